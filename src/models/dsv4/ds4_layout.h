/* ds4_layout.h -- the DS4 GGUF layout as data: every deepseek4.* metadata key
 * and every tensor (GGUF name, shape as a function of the hyperparameters,
 * which layers carry it, and its type in each file mix). The converter, the
 * random-model maker and the model binder all use this one table, so they
 * cannot disagree about names or shapes.
 *
 * Contract
 * - ds4_hparams holds every hyperparameter that has a GGUF key (sheet section
 *   2). Nothing here has a Flash default: whoever fills it (config.json, GGUF
 *   metadata, command-line flags) sets every field.
 * - ds4_hparams_write() writes general.architecture plus every key of the
 *   table with the GGUF type llama.cpp's deepseek4 loader requires (its
 *   get_key() accepts exactly the type of the hparams field: UINT32 for
 *   every count including context_length, FLOAT32, BOOL, arrays of UINT32 /
 *   FLOAT32 with one entry per layer); ds4_hparams_read() reads them back
 *   (accepting any integer/float type whose value fits, so older files with
 *   a UINT64 context_length still load) and fails with one line naming the
 *   first missing or invalid key.
 * - ds4_file_keys_write() writes the file-level keys the released files carry
 *   besides the hyperparameters: general.file_type (the llama_ftype of the
 *   mix), general.quantization_version and tokenizer.chat_template (the V4
 *   template, ds4_chat_template.c).
 * - ds4_hparams_check() rejects combinations the layout cannot express
 *   (heads not divisible into output groups, rotary dims wider than a head,
 *   more than DS4_MAX_LAYERS layers, zero sizes, ...).
 * - Layer kinds (attn_kind): DS4_ATTN_WINDOW = raw window only (ratio 0);
 *   DS4_ATTN_CSA = overlapping compressor (coff 2) with a lightning indexer;
 *   DS4_ATTN_HCA = non-overlapping compressor (coff 1), no indexer. The kind,
 *   not the ratio, decides the geometry: transformers picks it from
 *   layer_types, so a CSA layer may compress by 8 and an HCA layer by 4.
 *   The released files and llama.cpp carry only compress_ratios, where 4
 *   means CSA and any other nonzero ratio HCA (the official reference code's
 *   rule); ds4_hparams_write() adds DS4_KEY_LAYER_KINDS (UINT32 per layer)
 *   only when some layer departs from that rule, so files of the released
 *   shape keep exactly llama.cpp's keys, and ds4_layer_kinds_read() defaults
 *   a file without it from the ratios. Layers below n_hash_layer route by
 *   tid2eid, the others by top-k with exp_probs_b.
 * - Tensor shapes use GGUF order (ne[0] fastest); ds4_tensor_shape() returns
 *   n_dims. Per-layer names are "blk.<l>.<suffix>".
 * - Layer-range files (pipeline parallelism, docs/distributed.md):
 *   a file holding layers first..last carries DS4_SLICE_KEY_FIRST / _LAST /
 *   _OUTPUT (ds4_slice_keys_write) and exactly the tensors
 *   ds4_tensor_in_slice() admits: those layers' tensors, the token embedding
 *   when first == 0 and the output head (HC merge, norm, matrix) when output.
 *   Its deepseek4.* keys are the whole model's (block_count, every layer's
 *   schedule), so each piece knows the full route.
 */
#ifndef DS4_LAYOUT_H
#define DS4_LAYOUT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "format/layout_common.h"   /* ds4_hparam_key, its table walkers, enum ds4_mix */

struct ds4_gguf;
struct ds4_gguf_writer;

#define DS4_ARCH "deepseek4"
#define DS4_MAX_LAYERS 128
#define DS4_KEY_LAYER_KINDS "deepseek4.attention.layer_kinds"

/* Attention kind of a layer; the values are DS4_KEY_LAYER_KINDS's. */
enum ds4_attn_kind { DS4_ATTN_WINDOW = 0, DS4_ATTN_CSA = 1, DS4_ATTN_HCA = 2 };

/* The kind a file without DS4_KEY_LAYER_KINDS means by a ratio. */
static inline uint32_t ds4_attn_kind_of_ratio(uint32_t ratio) {
    return ratio == 0 ? DS4_ATTN_WINDOW : ratio == 4 ? DS4_ATTN_CSA : DS4_ATTN_HCA;
}

