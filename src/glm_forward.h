/* glm_forward.h -- GLM 5.2 forward pass on the CPU, reference form: one
 * sequence, every position's logits, recomputed from the tokens (no KV
 * state yet, so not behind backend.h: decode, batching, snapshots and the
 * engine come later). It states the math the batched backend must keep.
 *
 * Contract
 * - glm_forward_sequence() runs tokens[0..n) at positions 0..n-1 and writes
 *   logits[n][n_vocab]. Math (GLM sheet section 5, checked by
 *   tests/glm/test_glm_reference.py against transformers): pre-norm blocks;
 *   MLA in the absorbed form (the query's nope part multiplied into the
 *   latent through attn_k_b, attention over the cached latent + rope key,
 *   attn_v_b out); interleaved-pair RoPE; the DSA indexer on full layers
 *   (ReLU head scores weighted by indexer.proj, top-k of the visible keys,
 *   ties to the earlier position), its selection reused by shared layers;
 *   dense SwiGLU or sigmoid routing with the correction bias for selection
 *   only, top-k, normalised weights times expert_weights_scale, plus the
 *   shared expert. The q / kv latent norms use eps 1e-6 (transformers and
 *   DeepSeek's reference code), the block and final norms rms_eps.
 * - Matrices are used in their stored types through the CPU kernels
 *   (activations quantized per row for the weight type).
 * - Returns 0, or -1 with one line in err (bad token id, out of memory).
 */
#ifndef GLM_FORWARD_H
#define GLM_FORWARD_H

#include <stddef.h>
#include <stdint.h>

struct ds4_pool;
struct glm_model;

int glm_forward_sequence(const struct glm_model *m, struct ds4_pool *pool, const int32_t *tokens, int n,
                         float *logits, char *err, size_t errlen);

#endif
