/* forward_cpu.c -- the DS4 forward pass on the CPU: layer-major batches over
 * a ds4_kv session state (sections 6-8 of the model sheet). */
#include "forward_cpu.h"
#include "forward_cpu_impl.h"
#include "forward_shared.h"
#include "kernels_cpu.h"
#include "kv.h"
#include "quant.h"
#include "threadpool.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { ROPE_MAIN = 0, ROPE_COMPRESS = 1 };

typedef struct {
    float *scores;      /* attention logits over raw + compressed rows */
    float *iscore;      /* indexer scores of visible rows */
} thread_scratch;

typedef struct cpu {
    ds4_backend base;
    const ds4_model *m;
    const ds4_config *c;
    ds4_pool *pool;
    int n_threads;
    bool numerics;
    float *inv_freq[2];             /* [n_rot/2] per RoPE kind */
    float *comp_cs;                 /* RoPE table of the row being compressed */
    int mixn;                       /* HC mix rows: (2 + n_hc) * n_hc */

    /* batch scratch, grown to `cap` tokens */
    int cap;
    float *S, *S2, *flat, *mix, *hcw, *a, *x, *cq, *q, *kvr, *ck, *cz, *ik, *iz, *qi, *om;
    float *o, *z, *zg, *y, *rl, *ew, *xe, *ge, *ue, *oe, *rope_cs;
    int *sel, *nsel, *eidx, *elist;
    void *act;                      /* activations converted for the weight type */

    /* per-thread scratch, grown to the largest state seen */
    int rows_cap;
    thread_scratch *ts;
} cpu;

/* one eval: which layer and which tokens */
typedef struct {
    cpu *f;
    ds4_kv *kv;
    const int32_t *toks;
    int T, p0, l;
    const float *hc_scale, *hc_base;   /* the HC sublayer being applied */
} batch;

/* ---------------------------------------------------------------- helpers */

typedef void (*tok_fn)(batch *b, int task, int thread);
typedef struct { batch *b; tok_fn fn; } par_ctx;

static void par_task(void *ctx, int task, int n_tasks, int thread) {
    par_ctx *p = ctx;
    p->fn(p->b, task, thread);
}

static void par(batch *b, int n, tok_fn fn) {
    par_ctx p = {b, fn};
    ds4_pool_run(b->f->pool, par_task, &p, n);
}

/* y[T x rows] = W[rows starting at row0 of matrix e] . x[t] for T inputs of W->ne[0] floats. */
static void linear(cpu *f, const ds4_tensor *W, int64_t e, int64_t row0, int64_t rows, const float *x,
                   int64_t xstride, int T, float *y) {
    const int64_t n = W->ne[0];
    const size_t ab = ds4_act_bytes(W->type, n);
    for (int t = 0; t < T; t++) ds4_quantize_act(W->type, x + (size_t)t * xstride, (char *)f->act + (size_t)t * ab, n);
    const char *w = (const char *)W->data + ((size_t)e * (size_t)W->ne[1] + (size_t)row0) * W->row_bytes;
    if (T == 1) ds4_matvec(f->pool, W->type, w, rows, n, f->act, y);
    else ds4_matmul(f->pool, W->type, w, rows, n, f->act, T, y);
}

static void rmsnorm(float *x, int n, const float *w, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) x[i] = w ? w[i] * (x[i] * r) : x[i] * r;
}

/* f32 dot product through the SIMD kernels (the F32 "activation" is f32). */
static float dotf(const float *a, const float *b, int n) { return ds4_vec_dot(DS4_TYPE_F32, a, b, n); }

static void axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* Rotates the last n_rot dims of x (interleaved pairs) with a cos/sin table. */
static void rope_apply(float *x, int dim, int n_rot, const float *cs, bool inverse) {
    float *r = x + dim - n_rot;
    for (int i = 0; i < n_rot / 2; i++) {
        float c = cs[2 * i], s = inverse ? -cs[2 * i + 1] : cs[2 * i + 1];
        float a = r[2 * i], b = r[2 * i + 1];
        r[2 * i] = a * c - b * s;
        r[2 * i + 1] = b * c + a * s;
    }
}

