/* glm_forward.h -- the GLM 5.2 forward pass on the CPU over a session state
 * (glm_kv.h): the one implementation of GLM's math, used by the backend
 * (glm_backend.h) and by the reference entry ds4_glm_forward_sequence().
 *
 * Contract
 * - ds4_glm_forward_eval() evaluates n_runs runs together, up to max_rows tokens
 *   in all: each appends its toks[0..n) to its own state (distinct states)
 *   at positions kv->n_pos .. kv->n_pos + n - 1 (then kv->n_pos += n) and
 *   writes next-token logits: n x n_vocab when all_logits, else the last
 *   token's n_vocab; head false skips the output head (a run split into
 *   calls needs it only for its last call). Every projection runs once over
 *   all rows of all runs, so weights are read once per call.
 *   Math (GLM sheet section 5, checked against transformers by
 *   tests/unit/test_glm_forward.c and tests/glm/test_glm_reference.py):
 *   pre-norm blocks; MLA in the absorbed form (the query's nope part
 *   multiplied into the latent through attn_k_b, attention over the cached
 *   latent + rope key, attn_v_b out); interleaved-pair RoPE; the DSA indexer
 *   on full layers (ReLU head scores weighted by indexer.proj over the cached
 *   indexer keys, top-k of the visible keys, ties to the earlier position),
 *   its selection reused by the shared layers after it; dense SwiGLU or
 *   sigmoid routing with the correction bias for selection only, top-k,
 *   normalised weights times expert_weights_scale, plus the shared expert.
 *   The q / kv latent norms use eps 1e-6 (transformers and DeepSeek's
 *   reference code), the block and final norms rms_eps. The MTP block is
 *   not run.
 * - Exactness: every row's result depends only on its token, its position
 *   and its state before it (matrix products with the activation quantized
 *   per row; kernels whose dot order does not depend on the batch; the
 *   attention and indexer of a row read only its own state's rows <= its
 *   position; routed experts added in selection order), so any split of a
 *   run into calls, and any other runs sharing a call, give bit-identical
 *   logits and state.
 * - Matrices are used in their stored types through the CPU kernels; the
 *   attention heads of all rows and each row's indexer scores are spread
 *   over the thread pool (each head / score computed whole by one thread).
 * - Returns 0, or -1 with one line in err (bad token id, more than max_rows
 *   rows, a state twice, context full, out of memory) before any state
 *   changed.
 * - ds4_glm_forward_weight_bytes(): bytes of weight matrices the products have
 *   read so far (a batched product reads its weights once for all rows).
 * - ds4_glm_forward_split() (tensor parallelism, dist/tp.h, nn/tp_split.h)
 *   makes this pass one of two ranks that evaluate the same calls together,
 *   every value either computes being the single process's, so rank 0's
 *   logits and both ranks' states equal one process's bit for bit:
 *   - MoE layers: rank 0 computes the shared expert and the routed experts
 *     [0, mid), rank 1 the routed experts [mid, n_expert); gate 3 x l + 2
 *     sends rank 1 rank 0's shared-expert rows and its slots' outputs (one
 *     n_embd row per selected slot of an expert < mid, in slot order) and
 *     rank 0 rank 1's slots; both then add the slots in selection order
 *     onto the shared expert, exactly the single process's sum. Dense
 *     layers run whole on both (no exchange).
 *   - Attention, when ds4_glm_split_heads() (an even head count and
 *     n_embd): each rank computes the queries and attention of its half of
 *     the heads (q_b's rows, attn_k_b / attn_v_b of those heads) and half
 *     of attn_output's rows; gate 3 x l + 0 swaps the heads' outputs, gate
 *     3 x l + 1 the output rows. q_a, the KV latent and the indexer run on
 *     both (both hold the whole state).
 *   - The output head is split by vocabulary rows, HEAD_ROWS token rows per
 *     exchange (gates 3 x n_trunk + i, i counting the call's head
 *     exchanges): rank 1 sends its half and writes no logits, rank 0 writes
 *     them all.
 *   A run's head runs when its `head` is set; logits may be NULL only on
 *   rank 1 of a split.
 * - ds4_glm_forward_sequence() is the reference form: tokens[0..n) at positions
 *   0..n-1 on a fresh state, every position's logits into logits[n][n_vocab].
 */
#ifndef GLM_FORWARD_H
#define GLM_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nn/tp_split.h"

struct ds4_pool;
struct glm_model;
struct glm_kv;
struct ds4_steering;
struct ds4_act_probe;

typedef struct glm_forward glm_forward;

glm_forward *ds4_glm_forward_new(const struct glm_model *m, struct ds4_pool *pool, int max_rows, char *err,
                             size_t errlen);
void ds4_glm_forward_free(glm_forward *f);
int ds4_glm_forward_max_rows(const glm_forward *f);
/* --power (power.h): pause with `power` after every layer of an evaluation. */
struct ds4_power;
void ds4_glm_forward_pace(glm_forward *f, struct ds4_power *power);
uint64_t ds4_glm_forward_weight_bytes(const glm_forward *f);
/* Checks what eval would refuse for a run of n tokens appended to kv (token
 * ids, context room) without running anything, and grows the per-position
 * scratch for it: after it returns 0 for every run of distinct states,
 * ds4_glm_forward_eval() on any packing of those runs (split at call
 * boundaries) into calls of at most max_rows rows cannot fail. */
int ds4_glm_forward_prepare(glm_forward *f, const struct glm_kv *kv, const int32_t *toks, int n, char *err,
                        size_t errlen);
typedef struct glm_run {
    struct glm_kv *kv;
    const int32_t *toks;
    int n;
    float *logits;          /* where the head writes (NULL only on rank 1 of a split) */
    bool all_logits;
    bool head;              /* false: no output head for this run */
    const struct ds4_steering *steer;   /* NULL: unsteered (nn/steering.h) */
    struct ds4_act_probe *probe;        /* NULL: no --dump-activations sums */
} glm_run;
int ds4_glm_forward_eval(glm_forward *f, const glm_run *runs, int n_runs, char *err, size_t errlen);

/* false when out of memory (no split then) */
bool ds4_glm_forward_split(glm_forward *f, const ds4_cpu_split *sp);
bool ds4_glm_split_heads(const struct glm_model *m);

int ds4_glm_forward_sequence(const struct glm_model *m, struct ds4_pool *pool, const int32_t *tokens, int n,
                         float *logits, char *err, size_t errlen);

#endif
