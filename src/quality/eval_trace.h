/* eval_trace.h -- ds4-eval's trace file: what a run wrote (every prompt,
 * token and verdict) and the reader that lets --regrade-trace grade it
 * again without a model.
 *
 * Contract
 * - The file is JSON lines, one record per line, in run order:
 *     {"ds4_eval_trace":1,"thinking":B,"tokens":N,...}      header, first
 *     {"q":ID,"category":C,"prompt":TEXT,"prompt_tokens":N} a question starts
 *     {"q":ID,"tok":ID,"text":TEXT,"bytes":HEX}             each generated token
 *     {"q":ID,"verdict":"PASS"|"FAIL","picked":S,"expected":S,
 *      "gen_tokens":N,"end":S,"seconds":F,"output":TEXT}    a question ends
 *   TEXT is valid UTF-8 (a token's partial character reads U+FFFD; its
 *   exact bytes are HEX); writers flush after each record, so a run that
 *   was killed leaves a readable prefix.
 * - ds4_eval_trace_read() parses such a text and returns the header's
 *   thinking flag and every verdict record (question, old verdict, old
 *   picked answer, output, token counts). Question and token records are
 *   skipped; blank lines are allowed. Anything else (not JSON, no header,
 *   a verdict without its fields, a question id < 1) is rejected with one
 *   line in err naming the line number; nothing is returned then.
 */
#ifndef DS4_EVAL_TRACE_H
#define DS4_EVAL_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "base/json_util.h"

typedef struct {
    int q;
    bool pass;
    char *picked, *output;
    size_t output_len;
    int prompt_tokens, gen_tokens;
} ds4_eval_trace_case;

typedef struct {
    bool thinking;
    ds4_eval_trace_case *cases;
    int n;
} ds4_eval_trace;

int ds4_eval_trace_read(const char *text, size_t len, ds4_eval_trace *out, char *err, size_t errlen);
void ds4_eval_trace_free(ds4_eval_trace *t);

/* Appends `"key":` and the JSON string of s[0..n) to a record being built. */
void ds4_eval_trace_str(ds4_buf *b, const char *key, const char *s, size_t n);
/* Writes the record b (an object without its braces) as one line, flushed. */
void ds4_eval_trace_emit(FILE *f, ds4_buf *b);

#endif