static void rope_table(const cpu *f, int kind, int64_t pos, float *cs) {
    for (int i = 0; i < f->c->n_rot / 2; i++) {
        float ang = (float)pos * f->inv_freq[kind][i];   /* f32 angle, as the reference */
        cs[2 * i] = (float)cos(ang);
        cs[2 * i + 1] = (float)sin(ang);
    }
}

static int rope_kind(const ds4_config *c, int l) { return c->compress_ratio[l] ? ROPE_COMPRESS : ROPE_MAIN; }

static const float *rope_cs(const batch *b, int t) {
    const cpu *f = b->f;
    return f->rope_cs + ((size_t)t * 2 + rope_kind(f->c, b->l)) * f->c->n_rot;
}

/* ------------------------------------------------------- hyper-connections */

static void hc_norm_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const int n = f->c->n_hc * f->c->n_embd;
    memcpy(f->flat + (size_t)t * n, f->S + (size_t)t * n, (size_t)n * sizeof(float));
    rmsnorm(f->flat + (size_t)t * n, n, NULL, f->c->rms_eps);
}

/* pre/post/comb from the mix (sheet 6.2), then the collapsed input a. */
static void hc_pre_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const int hc = c->n_hc, E = c->n_embd;
    float *post = f->hcw + (size_t)t * f->mixn, *comb = post + hc;
    float pre[64];
    double C[64 * 64];
    ds4_hc_weights(f->mix + (size_t)t * f->mixn, b->hc_scale, b->hc_base, hc, c->sinkhorn_iters, c->hc_eps, pre, post,
                   comb, C);
    const float *S = f->S + (size_t)t * hc * E;
    float *a = f->a + (size_t)t * E;
    for (int d = 0; d < E; d++) {
        float acc = 0;
        for (int s = 0; s < hc; s++) acc += pre[s] * S[(size_t)s * E + d];
        a[d] = acc;
    }
}

/* S'[k] = post_k * y + sum_j C[j][k] * S[j], into S2 (swapped afterwards). */
static void hc_post_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const int hc = f->c->n_hc, E = f->c->n_embd;
    const float *post = f->hcw + (size_t)t * f->mixn, *comb = post + hc;
    const float *S = f->S + (size_t)t * hc * E, *y = f->y + (size_t)t * E;
    float *o = f->S2 + (size_t)t * hc * E;
    for (int k = 0; k < hc; k++)
        for (int d = 0; d < E; d++) {
            float acc = post[k] * y[d];
            for (int j = 0; j < hc; j++) acc += comb[j * hc + k] * S[(size_t)j * E + d];
            o[(size_t)k * E + d] = acc;
        }
}

/* a = HC-pre(S) for every token of the batch, then x = RMSNorm(a; norm). */
static void hc_pre(batch *b, const ds4_tensor *fn, const float *scale, const float *base, const float *norm) {
    cpu *f = b->f;
    const int n = f->c->n_hc * f->c->n_embd;
    par(b, b->T, hc_norm_task);
    linear(f, fn, 0, 0, f->mixn, f->flat, n, b->T, f->mix);
    b->hc_scale = scale;
    b->hc_base = base;
    par(b, b->T, hc_pre_task);
    for (int t = 0; t < b->T; t++) {
        float *x = f->x + (size_t)t * f->c->n_embd;
        memcpy(x, f->a + (size_t)t * f->c->n_embd, (size_t)f->c->n_embd * sizeof(float));
        rmsnorm(x, f->c->n_embd, norm, f->c->rms_eps);
    }
}

static void hc_post(batch *b) {
    cpu *f = b->f;
    par(b, b->T, hc_post_task);
    float *t = f->S; f->S = f->S2; f->S2 = t;
}

/* ------------------------------------------------------------- attention */

static void q_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const int D = c->head_dim;
    const float *cs = rope_cs(b, t);
    for (int h = 0; h < c->n_head; h++) {
        float *q = f->q + ((size_t)t * c->n_head + h) * D;
        rmsnorm(q, D, NULL, c->rms_eps);
        rope_apply(q, D, c->n_rot, cs, false);
    }
    float *kv = f->kvr + (size_t)t * D;
    rmsnorm(kv, D, b->f->m->layers[b->l].kv_norm, c->rms_eps);
    rope_apply(kv, D, c->n_rot, cs, false);
    if (f->numerics) {
        ds4_fp8_e4m3_roundtrip(kv, D - c->n_rot);
        fwd_f16_round(kv, D);
    }
}

