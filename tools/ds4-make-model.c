/* ds4-make-model -- writes a RANDOM-weight GGUF in the exact DS4 layout
 * (ds4_layout.h) for given dimensions. Its output text is meaningless by
 * construction; it exists so the engine, CLI, server and benchmarks can run
 * end to end without downloading a model.
 *
 *   ds4-make-model -o OUT.gguf [--preset demo|flash|pro|glm|glm-demo] [--layers N] [--type MIX]
 *                  [--seed N] [--vocab tokenizer.json] [--vocab-added FILE]
 *                  [--no-vocab] [--name NAME] [--slice A:B|A:output] [--<key> VALUE ...]
 *
 * Presets:
 *   demo  (default) tiny dims (hidden 256, 4 heads x 128, 8 experts x 256,
 *         6 layers with Flash's schedule: ratios 0,0,4,128,4,128, 3 hash
 *         layers), the real DeepSeek vocabulary (129280 ids; V3
 *         tokenizer.json + the V4 added tokens), q2 mix.
 *   flash Flash's real per-layer shapes (ds4_hparams_v4, sheet sections 1-2)
 *         with --layers N (default 4) layers, q2 mix: for decode-speed benchmarks.
 *   pro   V4 Pro's shapes (ds4_hparams_v4: hidden 7168, 128 heads, 16 output
 *         groups, q rank 1536, 384 experts top-6 of width 3072, indexer top-k
 *         1024, routed scale 2.5, ratio 128 on layers 0-1), 61 layers unless
 *         --layers, q2 mix: with --slice, the layout of the released halves.
 *   glm   GLM 5.2 (glm-dsa, glm_layout.h) with its real per-layer shapes
 *         (GLM sheet section 2): --layers N trunk layers (default 4; the
 *         first min(3, N) dense) plus the MTP block, GLM 5.2's indexer
 *         schedule (no indexer.types key, as in the released files), q2 mix
 *         (routed Q2_K, the rest Q8_0/F32). No vocabulary unless --vocab
 *         (GLM's tokenizer.json is not shipped).
 *   glm-demo  the same structure with tiny dims (hidden 256, 4 heads,
 *         8 experts x 256, 4 trunk layers: 1 dense, layers 0-2 full and 3
 *         shared indexer, vocab 4096) carrying the constructed GLM tokenizer
 *         (data/glm-constructed-tokenizer.json: GLM's pre-tokenizer and
 *         added tokens, 4096 ids), so it can be served.
 * GLM keys are overridden the same way without "glm-dsa." (e.g.
 * --attention.indexer.top_k 16).
 * Every metadata key of the layout can be overridden with --<key> VALUE,
 * where <key> is the key without "deepseek4." (e.g. --embedding_length 512,
 * --attention.head_count 8, --attention.compress_ratios 0,4,128; per-layer
 * keys take a comma list or one value for all layers; compress ratios give
 * each layer the released files' kind, 4 CSA and any other nonzero HCA, so
 * no attention.layer_kinds is written). --layers N resizes
 * the preset's schedule (ds4_v4_schedule: Flash's or Pro's first N layers;
 * hash routing on the first min(3, N)).
 *
 * --support mtp (DeepSeek presets) writes the MTP support file of the model
 * the same options describe instead of the model (ds4_layout.h: the main
 * model's keys, the mtp.0.* block and its projections, norms and HC merge;
 * no vocabulary), for --mtp. --support dspark writes a random DSpark
 * support file for it in DwarfStar's dense layout, --support dspark-sidecar
 * one in the layout of DeepSeek's released sidecar (ds4_layout.h), both for
 * --dspark.
 *
 * --slice (DeepSeek presets) writes only that layer range (the embedding
 * with layer 0, the output head with "output") plus the ds4.slice.* keys
 * (model.h), the way split files for pipeline-parallel hosts are laid out.
 * Random values are drawn in file order, so a slice's weights differ from
 * the whole file's.
 *
 * Values: norms ~U(0.8, 1.2), matrices uniform with std 1/sqrt(row length);
 * quantized tensors are filled with random but valid blocks whose scales
 * give about that std (no quantizer run, so gigabytes take seconds).
 */
#include "options/cli_args.h"
#include "models/dsv4/ds4_layout.h"
#include "format/gguf.h"
#include "models/dsv4/model.h"
#include "models/glm/glm_layout.h"
#include "kernels/quant.h"
#include "text/tokenizer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("ds4-make-model: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* ---------------------------------------------------------------- presets */

/* The released model's shape (ds4_layout.h), at the preset's depth; demo
 * keeps Flash's structure and values at tiny sizes. */
static void preset(ds4_hparams *hp, const char *name, uint32_t n_layer) {
    const bool pro = !strcmp(name, "pro"), demo = !strcmp(name, "demo");
    if (!pro && !demo && strcmp(name, "flash")) die("unknown preset '%s' (demo, flash, pro, glm, glm-demo)", name);
    const enum ds4_v4_model base = pro ? DS4_V4_PRO : DS4_V4_FLASH;
    ds4_hparams_v4(hp, base);
    if (demo) {
        hp->n_layer = 6;
        hp->n_embd = 256;
        hp->n_head = 4;
        hp->key_length = hp->value_length = 128;
        hp->q_lora_rank = hp->o_lora_rank = 64;
        hp->o_groups = 2;
        hp->idx_n_head = 4;
        hp->idx_topk = 8;
        hp->n_expert = 8;
        hp->n_expert_used = 2;
        hp->expert_ff = 256;
    } else if (!pro) {
        hp->n_layer = 4;            /* flash: a few layers for decode-speed benchmarks */
    }
    if (n_layer) hp->n_layer = n_layer;
    if (hp->n_layer > DS4_MAX_LAYERS) die("--layers %u exceeds %d", hp->n_layer, DS4_MAX_LAYERS);
    ds4_v4_schedule(hp, base);
}

