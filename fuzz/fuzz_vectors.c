/* Fuzz target: the reference-vector reader (vectors.h) and the step scorer.
 * Invariants (abort() on violation): a file that parses has prompts with at
 * least one prompt id and one step, every id inside the vocabulary, top-k
 * lists non-empty, distinct, not increasing and <= 0; scoring any step
 * against fixed logits gives a rank inside the vocabulary, a finite gap and
 * a KL that is finite and not meaningfully negative; a refusal has one line. */
#include "quality/vectors.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds4_vectors v;
    char err[256];
    if (!ds4_vectors_parse((const char *)data, size, VOCAB, &v, err, sizeof err)) {
        if (!err[0] || strchr(err, '\n')) abort();
        return 0;
    }
    float logits[VOCAB];
    for (int j = 0; j < VOCAB; j++) logits[j] = (float)((j * 37) % 11) - 5.0f;
    for (int i = 0; i < v.n; i++) {
        const ds4_vec_prompt *p = &v.p[i];
        if (p->n_prompt < 1 || p->n_steps < 1) abort();
        for (int k = 0; k < p->n_prompt; k++) if (p->prompt[k] < 0 || p->prompt[k] >= VOCAB) abort();
        for (int s = 0; s < p->n_steps; s++) {
            const ds4_vec_step *st = &p->steps[s];
            if (st->n_top < 1 || st->id < 0 || st->id >= VOCAB) abort();
            for (int k = 0; k < st->n_top; k++) {
                if (st->top_id[k] < 0 || st->top_id[k] >= VOCAB || !(st->top_lp[k] <= 0)) abort();
                if (k && st->top_lp[k] > st->top_lp[k - 1]) abort();
                for (int j = 0; j < k; j++) if (st->top_id[j] == st->top_id[k]) abort();
            }
            ds4_vec_score sc;
            ds4_vectors_score_step(st, logits, VOCAB, &sc);
            if (sc.rank < 0 || sc.rank >= VOCAB || !isfinite(sc.gap) || !isfinite(sc.kl) || sc.kl < -1e-9) abort();
        }
    }
    ds4_vectors_free(&v);
    return 0;
}
