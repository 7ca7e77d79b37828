/* dspark.c -- the DSpark block drafter: binding of its support file and its
 * dense forward over one block (dspark.h). Its matrix products run on the
 * main backend's threads, between the main model's evaluations; the rest
 * (attention over block_size rows, norms) is small. */
#include "models/dsv4/dspark.h"

#include "format/gguf.h"
#include "format/tensor_bind.h"
#include "kernels/attn_cpu.h"
#include "kernels/kernels_cpu.h"
#include "kernels/quant.h"
#include "models/dsv4/forward_cpu.h"
#include "models/dsv4/forward_shared.h"
#include "models/dsv4/kv.h"
#include "nn/nn_math.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *attn_norm, *q_a_norm, *kv_norm, *sinks, *ffn_norm;
    ds4_tensor q_a, q_b, kv, out_a, out_b;
    ds4_tensor gate, up, down;          /* the dense layer's MLP; a sidecar stage's shared expert */
    /* a sidecar stage's hyper-connections and routed experts */
    ds4_tensor hc_attn_fn, hc_ffn_fn, router, gate_exps, up_exps, down_exps;
    float *hc_attn_scale, *hc_attn_base, *hc_ffn_scale, *hc_ffn_base, *router_bias;
} dspark_layer;

struct ds4_dspark {
    ds4_gguf *g;
    const ds4_model *main;
    struct ds4_pool *pool;
    char name[128];
    bool sidecar;                       /* the released DeepSeek layout (stages with HC and MoE) */
    int E, V, n_layer, B, mask_tok, H, D, n_rot, Q, G, O, F, R, C, n_tgt;
    int window;                         /* a block attends to the last `window` context rows (0: all) */
    int n_hc, mixn, X, K;               /* sidecar: streams, HC mix width, experts, experts per row */
    float eps, rope_base, clamp_exp, clamp_shexp;
    int *targets;                       /* the main model's layers whose outputs it reads */
    float *inv_freq;                    /* [n_rot / 2] */
    ds4_tensor fc, w1, w2, conf_w, hc_head_fn;
    float *hidden_norm, *norm, conf_b, *hc_head_scale, *hc_head_base;
    dspark_layer *layers;
    /* scratch of one call (the engine is single-threaded) */
    void *act;
    float *x, *h, *qa, *q, *kvb, *att, *oa, *oa_group, *ff_g, *ff_u, *ctxh, *w1row;
    float *hid;                         /* [B][E] what the confidence head reads */
    float *x_next, *flat, *mix, *hcw, *router, *ew, *mo, *eo;   /* sidecar */
    int *eids;
};

/* Context rows are made lazily: an evaluation only records that the ring
 * now holds the features of [n, followed); the draft's next block turns
 * them into K = V rows, CONTEXT_CHUNK at a time, so the fc and kv matrices
 * are read once per chunk, not once per position (a session whose drafts
 * back off for k steps then pays one read, not k). A row's values do not
 * depend on the rows beside it (ds4_linear's contract), so a chunk gives
 * the rows one push at a time gives. A drafter that reads a window of rows
 * keeps them in a ring of CONTEXT_WINDOWS windows, so that a rewind of up to
 * that many windows still finds the rows before it. */
enum { CONTEXT_CHUNK = 32, CONTEXT_WINDOWS = 8 };

struct ds4_dspark_state {
    ds4_dspark *d;
    int ctx, n;                         /* n: context rows made */
    int lo;                             /* the rows of positions [lo, n) are held */
    int followed;                       /* the ring holds the features of [n, followed) */
    int kv_rows;                        /* rows held per layer: ctx, or a ring of context windows */
    float *kv;                          /* [n_layer][kv_rows][D] roped context K = V rows, slot = position mod kv_rows */
    float *ring;                        /* [slots][n_tgt][E] target features, slot = position mod slots */
    int slots, bound_pos;
};

static float *kv_row(const ds4_dspark_state *st, int l, int pos) {
    return st->kv + ((size_t)l * st->kv_rows + pos % st->kv_rows) * st->d->D;
}

static void layer_free(dspark_layer *L) {
    free(L->attn_norm); free(L->q_a_norm); free(L->kv_norm); free(L->sinks); free(L->ffn_norm);
    free(L->hc_attn_scale); free(L->hc_attn_base); free(L->hc_ffn_scale); free(L->hc_ffn_base); free(L->router_bias);
}

void ds4_dspark_free(ds4_dspark *d) {
    if (!d) return;
    for (int l = 0; d->layers && l < d->n_layer; l++) layer_free(&d->layers[l]);
    free(d->layers);
    free(d->targets); free(d->inv_freq); free(d->hidden_norm); free(d->norm); free(d->hc_head_scale); free(d->hc_head_base);
    free(d->act); free(d->x); free(d->h); free(d->qa); free(d->q); free(d->kvb); free(d->att); free(d->oa); free(d->oa_group);
    free(d->ff_g); free(d->ff_u); free(d->ctxh); free(d->w1row); free(d->hid);
    free(d->x_next); free(d->flat); free(d->mix); free(d->hcw); free(d->router); free(d->ew); free(d->mo); free(d->eo);
    free(d->eids);
    ds4_gguf_close(d->g);
    free(d);
}

static bool key_u32(ds4_binder *b, const char *key, int lo, int hi, int *out) {
    uint32_t v;
    if (b->failed) return false;
    if (!ds4_gguf_get_u32(b->g, key, &v)) { ds4_bind_fail(b, "missing or non-u32 key %s", key); return false; }
    if ((int64_t)v < lo || (int64_t)v > hi) { ds4_bind_fail(b, "%s = %u out of range %d..%d", key, v, lo, hi); return false; }
    *out = (int)v;
    return true;
}

