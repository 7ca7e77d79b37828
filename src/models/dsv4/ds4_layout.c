/* ds4_layout.c -- the DS4 GGUF layout tables (see ds4_layout.h). */
#include "models/dsv4/ds4_layout.h"
#include "format/gguf.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define K(name) "deepseek4." name
#define F(field) offsetof(ds4_hparams, field)

/* Optional keys are the ones ds4 itself does not read (llama.cpp-only or
 * informational), so files without them still load. */
const ds4_hparam_key ds4_hparam_keys[] = {
    {K("block_count"), DS4_HP_U32, F(n_layer), NULL, false},
    {K("context_length"), DS4_HP_U32, F(n_ctx_train), NULL, true},
    {K("embedding_length"), DS4_HP_U32, F(n_embd), NULL, false},
    {K("vocab_size"), DS4_HP_U32, F(n_vocab), NULL, false},
    {K("attention.head_count"), DS4_HP_U32, F(n_head), NULL, false},
    {K("attention.head_count_kv"), DS4_HP_U32, F(n_head_kv), NULL, false},
    {K("attention.key_length"), DS4_HP_U32, F(key_length), NULL, false},
    {K("attention.value_length"), DS4_HP_U32, F(value_length), NULL, false},
    {K("rope.dimension_count"), DS4_HP_U32, F(n_rot), NULL, false},
    {K("attention.q_lora_rank"), DS4_HP_U32, F(q_lora_rank), NULL, false},
    {K("attention.output_lora_rank"), DS4_HP_U32, F(o_lora_rank), NULL, false},
    {K("attention.output_group_count"), DS4_HP_U32, F(o_groups), NULL, false},
    {K("attention.sliding_window"), DS4_HP_U32, F(sliding_window), NULL, false},
    {K("attention.compress_ratios"), DS4_HP_U32_PER_LAYER, F(compress_ratio), NULL, false},
    {K("attention.compress_rope_freq_base"), DS4_HP_F32, F(compress_rope_base), NULL, false},
    {K("rope.freq_base"), DS4_HP_F32, F(rope_base), NULL, false},
    {K("rope.scaling.type"), DS4_HP_STR_CONST, 0, "yarn", true},
    {K("rope.scaling.factor"), DS4_HP_F32, F(yarn_factor), NULL, false},
    {K("rope.scaling.original_context_length"), DS4_HP_U32, F(yarn_orig_ctx), NULL, false},
    {K("rope.scaling.yarn_beta_fast"), DS4_HP_F32, F(yarn_beta_fast), NULL, false},
    {K("rope.scaling.yarn_beta_slow"), DS4_HP_F32, F(yarn_beta_slow), NULL, false},
    {K("attention.layer_norm_rms_epsilon"), DS4_HP_F32, F(rms_eps), NULL, false},
    {K("attention.indexer.head_count"), DS4_HP_U32, F(idx_n_head), NULL, false},
    {K("attention.indexer.key_length"), DS4_HP_U32, F(idx_head_dim), NULL, false},
    {K("attention.indexer.top_k"), DS4_HP_U32, F(idx_topk), NULL, false},
    {K("hyper_connection.count"), DS4_HP_U32, F(hc_count), NULL, false},
    {K("hyper_connection.sinkhorn_iterations"), DS4_HP_U32, F(hc_sinkhorn_iters), NULL, false},
    {K("hyper_connection.epsilon"), DS4_HP_F32, F(hc_eps), NULL, false},
    {K("expert_count"), DS4_HP_U32, F(n_expert), NULL, false},
    {K("expert_used_count"), DS4_HP_U32, F(n_expert_used), NULL, false},
    {K("expert_feed_forward_length"), DS4_HP_U32, F(expert_ff), NULL, false},
    {K("expert_shared_count"), DS4_HP_U32, F(n_expert_shared), NULL, false},
    {K("hash_layer_count"), DS4_HP_U32, F(n_hash_layer), NULL, false},
    {K("expert_weights_scale"), DS4_HP_F32, F(expert_weights_scale), NULL, false},
    {K("expert_weights_norm"), DS4_HP_BOOL, F(expert_weights_norm), NULL, false},
    {K("expert_gating_func"), DS4_HP_U32, F(expert_gating_func), NULL, true},
    {K("swiglu_clamp_exp"), DS4_HP_F32_PER_LAYER, F(swiglu_clamp_exp), NULL, false},
    {K("swiglu_clamp_shexp"), DS4_HP_F32_PER_LAYER, F(swiglu_clamp_shexp), NULL, true},
    {K("nextn_predict_layers"), DS4_HP_U32, F(nextn_predict_layers), NULL, true},
};