typedef struct ds4_hparams {
    uint32_t n_layer;              /* block_count */
    uint32_t n_ctx_train;          /* context_length */
    uint32_t n_embd;               /* embedding_length */
    uint32_t n_vocab;
    uint32_t n_head, n_head_kv;
    uint32_t key_length, value_length;  /* head dim (K = V, one shared KV head) */
    uint32_t n_rot;                /* rotary dims at the tail of each head */
    uint32_t q_lora_rank, o_lora_rank, o_groups;
    uint32_t sliding_window;
    uint32_t compress_ratio[DS4_MAX_LAYERS];
    uint32_t attn_kind[DS4_MAX_LAYERS];    /* enum ds4_attn_kind */
    float compress_rope_base, rope_base;
    float yarn_factor;
    uint32_t yarn_orig_ctx;
    float yarn_beta_fast, yarn_beta_slow;
    float rms_eps;
    uint32_t idx_n_head, idx_head_dim, idx_topk;
    uint32_t hc_count, hc_sinkhorn_iters;
    float hc_eps;
    uint32_t n_expert, n_expert_used, expert_ff, n_expert_shared, n_hash_layer;
    float expert_weights_scale;
    bool expert_weights_norm;
    uint32_t expert_gating_func;   /* 4 = sqrt(softplus) */
    float swiglu_clamp_exp[DS4_MAX_LAYERS], swiglu_clamp_shexp[DS4_MAX_LAYERS];
    uint32_t nextn_predict_layers;
} ds4_hparams;


extern const ds4_hparam_key ds4_hparam_keys[];
extern const size_t ds4_n_hparam_keys;

void ds4_hparams_write(struct ds4_gguf_writer *w, const ds4_hparams *hp);
int ds4_hparams_read(const struct ds4_gguf *g, ds4_hparams *hp, char *err, size_t errlen);
int ds4_hparams_check(const ds4_hparams *hp, char *err, size_t errlen);

/* Sets every layer's attn_kind from its compress ratio (the released files'
 * rule); for hparams filled from ratios alone. */
void ds4_hparams_default_kinds(ds4_hparams *hp);
/* Reads DS4_KEY_LAYER_KINDS into kinds[n_layer], or, when the file has no
 * such key, derives them from ratio[]; then checks every kind against its
 * ratio (a window-only layer has ratio 0, a compressed one a ratio >= 2).
 * -1 with one line in err on a bad array. */
int ds4_layer_kinds_read(const struct ds4_gguf *g, const uint32_t *ratio, uint32_t n_layer, uint32_t *kinds,
                         char *err, size_t errlen);

/* The released models' hyperparameters at their full depth (Flash: fact
 * sheet section 2; Pro: the published Pro configuration, sheet section 2's
 * Pro column where it agrees). ds4_v4_schedule() fills the per-layer arrays
 * (compress ratios, SwiGLU clamps) and the hash-layer count for hp->n_layer
 * layers, so a model maker keeps the model's shape with fewer layers. The
 * files carry no MTP block: nextn_predict_layers is 0. */
enum ds4_v4_model { DS4_V4_FLASH, DS4_V4_PRO };
void ds4_hparams_v4(ds4_hparams *hp, enum ds4_v4_model which);
void ds4_v4_schedule(ds4_hparams *hp, enum ds4_v4_model which);

static inline bool ds4_layer_compressed(const ds4_hparams *hp, int l) { return hp->compress_ratio[l] != 0; }
static inline bool ds4_layer_indexed(const ds4_hparams *hp, int l) { return hp->attn_kind[l] == DS4_ATTN_CSA; }
static inline uint32_t ds4_layer_coff(const ds4_hparams *hp, int l) { return ds4_layer_indexed(hp, l) ? 2 : 1; }
static inline bool ds4_layer_hashed(const ds4_hparams *hp, int l) { return (uint32_t)l < hp->n_hash_layer; }

/* ---- tensors ---- */
enum ds4_tensor_id {
    /* global */
    DS4_T_TOKEN_EMBD, DS4_T_OUTPUT_HC_FN, DS4_T_OUTPUT_HC_SCALE, DS4_T_OUTPUT_HC_BASE,
    DS4_T_OUTPUT_NORM, DS4_T_OUTPUT,
    /* every layer */
    DS4_T_HC_ATTN_FN, DS4_T_HC_ATTN_SCALE, DS4_T_HC_ATTN_BASE, DS4_T_ATTN_NORM,
    DS4_T_ATTN_Q_A, DS4_T_ATTN_Q_A_NORM, DS4_T_ATTN_Q_B, DS4_T_ATTN_KV, DS4_T_ATTN_KV_A_NORM,
    DS4_T_ATTN_SINKS, DS4_T_ATTN_OUTPUT_A, DS4_T_ATTN_OUTPUT_B,
    DS4_T_HC_FFN_FN, DS4_T_HC_FFN_SCALE, DS4_T_HC_FFN_BASE, DS4_T_FFN_NORM,
    DS4_T_FFN_GATE_INP, DS4_T_FFN_GATE_EXPS, DS4_T_FFN_UP_EXPS, DS4_T_FFN_DOWN_EXPS,
    DS4_T_FFN_GATE_SHEXP, DS4_T_FFN_UP_SHEXP, DS4_T_FFN_DOWN_SHEXP,
    /* routing: hash layers / top-k layers */
    DS4_T_FFN_GATE_TID2EID, DS4_T_EXP_PROBS_B,
    /* compressed layers */
    DS4_T_COMP_APE, DS4_T_COMP_KV, DS4_T_COMP_GATE, DS4_T_COMP_NORM,
    /* indexed (CSA) layers */
    DS4_T_IDX_Q_B, DS4_T_IDX_PROJ, DS4_T_IDX_COMP_APE, DS4_T_IDX_COMP_KV,
    DS4_T_IDX_COMP_GATE, DS4_T_IDX_COMP_NORM,
    DS4_T_COUNT
};