static ds4_tensor mat(ds4_binder *b, const char *name, uint64_t n0, uint64_t n1) {
    const uint64_t ne[2] = {n0, n1};
    return ds4_bind_matrix(b, name, 2, ne);
}

static float *vec(ds4_binder *b, const char *name, uint64_t n) {
    return ds4_bind_floats(b, name, 1, &n);
}

/* Layer l's attention and norms, named prefix (a format of l) + the names
 * both layouts share. */
static void bind_attention(ds4_binder *b, ds4_dspark *d, const char *prefix, int l) {
    char n[128], pre[64];
    dspark_layer *L = &d->layers[l];
    snprintf(pre, sizeof pre, prefix, l);
#define NAME(s) (snprintf(n, sizeof n, "%s" s, pre), n)
    L->attn_norm = vec(b, NAME("attn_norm.weight"), d->E);
    L->q_a = mat(b, NAME("attn_q_a.weight"), d->E, d->Q);
    L->q_a_norm = vec(b, NAME("attn_q_a_norm.weight"), d->Q);
    L->q_b = mat(b, NAME("attn_q_b.weight"), d->Q, (uint64_t)d->H * d->D);
    L->kv = mat(b, NAME("attn_kv.weight"), d->E, d->D);
    L->kv_norm = vec(b, NAME("attn_kv_a_norm.weight"), d->D);
    L->sinks = vec(b, NAME("attn_sinks.weight"), d->H);
    L->out_a = mat(b, NAME("attn_output_a.weight"), (uint64_t)d->H * d->D / d->G, (uint64_t)d->G * d->O);
    L->out_b = mat(b, NAME("attn_output_b.weight"), (uint64_t)d->G * d->O, d->E);
    L->ffn_norm = vec(b, NAME("ffn_norm.weight"), d->E);
    if (!d->sidecar) {
        L->gate = mat(b, NAME("ffn_gate.weight"), d->E, d->F);
        L->up = mat(b, NAME("ffn_up.weight"), d->E, d->F);
        L->down = mat(b, NAME("ffn_down.weight"), d->F, d->E);
        return;
    }
    const uint64_t hcE = (uint64_t)d->n_hc * d->E, experts_gu[3] = {d->E, d->F, d->X}, experts_d[3] = {d->F, d->E, d->X};
    L->hc_attn_fn = mat(b, NAME("hc_attn_fn.weight"), hcE, d->mixn);
    L->hc_attn_scale = vec(b, NAME("hc_attn_scale.weight"), 3);
    L->hc_attn_base = vec(b, NAME("hc_attn_base.weight"), d->mixn);
    L->hc_ffn_fn = mat(b, NAME("hc_ffn_fn.weight"), hcE, d->mixn);
    L->hc_ffn_scale = vec(b, NAME("hc_ffn_scale.weight"), 3);
    L->hc_ffn_base = vec(b, NAME("hc_ffn_base.weight"), d->mixn);
    L->router = mat(b, NAME("ffn_gate_inp.weight"), d->E, d->X);
    L->router_bias = vec(b, NAME("exp_probs_b.bias"), d->X);
    L->gate_exps = ds4_bind_matrix(b, NAME("ffn_gate_exps.weight"), 3, experts_gu);
    L->up_exps = ds4_bind_matrix(b, NAME("ffn_up_exps.weight"), 3, experts_gu);
    L->down_exps = ds4_bind_matrix(b, NAME("ffn_down_exps.weight"), 3, experts_d);
    L->gate = mat(b, NAME("ffn_gate_shexp.weight"), d->E, d->F);
    L->up = mat(b, NAME("ffn_up_shexp.weight"), d->E, d->F);
    L->down = mat(b, NAME("ffn_down_shexp.weight"), d->F, d->E);
#undef NAME
}

/* n ascending layer ids, each lo..hi, from an integer array key. */
static int *layer_ids(ds4_binder *b, const char *key, int lo, int hi, int *n) {
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(b->g, key);
    if (b->failed) return NULL;
    if (!kv || kv->type != DS4_GGUF_ARRAY || kv->arr_n < 1 || kv->arr_n > 64) {
        ds4_bind_fail(b, "missing key %s (an array of 1..64 layer ids)", key);
        return NULL;
    }
    int *ids = malloc(kv->arr_n * sizeof(int));
    if (!ids) { ds4_bind_fail_oom(b, "the DSpark drafter"); return NULL; }
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        int64_t v;
        if (!ds4_gguf_arr_i64(kv, i, &v) || v < lo || v > hi || (i && v <= ids[i - 1])) {
            ds4_bind_fail(b, "%s must be ascending layer ids in %d..%d", key, lo, hi);
            free(ids);
            return NULL;
        }
        ids[i] = (int)v;
    }
    *n = (int)kv->arr_n;
    return ids;
}

/* The dense layout's hyperparameters and target layers; the checks against
 * the main model are what makes a file for another model a one-line
 * refusal. */
