/* glm_layout.c -- the GLM 5.2 GGUF layout tables (see glm_layout.h).
 * Key strings and tensor names follow llama.cpp's LLM_ARCH_GLM_DSA tables
 * (fact sheet sections 3 and 4.1); the code is ours. */
#include "models/glm/glm_layout.h"
#include "format/gguf.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define K(name) "glm-dsa." name
#define F(field) offsetof(glm_hparams, field)
#define INDEXER_TYPES_KEY K("attention.indexer.types")

/* Optional keys are those llama.cpp's glm-dsa loader reads with a default;
 * ds4_glm_hparams_read() sets the same defaults first (vocab_size 0 = take it
 * from token_embd). */
const ds4_hparam_key ds4_glm_hparam_keys[] = {
    {K("block_count"), DS4_HP_U32, F(n_block), NULL, false},
    {K("nextn_predict_layers"), DS4_HP_U32, F(n_nextn), NULL, true},
    {K("context_length"), DS4_HP_U32, F(n_ctx_train), NULL, false},
    {K("embedding_length"), DS4_HP_U32, F(n_embd), NULL, false},
    {K("vocab_size"), DS4_HP_U32, F(n_vocab), NULL, true},
    {K("feed_forward_length"), DS4_HP_U32, F(dense_ff), NULL, false},
    {K("attention.head_count"), DS4_HP_U32, F(n_head), NULL, false},
    {K("attention.head_count_kv"), DS4_HP_U32, F(n_head_kv), NULL, false},
    {K("attention.key_length"), DS4_HP_U32, F(key_length), NULL, false},
    {K("attention.value_length"), DS4_HP_U32, F(value_length), NULL, false},
    {K("attention.key_length_mla"), DS4_HP_U32, F(key_length_mla), NULL, false},
    {K("attention.value_length_mla"), DS4_HP_U32, F(value_length_mla), NULL, false},
    {K("rope.dimension_count"), DS4_HP_U32, F(n_rot), NULL, false},
    {K("rope.freq_base"), DS4_HP_F32, F(rope_base), NULL, false},
    {K("attention.q_lora_rank"), DS4_HP_U32, F(q_lora_rank), NULL, false},
    {K("attention.kv_lora_rank"), DS4_HP_U32, F(kv_lora_rank), NULL, false},
    {K("attention.layer_norm_rms_epsilon"), DS4_HP_F32, F(rms_eps), NULL, false},
    {K("attention.indexer.head_count"), DS4_HP_U32, F(idx_n_head), NULL, false},
    {K("attention.indexer.key_length"), DS4_HP_U32, F(idx_head_dim), NULL, false},
    {K("attention.indexer.top_k"), DS4_HP_U32, F(idx_topk), NULL, false},
    {K("leading_dense_block_count"), DS4_HP_U32, F(n_leading_dense), NULL, true},
    {K("expert_count"), DS4_HP_U32, F(n_expert), NULL, false},
    {K("expert_used_count"), DS4_HP_U32, F(n_expert_used), NULL, false},
    {K("expert_feed_forward_length"), DS4_HP_U32, F(expert_ff), NULL, false},
    {K("expert_shared_count"), DS4_HP_U32, F(n_expert_shared), NULL, false},
    {K("expert_group_count"), DS4_HP_U32, F(n_expert_groups), NULL, true},
    {K("expert_group_used_count"), DS4_HP_U32, F(n_expert_groups_used), NULL, true},
    {K("expert_weights_scale"), DS4_HP_F32, F(expert_weights_scale), NULL, false},
    {K("expert_weights_norm"), DS4_HP_BOOL, F(expert_weights_norm), NULL, true},
    {K("expert_gating_func"), DS4_HP_U32, F(expert_gating_func), NULL, true},
};

#define N_KEYS (sizeof ds4_glm_hparam_keys / sizeof ds4_glm_hparam_keys[0])
const size_t ds4_glm_n_hparam_keys = N_KEYS;

