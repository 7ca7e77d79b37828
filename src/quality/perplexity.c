#include "quality/perplexity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double token_nll(const float *row, int n_vocab, int32_t tok) {
    float mx = row[0];
    for (int j = 1; j < n_vocab; j++) if (row[j] > mx) mx = row[j];
    double sum = 0;
    for (int j = 0; j < n_vocab; j++) sum += exp((double)row[j] - mx);
    return log(sum) + mx - row[tok];
}

int ds4_perplexity(ds4_session *s, int n_vocab, const int32_t *ids, int n, int window, int stride,
                   bool (*on_chunk)(void *ud, const ds4_ppl_chunk *c), void *ud, ds4_ppl_result *out,
                   char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (n < 2) { snprintf(err, errlen, "perplexity needs at least 2 tokens, the input has %d", n); return -1; }
    if (window > n) window = n;
    if (window < 2 || stride < 1 || stride >= window) {
        snprintf(err, errlen, "perplexity needs a context of at least 2 and a stride in [1, context-1] (context %d, stride %d)",
                 window, stride);
        return -1;
    }
    if (window > ds4_session_ctx(s)) {
        snprintf(err, errlen, "perplexity context %d exceeds the session's %d", window, ds4_session_ctx(s));
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab) { snprintf(err, errlen, "token %d at %d is outside the vocabulary (%d)", ids[i], i, n_vocab); return -1; }
    float *logits = malloc((size_t)window * (size_t)n_vocab * sizeof *logits);
    if (!logits) { snprintf(err, errlen, "out of memory for %d x %d logits", window, n_vocab); return -1; }
    int rc = 0, scored_to = 1;   /* tokens [1, scored_to) are scored */
    for (int begin = 0, idx = 0; scored_to < n; begin += stride, idx++) {
        int end = begin + window < n ? begin + window : n;
        if (ds4_session_rewind(s, 0, err, errlen) || ds4_session_prefill(s, ids + begin, end - begin, logits, NULL, NULL, err, errlen)) {
            rc = -1;
            break;
        }
        ds4_ppl_chunk c = {.index = idx, .begin = begin, .end = end};
        int from = scored_to > begin + 1 ? scored_to : begin + 1;
        for (int p = from; p < end; p++) {
            c.nll_sum += token_nll(logits + (size_t)(p - begin - 1) * n_vocab, n_vocab, ids[p]);
            c.scored++;
        }
        scored_to = end;
        out->scored += c.scored;
        out->nll_sum += c.nll_sum;
        out->chunks++;
        if (on_chunk && !on_chunk(ud, &c)) { rc = 1; break; }
    }
    free(logits);
    if (out->scored) {
        out->mean_nll = out->nll_sum / (double)out->scored;
        out->ppl = exp(out->mean_nll);
    }
    return rc;
}