static void read_dense_keys(ds4_binder *b, ds4_dspark *d) {
    const ds4_config *mc = &d->main->cfg;
    int E = 0, V = 0, L = 0;
    key_u32(b, DS4_DSPARK_KEY("embedding_length"), 1, 1 << 20, &E);
    key_u32(b, DS4_DSPARK_KEY("vocab_size"), 1, 1 << 24, &V);
    key_u32(b, DS4_DSPARK_KEY("target_block_count"), 1, 4096, &L);
    if (b->failed) return;
    if (E != mc->n_embd || V != mc->n_vocab || L != mc->n_layer) {
        ds4_bind_fail(b, "made for a model with n_embd %d, n_vocab %d, %d layers (this one: %d, %d, %d)", E, V, L,
                      mc->n_embd, mc->n_vocab, mc->n_layer);
        return;
    }
    d->E = E;
    d->V = V;
    key_u32(b, DS4_DSPARK_KEY("block_count"), 1, 64, &d->n_layer);
    key_u32(b, DS4_DSPARK_KEY("block_size"), 1, DS4_DSPARK_BLOCK_MAX, &d->B);
    key_u32(b, DS4_DSPARK_KEY("mask_token_id"), 0, V - 1, &d->mask_tok);
    key_u32(b, DS4_DSPARK_KEY("head_count"), 1, 1024, &d->H);
    key_u32(b, DS4_DSPARK_KEY("key_length"), 2, 4096, &d->D);
    key_u32(b, DS4_DSPARK_KEY("rope.dimension_count"), 2, d->D, &d->n_rot);
    key_u32(b, DS4_DSPARK_KEY("q_lora_rank"), 1, 1 << 16, &d->Q);
    key_u32(b, DS4_DSPARK_KEY("output_group_count"), 1, d->H, &d->G);
    key_u32(b, DS4_DSPARK_KEY("output_lora_rank"), 1, 1 << 16, &d->O);
    key_u32(b, DS4_DSPARK_KEY("feed_forward_length"), 1, 1 << 20, &d->F);
    key_u32(b, DS4_DSPARK_KEY("markov_rank"), 1, 1 << 16, &d->R);
    if (b->failed) return;
    if (d->n_rot % 2 || d->H % d->G) {
        ds4_bind_fail(b, "rope.dimension_count must be even and head_count a multiple of output_group_count");
        return;
    }
    if (!ds4_gguf_get_f32(b->g, DS4_DSPARK_KEY("rope.freq_base"), &d->rope_base) || !(d->rope_base > 1) ||
        !ds4_gguf_get_f32(b->g, DS4_DSPARK_KEY("layer_norm_rms_epsilon"), &d->eps) || !(d->eps > 0)) {
        ds4_bind_fail(b, "missing or invalid rope.freq_base / layer_norm_rms_epsilon");
        return;
    }
    /* the last layer's output is only seen through the output head's merge,
     * never as streams: the ids the reference serves are 0..L-2 */
    d->targets = layer_ids(b, DS4_DSPARK_KEY("target_layers"), 0, L - 2, &d->n_tgt);
}

/* The sidecar names only its own sizes: its stages have the main model's
 * attention and experts, and the shapes of its tensors (checked against
 * those) are what tells a file for another model. Its target layers are
 * the layers whose input (the output of the layer before) it reads. */
static void read_sidecar_keys(ds4_binder *b, ds4_dspark *d) {
    const ds4_config *mc = &d->main->cfg;
    d->sidecar = true;
    d->E = mc->n_embd;
    d->V = mc->n_vocab;
    d->H = mc->n_head;
    d->D = mc->head_dim;
    d->n_rot = mc->n_rot;
    d->Q = mc->q_lora;
    d->G = mc->o_groups;
    d->O = mc->o_lora;
    d->F = mc->n_ff_exp;
    d->eps = mc->rms_eps;
    d->rope_base = mc->rope_base;
    d->window = mc->window;
    d->n_hc = mc->n_hc;
    d->mixn = (2 + mc->n_hc) * mc->n_hc;
    d->X = mc->n_expert;
    d->K = mc->n_expert_used;
    /* one SwiGLU limit for every draft stage, as the MTP block takes it */
    d->clamp_exp = mc->clamp_exp[mc->n_layer - 1];
    d->clamp_shexp = mc->clamp_shexp[mc->n_layer - 1];
    key_u32(b, DS4_DSPARK_KEY("block_size"), 1, DS4_DSPARK_BLOCK_MAX, &d->B);
    key_u32(b, DS4_DSPARK_KEY("markov_rank"), 1, 1 << 16, &d->R);
    key_u32(b, DS4_DSPARK_KEY("noise_token_id"), 0, d->V - 1, &d->mask_tok);
    const char *stages = ds4_gguf_find_kv(b->g, DS4_DSPARK_KEY("stage_count")) ? DS4_DSPARK_KEY("stage_count")
                                                                                : DS4_DSPARK_KEY("n_layers");
    key_u32(b, stages, 1, 64, &d->n_layer);
    d->C = d->E + d->R;
    int *ids = layer_ids(b, DS4_DSPARK_KEY("target_layer_ids"), 1, mc->n_layer - 1, &d->n_tgt);
    if (!ids) return;
    for (int i = 0; i < d->n_tgt; i++) ids[i]--;
    d->targets = ids;
}

/* The dense layout's own tensors: its context projection, output norm,
 * Markov and confidence heads. */