/* Pools window w of one compressor from its frontier ring (sheet 6.5). */
static void pool_window(const float *fk, const float *fz, int f_cap, int coff, int d, int ratio, int64_t w,
                        float *out) {
    for (int j = 0; j < d; j++) out[j] = ds4_pool_lane(fk, fz, f_cap, coff, d, ratio, w, j);
}

/* Feeds the batch's projected K/Z into layer l's compressor(s) in token order,
 * emitting a row whenever a window completes. */
static void compress_batch(batch *b) {
    cpu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    ds4_kv_layer *L = &b->kv->L[b->l];
    const int D = c->head_dim, DI = c->idx_head_dim, r = L->ratio, Wc = L->coff * D, Wi = 2 * DI;
    float *cs = f->comp_cs;
    for (int t = 0; t < b->T; t++) {
        const int64_t p = b->p0 + t;
        const size_t slot = (size_t)(p % L->f_cap);
        const float *ape = W->comp_ape + (size_t)(p % r) * Wc;
        for (int i = 0; i < Wc; i++) {
            L->fk[slot * Wc + i] = f->ck[(size_t)t * Wc + i];
            L->fz[slot * Wc + i] = f->cz[(size_t)t * Wc + i] + ape[i];
        }
        if (L->idx) {
            const float *iape = W->idx_ape + (size_t)(p % r) * Wi;
            for (int i = 0; i < Wi; i++) {
                L->ik[slot * Wi + i] = f->ik[(size_t)t * Wi + i];
                L->iz[slot * Wi + i] = f->iz[(size_t)t * Wi + i] + iape[i];
            }
        }
        if ((p + 1) % r) continue;
        const int64_t w = (p + 1) / r - 1;
        rope_table(f, ROPE_COMPRESS, w * r, cs);
        float *row = L->comp + (size_t)w * D;
        pool_window(L->fk, L->fz, L->f_cap, L->coff, D, r, w, row);
        rmsnorm(row, D, W->comp_norm, c->rms_eps);
        rope_apply(row, D, c->n_rot, cs, false);
        if (f->numerics) {
            ds4_fp8_e4m3_roundtrip(row, D - c->n_rot);
            fwd_f16_round(row, D);
        }
        if (L->idx) {
            float *ir = L->idx + (size_t)w * DI;
            pool_window(L->ik, L->iz, L->f_cap, 2, DI, r, w, ir);
            rmsnorm(ir, DI, W->idx_norm, c->rms_eps);
            rope_apply(ir, DI, c->n_rot, cs, false);
            if (f->numerics) {
                ds4_hadamard(ir, DI);
                ds4_fp4_e2m1_roundtrip(ir, DI);
                fwd_f16_round(ir, DI);
            }
        }
    }
}

static void idx_q_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const int DI = c->idx_head_dim;
    const float *cs = rope_cs(b, t);
    for (int h = 0; h < c->n_idx_head; h++) {
        float *q = f->qi + ((size_t)t * c->n_idx_head + h) * DI;
        rope_apply(q, DI, c->n_rot, cs, false);
        if (f->numerics) {
            ds4_hadamard(q, DI);
            ds4_fp4_e2m1_roundtrip(q, DI);
        }
    }
}

/* I_t(w) = sum_h w_h * relu(q_h . k_w) for rows [w0, w1) (sheet 6.6). */
static void idx_score(const batch *b, int t, int w0, int w1, float *out) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const int DI = c->idx_head_dim, HI = c->n_idx_head;
    const float *rows = b->kv->L[b->l].idx;
    const float *q = f->qi + (size_t)t * HI * DI, *om = f->om + (size_t)t * HI;
    const float ks = 1.0f / sqrtf((float)DI), ws = 1.0f / sqrtf((float)HI);
    for (int w = w0; w < w1; w++) {
        const float *k = rows + (size_t)w * DI;
        float acc = 0;
        for (int h = 0; h < HI; h++) {
            float dot = dotf(k, q + (size_t)h * DI, DI);
            if (dot > 0) acc += dot * ks * (om[h] * ws);
        }
        out[w] = acc;
    }
}

