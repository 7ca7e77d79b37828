/* model.c -- DS4 config from metadata, tensor binding and validation. */
#include "models/dsv4/model.h"
#include "models/dsv4/ds4_layout.h"
#include "format/gguf.h"
#include "kernels/quant.h"
#include "format/tensor_bind.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- metadata ---- */

static int key_int(ds4_binder *b, const char *key, int min, int max) {
    uint64_t v = 0;
    if (b->failed) return min;
    if (!ds4_gguf_get_u64(b->g, key, &v)) { ds4_bind_fail(b, "missing or non-integer key %s", key); return min; }
    if (v < (uint64_t)min || v > (uint64_t)max) {
        ds4_bind_fail(b, "key %s = %llu out of range [%d, %d]", key, (unsigned long long)v, min, max);
        return min;
    }
    return (int)v;
}

static float key_float(ds4_binder *b, const char *key) {
    float v = 0;
    if (b->failed) return 0;
    if (!ds4_gguf_get_f32(b->g, key, &v) || !isfinite(v)) ds4_bind_fail(b, "missing or non-numeric key %s", key);
    return v;
}

/* Per-layer array key (compress ratios, clamps): at least n_layer numeric entries. */
static const ds4_gguf_kv *key_layer_array(ds4_binder *b, const char *key, int n_layer) {
    if (b->failed) return NULL;
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(b->g, key);
    if (!kv || kv->type != DS4_GGUF_ARRAY || kv->arr_type == DS4_GGUF_STRING) {
        ds4_bind_fail(b, "missing numeric array key %s", key);
        return NULL;
    }
    if (kv->arr_n < (uint64_t)n_layer) {
        ds4_bind_fail(b, "key %s has %llu entries, need %d", key, (unsigned long long)kv->arr_n, n_layer);
        return NULL;
    }
    return kv;
}

static void read_clamps(ds4_binder *b, const ds4_gguf_kv *kv, const char *key, float *dst, int n) {
    for (int l = 0; kv && l < n && !b->failed; l++) {
        double v;
        if (!ds4_gguf_arr_f64(kv, (uint64_t)l, &v) || !(v > 0) || !isfinite(v)) ds4_bind_fail(b, "key %s[%d] invalid", key, l);
        else dst[l] = (float)v;
    }
}

#define K(s) "deepseek4." s

/* Largest compress ratio accepted. The frontier ring holds coff * ratio
 * positions of every compressed layer, so a ratio far beyond Flash's 128
 * would only turn a corrupt file into a multi-gigabyte allocation. */
#define DS4_MAX_COMPRESS_RATIO 65536

