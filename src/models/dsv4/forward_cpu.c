/* forward_cpu.c -- the DS4 forward pass on the CPU: layer-major batches whose
 * rows may belong to several session states (sections 6-8 of the model sheet).
 *
 * Exactness across batch compositions: every per-row quantity is computed by
 * code that sees only that row (activations are quantized per row, each
 * (weight row, token) dot runs the same kernel arithmetic in matvec and
 * matmul, norms and attention are per row, expert outputs are added in
 * ascending expert order), so which other rows share a batch never changes a
 * row's result. */
#include "models/dsv4/forward_cpu.h"
#include "models/dsv4/forward_cpu_impl.h"
#include "kernels/attn_cpu.h"
#include "models/dsv4/expert_cache.h"
#include "models/dsv4/forward_shared.h"
#include "kernels/kernels_cpu.h"
#include "models/dsv4/kv.h"
#include "nn/nn_math.h"
#include "nn/steering.h"
#include "kernels/quant.h"
#include "base/threadpool.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { ROPE_MAIN = 0, ROPE_COMPRESS = 1 };

/* The buffers one routed expert computes in: its gathered input rows, the
 * gate/up halves, the output rows and their converted activations. */
typedef struct {
    float *in, *gate, *up, *out;   /* [rows][E], [rows][F], [rows][F], [rows][E] */
    void *act;
} expert_scratch;

/* Batch scratch, carved out of one block sized for `cap` rows. */
typedef struct {
    float *hc_state;        /* [T][n_hc][E] the residual streams */
    float *hc_state_next;   /* [T][n_hc][E] streams being written by HC-post */
    float *hc_flat;         /* [T][n_hc*E] RMS-normalised streams, input of the mix */
    float *hc_mix;          /* [T][mixn] mix projection */
    float *hc_weights;      /* [T][mixn] post [n_hc] then comb [n_hc][n_hc] */
    float *hc_collapsed;    /* [T][E] pre-weighted sum of the streams */
    float *normed;          /* [T][E] sublayer input after its RMSNorm; the head's hidden */
    float *sublayer_out;    /* [T][E] attention or FFN output before HC-post */
    float *q_latent;        /* [T][q_lora] */
    float *q_heads;         /* [T][n_head*D] */
    float *attn_out;        /* [T][n_head*D], dead during the FFN, whose slot_out uses the same block */
    float *kv_row;          /* [T][D] this row's raw KV row */
    float *comp_k, *comp_z; /* [T][2*D] compressor K and gate projections */
    float *idx_k, *idx_z;   /* [T][2*DI] indexer compressor projections */
    float *idx_q;           /* [T][n_idx_head*DI] indexer queries */
    float *idx_head_w;      /* [T][n_idx_head] indexer head weights */
    float *out_latent;      /* [T][o_groups*o_lora] grouped output projection */
    float *out_group;       /* [T][o_lora] one group's output */
    float *router;          /* [T][n_expert] router logits, then scores */
    float *expert_w;        /* [T][k] weights of the selected experts */
    float *expert_in;       /* [T][E] rows gathered for one expert */
    float *expert_out;      /* [T][E] */
    float *ffn_gate;        /* [T][F] */
    float *ffn_up;          /* [T][F] */
    float *rope_cs;         /* [T][2][n_rot] cos/sin per row and RoPE kind */
    int *idx_sel;           /* [T][idx_topk] selected compressed rows */
    int *idx_nsel;          /* [T] */
    int *expert_ids;        /* [T][k] */
    int *predicted_ids;     /* [T][k] --ssd-streaming: the next layer's experts, guessed */
    float *predicted_w;     /* [T][k] their weights (unused; ds4_route_token writes them) */
    int *expert_rows;       /* [T*k] (row * k + slot) of the rows gathered per expert */
    int *group_expert;      /* [T*k] per-expert tasks: the expert of each group of rows, */
    int *group_row0;        /* [T*k] its first entry in expert_rows */
    int *group_n;           /* [T*k] and its row count */
    float *slot_out;        /* [T*k][E] per-expert tasks: the groups' outputs, in expert_rows order; shares attn_out's block */
    int *slot_at;           /* [T*k] per-expert tasks: where (row * k + slot) sits in expert_rows */
    expert_scratch *thread_x; /* [threads] per-expert tasks: each thread's buffers, for expert_group_rows() rows */
    int32_t *tokens;        /* [T] */
    int *row_seq;           /* [T] which sequence a row belongs to */
    int *seq_row0;          /* [T] a sequence's first row (at most T sequences) */
    int64_t *row_pos;       /* [T] a row's position in its sequence */
    int *head_rows;         /* [T] rows of one all-logits sequence */
    float *tp_send, *tp_recv; /* [T][max(G*OL, F, (k + 1) * E)] tensor parallelism: halves exchanged (empty without a split) */
    int *last_rows;         /* [T] last rows of the sequences that want only those */
    void *act;              /* [T] activations converted for the weight type */
} batch_scratch;

typedef struct {
    const float **rows; /* attention's candidate rows: raw, then compressed */
    float *weights;     /* [ATTN_GROUP][candidates] their logits, then softmax weights */
    float *iscore;      /* indexer scores of visible rows */
} thread_scratch;

typedef struct cpu {
    ds4_backend base;
    const ds4_model *m;
    const ds4_config *c;
    ds4_pool *pool;
    bool owns_pool;                 /* false for a sibling (ds4_cpu_backend_new_sibling) */
    int n_threads;
    bool numerics;
    ds4_expert_cache *experts;      /* --ssd-streaming: routed weights come from its slots */
    bool predict;                   /* and the next layer's are guessed a layer early */
    float *inv_freq[2];             /* [n_rot/2] per RoPE kind */
    float *comp_cs;                 /* RoPE table of the row being compressed */
    int mixn;                       /* HC mix rows: (2 + n_hc) * n_hc */

    /* Every buffer below is replaced only after its larger successor is
     * allocated, so a failed grow leaves the backend as it was. */
    int cap;
    batch_scratch s;
    void *s_block;
    int head_cap;                   /* rows of head_logits */
    float *head_logits;             /* last-row logits of several sequences */
    int rows_cap;                   /* per-thread scratch, for states of up to rows_cap - 8 tokens */
    thread_scratch *ts;
    void *ts_block;
    ds4_matmul_observer observe;    /* NULL = off */
    void *observe_ud;
    ds4_cpu_split split;            /* tensor parallelism: send NULL = off */
    bool split_heads;               /* and attention's heads and out_b's rows split too */
    float *head_own, *head_other;   /* [HEAD_CHUNK][n_vocab - n_vocab / 2]: the split output head's halves */
} cpu;

/* one eval: its sequences and the layer being run */
typedef struct {
    cpu *f;
    const ds4_backend_seq *seqs;
    int n_seqs;
    int T, l;
    const float *hc_scale, *hc_base;   /* the HC sublayer being applied */
    int group0;                        /* expert_group_task: the first group of the run */
    int h0, h1;                        /* attention: the heads this process computes */
    int head_gate;                     /* the output head's exchanges so far in this eval */
    int sum_lo, sum_hi;                /* expert_sum_task: the experts whose slots it adds */
} batch;

static ds4_kv *row_kv(const batch *b, int t) { return b->seqs[b->f->s.row_seq[t]].kv; }
static int64_t row_pos(const batch *b, int t) { return b->f->s.row_pos[t]; }

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

/* ds4_linear over the whole pool in the batch's buffers, counting the bytes */
static void linear(cpu *f, const ds4_tensor *W, int64_t e, int64_t row0, int64_t rows, const float *x,
                   int64_t xstride, int T, float *y) {
    f->base.weight_bytes += (uint64_t)rows * W->row_bytes;
    if (f->observe) f->observe(f->observe_ud, W->data, e, x, xstride, W->ne[0], T);
    ds4_linear(f->pool, f->s.act, W, e, row0, rows, x, xstride, T, y);
}

/* in place, with the root in double as DeepSeek V4's reference */
static void rmsnorm(float *x, int n, const float *w, float eps) { ds4_rmsnorm(x, w, n, eps, DS4_RMS_F64, x); }

/* f32 dot product through the SIMD kernels (the F32 "activation" is f32). */

static void axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

/* Rotates the last n_rot dims of x (interleaved pairs) with a cos/sin table. */
static void rope_apply(float *x, int dim, int n_rot, const float *cs, bool inverse) {
    ds4_rope_rotate(x + dim - n_rot, n_rot, cs, inverse);
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
    return f->s.rope_cs + ((size_t)t * 2 + rope_kind(f->c, b->l)) * f->c->n_rot;
}