static int n_visible(const batch *b, int t) {
    return (int)((b->p0 + t + 1) / b->kv->L[b->l].ratio);
}

/* Whole-token indexer selection (prefill: one task per token). */
static void idx_select_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const int nv = n_visible(b, t), k = f->c->idx_topk;
    int *sel = f->sel + (size_t)t * k;
    if (nv <= k) {
        for (int w = 0; w < nv; w++) sel[w] = w;
        f->nsel[t] = nv;
        return;
    }
    float *sc = f->ts[thread].iscore;
    idx_score(b, t, 0, nv, sc);
    f->nsel[t] = fwd_topk(sc, nv, k, sel);
}

/* Decode: the single token's scores split into row blocks across threads. */
enum { IDX_BLOCK = 256 };
static void idx_block_task(batch *b, int task, int thread) {
    const int nv = n_visible(b, 0);
    const int w0 = task * IDX_BLOCK, w1 = w0 + IDX_BLOCK < nv ? w0 + IDX_BLOCK : nv;
    idx_score(b, 0, w0, w1, b->f->ts[0].iscore);
}

static void indexer(batch *b) {
    cpu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    if (n_visible(b, b->T - 1) > c->idx_topk) {
        linear(f, &W->idx_q_b, 0, 0, (int64_t)c->n_idx_head * c->idx_head_dim, f->cq, c->q_lora, b->T, f->qi);
        par(b, b->T, idx_q_task);
        linear(f, &W->idx_proj, 0, 0, c->n_idx_head, f->x, c->n_embd, b->T, f->om);
    }
    if (b->T == 1 && n_visible(b, 0) > c->idx_topk) {
        const int nv = n_visible(b, 0);
        par(b, (nv + IDX_BLOCK - 1) / IDX_BLOCK, idx_block_task);
        f->nsel[0] = fwd_topk(f->ts[0].iscore, nv, c->idx_topk, f->sel);
    } else {
        par(b, b->T, idx_select_task);
    }
}

/* Candidate row i of a query: raw rows first (positions lo..p, from the batch
 * or, before the batch, from the ring), then the usable compressed rows. */
static const float *attn_row(const batch *b, const ds4_kv_layer *L, int64_t lo, int n_raw, const int *sel, int i) {
    const int D = b->f->c->head_dim;
    if (i >= n_raw) return L->comp + (size_t)(sel ? sel[i - n_raw] : i - n_raw) * D;
    const int64_t pos = lo + i;
    if (pos >= b->p0) return b->f->kvr + (size_t)(pos - b->p0) * D;
    return L->raw + (size_t)(pos % b->kv->raw_cap) * D;
}

/* One head of one token: softmax with sink over raw + usable compressed rows. */
static void attn_task(batch *b, int task, int thread) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const int H = c->n_head, D = c->head_dim, t = task / H, h = task % H;
    const ds4_kv_layer *L = &b->kv->L[b->l];
    const int64_t p = b->p0 + t, lo = p - c->window + 1 > 0 ? p - c->window + 1 : 0;
    const float *q = f->q + ((size_t)t * H + h) * D;
    float *sc = f->ts[thread].scores;
    const float scale = 1.0f / sqrtf((float)D), sink = f->m->layers[b->l].sinks[h];
    const int n_raw = (int)(p - lo + 1);
    int n_comp = 0;
    const int *sel = NULL;
    if (L->ratio) {
        n_comp = n_visible(b, t);
        if (L->idx) { sel = f->sel + (size_t)t * c->idx_topk; n_comp = f->nsel[t]; }
    }
    const int n = n_raw + n_comp;
    float mx = sink;
    for (int i = 0; i < n; i++) {
        sc[i] = dotf(attn_row(b, L, lo, n_raw, sel, i), q, D) * scale;
        mx = fmaxf(mx, sc[i]);
    }
    double den = exp((double)sink - mx);
    for (int i = 0; i < n; i++) { sc[i] = (float)exp((double)sc[i] - mx); den += sc[i]; }
    float *o = f->o + ((size_t)t * H + h) * D;
    memset(o, 0, (size_t)D * sizeof(float));
    for (int i = 0; i < n; i++) axpy(o, (float)(sc[i] / den), attn_row(b, L, lo, n_raw, sel, i), D);
    rope_apply(o, D, c->n_rot, rope_cs(b, t), true);
}