/* A family's metadata table, for --<key> VALUE. */
typedef struct {
    const char *arch;              /* key prefix */
    const ds4_hparam_key *keys;
    size_t n_keys;
    void *fields;
    uint32_t n_layer;
} key_table;

/* --<key> VALUE: set one field of the metadata table. */
static void override(const key_table *kt, const char *key, const char *val) {
    char full[256];
    if (!strcmp(key, "block_count")) die("use --layers N to change the layer count");
    snprintf(full, sizeof full, "%s.%s", kt->arch, key);
    for (size_t i = 0; i < kt->n_keys; i++) {
        const ds4_hparam_key *k = &kt->keys[i];
        if (strcmp(k->key, full)) continue;
        char *base = (char *)kt->fields + k->offset, *end;
        switch (k->kind) {
        case DS4_HP_U32: *(uint32_t *)base = (uint32_t)strtoul(val, &end, 0); break;
        case DS4_HP_F32: *(float *)base = strtof(val, &end); break;
        case DS4_HP_BOOL: *(bool *)base = !strcmp(val, "true") || !strcmp(val, "1"); end = (char *)val + strlen(val); break;
        case DS4_HP_U32_PER_LAYER:
        case DS4_HP_F32_PER_LAYER: {
            const char *p = val;
            uint32_t n = 0;
            for (;;) {
                if (n >= DS4_MAX_LAYERS) die("--%s: too many entries", key);
                if (k->kind == DS4_HP_U32_PER_LAYER) ((uint32_t *)base)[n++] = (uint32_t)strtoul(p, &end, 0);
                else ((float *)base)[n++] = strtof(p, &end);
                if (end == p) die("--%s: bad list '%s'", key, val);
                if (*end != ',') break;
                p = end + 1;
            }
            if (n == 1) {
                for (uint32_t l = 1; l < DS4_MAX_LAYERS; l++) {
                    if (k->kind == DS4_HP_U32_PER_LAYER) ((uint32_t *)base)[l] = ((uint32_t *)base)[0];
                    else ((float *)base)[l] = ((float *)base)[0];
                }
            } else if (n != kt->n_layer) {
                die("--%s: %u entries for %u layers", key, n, kt->n_layer);
            }
            break;
        }
        case DS4_HP_STR_CONST: die("--%s cannot be changed", key);
        }
        if (*end) die("--%s: bad value '%s'", key, val);
        return;
    }
    die("unknown option --%s", key);
}

static const char *const own_options[] = {"-o", "--preset", "--layers", "--type", "--seed", "--vocab",
                                          "--vocab-added", "--name", "--slice", "--support"};

/* An option of this tool, or `--KEY` for a metadata key it can override. */
static bool known_option(const char *opt) {
    for (size_t j = 0; j < sizeof own_options / sizeof own_options[0]; j++)
        if (!strcmp(opt, own_options[j])) return true;
    char full[256];
    if (strncmp(opt, "--", 2)) return false;
    /* either family's key: override() checks it against the chosen preset's */
    if (snprintf(full, sizeof full, "%s.%s", DS4_ARCH, opt + 2) < (int)sizeof full)
        for (size_t i = 0; i < ds4_n_hparam_keys; i++)
            if (!strcmp(ds4_hparam_keys[i].key, full)) return true;
    if (snprintf(full, sizeof full, "%s.%s", GLM_ARCH, opt + 2) < (int)sizeof full)
        for (size_t i = 0; i < ds4_glm_n_hparam_keys; i++)
            if (!strcmp(ds4_glm_hparam_keys[i].key, full)) return true;
    return !strcmp(opt, "--block_count");   /* refused with its own message by override() */
}

/* ---------------------------------------------------------------- random values */