/* ------------------------------------------------------- hyper-connections */

static void hc_norm_task(batch *b, int t, int thread) {
    const batch_scratch *s = &b->f->s;
    const int n = b->f->c->n_hc * b->f->c->n_embd;
    memcpy(s->hc_flat + (size_t)t * n, s->hc_state + (size_t)t * n, (size_t)n * sizeof(float));
    rmsnorm(s->hc_flat + (size_t)t * n, n, NULL, b->f->c->rms_eps);
}

/* pre/post/comb weights from the mix (sheet 6.2), then the collapsed input. */
static void hc_pre_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const int n_hc = c->n_hc, E = c->n_embd;
    const float *mix = f->s.hc_mix + (size_t)t * f->mixn;
    const float *scale = b->hc_scale, *base = b->hc_base;
    float *post = f->s.hc_weights + (size_t)t * f->mixn, *comb = post + n_hc;
    float pre[64];
    double sinkhorn[64 * 64];
    ds4_hc_weights(mix, scale, base, n_hc, c->sinkhorn_iters, c->hc_eps, pre, post, comb, sinkhorn);
    ds4_hc_collapse(pre, f->s.hc_state + (size_t)t * n_hc * E, n_hc, E, f->s.hc_collapsed + (size_t)t * E);
}

/* next[k] = post_k * out + sum_j comb[j][k] * streams[j] (swapped in afterwards). */
static void hc_post_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const int n_hc = f->c->n_hc, E = f->c->n_embd;
    const float *post = f->s.hc_weights + (size_t)t * f->mixn, *comb = post + n_hc;
    ds4_hc_expand(post, comb, f->s.hc_state + (size_t)t * n_hc * E, f->s.sublayer_out + (size_t)t * E, n_hc, E,
                  f->s.hc_state_next + (size_t)t * n_hc * E);
}

/* collapsed = HC-pre(streams) for every row of the batch, then normed = RMSNorm(collapsed; norm). */
static void hc_pre(batch *b, const ds4_tensor *fn, const float *scale, const float *base, const float *norm) {
    cpu *f = b->f;
    const int E = f->c->n_embd;
    par(b, b->T, hc_norm_task);
    linear(f, fn, 0, 0, f->mixn, f->s.hc_flat, (int64_t)f->c->n_hc * E, b->T, f->s.hc_mix);
    b->hc_scale = scale;
    b->hc_base = base;
    par(b, b->T, hc_pre_task);
    for (int t = 0; t < b->T; t++) {
        float *x = f->s.normed + (size_t)t * E;
        memcpy(x, f->s.hc_collapsed + (size_t)t * E, (size_t)E * sizeof(float));
        rmsnorm(x, E, norm, f->c->rms_eps);
    }
}

/* Each row's sequence may steer the sublayer output before it is mixed back
 * into the streams (nn/steering.h). */
static void hc_post(batch *b, ds4_steer_site site) {
    batch_scratch *s = &b->f->s;
    const int E = b->f->c->n_embd;
    for (int t = 0; t < b->T; t++) {
        const ds4_backend_seq *q = &b->seqs[s->row_seq[t]];
        ds4_steer_row(q->steer, site, b->l, s->sublayer_out + (size_t)t * E);
        ds4_probe_row(q->probe, site, b->l, s->sublayer_out + (size_t)t * E);
    }
    par(b, b->T, hc_post_task);
    float *swap = s->hc_state; s->hc_state = s->hc_state_next; s->hc_state_next = swap;
}

/* ------------------------------------------------------------- attention */

/* Row t's KV row: normed, rotated and (exact numerics) rounded in place. */
static void kv_row_finish(batch *b, int t) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const int D = c->head_dim;
    float *kv = f->s.kv_row + (size_t)t * D;
    rmsnorm(kv, D, f->m->layers[b->l].kv_norm, c->rms_eps);
    rope_apply(kv, D, c->n_rot, rope_cs(b, t), false);
    if (f->numerics) {
        ds4_fp8_e4m3_roundtrip(kv, D - c->n_rot);
        ds4_fwd_f16_round(kv, D);
    }
}

static void q_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const int D = c->head_dim;
    const float *cs = rope_cs(b, t);
    for (int h = b->h0; h < b->h1; h++) {
        float *q = f->s.q_heads + ((size_t)t * c->n_head + h) * D;
        rmsnorm(q, D, NULL, c->rms_eps);
        rope_apply(q, D, c->n_rot, cs, false);
    }
    kv_row_finish(b, t);
}

static void kv_row_task(batch *b, int t, int thread) { kv_row_finish(b, t); }

/* Pools window w of one compressor from its frontier ring (sheet 6.5). */
static void pool_window(const float *fk, const float *fz, int f_cap, int coff, int d, int ratio, int64_t w,
                        float *out) {
    for (int j = 0; j < d; j++) out[j] = ds4_pool_lane(fk, fz, f_cap, coff, d, ratio, w, j);
}

/* Feeds sequence q's projected K/Z into layer l's compressor(s) in token
 * order, emitting a row whenever a window completes. */
