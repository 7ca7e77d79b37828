/* model.h -- DeepSeek V4 configuration from GGUF metadata and binding of
 * every tensor of the DS4 layout.
 *
 * Contract
 * - ds4_model_bind() reads every deepseek4.* key (all dimensions, the per-layer
 *   compress-ratio schedule, hash layer count, expert counts, clamps, RoPE and
 *   YaRN parameters) into ds4_config, then binds and validates every tensor of
 *   the layout for those dimensions: name, shape and an allowed type. Matrices
 *   may be any type the CPU kernels multiply (F32/F16/BF16/Q8_0/K-quants/
 *   IQ2_XXS); small vectors (norms, sinks, HC scale/base, compressor position
 *   bias, router bias) are copied to f32 once, so the forward pass reads plain
 *   floats. Nothing else is copied: matrices point into the mapping.
 * - Any missing key, wrong value type, missing tensor or wrong shape/type gives
 *   NULL and one line "not a DeepSeek V4 GGUF: <first problem>".
 * - The ds4_model does not own the ds4_gguf; it must outlive the model.
 * - Layer slices (pipeline parallelism, docs/distributed.md):
 *   ds4_model_bind_slice() binds only layers first..last, the token
 *   embedding when first == 0 and the output head (HC merge, norm, output
 *   matrix) when the slice owns it; every other tensor is neither looked up
 *   nor read, so its pages are never touched, and ds4_layer entries outside
 *   the slice stay zero. A file that holds only a layer range says so with
 *   DS4_SLICE_KEY_FIRST / _LAST / _OUTPUT (ds4_layout.h), or, without those
 *   keys, by which layers' tensors it has (the first run of layers, the head
 *   when output.weight is there); the slice asked for must lie inside it,
 *   and without a request the file's own range is bound. The config is
 *   always the whole model's (all layers' schedule), so positions, KV layout
 *   and hashes agree between the processes of a route.
 * - ds4_layer_slice_parse() reads "A:B" (inclusive) or "A:output"; the layer
 *   count is checked at bind time.
 */
#ifndef DS4_MODEL_H
#define DS4_MODEL_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "format/tensor.h"
#include "models/dsv4/ds4_layout.h"

struct ds4_gguf;

typedef struct {
    int n_layer, n_embd, n_vocab;
    int n_head, head_dim, n_rot;          /* one shared KV head of head_dim */
    int q_lora, o_lora, o_groups;
    int window;                           /* raw sliding window, current token included */
    int n_idx_head, idx_head_dim, idx_topk;
    int n_hc, sinkhorn_iters;
    int n_expert, n_expert_used, n_ff_exp, n_hash_layer;
    bool expert_weights_norm;
    float expert_weights_scale;
    float rms_eps, hc_eps;
    float rope_base, compress_rope_base;
    float yarn_factor, yarn_beta_fast, yarn_beta_slow;
    uint64_t yarn_orig_ctx, train_ctx;
    int *compress_ratio;                  /* [n_layer]: 0 = raw window only */
    uint32_t *attn_kind;                  /* [n_layer]: enum ds4_attn_kind (ds4_layout.h) */
    float *clamp_exp, *clamp_shexp;       /* [n_layer] SwiGLU limits */
} ds4_config;

typedef struct {
    ds4_tensor hc_attn_fn, hc_ffn_fn;
    float *hc_attn_scale, *hc_attn_base, *hc_ffn_scale, *hc_ffn_base;
    float *attn_norm, *q_a_norm, *kv_norm, *sinks, *ffn_norm;
    ds4_tensor q_a, q_b, kv, out_a, out_b;
    /* compressor (ratio != 0) */
    ds4_tensor comp_kv, comp_gate;
    float *comp_ape, *comp_norm;          /* ape: [ratio][coff*head_dim] */
    /* indexer (ratio 4 layers, i.e. overlapping compressor) */
    ds4_tensor idx_q_b, idx_proj, idx_kv, idx_gate;
    float *idx_ape, *idx_norm;
    /* routing: exactly one of tid2eid (hash layers) / exp_probs_b (may be NULL) */
    const int32_t *tid2eid;               /* [n_vocab][n_expert_used] */
    float *exp_probs_b;
    ds4_tensor gate_inp, gate_exps, up_exps, down_exps;
    ds4_tensor gate_shexp, up_shexp, down_shexp;
} ds4_layer;

