/* layout_common.c -- the metadata table walkers and the type mixes every
 * family's layout shares (see layout_common.h). */
#include "format/layout_common.h"
#include "format/gguf.h"

#include <stdio.h>
#include <strings.h>

void ds4_hparam_table_write(struct ds4_gguf_writer *w, const ds4_hparam_key *keys, size_t n_keys,
                            const void *fields, uint32_t n_layer) {
    const char *base = fields;
    for (size_t i = 0; i < n_keys; i++) {
        const ds4_hparam_key *k = &keys[i];
        const void *p = base + k->offset;
        switch (k->kind) {
        case DS4_HP_U32: ds4_gguf_w_u32(w, k->key, *(const uint32_t *)p); break;
        case DS4_HP_F32: ds4_gguf_w_f32(w, k->key, *(const float *)p); break;
        case DS4_HP_BOOL: ds4_gguf_w_bool(w, k->key, *(const bool *)p); break;
        case DS4_HP_U32_PER_LAYER: ds4_gguf_w_arr(w, k->key, DS4_GGUF_U32, p, n_layer); break;
        case DS4_HP_F32_PER_LAYER: ds4_gguf_w_arr(w, k->key, DS4_GGUF_F32, p, n_layer); break;
        case DS4_HP_STR_CONST: ds4_gguf_w_str(w, k->key, k->str_value); break;
        }
    }
}

static int read_array(const struct ds4_gguf *g, const ds4_hparam_key *k, uint32_t n_layer,
                      void *dst, char *err, size_t errlen) {
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, k->key);
    if (!kv || kv->type != DS4_GGUF_ARRAY) {
        snprintf(err, errlen, "missing or non-array key %s", k->key);
        return -1;
    }
    if (kv->arr_n < n_layer) {
        snprintf(err, errlen, "key %s has %llu entries, need %u", k->key,
                 (unsigned long long)kv->arr_n, n_layer);
        return -1;
    }
    for (uint32_t l = 0; l < n_layer; l++) {
        if (k->kind == DS4_HP_U32_PER_LAYER) {
            int64_t v;
            if (!ds4_gguf_arr_i64(kv, l, &v) || v < 0 || v > UINT32_MAX) {
                snprintf(err, errlen, "key %s: entry %u is not a valid u32", k->key, l);
                return -1;
            }
            ((uint32_t *)dst)[l] = (uint32_t)v;
        } else {
            double v;
            if (!ds4_gguf_arr_f64(kv, l, &v)) {
                snprintf(err, errlen, "key %s: entry %u is not a number", k->key, l);
                return -1;
            }
            ((float *)dst)[l] = (float)v;
        }
    }
    return 0;
}

int ds4_hparam_table_read(const struct ds4_gguf *g, const ds4_hparam_key *keys, size_t n_keys,
                          void *fields, uint32_t n_layer, char *err, size_t errlen) {
    char *base = fields;
    for (size_t i = 0; i < n_keys; i++) {
        const ds4_hparam_key *k = &keys[i];
        void *p = base + k->offset;
        bool ok = true;
        if (!ds4_gguf_find_kv(g, k->key)) {
            if (k->optional) continue;
            snprintf(err, errlen, "missing key %s", k->key);
            return -1;
        }
        switch (k->kind) {
        case DS4_HP_U32: ok = ds4_gguf_get_u32(g, k->key, p); break;
        case DS4_HP_F32: ok = ds4_gguf_get_f32(g, k->key, p); break;
        case DS4_HP_BOOL: ok = ds4_gguf_get_bool(g, k->key, p); break;
        case DS4_HP_U32_PER_LAYER:
        case DS4_HP_F32_PER_LAYER:
            if (read_array(g, k, n_layer, p, err, errlen)) return -1;
            break;
        case DS4_HP_STR_CONST: break;
        }
        if (!ok) {
            snprintf(err, errlen, "key %s has the wrong type", k->key);
            return -1;
        }
    }
    return 0;
}

static const char *const mix_names[] = {"f32", "f16", "q8_0", "q2", "q4"};

int ds4_mix_from_name(const char *s) {
    for (int i = 0; i < (int)(sizeof mix_names / sizeof mix_names[0]); i++)
        if (!strcasecmp(s, mix_names[i])) return i;
    return -1;
}

const char *ds4_mix_name(enum ds4_mix m) { return mix_names[m]; }

uint32_t ds4_mix_file_type(enum ds4_mix m) {
    /* llama_ftype values (llama.h): ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7,
     * MOSTLY_IQ2_XXS 19, MOSTLY_Q4_K_M 15. */
    static const uint32_t ftype[] = {[DS4_MIX_F32] = 0, [DS4_MIX_F16] = 1, [DS4_MIX_Q8_0] = 7,
                                     [DS4_MIX_Q2] = 19, [DS4_MIX_Q4] = 15};
    return ftype[m];
}