#define N_KEYS (sizeof ds4_hparam_keys / sizeof ds4_hparam_keys[0])
const size_t ds4_n_hparam_keys = N_KEYS;

void ds4_hparams_write(struct ds4_gguf_writer *w, const ds4_hparams *hp) {
    ds4_gguf_w_str(w, "general.architecture", DS4_ARCH);
    ds4_hparam_table_write(w, ds4_hparam_keys, N_KEYS, hp, hp->n_layer);
    for (uint32_t l = 0; l < hp->n_layer; l++)
        if (hp->attn_kind[l] != ds4_attn_kind_of_ratio(hp->compress_ratio[l])) {
            ds4_gguf_w_arr(w, DS4_KEY_LAYER_KINDS, DS4_GGUF_U32, hp->attn_kind, hp->n_layer);
            break;
        }
}

void ds4_hparams_default_kinds(ds4_hparams *hp) {
    for (uint32_t l = 0; l < hp->n_layer && l < DS4_MAX_LAYERS; l++)
        hp->attn_kind[l] = ds4_attn_kind_of_ratio(hp->compress_ratio[l]);
}

int ds4_layer_kinds_read(const struct ds4_gguf *g, const uint32_t *ratio, uint32_t n_layer, uint32_t *kinds,
                         char *err, size_t errlen) {
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, DS4_KEY_LAYER_KINDS);
    if (kv && (kv->type != DS4_GGUF_ARRAY || kv->arr_n != n_layer)) {
        snprintf(err, errlen, "key %s must be an array of %u layer kinds", DS4_KEY_LAYER_KINDS, n_layer);
        return -1;
    }
    for (uint32_t l = 0; l < n_layer; l++) {
        int64_t v = ds4_attn_kind_of_ratio(ratio[l]);
        if (kv && (!ds4_gguf_arr_i64(kv, l, &v) || v < DS4_ATTN_WINDOW || v > DS4_ATTN_HCA)) {
            snprintf(err, errlen, "%s[%u] is not 0 (window), 1 (CSA) or 2 (HCA)", DS4_KEY_LAYER_KINDS, l);
            return -1;
        }
        if ((v == DS4_ATTN_WINDOW) != (ratio[l] == 0)) {
            snprintf(err, errlen, "%s[%u] = %lld does not fit compress ratio %u (kind 0 exactly when the ratio is 0)",
                     DS4_KEY_LAYER_KINDS, l, (long long)v, ratio[l]);
            return -1;
        }
        kinds[l] = (uint32_t)v;
    }
    return 0;
}

int ds4_hparams_read(const struct ds4_gguf *g, ds4_hparams *hp, char *err, size_t errlen) {
    memset(hp, 0, sizeof *hp);
    /* block_count first: the per-layer arrays need it. */
    if (!ds4_gguf_get_u32(g, K("block_count"), &hp->n_layer) || hp->n_layer == 0 ||
        hp->n_layer > DS4_MAX_LAYERS) {
        snprintf(err, errlen, "missing or invalid key %s", K("block_count"));
        return -1;
    }
    if (ds4_hparam_table_read(g, ds4_hparam_keys, N_KEYS, hp, hp->n_layer, err, errlen)) return -1;
    if (!ds4_gguf_find_kv(g, K("swiglu_clamp_shexp")))
        memcpy(hp->swiglu_clamp_shexp, hp->swiglu_clamp_exp, sizeof hp->swiglu_clamp_exp);
    if (ds4_layer_kinds_read(g, hp->compress_ratio, hp->n_layer, hp->attn_kind, err, errlen)) return -1;
    return ds4_hparams_check(hp, err, errlen);
}