static void compress_seq(batch *b, int q) {
    cpu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    ds4_kv_layer *L = &b->seqs[q].kv->L[b->l];
    const int D = c->head_dim, DI = c->idx_head_dim, r = L->ratio, Wc = L->coff * D, Wi = 2 * DI;
    const int row0 = f->s.seq_row0[q];
    float *cs = f->comp_cs;
    for (int t = row0; t < row0 + b->seqs[q].n; t++) {
        const int64_t p = row_pos(b, t);
        const size_t slot = (size_t)(p % L->f_cap);
        const float *ape = W->comp_ape + (size_t)(p % r) * Wc;
        for (int i = 0; i < Wc; i++) {
            L->fk[slot * Wc + i] = f->s.comp_k[(size_t)t * Wc + i];
            L->fz[slot * Wc + i] = f->s.comp_z[(size_t)t * Wc + i] + ape[i];
        }
        if (L->idx) {
            const float *iape = W->idx_ape + (size_t)(p % r) * Wi;
            for (int i = 0; i < Wi; i++) {
                L->ik[slot * Wi + i] = f->s.idx_k[(size_t)t * Wi + i];
                L->iz[slot * Wi + i] = f->s.idx_z[(size_t)t * Wi + i] + iape[i];
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
            ds4_fwd_f16_round(row, D);
        }
        if (L->idx) {
            float *ir = L->idx + (size_t)w * DI;
            pool_window(L->ik, L->iz, L->f_cap, 2, DI, r, w, ir);
            rmsnorm(ir, DI, W->idx_norm, c->rms_eps);
            rope_apply(ir, DI, c->n_rot, cs, false);
            if (f->numerics) {
                ds4_hadamard(ir, DI);
                ds4_fp4_e2m1_roundtrip(ir, DI);
                ds4_fwd_f16_round(ir, DI);
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
        float *q = f->s.idx_q + ((size_t)t * c->n_idx_head + h) * DI;
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
    const float *rows = row_kv(b, t)->L[b->l].idx;
    const float *q = f->s.idx_q + (size_t)t * HI * DI, *head_w = f->s.idx_head_w + (size_t)t * HI;
    const float ks = 1.0f / sqrtf((float)DI), ws = 1.0f / sqrtf((float)HI);
    enum { HEADS_PER_DOT = 8 };   /* one load of a row serves 8 heads' dots (ds4_vec_dotn) */
    for (int w = w0; w < w1; w++) {
        const float *k = rows + (size_t)w * DI;
        float acc = 0;
        for (int h0 = 0; h0 < HI; h0 += HEADS_PER_DOT) {
            float dots[HEADS_PER_DOT];
            const int nh = HI - h0 < HEADS_PER_DOT ? HI - h0 : HEADS_PER_DOT;
            ds4_vec_dotn(DS4_TYPE_F32, k, q + (size_t)h0 * DI, (size_t)DI * sizeof(float), DI, nh, dots);
            for (int h = 0; h < nh; h++)
                if (dots[h] > 0) acc += dots[h] * ks * (head_w[h0 + h] * ws);
        }
        out[w] = acc;
    }
}

/* compressed rows visible to row t: windows completed at or before its position */
static int n_visible(const batch *b, int t) {
    return (int)((row_pos(b, t) + 1) / row_kv(b, t)->L[b->l].ratio);
}

/* Whole-row indexer selection (one task per row). */
static void idx_select_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const int nv = n_visible(b, t), k = f->c->idx_topk;
    int *sel = f->s.idx_sel + (size_t)t * k;
    if (nv <= k) {
        for (int w = 0; w < nv; w++) sel[w] = w;
        f->s.idx_nsel[t] = nv;
        return;
    }
    float *sc = f->ts[thread].iscore;
    idx_score(b, t, 0, nv, sc);
    f->s.idx_nsel[t] = ds4_topk(sc, nv, k, sel);
}

/* A single row: its scores split into blocks across threads (each score is
 * computed alone, so the split does not change them). */
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
    bool scores_needed = false;
    for (int t = 0; t < b->T && !scores_needed; t++) scores_needed = n_visible(b, t) > c->idx_topk;
    if (scores_needed) {
        linear(f, &W->idx_q_b, 0, 0, (int64_t)c->n_idx_head * c->idx_head_dim, f->s.q_latent, c->q_lora, b->T,
               f->s.idx_q);
        par(b, b->T, idx_q_task);
        linear(f, &W->idx_proj, 0, 0, c->n_idx_head, f->s.normed, c->n_embd, b->T, f->s.idx_head_w);
    }
    if (b->T == 1 && scores_needed) {
        const int nv = n_visible(b, 0);
        par(b, (nv + IDX_BLOCK - 1) / IDX_BLOCK, idx_block_task);
        f->s.idx_nsel[0] = ds4_topk(f->ts[0].iscore, nv, c->idx_topk, f->s.idx_sel);
    } else {
        par(b, b->T, idx_select_task);
    }
}

/* Row t's candidate rows, in the order attention sums them: raw rows first
 * (positions lo..p, from the batch or, before the sequence's first batch
 * row, from the ring), then the usable compressed rows; returns how many. */
static int attn_rows(const batch *b, int t, const ds4_kv_layer *L, const float **rows) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const int D = c->head_dim;
    const int64_t p = row_pos(b, t), first = row_kv(b, t)->first_pos;
    const int64_t lo = p - c->window + 1 > first ? p - c->window + 1 : first;
    const int row0 = f->s.seq_row0[f->s.row_seq[t]];
    const int64_t p0 = row_pos(b, row0);
    const int raw_cap = row_kv(b, t)->raw_cap;
    int n = 0;
    for (int64_t pos = lo; pos <= p; pos++)
        rows[n++] = pos >= p0 ? f->s.kv_row + (size_t)(row0 + (pos - p0)) * D : L->raw + (size_t)(pos % raw_cap) * D;
    if (!L->ratio) return n;
    if (L->idx) {
        const int *sel = f->s.idx_sel + (size_t)t * c->idx_topk;
        for (int j = 0; j < f->s.idx_nsel[t]; j++) rows[n++] = L->comp + (size_t)sel[j] * D;
    } else {
        for (int w = 0, nv = n_visible(b, t); w < nv; w++) rows[n++] = L->comp + (size_t)w * D;
    }
    return n;
}

/* A group of ATTN_GROUP heads of one row (ds4_attn_heads: softmax with sink
 * over the candidate rows, each row read once for the group). */
enum { ATTN_GROUP = 8 };
static int attn_groups(const batch *b) { return (b->h1 - b->h0 + ATTN_GROUP - 1) / ATTN_GROUP; }

static void attn_task(batch *b, int task, int thread) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const int H = c->n_head, D = c->head_dim, t = task / attn_groups(b), h0 = b->h0 + task % attn_groups(b) * ATTN_GROUP;
    const int nh = b->h1 - h0 < ATTN_GROUP ? b->h1 - h0 : ATTN_GROUP;
    thread_scratch *ts = &f->ts[thread];
    const int n = attn_rows(b, t, &row_kv(b, t)->L[b->l], ts->rows);
    float *o = f->s.attn_out + ((size_t)t * H + h0) * D;
    ds4_attn_heads(f->s.q_heads + ((size_t)t * H + h0) * D, nh, D, ts->rows, n, 1.0f / sqrtf((float)D),
                   f->m->layers[b->l].sinks + h0, ts->weights, o);
    for (int h = 0; h < nh; h++) rope_apply(o + (size_t)h * D, D, c->n_rot, rope_cs(b, t), true);
}

/* rows of W for the split products (tp_split.h), counted like linear() */
static void split_rows(void *ctx, const ds4_tensor *W, int64_t row0, int64_t rows, const float *X, size_t x_stride,
                       int T, float *Y) {
    linear(ctx, W, 0, row0, rows, X, (int64_t)x_stride, T, Y);
}

/* Tensor parallelism: the other rank's columns of x (tp_split.h) at the
 * layer's gate `which`. */
static void allgather(batch *b, int which, float *x, int width, int c0, int c1) {
    cpu *f = b->f;
    ds4_split_allgather(&f->split, ds4_split_gate(b->l, which), x, b->T, width, c0, c1, f->s.tp_send, f->s.tp_recv);
}

/* The batch's KV rows into each sequence's window ring of this layer. */
static void kv_store(batch *b) {
    batch_scratch *s = &b->f->s;
    const int D = b->f->c->head_dim;
    for (int q = 0; q < b->n_seqs; q++) {
        ds4_kv *kv = b->seqs[q].kv;
        const int row0 = s->seq_row0[q], n = b->seqs[q].n;
        for (int t = row0 + (n > kv->raw_cap ? n - kv->raw_cap : 0); t < row0 + n; t++)
            memcpy(kv->L[b->l].raw + (size_t)(row_pos(b, t) % kv->raw_cap) * D, s->kv_row + (size_t)t * D,
                   (size_t)D * sizeof(float));
    }
}

/* State-only rows of a window-only layer (backend.h): the attention's input
 * mix and norm, the KV projection and its row finish, as attention() computes
 * them, then the ring; no queries, attention, output or FFN. */
static void kv_rows(batch *b) {
    cpu *f = b->f;
    const ds4_layer *W = &f->m->layers[b->l];
    hc_pre(b, &W->hc_attn_fn, W->hc_attn_scale, W->hc_attn_base, W->attn_norm);
    linear(f, &W->kv, 0, 0, f->c->head_dim, f->s.normed, f->c->n_embd, b->T, f->s.kv_row);
    par(b, b->T, kv_row_task);
    kv_store(b);
}

static void attention(batch *b) {
    cpu *f = b->f;
    batch_scratch *s = &f->s;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    const int T = b->T, E = c->n_embd, D = c->head_dim, HD = c->n_head * D;
    const int ratio = ds4_cfg_ratio(c, b->l), coff = ratio ? ds4_cfg_coff(c, b->l) : 0;
    const bool has_indexer = ratio && ds4_cfg_has_indexer(c, b->l);

    hc_pre(b, &W->hc_attn_fn, W->hc_attn_scale, W->hc_attn_base, W->attn_norm);
    linear(f, &W->q_a, 0, 0, c->q_lora, s->normed, E, T, s->q_latent);
    for (int t = 0; t < T; t++) rmsnorm(s->q_latent + (size_t)t * c->q_lora, c->q_lora, W->q_a_norm, c->rms_eps);
    /* tensor parallelism: this rank's heads, those of its half of the
     * output groups (attn_out is free until the heads write it) */
    const int G = c->o_groups, OL = c->o_lora, gin = HD / G, hpg = c->n_head / G;
    const bool split = f->split.send && f->split_heads;
    const int g0 = split && f->split.rank ? G / 2 : 0, g1 = split && !f->split.rank ? G / 2 : G;
    b->h0 = g0 * hpg;
    b->h1 = g1 * hpg;
    if (split) {
        const size_t n = (size_t)(b->h1 - b->h0) * D;
        linear(f, &W->q_b, 0, (int64_t)b->h0 * D, (int64_t)n, s->q_latent, c->q_lora, T, s->attn_out);
        for (int t = 0; t < T; t++)
            memcpy(s->q_heads + (size_t)t * HD + (size_t)b->h0 * D, s->attn_out + (size_t)t * n, n * sizeof(float));
    } else {
        linear(f, &W->q_b, 0, 0, HD, s->q_latent, c->q_lora, T, s->q_heads);
    }
    linear(f, &W->kv, 0, 0, D, s->normed, E, T, s->kv_row);
    par(b, T, q_task);

    if (ratio) {
        linear(f, &W->comp_kv, 0, 0, (int64_t)coff * D, s->normed, E, T, s->comp_k);
        linear(f, &W->comp_gate, 0, 0, (int64_t)coff * D, s->normed, E, T, s->comp_z);
        if (has_indexer) {
            linear(f, &W->idx_kv, 0, 0, 2 * c->idx_head_dim, s->normed, E, T, s->idx_k);
            linear(f, &W->idx_gate, 0, 0, 2 * c->idx_head_dim, s->normed, E, T, s->idx_z);
        }
        for (int q = 0; q < b->n_seqs; q++) compress_seq(b, q);
        if (has_indexer) indexer(b);
    }
    par(b, T * attn_groups(b), attn_task);
    /* a sequence's rows become its ring only now: attention above read the
     * previous ring contents for positions before the batch */
    kv_store(b);

    /* grouped output projection: group g = heads g*hpg ... */
    for (int g = g0; g < g1; g++) {
        linear(f, &W->out_a, 0, (int64_t)g * OL, OL, s->attn_out + (size_t)g * gin, HD, T, s->out_group);
        for (int t = 0; t < T; t++)
            memcpy(s->out_latent + ((size_t)t * G + g) * OL, s->out_group + (size_t)t * OL, (size_t)OL * sizeof(float));
    }
    if (!split) {
        linear(f, &W->out_b, 0, 0, E, s->out_latent, (int64_t)G * OL, T, s->sublayer_out);
    } else {
        /* each rank's group latents to the other (the same bits one process
         * computes), then each computes its half of out_b's rows and they
         * swap those: sublayer_out is the single process's on both */
        allgather(b, DS4_SPLIT_HEADS, s->out_latent, G * OL, g0 * OL, g1 * OL);
        const ds4_split_product pr = {split_rows, f, f->pool};
        ds4_split_rows(&f->split, ds4_split_gate(b->l, DS4_SPLIT_ATTN_OUT), &pr, &W->out_b, s->out_latent,
                       (size_t)G * OL, T, s->tp_send, s->tp_recv, s->sublayer_out);
    }
    hc_post(b, DS4_STEER_ATTN);
}