static uint64_t rng_state;
static inline uint64_t rnd64(void) {
    /* splitmix64: fast, good enough for random weights */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline float rnd_unit(void) { return (float)(rnd64() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }

static void rnd_bytes(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = rnd64();
        memcpy(p + i, &r, n - i < 8 ? n - i : 8);
    }
}

/* centre and half-width of the uniform values of a float tensor */
static void spread(enum ds4_tensor_id id, uint64_t ne0, float *c, float *hw) {
    *c = 0.0f;
    *hw = sqrtf(3.0f / (float)ne0);             /* std 1/sqrt(ne0) */
    switch (id) {
    case DS4_T_ATTN_NORM: case DS4_T_ATTN_Q_A_NORM: case DS4_T_ATTN_KV_A_NORM: case DS4_T_FFN_NORM:
    case DS4_T_OUTPUT_NORM: case DS4_T_COMP_NORM: case DS4_T_IDX_COMP_NORM:
        *c = 1.0f; *hw = 0.2f; break;
    case DS4_T_HC_ATTN_SCALE: case DS4_T_HC_FFN_SCALE: case DS4_T_OUTPUT_HC_SCALE:
        *c = 1.25f; *hw = 0.75f; break;
    case DS4_T_HC_ATTN_BASE: case DS4_T_HC_FFN_BASE: case DS4_T_OUTPUT_HC_BASE: case DS4_T_COMP_APE:
    case DS4_T_IDX_COMP_APE:
        *hw = 0.5f; break;
    case DS4_T_ATTN_SINKS: *hw = 1.0f; break;
    case DS4_T_EXP_PROBS_B: *hw = 0.1f; break;
    case DS4_T_TOKEN_EMBD: *hw = 1.7f; break;
    case DS4_T_OUTPUT: *hw *= 2.0f; break;
    default: break;
    }
}

static void glm_spread(enum glm_tensor_id id, uint64_t ne0, float *c, float *hw) {
    *c = 0.0f;
    *hw = sqrtf(3.0f / (float)ne0);             /* std 1/sqrt(ne0) */
    switch (id) {
    case GLM_T_ATTN_NORM: case GLM_T_ATTN_Q_A_NORM: case GLM_T_ATTN_KV_A_NORM: case GLM_T_FFN_NORM:
    case GLM_T_OUTPUT_NORM: case GLM_T_IDX_K_NORM: case GLM_T_NEXTN_ENORM: case GLM_T_NEXTN_HNORM:
    case GLM_T_NEXTN_SHARED_HEAD_NORM:
        *c = 1.0f; *hw = 0.2f; break;
    case GLM_T_IDX_K_NORM_B: case GLM_T_EXP_PROBS_B: *hw = 0.1f; break;
    case GLM_T_TOKEN_EMBD: *hw = 1.7f; break;
    case GLM_T_OUTPUT: *hw *= 2.0f; break;
    default: break;
    }
}

/* Random valid blocks of a quantized type with values of about std sigma and
 * zero mean (the affine K-quant mins cancel the mean of d*sc*q). */
static void random_blocks(uint32_t type, uint8_t *dst, size_t n_blocks, float sigma) {
    size_t bb = ds4_type_block_bytes(type);
    rnd_bytes(dst, n_blocks * bb);
    for (size_t b = 0; b < n_blocks; b++) {
        uint8_t *blk = dst + b * bb;
        switch (type) {
        case DS4_TYPE_Q8_0: {
            ds4_block_q8_0 *q = (ds4_block_q8_0 *)blk;
            q->d = ds4_f32_to_half(sigma / 73.0f);
            for (int i = 0; i < DS4_QK8_0; i++) if (q->qs[i] == -128) q->qs[i] = -127;
            break;
        }
        case DS4_TYPE_Q2_K: {
            ds4_block_q2_K *q = (ds4_block_q2_K *)blk;
            q->d = ds4_f32_to_half(sigma / 12.0f);
            q->dmin = ds4_f32_to_half(1.5f * sigma / 12.0f);
            break;
        }
        case DS4_TYPE_Q4_K: {
            ds4_block_q4_K *q = (ds4_block_q4_K *)blk;
            q->d = ds4_f32_to_half(sigma / 200.0f);
            q->dmin = ds4_f32_to_half(7.5f * sigma / 200.0f);
            break;
        }
        case DS4_TYPE_IQ2_XXS:
            ((ds4_block_iq2_xxs *)blk)->d = ds4_f32_to_half(sigma / 40.0f);
            break;
        default:
            die("no random block recipe for %s", ds4_type_name(type));
        }
    }
}

typedef struct {
    char name[96];
    uint32_t type;
    int n_dims;
    uint64_t ne[4];
    float centre, half_width;      /* uniform values of a float tensor (spread) */
} mtensor;

typedef struct { mtensor *t; size_t n; uint32_t n_expert; } plan;

static int fill(void *ctx, size_t ti, void *dst, size_t n_bytes) {
    plan *pl = ctx;
    const mtensor *t = &pl->t[ti];
    uint64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (t->type == DS4_TYPE_I32) {
        /* tid2eid [k, vocab]: k distinct experts per token */
        int32_t *ids = dst;
        uint32_t k = (uint32_t)t->ne[0], X = pl->n_expert;
        for (uint64_t tok = 0; tok < t->ne[1]; tok++)
            for (uint32_t j = 0; j < k; j++) {
                int32_t e;
                bool dup;
                do {
                    e = (int32_t)(rnd64() % X);
                    dup = false;
                    for (uint32_t i = 0; i < j; i++) dup |= ids[tok * k + i] == e;
                } while (dup);
                ids[tok * k + j] = e;
            }
        return 0;
    }
    const float c = t->centre, hw = t->half_width;
    if (t->type == DS4_TYPE_F32 || t->type == DS4_TYPE_F16) {
        for (uint64_t i = 0; i < n; i++) {
            float v = c + hw * rnd_unit();
            if (t->type == DS4_TYPE_F32) ((float *)dst)[i] = v;
            else ((ds4_half *)dst)[i] = ds4_f32_to_half(v);
        }
    } else {
        random_blocks(t->type, dst, n_bytes / ds4_type_block_bytes(t->type), hw / sqrtf(3.0f));
    }
    fprintf(stderr, "[%4zu/%zu] %-40s %s\n", ti + 1, pl->n, t->name, ds4_type_name(t->type));
    return 0;
}

static void usage(void) {
    fputs("usage: ds4-make-model -o OUT.gguf [--preset demo|flash|pro|glm|glm-demo] [--layers N]\n"
          "       [--type f32|f16|q8_0|q2|q4] [--seed N] [--vocab tokenizer.json] [--vocab-added FILE]\n"
          "       [--no-vocab] [--name NAME] [--slice A:B|A:output] [--support mtp|dspark|dspark-sidecar]\n"
          "       [--<metadata key without 'deepseek4.' / 'glm-dsa.'> VALUE ...]\n",
          stderr);
    exit(2);
}

static mtensor *add_tensor(plan *pl, const char *name, int n_dims, const uint64_t ne[4], uint32_t type) {
    mtensor *t = &pl->t[pl->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    memcpy(t->ne, ne, sizeof t->ne);
    t->type = type;
    if (!ds4_type_row_bytes(t->type, t->ne[0]))
        die("%s: row length %llu is not a multiple of the %s block", t->name, (unsigned long long)t->ne[0],
            ds4_type_name(t->type));
    return t;
}

/* Every -- option that is not this tool's own is a metadata override. */
static void apply_overrides(int argc, char **argv, const key_table *kt) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-vocab")) continue;
        bool mine = false;
        for (size_t j = 0; j < sizeof own_options / sizeof own_options[0]; j++) mine |= !strcmp(argv[i], own_options[j]);
        if (!mine) override(kt, argv[i] + 2, argv[i + 1]);
        i++;
    }
}