int ds4_hparams_check(const ds4_hparams *hp, char *err, size_t errlen) {
#define NEED(cond, ...) do { if (!(cond)) { snprintf(err, errlen, __VA_ARGS__); return -1; } } while (0)
    NEED(hp->n_layer > 0 && hp->n_layer <= DS4_MAX_LAYERS, "block_count %u out of range 1..%d",
         hp->n_layer, DS4_MAX_LAYERS);
    NEED(hp->n_embd && hp->n_vocab && hp->n_head && hp->key_length && hp->q_lora_rank &&
         hp->o_lora_rank && hp->o_groups && hp->sliding_window && hp->hc_count &&
         hp->hc_sinkhorn_iters && hp->n_expert && hp->n_expert_used && hp->expert_ff,
         "a model dimension is zero");
    NEED(hp->n_head_kv == 1, "head_count_kv is %u; the layout has one shared KV head", hp->n_head_kv);
    NEED(hp->value_length == hp->key_length, "value_length %u != key_length %u (K and V are shared)",
         hp->value_length, hp->key_length);
    NEED(hp->n_rot > 0 && hp->n_rot <= hp->key_length && hp->n_rot % 2 == 0,
         "rope.dimension_count %u invalid for head dim %u", hp->n_rot, hp->key_length);
    NEED(hp->n_head % hp->o_groups == 0, "head_count %u not divisible by output_group_count %u",
         hp->n_head, hp->o_groups);
    NEED(hp->n_expert_used <= hp->n_expert, "expert_used_count %u > expert_count %u",
         hp->n_expert_used, hp->n_expert);
    NEED(hp->n_expert_shared == 1, "expert_shared_count %u; the layout has one shared expert",
         hp->n_expert_shared);
    NEED(hp->n_hash_layer <= hp->n_layer, "hash_layer_count %u > block_count %u",
         hp->n_hash_layer, hp->n_layer);
    bool any_indexed = false;
    for (uint32_t l = 0; l < hp->n_layer; l++) {
        if (ds4_layer_indexed(hp, (int)l)) any_indexed = true;
        NEED(hp->attn_kind[l] <= DS4_ATTN_HCA && (hp->attn_kind[l] == DS4_ATTN_WINDOW) == (hp->compress_ratio[l] == 0),
             "layer %u: attention kind %u does not fit compress ratio %u", l, hp->attn_kind[l], hp->compress_ratio[l]);
        NEED(isfinite(hp->swiglu_clamp_exp[l]) && isfinite(hp->swiglu_clamp_shexp[l]),
             "swiglu clamp of layer %u is not finite", l);
    }
    if (any_indexed)
        NEED(hp->idx_n_head && hp->idx_head_dim && hp->idx_topk &&
             hp->n_rot <= hp->idx_head_dim, "indexer dimensions invalid");
    NEED(hp->rms_eps > 0 && hp->hc_eps > 0, "epsilons must be positive");
    NEED(hp->rope_base > 0 && hp->compress_rope_base > 0 && hp->yarn_factor > 0 && hp->yarn_orig_ctx,
         "RoPE/YaRN parameters invalid");
#undef NEED
    return 0;
}

/* Flash: 0, 0, then 4 on even and 128 on odd layers. Pro: the same from
 * layer 2 on, but its first two layers compress by 128 instead of keeping the
 * raw window only (published Pro configuration: layers 0-1 HCA, then CSA/HCA
 * alternating from a CSA layer 2, 30 ratio-4 layers of 61; the fact sheet's
 * transformers-default reading, 128 on layer 2, was not confirmed). Both: hash
 * routing on the first three layers, SwiGLU clamp 10 everywhere. */
void ds4_v4_schedule(ds4_hparams *hp, enum ds4_v4_model which) {
    for (uint32_t l = 0; l < hp->n_layer && l < DS4_MAX_LAYERS; l++) {
        if (l < 2) hp->compress_ratio[l] = which == DS4_V4_PRO ? 128 : 0;
        else hp->compress_ratio[l] = l % 2 == 0 ? 4 : 128;
        hp->attn_kind[l] = ds4_attn_kind_of_ratio(hp->compress_ratio[l]);
        hp->swiglu_clamp_exp[l] = hp->swiglu_clamp_shexp[l] = 10.0f;
    }
    hp->n_hash_layer = hp->n_layer < 3 ? hp->n_layer : 3;
}