/* ------------------------------------------------------------------- MoE */

static void route_task(batch *b, int t, int thread) {
    const cpu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    const int k = c->n_expert_used;
    ds4_route_token(f->s.router + (size_t)t * c->n_expert, c->n_expert, k,
                    W->tid2eid ? W->tid2eid + (size_t)f->s.tokens[t] * k : NULL, W->exp_probs_b,
                    c->expert_weights_norm, c->expert_weights_scale, f->s.expert_ids + (size_t)t * k,
                    f->s.expert_w + (size_t)t * k);
}

/* Rows of one expert: in[i] = normed[token of rows[i]]; after the expert,
 * sublayer_out[token] += weight x out[i]. */
typedef struct { batch_scratch *s; const int *rows; int n, E, k; const expert_scratch *x; } expert_rows_ctx;

static void gather_rows(void *ctx, int first, int end) {
    const expert_rows_ctx *g = ctx;
    for (int i = first; i < end; i++)
        memcpy(g->x->in + (size_t)i * g->E, g->s->normed + (size_t)(g->rows[i] / g->k) * g->E,
               (size_t)g->E * sizeof(float));
}

/* Columns [16 first, 16 end) of sublayer_out += weighted expert output. Split
 * by columns, not rows, because a hash row may name the same expert twice, so
 * two rows can add into one token; per element the additions keep the row
 * order, and blocks of 16 floats keep threads off each other's cache lines. */
#define SCATTER_COLS 16
static void scatter_cols(void *ctx, int first, int end) {
    const expert_rows_ctx *g = ctx;
    const batch_scratch *s = g->s;
    const int col0 = first * SCATTER_COLS, col1 = end * SCATTER_COLS < g->E ? end * SCATTER_COLS : g->E;
    for (int i = 0; i < g->n; i++)
        axpy(s->sublayer_out + (size_t)(g->rows[i] / g->k) * g->E + col0, s->expert_w[g->rows[i]],
             g->x->out + (size_t)i * g->E + col0, col1 - col0);
}

/* Expert e over the n rows listed in rows (row * k + slot) into x->out, over
 * pool's threads (NULL: on the calling thread). */
static void expert(batch *b, int e, const int *rows, int n, ds4_pool *pool, const expert_scratch *x) {
    cpu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    const int E = c->n_embd, F = c->n_ff_exp, k = c->n_expert_used;
    expert_rows_ctx g = {&f->s, rows, n, E, k, x};
    ds4_pool_run_ranges(pool, n, gather_rows, &g);
    ds4_tensor w[3] = {W->gate_exps, W->up_exps, W->down_exps};
    int64_t we = e;
    if (f->experts) { ds4_expert_cache_get(f->experts, b->l, e, w); we = 0; }
    /* observed under the file's tensors and the expert's own index (a
     * streamed expert sits in a cache slot) */
    ds4_matmul_observer obs = f->observe;
    if (obs) obs(f->observe_ud, W->gate_exps.data, e, x->in, E, E, n);
    if (obs) obs(f->observe_ud, W->up_exps.data, e, x->in, E, E, n);
    ds4_linear(pool, x->act, &w[0], we, 0, F, x->in, E, n, x->gate);
    ds4_linear(pool, x->act, &w[1], we, 0, F, x->in, E, n, x->up);
    ds4_swiglu(pool, x->gate, x->up, n, F, c->clamp_exp[b->l]);
    if (obs) obs(f->observe_ud, W->down_exps.data, e, x->gate, F, F, n);
    ds4_linear(pool, x->act, &w[2], we, 0, E, x->gate, F, n, x->out);
}

static uint64_t expert_bytes(const ds4_layer *W) {
    return (uint64_t)W->gate_exps.ne[1] * W->gate_exps.row_bytes + (uint64_t)W->up_exps.ne[1] * W->up_exps.row_bytes +
           (uint64_t)W->down_exps.ne[1] * W->down_exps.row_bytes;
}

/* One group of rows of one expert on this thread, its outputs kept in
 * slot_out at the group's place in expert_rows. */
static void expert_group_task(batch *b, int g, int thread) {
    batch_scratch *s = &b->f->s;
    expert_scratch x = s->thread_x[thread];
    g += b->group0;
    x.out = s->slot_out + (size_t)s->group_row0[g] * b->f->c->n_embd;
    expert(b, s->group_expert[g], s->expert_rows + s->group_row0[g], s->group_n[g], NULL, &x);
}

/* Row t's outputs of the experts [sum_lo, sum_hi) added in ascending expert
 * order (slot order within one expert), as the expert-major loop of routed()
 * adds them: two calls over [0, m) and [m, n) add what one over [0, n) does,
 * in the same order. */
static void expert_sum_task(batch *b, int t, int thread) {
    const batch_scratch *s = &b->f->s;
    const int E = b->f->c->n_embd, k = b->f->c->n_expert_used;
    const int *ids = s->expert_ids + (size_t)t * k;
    int last = -1;   /* the slot added last; the next is the least (id, slot) after it */
    for (int added = 0; added < k; added++) {
        int best = -1;
        for (int j = 0; j < k; j++) {
            const bool after = last < 0 || ids[j] > ids[last] || (ids[j] == ids[last] && j > last);
            if (after && ids[j] >= b->sum_lo && ids[j] < b->sum_hi && (best < 0 || ids[j] < ids[best])) best = j;
        }
        if (best < 0) break;
        axpy(s->sublayer_out + (size_t)t * E, s->expert_w[(size_t)t * k + best],
             s->slot_out + (size_t)s->slot_at[(size_t)t * k + best] * E, E);
        last = best;
    }
}

/* Rows of one expert that one thread computes as a group: 64 tokens share
 * each weight load in the tile kernels (whose token groups hold at most 16),
 * a thread's buffers stay small (48 KiB per row on Flash, whatever the batch),
 * and an expert with more rows than that splits into groups that other
 * threads take. */
enum { EXPERT_GROUP_ROWS = 64 };
static int expert_group_rows(int T) { return T < EXPERT_GROUP_ROWS ? T : EXPERT_GROUP_ROWS; }

/* routed()'s progress through one layer's experts */
typedef struct {
    bool per_thread;    /* groups are recorded for one pool run, else run at once over the pool */
    int n_groups, used; /* groups recorded, entries of expert_rows they hold */
    int lo, hi;         /* the experts this process computes (tensor parallelism: its half) */
} routing;

/* The next n rows of expert e (from expert_rows + r->used). */
static void expert_group(batch *b, routing *r, int e, int n) {
    cpu *f = b->f;
    batch_scratch *s = &f->s;
    const int E = f->c->n_embd, k = f->c->n_expert_used;
    if (!f->split.send || (e >= r->lo && e < r->hi)) f->base.weight_bytes += expert_bytes(&f->m->layers[b->l]);
    if (r->per_thread) {
        s->group_expert[r->n_groups] = e;
        s->group_row0[r->n_groups] = r->used;
        s->group_n[r->n_groups++] = n;
        r->used += n;
        return;
    }
    const expert_scratch whole = {s->expert_in, s->ffn_gate, s->ffn_up, s->expert_out, s->act};
    expert(b, e, s->expert_rows, n, f->pool, &whole);
    expert_rows_ctx g = {s, s->expert_rows, n, E, k, &whole};
    ds4_pool_run_ranges(f->pool, (E + SCATTER_COLS - 1) / SCATTER_COLS, scatter_cols, &g);
}