static void read_config(ds4_binder *b, ds4_config *c) {
    c->n_layer = key_int(b, K("block_count"), 1, DS4_MAX_LAYERS);
    c->n_embd = key_int(b, K("embedding_length"), 1, 1 << 20);
    c->n_vocab = key_int(b, K("vocab_size"), 1, 1 << 24);
    c->n_head = key_int(b, K("attention.head_count"), 1, 4096);
    int n_head_kv = key_int(b, K("attention.head_count_kv"), 1, 4096);
    c->head_dim = key_int(b, K("attention.key_length"), 2, 1 << 16);
    int v_len = key_int(b, K("attention.value_length"), 2, 1 << 16);
    c->n_rot = key_int(b, K("rope.dimension_count"), 2, 1 << 16);
    c->q_lora = key_int(b, K("attention.q_lora_rank"), 1, 1 << 20);
    c->o_lora = key_int(b, K("attention.output_lora_rank"), 1, 1 << 20);
    c->o_groups = key_int(b, K("attention.output_group_count"), 1, 4096);
    /* window and top-k size per-token buffers but no tensor: bounded here */
    c->window = key_int(b, K("attention.sliding_window"), 1, 1 << 16);
    c->compress_rope_base = key_float(b, K("attention.compress_rope_freq_base"));
    c->rope_base = key_float(b, K("rope.freq_base"));
    c->yarn_factor = key_float(b, K("rope.scaling.factor"));
    uint64_t orig = 0;
    if (!b->failed && !ds4_gguf_get_u64(b->g, K("rope.scaling.original_context_length"), &orig))
        ds4_bind_fail(b, "missing key " K("rope.scaling.original_context_length"));
    c->yarn_orig_ctx = orig;
    c->yarn_beta_fast = key_float(b, K("rope.scaling.yarn_beta_fast"));
    c->yarn_beta_slow = key_float(b, K("rope.scaling.yarn_beta_slow"));
    c->rms_eps = key_float(b, K("attention.layer_norm_rms_epsilon"));
    c->n_idx_head = key_int(b, K("attention.indexer.head_count"), 1, 4096);
    c->idx_head_dim = key_int(b, K("attention.indexer.key_length"), 2, 1 << 16);
    c->idx_topk = key_int(b, K("attention.indexer.top_k"), 1, 1 << 16);
    c->n_hc = key_int(b, K("hyper_connection.count"), 1, 64);
    c->sinkhorn_iters = key_int(b, K("hyper_connection.sinkhorn_iterations"), 1, 1000);
    c->hc_eps = key_float(b, K("hyper_connection.epsilon"));
    c->n_expert = key_int(b, K("expert_count"), 1, 1 << 16);
    c->n_expert_used = key_int(b, K("expert_used_count"), 1, 1 << 16);
    c->n_ff_exp = key_int(b, K("expert_feed_forward_length"), 1, 1 << 20);
    int n_shared = key_int(b, K("expert_shared_count"), 0, 64);
    c->n_hash_layer = key_int(b, K("hash_layer_count"), 0, 4096);
    c->expert_weights_scale = key_float(b, K("expert_weights_scale"));
    if (!b->failed && !ds4_gguf_get_bool(b->g, K("expert_weights_norm"), &c->expert_weights_norm))
        ds4_bind_fail(b, "missing bool key " K("expert_weights_norm"));
    if (b->failed) return;

    uint64_t ctx = 0;
    c->train_ctx = ds4_gguf_get_u64(b->g, K("context_length"), &ctx) ? ctx : 0;
    uint32_t u;
    if (ds4_gguf_get_u32(b->g, K("expert_gating_func"), &u) && u != 4)
        ds4_bind_fail(b, "key " K("expert_gating_func") " = %u, only 4 (sqrt-softplus) is DS4", u);
    if (ds4_gguf_get_u32(b->g, K("expert_group_count"), &u) && u != 0)
        ds4_bind_fail(b, "key " K("expert_group_count") " = %u, DS4 has no expert groups", u);

    if (n_head_kv != 1) ds4_bind_fail(b, "attention.head_count_kv = %d, DS4 has one shared KV head", n_head_kv);
    if (v_len != c->head_dim) ds4_bind_fail(b, "value_length %d != key_length %d", v_len, c->head_dim);
    if (c->n_rot > c->head_dim || c->n_rot > c->idx_head_dim || c->n_rot % 2)
        ds4_bind_fail(b, "rope.dimension_count %d does not fit the heads", c->n_rot);
    if (c->n_head % c->o_groups) ds4_bind_fail(b, "head_count %d not a multiple of output_group_count %d", c->n_head, c->o_groups);
    if (n_shared != 1) ds4_bind_fail(b, "expert_shared_count = %d, DS4 has one shared expert", n_shared);
    if (c->n_expert_used > c->n_expert) ds4_bind_fail(b, "expert_used_count > expert_count");
    if (c->n_hash_layer > c->n_layer) ds4_bind_fail(b, "hash_layer_count > block_count");
    /* The YaRN ramp (forward_cpu.c make_inv_freq) takes logarithms of the
     * betas and of both bases and needs the fast correction dim below the
     * slow one: anything else gives NaN or inverted frequencies, not an error. */
    if (c->rope_base <= 1) ds4_bind_fail(b, "rope.freq_base = %g, must be > 1", c->rope_base);
    if (c->compress_rope_base <= 1)
        ds4_bind_fail(b, "attention.compress_rope_freq_base = %g, must be > 1", c->compress_rope_base);
    if (c->yarn_factor < 1) ds4_bind_fail(b, "rope.scaling.factor = %g, must be >= 1", c->yarn_factor);
    if (c->yarn_orig_ctx == 0) ds4_bind_fail(b, "rope.scaling.original_context_length = 0, must be > 0");
    if (!(c->yarn_beta_fast > 0)) ds4_bind_fail(b, "rope.scaling.yarn_beta_fast = %g, must be > 0", c->yarn_beta_fast);
    if (!(c->yarn_beta_slow > 0)) ds4_bind_fail(b, "rope.scaling.yarn_beta_slow = %g, must be > 0", c->yarn_beta_slow);
    if (c->yarn_beta_fast < c->yarn_beta_slow)
        ds4_bind_fail(b, "rope.scaling.yarn_beta_fast %g < yarn_beta_slow %g: the pair is reversed", c->yarn_beta_fast,
             c->yarn_beta_slow);
    if (b->failed) return;

    c->compress_ratio = calloc((size_t)c->n_layer, sizeof(int));
    c->attn_kind = calloc((size_t)c->n_layer, sizeof(uint32_t));
    c->clamp_exp = calloc((size_t)c->n_layer, sizeof(float));
    c->clamp_shexp = calloc((size_t)c->n_layer, sizeof(float));
    if (!c->compress_ratio || !c->attn_kind || !c->clamp_exp || !c->clamp_shexp) { ds4_bind_fail_oom(b, "the layer schedule"); return; }
    /* The forward pass implements three kinds of layer (ds4_layout.h): raw
     * window only (ratio 0), CSA (overlapping windows, coff 2, with the
     * indexer) and HCA (non-overlapping windows), each compressed kind at
     * any ratio >= 2. Ratio 1 would compress nothing and is no DS4 layer. */
    const ds4_gguf_kv *kr = key_layer_array(b, K("attention.compress_ratios"), c->n_layer);
    for (int l = 0; kr && l < c->n_layer && !b->failed; l++) {
        int64_t r;
        if (!ds4_gguf_arr_i64(kr, (uint64_t)l, &r)) ds4_bind_fail(b, "compress_ratios[%d] is not an integer", l);
        else if (r < 0 || r == 1 || r > DS4_MAX_COMPRESS_RATIO)
            ds4_bind_fail(b, "compress_ratios[%d] = %lld; supported: 0 (no compressor) or a ratio in 2..%d", l,
                 (long long)r, DS4_MAX_COMPRESS_RATIO);
        else c->compress_ratio[l] = (int)r;
    }
    if (!b->failed) {
        uint32_t ratio[DS4_MAX_LAYERS];
        char err[200];
        for (int l = 0; l < c->n_layer; l++) ratio[l] = (uint32_t)c->compress_ratio[l];
        if (ds4_layer_kinds_read(b->g, ratio, (uint32_t)c->n_layer, c->attn_kind, err, sizeof err))
            ds4_bind_fail(b, "%s", err);
    }
    const ds4_gguf_kv *ke = key_layer_array(b, K("swiglu_clamp_exp"), c->n_layer);
    read_clamps(b, ke, K("swiglu_clamp_exp"), c->clamp_exp, c->n_layer);
    /* the shared-expert limit defaults to the routed one when absent */
    const ds4_gguf_kv *ks = ds4_gguf_find_kv(b->g, K("swiglu_clamp_shexp"));
    if (ks) read_clamps(b, key_layer_array(b, K("swiglu_clamp_shexp"), c->n_layer), K("swiglu_clamp_shexp"),
                        c->clamp_shexp, c->n_layer);
    else if (!b->failed) memcpy(c->clamp_shexp, c->clamp_exp, (size_t)c->n_layer * sizeof(float));
}