/* What Flash and Pro share; the table below lists where they differ. Static
 * storage, so the padding is zero and a copy compares equal with memcmp. */
#define V4_SHARED .n_ctx_train = 1048576, .n_vocab = 129280, .n_head_kv = 1, .key_length = 512, \
    .value_length = 512, .n_rot = 64, .o_lora_rank = 1024, .sliding_window = 128, .compress_rope_base = 160000.0f, \
    .rope_base = 10000.0f, .yarn_factor = 16.0f, .yarn_orig_ctx = 65536, .yarn_beta_fast = 32.0f, \
    .yarn_beta_slow = 1.0f, .rms_eps = 1e-6f, .idx_n_head = 64, .idx_head_dim = 128, .hc_count = 4, \
    .hc_sinkhorn_iters = 20, .hc_eps = 1e-6f, .n_expert_used = 6, .n_expert_shared = 1, \
    .expert_weights_norm = true, .expert_gating_func = 4
static const ds4_hparams v4_models[] = {
    [DS4_V4_FLASH] = {V4_SHARED, .n_layer = 43, .n_embd = 4096, .n_head = 64, .q_lora_rank = 1024, .o_groups = 8,
                      .idx_topk = 512, .n_expert = 256, .expert_ff = 2048, .expert_weights_scale = 1.5f},
    [DS4_V4_PRO] = {V4_SHARED, .n_layer = 61, .n_embd = 7168, .n_head = 128, .q_lora_rank = 1536, .o_groups = 16,
                    .idx_topk = 1024, .n_expert = 384, .expert_ff = 3072, .expert_weights_scale = 2.5f},
};
#undef V4_SHARED

void ds4_hparams_v4(ds4_hparams *hp, enum ds4_v4_model which) {
    memcpy(hp, &v4_models[which], sizeof *hp);
    ds4_v4_schedule(hp, which);
}

/* ---- tensors ---- */