/* Tensor parallelism, the shared expert's second half (tp_split.h): the
 * other rank's activation, then this rank's output columns into out. */
static void shared_split_end(batch *b, float *out) {
    cpu *f = b->f;
    const ds4_split_product pr = {split_rows, f, f->pool};
    ds4_split_shared_end(&f->split, b->l, &pr, &f->m->layers[b->l].down_shexp, b->T, f->s.ffn_gate, f->s.tp_recv,
                         f->s.ffn_up, out);
}

/* Routed experts added into sublayer_out: rows grouped per expert so each
 * expert's weights are read once per group, whichever sequences the rows
 * belong to; every row receives its experts in ascending order.
 * Each group runs whole on one thread, all groups of the layer in one pool
 * run that hands them out as threads free up, then one run sums every row's
 * slots. Splitting each expert's three matmuls over the pool instead (as
 * before for batches of more than n_expert / k rows) put eight pool barriers
 * on every expert, about 9000 per prefill of 512 tokens on Flash, each one
 * waiting for the slowest thread: a thread that the scheduler took off a
 * shared core stalled them all. A decode-sized batch has about one row per
 * expert and gains the same way (a matvec split over the threads ends in a
 * barrier every few hundred microseconds). --ssd-streaming (its views are
 * valid on one thread, one expert at a time) splits each expert's rows (a
 * group of at most T, since a hash row may name an expert twice) over the
 * pool. */
static void routed(batch *b) {
    cpu *f = b->f;
    batch_scratch *s = &f->s;
    const ds4_config *c = f->c;
    const int T = b->T, k = c->n_expert_used, mid = f->split.mid;
    routing r = {.per_thread = !f->experts, .lo = 0, .hi = c->n_expert};
    if (f->split.send) {
        r.lo = f->split.rank ? mid : 0;
        r.hi = f->split.rank ? c->n_expert : mid;
    }
    int mid_group = 0, mid_used = 0;   /* where the experts [mid, n) start in the groups and in expert_rows */
    const int group = r.per_thread ? expert_group_rows(T) : T;
    for (int e = 0; e < c->n_expert; e++) {
        if (e == mid) { mid_group = r.n_groups; mid_used = r.used; }
        int n = 0;
        for (int j = 0; j < T * k; j++) {
            if (s->expert_ids[j] != e) continue;
            s->slot_at[j] = r.used + n;
            s->expert_rows[r.used + n++] = j;
            if (n == group) { expert_group(b, &r, e, n); n = 0; }
        }
        if (n) expert_group(b, &r, e, n);
    }
    if (!r.per_thread) return;
    b->sum_lo = 0;
    if (!f->split.send) {
        b->group0 = 0;
        b->sum_hi = c->n_expert;
        par(b, r.n_groups, expert_group_task);
        par(b, T, expert_sum_task);
        return;
    }
    /* Tensor parallelism (ds4_cpu_split): the groups are laid out as one
     * process lays them out and each rank computes its own experts' groups
     * [0, mid_group) or [mid_group, n_groups), whose outputs fill the slots
     * [0, mid_used) or [mid_used, used); then the shared expert's half of
     * the output columns (shared_split_end). One exchange swaps those
     * halves and slots, and each rank adds every row's experts as one
     * process does. */
    const int rank = f->split.rank, E = c->n_embd;
    const size_t lo_rows = (size_t)mid_used * E, hi_rows = (size_t)(r.used - mid_used) * E;
    b->group0 = rank ? mid_group : 0;
    par(b, rank ? r.n_groups - mid_group : mid_group, expert_group_task);
    shared_split_end(b, s->tp_send);
    const size_t own_n = rank ? hi_rows : lo_rows, other_n = rank ? lo_rows : hi_rows;
    memcpy(ds4_split_moe_extra(&f->split, s->tp_send, T, E), s->slot_out + (rank ? lo_rows : 0),
           own_n * sizeof(float));
    const float *other = ds4_split_moe_exchange(&f->split, b->l, T, E, s->tp_send, own_n, s->tp_recv, other_n,
                                                s->sublayer_out);
    memcpy(s->slot_out + (rank ? 0 : lo_rows), other, other_n * sizeof(float));
    b->sum_lo = 0;
    b->sum_hi = c->n_expert;
    par(b, T, expert_sum_task);
}

/* --ssd-streaming, decode-sized batches: the experts of `layer` guessed
 * before its router runs, so their reads overlap the work in between. A hash
 * layer's are known from the token (so layer 0's go out before its
 * attention); otherwise, from the layer before, its router runs on that
 * layer's FFN input (the collapsed stream, normed with this layer's
 * ffn_norm), and the reads overlap the previous layer's experts and this
 * layer's attention. Only reads depend on the guess: the layer's own router
 * decides what is computed. */
static void predict_experts(batch *b, int layer) {
    cpu *f = b->f;
    batch_scratch *s = &f->s;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[layer];
    const int T = b->T, E = c->n_embd, k = c->n_expert_used;
    if (W->tid2eid) {
        for (int i = 0; i < T * k; i++) s->predicted_ids[i] = W->tid2eid[(size_t)s->tokens[i / k] * k + i % k];
    } else {
        /* expert_in and router are free until the routed loop: the real
         * routing already sits in expert_ids */
        for (int t = 0; t < T; t++) {
            float *x = s->expert_in + (size_t)t * E;
            memcpy(x, s->hc_collapsed + (size_t)t * E, (size_t)E * sizeof(float));
            rmsnorm(x, E, W->ffn_norm, c->rms_eps);
        }
        linear(f, &W->gate_inp, 0, 0, c->n_expert, s->expert_in, E, T, s->router);
        for (int t = 0; t < T; t++)
            ds4_route_token(s->router + (size_t)t * c->n_expert, c->n_expert, k, NULL, W->exp_probs_b,
                            c->expert_weights_norm, c->expert_weights_scale, s->predicted_ids + (size_t)t * k,
                            s->predicted_w + (size_t)t * k);
    }
    ds4_expert_cache_predict(f->experts, layer, s->predicted_ids, T, k);
}

static void ffn(batch *b) {
    cpu *f = b->f;
    batch_scratch *s = &f->s;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    const int T = b->T, E = c->n_embd, F = c->n_ff_exp, k = c->n_expert_used;

    hc_pre(b, &W->hc_ffn_fn, W->hc_ffn_scale, W->hc_ffn_base, W->ffn_norm);
    linear(f, &W->gate_inp, 0, 0, c->n_expert, s->normed, E, T, s->router);
    par(b, T, route_task);
    /* the reads of missing experts overlap the shared expert */
    if (f->experts) {
        ds4_expert_cache_fetch(f->experts, b->l, s->expert_ids, T, k);
        if (f->predict && b->l < f->m->slice.last && T * k < c->n_expert) predict_experts(b, b->l + 1);
    }

    /* shared expert over the whole batch, into sublayer_out (tensor
     * parallelism: this rank's half of its activation, sent now so that
     * the transfer overlaps the routed experts; routed() finishes it) */
    if (!f->split.send) {
        linear(f, &W->gate_shexp, 0, 0, F, s->normed, E, T, s->ffn_gate);
        linear(f, &W->up_shexp, 0, 0, F, s->normed, E, T, s->ffn_up);
        ds4_swiglu(f->pool, s->ffn_gate, s->ffn_up, T, F, c->clamp_shexp[b->l]);
        linear(f, &W->down_shexp, 0, 0, E, s->ffn_gate, F, T, s->sublayer_out);
    } else {
        const ds4_split_product pr = {split_rows, f, f->pool};
        ds4_split_shared_begin(&f->split, b->l, &pr, &W->gate_shexp, &W->up_shexp, c->clamp_shexp[b->l], s->normed,
                               (size_t)E, T, s->ffn_gate, s->ffn_up);
    }

    routed(b);
    hc_post(b, DS4_STEER_FFN);
}

/* ---------------------------------------------------------------- driver */

/* Hands out consecutive 64-byte aligned pieces of a block; with a NULL base it
 * only adds up the size. */
typedef struct { char *base; size_t used; } carver;

static void *carve(carver *cv, size_t count, size_t elem) {
    void *p = cv->base ? cv->base + cv->used : NULL;
    cv->used += (count * elem + 63) & ~(size_t)63;
    return p;
}