/* ---- tensors ---- */

/* Names and expected shapes come from the shared layout table (ds4_layout.h),
 * so the binder, the converter and the model maker cannot disagree. */
static ds4_tensor bind_matrix(ds4_binder *b, const ds4_hparams *hp, enum ds4_tensor_id id, int l) {
    char name[160];
    uint64_t ne[4];
    ds4_tensor_name(id, l, name, sizeof name);
    return ds4_bind_matrix(b, name, ds4_tensor_shape(hp, id, l, ne), ne);
}

/* Small float tensors are converted to f32 once. */
static float *bind_floats(ds4_binder *b, const ds4_hparams *hp, enum ds4_tensor_id id, int l) {
    char name[160];
    uint64_t ne[4];
    ds4_tensor_name(id, l, name, sizeof name);
    return ds4_bind_floats(b, name, ds4_tensor_shape(hp, id, l, ne), ne);
}

/* Layer l of c, its tensors named as layer `named` (l itself, or DS4_LAYER_MTP). */
static void bind_layer(ds4_binder *b, const ds4_config *c, const ds4_hparams *hp, int l, int named, ds4_layer *L) {
    L->hc_attn_fn = bind_matrix(b, hp, DS4_T_HC_ATTN_FN, named);
    L->hc_attn_scale = bind_floats(b, hp, DS4_T_HC_ATTN_SCALE, named);
    L->hc_attn_base = bind_floats(b, hp, DS4_T_HC_ATTN_BASE, named);
    L->attn_norm = bind_floats(b, hp, DS4_T_ATTN_NORM, named);
    L->q_a = bind_matrix(b, hp, DS4_T_ATTN_Q_A, named);
    L->q_a_norm = bind_floats(b, hp, DS4_T_ATTN_Q_A_NORM, named);
    L->q_b = bind_matrix(b, hp, DS4_T_ATTN_Q_B, named);
    L->kv = bind_matrix(b, hp, DS4_T_ATTN_KV, named);
    L->kv_norm = bind_floats(b, hp, DS4_T_ATTN_KV_A_NORM, named);
    L->sinks = bind_floats(b, hp, DS4_T_ATTN_SINKS, named);
    L->out_a = bind_matrix(b, hp, DS4_T_ATTN_OUTPUT_A, named);
    L->out_b = bind_matrix(b, hp, DS4_T_ATTN_OUTPUT_B, named);
    L->hc_ffn_fn = bind_matrix(b, hp, DS4_T_HC_FFN_FN, named);
    L->hc_ffn_scale = bind_floats(b, hp, DS4_T_HC_FFN_SCALE, named);
    L->hc_ffn_base = bind_floats(b, hp, DS4_T_HC_FFN_BASE, named);
    L->ffn_norm = bind_floats(b, hp, DS4_T_FFN_NORM, named);
    L->gate_inp = bind_matrix(b, hp, DS4_T_FFN_GATE_INP, named);
    L->gate_exps = bind_matrix(b, hp, DS4_T_FFN_GATE_EXPS, named);
    L->up_exps = bind_matrix(b, hp, DS4_T_FFN_UP_EXPS, named);
    L->down_exps = bind_matrix(b, hp, DS4_T_FFN_DOWN_EXPS, named);
    L->gate_shexp = bind_matrix(b, hp, DS4_T_FFN_GATE_SHEXP, named);
    L->up_shexp = bind_matrix(b, hp, DS4_T_FFN_UP_SHEXP, named);
    L->down_shexp = bind_matrix(b, hp, DS4_T_FFN_DOWN_SHEXP, named);

    char name[160];
    uint64_t ne[4];
    if (l < c->n_hash_layer) {
        ds4_tensor_name(DS4_T_FFN_GATE_TID2EID, named, name, sizeof name);
        const ds4_gguf_tensor *t = ds4_bind_find(b, name, ds4_tensor_shape(hp, DS4_T_FFN_GATE_TID2EID, named, ne), ne);
        if (t && t->type != DS4_TYPE_I32) ds4_bind_fail(b, "tensor %s must be I32", name);
        if (t && !b->failed) {
            L->tid2eid = t->data;
            for (uint64_t i = 0; i < t->n_elements; i++)
                if (L->tid2eid[i] < 0 || L->tid2eid[i] >= c->n_expert) { ds4_bind_fail(b, "tensor %s holds expert id %d", name, L->tid2eid[i]); break; }
        }
    } else {
        ds4_tensor_name(DS4_T_EXP_PROBS_B, named, name, sizeof name);
        if (ds4_gguf_find_tensor(b->g, name)) L->exp_probs_b = bind_floats(b, hp, DS4_T_EXP_PROBS_B, named);
    }

    if (c->compress_ratio[l]) {
        L->comp_ape = bind_floats(b, hp, DS4_T_COMP_APE, named);
        L->comp_kv = bind_matrix(b, hp, DS4_T_COMP_KV, named);
        L->comp_gate = bind_matrix(b, hp, DS4_T_COMP_GATE, named);
        L->comp_norm = bind_floats(b, hp, DS4_T_COMP_NORM, named);
    }
    if (c->compress_ratio[l] && ds4_cfg_has_indexer(c, l)) {
        L->idx_q_b = bind_matrix(b, hp, DS4_T_IDX_Q_B, named);
        L->idx_proj = bind_matrix(b, hp, DS4_T_IDX_PROJ, named);
        L->idx_ape = bind_floats(b, hp, DS4_T_IDX_COMP_APE, named);
        L->idx_kv = bind_matrix(b, hp, DS4_T_IDX_COMP_KV, named);
        L->idx_gate = bind_matrix(b, hp, DS4_T_IDX_COMP_GATE, named);
        L->idx_norm = bind_floats(b, hp, DS4_T_IDX_COMP_NORM, named);
    }
}