const ds4_tensor_desc ds4_tensor_table[DS4_T_COUNT] = {
    [DS4_T_TOKEN_EMBD]      = {"token_embd.weight", DS4_SCOPE_GLOBAL, DS4_TC_F16},
    [DS4_T_OUTPUT_HC_FN]    = {"output_hc_fn.weight", DS4_SCOPE_GLOBAL, DS4_TC_F16},
    [DS4_T_OUTPUT_HC_SCALE] = {"output_hc_scale.weight", DS4_SCOPE_GLOBAL, DS4_TC_F32},
    [DS4_T_OUTPUT_HC_BASE]  = {"output_hc_base.weight", DS4_SCOPE_GLOBAL, DS4_TC_F32},
    [DS4_T_OUTPUT_NORM]     = {"output_norm.weight", DS4_SCOPE_GLOBAL, DS4_TC_F32},
    [DS4_T_OUTPUT]          = {"output.weight", DS4_SCOPE_GLOBAL, DS4_TC_Q8},
    [DS4_T_HC_ATTN_FN]      = {"hc_attn_fn.weight", DS4_SCOPE_LAYER, DS4_TC_F16},
    [DS4_T_HC_ATTN_SCALE]   = {"hc_attn_scale.weight", DS4_SCOPE_LAYER, DS4_TC_F32},
    [DS4_T_HC_ATTN_BASE]    = {"hc_attn_base.weight", DS4_SCOPE_LAYER, DS4_TC_F32},
    [DS4_T_ATTN_NORM]       = {"attn_norm.weight", DS4_SCOPE_LAYER, DS4_TC_F32},
    [DS4_T_ATTN_Q_A]        = {"attn_q_a.weight", DS4_SCOPE_LAYER, DS4_TC_Q8},
    [DS4_T_ATTN_Q_A_NORM]   = {"attn_q_a_norm.weight", DS4_SCOPE_LAYER, DS4_TC_F32},
    [DS4_T_ATTN_Q_B]        = {"attn_q_b.weight", DS4_SCOPE_LAYER, DS4_TC_Q8},
    [DS4_T_ATTN_KV]         = {"attn_kv.weight", DS4_SCOPE_LAYER, DS4_TC_Q8},
    [DS4_T_ATTN_KV_A_NORM]  = {"attn_kv_a_norm.weight", DS4_SCOPE_LAYER, DS4_TC_F32},
    [DS4_T_ATTN_SINKS]      = {"attn_sinks.weight", DS4_SCOPE_LAYER, DS4_TC_F32},
    [DS4_T_ATTN_OUTPUT_A]   = {"attn_output_a.weight", DS4_SCOPE_LAYER, DS4_TC_Q8},
    [DS4_T_ATTN_OUTPUT_B]   = {"attn_output_b.weight", DS4_SCOPE_LAYER, DS4_TC_Q8},
    [DS4_T_HC_FFN_FN]       = {"hc_ffn_fn.weight", DS4_SCOPE_LAYER, DS4_TC_F16},
    [DS4_T_HC_FFN_SCALE]    = {"hc_ffn_scale.weight", DS4_SCOPE_LAYER, DS4_TC_F32},
    [DS4_T_HC_FFN_BASE]     = {"hc_ffn_base.weight", DS4_SCOPE_LAYER, DS4_TC_F32},
    [DS4_T_FFN_NORM]        = {"ffn_norm.weight", DS4_SCOPE_LAYER, DS4_TC_F32},
    [DS4_T_FFN_GATE_INP]    = {"ffn_gate_inp.weight", DS4_SCOPE_LAYER, DS4_TC_F16},
    [DS4_T_FFN_GATE_EXPS]   = {"ffn_gate_exps.weight", DS4_SCOPE_LAYER, DS4_TC_EXP_GATE_UP},
    [DS4_T_FFN_UP_EXPS]     = {"ffn_up_exps.weight", DS4_SCOPE_LAYER, DS4_TC_EXP_GATE_UP},
    [DS4_T_FFN_DOWN_EXPS]   = {"ffn_down_exps.weight", DS4_SCOPE_LAYER, DS4_TC_EXP_DOWN},
    [DS4_T_FFN_GATE_SHEXP]  = {"ffn_gate_shexp.weight", DS4_SCOPE_LAYER, DS4_TC_Q8},
    [DS4_T_FFN_UP_SHEXP]    = {"ffn_up_shexp.weight", DS4_SCOPE_LAYER, DS4_TC_Q8},
    [DS4_T_FFN_DOWN_SHEXP]  = {"ffn_down_shexp.weight", DS4_SCOPE_LAYER, DS4_TC_Q8},
    [DS4_T_FFN_GATE_TID2EID]= {"ffn_gate_tid2eid.weight", DS4_SCOPE_HASH, DS4_TC_I32},
    [DS4_T_EXP_PROBS_B]     = {"exp_probs_b.bias", DS4_SCOPE_TOPK, DS4_TC_F32},
    [DS4_T_COMP_APE]        = {"attn_compressor_ape.weight", DS4_SCOPE_COMPRESSED, DS4_TC_F16},
    [DS4_T_COMP_KV]         = {"attn_compressor_kv.weight", DS4_SCOPE_COMPRESSED, DS4_TC_F16},
    [DS4_T_COMP_GATE]       = {"attn_compressor_gate.weight", DS4_SCOPE_COMPRESSED, DS4_TC_F16},
    [DS4_T_COMP_NORM]       = {"attn_compressor_norm.weight", DS4_SCOPE_COMPRESSED, DS4_TC_F32},
    [DS4_T_IDX_Q_B]         = {"indexer.attn_q_b.weight", DS4_SCOPE_INDEXED, DS4_TC_F16},
    [DS4_T_IDX_PROJ]        = {"indexer.proj.weight", DS4_SCOPE_INDEXED, DS4_TC_F16},
    [DS4_T_IDX_COMP_APE]    = {"indexer_compressor_ape.weight", DS4_SCOPE_INDEXED, DS4_TC_F16},
    [DS4_T_IDX_COMP_KV]     = {"indexer_compressor_kv.weight", DS4_SCOPE_INDEXED, DS4_TC_F16},
    [DS4_T_IDX_COMP_GATE]   = {"indexer_compressor_gate.weight", DS4_SCOPE_INDEXED, DS4_TC_F16},
    [DS4_T_IDX_COMP_NORM]   = {"indexer_compressor_norm.weight", DS4_SCOPE_INDEXED, DS4_TC_F32},
};