/* gguf-py's LlamaExpertGatingFuncType.SIGMOID */
#define GLM_GATING_SIGMOID 2u

void ds4_glm_default_indexer_types(glm_hparams *hp) {
    const uint32_t n = glm_n_trunk(hp);
    for (uint32_t l = 0; l < n && l < GLM_MAX_LAYERS; l++) {
        /* GLM 5.2's config: index_topk_freq 4, index_skip_topk_offset 3 */
        const int64_t shifted = (int64_t)l - 3 + 1;
        hp->indexer_full[l] = hp->n_ctx_train < GLM_52_CONTEXT || (shifted < 0 ? 0 : shifted) % 4 == 0;
    }
}

void ds4_glm_hparams_write(struct ds4_gguf_writer *w, const glm_hparams *hp) {
    ds4_gguf_w_str(w, "general.architecture", GLM_ARCH);
    ds4_hparam_table_write(w, ds4_glm_hparam_keys, N_KEYS, hp, hp->n_block);
    if (hp->indexer_types_key)
        ds4_gguf_w_arr(w, INDEXER_TYPES_KEY, DS4_GGUF_BOOL, hp->indexer_full, glm_n_trunk(hp));
}

static int read_indexer_types(const struct ds4_gguf *g, glm_hparams *hp, char *err, size_t errlen) {
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, INDEXER_TYPES_KEY);
    hp->indexer_types_key = kv != NULL;
    if (!kv) { ds4_glm_default_indexer_types(hp); return 0; }
    const uint32_t n = glm_n_trunk(hp);
    if (kv->type != DS4_GGUF_ARRAY || kv->arr_n != n) {
        snprintf(err, errlen, "key %s must be an array of %u entries (one per trunk layer)", INDEXER_TYPES_KEY, n);
        return -1;
    }
    for (uint32_t l = 0; l < n; l++) {
        int64_t v;
        /* gguf-py writes Python bools (validated 0/1 at open); llama.cpp also takes ints */
        if (kv->arr_type == DS4_GGUF_BOOL) v = kv->arr_data[l];
        else if (!ds4_gguf_arr_i64(kv, l, &v)) {
            snprintf(err, errlen, "key %s: entry %u is not a bool or integer", INDEXER_TYPES_KEY, l);
            return -1;
        }
        hp->indexer_full[l] = v != 0;
    }
    return 0;
}

int ds4_glm_hparams_read(const struct ds4_gguf *g, glm_hparams *hp, char *err, size_t errlen) {
    memset(hp, 0, sizeof *hp);
    hp->expert_gating_func = GLM_GATING_SIGMOID;
    if (ds4_hparam_table_read(g, ds4_glm_hparam_keys, N_KEYS, hp, hp->n_block, err, errlen)) return -1;
    /* the schedule is per trunk layer: bound the counts before reading it */
    if (hp->n_block == 0 || hp->n_block > GLM_MAX_LAYERS || hp->n_nextn >= hp->n_block) {
        snprintf(err, errlen, "block_count %u / nextn_predict_layers %u out of range (1..%d blocks, "
                 "at least one trunk layer)", hp->n_block, hp->n_nextn, GLM_MAX_LAYERS);
        return -1;
    }
    if (read_indexer_types(g, hp, err, errlen)) return -1;
    return ds4_glm_hparams_check(hp, err, errlen);
}

