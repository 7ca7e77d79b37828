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
#include "models/dsv4/kv.h"
#include "nn/nn_math.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *attn_norm, *q_a_norm, *kv_norm, *sinks, *ffn_norm;
    ds4_tensor q_a, q_b, kv, out_a, out_b, gate, up, down;
} dspark_layer;

struct ds4_dspark {
    ds4_gguf *g;
    const ds4_model *main;
    struct ds4_pool *pool;
    char name[128];
    int E, V, n_layer, B, mask_tok, H, D, n_rot, Q, G, O, F, R, C, n_tgt;
    float eps, rope_base;
    int *targets;
    float *inv_freq;                    /* [n_rot / 2] */
    ds4_tensor fc, w1, w2, conf_w;
    float *hidden_norm, *norm, conf_b;
    dspark_layer *layers;
    /* scratch of one call (the engine is single-threaded) */
    void *act;
    float *x, *h, *qa, *q, *kvb, *att, *oa, *oa_group, *ff_g, *ff_u, *ctxh, *w1row;
};

/* Context rows are made lazily: an evaluation only records that the ring
 * now holds the features of [n, followed); the draft's next block turns
 * them into K = V rows, CONTEXT_CHUNK at a time, so the fc and kv matrices
 * are read once per chunk, not once per position (a session whose drafts
 * back off for k steps then pays one read, not k). A row's values do not
 * depend on the rows beside it (ds4_linear's contract), so a chunk gives
 * the rows one push at a time gives. */
enum { CONTEXT_CHUNK = 32 };

struct ds4_dspark_state {
    ds4_dspark *d;
    int ctx, n;                         /* n: context rows made */
    int followed;                       /* the ring holds the features of [n, followed) */
    float *kv;                          /* [n_layer][ctx][D] roped context K = V rows */
    float *ring;                        /* [slots][n_tgt][E] target features, slot = position mod slots */
    int slots, bound_pos;
};

static float *kv_row(const ds4_dspark_state *st, int l, int pos) {
    return st->kv + ((size_t)l * st->ctx + pos) * st->d->D;
}