static void attention(batch *b) {
    cpu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    ds4_kv_layer *L = &b->kv->L[b->l];
    const int T = b->T, E = c->n_embd, D = c->head_dim, HD = c->n_head * D;

    hc_pre(b, &W->hc_attn_fn, W->hc_attn_scale, W->hc_attn_base, W->attn_norm);
    linear(f, &W->q_a, 0, 0, c->q_lora, f->x, E, T, f->cq);
    for (int t = 0; t < T; t++) rmsnorm(f->cq + (size_t)t * c->q_lora, c->q_lora, W->q_a_norm, c->rms_eps);
    linear(f, &W->q_b, 0, 0, HD, f->cq, c->q_lora, T, f->q);
    linear(f, &W->kv, 0, 0, D, f->x, E, T, f->kvr);
    par(b, T, q_task);

    if (L->ratio) {
        linear(f, &W->comp_kv, 0, 0, (int64_t)L->coff * D, f->x, E, T, f->ck);
        linear(f, &W->comp_gate, 0, 0, (int64_t)L->coff * D, f->x, E, T, f->cz);
        if (L->idx) {
            linear(f, &W->idx_kv, 0, 0, 2 * c->idx_head_dim, f->x, E, T, f->ik);
            linear(f, &W->idx_gate, 0, 0, 2 * c->idx_head_dim, f->x, E, T, f->iz);
        }
        compress_batch(b);
        if (L->idx) indexer(b);
    }
    par(b, T * c->n_head, attn_task);

    /* the batch's rows become the ring only now: attention above read the
     * previous ring contents for positions before the batch */
    for (int t = T > b->kv->raw_cap ? T - b->kv->raw_cap : 0; t < T; t++)
        memcpy(L->raw + (size_t)((b->p0 + t) % b->kv->raw_cap) * D, f->kvr + (size_t)t * D, (size_t)D * sizeof(float));

    /* grouped output projection: group g = heads g*hpg ... */
    const int G = c->o_groups, OL = c->o_lora, gin = HD / G;
    for (int g = 0; g < G; g++) {
        linear(f, &W->out_a, 0, (int64_t)g * OL, OL, f->o + (size_t)g * gin, HD, T, f->zg);
        for (int t = 0; t < T; t++)
            memcpy(f->z + ((size_t)t * G + g) * OL, f->zg + (size_t)t * OL, (size_t)OL * sizeof(float));
    }
    linear(f, &W->out_b, 0, 0, E, f->z, (int64_t)G * OL, T, f->y);
    hc_post(b);
}

/* ------------------------------------------------------------------- MoE */

static void swiglu(float *g, const float *u, int n, float limit) {
    for (int i = 0; i < n; i++) {
        float gv = fminf(g[i], limit), uv = fminf(fmaxf(u[i], -limit), limit);
        g[i] = gv / (1.0f + expf(-gv)) * uv;
    }
}

static void route_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    const int k = c->n_expert_used;
    ds4_route_token(f->rl + (size_t)t * c->n_expert, c->n_expert, k,
                    W->tid2eid ? W->tid2eid + (size_t)b->toks[t] * k : NULL, W->exp_probs_b, c->expert_weights_norm,
                    c->expert_weights_scale, f->eidx + (size_t)t * k, f->ew + (size_t)t * k);
}

