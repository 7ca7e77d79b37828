/* glm_model.c -- GLM config from metadata, tensor binding and validation. */
#include "models/glm/glm_model.h"
#include "format/gguf.h"
#include "format/tensor_bind.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool ds4_glm_gguf_is_glm(const ds4_gguf *g) {
    return ds4_gguf_arch_is(g, GLM_ARCH);
}

/* Names and shapes from the layout table (glm_layout.h). */
static ds4_tensor bind_matrix(ds4_binder *b, const glm_hparams *hp, enum glm_tensor_id id, int l) {
    char name[160];
    uint64_t ne[4];
    ds4_glm_tensor_name(id, l, name, sizeof name);
    return ds4_bind_matrix(b, name, ds4_glm_tensor_shape(hp, id, l, ne), ne);
}

static float *bind_floats(ds4_binder *b, const glm_hparams *hp, enum glm_tensor_id id, int l) {
    char name[160];
    uint64_t ne[4];
    ds4_glm_tensor_name(id, l, name, sizeof name);
    return ds4_bind_floats(b, name, ds4_glm_tensor_shape(hp, id, l, ne), ne);
}

static bool has_tensor(ds4_binder *b, const glm_hparams *hp, enum glm_tensor_id id, int l) {
    char name[160];
    ds4_glm_tensor_name(id, l, name, sizeof name);
    return ds4_gguf_find_tensor(b->g, name) != NULL;
}

static void bind_layer(ds4_binder *b, const glm_hparams *hp, int l, glm_layer *L) {
    L->attn_norm = bind_floats(b, hp, GLM_T_ATTN_NORM, l);
    L->q_a = bind_matrix(b, hp, GLM_T_ATTN_Q_A, l);
    L->q_a_norm = bind_floats(b, hp, GLM_T_ATTN_Q_A_NORM, l);
    L->q_b = bind_matrix(b, hp, GLM_T_ATTN_Q_B, l);
    L->kv_a_mqa = bind_matrix(b, hp, GLM_T_ATTN_KV_A_MQA, l);
    L->kv_a_norm = bind_floats(b, hp, GLM_T_ATTN_KV_A_NORM, l);
    L->k_b = bind_matrix(b, hp, GLM_T_ATTN_K_B, l);
    L->v_b = bind_matrix(b, hp, GLM_T_ATTN_V_B, l);
    L->attn_output = bind_matrix(b, hp, GLM_T_ATTN_OUTPUT, l);
    L->ffn_norm = bind_floats(b, hp, GLM_T_FFN_NORM, l);
    if (!glm_block_nextn(hp, l) && hp->indexer_full[l]) {
        L->idx_q_b = bind_matrix(b, hp, GLM_T_IDX_Q_B, l);
        L->idx_k = bind_matrix(b, hp, GLM_T_IDX_K, l);
        L->idx_k_norm = bind_floats(b, hp, GLM_T_IDX_K_NORM, l);
        L->idx_k_norm_b = bind_floats(b, hp, GLM_T_IDX_K_NORM_B, l);
        L->idx_proj = bind_floats(b, hp, GLM_T_IDX_PROJ, l);
    }
    if (glm_block_dense(hp, l)) {
        L->ffn_gate = bind_matrix(b, hp, GLM_T_FFN_GATE, l);
        L->ffn_up = bind_matrix(b, hp, GLM_T_FFN_UP, l);
        L->ffn_down = bind_matrix(b, hp, GLM_T_FFN_DOWN, l);
    } else {
        L->gate_inp = bind_floats(b, hp, GLM_T_FFN_GATE_INP, l);
        if (has_tensor(b, hp, GLM_T_EXP_PROBS_B, l)) L->exp_probs_b = bind_floats(b, hp, GLM_T_EXP_PROBS_B, l);
        L->gate_exps = bind_matrix(b, hp, GLM_T_FFN_GATE_EXPS, l);
        L->up_exps = bind_matrix(b, hp, GLM_T_FFN_UP_EXPS, l);
        L->down_exps = bind_matrix(b, hp, GLM_T_FFN_DOWN_EXPS, l);
        L->gate_shexp = bind_matrix(b, hp, GLM_T_FFN_GATE_SHEXP, l);
        L->up_shexp = bind_matrix(b, hp, GLM_T_FFN_UP_SHEXP, l);
        L->down_shexp = bind_matrix(b, hp, GLM_T_FFN_DOWN_SHEXP, l);
        if (!b->failed && L->gate_exps.type != L->up_exps.type)
            ds4_bind_fail(b, "blk.%d: routed gate and up experts have different types", l);
    }
    if (glm_block_nextn(hp, l)) {
        L->eh_proj = bind_matrix(b, hp, GLM_T_NEXTN_EH_PROJ, l);
        L->enorm = bind_floats(b, hp, GLM_T_NEXTN_ENORM, l);
        L->hnorm = bind_floats(b, hp, GLM_T_NEXTN_HNORM, l);
        if (has_tensor(b, hp, GLM_T_NEXTN_SHARED_HEAD_NORM, l))
            L->shared_head_norm = bind_floats(b, hp, GLM_T_NEXTN_SHARED_HEAD_NORM, l);
        if (has_tensor(b, hp, GLM_T_NEXTN_EMBED_TOKENS, l))
            L->nextn_embed = bind_matrix(b, hp, GLM_T_NEXTN_EMBED_TOKENS, l);
        if (has_tensor(b, hp, GLM_T_NEXTN_SHARED_HEAD_HEAD, l))
            L->nextn_head = bind_matrix(b, hp, GLM_T_NEXTN_SHARED_HEAD_HEAD, l);
    }
}