/* The preset's hyperparameters with the command line's key overrides,
 * checked; every DeepSeek file this tool writes starts from them. */
static void ds4_preset_hparams(ds4_hparams *hp, int argc, char **argv, const char *pname, uint32_t n_layer) {
    preset(hp, pname, n_layer);
    apply_overrides(argc, argv, &(key_table){DS4_ARCH, ds4_hparam_keys, ds4_n_hparam_keys, hp, hp->n_layer});
    /* overridden ratios mean what they mean in the released files */
    ds4_hparams_default_kinds(hp);
    char err[512];
    if (ds4_hparams_check(hp, err, sizeof err)) die("%s", err);
}

static void plan_ds4(ds4_gguf_writer *w, int argc, char **argv, const char *pname, uint32_t n_layer,
                     enum ds4_mix mix, const char *slice_arg, plan *pl) {
    static ds4_hparams hp;
    ds4_preset_hparams(&hp, argc, argv, pname, n_layer);
    char err[512];
    ds4_layer_slice slice = DS4_SLICE_ALL;
    if (slice_arg && !ds4_layer_slice_parse(slice_arg, &slice, err, sizeof err)) die("%s", err);
    if (!ds4_layer_slice_resolve(&slice, (int)hp.n_layer, err, sizeof err)) die("--slice %s", err);
    pl->n_expert = hp.n_expert;
    pl->t = calloc(DS4_T_COUNT * (hp.n_layer + 1), sizeof *pl->t);
    if (!pl->t) die("out of memory");
    for (int l = -1; l < (int)hp.n_layer; l++)
        for (int id = 0; id < DS4_T_COUNT; id++) {
            if (!ds4_tensor_present(&hp, (enum ds4_tensor_id)id, l)) continue;
            if (!ds4_tensor_in_slice((enum ds4_tensor_id)id, l, slice.first, slice.last, slice.output)) continue;
            char name[96];
            uint64_t ne[4];
            ds4_tensor_name((enum ds4_tensor_id)id, l, name, sizeof name);
            int nd = ds4_tensor_shape(&hp, (enum ds4_tensor_id)id, l, ne);
            mtensor *t = add_tensor(pl, name, nd, ne, ds4_tensor_type((enum ds4_tensor_id)id, mix));
            spread((enum ds4_tensor_id)id, ne[0], &t->centre, &t->half_width);
        }
    ds4_hparams_write(w, &hp);
    ds4_file_keys_write(w, mix);
    if (slice_arg) ds4_slice_keys_write(w, (uint32_t)slice.first, (uint32_t)slice.last, slice.output);
}

/* The MTP projections are spread like a layer's matrices, its norms and HC
 * merge like the head's. */
static enum ds4_tensor_id mtp_spread_like(enum ds4_mtp_tensor_id id) {
    switch (id) {
    case DS4_MTP_ENORM: case DS4_MTP_HNORM: case DS4_MTP_NORM: return DS4_T_OUTPUT_NORM;
    case DS4_MTP_HC_HEAD_FN: return DS4_T_OUTPUT_HC_FN;
    case DS4_MTP_HC_HEAD_SCALE: return DS4_T_OUTPUT_HC_SCALE;
    case DS4_MTP_HC_HEAD_BASE: return DS4_T_OUTPUT_HC_BASE;
    default: return DS4_T_ATTN_Q_A;
    }
}