/* Expert e over the n gathered rows of xe; adds weighted outputs into y. */
static void expert(batch *b, int e, int n) {
    cpu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    const int E = c->n_embd, F = c->n_ff_exp, k = c->n_expert_used;
    linear(f, &W->gate_exps, e, 0, F, f->xe, E, n, f->ge);
    linear(f, &W->up_exps, e, 0, F, f->xe, E, n, f->ue);
    for (int i = 0; i < n; i++) swiglu(f->ge + (size_t)i * F, f->ue + (size_t)i * F, F, c->clamp_exp[b->l]);
    linear(f, &W->down_exps, e, 0, E, f->ge, F, n, f->oe);
    for (int i = 0; i < n; i++) {
        axpy(f->y + (size_t)(f->elist[i] / k) * E, f->ew[f->elist[i]], f->oe + (size_t)i * E, E);
    }
}

static void ffn(batch *b) {
    cpu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    const int T = b->T, E = c->n_embd, F = c->n_ff_exp, k = c->n_expert_used;

    hc_pre(b, &W->hc_ffn_fn, W->hc_ffn_scale, W->hc_ffn_base, W->ffn_norm);
    linear(f, &W->gate_inp, 0, 0, c->n_expert, f->x, E, T, f->rl);
    par(b, T, route_task);

    /* shared expert over the whole batch, into y */
    linear(f, &W->gate_shexp, 0, 0, F, f->x, E, T, f->ge);
    linear(f, &W->up_shexp, 0, 0, F, f->x, E, T, f->ue);
    for (int t = 0; t < T; t++) swiglu(f->ge + (size_t)t * F, f->ue + (size_t)t * F, F, c->clamp_shexp[b->l]);
    linear(f, &W->down_shexp, 0, 0, E, f->ge, F, T, f->y);

    /* routed experts: tokens grouped per expert so each expert is one matmul
     * (flushed every T rows, since a hash row may name an expert twice) */
    for (int e = 0; e < c->n_expert; e++) {
        int n = 0;
        for (int j = 0; j < T * k; j++) {
            if (f->eidx[j] != e) continue;
            f->elist[n] = j;
            memcpy(f->xe + (size_t)n * E, f->x + (size_t)(j / k) * E, (size_t)E * sizeof(float));
            if (++n == T) { expert(b, e, n); n = 0; }
        }
        if (n) expert(b, e, n);
    }
    hc_post(b);
}

/* ---------------------------------------------------------------- driver */

#define GROW(ptr, n) do { free(ptr); (ptr) = malloc((size_t)(n) * sizeof(*(ptr))); if (!(ptr)) return false; } while (0)

static bool grow_batch(cpu *f, int T) {
    if (T <= f->cap) return true;
    const ds4_config *c = f->c;
    const size_t E = c->n_embd, hcE = (size_t)c->n_hc * E, D = c->head_dim, HD = (size_t)c->n_head * D;
    const size_t DI = c->idx_head_dim, F = c->n_ff_exp, k = c->n_expert_used;
    GROW(f->S, T * hcE); GROW(f->S2, T * hcE); GROW(f->flat, T * hcE);
    GROW(f->mix, T * f->mixn); GROW(f->hcw, T * f->mixn);
    GROW(f->a, T * E); GROW(f->x, T * E); GROW(f->y, T * E);
    GROW(f->cq, T * c->q_lora);
    GROW(f->q, T * HD); GROW(f->o, T * HD); GROW(f->kvr, T * D);
    GROW(f->ck, T * 2 * D); GROW(f->cz, T * 2 * D); GROW(f->ik, T * 2 * DI); GROW(f->iz, T * 2 * DI);
    GROW(f->qi, T * c->n_idx_head * DI); GROW(f->om, T * c->n_idx_head);
    GROW(f->z, T * c->o_groups * c->o_lora); GROW(f->zg, T * c->o_lora);
    GROW(f->rl, T * c->n_expert); GROW(f->ew, T * k); GROW(f->eidx, T * k);
    GROW(f->elist, T); GROW(f->xe, T * E);
    GROW(f->ge, T * F); GROW(f->ue, T * F); GROW(f->oe, T * E);
    GROW(f->sel, T * c->idx_topk); GROW(f->nsel, T);
    GROW(f->rope_cs, T * 2 * c->n_rot);
    size_t widest = hcE;
    size_t ins[] = {HD, F, (size_t)c->o_groups * c->o_lora, (size_t)c->q_lora, E};
    for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++) if (ins[i] > widest) widest = ins[i];
    /* f32 activations are the widest conversion of any weight type */
    free(f->act);
    f->act = malloc((size_t)T * ds4_act_bytes(DS4_TYPE_F32, (int64_t)widest));
    if (!f->act) return false;
    f->cap = T;
    return true;
}

