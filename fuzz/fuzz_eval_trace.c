/* Fuzz target: ds4-eval's readers of untrusted text -- the trace reader
 * (eval_trace.h), the answer extractor and grader (eval_grade.h) over any
 * model reply, and the question selection parser (eval_questions.h).
 * Invariants (abort() on violation): a trace that reads has a verdict for
 * each case with its picked answer and output present and output_len equal
 * to the output's length; grading never yields a pass without a picked
 * answer, and the picked answer is one line inside its buffer; a selection
 * that parses selects at least one question. */
#include "quality/eval_grade.h"
#include "quality/eval_questions.h"
#include "quality/eval_trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    ds4_eval_trace t;
    char err[256];
    if (!ds4_eval_trace_read(text, size, &t, err, sizeof err)) {
        for (int i = 0; i < t.n; i++)
            if (!t.cases[i].picked || !t.cases[i].output || strlen(t.cases[i].output) != t.cases[i].output_len ||
                t.cases[i].q < 1)
                abort();
        ds4_eval_trace_free(&t);
    } else if (!err[0] || strchr(err, '\n')) {
        abort();
    }
    int n;
    const ds4_eval_question *q = ds4_eval_questions(&n);
    for (int c = 0; c < DS4_EVAL_N_CATEGORIES; c++) {
        /* the first question of each category; both thinking modes */
        const ds4_eval_question *pick = NULL;
        for (int i = 0; i < n && !pick; i++) if (q[i].cat == (ds4_eval_category)c) pick = &q[i];
        for (int think = 0; think < 2; think++) {
            ds4_eval_verdict v;
            ds4_eval_grade(pick, text, size, think, &v);
            size_t len = strnlen(v.picked, sizeof v.picked);
            if (len == sizeof v.picked || (v.pass && !len) || memchr(v.picked, '\n', len)) abort();
        }
    }
    char *spec = malloc(size + 1);
    bool *mask = calloc((size_t)n, sizeof *mask);
    if (spec && mask) {
        memcpy(spec, data, size);
        spec[size] = 0;
        if (ds4_eval_select(spec, mask, n, err, sizeof err)) {
            int any = 0;
            for (int i = 0; i < n; i++) any |= mask[i];
            if (!any) abort();
        }
    }
    free(spec);
    free(mask);
    return 0;
}