/* The layout table's shape rules need only these hyperparameters; they are
 * taken from the validated config rather than re-read from metadata. */
static void shape_hparams(const ds4_config *c, ds4_hparams *hp) {
    memset(hp, 0, sizeof *hp);
    hp->n_layer = (uint32_t)c->n_layer;
    hp->n_embd = (uint32_t)c->n_embd;
    hp->n_vocab = (uint32_t)c->n_vocab;
    hp->n_head = (uint32_t)c->n_head;
    hp->key_length = hp->value_length = (uint32_t)c->head_dim;
    hp->q_lora_rank = (uint32_t)c->q_lora;
    hp->o_lora_rank = (uint32_t)c->o_lora;
    hp->o_groups = (uint32_t)c->o_groups;
    hp->idx_n_head = (uint32_t)c->n_idx_head;
    hp->idx_head_dim = (uint32_t)c->idx_head_dim;
    hp->hc_count = (uint32_t)c->n_hc;
    hp->n_expert = (uint32_t)c->n_expert;
    hp->n_expert_used = (uint32_t)c->n_expert_used;
    hp->expert_ff = (uint32_t)c->n_ff_exp;
    hp->n_hash_layer = (uint32_t)c->n_hash_layer;
    for (int l = 0; l < c->n_layer; l++) {
        hp->compress_ratio[l] = (uint32_t)c->compress_ratio[l];
        hp->attn_kind[l] = c->attn_kind[l];
    }
}