/* Per-thread buffers sized for the rows a state of this ctx can expose. */
static bool grow_rows(cpu *f, const ds4_kv *kv) {
    int rows = kv->ctx + 8;
    if (rows <= f->rows_cap) return true;
    for (int i = 0; i < f->n_threads; i++) {
        thread_scratch *s = &f->ts[i];
        GROW(s->scores, (size_t)f->c->window + rows);
        GROW(s->iscore, rows);
    }
    f->rows_cap = rows;
    return true;
}

/* Output head (sheet 6.10) for tokens [t0, t0+n) into logits (n x vocab). */
static void head(batch *b, int t0, int n, float *logits) {
    cpu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_model *m = f->m;
    const int hc = c->n_hc, E = c->n_embd;
    const size_t hcE = (size_t)hc * E;
    for (int i = 0; i < n; i++) {
        memcpy(f->flat + i * hcE, f->S + (size_t)(t0 + i) * hcE, hcE * sizeof(float));
        rmsnorm(f->flat + i * hcE, (int)hcE, NULL, c->rms_eps);
    }
    linear(f, &m->output_hc_fn, 0, 0, hc, f->flat, (int64_t)hcE, n, f->mix);
    for (int i = 0; i < n; i++) {
        const float *S = f->S + (size_t)(t0 + i) * hcE;
        float *h = f->x + (size_t)i * E;
        memset(h, 0, (size_t)E * sizeof(float));
        for (int s = 0; s < hc; s++) {
            float w = ds4_sigmoid(f->mix[(size_t)i * hc + s] * m->output_hc_scale[0] + m->output_hc_base[s]) + c->hc_eps;
            for (int d = 0; d < E; d++) h[d] += w * S[(size_t)s * E + d];
        }
        rmsnorm(h, E, m->output_norm, c->rms_eps);
    }
    linear(f, &m->output, 0, 0, c->n_vocab, f->x, E, n, logits);
}

static int cpu_eval(ds4_backend *be, ds4_kv *kv, const int32_t *toks, int n, float *logits, bool all_logits,
                    char *err, size_t errlen) {
    cpu *f = (cpu *)be;
    const ds4_config *c = f->c;
    if (n <= 0) return 0;
    for (int i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= c->n_vocab) {
            snprintf(err, errlen, "token id %d out of range [0, %d)", toks[i], c->n_vocab);
            return -1;
        }
    if (!grow_batch(f, n) || !grow_rows(f, kv)) {
        snprintf(err, errlen, "out of memory for a batch of %d tokens", n);
        return -1;
    }
    batch b = {f, kv, toks, n, kv->n_pos, 0, NULL, NULL};
    const int E = c->n_embd, hc = c->n_hc;
    for (int t = 0; t < n; t++) {
        float *S = f->S + (size_t)t * hc * E;
        ds4_dequantize_row(f->m->token_embd.type,
                           (const char *)f->m->token_embd.data + (size_t)toks[t] * f->m->token_embd.row_bytes, S, E);
        for (int s = 1; s < hc; s++) memcpy(S + (size_t)s * E, S, (size_t)E * sizeof(float));
        for (int kind = 0; kind < 2; kind++)
            rope_table(f, kind, b.p0 + t, f->rope_cs + ((size_t)t * 2 + kind) * c->n_rot);
    }
    for (b.l = 0; b.l < c->n_layer; b.l++) {
        attention(&b);
        ffn(&b);
    }
    kv->n_pos += n;
    if (all_logits) head(&b, 0, n, logits);
    else head(&b, n - 1, 1, logits);
    return 0;
}

/* --------------------------------------------------------------- creation */