static void plan_ds4_mtp(ds4_gguf_writer *w, int argc, char **argv, const char *pname, uint32_t n_layer,
                         enum ds4_mix mix, plan *pl) {
    static ds4_hparams hp, block;
    ds4_preset_hparams(&hp, argc, argv, pname, n_layer);
    hp.nextn_predict_layers = 1;
    ds4_hparams_mtp_block(&hp, &block);
    pl->n_expert = hp.n_expert;
    pl->t = calloc(DS4_T_COUNT + DS4_MTP_COUNT, sizeof *pl->t);
    if (!pl->t) die("out of memory");
    char name[96];
    uint64_t ne[4];
    for (int id = 0; id < DS4_T_COUNT; id++) {
        if (!ds4_tensor_present(&block, (enum ds4_tensor_id)id, DS4_LAYER_MTP)) continue;
        ds4_tensor_name((enum ds4_tensor_id)id, DS4_LAYER_MTP, name, sizeof name);
        int nd = ds4_tensor_shape(&block, (enum ds4_tensor_id)id, DS4_LAYER_MTP, ne);
        mtensor *t = add_tensor(pl, name, nd, ne, ds4_tensor_type((enum ds4_tensor_id)id, mix));
        spread((enum ds4_tensor_id)id, ne[0], &t->centre, &t->half_width);
    }
    for (int id = 0; id < DS4_MTP_COUNT; id++) {
        ds4_mtp_tensor_name((enum ds4_mtp_tensor_id)id, name, sizeof name);
        int nd = ds4_mtp_tensor_shape(&block, (enum ds4_mtp_tensor_id)id, ne);
        mtensor *t = add_tensor(pl, name, nd, ne, ds4_mtp_tensor_type((enum ds4_mtp_tensor_id)id, mix));
        spread(mtp_spread_like((enum ds4_mtp_tensor_id)id), ne[0], &t->centre, &t->half_width);
    }
    ds4_hparams_write(w, &hp);
    ds4_file_keys_write(w, mix);
}

/* A DSpark support file (ds4_layout.h) for the model the options describe:
 * three draft layers with the main model's attention shape, a shared
 * expert's feed-forward width, a rank-256 Markov head (32 below Flash's
 * width), the confidence head
 * reading the Markov embedding too, and the target layers the three last
 * below the final one. Types: each matrix like its counterpart in the main
 * model; the mask token the vocabulary's last id. */
static void dspark_tensor(plan *pl, const char *name, uint64_t n0, uint64_t n1, enum ds4_tensor_id like,
                          enum ds4_mix mix) {
    const uint64_t ne[4] = {n0, n1, 1, 1};
    /* vectors F32 */
    const bool vector = n1 == 1;
    mtensor *t = add_tensor(pl, name, vector ? 1 : 2, ne, vector ? DS4_TYPE_F32 : ds4_tensor_type(like, mix));
    spread(like, n0, &t->centre, &t->half_width);
}