static void bind_dense(ds4_binder *b, ds4_dspark *d) {
    d->fc = mat(b, DS4_DSPARK_PREFIX "fc.weight", (uint64_t)d->n_tgt * d->E, d->E);
    d->hidden_norm = vec(b, DS4_DSPARK_PREFIX "hidden_norm.weight", d->E);
    d->norm = vec(b, DS4_DSPARK_PREFIX "norm.weight", d->E);
    d->w1 = mat(b, DS4_DSPARK_PREFIX "markov_w1.weight", d->R, d->V);
    d->w2 = mat(b, DS4_DSPARK_PREFIX "markov_w2.weight", d->R, d->V);
    /* the confidence head reads the Markov embedding of the previous token
     * too when it was trained with it: its width says which */
    const ds4_gguf_tensor *ct = ds4_gguf_find_tensor(d->g, DS4_DSPARK_PREFIX "confidence.weight");
    d->C = ct && ct->ne[0] == (uint64_t)(d->E + d->R) ? d->E + d->R : d->E;
    d->conf_w = mat(b, DS4_DSPARK_PREFIX "confidence.weight", d->C, 1);
    float *cb = vec(b, DS4_DSPARK_PREFIX "confidence.bias", 1);
    if (cb) d->conf_b = cb[0];
    free(cb);
    for (int l = 0; l < d->n_layer && !b->failed; l++) bind_attention(b, d, DS4_DSPARK_LAYER_PREFIX, l);
}

/* The sidecar's: the first stage's context projection, the last stage's
 * HC merge, norm, Markov and confidence heads (no confidence bias). */
static void bind_sidecar(ds4_binder *b, ds4_dspark *d) {
    char n[128];
    const int last = d->n_layer - 1;
#define LAST(s) (snprintf(n, sizeof n, DS4_DSPARK_STAGE_PREFIX s, last), n)
    d->fc = mat(b, DS4_DSPARK_STAGE_PREFIX_0 "main_proj.weight", (uint64_t)d->n_tgt * d->E, d->E);
    d->hidden_norm = vec(b, DS4_DSPARK_STAGE_PREFIX_0 "main_norm.weight", d->E);
    d->hc_head_fn = mat(b, LAST("hc_head_fn.weight"), (uint64_t)d->n_hc * d->E, d->n_hc);
    d->hc_head_scale = vec(b, LAST("hc_head_scale.weight"), 1);
    d->hc_head_base = vec(b, LAST("hc_head_base.weight"), d->n_hc);
    d->norm = vec(b, LAST("norm.weight"), d->E);
    d->w1 = mat(b, LAST("markov_head.markov_w1.weight"), d->R, d->V);
    d->w2 = mat(b, LAST("markov_head.markov_w2.weight"), d->R, d->V);
    d->conf_w = mat(b, LAST("confidence_head.proj.weight"), d->C, 1);
#undef LAST
    for (int l = 0; l < d->n_layer && !b->failed; l++) bind_attention(b, d, DS4_DSPARK_STAGE_PREFIX, l);
}

ds4_dspark *ds4_dspark_load(const char *path, const ds4_model *main_model, struct ds4_pool *pool, char *err,
                            size_t errlen) {
    char why[384];
    ds4_gguf *g = ds4_gguf_open(path, why, sizeof why);
    if (!g) {
        snprintf(err, errlen, "--dspark %s: %s", path, why);
        return NULL;
    }
    return ds4_dspark_from_gguf(g, path, main_model, pool, err, errlen);
}

ds4_dspark *ds4_dspark_from_gguf(ds4_gguf *g, const char *path, const ds4_model *main_model,
                                 struct ds4_pool *pool, char *err, size_t errlen) {
    ds4_dspark *d = calloc(1, sizeof *d);
    if (!d) {
        ds4_gguf_close(g);
        snprintf(err, errlen, "out of memory for the DSpark drafter");
        return NULL;
    }
    char why[384];
    d->g = g;
    d->main = main_model;
    d->pool = pool;
    ds4_binder b = {.g = d->g, .prefix = "not a DSpark file for this model: ", .err = why, .errlen = sizeof why};
    if (ds4_gguf_arch_is(g, DS4_DSPARK_SIDECAR_ARCH)) read_sidecar_keys(&b, d);
    else if (ds4_gguf_arch_is(g, DS4_DSPARK_ARCH)) read_dense_keys(&b, d);
    else ds4_bind_fail(&b, "general.architecture is neither \"" DS4_DSPARK_ARCH "\" nor \"" DS4_DSPARK_SIDECAR_ARCH "\"");
    if (!b.failed) {
        d->layers = calloc((size_t)d->n_layer, sizeof *d->layers);
        if (!d->layers) ds4_bind_fail_oom(&b, "the DSpark drafter");
    }
    if (!b.failed) (d->sidecar ? bind_sidecar : bind_dense)(&b, d);
    if (b.failed) {
        snprintf(err, errlen, "--dspark %s: %s", path, why);
        ds4_dspark_free(d);
        return NULL;
    }
    ds4_gguf_str nm;
    if (ds4_gguf_get_str(d->g, "general.name", &nm))
        snprintf(d->name, sizeof d->name, "%.*s", (int)(nm.len < 120 ? nm.len : 120), nm.ptr);
    else
        snprintf(d->name, sizeof d->name, "dspark");
    const int B = d->B, HD = d->H * d->D, hcE = d->sidecar ? d->n_hc * d->E : d->E;
    if (d->sidecar) {
        d->inv_freq = ds4_rope_inv_freq(&main_model->cfg, false);
    } else {
        d->inv_freq = malloc((size_t)d->n_rot / 2 * sizeof(float));
        for (int i = 0; d->inv_freq && i < d->n_rot / 2; i++)
            d->inv_freq[i] = (float)(1.0 / pow(d->rope_base, (double)(2 * i) / d->n_rot));
    }
    int widest = d->n_tgt * d->E;
    const int widths[] = {d->E, d->Q, HD, d->F, d->C, d->R, d->G * d->O, hcE};
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++)
        if (widths[i] > widest) widest = widths[i];
    /* one F32-sized activation row per block or context row covers every weight type */
    const int act_rows = B > CONTEXT_CHUNK ? B : CONTEXT_CHUNK;
    bool ok = true;