void ds4_file_keys_write(struct ds4_gguf_writer *w, enum ds4_mix mix) {
    ds4_gguf_w_u32(w, "general.file_type", ds4_mix_file_type(mix));
    ds4_gguf_w_u32(w, "general.quantization_version", 2);
    ds4_gguf_w_str(w, "tokenizer.chat_template", ds4_v4_chat_template);
}

bool ds4_tensor_present(const ds4_hparams *hp, enum ds4_tensor_id id, int layer) {
    if (layer == DS4_LAYER_MTP) {
        if (ds4_tensor_table[id].scope == DS4_SCOPE_GLOBAL) return false;
        layer = 0;
    }
    switch (ds4_tensor_table[id].scope) {
    case DS4_SCOPE_GLOBAL: return layer < 0;
    case DS4_SCOPE_LAYER: return layer >= 0;
    case DS4_SCOPE_HASH: return layer >= 0 && ds4_layer_hashed(hp, layer);
    case DS4_SCOPE_TOPK: return layer >= 0 && !ds4_layer_hashed(hp, layer);
    case DS4_SCOPE_COMPRESSED: return layer >= 0 && ds4_layer_compressed(hp, layer);
    case DS4_SCOPE_INDEXED: return layer >= 0 && ds4_layer_indexed(hp, layer);
    }
    return false;
}

static int dims(uint64_t ne[4], uint64_t a, uint64_t b, uint64_t c) {
    ne[0] = a; ne[1] = b; ne[2] = c; ne[3] = 1;
    return c > 1 ? 3 : b > 1 ? 2 : 1;
}

