/* perplexity.h -- perplexity of a token sequence over sliding windows
 * (`ds4 --perplexity-file`).
 *
 * Contract
 * - Windows of at most `window` tokens start at 0, stride, 2*stride, ...;
 *   the last one ends at the sequence's end. Each window is prefilled into
 *   the session from empty (rewound to 0) with every position's logits,
 *   and scores the tokens no earlier window scored: token p is predicted
 *   by the logits after token p-1 of the same window, so a window's first
 *   token is never scored by it (the sequence's first token never is).
 * - A token's NLL is logsumexp(logits) - logits[token], in double. The
 *   result is the mean NLL over every scored token and exp(mean) as PPL.
 * - Needs 2 <= n, 2 <= window, 1 <= stride <= window - 1 (else a window
 *   would score nothing new), window <= the session's context: otherwise
 *   -1 with one line in err and nothing run. Engine errors: -1 with err.
 * - on_chunk (optional) sees each window as it is scored; returning false
 *   stops (the result then covers the windows done, and 1 is returned).
 */
#ifndef DS4_PERPLEXITY_H
#define DS4_PERPLEXITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

typedef struct {
    int index, begin, end;      /* window [begin, end) of the sequence */
    int scored;                 /* tokens this window scored */
    double nll_sum;             /* their summed NLL */
} ds4_ppl_chunk;

typedef struct {
    long scored;
    double nll_sum, mean_nll, ppl;
    int chunks;
} ds4_ppl_result;

int ds4_perplexity(ds4_session *s, int n_vocab, const int32_t *ids, int n, int window, int stride,
                   bool (*on_chunk)(void *ud, const ds4_ppl_chunk *c), void *ud, ds4_ppl_result *out,
                   char *err, size_t errlen);

#endif