#define ALLOC(p, n) ok &= ((p) = malloc((size_t)(n) * sizeof *(p))) != NULL
    ok &= (d->act = ds4_kernels_alloc((size_t)act_rows * (ds4_act_bytes(DS4_TYPE_F32, widest) + 64))) != NULL;
    ALLOC(d->x, B * hcE);
    ALLOC(d->h, B * d->E);
    ALLOC(d->hid, B * d->E);
    ALLOC(d->qa, B * d->Q);
    ALLOC(d->q, B * HD);
    ALLOC(d->kvb, B * d->D);
    ALLOC(d->att, B * HD);
    ALLOC(d->oa, B * d->G * d->O);
    ALLOC(d->oa_group, B * d->O);
    ALLOC(d->ff_g, B * d->F);
    ALLOC(d->ff_u, B * d->F);
    ALLOC(d->ctxh, CONTEXT_CHUNK * d->E);
    ALLOC(d->w1row, d->E + d->R);
    if (d->sidecar) {
        ALLOC(d->x_next, B * hcE);
        ALLOC(d->flat, B * hcE);
        ALLOC(d->mix, B * d->mixn);
        ALLOC(d->hcw, B * d->mixn);
        ALLOC(d->router, B * d->X);
        ALLOC(d->ew, B * d->K);
        ALLOC(d->eids, B * d->K);
        ALLOC(d->mo, B * d->E);
        ALLOC(d->eo, d->E);
    }
#undef ALLOC
    if (!ok || !d->inv_freq) {
        snprintf(err, errlen, "out of memory for the DSpark drafter");
        ds4_dspark_free(d);
        return NULL;
    }
    return d;
}

const char *ds4_dspark_name(const ds4_dspark *d) { return d->name; }
int ds4_dspark_block_size(const ds4_dspark *d) { return d->B; }
int ds4_dspark_n_targets(const ds4_dspark *d) { return d->n_tgt; }
const int *ds4_dspark_targets(const ds4_dspark *d) { return d->targets; }

static int kv_rows_for(const ds4_dspark *d, int ctx) {
    return d->window && CONTEXT_WINDOWS * d->window < ctx ? CONTEXT_WINDOWS * d->window : ctx;
}

uint64_t ds4_dspark_state_bytes(const ds4_dspark *d, int ctx, int ring_rows) {
    return ((uint64_t)d->n_layer * kv_rows_for(d, ctx) * d->D + (uint64_t)ring_rows * d->n_tgt * d->E) * sizeof(float);
}

ds4_dspark_state *ds4_dspark_state_new(ds4_dspark *d, int ctx, int ring_rows) {
    ds4_dspark_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->d = d;
    st->ctx = ctx;
    st->slots = ring_rows;
    st->kv_rows = kv_rows_for(d, ctx);
    st->kv = malloc((size_t)d->n_layer * st->kv_rows * d->D * sizeof(float));
    st->ring = ring_rows > 0 ? malloc((size_t)ring_rows * d->n_tgt * d->E * sizeof(float)) : NULL;
    if (!st->kv || (ring_rows > 0 && !st->ring)) { ds4_dspark_state_free(st); return NULL; }
    return st;
}

void ds4_dspark_state_free(ds4_dspark_state *st) {
    if (!st) return;
    free(st->kv);
    free(st->ring);
    free(st);
}

static void make_context(ds4_dspark_state *st);

void ds4_dspark_bind(ds4_dspark_state *st, ds4_backend_seq *q) {
    /* the evaluation writes q->n slots: rows still to be made that it
     * would overwrite are made first */
    if (st->followed > st->n && st->followed - st->n + q->n > st->slots) make_context(st);
    q->layer_ring = st->ring;
    q->ring_layers = st->d->targets;
    q->n_ring_layers = st->d->n_tgt;
    q->layer_ring_slots = st->slots;
    st->bound_pos = q->kv->n_pos;
}

/* Rows [bound_pos, n_pos) were just written and the ring holds the last
 * `slots` of them. They extend the context when it reaches their first;
 * otherwise (a restored state, an evaluation longer than the ring) the
 * context starts again at the first one the ring holds, with no rows
 * before it: a drafter that reads a window drafts again once a window of
 * rows has been made, one that reads every row once the session is rewound
 * to where it has them (a reset: position 0). */
void ds4_dspark_evaluated(ds4_dspark_state *st, int n_pos) {
    if (n_pos > st->ctx) n_pos = st->ctx;
    int first = st->bound_pos;
    if (n_pos - first > st->slots) first = n_pos - st->slots;
    if (st->followed != first) st->n = st->lo = first;
    st->followed = n_pos;
}

void ds4_dspark_forget(ds4_dspark_state *st) { st->n = st->lo = st->followed = 0; }

int ds4_dspark_context(const ds4_dspark_state *st) { return st->followed; }
void ds4_dspark_rewound(ds4_dspark_state *st, int n_pos) {
    if (n_pos < 0) n_pos = 0;
    if (st->n > n_pos) st->n = n_pos;
    if (st->lo > st->n) st->lo = st->n;
    if (st->followed > n_pos) st->followed = n_pos;
}

static void linear(ds4_dspark *d, const ds4_tensor *W, int64_t mat, int64_t row0, int64_t rows, const float *x,
                   int64_t xstride, int T, float *y) {
    ds4_linear(d->pool, d->act, W, mat, row0, rows, x, xstride, T, y);
}