int ds4_glm_hparams_check(const glm_hparams *hp, char *err, size_t errlen) {
#define NEED(cond, ...) do { if (!(cond)) { snprintf(err, errlen, __VA_ARGS__); return -1; } } while (0)
    NEED(hp->n_block > 0 && hp->n_block <= GLM_MAX_LAYERS, "block_count %u out of range 1..%d",
         hp->n_block, GLM_MAX_LAYERS);
    NEED(hp->n_nextn <= 1 && hp->n_nextn < hp->n_block,
         "nextn_predict_layers %u: supported are 0 or 1 MTP block after at least one trunk layer", hp->n_nextn);
    NEED(hp->n_embd && hp->n_head && hp->q_lora_rank && hp->kv_lora_rank && hp->value_length_mla &&
         hp->n_expert && hp->n_expert_used && hp->expert_ff && hp->idx_n_head && hp->idx_topk,
         "a model dimension is zero");
    NEED(hp->n_head_kv == 1, "head_count_kv is %u; GLM's MLA cache is one shared latent head (1)", hp->n_head_kv);
    NEED(hp->n_rot > 0 && hp->n_rot % 2 == 0 && hp->n_rot < hp->key_length_mla,
         "rope.dimension_count %u invalid for key_length_mla %u", hp->n_rot, hp->key_length_mla);
    NEED(hp->key_length == hp->kv_lora_rank + hp->n_rot,
         "key_length %u != kv_lora_rank %u + rope.dimension_count %u (the cached latent + rope key)",
         hp->key_length, hp->kv_lora_rank, hp->n_rot);
    NEED(hp->value_length == hp->kv_lora_rank, "value_length %u != kv_lora_rank %u", hp->value_length,
         hp->kv_lora_rank);
    NEED(hp->idx_head_dim >= hp->n_rot && hp->idx_head_dim % 2 == 0,
         "indexer key_length %u must be even and hold the %u rope dims", hp->idx_head_dim, hp->n_rot);
    NEED(hp->n_expert_used <= hp->n_expert, "expert_used_count %u > expert_count %u", hp->n_expert_used,
         hp->n_expert);
    NEED(hp->n_expert_shared >= 1, "expert_shared_count is 0; GLM has a shared expert");
    NEED(hp->n_expert_groups <= 1 && hp->n_expert_groups_used <= 1,
         "expert_group_count %u / used %u: only ungrouped routing (GLM 5.2: 1 / 1) is supported",
         hp->n_expert_groups, hp->n_expert_groups_used);
    NEED(hp->expert_gating_func == GLM_GATING_SIGMOID, "expert_gating_func %u; GLM routes by sigmoid (2)",
         hp->expert_gating_func);
    NEED(hp->n_leading_dense <= glm_n_trunk(hp), "leading_dense_block_count %u > %u trunk layers",
         hp->n_leading_dense, glm_n_trunk(hp));
    NEED(hp->n_leading_dense == 0 || hp->dense_ff, "feed_forward_length is 0 with %u dense layers",
         hp->n_leading_dense);
    NEED(hp->indexer_full[0], "trunk layer 0 is a shared indexer layer: it has no earlier top-k to share");
    NEED(hp->rms_eps > 0 && isfinite(hp->rms_eps), "layer_norm_rms_epsilon must be positive");
    NEED(hp->rope_base > 1 && isfinite(hp->rope_base), "rope.freq_base = %g, must be > 1", hp->rope_base);
    NEED(isfinite(hp->expert_weights_scale) && hp->expert_weights_scale > 0,
         "expert_weights_scale = %g, must be > 0", hp->expert_weights_scale);
#undef NEED
    return 0;
}

void ds4_glm_file_keys_write(struct ds4_gguf_writer *w, enum ds4_mix mix) {
    /* llama_ftype (llama.h): ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7,
     * MOSTLY_Q2_K 10, MOSTLY_Q4_K_M 15: named after the routed experts. */
    static const uint32_t ftype[] = {[DS4_MIX_F32] = 0, [DS4_MIX_F16] = 1, [DS4_MIX_Q8_0] = 7,
                                     [DS4_MIX_Q2] = 10, [DS4_MIX_Q4] = 15};
    ds4_gguf_w_u32(w, "general.file_type", ftype[mix]);
    ds4_gguf_w_u32(w, "general.quantization_version", 2);
}

/* ---- tensors ---- */