static void plan_ds4_dspark(ds4_gguf_writer *w, int argc, char **argv, const char *pname, uint32_t n_layer,
                            enum ds4_mix mix, plan *pl) {
    static ds4_hparams hp;
    ds4_preset_hparams(&hp, argc, argv, pname, n_layer);
    if (hp.n_layer < 2) die("--support dspark: the model needs at least 2 layers");
    enum { LAYERS = 3, BLOCK = 5 };
    /* the released draft's rank; small models keep their Markov tables small */
    const uint32_t rank = hp.n_embd >= 4096 ? 256 : 32;
    int32_t targets[3];
    int n_tgt = 0;
    for (int l = (int)hp.n_layer - 4; l <= (int)hp.n_layer - 2; l++)
        if (l >= 0) targets[n_tgt++] = l;
    const uint64_t E = hp.n_embd, V = hp.n_vocab, HD = (uint64_t)hp.n_head * hp.key_length;
    const uint64_t GO = (uint64_t)hp.o_groups * hp.o_lora_rank, F = hp.expert_ff;
    ds4_gguf_w_str(w, "general.architecture", DS4_DSPARK_ARCH);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("embedding_length"), hp.n_embd);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("vocab_size"), hp.n_vocab);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("target_block_count"), hp.n_layer);
    ds4_gguf_w_arr(w, DS4_DSPARK_KEY("target_layers"), DS4_GGUF_I32, targets, (uint64_t)n_tgt);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("block_count"), LAYERS);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("block_size"), BLOCK);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("mask_token_id"), hp.n_vocab - 1);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("head_count"), hp.n_head);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("key_length"), hp.key_length);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("rope.dimension_count"), hp.n_rot);
    ds4_gguf_w_f32(w, DS4_DSPARK_KEY("rope.freq_base"), hp.rope_base);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("q_lora_rank"), hp.q_lora_rank);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("output_group_count"), hp.o_groups);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("output_lora_rank"), hp.o_lora_rank);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("feed_forward_length"), hp.expert_ff);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("markov_rank"), rank);
    ds4_gguf_w_f32(w, DS4_DSPARK_KEY("layer_norm_rms_epsilon"), hp.rms_eps);
    pl->t = calloc(7 + 13 * LAYERS, sizeof *pl->t);
    if (!pl->t) die("out of memory");
    dspark_tensor(pl, DS4_DSPARK_PREFIX "fc.weight", (uint64_t)n_tgt * E, E, DS4_T_ATTN_Q_A, mix);
    dspark_tensor(pl, DS4_DSPARK_PREFIX "hidden_norm.weight", E, 1, DS4_T_ATTN_NORM, mix);
    dspark_tensor(pl, DS4_DSPARK_PREFIX "norm.weight", E, 1, DS4_T_OUTPUT_NORM, mix);
    dspark_tensor(pl, DS4_DSPARK_PREFIX "markov_w1.weight", rank, V, DS4_T_TOKEN_EMBD, mix);
    dspark_tensor(pl, DS4_DSPARK_PREFIX "markov_w2.weight", rank, V, DS4_T_OUTPUT, mix);
    mtensor *conf = add_tensor(pl, DS4_DSPARK_PREFIX "confidence.weight", 2, (uint64_t[4]){E + rank, 1, 1, 1},
                               DS4_TYPE_F32);
    spread(DS4_T_ATTN_Q_A, E + rank, &conf->centre, &conf->half_width);
    dspark_tensor(pl, DS4_DSPARK_PREFIX "confidence.bias", 1, 1, DS4_T_EXP_PROBS_B, mix);
    static const struct { const char *name; enum ds4_tensor_id like; } L[] = {
        {"attn_norm", DS4_T_ATTN_NORM}, {"attn_q_a", DS4_T_ATTN_Q_A}, {"attn_q_a_norm", DS4_T_ATTN_Q_A_NORM},
        {"attn_q_b", DS4_T_ATTN_Q_B}, {"attn_kv", DS4_T_ATTN_KV}, {"attn_kv_a_norm", DS4_T_ATTN_KV_A_NORM},
        {"attn_sinks", DS4_T_ATTN_SINKS}, {"attn_output_a", DS4_T_ATTN_OUTPUT_A},
        {"attn_output_b", DS4_T_ATTN_OUTPUT_B}, {"ffn_norm", DS4_T_FFN_NORM}, {"ffn_gate", DS4_T_FFN_GATE_SHEXP},
        {"ffn_up", DS4_T_FFN_UP_SHEXP}, {"ffn_down", DS4_T_FFN_DOWN_SHEXP}};
    const uint64_t shape[][2] = {{E, 1}, {E, hp.q_lora_rank}, {hp.q_lora_rank, 1}, {hp.q_lora_rank, HD},
                                 {E, hp.key_length}, {hp.key_length, 1}, {hp.n_head, 1},
                                 {HD / hp.o_groups, GO}, {GO, E}, {E, 1}, {E, F}, {E, F}, {F, E}};
    for (int l = 0; l < LAYERS; l++)
        for (size_t i = 0; i < sizeof L / sizeof *L; i++) {
            char name[96];
            snprintf(name, sizeof name, DS4_DSPARK_LAYER_PREFIX "%s.weight", l, L[i].name);
            dspark_tensor(pl, name, shape[i][0], shape[i][1], L[i].like, mix);
        }
}

/* The released DeepSeek DSpark sidecar's layout (ds4_layout.h) for the model
 * the options describe: three stages that are the MTP block's layer
 * (window-only attention, top-k routed experts) named mtp.0. .. mtp.2., the
 * first with main_proj and main_norm over the inputs of the three last
 * layers, the last with the HC merge, norm, the Markov head (rank as above)
 * and the confidence head; the noise token the vocabulary's last id. Types
 * as the MTP block's and the dense file's counterparts. */