static void free_layer(ds4_layer *L) {
    float *owned[] = {L->hc_attn_scale, L->hc_attn_base, L->hc_ffn_scale, L->hc_ffn_base, L->attn_norm,
                      L->q_a_norm, L->kv_norm, L->sinks, L->ffn_norm, L->comp_ape, L->comp_norm,
                      L->idx_ape, L->idx_norm, L->exp_probs_b};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) free(owned[i]);
}

void ds4_model_free(ds4_model *m) {
    if (!m) return;
    for (int l = 0; m->layers && l < m->cfg.n_layer; l++) free_layer(&m->layers[l]);
    free(m->layers);
    free(m->output_hc_scale);
    free(m->output_hc_base);
    free(m->output_norm);
    free(m->cfg.compress_ratio);
    free(m->cfg.attn_kind);
    free(m->cfg.clamp_exp);
    free(m->cfg.clamp_shexp);
    free(m->mtp_enorm);
    free(m->mtp_hnorm);
    free(m);
}

/* A layer number: decimal digits only, below DS4_MAX_LAYERS; *end past it. */
static bool layer_number(const char *s, const char **end, int *out) {
    long v = 0;
    const char *p = s;
    while (*p >= '0' && *p <= '9' && v < DS4_MAX_LAYERS) v = v * 10 + (*p++ - '0');
    *end = p;
    *out = (int)v;
    return p > s && v < DS4_MAX_LAYERS;
}

bool ds4_layer_slice_parse(const char *s, ds4_layer_slice *out, char *err, size_t errlen) {
    const char *p;
    int a, b = -1;
    if (layer_number(s, &p, &a) && *p == ':' &&
        (!strcmp(p + 1, "output") || (layer_number(p + 1, &p, &b) && !*p && b >= a))) {
        *out = (ds4_layer_slice){a, b, b < 0};
        return true;
    }
    snprintf(err, errlen, "--layers %s: expected A:B (inclusive, A <= B < %d) or A:output", s, DS4_MAX_LAYERS);
    return false;
}

bool ds4_layer_slice_resolve(ds4_layer_slice *s, int n_layer, char *err, size_t errlen) {
    if (s->last < 0) s->last = n_layer - 1;
    if (s->last < n_layer) return true;
    snprintf(err, errlen, "%d:%d: the model has layers 0..%d", s->first, s->last, n_layer - 1);
    return false;
}