const glm_tensor_desc ds4_glm_tensor_table[GLM_T_COUNT] = {
    [GLM_T_TOKEN_EMBD]      = {"token_embd.weight", GLM_SCOPE_GLOBAL, GLM_TC_Q8, false},
    [GLM_T_OUTPUT_NORM]     = {"output_norm.weight", GLM_SCOPE_GLOBAL, GLM_TC_F32, false},
    [GLM_T_OUTPUT]          = {"output.weight", GLM_SCOPE_GLOBAL, GLM_TC_Q8, false},
    [GLM_T_ATTN_NORM]       = {"attn_norm.weight", GLM_SCOPE_BLOCK, GLM_TC_F32, false},
    [GLM_T_ATTN_Q_A]        = {"attn_q_a.weight", GLM_SCOPE_BLOCK, GLM_TC_Q8, false},
    [GLM_T_ATTN_Q_A_NORM]   = {"attn_q_a_norm.weight", GLM_SCOPE_BLOCK, GLM_TC_F32, false},
    [GLM_T_ATTN_Q_B]        = {"attn_q_b.weight", GLM_SCOPE_BLOCK, GLM_TC_Q8, false},
    [GLM_T_ATTN_KV_A_MQA]   = {"attn_kv_a_mqa.weight", GLM_SCOPE_BLOCK, GLM_TC_Q8, false},
    [GLM_T_ATTN_KV_A_NORM]  = {"attn_kv_a_norm.weight", GLM_SCOPE_BLOCK, GLM_TC_F32, false},
    [GLM_T_ATTN_K_B]        = {"attn_k_b.weight", GLM_SCOPE_BLOCK, GLM_TC_Q8, false},
    [GLM_T_ATTN_V_B]        = {"attn_v_b.weight", GLM_SCOPE_BLOCK, GLM_TC_Q8, false},
    [GLM_T_ATTN_OUTPUT]     = {"attn_output.weight", GLM_SCOPE_BLOCK, GLM_TC_Q8, false},
    [GLM_T_FFN_NORM]        = {"ffn_norm.weight", GLM_SCOPE_BLOCK, GLM_TC_F32, false},
    [GLM_T_IDX_Q_B]         = {"indexer.attn_q_b.weight", GLM_SCOPE_INDEXER, GLM_TC_Q8, false},
    [GLM_T_IDX_K]           = {"indexer.attn_k.weight", GLM_SCOPE_INDEXER, GLM_TC_Q8, false},
    [GLM_T_IDX_K_NORM]      = {"indexer.k_norm.weight", GLM_SCOPE_INDEXER, GLM_TC_F32, false},
    [GLM_T_IDX_K_NORM_B]    = {"indexer.k_norm.bias", GLM_SCOPE_INDEXER, GLM_TC_F32, false},
    [GLM_T_IDX_PROJ]        = {"indexer.proj.weight", GLM_SCOPE_INDEXER, GLM_TC_F32, false},
    [GLM_T_FFN_GATE]        = {"ffn_gate.weight", GLM_SCOPE_DENSE, GLM_TC_Q8, false},
    [GLM_T_FFN_UP]          = {"ffn_up.weight", GLM_SCOPE_DENSE, GLM_TC_Q8, false},
    [GLM_T_FFN_DOWN]        = {"ffn_down.weight", GLM_SCOPE_DENSE, GLM_TC_Q8, false},
    [GLM_T_FFN_GATE_INP]    = {"ffn_gate_inp.weight", GLM_SCOPE_MOE, GLM_TC_F32, false},
    [GLM_T_EXP_PROBS_B]     = {"exp_probs_b.bias", GLM_SCOPE_MOE, GLM_TC_F32, false},
    [GLM_T_FFN_GATE_EXPS]   = {"ffn_gate_exps.weight", GLM_SCOPE_MOE, GLM_TC_EXP_GATE_UP, false},
    [GLM_T_FFN_UP_EXPS]     = {"ffn_up_exps.weight", GLM_SCOPE_MOE, GLM_TC_EXP_GATE_UP, false},
    [GLM_T_FFN_DOWN_EXPS]   = {"ffn_down_exps.weight", GLM_SCOPE_MOE, GLM_TC_EXP_DOWN, false},
    [GLM_T_FFN_GATE_SHEXP]  = {"ffn_gate_shexp.weight", GLM_SCOPE_MOE, GLM_TC_Q8, false},
    [GLM_T_FFN_UP_SHEXP]    = {"ffn_up_shexp.weight", GLM_SCOPE_MOE, GLM_TC_Q8, false},
    [GLM_T_FFN_DOWN_SHEXP]  = {"ffn_down_shexp.weight", GLM_SCOPE_MOE, GLM_TC_Q8, false},
    [GLM_T_NEXTN_EH_PROJ]   = {"nextn.eh_proj.weight", GLM_SCOPE_NEXTN, GLM_TC_Q8, false},
    [GLM_T_NEXTN_ENORM]     = {"nextn.enorm.weight", GLM_SCOPE_NEXTN, GLM_TC_F32, false},
    [GLM_T_NEXTN_HNORM]     = {"nextn.hnorm.weight", GLM_SCOPE_NEXTN, GLM_TC_F32, false},
    [GLM_T_NEXTN_SHARED_HEAD_NORM] = {"nextn.shared_head_norm.weight", GLM_SCOPE_NEXTN, GLM_TC_F32, true},
    [GLM_T_NEXTN_EMBED_TOKENS]     = {"nextn.embed_tokens.weight", GLM_SCOPE_NEXTN_EXTRA, GLM_TC_Q8, true},
    [GLM_T_NEXTN_SHARED_HEAD_HEAD] = {"nextn.shared_head_head.weight", GLM_SCOPE_NEXTN_EXTRA, GLM_TC_Q8, true},
};