/* Layers first..last inclusive; last < 0: through the final layer. */
typedef struct {
    int first, last;
    bool output;          /* the output head (logits) */
} ds4_layer_slice;

#define DS4_SLICE_ALL ((ds4_layer_slice){0, -1, true})

/* false (and a line in err) for anything but "A:B" with A <= B or "A:output" */
bool ds4_layer_slice_parse(const char *s, ds4_layer_slice *out, char *err, size_t errlen);
/* Turns "through the final layer" into n_layer - 1; false (and "A:B: the
 * model has layers 0..N", for the caller to prefix with its option) when
 * the slice ends past the model's last layer. */
bool ds4_layer_slice_resolve(ds4_layer_slice *s, int n_layer, char *err, size_t errlen);

typedef struct ds4_model {
    ds4_config cfg;
    ds4_layer_slice slice;                /* resolved: 0 <= first <= last < n_layer */
    ds4_tensor token_embd, output;
    ds4_tensor output_hc_fn;
    float *output_hc_scale, *output_hc_base, *output_norm;
    ds4_layer *layers;
    char name[128];
    uint64_t file_bytes;
    bool binds_file;                      /* the slice is all the file holds (its own range, or all of a whole file) */
    /* An MTP block (ds4_model_bind_mtp): its rows enter as
     * e_proj(enorm(embed(token))) + h_proj(hnorm(stream)) for each of the
     * n_hc streams of a hidden state the sequence brings (hidden_in). */
    bool mtp;
    ds4_tensor mtp_e_proj, mtp_h_proj;
    float *mtp_enorm, *mtp_hnorm;
} ds4_model;

ds4_model *ds4_model_bind(const struct ds4_gguf *g, char *err, size_t errlen);
/* want NULL: the file's own range (all of it for an ordinary file) */
ds4_model *ds4_model_bind_slice(const struct ds4_gguf *g, const ds4_layer_slice *want, char *err, size_t errlen);

/* The MTP block of an MTP support file (ds4_layout.h) as a one-layer model
 * for the main model `main`: layer 0 is the block (window-only, top-k
 * routed), the head is its own HC merge and norm over the main model's output
 * matrix, the token embedding is the main model's (both views of main's
 * mapping, which must outlive it). The file's deepseek4.* keys must describe
 * main's dimensions; a file for another model, a missing or misshapen tensor
 * gives NULL and one line ("not an MTP file for this model: ..."). */
ds4_model *ds4_model_bind_mtp(const struct ds4_gguf *g, const ds4_model *main_model, char *err, size_t errlen);

static inline bool ds4_model_has_layer(const ds4_model *m, int l) { return l >= m->slice.first && l <= m->slice.last; }
/* Whether this model computes logits from tokens alone (embedding, every layer, head). */
static inline bool ds4_model_is_whole(const ds4_model *m) {
    return m->slice.first == 0 && m->slice.last == m->cfg.n_layer - 1 && m->slice.output;
}
void ds4_model_free(ds4_model *m);

/* Compressor geometry of layer l: ratio, and coff = 2 when windows overlap
 * (a CSA layer: each token feeds its own and the next window, whatever the
 * ratio), else 1. Only CSA layers have the indexer. */
static inline int ds4_cfg_ratio(const ds4_config *c, int l) { return c->compress_ratio[l]; }
static inline bool ds4_cfg_has_indexer(const ds4_config *c, int l) { return c->attn_kind[l] == DS4_ATTN_CSA; }
static inline int ds4_cfg_coff(const ds4_config *c, int l) { return ds4_cfg_has_indexer(c, l) ? 2 : 1; }

/* Bits per weight class of the routed experts (2 for IQ2_XXS/Q2_K, 4 for Q4_K,
 * 8 for Q8_0, 16 for F16/BF16, 32 for F32). */
int ds4_model_expert_bits(const ds4_model *m);

#endif