/* Lays out the scratch for T rows over cv; returns the bytes it needs. */
static size_t layout_batch(const cpu *f, int T, carver *cv, batch_scratch *s) {
    const ds4_config *c = f->c;
    const size_t rows = (size_t)T, E = c->n_embd, hcE = (size_t)c->n_hc * E, D = c->head_dim;
    const size_t HD = (size_t)c->n_head * D, DI = c->idx_head_dim, F = c->n_ff_exp, k = c->n_expert_used;
    const size_t fl = sizeof(float);
    s->hc_state = carve(cv, rows * hcE, fl);
    s->hc_state_next = carve(cv, rows * hcE, fl);
    s->hc_flat = carve(cv, rows * hcE, fl);
    s->hc_mix = carve(cv, rows * f->mixn, fl);
    s->hc_weights = carve(cv, rows * f->mixn, fl);
    s->hc_collapsed = carve(cv, rows * E, fl);
    s->normed = carve(cv, rows * E, fl);
    s->sublayer_out = carve(cv, rows * E, fl);
    s->q_latent = carve(cv, rows * c->q_lora, fl);
    s->q_heads = carve(cv, rows * HD, fl);
    /* attention's output is consumed by its output projection before the
     * FFN starts, so the FFN's per-slot expert outputs reuse its block */
    s->attn_out = carve(cv, rows * (HD > k * E ? HD : k * E), fl);
    s->slot_out = s->attn_out;
    s->kv_row = carve(cv, rows * D, fl);
    s->comp_k = carve(cv, rows * 2 * D, fl);
    s->comp_z = carve(cv, rows * 2 * D, fl);
    s->idx_k = carve(cv, rows * 2 * DI, fl);
    s->idx_z = carve(cv, rows * 2 * DI, fl);
    s->idx_q = carve(cv, rows * c->n_idx_head * DI, fl);
    s->idx_head_w = carve(cv, rows * c->n_idx_head, fl);
    s->out_latent = carve(cv, rows * c->o_groups * c->o_lora, fl);
    s->out_group = carve(cv, rows * c->o_lora, fl);
    /* tensor parallelism: the widest exchange per row is the attention's
     * group latents, the shared expert's activation or the MoE exchange
     * (half the shared expert's output and up to k slots) */
    const size_t G_OL = (size_t)c->o_groups * c->o_lora, moe_cols = (size_t)(k + 1) * E;
    size_t tp_cols = G_OL > (size_t)F ? G_OL : (size_t)F;
    if (moe_cols > tp_cols) tp_cols = moe_cols;
    if (!f->split.send) tp_cols = 0;
    s->tp_send = carve(cv, rows * tp_cols, fl);
    s->tp_recv = carve(cv, rows * tp_cols, fl);
    s->router = carve(cv, rows * c->n_expert, fl);
    s->expert_w = carve(cv, rows * k, fl);
    s->expert_in = carve(cv, rows * E, fl);
    s->expert_out = carve(cv, rows * E, fl);
    s->ffn_gate = carve(cv, rows * F, fl);
    s->ffn_up = carve(cv, rows * F, fl);
    s->rope_cs = carve(cv, rows * 2 * c->n_rot, fl);
    s->idx_sel = carve(cv, rows * c->idx_topk, sizeof(int));
    s->idx_nsel = carve(cv, rows, sizeof(int));
    s->expert_ids = carve(cv, rows * k, sizeof(int));
    s->predicted_ids = carve(cv, rows * k, sizeof(int));
    s->predicted_w = carve(cv, rows * k, fl);
    s->expert_rows = carve(cv, rows * k, sizeof(int));
    s->group_expert = carve(cv, rows * k, sizeof(int));
    s->group_row0 = carve(cv, rows * k, sizeof(int));
    s->group_n = carve(cv, rows * k, sizeof(int));
    s->slot_at = carve(cv, rows * k, sizeof(int));
    const size_t thread_rows = (size_t)expert_group_rows(T);
    s->thread_x = carve(cv, (size_t)f->n_threads, sizeof(expert_scratch));
    const size_t expert_act = ds4_act_bytes(DS4_TYPE_F32, (int64_t)(E > F ? E : F));
    for (int i = 0; i < f->n_threads; i++) {
        /* no output rows: a group writes straight into slot_out */
        expert_scratch x = {carve(cv, thread_rows * E, fl), carve(cv, thread_rows * F, fl),
                            carve(cv, thread_rows * F, fl), NULL, carve(cv, thread_rows, expert_act)};
        if (s->thread_x) s->thread_x[i] = x;
    }
    s->tokens = carve(cv, rows, sizeof(int32_t));
    s->row_seq = carve(cv, rows, sizeof(int));
    s->seq_row0 = carve(cv, rows, sizeof(int));
    s->row_pos = carve(cv, rows, sizeof(int64_t));
    s->head_rows = carve(cv, rows, sizeof(int));
    s->last_rows = carve(cv, rows, sizeof(int));
    size_t widest = hcE;
    const size_t inputs[] = {HD, F, (size_t)c->o_groups * c->o_lora, (size_t)c->q_lora, E};
    for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; i++) if (inputs[i] > widest) widest = inputs[i];
    /* f32 activations are the widest conversion of any weight type */
    s->act = carve(cv, rows, ds4_act_bytes(DS4_TYPE_F32, (int64_t)widest));
    return cv->used;
}

static bool grow_batch(cpu *f, int T) {
    if (T <= f->cap) return true;
    carver sizing = {NULL, 0};
    batch_scratch unused;
    char *block = ds4_kernels_alloc(layout_batch(f, T, &sizing, &unused));
    if (!block) return false;
    carver cv = {block, 0};
    layout_batch(f, T, &cv, &f->s);
    free(f->s_block);
    f->s_block = block;
    f->cap = T;
    return true;
}

/* attention candidates of a row in a state of `rows` tokens: the raw window
 * plus the most compressed rows any layer can use (all visible ones, at most
 * the indexer's top-k where it selects) */
static size_t max_candidates(const ds4_config *c, int rows) {
    size_t comp = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const int ratio = ds4_cfg_ratio(c, l);
        if (!ratio) continue;
        const size_t visible = (size_t)rows / (size_t)ratio;
        const size_t used = ds4_cfg_has_indexer(c, l) && (size_t)c->idx_topk < visible ? (size_t)c->idx_topk : visible;
        if (used > comp) comp = used;
    }
    return (size_t)c->window + comp;
}

/* Per-thread buffers sized for the rows a state of ctx tokens can expose. */
static bool grow_rows(cpu *f, int ctx) {
    const int rows = ctx + 8;
    if (rows <= f->rows_cap) return true;
    const size_t cand = max_candidates(f->c, rows);
    /* floats first (a multiple of 64 bytes), then the pointers: every piece stays aligned */
    const size_t floats = ((size_t)ATTN_GROUP * cand + (size_t)rows + 15) & ~(size_t)15, per_thread = floats * sizeof(float) + cand * sizeof(float *);
    char *block = ds4_kernels_alloc((size_t)f->n_threads * per_thread);
    if (!block) return false;
    for (int i = 0; i < f->n_threads; i++) {
        float *base = (float *)(block + (size_t)i * per_thread);
        f->ts[i].weights = base;
        f->ts[i].iscore = base + (size_t)ATTN_GROUP * cand;
        f->ts[i].rows = (const float **)(base + floats);
    }
    free(f->ts_block);
    f->ts_block = block;
    f->rows_cap = rows;
    return true;
}

static bool grow_head(cpu *f, int rows) {
    if (rows <= f->head_cap) return true;
    float *p = malloc((size_t)rows * f->c->n_vocab * sizeof(float));
    if (!p) return false;
    free(f->head_logits);
    f->head_logits = p;
    f->head_cap = rows;
    return true;
}