bool ds4_glm_tensor_present(const glm_hparams *hp, enum glm_tensor_id id, int layer) {
    switch (ds4_glm_tensor_table[id].scope) {
    case GLM_SCOPE_GLOBAL: return layer < 0;
    case GLM_SCOPE_BLOCK: case GLM_SCOPE_INDEXER: return layer >= 0;
    case GLM_SCOPE_DENSE: return layer >= 0 && glm_block_dense(hp, layer);
    case GLM_SCOPE_MOE: return layer >= 0 && !glm_block_dense(hp, layer);
    case GLM_SCOPE_NEXTN: return layer >= 0 && glm_block_nextn(hp, layer);
    case GLM_SCOPE_NEXTN_EXTRA: return false;
    }
    return false;
}

static int dims(uint64_t ne[4], uint64_t a, uint64_t b, uint64_t c) {
    ne[0] = a; ne[1] = b; ne[2] = c; ne[3] = 1;
    return c > 1 ? 3 : b > 1 ? 2 : 1;
}

int ds4_glm_tensor_shape(const glm_hparams *hp, enum glm_tensor_id id, int layer, uint64_t ne[4]) {
    (void)layer;   /* every per-block shape is the same on every block that has it */
    const uint64_t E = hp->n_embd, V = hp->n_vocab, H = hp->n_head;
    const uint64_t R = hp->n_rot, DK = hp->key_length_mla, DV = hp->value_length_mla, nope = DK - R;
    const uint64_t LQ = hp->q_lora_rank, LKV = hp->kv_lora_rank;
    const uint64_t X = hp->n_expert, Fe = hp->expert_ff, Fs = (uint64_t)hp->expert_ff * hp->n_expert_shared;
    const uint64_t IH = hp->idx_n_head, ID = hp->idx_head_dim;
    switch (id) {
    case GLM_T_TOKEN_EMBD: case GLM_T_OUTPUT:
    case GLM_T_NEXTN_EMBED_TOKENS: case GLM_T_NEXTN_SHARED_HEAD_HEAD: return dims(ne, E, V, 1);
    case GLM_T_OUTPUT_NORM: case GLM_T_ATTN_NORM: case GLM_T_FFN_NORM:
    case GLM_T_NEXTN_ENORM: case GLM_T_NEXTN_HNORM: case GLM_T_NEXTN_SHARED_HEAD_NORM: return dims(ne, E, 1, 1);
    case GLM_T_ATTN_Q_A: return dims(ne, E, LQ, 1);
    case GLM_T_ATTN_Q_A_NORM: return dims(ne, LQ, 1, 1);
    case GLM_T_ATTN_Q_B: return dims(ne, LQ, H * DK, 1);
    case GLM_T_ATTN_KV_A_MQA: return dims(ne, E, LKV + R, 1);
    case GLM_T_ATTN_KV_A_NORM: return dims(ne, LKV, 1, 1);
    case GLM_T_ATTN_K_B: return dims(ne, nope, LKV, H);
    case GLM_T_ATTN_V_B: return dims(ne, LKV, DV, H);
    case GLM_T_ATTN_OUTPUT: return dims(ne, H * DV, E, 1);
    case GLM_T_IDX_Q_B: return dims(ne, LQ, IH * ID, 1);
    case GLM_T_IDX_K: return dims(ne, E, ID, 1);
    case GLM_T_IDX_K_NORM: case GLM_T_IDX_K_NORM_B: return dims(ne, ID, 1, 1);
    case GLM_T_IDX_PROJ: return dims(ne, E, IH, 1);
    case GLM_T_FFN_GATE: case GLM_T_FFN_UP: return dims(ne, E, hp->dense_ff, 1);
    case GLM_T_FFN_DOWN: return dims(ne, hp->dense_ff, E, 1);
    case GLM_T_FFN_GATE_INP: return dims(ne, E, X, 1);
    case GLM_T_EXP_PROBS_B: return dims(ne, X, 1, 1);
    case GLM_T_FFN_GATE_EXPS: case GLM_T_FFN_UP_EXPS: return dims(ne, E, Fe, X);
    case GLM_T_FFN_DOWN_EXPS: return dims(ne, Fe, E, X);
    case GLM_T_FFN_GATE_SHEXP: case GLM_T_FFN_UP_SHEXP: return dims(ne, E, Fs, 1);
    case GLM_T_FFN_DOWN_SHEXP: return dims(ne, Fs, E, 1);
    case GLM_T_NEXTN_EH_PROJ: return dims(ne, 2 * E, E, 1);
    case GLM_T_COUNT: break;
    }
    return dims(ne, 0, 1, 1);
}

