/* sampler.h -- next-token sampling from a logits vector: temperature, top-k,
 * top-p, min-p, seeded RNG, and the per-call greedy override that DSML
 * protocol structure uses (server-api.md 2.3, 10.4).
 *
 * Contract
 * - Filter order (ds4): top-k (when top_k > 0, capped at DS4_SAMPLER_MAX_TOP_K)
 *   on the logits, softmax at `temperature`, drop tokens whose probability
 *   is below min_p * p(most likely), then keep the smallest prefix (by
 *   descending probability, ties by lower id) whose cumulative probability,
 *   renormalised over the survivors, reaches top_p; sample from what is left
 *   in proportion to the probabilities.
 * - temperature <= 0, or force_greedy, returns the argmax (lowest id on
 *   ties) without advancing the RNG, so forcing structural tokens greedy
 *   leaves the random stream of the payload draws unchanged. top_p <= 0 or > 1 means 1; min_p <= 0 is
 *   off; NaN logits are never chosen (-inf ones are never chosen either,
 *   unless every logit is -inf/NaN, in which case id 0 is returned).
 * - Determinism: the same seed, parameters and logits sequence give the
 *   same ids (xoshiro256** seeded by splitmix64, one draw per non-greedy
 *   sample, weights in double). Across libm versions exp() may differ in
 *   the last bit, so bit-identical streams are promised per build only.
 * - A sampler owns O(n_vocab) scratch; not thread-safe, one per session.
 */
#ifndef DS4_SAMPLER_H
#define DS4_SAMPLER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#define DS4_SAMPLER_MAX_TOP_K 1024

typedef struct {
    float temperature;   /* default 1.0 */
    int top_k;           /* default 0 = off */
    float top_p;         /* default 1.0 */
    float min_p;         /* default 0.05 */
    uint64_t seed;
} ds4_sampler_params;

/* the ds4 defaults above; seed 0 */
void ds4_sampler_params_default(ds4_sampler_params *p);
/* A seed from the OS entropy source, for requests without one. */
uint64_t ds4_sampler_random_seed(void);

typedef struct ds4_sampler ds4_sampler;

ds4_sampler *ds4_sampler_new(const ds4_sampler_params *p, int n_vocab);
void ds4_sampler_free(ds4_sampler *s);

int ds4_sampler_sample(ds4_sampler *s, const float *logits, bool force_greedy);

/* The candidate set the next non-greedy draw would choose from: up to `max`
 * ids in descending probability with their renormalised probabilities.
 * Returns the full candidate count (may exceed max). For tests and
 * diagnostics; does not touch the RNG. */
int ds4_sampler_candidates(ds4_sampler *s, const float *logits,
                           int *ids, float *probs, int max);

/* Log-softmax of the raw logits (temperature 1, no filters) for `id`, and the
 * k most likely ids with theirs (OpenAI logprobs). Returns the count written. */
float ds4_logprob(const float *logits, int n_vocab, int id);
int ds4_top_logprobs(const float *logits, int n_vocab, int k, int *ids, float *logprobs);

#endif
