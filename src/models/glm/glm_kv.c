/* glm_kv.c -- GLM session state allocation and truncation (see glm_kv.h). */
#include "models/glm/glm_kv.h"

#include <stdlib.h>

static uint64_t layer_floats(const glm_hparams *hp, uint32_t l, int ctx) {
    uint64_t per_pos = (uint64_t)hp->kv_lora_rank + hp->n_rot + (hp->indexer_full[l] ? hp->idx_head_dim : 0);
    return per_pos * (uint64_t)ctx;
}

uint64_t ds4_glm_kv_bytes_for(const glm_hparams *hp, int ctx) {
    uint64_t n = 0;
    for (uint32_t l = 0; l < glm_n_trunk(hp); l++) n += layer_floats(hp, l, ctx);
    return n * sizeof(float);
}

glm_kv *ds4_glm_kv_new(const glm_hparams *hp, int ctx) {
    const int n_layer = (int)glm_n_trunk(hp);
    glm_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return NULL;
    kv->n_layer = n_layer;
    kv->ctx = ctx;
    kv->latent_width = (int)hp->kv_lora_rank;
    kv->row_width = (int)(hp->kv_lora_rank + hp->n_rot);
    kv->idx_width = (int)hp->idx_head_dim;
    kv->bytes = ds4_glm_kv_bytes_for(hp, ctx);
    kv->rows = calloc((size_t)n_layer, sizeof(float *));
    kv->idx = calloc((size_t)n_layer, sizeof(float *));
    float *p = kv->rows && kv->idx ? calloc(kv->bytes / sizeof(float), sizeof(float)) : NULL;
    if (!p) { ds4_glm_kv_free(kv); return NULL; }
    kv->block = p;
    for (int l = 0; l < n_layer; l++) {
        kv->rows[l] = p;
        p += (size_t)ctx * kv->row_width;
        if (hp->indexer_full[l]) {
            kv->idx[l] = p;
            p += (size_t)ctx * kv->idx_width;
        }
    }
    return kv;
}

void ds4_glm_kv_free(glm_kv *kv) {
    if (!kv) return;
    free(kv->block);
    free(kv->rows);
    free(kv->idx);
    free(kv);
}

bool ds4_glm_kv_truncate(glm_kv *kv, int n) {
    if (n < 0 || n > kv->n_pos) return false;
    kv->n_pos = n;
    return true;
}