int ds4_glm_tensor_name(enum glm_tensor_id id, int layer, char *buf, size_t n) {
    if (ds4_glm_tensor_table[id].scope == GLM_SCOPE_GLOBAL) return snprintf(buf, n, "%s", ds4_glm_tensor_table[id].name);
    return snprintf(buf, n, "blk.%d.%s", layer, ds4_glm_tensor_table[id].name);
}

uint32_t ds4_glm_tensor_type(enum glm_tensor_id id, enum ds4_mix mix) {
    static const uint32_t by_mix[][5] = {
        /*                      F32           F16           Q8_0           Q2             Q4 */
        [GLM_TC_F32]         = {DS4_TYPE_F32, DS4_TYPE_F32, DS4_TYPE_F32,  DS4_TYPE_F32,  DS4_TYPE_F32},
        [GLM_TC_Q8]          = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_Q8_0, DS4_TYPE_Q8_0, DS4_TYPE_Q8_0},
        [GLM_TC_EXP_GATE_UP] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_Q8_0, DS4_TYPE_Q2_K, DS4_TYPE_Q4_K},
        [GLM_TC_EXP_DOWN]    = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_Q8_0, DS4_TYPE_Q2_K, DS4_TYPE_Q4_K},
    };
    return by_mix[ds4_glm_tensor_table[id].cls][mix];
}