static void rmsnorm(const ds4_dspark *d, float *x, const float *w, int n) {
    ds4_rmsnorm(x, w, n, d->eps, DS4_RMS_F32, x);
}

/* Interleaved rotation of the last n_rot dims of x at position pos, as
 * the reference computes its tables: f32 angle = inv_freq * pos. */
static void rope(const ds4_dspark *d, float *x, int pos, bool inverse) {
    float *r = x + d->D - d->n_rot;
    for (int i = 0; i < d->n_rot / 2; i++) {
        const float a = d->inv_freq[i] * (float)pos;
        ds4_rope_pair(r + 2 * i, cosf(a), inverse ? -sinf(a) : sinf(a));
    }
}

/* K = V latent of rows x[T][E] at positions pos0.. (roped) into out[T][D]
 * (out NULL: into the context rows of layer l) */
static void latent(ds4_dspark_state *st, int l, const float *x, int T, int pos0, float *out) {
    ds4_dspark *d = st->d;
    const dspark_layer *L = &d->layers[l];
    for (int t0 = 0; t0 < T;) {
        /* a chunk of context rows does not wrap their ring */
        int n = T - t0;
        if (!out && n > st->kv_rows - (pos0 + t0) % st->kv_rows) n = st->kv_rows - (pos0 + t0) % st->kv_rows;
        float *y = out ? out + (size_t)t0 * d->D : kv_row(st, l, pos0 + t0);
        linear(d, &L->kv, 0, 0, d->D, x + (size_t)t0 * d->E, d->E, n, y);
        for (int t = 0; t < n; t++) {
            rmsnorm(d, y + (size_t)t * d->D, L->kv_norm, d->D);
            rope(d, y + (size_t)t * d->D, pos0 + t0 + t, false);
        }
        t0 += n;
    }
}

/* Context rows [n, n + T) from T feature rows x_stride floats apart. */
static void context_rows(ds4_dspark_state *st, const float *feat, int64_t x_stride, int T) {
    ds4_dspark *d = st->d;
    linear(d, &d->fc, 0, 0, d->E, feat, x_stride, T, d->ctxh);
    for (int t = 0; t < T; t++) rmsnorm(d, d->ctxh + (size_t)t * d->E, d->hidden_norm, d->E);
    for (int l = 0; l < d->n_layer; l++) latent(st, l, d->ctxh, T, st->n, NULL);
    st->n += T;
    if (st->lo < st->n - st->kv_rows) st->lo = st->n - st->kv_rows;
}

/* The rows [n, followed) from the ring, in chunks that do not wrap it. */
static void make_context(ds4_dspark_state *st) {
    const int64_t row = (int64_t)st->d->n_tgt * st->d->E;
    while (st->n < st->followed) {
        const int slot = st->n % st->slots, left = st->followed - st->n;
        int T = left < CONTEXT_CHUNK ? left : CONTEXT_CHUNK;
        if (T > st->slots - slot) T = st->slots - slot;
        context_rows(st, st->ring + (size_t)slot * row, row, T);
    }
}

bool ds4_dspark_push(ds4_dspark_state *st, const float *feat) {
    make_context(st);
    if (st->n >= st->ctx) return false;
    context_rows(st, feat, (int64_t)st->d->n_tgt * st->d->E, 1);
    st->followed = st->n;
    return true;
}

/* The first context row a block at n attends to. */
static int context_first(const ds4_dspark *d, int n) { return d->window && n > d->window ? n - d->window : 0; }

/* The attention sublayer of layer l over its normed input rows h[B][E]
 * (block rows at positions n..) into h: q-LoRA queries, the block's own
 * K = V rows, attention over the context rows c0..n-1 and the block rows
 * (one shared K = V head, as the main model's: attn_cpu.h's kernel), the
 * grouped output LoRA. rows and weights: caller scratch of one pointer
 * and H floats per row attended to. */
static void attention(ds4_dspark_state *st, int l, int n, const float **rows, float *weights) {
    ds4_dspark *d = st->d;
    const dspark_layer *L = &d->layers[l];
    const int B = d->B, E = d->E, D = d->D, HD = d->H * d->D, c0 = context_first(d, n);
    linear(d, &L->q_a, 0, 0, d->Q, d->h, E, B, d->qa);
    for (int t = 0; t < B; t++) rmsnorm(d, d->qa + (size_t)t * d->Q, L->q_a_norm, d->Q);
    linear(d, &L->q_b, 0, 0, HD, d->qa, d->Q, B, d->q);
    for (int t = 0; t < B; t++)
        for (int hh = 0; hh < d->H; hh++) {
            float *q = d->q + (size_t)t * HD + (size_t)hh * D;
            rmsnorm(d, q, NULL, D);
            rope(d, q, n + t, false);
        }
    latent(st, l, d->h, B, n, d->kvb);
    const int m = n - c0;
    for (int j = 0; j < m + B; j++) rows[j] = j < m ? kv_row(st, l, c0 + j) : d->kvb + (size_t)(j - m) * D;
    for (int t = 0; t < B; t++) {
        float *o = d->att + (size_t)t * HD;
        ds4_attn_heads(d->q + (size_t)t * HD, d->H, D, rows, m + B, 1.0f / sqrtf((float)D), L->sinks, weights, o);
        for (int hh = 0; hh < d->H; hh++) rope(d, o + (size_t)hh * D, n + t, true);
    }
    /* grouped output LoRA: group g's slice of the heads through its rows,
     * for the whole block at once (its rows read once) */
    const int gin = HD / d->G;
    for (int g = 0; g < d->G; g++) {
        linear(d, &L->out_a, 0, (int64_t)g * d->O, d->O, d->att + (size_t)g * gin, HD, B, d->oa_group);
        for (int t = 0; t < B; t++)
            memcpy(d->oa + (size_t)t * d->G * d->O + (size_t)g * d->O, d->oa_group + (size_t)t * d->O,
                   (size_t)d->O * sizeof(float));
    }
    linear(d, &L->out_b, 0, 0, E, d->oa, (int64_t)d->G * d->O, B, d->h);
}