static void free_layer(glm_layer *L) {
    float *owned[] = {L->attn_norm, L->q_a_norm, L->kv_a_norm, L->ffn_norm, L->idx_k_norm, L->idx_k_norm_b,
                      L->idx_proj, L->gate_inp, L->exp_probs_b, L->enorm, L->hnorm, L->shared_head_norm};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) free(owned[i]);
}

void ds4_glm_model_free(glm_model *m) {
    if (!m) return;
    for (uint32_t l = 0; m->layers && l < m->hp.n_block; l++) free_layer(&m->layers[l]);
    free(m->layers);
    free(m->output_norm);
    free(m);
}

glm_model *ds4_glm_model_bind(const ds4_gguf *g, char *err, size_t errlen) {
    static const char prefix[] = "not a GLM 5.2 GGUF: ";
    ds4_binder b = {g, prefix, err, errlen, false};
    glm_model *m = calloc(1, sizeof *m);
    if (!m) { snprintf(err, errlen, "out of memory for the model"); return NULL; }
    char why[400];
    if (!ds4_glm_gguf_is_glm(g)) {
        ds4_bind_fail(&b, "general.architecture is not \"%s\"", GLM_ARCH);
    } else if (ds4_glm_hparams_read(g, &m->hp, why, sizeof why)) {
        ds4_bind_fail(&b, "%s", why);
    } else if (m->hp.n_vocab == 0) {
        /* vocab_size is optional in llama.cpp's files: the embedding says it */
        const ds4_gguf_tensor *t = ds4_gguf_find_tensor(g, ds4_glm_tensor_table[GLM_T_TOKEN_EMBD].name);
        if (!t || t->n_dims != 2 || t->ne[1] == 0 || t->ne[1] > (1u << 24))
            ds4_bind_fail(&b, "no vocab_size key and no 2-D %s to take it from", ds4_glm_tensor_table[GLM_T_TOKEN_EMBD].name);
        else
            m->hp.n_vocab = (uint32_t)t->ne[1];
    }
    if (!b.failed) {
        const glm_hparams *hp = &m->hp;
        m->token_embd = bind_matrix(&b, hp, GLM_T_TOKEN_EMBD, -1);
        m->output_norm = bind_floats(&b, hp, GLM_T_OUTPUT_NORM, -1);
        m->output = bind_matrix(&b, hp, GLM_T_OUTPUT, -1);
        m->layers = calloc(hp->n_block, sizeof(glm_layer));
        if (!m->layers) ds4_bind_fail_oom(&b, "the layer table");
        for (uint32_t l = 0; l < hp->n_block && !b.failed; l++) bind_layer(&b, hp, (int)l, &m->layers[l]);
    }
    if (b.failed) { ds4_glm_model_free(m); return NULL; }
    ds4_gguf_str name;
    if (ds4_gguf_get_str(g, "general.name", &name))
        snprintf(m->name, sizeof m->name, "%.*s", (int)(name.len < 127 ? name.len : 127), name.ptr);
    else
        snprintf(m->name, sizeof m->name, "%s", GLM_ARCH);
    m->file_bytes = ds4_gguf_file_bytes(g);
    return m;
}