enum ds4_tensor_scope { DS4_SCOPE_GLOBAL, DS4_SCOPE_LAYER, DS4_SCOPE_HASH, DS4_SCOPE_TOPK,
                        DS4_SCOPE_COMPRESSED, DS4_SCOPE_INDEXED };

/* Type class: what the released files use, and what the converter's --type
 * touches. F32/I32 classes never change. */
enum ds4_tensor_class {
    DS4_TC_F32,        /* norms, sinks, HC scale/base, router bias */
    DS4_TC_I32,        /* tid2eid */
    DS4_TC_F16,        /* F16 in released files: embedding, HC fn, router, compressor, indexer */
    DS4_TC_Q8,         /* Q8_0 in released files: attention, shared expert, output head */
    DS4_TC_EXP_GATE_UP,/* routed gate/up experts */
    DS4_TC_EXP_DOWN,   /* routed down experts */
};

typedef struct ds4_tensor_desc {
    const char *name;              /* global name, or per-layer suffix after "blk.N." */
    enum ds4_tensor_scope scope;
    enum ds4_tensor_class cls;
} ds4_tensor_desc;

extern const ds4_tensor_desc ds4_tensor_table[DS4_T_COUNT];

/* File mixes. F32/F16: every float matrix in that type. Q8_0: the released
 * non-expert types (F16 class stays F16) with Q8_0 experts. Q2/Q4: the released
 * mixes (IQ2_XXS gate/up + Q2_K down; Q4_K experts). */
extern const char ds4_v4_chat_template[];
void ds4_file_keys_write(struct ds4_gguf_writer *w, enum ds4_mix mix);

bool ds4_tensor_present(const ds4_hparams *hp, enum ds4_tensor_id id, int layer);
/* Fills ne[0..3] (unused = 1); returns n_dims. layer is ignored for globals. */
int ds4_tensor_shape(const ds4_hparams *hp, enum ds4_tensor_id id, int layer, uint64_t ne[4]);
/* "blk.<layer>.<suffix>" or the global name; returns snprintf's result. */
int ds4_tensor_name(enum ds4_tensor_id id, int layer, char *buf, size_t n);
uint32_t ds4_tensor_type(enum ds4_tensor_id id, enum ds4_mix mix);   /* ggml type id */

/* ---- the MTP support file (one-stage multi-token prediction) ----
 * A support file carries the main model's deepseek4.* keys (so a file made
 * for another model is recognised at bind time) and the MTP block: one
 * window-only (ratio 0), top-k routed decoder block whose tensors are the
 * layer tensors of the table named "mtp.0.<suffix>", plus the MTP-only
 * tensors of ds4_mtp_tensor_table (the token and hidden-state projections,
 * their norms, its own HC merge and final norm). The token embedding and the
 * output matrix are the main model's.
 * - ds4_hparams_mtp_block() turns the main model's hparams into the block's:
 *   one layer, ratio 0, no hash routing, the main last layer's SwiGLU clamps.
 * - Layer DS4_LAYER_MTP in ds4_tensor_present / _shape / _name means layer 0
 *   of the block's hparams under the "mtp.0." names. */
#define DS4_LAYER_MTP (-2)
#define DS4_MTP_PREFIX "mtp.0."
enum ds4_mtp_tensor_id {
    DS4_MTP_E_PROJ, DS4_MTP_H_PROJ, DS4_MTP_ENORM, DS4_MTP_HNORM, DS4_MTP_NORM,
    DS4_MTP_HC_HEAD_FN, DS4_MTP_HC_HEAD_SCALE, DS4_MTP_HC_HEAD_BASE,
    DS4_MTP_COUNT
};
extern const ds4_tensor_desc ds4_mtp_tensor_table[DS4_MTP_COUNT];   /* names after DS4_MTP_PREFIX */
void ds4_hparams_mtp_block(const ds4_hparams *main_hp, ds4_hparams *block);
int ds4_mtp_tensor_shape(const ds4_hparams *hp, enum ds4_mtp_tensor_id id, uint64_t ne[4]);
int ds4_mtp_tensor_name(enum ds4_mtp_tensor_id id, char *buf, size_t n);
uint32_t ds4_mtp_tensor_type(enum ds4_mtp_tensor_id id, enum ds4_mix mix);