/* ---- the dense layout's layers ---- */

static void dense_layers(ds4_dspark_state *st, int n, const float **rows, float *weights) {
    ds4_dspark *d = st->d;
    const int B = d->B, E = d->E;
    for (int l = 0; l < d->n_layer; l++) {
        const dspark_layer *L = &d->layers[l];
        for (int t = 0; t < B; t++) ds4_rmsnorm(d->x + (size_t)t * E, L->attn_norm, E, d->eps, DS4_RMS_F32, d->h + (size_t)t * E);
        attention(st, l, n, rows, weights);
        for (size_t i = 0; i < (size_t)B * E; i++) d->x[i] += d->h[i];
        for (int t = 0; t < B; t++) ds4_rmsnorm(d->x + (size_t)t * E, L->ffn_norm, E, d->eps, DS4_RMS_F32, d->h + (size_t)t * E);
        linear(d, &L->gate, 0, 0, d->F, d->h, E, B, d->ff_g);
        linear(d, &L->up, 0, 0, d->F, d->h, E, B, d->ff_u);
        ds4_swiglu(NULL, d->ff_g, d->ff_u, B, d->F, INFINITY);
        linear(d, &L->down, 0, 0, E, d->ff_g, d->F, B, d->h);
        for (size_t i = 0; i < (size_t)B * E; i++) d->x[i] += d->h[i];
    }
    for (int t = 0; t < B; t++) rmsnorm(d, d->x + (size_t)t * E, d->norm, E);
    memcpy(d->hid, d->x, (size_t)B * E * sizeof(float));
}

/* ---- the sidecar's stages: V4 blocks over hyper-connection streams ---- */

/* The rows' streams, each normed whole, through fn (width outputs) into mix. */
static void hc_mix(ds4_dspark *d, const ds4_tensor *fn, int width) {
    const int hcE = d->n_hc * d->E;
    for (int t = 0; t < d->B; t++)
        ds4_rmsnorm(d->x + (size_t)t * hcE, NULL, hcE, d->eps, DS4_RMS_F32, d->flat + (size_t)t * hcE);
    linear(d, fn, 0, 0, width, d->flat, hcE, d->B, d->mix);
}

/* A sublayer's entry: the streams' mix (post and comb into hcw) and the
 * collapsed rows, normed, into h. */
static void hc_enter(ds4_dspark *d, const ds4_tensor *fn, const float *scale, const float *base, const float *norm) {
    const ds4_config *c = &d->main->cfg;
    const int B = d->B, E = d->E, hc = d->n_hc, hcE = hc * E;
    hc_mix(d, fn, d->mixn);
    for (int t = 0; t < B; t++) {
        float pre[64], *post = d->hcw + (size_t)t * d->mixn;
        double sinkhorn[64 * 64];
        ds4_hc_weights(d->mix + (size_t)t * d->mixn, scale, base, hc, c->sinkhorn_iters, c->hc_eps, pre, post,
                       post + hc, sinkhorn);
        ds4_hc_collapse(pre, d->x + (size_t)t * hcE, hc, E, d->h + (size_t)t * E);
        rmsnorm(d, d->h + (size_t)t * E, norm, E);
    }
}

/* A sublayer's exit: its output rows out[B][E] mixed back into the streams. */
static void hc_exit(ds4_dspark *d, const float *out) {
    const int hc = d->n_hc, hcE = hc * d->E;
    for (int t = 0; t < d->B; t++) {
        const float *post = d->hcw + (size_t)t * d->mixn;
        ds4_hc_expand(post, post + hc, d->x + (size_t)t * hcE, out + (size_t)t * d->E, hc, d->E,
                      d->x_next + (size_t)t * hcE);
    }
    float *swap = d->x; d->x = d->x_next; d->x_next = swap;
}

/* The stage's MoE over h into mo: the shared expert, then each row's routed
 * experts one row at a time (a block's rows rarely share an expert). */
static void moe(ds4_dspark *d, const dspark_layer *L) {
    const ds4_config *c = &d->main->cfg;
    const int B = d->B, E = d->E, F = d->F, K = d->K;
    linear(d, &L->router, 0, 0, d->X, d->h, E, B, d->router);
    for (int t = 0; t < B; t++)
        ds4_route_token(d->router + (size_t)t * d->X, d->X, K, NULL, L->router_bias, c->expert_weights_norm,
                        c->expert_weights_scale, d->eids + (size_t)t * K, d->ew + (size_t)t * K);
    linear(d, &L->gate, 0, 0, F, d->h, E, B, d->ff_g);
    linear(d, &L->up, 0, 0, F, d->h, E, B, d->ff_u);
    ds4_swiglu(NULL, d->ff_g, d->ff_u, B, F, d->clamp_shexp);
    linear(d, &L->down, 0, 0, E, d->ff_g, F, B, d->mo);
    for (int t = 0; t < B; t++)
        for (int j = 0; j < K; j++) {
            const int e = d->eids[(size_t)t * K + j];
            const float *in = d->h + (size_t)t * E;
            linear(d, &L->gate_exps, e, 0, F, in, E, 1, d->ff_g);
            linear(d, &L->up_exps, e, 0, F, in, E, 1, d->ff_u);
            ds4_swiglu(NULL, d->ff_g, d->ff_u, 1, F, d->clamp_exp);
            linear(d, &L->down_exps, e, 0, E, d->ff_g, F, 1, d->eo);
            const float w = d->ew[(size_t)t * K + j];
            float *o = d->mo + (size_t)t * E;
            for (int i = 0; i < E; i++) o[i] += w * d->eo[i];
        }
}

