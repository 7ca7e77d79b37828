/* glm_layout.h -- the GLM 5.2 GGUF layout as data: every glm-dsa.* metadata
 * key and every tensor (GGUF name, shape as a function of the
 * hyperparameters, which blocks carry it, and its type in each file mix),
 * exactly as llama.cpp's converter writes them for the GlmMoeDsaForCausalLM
 * architecture (general.architecture "glm-dsa"; fact sheet
 * docs glm-5.2-model.md sections 2-4). The GLM binder (glm_model.h) and the
 * random-model maker use this one table, as ds4_layout.h is for DeepSeek V4.
 *
 * Contract
 * - glm_hparams holds every hyperparameter with a GGUF key. Nothing has a
 *   GLM 5.2 default: whoever fills it sets every field.
 * - Blocks: block_count counts the trunk layers plus nextn_predict_layers MTP
 *   blocks at the end (GLM 5.2: 78 + 1 = 79). Blocks below
 *   leading_dense_block_count have a dense SwiGLU FFN, the others (MTP
 *   included) sigmoid-routed experts plus one shared expert.
 * - Indexer schedule: trunk layer l runs the DSA lightning indexer ("full")
 *   or reuses the top-k of the previous full layer ("shared").
 *   glm-dsa.attention.indexer.types (bool/int array, one entry per trunk
 *   layer, true/nonzero = full) gives it; without the key a file with
 *   context_length >= 2^20 uses GLM 5.2's pattern (full iff
 *   max(l - 3 + 1, 0) mod 4 == 0: layers 0,1,2,6,10,...) and a shorter one
 *   has every layer full (GLM 5 / 5.1), as llama.cpp decides. Layer 0 must
 *   be full. ds4_glm_hparams_write() writes the key only when indexer_types_key.
 * - ds4_glm_hparams_write() writes general.architecture and every key with the
 *   type llama.cpp's reader expects; ds4_glm_hparams_read() reads them back (any
 *   integer/float type that fits), then ds4_glm_hparams_check(); each fails with
 *   one line naming the first missing or invalid key or combination.
 * - Indexer tensors are written on every block (the released files carry
 *   them on all 79); the binder requires them only on full trunk layers.
 *   nextn.shared_head_norm is optional; nextn.embed_tokens /
 *   nextn.shared_head_head are not part of the written layout (absent in the
 *   released files; the MTP block then uses token_embd / output) but are
 *   bound when a file has them.
 * - Tensor shapes use GGUF order (ne[0] fastest); ds4_glm_tensor_shape() returns
 *   n_dims. attn_k_b is [qk_nope, kv_lora, heads] (the converter stores
 *   W_k,h transposed), attn_v_b is [kv_lora, v_head, heads].
 */
#ifndef GLM_LAYOUT_H
#define GLM_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "format/layout_common.h"

struct ds4_gguf;
struct ds4_gguf_writer;

#define GLM_ARCH "glm-dsa"
#define GLM_MAX_LAYERS 128
/* Context length from which a file without indexer.types is GLM 5.2 (llama.cpp's rule). */
#define GLM_52_CONTEXT 1048576u

typedef struct glm_hparams {
    uint32_t n_block;              /* block_count: trunk + MTP blocks */
    uint32_t n_nextn;              /* nextn_predict_layers (0 or 1) */
    uint32_t n_ctx_train;          /* context_length */
    uint32_t n_embd, n_vocab;
    uint32_t n_head, n_head_kv;    /* head_count_kv is 1: MLA runs as MQA over the latent */
    uint32_t key_length, value_length;          /* cached widths: kv_lora + rope, kv_lora */
    uint32_t key_length_mla, value_length_mla;  /* per-head q/k width (nope + rope) and v width */
    uint32_t n_rot;                /* rope.dimension_count: rope dims of q/k heads */
    uint32_t q_lora_rank, kv_lora_rank;
    uint32_t dense_ff, n_leading_dense;
    uint32_t n_expert, n_expert_used, expert_ff, n_expert_shared;
    uint32_t n_expert_groups, n_expert_groups_used;
    float expert_weights_scale;
    bool expert_weights_norm;
    uint32_t expert_gating_func;   /* 2 = sigmoid */
    float rope_base, rms_eps;
    uint32_t idx_n_head, idx_head_dim, idx_topk;
    bool indexer_types_key;        /* write glm-dsa.attention.indexer.types */
    bool indexer_full[GLM_MAX_LAYERS];  /* per trunk layer */
} glm_hparams;

extern const ds4_hparam_key ds4_glm_hparam_keys[];
extern const size_t ds4_glm_n_hparam_keys;

static inline uint32_t glm_n_trunk(const glm_hparams *hp) { return hp->n_block - hp->n_nextn; }
static inline bool glm_block_dense(const glm_hparams *hp, int l) { return (uint32_t)l < hp->n_leading_dense; }
static inline bool glm_block_nextn(const glm_hparams *hp, int l) { return (uint32_t)l >= glm_n_trunk(hp); }

