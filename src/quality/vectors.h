/* vectors.h -- reference top-k logprob vectors (captured from the official
 * API for fixed prompts) and the scorer that compares the local model with
 * them (`ds4 --score-vectors`).
 *
 * Contract
 * - File format (JSON, docs/quality.md):
 *     {"ds4_vectors": 1, "source": "...",
 *      "prompts": [{"name": "...", "prompt_ids": [ids...],
 *                   "steps": [{"id": ID, "top": [{"id": ID, "logprob": F}, ...]}, ...]}]}
 *   prompt_ids is the exact prompt (at least one id); control characters
 *   in a name read as '?' (names are printed); each step is one
 *   generated position: "id" the token the reference emitted there (the
 *   local model is fed the same tokens), "top" the reference's top-k,
 *   most likely first (at least one entry, logprobs <= 0 and not
 *   increasing, distinct ids).
 * - ds4_vectors_parse() validates all of it (ids inside [0, n_vocab) when
 *   n_vocab > 0) and returns false with one line in err naming the prompt
 *   and step; on success the caller frees with ds4_vectors_free().
 * - ds4_vectors_score_step() compares one step with the local logits
 *   (n_vocab floats): top1 = the local argmax is the reference's first
 *   token; rank = how many local tokens have a higher logit than it; gap =
 *   its reference logprob minus its local logprob; kl = KL(reference ||
 *   local) over the reference's top-k, each side renormalised over those
 *   tokens.
 */
#ifndef DS4_VECTORS_H
#define DS4_VECTORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct { int32_t id; int n_top; int32_t *top_id; double *top_lp; } ds4_vec_step;

typedef struct {
    char *name;
    int32_t *prompt;
    int n_prompt;
    ds4_vec_step *steps;
    int n_steps;
} ds4_vec_prompt;

typedef struct {
    ds4_vec_prompt *p;
    int n;
} ds4_vectors;

bool ds4_vectors_parse(const char *text, size_t len, int n_vocab, ds4_vectors *out, char *err, size_t errlen);
void ds4_vectors_free(ds4_vectors *v);

typedef struct { bool top1; long rank; double gap, kl; } ds4_vec_score;
void ds4_vectors_score_step(const ds4_vec_step *st, const float *logits, int n_vocab, ds4_vec_score *out);

#endif
