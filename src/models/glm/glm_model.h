/* glm_model.h -- GLM 5.2 (glm-dsa) configuration from GGUF metadata and
 * binding of every tensor of the GLM layout (glm_layout.h).
 *
 * Contract
 * - ds4_glm_model_bind() reads the glm-dsa.* keys into glm_hparams (every
 *   dimension from metadata; vocab_size, when absent, from token_embd), then
 *   binds and validates every tensor the forward pass and the MTP block use:
 *   name, shape and a type the CPU kernels multiply; norms, the router, its
 *   correction bias and the indexer's head weights / LayerNorm are copied to
 *   f32 once. Indexer tensors are required on full trunk layers and ignored
 *   on shared layers and the MTP block (the released files carry them there,
 *   both reference implementations ignore them). exp_probs_b may be absent
 *   (no correction bias). Matrices point into the mapping.
 * - Any problem gives NULL and one line "not a GLM 5.2 GGUF: <first problem>"
 *   (or "out of memory for ...").
 * - ds4_glm_gguf_is_glm() tells the family dispatchers (engine, tools) whether a
 *   file's general.architecture is glm-dsa.
 * - The glm_model does not own the ds4_gguf; it must outlive the model.
 */
#ifndef GLM_MODEL_H
#define GLM_MODEL_H

#include <stdbool.h>
#include <stddef.h>

#include "models/glm/glm_layout.h"
#include "format/tensor.h"

struct ds4_gguf;

typedef struct {
    float *attn_norm, *q_a_norm, *kv_a_norm, *ffn_norm;
    ds4_tensor q_a, q_b, kv_a_mqa, k_b, v_b, attn_output;
    /* DSA indexer: bound on full trunk layers only */
    ds4_tensor idx_q_b, idx_k;
    float *idx_k_norm, *idx_k_norm_b, *idx_proj;   /* idx_proj: [idx_n_head][n_embd] */
    /* dense FFN (blocks below leading_dense_block_count) */
    ds4_tensor ffn_gate, ffn_up, ffn_down;
    /* MoE */
    float *gate_inp;                      /* [n_expert][n_embd] */
    float *exp_probs_b;                   /* [n_expert] or NULL */
    ds4_tensor gate_exps, up_exps, down_exps, gate_shexp, up_shexp, down_shexp;
    /* MTP block */
    ds4_tensor eh_proj, nextn_embed, nextn_head;   /* nextn_embed/head: .data NULL when absent */
    float *enorm, *hnorm, *shared_head_norm;       /* shared_head_norm may be NULL */
} glm_layer;

typedef struct glm_model {
    glm_hparams hp;
    ds4_tensor token_embd, output;
    float *output_norm;
    glm_layer *layers;                    /* [n_block] */
    char name[128];
    uint64_t file_bytes;
} glm_model;

bool ds4_glm_gguf_is_glm(const struct ds4_gguf *g);
glm_model *ds4_glm_model_bind(const struct ds4_gguf *g, char *err, size_t errlen);
void ds4_glm_model_free(glm_model *m);

#endif