/* Output head (sheet 6.10) for the n batch rows listed in `rows` into logits (n x vocab). */
enum { HEAD_CHUNK = 16 };
static void head(batch *b, const int *rows, int n, float *logits) {
    cpu *f = b->f;
    batch_scratch *s = &f->s;
    const ds4_config *c = f->c;
    const ds4_model *m = f->m;
    const int n_hc = c->n_hc, E = c->n_embd;
    const size_t hcE = (size_t)n_hc * E;
    for (int i = 0; i < n; i++) {
        memcpy(s->hc_flat + i * hcE, s->hc_state + (size_t)rows[i] * hcE, hcE * sizeof(float));
        rmsnorm(s->hc_flat + i * hcE, (int)hcE, NULL, c->rms_eps);
    }
    linear(f, &m->output_hc_fn, 0, 0, n_hc, s->hc_flat, (int64_t)hcE, n, s->hc_mix);
    for (int i = 0; i < n; i++) {
        float pre[64], *hidden = s->normed + (size_t)i * E;
        ds4_hc_head_weights(s->hc_mix + (size_t)i * n_hc, m->output_hc_scale[0], m->output_hc_base, n_hc, c->hc_eps, pre);
        ds4_hc_collapse(pre, s->hc_state + (size_t)rows[i] * hcE, n_hc, E, hidden);
        rmsnorm(hidden, E, m->output_norm, c->rms_eps);
    }
    if (!f->split.send) {
        linear(f, &m->output, 0, 0, c->n_vocab, s->normed, E, n, logits);
        return;
    }
    /* tensor parallelism: rank 0 computes the vocabulary's first half, rank
     * 1 the rest and sends it (rank 1 has no logits to write), HEAD_CHUNK
     * rows at a time so the buffers stay small; every logit is the single
     * process's */
    const int V = c->n_vocab, vh = V / 2, v0 = f->split.rank ? vh : 0, v1 = f->split.rank ? V : vh;
    for (int i0 = 0; i0 < n; i0 += HEAD_CHUNK) {
        const int nc = n - i0 < HEAD_CHUNK ? n - i0 : HEAD_CHUNK;
        linear(f, &m->output, 0, v0, v1 - v0, s->normed + (size_t)i0 * E, E, nc, f->head_own);
        const int gate = ds4_split_gate(c->n_layer, b->head_gate++);
        if (f->split.rank) {
            ds4_split_exchange(&f->split, gate, f->head_own, (size_t)nc * (V - vh), NULL, 0);
            continue;
        }
        ds4_split_exchange(&f->split, gate, NULL, 0, f->head_other, (size_t)nc * (V - vh));
        for (int i = 0; i < nc; i++) {
            float *row = logits + (size_t)(i0 + i) * V;
            memcpy(row, f->head_own + (size_t)i * vh, (size_t)vh * sizeof(float));
            memcpy(row + vh, f->head_other + (size_t)i * (V - vh), (size_t)(V - vh) * sizeof(float));
        }
    }
}

/* Logits of every sequence: all rows of the all_logits ones straight into
 * their buffers; the last rows of the others together (the output matrix is
 * then read once for all of them) through head_logits. */
static void heads(batch *b) {
    cpu *f = b->f;
    const int V = f->c->n_vocab;
    int *last = f->s.last_rows, n_last = 0;
    for (int q = 0; q < b->n_seqs; q++) {
        const ds4_backend_seq *sq = &b->seqs[q];
        const int row0 = f->s.seq_row0[q];
        if (sq->all_logits) {
            for (int i = 0; i < sq->n; i++) f->s.head_rows[i] = row0 + i;
            head(b, f->s.head_rows, sq->n, sq->logits);
        } else {
            last[n_last++] = row0 + sq->n - 1;
        }
    }
    if (n_last == 1) {
        for (int q = 0; q < b->n_seqs; q++)
            if (!b->seqs[q].all_logits) head(b, last, 1, b->seqs[q].logits);
        return;
    }
    if (!n_last) return;
    head(b, last, n_last, f->head_logits);
    if (f->split.send && f->split.rank) return;   /* rank 1 wrote no logits */
    for (int q = 0, i = 0; q < b->n_seqs; q++)
        if (!b->seqs[q].all_logits)
            memcpy(b->seqs[q].logits, f->head_logits + (size_t)i++ * V, (size_t)V * sizeof(float));
}

static void embed(const cpu *f, int32_t tok, float *out) {
    const ds4_tensor *emb = &f->m->token_embd;
    ds4_dequantize_row(emb->type, (const char *)emb->data + (size_t)tok * emb->row_bytes, out, f->c->n_embd);
}

/* An MTP block's input (sheet section 13): every stream k of row t is
 * e_proj(RMSNorm(embed(token); enorm)) + h_proj(RMSNorm(hidden_in[k]; hnorm)),
 * the streams of all rows going through h_proj as one batch of T * n_hc rows. */
static void mtp_input(batch *b) {
    cpu *f = b->f;
    batch_scratch *s = &f->s;
    const ds4_model *m = f->m;
    const int E = f->c->n_embd, n_hc = f->c->n_hc, T = b->T;
    const size_t hcE = (size_t)n_hc * E;
    for (int t = 0; t < T; t++) {
        const int q = s->row_seq[t];
        const float *h = b->seqs[q].hidden_in + (size_t)(t - s->seq_row0[q]) * hcE;
        for (int k = 0; k < n_hc; k++)
            ds4_rmsnorm(h + (size_t)k * E, m->mtp_hnorm, E, f->c->rms_eps, DS4_RMS_F64, s->hc_flat + t * hcE + (size_t)k * E);
        float *e = s->normed + (size_t)t * E;
        embed(f, s->tokens[t], e);
        rmsnorm(e, E, m->mtp_enorm, f->c->rms_eps);
    }
    linear(f, &m->mtp_h_proj, 0, 0, E, s->hc_flat, E, T * n_hc, s->hc_state);
    linear(f, &m->mtp_e_proj, 0, 0, E, s->normed, E, T, s->sublayer_out);
    for (int t = 0; t < T; t++)
        for (int k = 0; k < n_hc; k++) {
            float *streams = s->hc_state + t * hcE + (size_t)k * E;
            const float *e = s->sublayer_out + (size_t)t * E;
            for (int d = 0; d < E; d++) streams[d] = e[d] + streams[d];
        }
}

/* The layer just run, for the sequences that keep its output (ring_layers):
 * the mean of each row's streams into the row's slot. */
static void keep_layer_means(batch *b) {
    batch_scratch *s = &b->f->s;
    const int E = b->f->c->n_embd, n_hc = b->f->c->n_hc;
    for (int t = 0; t < b->T; t++) {
        const ds4_backend_seq *sq = &b->seqs[s->row_seq[t]];
        int i = 0;
        while (sq->layer_ring && i < sq->n_ring_layers && sq->ring_layers[i] != b->l) i++;
        if (!sq->layer_ring || i == sq->n_ring_layers) continue;
        const float *streams = s->hc_state + (size_t)t * n_hc * E;
        float *out = sq->layer_ring + ((size_t)(s->row_pos[t] % sq->layer_ring_slots) * sq->n_ring_layers + i) * E;
        for (int e = 0; e < E; e++) {
            float sum = 0;
            for (int k = 0; k < n_hc; k++) sum += streams[(size_t)k * E + e];
            out[e] = sum / (float)n_hc;
        }
    }
}

