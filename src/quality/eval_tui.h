/* eval_tui.h -- ds4-eval's split-screen terminal view: the question list
 * with each verdict on the left, the live token stream of the question in
 * flight on the right, progress and key help on top.
 *
 * Contract
 * - ds4_eval_tui_open() takes the terminal (raw input from stdin; alternate
 *   screen drawn on `out`, the terminal's output stream the front end hands in;
 *   hidden cursor); ds4_eval_tui_close() gives it back exactly, so the
 *   report printed afterwards lands on the normal screen. NULL when stdin or `out`
 *   is not a terminal.
 * - Keys, read between tokens: p pauses (the run blocks at the next token
 *   until p again) and resumes; q stops the run (the question in flight is
 *   left unfinished, the report follows); Up/Down move the selection (the
 *   right pane shows the selected question's reply and verdict once it
 *   ran, the live stream otherwise);
 *   Enter makes the selected pending question the next one to run. The
 *   interrupt flag (SIGINT) stops the run like q.
 * - The view only reads the run's items; it never changes them.
 */
#ifndef DS4_EVAL_TUI_H
#define DS4_EVAL_TUI_H

#include <signal.h>

#include "quality/eval_run.h"

typedef struct ds4_eval_tui ds4_eval_tui;

ds4_eval_tui *ds4_eval_tui_open(const ds4_eval_run *r, FILE *out, volatile sig_atomic_t *interrupted);
ds4_eval_view ds4_eval_tui_view(ds4_eval_tui *t);
void ds4_eval_tui_close(ds4_eval_tui *t);

#endif