void ds4_dspark_free(ds4_dspark *d) {
    if (!d) return;
    if (d->layers)
        for (int l = 0; l < d->n_layer; l++) {
            dspark_layer *L = &d->layers[l];
            free(L->attn_norm); free(L->q_a_norm); free(L->kv_norm); free(L->sinks); free(L->ffn_norm);
        }
    free(d->layers);
    free(d->targets); free(d->inv_freq); free(d->hidden_norm); free(d->norm);
    free(d->act); free(d->x); free(d->h); free(d->qa); free(d->q); free(d->kvb); free(d->att); free(d->oa); free(d->oa_group);
    free(d->ff_g); free(d->ff_u); free(d->ctxh); free(d->w1row);
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

static void bind_layer(ds4_binder *b, ds4_dspark *d, int l) {
    char n[96];
    dspark_layer *L = &d->layers[l];
#define NAME(s) (snprintf(n, sizeof n, DS4_DSPARK_LAYER_PREFIX s, l), n)
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
    L->gate = mat(b, NAME("ffn_gate.weight"), d->E, d->F);
    L->up = mat(b, NAME("ffn_up.weight"), d->E, d->F);
    L->down = mat(b, NAME("ffn_down.weight"), d->F, d->E);
#undef NAME
}

/* The hyperparameters and the target layers; the checks against the main
 * model are what makes a file for another model a one-line refusal. */
static void read_keys(ds4_binder *b, ds4_dspark *d) {
    const ds4_config *mc = &d->main->cfg;
    if (ds4_gguf_arch_is(b->g, DS4_DSPARK_RELEASED_ARCH)) {
        ds4_bind_fail(b, "%s", DS4_DSPARK_RELEASED_REFUSAL);
        return;
    }
    if (!ds4_gguf_arch_is(b->g, DS4_DSPARK_ARCH)) {
        ds4_bind_fail(b, "general.architecture is not \"" DS4_DSPARK_ARCH "\"");
        return;
    }
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
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(b->g, DS4_DSPARK_KEY("target_layers"));
    if (!kv || kv->type != DS4_GGUF_ARRAY || kv->arr_n < 1 || kv->arr_n > 64) {
        ds4_bind_fail(b, "missing key " DS4_DSPARK_KEY("target_layers") " (an array of 1..64 layer ids)");
        return;
    }
    d->n_tgt = (int)kv->arr_n;
    d->targets = malloc((size_t)d->n_tgt * sizeof(int));
    if (!d->targets) { ds4_bind_fail_oom(b, "the DSpark drafter"); return; }
    for (int i = 0; i < d->n_tgt; i++) {
        int64_t v;
        /* the last layer's output is only seen through the output head's
         * merge, never as streams: the ids the reference serves are 0..L-2 */
        if (!ds4_gguf_arr_i64(kv, (uint64_t)i, &v) || v < 0 || v > L - 2 || (i && v <= d->targets[i - 1])) {
            ds4_bind_fail(b, "target_layers must be ascending layer ids in 0..%d", L - 2);
            return;
        }
        d->targets[i] = (int)v;
    }
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
    read_keys(&b, d);
    if (!b.failed) {
        d->layers = calloc((size_t)d->n_layer, sizeof *d->layers);
        if (!d->layers) ds4_bind_fail_oom(&b, "the DSpark drafter");
    }
    if (!b.failed) {
        d->fc = mat(&b, DS4_DSPARK_PREFIX "fc.weight", (uint64_t)d->n_tgt * d->E, d->E);
        d->hidden_norm = vec(&b, DS4_DSPARK_PREFIX "hidden_norm.weight", d->E);
        d->norm = vec(&b, DS4_DSPARK_PREFIX "norm.weight", d->E);
        d->w1 = mat(&b, DS4_DSPARK_PREFIX "markov_w1.weight", d->R, d->V);
        d->w2 = mat(&b, DS4_DSPARK_PREFIX "markov_w2.weight", d->R, d->V);
        /* the confidence head reads the Markov embedding of the previous
         * token too when it was trained with it: its width says which */
        const ds4_gguf_tensor *ct = ds4_gguf_find_tensor(d->g, DS4_DSPARK_PREFIX "confidence.weight");
        d->C = ct && ct->ne[0] == (uint64_t)(d->E + d->R) ? d->E + d->R : d->E;
        d->conf_w = mat(&b, DS4_DSPARK_PREFIX "confidence.weight", d->C, 1);
        float *cb = vec(&b, DS4_DSPARK_PREFIX "confidence.bias", 1);
        if (cb) d->conf_b = cb[0];
        free(cb);
        for (int l = 0; l < d->n_layer && !b.failed; l++) bind_layer(&b, d, l);
    }
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
    const int B = d->B, HD = d->H * d->D;
    d->inv_freq = malloc((size_t)d->n_rot / 2 * sizeof(float));
    for (int i = 0; d->inv_freq && i < d->n_rot / 2; i++)
        d->inv_freq[i] = (float)(1.0 / pow(d->rope_base, (double)(2 * i) / d->n_rot));
    int widest = d->n_tgt * d->E;
    const int widths[] = {d->E, d->Q, HD, d->F, d->C, d->R, d->G * d->O};
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++)
        if (widths[i] > widest) widest = widths[i];
    /* one F32-sized activation row per block or context row covers every weight type */
    const int act_rows = B > CONTEXT_CHUNK ? B : CONTEXT_CHUNK;
    d->act = malloc((size_t)act_rows * (ds4_act_bytes(DS4_TYPE_F32, widest) + 64));
    d->x = malloc((size_t)B * d->E * sizeof(float));
    d->h = malloc((size_t)B * d->E * sizeof(float));
    d->qa = malloc((size_t)B * d->Q * sizeof(float));
    d->q = malloc((size_t)B * HD * sizeof(float));
    d->kvb = malloc((size_t)B * d->D * sizeof(float));
    d->att = malloc((size_t)B * HD * sizeof(float));
    d->oa = malloc((size_t)B * d->G * d->O * sizeof(float));
    d->oa_group = malloc((size_t)B * d->O * sizeof(float));
    d->ff_g = malloc((size_t)B * d->F * sizeof(float));
    d->ff_u = malloc((size_t)B * d->F * sizeof(float));
    d->ctxh = malloc((size_t)CONTEXT_CHUNK * d->E * sizeof(float));
    d->w1row = malloc((size_t)(d->E + d->R) * sizeof(float));
    if (!d->inv_freq || !d->act || !d->x || !d->h || !d->qa || !d->q || !d->kvb || !d->att || !d->oa || !d->oa_group || !d->ff_g ||
        !d->ff_u || !d->ctxh || !d->w1row) {
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
uint64_t ds4_dspark_state_bytes(const ds4_dspark *d, int ctx, int ring_rows) {
    return ((uint64_t)d->n_layer * ctx * d->D + (uint64_t)ring_rows * d->n_tgt * d->E) * sizeof(float);
}

ds4_dspark_state *ds4_dspark_state_new(ds4_dspark *d, int ctx, int ring_rows) {
    ds4_dspark_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->d = d;
    st->ctx = ctx;
    st->slots = ring_rows;
    st->kv = malloc((size_t)d->n_layer * ctx * d->D * sizeof(float));
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

/* Rows [bound_pos, n_pos) were just written: they extend the context when
 * it reaches bound_pos and they all still sit in the ring. */
void ds4_dspark_evaluated(ds4_dspark_state *st, int n_pos) {
    if (st->followed != st->bound_pos || n_pos - st->bound_pos > st->slots) return;
    st->followed = n_pos < st->ctx ? n_pos : st->ctx;
}

void ds4_dspark_forget(ds4_dspark_state *st) { st->n = st->followed = 0; }

int ds4_dspark_context(const ds4_dspark_state *st) { return st->followed; }
void ds4_dspark_rewound(ds4_dspark_state *st, int n_pos) {
    if (n_pos < 0) n_pos = 0;
    if (st->n > n_pos) st->n = n_pos;
    if (st->followed > n_pos) st->followed = n_pos;
}

static void linear(ds4_dspark *d, const ds4_tensor *W, int64_t row0, int64_t rows, const float *x, int64_t xstride,
                   int T, float *y) {
    ds4_linear(d->pool, d->act, W, 0, row0, rows, x, xstride, T, y);
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

/* K = V latent of rows x[T][E] at positions pos0.. (roped) */
static void latent(ds4_dspark *d, const dspark_layer *L, const float *x, int T, int pos0, float *out) {
    linear(d, &L->kv, 0, d->D, x, d->E, T, out);
    for (int t = 0; t < T; t++) {
        ds4_rmsnorm(out + (size_t)t * d->D, L->kv_norm, d->D, d->eps, DS4_RMS_F32, out + (size_t)t * d->D);
        rope(d, out + (size_t)t * d->D, pos0 + t, false);
    }
}

/* Context rows [n, n + T) from T feature rows x_stride floats apart. */
static void context_rows(ds4_dspark_state *st, const float *feat, int64_t x_stride, int T) {
    ds4_dspark *d = st->d;
    linear(d, &d->fc, 0, d->E, feat, x_stride, T, d->ctxh);
    for (int t = 0; t < T; t++)
        ds4_rmsnorm(d->ctxh + (size_t)t * d->E, d->hidden_norm, d->E, d->eps, DS4_RMS_F32, d->ctxh + (size_t)t * d->E);
    for (int l = 0; l < d->n_layer; l++) latent(d, &d->layers[l], d->ctxh, T, st->n, kv_row(st, l, st->n));
    st->n += T;
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

/* The block rows' attention over the n context rows and the B block rows
 * (one shared K = V head, as the main model's: attn_cpu.h's kernel). rows
 * and weights: caller scratch of n + B pointers and H x (n + B) floats. */
static void attention(ds4_dspark_state *st, const dspark_layer *L, int n, const float **rows, float *weights) {
    ds4_dspark *d = st->d;
    const int B = d->B, D = d->D, HD = d->H * d->D, layer = (int)(L - d->layers);
    for (int j = 0; j < n + B; j++) rows[j] = j < n ? kv_row(st, layer, j) : d->kvb + (size_t)(j - n) * D;
    for (int t = 0; t < B; t++) {
        float *o = d->att + (size_t)t * HD;
        ds4_attn_heads(d->q + (size_t)t * HD, d->H, D, rows, n + B, 1.0f / sqrtf((float)D), L->sinks, weights, o);
        for (int hh = 0; hh < d->H; hh++) rope(d, o + (size_t)hh * D, n + t, true);
    }
}

int ds4_dspark_block(ds4_dspark_state *st, int32_t last, float threshold, int max, int32_t *tokens, float *logits,
                     float *confidence) {
    ds4_dspark *d = st->d;
    make_context(st);
    const int B = d->B, E = d->E, V = d->V, D = d->D, HD = d->H * d->D, n = st->n;
    const ds4_tensor *emb = &d->main->token_embd;
    const float **rows = malloc((size_t)(n + B) * sizeof *rows);
    float *weights = malloc((size_t)d->H * (n + B) * sizeof(float));
    float *row_logits = malloc((size_t)2 * V * sizeof(float)), *bias = row_logits + V;
    if (!rows || !weights || !row_logits) { free(rows); free(weights); free(row_logits); return 0; }
    for (int t = 0; t < B; t++) {
        const int32_t tok = t ? d->mask_tok : last;
        ds4_dequantize_row(emb->type, (const char *)emb->data + (size_t)tok * emb->row_bytes, d->x + (size_t)t * E, E);
    }
    for (int l = 0; l < d->n_layer; l++) {
        const dspark_layer *L = &d->layers[l];
        for (int t = 0; t < B; t++) ds4_rmsnorm(d->x + (size_t)t * E, L->attn_norm, E, d->eps, DS4_RMS_F32, d->h + (size_t)t * E);
        linear(d, &L->q_a, 0, d->Q, d->h, E, B, d->qa);
        for (int t = 0; t < B; t++) ds4_rmsnorm(d->qa + (size_t)t * d->Q, L->q_a_norm, d->Q, d->eps, DS4_RMS_F32, d->qa + (size_t)t * d->Q);
        linear(d, &L->q_b, 0, HD, d->qa, d->Q, B, d->q);
        for (int t = 0; t < B; t++)
            for (int hh = 0; hh < d->H; hh++) {
                float *q = d->q + (size_t)t * HD + (size_t)hh * D;
                ds4_rmsnorm(q, NULL, D, d->eps, DS4_RMS_F32, q);
                rope(d, q, n + t, false);
            }
        latent(d, L, d->h, B, n, d->kvb);
        attention(st, L, n, rows, weights);
        /* grouped output LoRA: group g's slice of the heads through its
         * rows, for the whole block at once (its rows read once) */
        const int gin = HD / d->G;
        for (int g = 0; g < d->G; g++) {
            linear(d, &L->out_a, (int64_t)g * d->O, d->O, d->att + (size_t)g * gin, HD, B, d->oa_group);
            for (int t = 0; t < B; t++)
                memcpy(d->oa + (size_t)t * d->G * d->O + (size_t)g * d->O, d->oa_group + (size_t)t * d->O,
                       (size_t)d->O * sizeof(float));
        }
        linear(d, &L->out_b, 0, E, d->oa, (int64_t)d->G * d->O, B, d->h);
        for (size_t i = 0; i < (size_t)B * E; i++) d->x[i] += d->h[i];
        for (int t = 0; t < B; t++) ds4_rmsnorm(d->x + (size_t)t * E, L->ffn_norm, E, d->eps, DS4_RMS_F32, d->h + (size_t)t * E);
        linear(d, &L->gate, 0, d->F, d->h, E, B, d->ff_g);
        linear(d, &L->up, 0, d->F, d->h, E, B, d->ff_u);
        ds4_swiglu(NULL, d->ff_g, d->ff_u, B, d->F, INFINITY);
        linear(d, &L->down, 0, E, d->ff_g, d->F, B, d->h);
        for (size_t i = 0; i < (size_t)B * E; i++) d->x[i] += d->h[i];
    }
    for (int t = 0; t < B; t++) ds4_rmsnorm(d->x + (size_t)t * E, d->norm, E, d->eps, DS4_RMS_F32, d->x + (size_t)t * E);
    /* The Markov head makes the rows sequential: row t's bias and confidence
     * read the draft of row t - 1. A row's confidence needs no logits, so the
     * output head runs only for rows the schedule keeps. */
    int keep = 0;
    double prefix = 1.0;
    int32_t prev = last;
    for (int t = 0; t < B && t < max; t++) {
        float *feat = d->w1row;
        memcpy(feat, d->x + (size_t)t * E, (size_t)E * sizeof(float));
        ds4_dequantize_row(d->w1.type, (const char *)d->w1.data + (size_t)prev * d->w1.row_bytes, feat + E, d->R);
        float c;
        linear(d, &d->conf_w, 0, 1, feat, d->C, 1, &c);
        const float p = ds4_sigmoid(c + d->conf_b);
        if (confidence) confidence[t] = p;
        prefix *= p;
        if (threshold > 0 && prefix < threshold) break;
        linear(d, &d->main->output, 0, V, d->x + (size_t)t * E, E, 1, row_logits);
        linear(d, &d->w2, 0, V, feat + E, d->R, 1, bias);
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
    free(row_logits);
    return keep;
}