static bool file_has(const ds4_gguf *g, enum ds4_tensor_id id, int l) {
    char name[96];
    ds4_tensor_name(id, l, name, sizeof name);
    return ds4_gguf_find_tensor(g, name) != NULL;
}

/* Every layer has attn_norm and ffn_norm: either one means the layer is there. */
static bool file_has_layer(const ds4_gguf *g, int l) {
    return file_has(g, DS4_T_ATTN_NORM, l) || file_has(g, DS4_T_FFN_NORM, l);
}

/* The range a file holds: its slice keys; without them, the first run of
 * layers whose tensors it has, and the head when it has any of output_norm
 * or output.weight, so a range file from a tool that writes no ds4.* keys
 * (llama.cpp-based split workflows) still loads with its own range and
 * refuses a wider one with the same line, while a whole file missing one
 * head or layer tensor still fails binding with that tensor's name. A file
 * with no layer tensors at all, or with layers after a gap, counts as whole
 * for the same reason. */
static ds4_layer_slice file_slice(ds4_binder *b, int n_layer) {
    ds4_layer_slice f = {0, n_layer - 1, true};
    if (!ds4_gguf_find_kv(b->g, DS4_SLICE_KEY_FIRST)) {
        int first = 0;
        while (first < n_layer && !file_has_layer(b->g, first)) first++;
        if (first == n_layer) return f;
        int last = first;
        while (last + 1 < n_layer && file_has_layer(b->g, last + 1)) last++;
        for (int l = last + 1; l < n_layer; l++)
            if (file_has_layer(b->g, l)) return f;   /* layers after a gap: a damaged whole file */
        return (ds4_layer_slice){first, last, file_has(b->g, DS4_T_OUTPUT_NORM, -1) || file_has(b->g, DS4_T_OUTPUT, -1)};
    }
    f.first = key_int(b, DS4_SLICE_KEY_FIRST, 0, n_layer - 1);
    f.last = key_int(b, DS4_SLICE_KEY_LAST, f.first, n_layer - 1);
    if (!b->failed && !ds4_gguf_get_bool(b->g, DS4_SLICE_KEY_OUTPUT, &f.output))
        ds4_bind_fail(b, "missing bool key " DS4_SLICE_KEY_OUTPUT);
    return f;
}

static const char *slice_text(const ds4_layer_slice *s, char *buf, size_t n) {
    snprintf(buf, n, "layers %d..%d%s", s->first, s->last, s->output ? " and the output head" : "");
    return buf;
}

ds4_model *ds4_model_bind_slice(const ds4_gguf *g, const ds4_layer_slice *want, char *err, size_t errlen) {
    ds4_binder b = {g, "not a DeepSeek V4 GGUF: ", err, errlen, false};
    ds4_model *m = calloc(1, sizeof *m);
    if (!m) { snprintf(err, errlen, "out of memory for the model"); return NULL; }
    ds4_config *c = &m->cfg;
    ds4_gguf_str arch;
    if (!ds4_gguf_get_str(g, "general.architecture", &arch))
        ds4_bind_fail(&b, "no general.architecture key");
    else if (arch.len != 9 || memcmp(arch.ptr, "deepseek4", 9))
        ds4_bind_fail(&b, "general.architecture is \"%.*s\", not \"deepseek4\"", (int)(arch.len < 64 ? arch.len : 64),
                      arch.ptr);
    read_config(&b, c);
    const ds4_layer_slice held = b.failed ? DS4_SLICE_ALL : file_slice(&b, c->n_layer);
    ds4_layer_slice *sl = &m->slice;
    *sl = want ? *want : held;
    char why[128];
    if (!b.failed && !ds4_layer_slice_resolve(sl, c->n_layer, why, sizeof why)) {
        snprintf(err, errlen, "--layers %s", why);
        b.failed = true;
    }
    m->binds_file = sl->first == held.first && sl->last == held.last && sl->output == held.output;
    if (!b.failed && (sl->first < held.first || sl->last > held.last || (sl->output && !held.output))) {
        char h[80], w[80];
        snprintf(err, errlen, "this file holds %s; %s asked for", slice_text(&held, h, sizeof h),
                 slice_text(sl, w, sizeof w));
        b.failed = true;
    }
    if (!b.failed) {
        ds4_hparams hp;
        shape_hparams(c, &hp);
        if (sl->first == 0) m->token_embd = bind_matrix(&b, &hp, DS4_T_TOKEN_EMBD, 0);
        if (sl->output) {
            m->output_hc_fn = bind_matrix(&b, &hp, DS4_T_OUTPUT_HC_FN, 0);
            m->output_hc_scale = bind_floats(&b, &hp, DS4_T_OUTPUT_HC_SCALE, 0);
            m->output_hc_base = bind_floats(&b, &hp, DS4_T_OUTPUT_HC_BASE, 0);
            m->output_norm = bind_floats(&b, &hp, DS4_T_OUTPUT_NORM, 0);
            m->output = bind_matrix(&b, &hp, DS4_T_OUTPUT, 0);
        }
        m->layers = calloc((size_t)c->n_layer, sizeof(ds4_layer));
        if (!m->layers) ds4_bind_fail_oom(&b, "the layer table");
        for (int l = sl->first; l <= sl->last && !b.failed; l++) bind_layer(&b, c, &hp, l, l, &m->layers[l]);
    }
    if (b.failed) { ds4_model_free(m); return NULL; }
    ds4_gguf_str name;
    if (ds4_gguf_get_str(g, "general.name", &name))
        snprintf(m->name, sizeof m->name, "%.*s", (int)(name.len < 127 ? name.len : 127), name.ptr);
    else
        snprintf(m->name, sizeof m->name, "deepseek4");
    m->file_bytes = ds4_gguf_file_bytes(g);
    return m;
}