static void cpu_free(ds4_backend *be) {
    cpu *f = (cpu *)be;
    if (!f) return;
    ds4_pool_free(f->pool);
    free(f->inv_freq[0]); free(f->inv_freq[1]);
    float *bufs[] = {f->S, f->S2, f->flat, f->mix, f->hcw, f->a, f->x, f->cq, f->q, f->kvr, f->ck, f->cz,
                     f->ik, f->iz, f->qi, f->om, f->o, f->z, f->zg, f->y, f->rl, f->ew, f->xe, f->ge, f->ue,
                     f->oe, f->rope_cs, f->comp_cs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(f->sel); free(f->nsel); free(f->eidx); free(f->elist); free(f->act);
    for (int i = 0; f->ts && i < f->n_threads; i++) { free(f->ts[i].scores); free(f->ts[i].iscore); }
    free(f->ts);
    free(f);
}

/* Inverse frequencies as the reference computes them in f32: plain RoPE, or
 * YaRN (ramp between the beta_fast/beta_slow correction dims, no magnitude
 * scaling) for compressed layers (sheet 6.4). */
float *ds4_rope_inv_freq(const ds4_config *c, bool yarn) {
    const int n = c->n_rot / 2;
    float *inv = malloc((size_t)n * sizeof(float));
    const double base = yarn ? c->compress_rope_base : c->rope_base;
    double lo = 0, hi = 0;
    if (yarn) {
        const double L = (double)c->yarn_orig_ctx;
#define CORR(rot) (c->n_rot * log(L / ((rot) * 2 * M_PI)) / (2 * log(base)))
        lo = fmax(floor(CORR(c->yarn_beta_fast)), 0);
        hi = fmin(ceil(CORR(c->yarn_beta_slow)), c->n_rot - 1);
#undef CORR
        if (lo == hi) hi += 0.001;
    }
    for (int i = 0; i < n; i++) {
        float pf = powf((float)base, (float)(2 * i) / (float)c->n_rot);
        float extra = 1.0f / pf;
        if (!yarn || c->yarn_factor <= 1.0f) { inv[i] = extra; continue; }
        float inter = 1.0f / (c->yarn_factor * pf);
        float ramp = (float)fmin(fmax((i - lo) / (hi - lo), 0), 1);
        float ef = 1.0f - ramp;
        inv[i] = inter * (1.0f - ef) + extra * ef;
    }
    return inv;
}

bool ds4_cpu_numerics_supported(const ds4_config *c) {
    const int DI = c->idx_head_dim;
    return (c->head_dim - c->n_rot) % 64 == 0 && DI % 32 == 0 && (DI & (DI - 1)) == 0;
}

int ds4_cpu_backend_threads(const ds4_backend *be) { return ((const cpu *)be)->n_threads; }

ds4_backend *ds4_cpu_backend_new(const ds4_model *m, int n_threads, int max_batch, bool numerics,
                                 char *err, size_t errlen) {
    if (numerics && !ds4_cpu_numerics_supported(&m->cfg)) {
        snprintf(err, errlen, "ds4 numerics need non-rotary dims a multiple of 64 and a power-of-two indexer head");
        return NULL;
    }
    if (m->cfg.n_hc > 64) { snprintf(err, errlen, "more than 64 hyper-connection streams"); return NULL; }
    cpu *f = calloc(1, sizeof *f);
    f->base.name = "cpu";
    f->base.max_batch = max_batch > 0 ? max_batch : 1;
    f->base.eval = cpu_eval;
    f->base.free = cpu_free;
    f->m = m;
    f->c = &m->cfg;
    f->numerics = numerics;
    f->mixn = (2 + m->cfg.n_hc) * m->cfg.n_hc;
    f->pool = ds4_pool_new(n_threads);
    f->n_threads = ds4_pool_threads(f->pool);
    f->ts = calloc((size_t)f->n_threads, sizeof(thread_scratch));
    f->inv_freq[ROPE_MAIN] = ds4_rope_inv_freq(&m->cfg, false);
    f->inv_freq[ROPE_COMPRESS] = ds4_rope_inv_freq(&m->cfg, true);
    f->comp_cs = malloc((size_t)m->cfg.n_rot * sizeof(float));
    if (!f->pool || !f->ts) { cpu_free(&f->base); snprintf(err, errlen, "cannot create the thread pool"); return NULL; }
    return &f->base;
}