/* ---- the DSpark support file (block drafter, --dspark) ----
 * A DwarfStar layout (no public GGUF naming exists for this draft): the
 * dense draft of nemo-automodel's DeepSeek V4 DSpark module (dspark.h).
 * general.architecture "dspark"; keys DS4_DSPARK_KEY(x) = "dspark.x":
 *   embedding_length, vocab_size, target_block_count (the main model's
 *   n_embd, n_vocab and layer count: a file for another model is refused),
 *   target_layers (i32 array, ascending, each 0..target_block_count - 2),
 *   block_count, block_size (1..16), mask_token_id, head_count, key_length,
 *   rope.dimension_count, rope.freq_base, q_lora_rank, output_group_count,
 *   output_lora_rank, feed_forward_length, markov_rank,
 *   layer_norm_rms_epsilon.
 * Tensors (ggml order: ne[0] is the input width; E embedding, V vocab, T
 * target layers, H heads of D, Q q-LoRA, G output groups of O, F
 * feed-forward, R Markov rank, C = E or E + R):
 *   dspark.fc.weight [T*E, E]      dspark.hidden_norm.weight [E]
 *   dspark.norm.weight [E]         dspark.markov_w1.weight [R, V]
 *   dspark.markov_w2.weight [R, V] dspark.confidence.weight [C, 1]
 *   dspark.confidence.bias [1]
 *   dspark.blk.N.: attn_norm [E], attn_q_a [E, Q], attn_q_a_norm [Q],
 *   attn_q_b [Q, H*D], attn_kv [E, D], attn_kv_a_norm [D], attn_sinks [H],
 *   attn_output_a [H*D/G, G*O], attn_output_b [G*O, E], ffn_norm [E],
 *   ffn_gate [E, F], ffn_up [E, F], ffn_down [F, E].
 * Matrices may be any type the CPU kernels multiply; vectors F32/F16/BF16.
 * The token embedding and the output matrix are the main model's. */
#define DS4_DSPARK_ARCH "dspark"
/* The released DeepSeek V4 Flash DSpark sidecar, as third-party converters
 * write it (no DwarfStar key of its own): general.architecture
 * "deepseek4-dspark"; keys dspark.block_size, markov_rank, noise_token_id,
 * stage_count (or n_layers), target_layer_ids (i32 array, ascending, each
 * 1..n_layer - 1: the layers whose input the drafter reads). Stage s is a
 * full V4 block named DS4_DSPARK_STAGE_PREFIX (mtp.s.) + the main model's
 * per-layer names (attn_*, hc_attn_*, hc_ffn_*, ffn_gate_inp, exp_probs_b,
 * ffn_*_exps, ffn_*_shexp; no compressor, no hash routing) with the main
 * model's shapes; mtp.0. adds main_proj [T*E, E] and main_norm [E]; the last
 * stage adds hc_head_fn / hc_head_scale / hc_head_base (as the main model's
 * output_hc_*), norm [E], markov_head.markov_w1 / markov_w2 [R, V] and
 * confidence_head.proj [E + R, 1]. */
#define DS4_DSPARK_SIDECAR_ARCH "deepseek4-dspark"
#define DS4_DSPARK_STAGE_PREFIX "mtp.%d."
#define DS4_DSPARK_STAGE_PREFIX_0 "mtp.0."
#define DS4_DSPARK_KEY(x) "dspark." x
#define DS4_DSPARK_PREFIX "dspark."
#define DS4_DSPARK_LAYER_PREFIX "dspark.blk.%d."

/* ---- layer-range files ---- */
/* u32, u32, bool. DwarfStar's own keys: llama.cpp-family readers ignore them. */
#define DS4_SLICE_KEY_FIRST "ds4.slice.first_layer"
#define DS4_SLICE_KEY_LAST "ds4.slice.last_layer"
#define DS4_SLICE_KEY_OUTPUT "ds4.slice.output"
void ds4_slice_keys_write(struct ds4_gguf_writer *w, uint32_t first, uint32_t last, bool output);
/* layer -1: a global tensor */
bool ds4_tensor_in_slice(enum ds4_tensor_id id, int layer, int first, int last, bool output);

#endif