ds4_model *ds4_model_bind(const ds4_gguf *g, char *err, size_t errlen) {
    return ds4_model_bind_slice(g, NULL, err, errlen);
}

int ds4_model_expert_bits(const ds4_model *m) {
    switch (m->layers[m->slice.first].gate_exps.type) {
    case DS4_TYPE_IQ2_XXS: case DS4_TYPE_Q2_K: return 2;
    case DS4_TYPE_Q3_K: return 3;
    case DS4_TYPE_Q4_K: return 4;
    case DS4_TYPE_Q5_K: return 5;
    case DS4_TYPE_Q6_K: return 6;
    case DS4_TYPE_Q8_0: return 8;
    case DS4_TYPE_F16: case DS4_TYPE_BF16: return 16;
    default: return 32;
    }
}

/* ---- MTP support files ---- */

static ds4_tensor bind_mtp_matrix(ds4_binder *b, const ds4_hparams *hp, enum ds4_mtp_tensor_id id) {
    char name[160];
    uint64_t ne[4];
    ds4_mtp_tensor_name(id, name, sizeof name);
    return ds4_bind_matrix(b, name, ds4_mtp_tensor_shape(hp, id, ne), ne);
}

static float *bind_mtp_floats(ds4_binder *b, const ds4_hparams *hp, enum ds4_mtp_tensor_id id) {
    char name[160];
    uint64_t ne[4];
    ds4_mtp_tensor_name(id, name, sizeof name);
    return ds4_bind_floats(b, name, ds4_mtp_tensor_shape(hp, id, ne), ne);
}

/* The dimensions the block shares with its main model: a support file whose
 * keys differ in any of them was made for another model. */
static void check_same_model(ds4_binder *b, const ds4_config *file, const ds4_config *main_cfg) {
#define SAME(field, key)                                                                                  \
    if (!b->failed && file->field != main_cfg->field)                                                     \
        ds4_bind_fail(b, "it was made for another model (" key " %g, the model's %g)", (double)file->field, \
                      (double)main_cfg->field)
    SAME(n_embd, "embedding_length"); SAME(n_vocab, "vocab_size"); SAME(n_layer, "block_count");
    SAME(n_head, "attention.head_count"); SAME(head_dim, "attention.key_length"); SAME(n_rot, "rope.dimension_count");
    SAME(q_lora, "attention.q_lora_rank"); SAME(o_lora, "attention.output_lora_rank");
    SAME(o_groups, "attention.output_group_count"); SAME(window, "attention.sliding_window");
    SAME(n_hc, "hyper_connection.count"); SAME(n_expert, "expert_count"); SAME(n_expert_used, "expert_used_count");
    SAME(n_ff_exp, "expert_feed_forward_length"); SAME(rope_base, "rope.freq_base"); SAME(rms_eps, "rms epsilon");
#undef SAME
}