static int cpu_eval(ds4_backend *be, const ds4_backend_seq *seqs, int n_seqs, char *err, size_t errlen) {
    cpu *f = (cpu *)be;
    const ds4_config *c = f->c;
    const ds4_layer_slice *sl = &f->m->slice;
    int T = 0, max_ctx = 0, n_last = 0, n_state_only = 0;
    for (int q = 0; q < n_seqs; q++) {
        const ds4_backend_seq *sq = &seqs[q];
        n_state_only += sq->state_only;
        if (sq->n <= 0 || sq->kv->n_pos + sq->n > sq->kv->ctx) {
            snprintf(err, errlen, "sequence %d: %d tokens at position %d do not fit its context of %d", q, sq->n,
                     sq->kv->n_pos, sq->kv->ctx);
            return -1;
        }
        for (int j = 0; j < q; j++)
            if (seqs[j].kv == sq->kv) { snprintf(err, errlen, "one state appears twice in a batch"); return -1; }
        for (int i = 0; i < sq->n; i++)
            if (sq->toks[i] < 0 || sq->toks[i] >= c->n_vocab) {
                snprintf(err, errlen, "token id %d out of range [0, %d)", sq->toks[i], c->n_vocab);
                return -1;
            }
        const bool takes_hidden = sl->first > 0 || f->m->mtp;
        if ((takes_hidden && !sq->hidden_in) || (!sl->output && !sq->hidden_out)) {
            snprintf(err, errlen, "sequence %d: the layer slice %d..%d needs hidden states %s", q, sl->first,
                     sl->last, takes_hidden && !sq->hidden_in ? "in" : "out");
            return -1;
        }
        T += sq->n;
        if (sq->kv->ctx > max_ctx) max_ctx = sq->kv->ctx;
        n_last += !sq->all_logits;
    }
    if (T == 0) return 0;
    const bool state_only = n_state_only > 0;
    if (state_only && (n_state_only < n_seqs || !f->m->mtp || sl->first != sl->last || ds4_cfg_ratio(c, sl->first))) {
        snprintf(err, errlen, "state-only rows need a batch of them alone on a window-only MTP block");
        return -1;
    }
    if (T > be->max_batch) {
        snprintf(err, errlen, "a batch of %d rows exceeds the backend's %d", T, be->max_batch);
        return -1;
    }
    if (!grow_batch(f, T) || !grow_rows(f, max_ctx) || (n_last > 1 && !grow_head(f, n_last))) {
        snprintf(err, errlen, "out of memory for a batch of %d rows", T);
        return -1;
    }
    batch b = {f, seqs, n_seqs, T, 0, NULL, NULL, 0, 0, c->n_head, 0, 0, 0};
    batch_scratch *s = &f->s;
    const int E = c->n_embd, n_hc = c->n_hc;
    for (int q = 0, t = 0; q < n_seqs; q++) {
        s->seq_row0[q] = t;
        for (int i = 0; i < seqs[q].n; i++, t++) {
            s->tokens[t] = seqs[q].toks[i];
            s->row_seq[t] = q;
            s->row_pos[t] = seqs[q].kv->n_pos + i;
        }
    }
    const size_t hcE = (size_t)n_hc * E;
    for (int t = 0; t < T; t++) {
        float *streams = s->hc_state + (size_t)t * hcE;
        const int q = s->row_seq[t];
        if (sl->first > 0) {
            memcpy(streams, seqs[q].hidden_in + (size_t)(t - s->seq_row0[q]) * hcE, hcE * sizeof(float));
        } else if (!f->m->mtp) {
            embed(f, s->tokens[t], streams);
            for (int k = 1; k < n_hc; k++) memcpy(streams + (size_t)k * E, streams, (size_t)E * sizeof(float));
        }
        for (int kind = 0; kind < 2; kind++)
            rope_table(f, kind, s->row_pos[t], s->rope_cs + ((size_t)t * 2 + kind) * c->n_rot);
    }
    if (f->m->mtp) mtp_input(&b);
    if (state_only) {
        b.l = sl->first;
        kv_rows(&b);
        for (int q = 0; q < n_seqs; q++) seqs[q].kv->n_pos += seqs[q].n;
        return 0;
    }
    if (f->experts && f->predict && T * c->n_expert_used < c->n_expert && f->m->layers[sl->first].tid2eid)
        predict_experts(&b, sl->first);
    for (b.l = sl->first; b.l <= sl->last; b.l++) {
        attention(&b);
        ffn(&b);
        keep_layer_means(&b);
        if (f->experts && ds4_expert_cache_take_error(f->experts, err, errlen)) return -1;
        ds4_power_pause(&be->power);
    }
    for (int t = 0; t < T; t++) {
        const ds4_backend_seq *sq = &seqs[s->row_seq[t]];
        if (sq->hc_ring)
            memcpy(sq->hc_ring + (size_t)(s->row_pos[t] % sq->hc_ring_slots) * hcE, s->hc_state + (size_t)t * hcE,
                   hcE * sizeof(float));
    }
    for (int q = 0; q < n_seqs; q++) seqs[q].kv->n_pos += seqs[q].n;
    if (sl->output) heads(&b);
    else
        for (int q = 0; q < n_seqs; q++)
            memcpy(seqs[q].hidden_out, s->hc_state + (size_t)s->seq_row0[q] * hcE, (size_t)seqs[q].n * hcE * sizeof(float));
    return 0;
}

/* --------------------------------------------------------------- creation */

static void cpu_free(ds4_backend *be) {
    cpu *f = (cpu *)be;
    if (!f) return;
    if (f->owns_pool) ds4_pool_free(f->pool);
    free(f->inv_freq[0]); free(f->inv_freq[1]);
    free(f->comp_cs);
    free(f->s_block);
    free(f->head_logits);
    free(f->head_own);
    free(f->head_other);
    free(f->ts_block);
    free(f->ts);
    free(f);
}

/* Inverse frequencies as the reference computes them in f32: plain RoPE, or
 * YaRN (ramp between the beta_fast/beta_slow correction dims, no magnitude
 * scaling) for compressed layers (sheet 6.4). */
float *ds4_rope_inv_freq(const ds4_config *c, bool yarn) {
    const int n = c->n_rot / 2;
    float *inv = malloc((size_t)n * sizeof(float));
    if (!inv) return NULL;
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
ds4_pool *ds4_cpu_backend_pool(ds4_backend *be) { return ((cpu *)be)->pool; }
void ds4_cpu_backend_observe(ds4_backend *be, ds4_matmul_observer fn, void *ud) {
    ((cpu *)be)->observe = fn;
    ((cpu *)be)->observe_ud = ud;
}
bool ds4_cpu_backend_split(ds4_backend *be, const ds4_cpu_split *sp) {
    cpu *f = (cpu *)be;
    const size_t half = (size_t)HEAD_CHUNK * (f->c->n_vocab - f->c->n_vocab / 2);
    free(f->head_own);
    free(f->head_other);
    f->head_own = malloc(half * sizeof(float));
    f->head_other = malloc(half * sizeof(float));
    if (!f->head_own || !f->head_other) return false;
    f->split = *sp;
    f->split_heads = ds4_cpu_split_heads(f->c);
    f->cap = 0;   /* the next batch lays its scratch out with the exchange buffers */
    return true;
}

bool ds4_cpu_split_heads(const ds4_config *c) { return c->o_groups % 2 == 0 && c->n_embd % 2 == 0; }
void ds4_cpu_backend_stream_experts(ds4_backend *be, ds4_expert_cache *experts, bool predict) {
    ((cpu *)be)->experts = experts;
    ((cpu *)be)->predict = predict;
}

static ds4_backend *cpu_new(const ds4_model *m, ds4_pool *shared, int n_threads, int max_batch, bool numerics,
                            char *err, size_t errlen) {
    if (numerics && !ds4_cpu_numerics_supported(&m->cfg)) {
        snprintf(err, errlen, "ds4 numerics need non-rotary dims a multiple of 64 and a power-of-two indexer head");
        return NULL;
    }
    if (m->cfg.n_hc > 64) { snprintf(err, errlen, "more than 64 hyper-connection streams"); return NULL; }
    cpu *f = calloc(1, sizeof *f);
    if (!f) { snprintf(err, errlen, "out of memory for the CPU backend"); return NULL; }
    f->base.name = "cpu";
    f->base.max_batch = max_batch > 0 ? max_batch : 1;
    f->base.eval = cpu_eval;
    f->base.free = cpu_free;
    f->m = m;
    f->c = &m->cfg;
    f->numerics = numerics;
    f->mixn = (2 + m->cfg.n_hc) * m->cfg.n_hc;
    f->owns_pool = !shared;
    f->pool = shared ? shared : ds4_pool_new(n_threads);
    f->n_threads = ds4_pool_threads(f->pool);
    f->base.power.threads = f->n_threads;   /* --power counts this pool's CPU time */
    f->ts = calloc((size_t)f->n_threads, sizeof(thread_scratch));
    f->inv_freq[ROPE_MAIN] = ds4_rope_inv_freq(&m->cfg, false);
    f->inv_freq[ROPE_COMPRESS] = ds4_rope_inv_freq(&m->cfg, true);
    f->comp_cs = malloc((size_t)m->cfg.n_rot * sizeof(float));
    if (!f->pool) { cpu_free(&f->base); snprintf(err, errlen, "cannot create the thread pool"); return NULL; }
    if (!f->ts || !f->inv_freq[ROPE_MAIN] || !f->inv_freq[ROPE_COMPRESS] || !f->comp_cs) {
        cpu_free(&f->base);
        snprintf(err, errlen, "out of memory for the CPU backend");
        return NULL;
    }
    return &f->base;
}

ds4_backend *ds4_cpu_backend_new(const ds4_model *m, int n_threads, int max_batch, bool numerics,
                                 char *err, size_t errlen) {
    return cpu_new(m, NULL, n_threads, max_batch, numerics, err, errlen);
}

ds4_backend *ds4_cpu_backend_new_sibling(const ds4_model *m, ds4_backend *host, int max_batch, bool numerics,
                                         char *err, size_t errlen) {
    if (strcmp(host->name, "cpu")) {
        snprintf(err, errlen, "a sibling CPU backend needs a CPU host backend, not %s", host->name);
        return NULL;
    }
    ds4_backend *be = cpu_new(m, ((cpu *)host)->pool, 0, max_batch, numerics, err, errlen);
    /* pacing is the host's: both run on its threads */
    if (be) be->power = host->power;
    return be;
}