int ds4_tensor_shape(const ds4_hparams *hp, enum ds4_tensor_id id, int layer, uint64_t ne[4]) {
    if (layer == DS4_LAYER_MTP) layer = 0;
    const uint64_t E = hp->n_embd, V = hp->n_vocab, H = hp->n_head, D = hp->key_length;
    const uint64_t hc = hp->hc_count, hc_mix = (2 + hc) * hc;
    const uint64_t X = hp->n_expert, Fe = hp->expert_ff;
    const uint64_t ratio = layer >= 0 ? hp->compress_ratio[layer] : 0;
    const uint64_t coff = layer >= 0 ? ds4_layer_coff(hp, layer) : 1;
    const uint64_t DI = hp->idx_head_dim;
    switch (id) {
    case DS4_T_TOKEN_EMBD: case DS4_T_OUTPUT: return dims(ne, E, V, 1);
    case DS4_T_OUTPUT_HC_FN: return dims(ne, hc * E, hc, 1);
    case DS4_T_OUTPUT_HC_SCALE: return dims(ne, 1, 1, 1);
    case DS4_T_OUTPUT_HC_BASE: return dims(ne, hc, 1, 1);
    case DS4_T_OUTPUT_NORM: case DS4_T_ATTN_NORM: case DS4_T_FFN_NORM: return dims(ne, E, 1, 1);
    case DS4_T_HC_ATTN_FN: case DS4_T_HC_FFN_FN: return dims(ne, hc * E, hc_mix, 1);
    case DS4_T_HC_ATTN_SCALE: case DS4_T_HC_FFN_SCALE: return dims(ne, 3, 1, 1);
    case DS4_T_HC_ATTN_BASE: case DS4_T_HC_FFN_BASE: return dims(ne, hc_mix, 1, 1);
    case DS4_T_ATTN_Q_A: return dims(ne, E, hp->q_lora_rank, 1);
    case DS4_T_ATTN_Q_A_NORM: return dims(ne, hp->q_lora_rank, 1, 1);
    case DS4_T_ATTN_Q_B: return dims(ne, hp->q_lora_rank, H * D, 1);
    case DS4_T_ATTN_KV: return dims(ne, E, D, 1);
    case DS4_T_ATTN_KV_A_NORM: case DS4_T_COMP_NORM: return dims(ne, D, 1, 1);
    case DS4_T_ATTN_SINKS: return dims(ne, H, 1, 1);
    case DS4_T_ATTN_OUTPUT_A:
        return dims(ne, H * D / hp->o_groups, (uint64_t)hp->o_groups * hp->o_lora_rank, 1);
    case DS4_T_ATTN_OUTPUT_B: return dims(ne, (uint64_t)hp->o_groups * hp->o_lora_rank, E, 1);
    case DS4_T_FFN_GATE_INP: return dims(ne, E, X, 1);
    case DS4_T_FFN_GATE_EXPS: case DS4_T_FFN_UP_EXPS: return dims(ne, E, Fe, X);
    case DS4_T_FFN_DOWN_EXPS: return dims(ne, Fe, E, X);
    case DS4_T_FFN_GATE_SHEXP: case DS4_T_FFN_UP_SHEXP: return dims(ne, E, Fe, 1);
    case DS4_T_FFN_DOWN_SHEXP: return dims(ne, Fe, E, 1);
    case DS4_T_FFN_GATE_TID2EID: return dims(ne, hp->n_expert_used, V, 1);
    case DS4_T_EXP_PROBS_B: return dims(ne, X, 1, 1);
    case DS4_T_COMP_APE: return dims(ne, coff * D, ratio, 1);
    case DS4_T_COMP_KV: case DS4_T_COMP_GATE: return dims(ne, E, coff * D, 1);
    case DS4_T_IDX_Q_B: return dims(ne, hp->q_lora_rank, (uint64_t)hp->idx_n_head * DI, 1);
    case DS4_T_IDX_PROJ: return dims(ne, E, hp->idx_n_head, 1);
    case DS4_T_IDX_COMP_APE: return dims(ne, 2 * DI, ratio, 1);
    case DS4_T_IDX_COMP_KV: case DS4_T_IDX_COMP_GATE: return dims(ne, E, 2 * DI, 1);
    case DS4_T_IDX_COMP_NORM: return dims(ne, DI, 1, 1);
    case DS4_T_COUNT: break;
    }
    return dims(ne, 0, 1, 1);
}

int ds4_tensor_name(enum ds4_tensor_id id, int layer, char *buf, size_t n) {
    if (ds4_tensor_table[id].scope == DS4_SCOPE_GLOBAL)
        return snprintf(buf, n, "%s", ds4_tensor_table[id].name);
    if (layer == DS4_LAYER_MTP) return snprintf(buf, n, DS4_MTP_PREFIX "%s", ds4_tensor_table[id].name);
    return snprintf(buf, n, "blk.%d.%s", layer, ds4_tensor_table[id].name);
}

static uint32_t type_of_class(enum ds4_tensor_class cls, enum ds4_mix mix) {
    static const uint32_t by_mix[][5] = {
        /*                      F32           F16           Q8_0           Q2                Q4 */
        [DS4_TC_F32]         = {DS4_TYPE_F32, DS4_TYPE_F32, DS4_TYPE_F32,  DS4_TYPE_F32,     DS4_TYPE_F32},
        [DS4_TC_I32]         = {DS4_TYPE_I32, DS4_TYPE_I32, DS4_TYPE_I32,  DS4_TYPE_I32,     DS4_TYPE_I32},
        [DS4_TC_F16]         = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_F16,  DS4_TYPE_F16,     DS4_TYPE_F16},
        [DS4_TC_Q8]          = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_Q8_0, DS4_TYPE_Q8_0,    DS4_TYPE_Q8_0},
        [DS4_TC_EXP_GATE_UP] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_Q8_0, DS4_TYPE_IQ2_XXS, DS4_TYPE_Q4_K},
        [DS4_TC_EXP_DOWN]    = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_Q8_0, DS4_TYPE_Q2_K,    DS4_TYPE_Q4_K},
    };
    return by_mix[cls][mix];
}

uint32_t ds4_tensor_type(enum ds4_tensor_id id, enum ds4_mix mix) { return type_of_class(ds4_tensor_table[id].cls, mix); }