/* The default indexer schedule of a file without indexer.types (see Contract). */
void ds4_glm_default_indexer_types(glm_hparams *hp);
void ds4_glm_hparams_write(struct ds4_gguf_writer *w, const glm_hparams *hp);
int ds4_glm_hparams_read(const struct ds4_gguf *g, glm_hparams *hp, char *err, size_t errlen);
int ds4_glm_hparams_check(const glm_hparams *hp, char *err, size_t errlen);
/* general.file_type and general.quantization_version of a mix. */
void ds4_glm_file_keys_write(struct ds4_gguf_writer *w, enum ds4_mix mix);

/* ---- tensors ---- */
enum glm_tensor_id {
    /* global */
    GLM_T_TOKEN_EMBD, GLM_T_OUTPUT_NORM, GLM_T_OUTPUT,
    /* every block */
    GLM_T_ATTN_NORM, GLM_T_ATTN_Q_A, GLM_T_ATTN_Q_A_NORM, GLM_T_ATTN_Q_B,
    GLM_T_ATTN_KV_A_MQA, GLM_T_ATTN_KV_A_NORM, GLM_T_ATTN_K_B, GLM_T_ATTN_V_B,
    GLM_T_ATTN_OUTPUT, GLM_T_FFN_NORM,
    /* DSA indexer */
    GLM_T_IDX_Q_B, GLM_T_IDX_K, GLM_T_IDX_K_NORM, GLM_T_IDX_K_NORM_B, GLM_T_IDX_PROJ,
    /* dense FFN blocks */
    GLM_T_FFN_GATE, GLM_T_FFN_UP, GLM_T_FFN_DOWN,
    /* MoE blocks */
    GLM_T_FFN_GATE_INP, GLM_T_EXP_PROBS_B, GLM_T_FFN_GATE_EXPS, GLM_T_FFN_UP_EXPS,
    GLM_T_FFN_DOWN_EXPS, GLM_T_FFN_GATE_SHEXP, GLM_T_FFN_UP_SHEXP, GLM_T_FFN_DOWN_SHEXP,
    /* MTP blocks */
    GLM_T_NEXTN_EH_PROJ, GLM_T_NEXTN_ENORM, GLM_T_NEXTN_HNORM, GLM_T_NEXTN_SHARED_HEAD_NORM,
    GLM_T_NEXTN_EMBED_TOKENS, GLM_T_NEXTN_SHARED_HEAD_HEAD,
    GLM_T_COUNT
};

enum glm_tensor_scope { GLM_SCOPE_GLOBAL, GLM_SCOPE_BLOCK, GLM_SCOPE_INDEXER, GLM_SCOPE_DENSE,
                        GLM_SCOPE_MOE, GLM_SCOPE_NEXTN,
                        /* MTP tensors the released files leave out: never written,
                         * bound when a file has them */
                        GLM_SCOPE_NEXTN_EXTRA };

/* Type class: the released files' type (sheet section 9) and what --type changes. */
enum glm_tensor_class {
    GLM_TC_F32,          /* norms, router, router bias, indexer head weights */
    GLM_TC_Q8,           /* Q8_0 in released files: attention, indexer, dense, shared expert, embeddings, head */
    GLM_TC_EXP_GATE_UP,  /* routed gate/up experts */
    GLM_TC_EXP_DOWN,     /* routed down experts */
};

typedef struct glm_tensor_desc {
    const char *name;              /* global name, or per-block suffix after "blk.N." */
    enum glm_tensor_scope scope;
    enum glm_tensor_class cls;
    bool optional;                 /* the binder accepts its absence */
} glm_tensor_desc;

extern const glm_tensor_desc ds4_glm_tensor_table[GLM_T_COUNT];

/* Whether the written layout has tensor id at block `layer` (-1 for
 * globals); GLM_SCOPE_NEXTN_EXTRA tensors never are. */
bool ds4_glm_tensor_present(const glm_hparams *hp, enum glm_tensor_id id, int layer);
int ds4_glm_tensor_shape(const glm_hparams *hp, enum glm_tensor_id id, int layer, uint64_t ne[4]);
int ds4_glm_tensor_name(enum glm_tensor_id id, int layer, char *buf, size_t n);
/* ggml type of the tensor in a mix. f32: all F32; f16: F32 class stays F32;
 * q8_0: Q8_0 matrices and experts; q2 / q4: Q8_0 matrices, routed experts
 * Q2_K / Q4_K (the antirez GLM-5.2 RoutedQ2K / RoutedQ4K mixes). */
uint32_t ds4_glm_tensor_type(enum glm_tensor_id id, enum ds4_mix mix);

#endif
