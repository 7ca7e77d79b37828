/* dspark.h -- DeepSeek V4's DSpark block drafter (--mtp FILE --dspark): a small
 * draft model that reads hidden states of chosen layers of the main model and
 * proposes a block of up to block_size tokens in one forward pass, with a
 * Markov head that conditions each proposal on the one before it and a
 * confidence head that says how likely each is to be accepted.
 *
 * Contract
 * - Two support-file layouts (ds4_layout.h), chosen by the file's
 *   general.architecture:
 *   the released sidecar ("deepseek4-dspark"; DeepSeek's inference/model.py
 *   DSparkBlock, the reference of tests/oracles/ds4_dspark_sidecar_oracle.py):
 *     feat_j       = the hyper-connection stream means entering each target
 *                    layer at position j (the outputs of the layers before
 *                    them), concatenated
 *     context m_j  = RMSNorm(main_proj(feat_j); main_norm); per stage one
 *                    K = V row RMSNorm(wkv(m_j)) roped at j, for the last
 *                    `window` (the main model's sliding window) positions
 *     block rows   = embed(last), embed(noise) x (block_size - 1) at
 *                    positions n .., on every stream
 *     each stage   = a V4 block: HC mix, attention (q-LoRA queries and K = V
 *                    rows from the block, over the context rows and every
 *                    block row both ways, sinks, grouped output LoRA), HC
 *                    mix back; the same around the MoE (router with bias,
 *                    top-k experts and the shared expert, the main model's
 *                    counts and SwiGLU limits)
 *     x_k          = the last stage's HC merge of row k's streams
 *     logits_k     = output(RMSNorm(x_k; norm)) + w2 w1[prev_k]
 *     confidence_k = sigmoid(proj([x_k; w1[prev_k]]))
 *   the dense layout ("dspark"; nemo-automodel's DeepSeek V4 DSpark draft,
 *   the reference of tests/oracles/ds4_dspark_oracle.py):
 *     context c_j   = RMSNorm(fc(feat_j); hidden_norm), feat_j the target
 *                     layers' outputs at position j (each the mean of its
 *                     hyper-connection streams), concatenated in file order
 *     block rows    = embed(last), embed(mask) x (block_size - 1) at
 *                     positions n .. n + block_size - 1
 *     each layer    = x += attn(RMSNorm(x)); x += swiglu_mlp(RMSNorm(x))
 *                     attn as above over every context row j < n
 *     logits_k      = output(RMSNorm(x_k; norm)) + w2 w1[prev_k]
 *     confidence_k  = sigmoid(proj([RMSNorm(x_k); w1[prev_k]]) + b) (the
 *                     w1 part only when the head's input has it)
 *   In both prev_0 = last and prev_k is the greedy draft at k - 1; the
 *   embedding and the output matrix are the main model's; the arithmetic is
 *   float32 (no FP8 simulation of the reference's K = V rows).
 * - ds4_dspark_load() binds and validates the file against the main model
 *   (dimensions, vocabulary, target layers it has: the dense layout's inside
 *   0..n_layer-2, the sidecar's inside 1..n_layer-1; tensor shapes);
 *   anything else gives NULL and one line. ds4_dspark_targets() are the main
 *   model's layers whose outputs the drafter reads.
 * - A state keeps, per context position, each draft layer's K = V row (they
 *   depend on that position's features only): ds4_dspark_push() adds
 *   position ds4_dspark_context(st) from its features; ds4_dspark_rewound()
 *   drops the rows at and past n_pos. The dense drafter keeps a row per
 *   position, the sidecar a ring of a few windows. Nothing of it is
 *   persisted. The rows of evaluated positions are made when the next block
 *   needs them (or before an evaluation would overwrite their features), a
 *   chunk of positions per read of the drafter's matrices: the same values
 *   as one position at a time.
 * - Beside a session: ds4_dspark_bind() before each main evaluation points
 *   the sequence's layer ring (backend.h) at the state's ring of ring_rows
 *   slots; ds4_dspark_evaluated() after it pushes the new positions. When
 *   the positions do not follow the context (a restored snapshot:
 *   ds4_dspark_forget(); an evaluation of more than ring_rows rows) the
 *   context starts again at the first position the ring holds, with no rows
 *   before it.
 * - ds4_dspark_block(): the block after the context and `last` (the token at
 *   position ds4_dspark_context(st)): how many drafts to propose, the
 *   longest prefix of at most max rows whose product of confidences stays
 *   >= threshold (threshold 0: the whole block, up to max). It writes those
 *   rows' greedy drafts to tokens and, when non-NULL, their logits to
 *   logits (row t at t x n_vocab) and their confidence probabilities to
 *   confidence, which also gets the row that ended the prefix. Rows past
 *   the prefix are not computed: the output head costs most. Returns 0
 *   when out of memory, and when the rows the block reads are not all held
 *   (the dense drafter: from position 0; the sidecar: the last window).
 */
#ifndef DS4_DSPARK_H
#define DS4_DSPARK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "models/dsv4/model.h"

#define DS4_DSPARK_BLOCK_MAX 16

typedef struct ds4_dspark ds4_dspark;
typedef struct ds4_dspark_state ds4_dspark_state;

/* pool: the threads its matrix products run on (NULL: the caller's) */
struct ds4_pool;
ds4_dspark *ds4_dspark_load(const char *path, const ds4_model *main_model, struct ds4_pool *pool, char *err,
                            size_t errlen);
/* The same from an open file, which it then owns (closed on failure too). */
struct ds4_gguf;
ds4_dspark *ds4_dspark_from_gguf(struct ds4_gguf *g, const char *path, const ds4_model *main_model,
                                 struct ds4_pool *pool, char *err, size_t errlen);
void ds4_dspark_free(ds4_dspark *d);
const char *ds4_dspark_name(const ds4_dspark *d);
int ds4_dspark_block_size(const ds4_dspark *d);
/* the main model's layers whose outputs the drafter reads, ascending */
int ds4_dspark_n_targets(const ds4_dspark *d);
const int *ds4_dspark_targets(const ds4_dspark *d);
uint64_t ds4_dspark_state_bytes(const ds4_dspark *d, int ctx, int ring_rows);

ds4_dspark_state *ds4_dspark_state_new(ds4_dspark *d, int ctx, int ring_rows);   /* NULL: out of memory */
void ds4_dspark_state_free(ds4_dspark_state *st);
int ds4_dspark_context(const ds4_dspark_state *st);
/* feat: n_targets x n_embd floats; false when the context is full */
bool ds4_dspark_push(ds4_dspark_state *st, const float *feat);
void ds4_dspark_rewound(ds4_dspark_state *st, int n_pos);
void ds4_dspark_bind(ds4_dspark_state *st, ds4_backend_seq *q);
void ds4_dspark_evaluated(ds4_dspark_state *st, int n_pos);
void ds4_dspark_forget(ds4_dspark_state *st);
int ds4_dspark_block(ds4_dspark_state *st, int32_t last, float threshold, int max, int32_t *tokens, float *logits,
                     float *confidence);

#endif
