/* eval_run.h -- ds4-eval's runner: selected questions through the real
 * chat renderer and generation loop, graded; the report; the regrade of an
 * old trace.
 *
 * Contract
 * - ds4_eval_prepare() renders and tokenizes every selected question (the
 *   engine's chat profile, one user message, the thinking mode) and sizes
 *   the context: the largest prompt + max_tokens + the forced close. A
 *   context above the model's trained context is refused with one line in
 *   err (nothing allocated is left behind).
 * - ds4_eval_run_next() runs one question on one session (rewound to empty
 *   first): prefill, then ds4_generate() with the sampler. While the model
 *   is inside <think>, a reasoning that reaches think_soft tokens is closed
 *   ("</think>" forced) at the next line end, and at think_hard tokens at
 *   once, so the reply keeps room for the answer. With a script (test
 *   only) the question's entry is forced token by token, then EOS. Every
 *   prompt, token and verdict goes to the trace when there is one.
 * - The view (optional) sees each question start, each text piece and each
 *   end; its poll() is asked between tokens and prefill chunks and returns
 *   true to stop the run (the question in flight ends unfinished and is not
 *   graded); its next() may pick the pending item that runs next.
 * - ds4_eval_report() prints the per-question table (prompt tokens,
 *   generated tokens, PASS/FAIL/SKIP, picked answer, expected), per-category
 *   and overall scores and the wall time; it returns the number passed.
 * - ds4_eval_regrade() grades a trace's outputs again with the current
 *   extractor and keys, prints every case whose verdict or picked answer
 *   changed (old and new), then the report of the new verdicts.
 */
#ifndef DS4_EVAL_RUN_H
#define DS4_EVAL_RUN_H

#include <stdbool.h>
#include <stdio.h>

#include "base/turn_script.h"
#include "text/chat.h"
#include "engine/engine.h"
#include "quality/eval_grade.h"
#include "quality/eval_questions.h"
#include "quality/eval_trace.h"
#include "engine/generate.h"
#include "engine/sampler.h"

typedef struct {
    int max_tokens;                 /* --tokens */
    int think_soft, think_hard;     /* reasoning tokens before </think> is forced (line end / at once) */
    ds4_think_mode think;
    FILE *trace;                    /* NULL = none */
    ds4_turn_script *script;       /* test only: forced replies, one entry per question in run order */
    ds4_spec *spec;                 /* NULL, or the drafter every question decodes with (answers unchanged) */
} ds4_eval_opts;

typedef enum { DS4_EVAL_PENDING, DS4_EVAL_RUNNING, DS4_EVAL_DONE, DS4_EVAL_UNFINISHED } ds4_eval_state;

typedef struct {
    const ds4_eval_question *q;
    ds4_token_ids prompt;
    ds4_eval_state state;
    int gen_tokens;
    ds4_eval_verdict v;
    double seconds;
    char *output;                   /* the reply once the question ran (NULL before) */
    size_t output_len;
} ds4_eval_item;

typedef struct {
    void (*start)(void *ud, int item);
    void (*text)(void *ud, const char *s, size_t n);
    void (*end)(void *ud, int item);
    bool (*poll)(void *ud);
    int (*next)(void *ud);          /* the item to run next, or -1: the first pending */
    void *ud;
} ds4_eval_view;

typedef struct {
    ds4_engine *e;
    const ds4_tokenizer *tok;
    ds4_eval_opts o;
    ds4_eval_item *items;
    int n;
    int ctx;                        /* the context the run needs */
    ds4_token_ids close;            /* the forced "</think>\n\n" */
} ds4_eval_run;

/* ids: the selected question ids in run order. */
int ds4_eval_prepare(ds4_eval_run *r, ds4_engine *e, const int *ids, int n, const ds4_eval_opts *o, char *err, size_t errlen);
/* Writes the trace header. */
void ds4_eval_trace_header(const ds4_eval_run *r, const ds4_sampler_params *sp);
/* 0 done, 1 stopped by the view, -1 engine error (err). */
int ds4_eval_run_item(ds4_eval_run *r, int item, ds4_session *s, ds4_sampler *smp, const ds4_eval_view *v,
                      char *err, size_t errlen);
/* Every pending item, the view's pick first: 0 all done, 1 stopped, -1 error. */
int ds4_eval_run_all(ds4_eval_run *r, ds4_session *s, ds4_sampler *smp, const ds4_eval_view *v, char *err, size_t errlen);
void ds4_eval_run_free(ds4_eval_run *r);

/* Monotonic seconds (the report's wall time, the view's redraw pacing). */
double ds4_eval_clock(void);

int ds4_eval_report(FILE *f, const ds4_eval_item *items, int n, double wall_s);
/* 0 ok, -1 unreadable trace (one line on stderr). */
int ds4_eval_regrade(FILE *f, const char *path);

#endif
