/* agent/display.h -- what ds4-agent shows in the terminal: the streamed
 * answer, reasoning (dimmed, or hidden by /think-show), one line per tool
 * call, edit diffs, notes, and the prefill progress bar.
 *
 * Contract
 * - Text goes to `out` (stdout), the progress bar to `status` (stderr),
 *   and only when both are terminals; colours only when `out` is one.
 * - Channel switches (reasoning -> answer -> tool line) start a new line,
 *   so every tool line and note begins at column 0 whatever was streamed.
 * - The progress bar redraws at most ten times a second (and at the end):
 *   bar, done/total tokens, tokens/s and the ETA from the rate so far; it is
 *   erased and replaced by one summary line when the prefill ends.
 */
#ifndef DS4_AGENT_DISPLAY_H
#define DS4_AGENT_DISPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct {
    FILE *out, *status;
    bool color, status_tty;
    bool show_reasoning;
    int channel;              /* 0 none, 1 reasoning, 2 answer */
    bool mid_line;            /* the last byte written to out was not '\n' */
    char tool[64];            /* the running tool, for its summary line */
    bool tool_interrupted;    /* something (a question) was printed since tool_start */
    double bar_t0, bar_last;
    bool bar_shown;
} ds4_agent_display;

void ds4_agent_display_init(ds4_agent_display *d, FILE *out, FILE *status);
void ds4_agent_display_reasoning(ds4_agent_display *d, const char *s, size_t n);
void ds4_agent_display_answer(ds4_agent_display *d, const char *s, size_t n);
/* Ends the streamed message: colours off, cursor at column 0. */
void ds4_agent_display_end(ds4_agent_display *d);
/* "-> name args" while the tool runs, then "  summary" on the same line
 * and the extra lines (a diff) if any. */
void ds4_agent_display_tool_start(ds4_agent_display *d, const char *name, const char *args);
void ds4_agent_display_tool_end(ds4_agent_display *d, const char *summary, const char *extra, size_t extra_len);
/* Before something else writes to the terminal (a confirmation question):
 * ends the current line; a running tool's summary then repeats its name. */
void ds4_agent_display_interject(ds4_agent_display *d);
void ds4_agent_display_note(ds4_agent_display *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ds4_agent_display_progress_begin(ds4_agent_display *d);
void ds4_agent_display_progress(ds4_agent_display *d, int done, int total);
void ds4_agent_display_progress_end(ds4_agent_display *d, int done, bool cancelled);

#endif