static void sidecar_stages(ds4_dspark_state *st, int n, const float **rows, float *weights) {
    ds4_dspark *d = st->d;
    const int B = d->B, E = d->E, hc = d->n_hc, hcE = hc * E;
    /* the block's embeddings on every stream */
    for (int t = 0; t < B; t++)
        for (int k = 1; k < hc; k++)
            memcpy(d->x + (size_t)t * hcE + (size_t)k * E, d->x + (size_t)t * hcE, (size_t)E * sizeof(float));
    for (int l = 0; l < d->n_layer; l++) {
        const dspark_layer *L = &d->layers[l];
        hc_enter(d, &L->hc_attn_fn, L->hc_attn_scale, L->hc_attn_base, L->attn_norm);
        attention(st, l, n, rows, weights);
        hc_exit(d, d->h);
        hc_enter(d, &L->hc_ffn_fn, L->hc_ffn_scale, L->hc_ffn_base, L->ffn_norm);
        moe(d, L);
        hc_exit(d, d->mo);
    }
    /* the last stage's HC merge: the confidence head reads it, the output
     * head its norm */
    hc_mix(d, &d->hc_head_fn, hc);
    for (int t = 0; t < B; t++) {
        float pre[64];
        ds4_hc_head_weights(d->mix + (size_t)t * hc, d->hc_head_scale[0], d->hc_head_base, hc, d->main->cfg.hc_eps, pre);
        ds4_hc_collapse(pre, d->x + (size_t)t * hcE, hc, E, d->hid + (size_t)t * E);
        memcpy(d->h + (size_t)t * E, d->hid + (size_t)t * E, (size_t)E * sizeof(float));
        rmsnorm(d, d->h + (size_t)t * E, d->norm, E);
    }
}

int ds4_dspark_block(ds4_dspark_state *st, int32_t last, float threshold, int max, int32_t *tokens, float *logits,
                     float *confidence) {
    ds4_dspark *d = st->d;
    make_context(st);
    const int B = d->B, E = d->E, V = d->V, n = st->n, hcE = d->sidecar ? d->n_hc * E : E;
    if (st->lo > context_first(d, n)) return 0;   /* its rows are gone: after a restore, or a deep rewind */
    const ds4_tensor *emb = &d->main->token_embd;
    /* the rows a block attends to: the context's (a sidecar's window only) and its own */
    const int seen = n - context_first(d, n) + B;
    const float **rows = malloc((size_t)seen * sizeof *rows);
    float *weights = malloc((size_t)d->H * seen * sizeof(float));
    float *head_logits = malloc((size_t)(B + 1) * V * sizeof(float)), *bias = head_logits ? head_logits + (size_t)B * V : NULL;
    if (!rows || !weights || !head_logits) { free(rows); free(weights); free(head_logits); return 0; }
    for (int t = 0; t < B; t++) {
        const int32_t tok = t ? d->mask_tok : last;
        ds4_dequantize_row(emb->type, (const char *)emb->data + (size_t)tok * emb->row_bytes, d->x + (size_t)t * hcE, E);
    }
    if (d->sidecar) sidecar_stages(st, n, rows, weights);
    else dense_layers(st, n, rows, weights);
    const float *head_in = d->sidecar ? d->h : d->x;
    /* The Markov head makes the rows sequential: row t's bias and confidence
     * read the draft of row t - 1. A row's confidence needs no logits, so a
     * block whose first row misses the threshold reads no output matrix;
     * otherwise the output head runs once for every row that may be kept
     * (one read of the matrix, the rows' products independent of each
     * other), before the schedule decides how many are. */
    const int rows_max = B < max ? B : max;
    int keep = 0;
    double prefix = 1.0;
    int32_t prev = last;
    for (int t = 0; t < rows_max; t++) {
        float *feat = d->w1row;
        memcpy(feat, d->hid + (size_t)t * E, (size_t)E * sizeof(float));
        ds4_dequantize_row(d->w1.type, (const char *)d->w1.data + (size_t)prev * d->w1.row_bytes, feat + E, d->R);
        float c;
        linear(d, &d->conf_w, 0, 0, 1, feat, d->C, 1, &c);
        const float p = ds4_sigmoid(c + d->conf_b);
        if (confidence) confidence[t] = p;
        prefix *= p;
        if (threshold > 0 && prefix < threshold) break;
        if (t == 0) linear(d, &d->main->output, 0, 0, V, head_in, E, rows_max, head_logits);
        float *row_logits = head_logits + (size_t)t * V;
        linear(d, &d->w2, 0, 0, V, feat + E, d->R, 1, bias);
        int best = 0;
        for (int v = 0; v < V; v++) {
            row_logits[v] += bias[v];
            if (row_logits[v] > row_logits[best]) best = v;
        }
        if (logits) memcpy(logits + (size_t)t * V, row_logits, (size_t)V * sizeof(float));
        tokens[t] = best;
        keep++;
        prev = best;
    }
    free(rows);
    free(weights);
    free(head_logits);
    return keep;
}