/* The released MTP file keeps the projections Q8_0 and the norms F32, like
 * the attention matrices and norms of a layer; the HC merge as the head's. */
const ds4_tensor_desc ds4_mtp_tensor_table[DS4_MTP_COUNT] = {
    [DS4_MTP_E_PROJ]        = {"e_proj.weight", DS4_SCOPE_GLOBAL, DS4_TC_Q8},
    [DS4_MTP_H_PROJ]        = {"h_proj.weight", DS4_SCOPE_GLOBAL, DS4_TC_Q8},
    [DS4_MTP_ENORM]         = {"enorm.weight", DS4_SCOPE_GLOBAL, DS4_TC_F32},
    [DS4_MTP_HNORM]         = {"hnorm.weight", DS4_SCOPE_GLOBAL, DS4_TC_F32},
    [DS4_MTP_NORM]          = {"norm.weight", DS4_SCOPE_GLOBAL, DS4_TC_F32},
    [DS4_MTP_HC_HEAD_FN]    = {"hc_head_fn.weight", DS4_SCOPE_GLOBAL, DS4_TC_F16},
    [DS4_MTP_HC_HEAD_SCALE] = {"hc_head_scale.weight", DS4_SCOPE_GLOBAL, DS4_TC_F32},
    [DS4_MTP_HC_HEAD_BASE]  = {"hc_head_base.weight", DS4_SCOPE_GLOBAL, DS4_TC_F32},
};

void ds4_hparams_mtp_block(const ds4_hparams *main_hp, ds4_hparams *block) {
    const uint32_t last = main_hp->n_layer ? main_hp->n_layer - 1 : 0;
    *block = *main_hp;
    block->n_layer = 1;
    memset(block->compress_ratio, 0, sizeof block->compress_ratio);
    memset(block->attn_kind, 0, sizeof block->attn_kind);
    block->attn_kind[0] = DS4_ATTN_WINDOW;
    block->n_hash_layer = 0;
    block->swiglu_clamp_exp[0] = main_hp->swiglu_clamp_exp[last];
    block->swiglu_clamp_shexp[0] = main_hp->swiglu_clamp_shexp[last];
}

int ds4_mtp_tensor_shape(const ds4_hparams *hp, enum ds4_mtp_tensor_id id, uint64_t ne[4]) {
    const uint64_t E = hp->n_embd, hc = hp->hc_count;
    switch (id) {
    case DS4_MTP_E_PROJ: case DS4_MTP_H_PROJ: return dims(ne, E, E, 1);
    case DS4_MTP_ENORM: case DS4_MTP_HNORM: case DS4_MTP_NORM: return dims(ne, E, 1, 1);
    case DS4_MTP_HC_HEAD_FN: return dims(ne, hc * E, hc, 1);
    case DS4_MTP_HC_HEAD_SCALE: return dims(ne, 1, 1, 1);
    case DS4_MTP_HC_HEAD_BASE: return dims(ne, hc, 1, 1);
    case DS4_MTP_COUNT: break;
    }
    return dims(ne, 0, 1, 1);
}

int ds4_mtp_tensor_name(enum ds4_mtp_tensor_id id, char *buf, size_t n) {
    return snprintf(buf, n, DS4_MTP_PREFIX "%s", ds4_mtp_tensor_table[id].name);
}

uint32_t ds4_mtp_tensor_type(enum ds4_mtp_tensor_id id, enum ds4_mix mix) {
    return type_of_class(ds4_mtp_tensor_table[id].cls, mix);
}

void ds4_slice_keys_write(struct ds4_gguf_writer *w, uint32_t first, uint32_t last, bool output) {
    ds4_gguf_w_u32(w, DS4_SLICE_KEY_FIRST, first);
    ds4_gguf_w_u32(w, DS4_SLICE_KEY_LAST, last);
    ds4_gguf_w_bool(w, DS4_SLICE_KEY_OUTPUT, output);
}

bool ds4_tensor_in_slice(enum ds4_tensor_id id, int layer, int first, int last, bool output) {
    if (layer >= 0) return layer >= first && layer <= last;
    return id == DS4_T_TOKEN_EMBD ? first == 0 : output;
}