static void plan_ds4_dspark_sidecar(ds4_gguf_writer *w, int argc, char **argv, const char *pname, uint32_t n_layer,
                                    enum ds4_mix mix, plan *pl) {
    static ds4_hparams hp, block;
    ds4_preset_hparams(&hp, argc, argv, pname, n_layer);
    if (hp.n_layer < 2) die("--support dspark-sidecar: the model needs at least 2 layers");
    ds4_hparams_mtp_block(&hp, &block);
    enum { STAGES = 3, BLOCK = 5 };
    const uint32_t rank = hp.n_embd >= 4096 ? 256 : 32;
    int32_t targets[3];
    int n_tgt = 0;
    for (int l = (int)hp.n_layer - 3; l <= (int)hp.n_layer - 1; l++)
        if (l >= 1) targets[n_tgt++] = l;
    const uint64_t E = hp.n_embd, V = hp.n_vocab, hc = hp.hc_count;
    ds4_gguf_w_str(w, "general.architecture", DS4_DSPARK_SIDECAR_ARCH);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("block_size"), BLOCK);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("markov_rank"), rank);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("n_layers"), STAGES);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("noise_token_id"), hp.n_vocab - 1);
    ds4_gguf_w_u32(w, DS4_DSPARK_KEY("stage_count"), STAGES);
    ds4_gguf_w_arr(w, DS4_DSPARK_KEY("target_layer_ids"), DS4_GGUF_I32, targets, (uint64_t)n_tgt);
    pl->n_expert = hp.n_expert;
    pl->t = calloc(STAGES * DS4_T_COUNT + 9, sizeof *pl->t);
    if (!pl->t) die("out of memory");
    char name[96], stage[96];
    uint64_t ne[4];
    for (int s = 0; s < STAGES; s++)
        for (int id = 0; id < DS4_T_COUNT; id++) {
            if (!ds4_tensor_present(&block, (enum ds4_tensor_id)id, DS4_LAYER_MTP)) continue;
            ds4_tensor_name((enum ds4_tensor_id)id, DS4_LAYER_MTP, name, sizeof name);
            snprintf(stage, sizeof stage, DS4_DSPARK_STAGE_PREFIX "%s", s, name + strlen(DS4_MTP_PREFIX));
            int nd = ds4_tensor_shape(&block, (enum ds4_tensor_id)id, DS4_LAYER_MTP, ne);
            mtensor *t = add_tensor(pl, stage, nd, ne, ds4_tensor_type((enum ds4_tensor_id)id, mix));
            spread((enum ds4_tensor_id)id, ne[0], &t->centre, &t->half_width);
        }
    dspark_tensor(pl, DS4_DSPARK_STAGE_PREFIX_0 "main_proj.weight", (uint64_t)n_tgt * E, E, DS4_T_ATTN_Q_A, mix);
    dspark_tensor(pl, DS4_DSPARK_STAGE_PREFIX_0 "main_norm.weight", E, 1, DS4_T_ATTN_NORM, mix);
    static const struct { const char *name; enum ds4_tensor_id like; } last[] = {
        {"hc_head_fn", DS4_T_OUTPUT_HC_FN}, {"hc_head_scale", DS4_T_OUTPUT_HC_SCALE},
        {"hc_head_base", DS4_T_OUTPUT_HC_BASE}, {"norm", DS4_T_OUTPUT_NORM},
        {"markov_head.markov_w1", DS4_T_TOKEN_EMBD}, {"markov_head.markov_w2", DS4_T_OUTPUT}};
    const uint64_t shape[][2] = {{hc * E, hc}, {1, 1}, {hc, 1}, {E, 1}, {rank, V}, {rank, V}};
    for (size_t i = 0; i < sizeof last / sizeof *last; i++) {
        snprintf(name, sizeof name, DS4_DSPARK_STAGE_PREFIX "%s.weight", STAGES - 1, last[i].name);
        dspark_tensor(pl, name, shape[i][0], shape[i][1], last[i].like, mix);
    }
    snprintf(name, sizeof name, DS4_DSPARK_STAGE_PREFIX "confidence_head.proj.weight", STAGES - 1);
    mtensor *conf = add_tensor(pl, name, 2, (uint64_t[4]){E + rank, 1, 1, 1}, DS4_TYPE_F32);
    spread(DS4_T_ATTN_Q_A, E + rank, &conf->centre, &conf->half_width);
}

/* GLM 5.2's hyperparameters (GLM sheet section 2) with the preset's sizes. */
static void glm_preset(glm_hparams *hp, const char *name, uint32_t n_layer) {
    const bool real = !strcmp(name, "glm");
    memset(hp, 0, sizeof *hp);
    const uint32_t trunk = n_layer ? n_layer : 4;
    if (trunk + 1 > GLM_MAX_LAYERS) die("--layers %u exceeds %d", trunk, GLM_MAX_LAYERS - 1);
    hp->n_block = trunk + 1;
    hp->n_nextn = 1;
    hp->n_ctx_train = GLM_52_CONTEXT;
    hp->n_vocab = real ? 154880 : 4096;
    hp->n_embd = real ? 6144 : 256;
    hp->n_head = real ? 64 : 4;
    hp->n_head_kv = 1;
    hp->n_rot = 64;
    hp->key_length_mla = real ? 256 : 128;
    hp->value_length_mla = real ? 256 : 128;
    hp->q_lora_rank = real ? 2048 : 128;
    hp->kv_lora_rank = real ? 512 : 128;
    hp->key_length = hp->kv_lora_rank + hp->n_rot;
    hp->value_length = hp->kv_lora_rank;
    hp->dense_ff = real ? 12288 : 512;
    hp->n_leading_dense = real ? (trunk < 3 ? trunk : 3) : 1;
    hp->n_expert = real ? 256 : 8;
    hp->n_expert_used = real ? 8 : 2;
    hp->expert_ff = real ? 2048 : 256;
    hp->n_expert_shared = 1;
    hp->n_expert_groups = hp->n_expert_groups_used = 1;
    hp->expert_weights_scale = 2.5f;
    hp->expert_weights_norm = true;
    hp->expert_gating_func = 2;
    hp->rope_base = 8e6f;
    hp->rms_eps = 1e-5f;
    hp->idx_n_head = real ? 32 : 8;
    hp->idx_head_dim = 128;
    hp->idx_topk = real ? 2048 : 16;
}

static void plan_glm(ds4_gguf_writer *w, int argc, char **argv, const char *pname, uint32_t n_layer,
                     enum ds4_mix mix, plan *pl) {
    static glm_hparams hp;
    glm_preset(&hp, pname, n_layer);
    apply_overrides(argc, argv, &(key_table){GLM_ARCH, ds4_glm_hparam_keys, ds4_glm_n_hparam_keys, &hp, hp.n_block});
    ds4_glm_default_indexer_types(&hp);   /* after overrides: it follows context_length */
    char err[512];
    if (ds4_glm_hparams_check(&hp, err, sizeof err)) die("%s", err);
    pl->n_expert = hp.n_expert;
    pl->t = calloc(GLM_T_COUNT * (hp.n_block + 1), sizeof *pl->t);
    if (!pl->t) die("out of memory");
    for (int l = -1; l < (int)hp.n_block; l++)
        for (int id = 0; id < GLM_T_COUNT; id++) {
            if (!ds4_glm_tensor_present(&hp, (enum glm_tensor_id)id, l)) continue;
            char name[96];
            uint64_t ne[4];
            ds4_glm_tensor_name((enum glm_tensor_id)id, l, name, sizeof name);
            int nd = ds4_glm_tensor_shape(&hp, (enum glm_tensor_id)id, l, ne);
            mtensor *t = add_tensor(pl, name, nd, ne, ds4_glm_tensor_type((enum glm_tensor_id)id, mix));
            glm_spread((enum glm_tensor_id)id, ne[0], &t->centre, &t->half_width);
        }
    ds4_glm_hparams_write(w, &hp);
    ds4_glm_file_keys_write(w, mix);
}