ds4_model *ds4_model_bind_mtp(const ds4_gguf *g, const ds4_model *main_model, char *err, size_t errlen) {
    ds4_binder b = {g, "not an MTP file for this model: ", err, errlen, false};
    const ds4_config *mc = &main_model->cfg;
    if (!main_model->slice.output || main_model->slice.first != 0) {
        snprintf(err, errlen, "the MTP block needs the token embedding and the output head in this process");
        return NULL;
    }
    if (ds4_gguf_arch_is(g, DS4_DSPARK_ARCH) || ds4_gguf_arch_is(g, DS4_DSPARK_SIDECAR_ARCH)) {
        snprintf(err, errlen, "a DSpark support file, not an MTP file: add --dspark to draft with it");
        return NULL;
    }
    ds4_model *m = calloc(1, sizeof *m);
    ds4_config file_cfg = {0};
    if (!m) { snprintf(err, errlen, "out of memory for the MTP block"); return NULL; }
    read_config(&b, &file_cfg);
    check_same_model(&b, &file_cfg, mc);
    free(file_cfg.compress_ratio); free(file_cfg.attn_kind); free(file_cfg.clamp_exp); free(file_cfg.clamp_shexp);
    /* the main model's configuration with the block as its only layer */
    ds4_config *c = &m->cfg;
    *c = *mc;
    c->n_layer = 1;
    c->n_hash_layer = 0;
    c->compress_ratio = calloc(1, sizeof *c->compress_ratio);
    c->attn_kind = calloc(1, sizeof *c->attn_kind);
    c->clamp_exp = malloc(sizeof *c->clamp_exp);
    c->clamp_shexp = malloc(sizeof *c->clamp_shexp);
    if (!c->compress_ratio || !c->attn_kind || !c->clamp_exp || !c->clamp_shexp) ds4_bind_fail_oom(&b, "the MTP block");
    if (!b.failed) {
        c->attn_kind[0] = DS4_ATTN_WINDOW;
        c->clamp_exp[0] = mc->clamp_exp[mc->n_layer - 1];
        c->clamp_shexp[0] = mc->clamp_shexp[mc->n_layer - 1];
    }
    m->slice = (ds4_layer_slice){0, 0, true};
    m->layers = calloc(1, sizeof(ds4_layer));
    if (!m->layers) ds4_bind_fail_oom(&b, "the MTP block");
    if (!b.failed) {
        ds4_hparams hp;
        shape_hparams(c, &hp);
        bind_layer(&b, c, &hp, 0, DS4_LAYER_MTP, &m->layers[0]);
        if (!b.failed && !m->layers[0].exp_probs_b) {
            char name[160];
            ds4_tensor_name(DS4_T_EXP_PROBS_B, DS4_LAYER_MTP, name, sizeof name);
            ds4_bind_fail(&b, "missing tensor %s", name);
        }
        m->mtp_e_proj = bind_mtp_matrix(&b, &hp, DS4_MTP_E_PROJ);
        m->mtp_h_proj = bind_mtp_matrix(&b, &hp, DS4_MTP_H_PROJ);
        m->mtp_enorm = bind_mtp_floats(&b, &hp, DS4_MTP_ENORM);
        m->mtp_hnorm = bind_mtp_floats(&b, &hp, DS4_MTP_HNORM);
        m->output_norm = bind_mtp_floats(&b, &hp, DS4_MTP_NORM);
        m->output_hc_fn = bind_mtp_matrix(&b, &hp, DS4_MTP_HC_HEAD_FN);
        m->output_hc_scale = bind_mtp_floats(&b, &hp, DS4_MTP_HC_HEAD_SCALE);
        m->output_hc_base = bind_mtp_floats(&b, &hp, DS4_MTP_HC_HEAD_BASE);
    }
    if (b.failed) { ds4_model_free(m); return NULL; }
    m->token_embd = main_model->token_embd;
    m->output = main_model->output;
    m->mtp = true;
    m->binds_file = true;
    snprintf(m->name, sizeof m->name, "%.120s MTP", main_model->name);
    m->file_bytes = ds4_gguf_file_bytes(g);
    return m;
}
