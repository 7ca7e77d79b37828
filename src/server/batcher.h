/* batcher.h -- one engine shared by the server's slot threads: the decode
 * tokens and prefill slices they submit are gathered into batched engine
 * steps (ds4_sessions_step), so N streaming clients cost about one pass over
 * the dense weights per token instead of N.
 *
 * Contract
 * - ds4_batcher_eval() appends n tokens to the caller's session and returns
 *   when they are in (0, or -1 with err). Batching never changes a result
 *   (engine.h: batched sessions are bit-identical to sessions alone), so
 *   when a step runs only affects speed.
 * - A step runs once every busy slot (ds4_batcher_busy) has work pending, or
 *   after a grace period (2 ms, or an eighth of the last step when that is
 *   longer) counted from the end of the last step or the oldest pending
 *   work's arrival, whichever is later: the slots of the step that just ended
 *   get that long to submit their next token, and a slot busy writing to a
 *   client or tokenizing does not hold the others back longer. A step takes
 *   every pending decode token and at most PREFILL_ROWS prompt tokens in
 *   all, so a long prompt is prefilled in bounded chunks interleaved with
 *   everyone's decode steps. Prompts' first slices go first (oldest first),
 *   then later slices of long prompts; slots submit long prompts one slice
 *   at a time (job.c), so a new request's prompt waits at most for the step
 *   already running (unless other new prompts fill that budget), and a burst
 *   of short prompts is prefilled in one pass over the weights instead of
 *   one pass each.
 * - The per-step log line names its decode and prefill rows and how many
 *   steps started after a decode token or a prompt's first slice arrived
 *   without taking it ("decode waited", "prefill waited": 0 is the promise
 *   above), so tests check the schedule from the order of steps.
 * - The engine is not thread-safe: any other engine call a slot makes
 *   (rewind, prefill that keeps every position's logits) goes between
 *   ds4_batcher_lock() and ds4_batcher_unlock().
 * - The thread that completes the group runs the step itself (no extra
 *   thread); each session may have one submission in flight.
 */
#ifndef DS4_BATCHER_H
#define DS4_BATCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

typedef struct ds4_batcher ds4_batcher;

/* log may be NULL; otherwise it is called (outside the engine lock) once per
 * step with warning false. */
ds4_batcher *ds4_batcher_new(ds4_engine *e, void (*log)(void *ud, bool warning, const char *line), void *log_ud);
void ds4_batcher_free(ds4_batcher *b);
/* A slot starts (true) or ends (false) a request. */
void ds4_batcher_busy(ds4_batcher *b, bool busy);
/* prompt_start: toks are the first slice of a prompt (the log reports how
 * long those waited; a later slice of the same prompt is expected to wait
 * behind other prompts' slices). */
int ds4_batcher_eval(ds4_batcher *b, ds4_session *s, const int32_t *toks, int n, bool prompt_start,
                     char *err, size_t errlen);
void ds4_batcher_lock(ds4_batcher *b);
void ds4_batcher_unlock(ds4_batcher *b);

#endif