int main(int argc, char **argv) {
    const char *out = NULL, *pname = "demo", *type = "q2", *name = NULL, *slice_arg = NULL, *support = NULL;
    const char *vocab = "data/deepseek-v3-tokenizer.json";
    const char *vocab_added = "tests/fixtures/tokenizer/v4-added-tokens.json";
    uint32_t n_layer = 0;
    uint64_t seed = 1;
    bool no_vocab = false, vocab_given = false;
    /* First pass: everything except the per-key overrides, which apply to the
     * preset once its layer count is known. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--no-vocab")) { no_vocab = true; continue; }
        if (!strcmp(a, "-h") || !strcmp(a, "--help") || a[0] != '-') usage();
        if (!known_option(a)) { ds4_cli_unknown_option("ds4-make-model", a); exit(2); }
        if (i + 1 >= argc) { ds4_cli_missing_value("ds4-make-model", a); exit(2); }
        const char *v = argv[++i];
        if (!strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--preset")) pname = v;
        else if (!strcmp(a, "--layers")) n_layer = (uint32_t)strtoul(v, NULL, 0);
        else if (!strcmp(a, "--type")) type = v;
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 0);
        else if (!strcmp(a, "--vocab")) { vocab = v; vocab_given = true; }
        else if (!strcmp(a, "--vocab-added")) { vocab_added = *v ? v : NULL; vocab_given = true; }
        else if (!strcmp(a, "--name")) name = v;
        else if (!strcmp(a, "--slice")) slice_arg = v;
        else if (!strcmp(a, "--support")) support = v;
    }
    if (!out) usage();
    int mix = ds4_mix_from_name(type);
    if (mix < 0) die("unknown --type %s (f32, f16, q8_0, q2, q4)", type);
    const bool glm = !strcmp(pname, "glm") || !strcmp(pname, "glm-demo");
    if (glm && slice_arg) die("--slice: GLM presets are written whole");
    if (support && ((strcmp(support, "mtp") && strcmp(support, "dspark") && strcmp(support, "dspark-sidecar")) || glm ||
                    slice_arg))
        die("--support %s: the support files are mtp, dspark and dspark-sidecar, for DeepSeek presets, without --slice",
            support);
    rng_state = seed;

    plan pl = {0};
    ds4_gguf_writer *w = ds4_gguf_writer_new(32);
    if (glm) plan_glm(w, argc, argv, pname, n_layer, (enum ds4_mix)mix, &pl);
    else if (support && !strcmp(support, "dspark")) plan_ds4_dspark(w, argc, argv, pname, n_layer, (enum ds4_mix)mix, &pl);
    else if (support && !strcmp(support, "dspark-sidecar"))
        plan_ds4_dspark_sidecar(w, argc, argv, pname, n_layer, (enum ds4_mix)mix, &pl);
    else if (support) plan_ds4_mtp(w, argc, argv, pname, n_layer, (enum ds4_mix)mix, &pl);
    else plan_ds4(w, argc, argv, pname, n_layer, (enum ds4_mix)mix, slice_arg, &pl);
    char dflt[128], err[512];
    snprintf(dflt, sizeof dflt, "ds4 random %s (meaningless weights)", pname);
    ds4_gguf_w_str(w, "general.name", name ? name : dflt);
    /* GLM's tokenizer ships with no package here: glm-demo carries the
     * constructed one (GLM's form, 4096 ids = its vocabulary), the real-shape
     * glm preset none unless --vocab names one */
    if (glm && !vocab_given) {
        vocab = strcmp(pname, "glm-demo") ? NULL : "data/glm-constructed-tokenizer.json";
        vocab_added = NULL;
    }
    if (!support && !no_vocab && vocab && ds4_tokenizer_gguf_from_hf_json(w, vocab, vocab_added, err, sizeof err))
        die("tokenizer %s: %s (use --vocab/--vocab-added, or --no-vocab)", vocab, err);
    for (size_t i = 0; i < pl.n; i++)
        ds4_gguf_w_tensor(w, pl.t[i].name, pl.t[i].type, (uint32_t)pl.t[i].n_dims, pl.t[i].ne, NULL);
    fprintf(stderr, "ds4-make-model: %s preset, %s mix, %zu tensors -> %s (random weights)\n",
            pname, ds4_mix_name((enum ds4_mix)mix), pl.n, out);
    if (ds4_gguf_writer_write_file(w, out, fill, &pl, err, sizeof err)) die("%s", err);
    ds4_gguf_writer_free(w);
    free(pl.t);
    return 0;
}
