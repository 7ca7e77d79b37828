/* glm_forward.c -- GLM 5.2 forward pass over a session state (see glm_forward.h). */
#include "models/glm/glm_forward.h"
#include "models/glm/glm_kv.h"
#include "models/glm/glm_model.h"
#include "kernels/kernels_cpu.h"
#include "nn/nn_math.h"
#include "nn/steering.h"
#include "kernels/quant.h"
#include "base/power.h"
#include "base/threadpool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GLM_LATENT_NORM_EPS 1e-6f
#define GLM_INDEXER_NORM_EPS 1e-6f
/* Last-token rows of different runs sharing one output-head product (bounds
 * the head's scratch: HEAD_ROWS x n_vocab floats). */
#define HEAD_ROWS 16

typedef struct head_scratch {
    float *qlat, *obar, *score;
    void *act;
} head_scratch;

/* Row scratch is [max_rows][width]; position scratch grows with the longest
 * state seen (pos_cap). */
struct glm_forward {
    const glm_model *m;
    struct ds4_pool *pool;
    int max_rows, pos_cap;
    uint64_t weight_bytes;
    ds4_power *power;                /* paced after every layer (NULL: never) */
    float *rope_inv;                 /* [n_rot/2] inverse frequencies */
    /* per row */
    float *x, *a, *qr, *q, *kvraw, *attn, *h, *y, *ffn, *gate, *up, *iq, *ik;
    glm_kv **row_kv;                 /* [max_rows] the state each row belongs to */
    const ds4_steering **row_steer;  /* [max_rows] its run's steering (NULL: none) */
    ds4_act_probe **row_probe;       /* [max_rows] its run's activation probe (NULL: none) */
    int *row_pos;                    /* [max_rows] its position there */
    int *picks, *n_picks;            /* [max_rows][idx_topk] selected positions (ascending), their counts */
    void *acts;                      /* [max_rows] quantized activation rows of the widest input */
    /* routed experts: [max_rows][n_expert_used] selections, weights and outputs */
    int *experts;
    float *expert_w, *expert_out;
    /* the rows one expert runs over: their inputs ([max_rows][n_embd]) and (row, choice) slots */
    float *expert_in;
    int *expert_slot;
    /* one row at a time */
    float *iw, *router;
    /* per pool thread: one attention head's latent query, output and scores
     * (at most idx_topk keys are attended) and its activation row */
    struct head_scratch *heads;
    int n_heads_scratch;
    /* per position */
    float *score;
    float *head_out;                 /* [HEAD_ROWS][n_vocab] */
    /* tensor parallelism (ds4_glm_forward_split): send NULL = off */
    ds4_cpu_split split;
    bool split_heads;                /* attention's heads and attn_output's rows split too */
    int l, h0, h1;                   /* the layer being evaluated; its heads here: [h0, h1) */
    int head_gate;                   /* the call's head exchanges so far */
    float *tp_send, *tp_recv;        /* [max_rows][split_width()] */
    float *tp_act, *tp_whole;        /* [max_rows][F]: the shared expert's activation, this rank's half and whole */
    float *head_own, *head_other;    /* [HEAD_ROWS][n_vocab - n_vocab / 2] */
};

/* Y[t][0..rows) = matrix `mat` of w times X[t] for t < T (X rows x_stride
 * floats apart); the activation is quantized once per row for w's type and
 * each weight row is read once for the whole batch. */
static void matmul_rows(glm_forward *f, const ds4_tensor *w, int64_t mat, int64_t row0, int64_t rows, int T,
                        const float *X, size_t x_stride, float *Y) {
    ds4_linear(f->pool, f->acts, w, mat, row0, rows, X, (int64_t)x_stride, T, Y);
    f->weight_bytes += (uint64_t)rows * w->row_bytes;
}

static void matmul(glm_forward *f, const ds4_tensor *w, int64_t mat, int T, const float *X, size_t x_stride, float *Y) {
    matmul_rows(f, w, mat, 0, w->ne[1], T, X, x_stride, Y);
}

/* Rows [row0, row0 + rows) of w times X into the columns [row0, row0 +
 * rows) of Y's T rows of y_width floats (a split rank's share of a product
 * whose other columns the other rank computes; all of them without a split). */
static void matmul_cols(glm_forward *f, const ds4_tensor *w, int64_t row0, int64_t rows, int T, const float *X,
                        size_t x_stride, float *Y, size_t y_width) {
    if ((size_t)rows == y_width) {   /* no split: straight into Y */
        matmul_rows(f, w, 0, 0, rows, T, X, x_stride, Y);
        return;
    }
    matmul_rows(f, w, 0, row0, rows, T, X, x_stride, f->tp_recv);
    for (int t = 0; t < T; t++)
        memcpy(Y + (size_t)t * y_width + row0, f->tp_recv + (size_t)t * rows, (size_t)rows * sizeof(float));
}

/* with the root in f32, as transformers' RMSNorm computes GLM's */
static void rms(const float *x, const float *w, float eps, int n, float *y) { ds4_rmsnorm(x, w, n, eps, DS4_RMS_F32, y); }

static void layer_norm(float *x, const float *w, const float *b, float eps, int n) {
    double mu = 0, var = 0;
    for (int i = 0; i < n; i++) mu += x[i];
    mu /= n;
    for (int i = 0; i < n; i++) var += (x[i] - mu) * (x[i] - mu);
    const float r = 1.0f / sqrtf((float)(var / n) + eps);
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] - mu) * r * w[i] + b[i];
}

/* Adjacent pairs (x[2i], x[2i+1]) rotated by pos * base^(-2i/n_rot). */
static void rope(const glm_forward *f, float *x, int pos) {
    const int d = (int)f->m->hp.n_rot;
    for (int i = 0; i < d / 2; i++) {
        const float ang = (float)pos * f->rope_inv[i];
        ds4_rope_pair(x + 2 * i, cosf(ang), sinf(ang));
    }
}

static float dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* The row's indexer selection: the top-k positions of its scores over
 * [0, pos], stored ascending so attention visits keys in position order. */
static void select_keys(glm_forward *f, int pos, int *picks, int *n_picks) {
    const int visible = pos + 1, k = (int)f->m->hp.idx_topk;
    if (visible <= k) {
        for (int u = 0; u < visible; u++) picks[u] = u;
        *n_picks = visible;
        return;
    }
    *n_picks = ds4_topk(f->score, visible, k, picks);
}

typedef struct {
    glm_forward *f;
    const float *iq, *keys;     /* one row's roped queries [IH][ID]; its state's keys */
    int visible;
} index_job;

/* Task `task` of n scores its share of the visible keys (each score is one
 * key's own sum, so the split changes nothing). */
static void index_scores(void *ctx, int task, int n_tasks, int thread) {
    const index_job *j = ctx;
    const glm_hparams *hp = &j->f->m->hp;
    const int IH = (int)hp->idx_n_head, ID = (int)hp->idx_head_dim;
    const int first = (int)((int64_t)j->visible * task / n_tasks), end = (int)((int64_t)j->visible * (task + 1) / n_tasks);
    for (int u = first; u < end; u++) {
        float sc = 0;
        for (int h = 0; h < IH; h++) {
            const float qk = dot(j->iq + (size_t)h * ID, j->keys + (size_t)u * ID, ID) / sqrtf((float)ID);
            sc += j->f->iw[h] * (qk > 0 ? qk : 0);
        }
        j->f->score[u] = sc / sqrtf((float)IH);
    }
}

/* Full layer: the rows' indexer keys into the state, then each row's top-k
 * over every cached key up to its position. */
static void indexer(glm_forward *f, const glm_layer *L, int l, int T) {
    const glm_hparams *hp = &f->m->hp;
    const int E = (int)hp->n_embd, IH = (int)hp->idx_n_head, ID = (int)hp->idx_head_dim, LQ = (int)hp->q_lora_rank;
    const int K = (int)hp->idx_topk;
    matmul(f, &L->idx_k, 0, T, f->a, (size_t)E, f->ik);
    for (int t = 0; t < T; t++) {
        float *k = f->row_kv[t]->idx[l] + (size_t)f->row_pos[t] * ID;
        memcpy(k, f->ik + (size_t)t * ID, (size_t)ID * sizeof(float));
        layer_norm(k, L->idx_k_norm, L->idx_k_norm_b, GLM_INDEXER_NORM_EPS, ID);
        rope(f, k, f->row_pos[t]);
    }
    matmul(f, &L->idx_q_b, 0, T, f->qr, (size_t)LQ, f->iq);
    for (int t = 0; t < T; t++) {
        const int pos = f->row_pos[t];
        const float *keys = f->row_kv[t]->idx[l];
        if (pos + 1 > K) {
            float *iq = f->iq + (size_t)t * IH * ID;
            for (int j = 0; j < IH; j++) {
                rope(f, iq + (size_t)j * ID, pos);
                f->iw[j] = dot(L->idx_proj + (size_t)j * E, f->a + (size_t)t * E, E);
            }
            index_job job = {f, iq, keys, pos + 1};
            ds4_pool_run(f->pool, index_scores, &job, ds4_pool_threads(f->pool));
        }
        select_keys(f, pos, f->picks + (size_t)t * K, &f->n_picks[t]);
    }
}

/* The rows' latent + rope key into the state. */
static void cache_latent(glm_forward *f, const glm_layer *L, int l, int T) {
    const glm_hparams *hp = &f->m->hp;
    const int LKV = (int)hp->kv_lora_rank, R = (int)hp->n_rot, W = LKV + R;
    matmul(f, &L->kv_a_mqa, 0, T, f->a, hp->n_embd, f->kvraw);
    for (int t = 0; t < T; t++) {
        const float *raw = f->kvraw + (size_t)t * W;
        float *row = f->row_kv[t]->rows[l] + (size_t)f->row_pos[t] * W;
        rms(raw, L->kv_a_norm, GLM_LATENT_NORM_EPS, LKV, row);
        memcpy(row + LKV, raw + LKV, (size_t)R * sizeof(float));
        rope(f, row + LKV, f->row_pos[t]);
    }
}

/* y = matrix `mat` of w times x on the calling thread (inside a pool task). */
static void head_mv(const ds4_tensor *w, int64_t mat, const float *x, float *y, void *act) {
    ds4_linear(NULL, act, w, mat, 0, w->ne[1], x, w->ne[0], 1, y);
}

typedef struct {
    glm_forward *f;
    const glm_layer *L;
    int l;
} attend_job;

/* Absorbed MLA for one (row, head) over the row's selected cached positions;
 * tasks run on any thread with that thread's scratch. */
static void attend_head(void *ctx, int task, int n_tasks, int thread) {
    const attend_job *job = ctx;
    glm_forward *f = job->f;
    const glm_hparams *hp = &f->m->hp;
    const int nh = f->h1 - f->h0, t = task / nh, h = f->h0 + task % nh, H = (int)hp->n_head;
    const glm_kv *kv = f->row_kv[t];
    const int R = (int)hp->n_rot, LKV = (int)hp->kv_lora_rank, W = kv->row_width;
    const int DK = (int)hp->key_length_mla, nope = DK - R, DV = (int)hp->value_length_mla;
    const float scale = 1.0f / sqrtf((float)DK);
    const int *picks = f->picks + (size_t)t * hp->idx_topk, n_picks = f->n_picks[t];
    const float *rows = kv->rows[job->l];
    head_scratch *hs = &f->heads[thread];
    float *qh = f->q + ((size_t)t * H + h) * DK;
    rope(f, qh + nope, f->row_pos[t]);
    head_mv(&job->L->k_b, h, qh, hs->qlat, hs->act);                  /* W_k,h^T q_nope */
    float mx = -INFINITY;
    for (int j = 0; j < n_picks; j++) {
        const float *row = rows + (size_t)picks[j] * W;
        hs->score[j] = scale * (dot(hs->qlat, row, LKV) + dot(qh + nope, row + LKV, R));
        if (hs->score[j] > mx) mx = hs->score[j];
    }
    double den = 0;
    for (int j = 0; j < n_picks; j++) den += hs->score[j] = expf(hs->score[j] - mx);
    memset(hs->obar, 0, (size_t)LKV * sizeof(float));
    for (int j = 0; j < n_picks; j++) {
        const float p = (float)(hs->score[j] / den);
        const float *lu = rows + (size_t)picks[j] * W;
        for (int i = 0; i < LKV; i++) hs->obar[i] += p * lu[i];
    }
    head_mv(&job->L->v_b, h, hs->obar, f->attn + ((size_t)t * H + h) * DV, hs->act);
}

/* out[t] = down(silu(gate y[t]) * up y[t]) for T rows of y. */
static void swiglu(glm_forward *f, const ds4_tensor *gate, const ds4_tensor *up, const ds4_tensor *down, int64_t mat,
                   int T, const float *y, float *gate_buf, float *up_buf, float *out) {
    const int64_t F = gate->ne[1], E = f->m->hp.n_embd;
    matmul(f, gate, mat, T, y, (size_t)E, gate_buf);
    matmul(f, up, mat, T, y, (size_t)E, up_buf);
    ds4_swiglu(f->pool, gate_buf, up_buf, T, (int)F, INFINITY);
    matmul(f, down, mat, T, gate_buf, (size_t)F, out);
}

/* Row t's router: its experts in selection order and their weights. */
static void route(glm_forward *f, const glm_layer *L, int t) {
    const glm_hparams *hp = &f->m->hp;
    const int E = (int)hp->n_embd, X = (int)hp->n_expert, K = (int)hp->n_expert_used;
    const float *y = f->y + (size_t)t * E;
    float *prob = f->router, *w = f->expert_w + (size_t)t * K;
    int *chosen = f->experts + (size_t)t * K;
    for (int e = 0; e < X; e++) prob[e] = ds4_sigmoid(dot(L->gate_inp + (size_t)e * E, y, E));
    ds4_route_select(prob, L->exp_probs_b, X, K, chosen);
    float sum = 0;
    for (int j = 0; j < K; j++) sum += prob[chosen[j]];
    for (int j = 0; j < K; j++) {
        w[j] = prob[chosen[j]];
        if (hp->expert_weights_norm) w[j] /= sum + 1e-20f;
        w[j] *= hp->expert_weights_scale;
    }
}

/* rows of w for the shared split (tp_split.h), counted like matmul() */
static void split_rows(void *ctx, const ds4_tensor *w, int64_t row0, int64_t rows, const float *X, size_t x_stride,
                       int T, float *Y) {
    matmul_rows(ctx, w, 0, row0, rows, T, X, x_stride, Y);
}

/* Tensor parallelism, MoE layer: each rank holds half of the shared
 * expert's output columns (ds4_split_shared_end, into tp_send) and its
 * slots' outputs (rank 0 experts < mid, rank 1 the rest). One exchange
 * swaps them, slots packed in slot order; both then hold the whole shared
 * output in ffn and every slot's output, which routed() adds in selection
 * order as one process does. */
static void exchange_ffn(glm_forward *f, const glm_layer *L, int T) {
    const glm_hparams *hp = &f->m->hp;
    const size_t E = hp->n_embd;
    const int K = (int)hp->n_expert_used, mid = f->split.mid, rank = f->split.rank;
    const ds4_split_product pr = {split_rows, f, f->pool};
    ds4_split_shared_end(&f->split, f->l, &pr, &L->down_shexp, T, f->tp_act, f->tp_recv, f->tp_whole, f->tp_send);
    size_t n_lo = 0;
    for (int i = 0; i < T * K; i++) n_lo += f->experts[i] < mid;
    const size_t n_hi = (size_t)T * K - n_lo;
    float *const slots = ds4_split_moe_extra(&f->split, f->tp_send, T, (int)E), *w = slots;
    for (int i = 0; i < T * K; i++)
        if ((f->experts[i] >= mid) == (rank == 1)) {
            memcpy(w, f->expert_out + (size_t)i * E, E * sizeof(float));
            w += E;
        }
    const float *r = ds4_split_moe_exchange(&f->split, f->l, T, (int)E, f->tp_send, (size_t)(w - slots), f->tp_recv,
                                            (rank ? n_lo : n_hi) * E, f->ffn);
    for (int i = 0; i < T * K; i++)
        if ((f->experts[i] >= mid) == (rank == 0)) {
            memcpy(f->expert_out + (size_t)i * E, r, E * sizeof(float));
            r += E;
        }
}

/* Routed experts of T rows added to ffn (which holds the shared expert).
 * Each selected expert runs once over every row that chose it (its weights
 * read once per call); a row then adds its experts' outputs in selection
 * order, so the sum is the same whatever else is in the batch. */
static void routed(glm_forward *f, const glm_layer *L, int T) {
    const glm_hparams *hp = &f->m->hp;
    const int E = (int)hp->n_embd, X = (int)hp->n_expert, K = (int)hp->n_expert_used;
    const bool split = f->split.send != NULL;
    const int lo = split && f->split.rank ? f->split.mid : 0, hi = split && !f->split.rank ? f->split.mid : X;
    for (int t = 0; t < T; t++) route(f, L, t);
    for (int e = lo; e < hi; e++) {
        int m = 0;
        for (int i = 0; i < T * K; i++)
            if (f->experts[i] == e) {
                f->expert_slot[m] = i;
                memcpy(f->expert_in + (size_t)m * E, f->y + (size_t)(i / K) * E, (size_t)E * sizeof(float));
                m++;
            }
        if (!m) continue;
        /* in place: the inputs are consumed by gate/up before down writes */
        swiglu(f, &L->gate_exps, &L->up_exps, &L->down_exps, e, m, f->expert_in, f->gate, f->up, f->expert_in);
        for (int r = 0; r < m; r++)
            memcpy(f->expert_out + (size_t)f->expert_slot[r] * E, f->expert_in + (size_t)r * E, (size_t)E * sizeof(float));
    }
    if (split) exchange_ffn(f, L, T);
    for (int t = 0; t < T; t++) {
        float *out = f->ffn + (size_t)t * E;
        for (int j = 0; j < K; j++) {
            const float w = f->expert_w[(size_t)t * K + j], *eo = f->expert_out + ((size_t)t * K + j) * E;
            for (int i = 0; i < E; i++) out[i] += w * eo[i];
        }
    }
}

static void layer(glm_forward *f, int l, int T) {
    const glm_hparams *hp = &f->m->hp;
    const glm_layer *L = &f->m->layers[l];
    const int E = (int)hp->n_embd, LQ = (int)hp->q_lora_rank, H = (int)hp->n_head;
    const int DK = (int)hp->key_length_mla, DV = (int)hp->value_length_mla;
    const bool split_heads = f->split.send && f->split_heads, rank = f->split.rank;
    f->l = l;
    f->h0 = split_heads && rank ? H / 2 : 0;
    f->h1 = split_heads && !rank ? H / 2 : H;
    for (int t = 0; t < T; t++) rms(f->x + (size_t)t * E, L->attn_norm, hp->rms_eps, E, f->a + (size_t)t * E);
    matmul(f, &L->q_a, 0, T, f->a, (size_t)E, f->q);
    for (int t = 0; t < T; t++)
        rms(f->q + (size_t)t * LQ, L->q_a_norm, GLM_LATENT_NORM_EPS, LQ, f->qr + (size_t)t * LQ);
    cache_latent(f, L, l, T);
    if (hp->indexer_full[l]) indexer(f, L, l, T);
    /* a split rank computes the queries of its heads only */
    matmul_cols(f, &L->q_b, (int64_t)f->h0 * DK, (int64_t)(f->h1 - f->h0) * DK, T, f->qr, (size_t)LQ, f->q,
                (size_t)H * DK);
    attend_job job = {f, L, l};
    ds4_pool_run(f->pool, attend_head, &job, T * (f->h1 - f->h0));
    /* each (row, head) read that head's attn_k_b and attn_v_b matrices */
    f->weight_bytes += (uint64_t)T * (uint64_t)(L->k_b.ne[1] * L->k_b.row_bytes + L->v_b.ne[1] * L->v_b.row_bytes) *
                       (uint64_t)(f->h1 - f->h0);
    if (!split_heads) {
        matmul(f, &L->attn_output, 0, T, f->attn, (size_t)H * DV, f->h);
    } else {
        /* the heads' outputs to the other rank, then each computes half of
         * attn_output's rows and they swap those: f->h is the single
         * process's on both */
        ds4_split_allgather(&f->split, ds4_split_gate(l, DS4_SPLIT_HEADS), f->attn, T, H * DV, f->h0 * DV,
                            f->h1 * DV, f->tp_send, f->tp_recv);
        const ds4_split_product pr = {split_rows, f, f->pool};
        ds4_split_rows(&f->split, ds4_split_gate(l, DS4_SPLIT_ATTN_OUT), &pr, &L->attn_output, f->attn, (size_t)H * DV,
                       T, f->tp_send, f->tp_recv, f->h);
    }
    for (int t = 0; t < T; t++) {
        float *x = f->x + (size_t)t * E, *h = f->h + (size_t)t * E;
        ds4_steer_row(f->row_steer[t], DS4_STEER_ATTN, l, h);
        ds4_probe_row(f->row_probe[t], DS4_STEER_ATTN, l, h);
        for (int i = 0; i < E; i++) h[i] += x[i];
        rms(h, L->ffn_norm, hp->rms_eps, E, f->y + (size_t)t * E);
    }
    if (glm_block_dense(hp, l)) {
        swiglu(f, &L->ffn_gate, &L->ffn_up, &L->ffn_down, 0, T, f->y, f->gate, f->up, f->ffn);
    } else {
        /* the shared expert; split, this rank's half of its activation, sent
         * now so the transfer overlaps the routed experts (exchange_ffn()
         * finishes it) */
        if (!f->split.send) {
            swiglu(f, &L->gate_shexp, &L->up_shexp, &L->down_shexp, 0, T, f->y, f->gate, f->up, f->ffn);
        } else {
            const ds4_split_product pr = {split_rows, f, f->pool};
            ds4_split_shared_begin(&f->split, l, &pr, &L->gate_shexp, &L->up_shexp, INFINITY, f->y, (size_t)E, T,
                                   f->tp_act, f->up);
        }
        routed(f, L, T);
    }
    for (int t = 0; t < T; t++) {
        float *x = f->x + (size_t)t * E, *o = f->ffn + (size_t)t * E;
        const float *h = f->h + (size_t)t * E;
        ds4_steer_row(f->row_steer[t], DS4_STEER_FFN, l, o);
        ds4_probe_row(f->row_probe[t], DS4_STEER_FFN, l, o);
        for (int i = 0; i < E; i++) x[i] = h[i] + o[i];
    }
}

int ds4_glm_forward_prepare(glm_forward *f, const glm_kv *kv, const int32_t *toks, int n, char *err, size_t errlen) {
    const glm_hparams *hp = &f->m->hp;
    if (n < 1) {
        snprintf(err, errlen, "a GLM evaluation needs at least one token");
        return -1;
    }
    if (kv->n_pos + n > kv->ctx) {
        snprintf(err, errlen, "context full: %d + %d tokens exceed ctx %d", kv->n_pos, n, kv->ctx);
        return -1;
    }
    for (int t = 0; t < n; t++)
        if (toks[t] < 0 || (uint32_t)toks[t] >= hp->n_vocab) {
            snprintf(err, errlen, "token id %d at position %d is outside the vocabulary (%u)", toks[t], kv->n_pos + t,
                     hp->n_vocab);
            return -1;
        }
    const int need = kv->n_pos + n;
    if (need <= f->pos_cap) return 0;
    /* the scratch follows the longest state; attention scores reuse it per head */
    float *score = realloc(f->score, (size_t)need * sizeof(float));
    if (!score) {
        snprintf(err, errlen, "out of memory for GLM attention scratch over %d positions", need);
        return -1;
    }
    f->score = score;
    f->pos_cap = need;
    return 0;
}

/* The output head over n rows of f->y from row `first` into out (n x
 * n_vocab). Split: rank 0 computes the vocabulary's first half, rank 1 the
 * rest and sends it (writing nothing), HEAD_ROWS rows per exchange. */
static void head(glm_forward *f, int first, int n, float *out) {
    const size_t E = f->m->hp.n_embd;
    const float *y = f->y + (size_t)first * E;
    if (!f->split.send) {
        matmul(f, &f->m->output, 0, n, y, E, out);
        return;
    }
    const int V = (int)f->m->hp.n_vocab, vh = V / 2, rank = f->split.rank, v0 = rank ? vh : 0, v1 = rank ? V : vh;
    for (int i0 = 0; i0 < n; i0 += HEAD_ROWS) {
        const int nc = n - i0 < HEAD_ROWS ? n - i0 : HEAD_ROWS;
        matmul_rows(f, &f->m->output, 0, v0, v1 - v0, nc, y + (size_t)i0 * E, E, f->head_own);
        const int gate = ds4_split_gate((int)glm_n_trunk(&f->m->hp), f->head_gate++);
        if (rank) {
            ds4_split_exchange(&f->split, gate, f->head_own, (size_t)nc * (V - vh), NULL, 0);
            continue;
        }
        ds4_split_exchange(&f->split, gate, NULL, 0, f->head_other, (size_t)nc * (V - vh));
        for (int i = 0; i < nc; i++) {
            float *row = out + (size_t)(i0 + i) * V;
            memcpy(row, f->head_own + (size_t)i * vh, (size_t)vh * sizeof(float));
            memcpy(row + vh, f->head_other + (size_t)i * (V - vh), (size_t)(V - vh) * sizeof(float));
        }
    }
}

/* The last rows gathered at the front of f->y, one per run in group_run:
 * one head product for all of them, then each run's copy. */
static void head_group(glm_forward *f, const glm_run *runs, const int *group_run, int group) {
    const size_t V = f->m->hp.n_vocab;
    head(f, 0, group, f->head_out);
    if (f->split.send && f->split.rank) return;   /* rank 1 writes no logits */
    for (int g = 0; g < group; g++) memcpy(runs[group_run[g]].logits, f->head_out + g * V, V * sizeof(float));
}

int ds4_glm_forward_eval(glm_forward *f, const glm_run *runs, int n_runs, char *err, size_t errlen) {
    int T = 0;
    for (int r = 0; r < n_runs; r++) {
        if (ds4_glm_forward_prepare(f, runs[r].kv, runs[r].toks, runs[r].n, err, errlen)) return -1;
        for (int q = 0; q < r; q++)
            if (runs[q].kv == runs[r].kv) { snprintf(err, errlen, "one state appears twice in a GLM evaluation"); return -1; }
        T += runs[r].n;
        if (T > f->max_rows) {
            snprintf(err, errlen, "a GLM evaluation takes at most %d rows (got more)", f->max_rows);
            return -1;
        }
    }
    const glm_model *m = f->m;
    const glm_hparams *hp = &m->hp;
    const int E = (int)hp->n_embd;
    f->head_gate = 0;
    for (int r = 0, t = 0; r < n_runs; r++)
        for (int i = 0; i < runs[r].n; i++, t++) {
            f->row_kv[t] = runs[r].kv;
            f->row_steer[t] = runs[r].steer;
            f->row_probe[t] = runs[r].probe;
            f->row_pos[t] = runs[r].kv->n_pos + i;
            ds4_dequantize_row(m->token_embd.type,
                               (const char *)m->token_embd.data + (size_t)runs[r].toks[i] * m->token_embd.row_bytes,
                               f->x + (size_t)t * E, (int64_t)E);
        }
    for (int l = 0; l < (int)glm_n_trunk(hp); l++) {
        layer(f, l, T);
        if (f->power) ds4_power_pause(f->power);
    }
    for (int t = 0; t < T; t++) rms(f->x + (size_t)t * E, m->output_norm, hp->rms_eps, E, f->y + (size_t)t * E);
    /* Every row of an all_logits run goes straight into its buffer. The last
     * rows of the others move to the front of f->y (row `group` <= the run's
     * index <= its first row, so no row still needed is overwritten) and
     * share one head product per HEAD_ROWS: decode rows of several runs read
     * the head's weights once. */
    int group = 0, group_run[HEAD_ROWS];
    for (int r = 0, t = 0; r < n_runs; t += runs[r].n, r++) {
        const glm_run *run = &runs[r];
        run->kv->n_pos += run->n;
        if (!run->head) continue;
        if (run->all_logits) { head(f, t, run->n, run->logits); continue; }
        memmove(f->y + (size_t)group * E, f->y + (size_t)(t + run->n - 1) * E, (size_t)E * sizeof(float));
        group_run[group++] = r;
        if (group == HEAD_ROWS) { head_group(f, runs, group_run, group); group = 0; }
    }
    if (group) head_group(f, runs, group_run, group);
    return 0;
}

int ds4_glm_forward_max_rows(const glm_forward *f) { return f->max_rows; }
void ds4_glm_forward_pace(glm_forward *f, struct ds4_power *power) { f->power = power; }
uint64_t ds4_glm_forward_weight_bytes(const glm_forward *f) { return f->weight_bytes; }

void ds4_glm_forward_free(glm_forward *f) {
    if (!f) return;
    void *owned[] = {f->rope_inv, f->x, f->a, f->qr, f->q, f->kvraw, f->attn, f->h, f->y, f->ffn, f->gate, f->up,
                     f->iq, f->ik, f->picks, f->n_picks, f->acts, f->iw, f->router,
                     f->expert_w, f->expert_in, f->expert_out, f->experts, f->expert_slot, f->score,
                     f->row_kv, f->row_steer, f->row_probe, f->row_pos, f->head_out,
                     f->tp_send, f->tp_recv, f->tp_act, f->tp_whole, f->head_own, f->head_other};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) free(owned[i]);
    for (int i = 0; f->heads && i < f->n_heads_scratch; i++) {
        free(f->heads[i].qlat);
        free(f->heads[i].obar);
        free(f->heads[i].score);
        free(f->heads[i].act);
    }
    free(f->heads);
    free(f);
}

static size_t max_size(const size_t *v, size_t n) {
    size_t best = 0;
    for (size_t i = 0; i < n; i++) best = v[i] > best ? v[i] : best;
    return best;
}

glm_forward *ds4_glm_forward_new(const glm_model *m, struct ds4_pool *pool, int max_rows, char *err, size_t errlen) {
    const glm_hparams *hp = &m->hp;
    glm_forward *f = calloc(1, sizeof *f);
    if (!f) { snprintf(err, errlen, "out of memory for the GLM forward pass"); return NULL; }
    f->m = m;
    f->pool = pool;
    f->max_rows = max_rows;
    const size_t T = (size_t)max_rows, E = hp->n_embd, H = hp->n_head;
    /* widest FFN intermediate of any block (dense, shared expert, one routed expert) */
    size_t F = 0;
    for (uint32_t l = 0; l < glm_n_trunk(hp); l++) {
        const glm_layer *L = &m->layers[l];
        const size_t ff[] = {(size_t)L->ffn_gate.ne[1], (size_t)L->gate_shexp.ne[1], (size_t)L->gate_exps.ne[1]};
        F = max_size((size_t[]){F, max_size(ff, 3)}, 2);
    }
    const size_t q_width = max_size((size_t[]){hp->q_lora_rank, H * hp->key_length_mla}, 2);
    const size_t idx_q = (size_t)hp->idx_n_head * hp->idx_head_dim;
    /* the widest input any product quantizes */
    const size_t widest = max_size((size_t[]){E, F, q_width, H * hp->value_length_mla, hp->kv_lora_rank,
                                              hp->key_length_mla}, 6);
    static const uint32_t types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0, DS4_TYPE_Q2_K,
                                     DS4_TYPE_Q3_K, DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K, DS4_TYPE_IQ2_XXS};
    size_t act_row = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const size_t b = ds4_act_bytes(types[i], (int64_t)widest);
        act_row = b > act_row ? b : act_row;
    }
    f->rope_inv = malloc((hp->n_rot / 2 + 1) * sizeof(float));
    f->x = malloc(T * E * sizeof(float));
    f->a = malloc(T * E * sizeof(float));
    f->qr = malloc(T * hp->q_lora_rank * sizeof(float));
    f->q = malloc(T * q_width * sizeof(float));
    f->kvraw = malloc(T * (hp->kv_lora_rank + hp->n_rot) * sizeof(float));
    f->attn = malloc(T * H * hp->value_length_mla * sizeof(float));
    f->h = malloc(T * E * sizeof(float));
    f->y = malloc(T * E * sizeof(float));
    f->ffn = malloc(T * E * sizeof(float));
    f->gate = malloc(T * F * sizeof(float));
    f->up = malloc(T * F * sizeof(float));
    f->iq = malloc(T * idx_q * sizeof(float));
    f->ik = malloc(T * hp->idx_head_dim * sizeof(float));
    f->row_kv = malloc(T * sizeof(glm_kv *));
    f->row_steer = malloc(T * sizeof(ds4_steering *));
    f->row_probe = malloc(T * sizeof(ds4_act_probe *));
    f->row_pos = malloc(T * sizeof(int));
    f->head_out = malloc((size_t)HEAD_ROWS * hp->n_vocab * sizeof(float));
    f->picks = malloc(T * hp->idx_topk * sizeof(int));
    f->n_picks = malloc(T * sizeof(int));
    f->acts = ds4_kernels_alloc(T * act_row);
    f->n_heads_scratch = ds4_pool_threads(pool);
    f->heads = calloc((size_t)f->n_heads_scratch, sizeof(head_scratch));
    bool heads_ok = f->heads != NULL;
    for (int i = 0; heads_ok && i < f->n_heads_scratch; i++) {
        head_scratch *hs = &f->heads[i];
        hs->qlat = malloc(hp->kv_lora_rank * sizeof(float));
        hs->obar = malloc(hp->kv_lora_rank * sizeof(float));
        hs->score = malloc(((size_t)hp->idx_topk + 1) * sizeof(float));
        hs->act = ds4_kernels_alloc(act_row);
        heads_ok = hs->qlat && hs->obar && hs->score && hs->act;
    }
    f->iw = malloc(hp->idx_n_head * sizeof(float));
    f->router = malloc(((size_t)hp->n_expert + 1) * sizeof(float));
    const size_t K = (size_t)hp->n_expert_used + 1;
    f->expert_w = malloc(T * K * sizeof(float));
    f->expert_in = malloc(T * E * sizeof(float));
    f->expert_out = malloc(T * K * E * sizeof(float));
    f->experts = malloc(T * K * sizeof(int));
    f->expert_slot = malloc(T * K * sizeof(int));
    if (!f->rope_inv || !f->x || !f->a || !f->qr || !f->q || !f->kvraw || !f->attn || !f->h || !f->y || !f->ffn ||
        !f->gate || !f->up || !f->iq || !f->ik || !f->picks || !f->n_picks || !f->acts || !heads_ok ||
        !f->iw || !f->router || !f->expert_w || !f->expert_in || !f->expert_out || !f->experts || !f->expert_slot ||
        !f->row_kv || !f->row_steer || !f->row_probe || !f->row_pos || !f->head_out) {
        snprintf(err, errlen, "out of memory for the GLM forward pass scratch (%d rows)", max_rows);
        ds4_glm_forward_free(f);
        return NULL;
    }
    for (uint32_t i = 0; i < hp->n_rot / 2; i++)
        f->rope_inv[i] = 1.0f / powf(hp->rope_base, (float)(2 * i) / (float)hp->n_rot);
    return f;
}

int ds4_glm_forward_sequence(const glm_model *m, struct ds4_pool *pool, const int32_t *tokens, int n, float *logits,
                         char *err, size_t errlen) {
    if (n < 1) { snprintf(err, errlen, "a GLM forward pass needs at least one token"); return -1; }
    glm_kv *kv = ds4_glm_kv_new(&m->hp, n);
    glm_forward *f = kv ? ds4_glm_forward_new(m, pool, n, err, errlen) : NULL;
    if (!kv) snprintf(err, errlen, "out of memory for a %d-token GLM state", n);
    const glm_run run = {kv, tokens, n, logits, true, true, NULL, NULL};
    const int rc = f ? ds4_glm_forward_eval(f, &run, 1, err, errlen) : -1;
    ds4_glm_forward_free(f);
    ds4_glm_kv_free(kv);
    return rc;
}

bool ds4_glm_split_heads(const glm_model *m) { return m->hp.n_head % 2 == 0 && m->hp.n_embd % 2 == 0; }

bool ds4_glm_forward_split(glm_forward *f, const ds4_cpu_split *sp) {
    const glm_hparams *hp = &f->m->hp;
    const size_t T = (size_t)f->max_rows, E = hp->n_embd, H = hp->n_head, K = hp->n_expert_used;
    size_t F = 0;   /* the widest shared expert */
    for (uint32_t l = 0; l < glm_n_trunk(hp); l++)
        if ((size_t)f->m->layers[l].gate_shexp.ne[1] > F) F = (size_t)f->m->layers[l].gate_shexp.ne[1];
    /* the widest exchange or split product: the heads' queries or outputs,
     * the shared expert's activation, or half its output plus every slot */
    const size_t width = max_size((size_t[]){H * hp->key_length_mla, H * hp->value_length_mla, F, E + K * E}, 4);
    const size_t half = (size_t)HEAD_ROWS * (hp->n_vocab - hp->n_vocab / 2);
    float *send = malloc(T * width * sizeof(float)), *recv = malloc(T * width * sizeof(float));
    float *act = malloc((T * F + 1) * sizeof(float)), *whole = malloc((T * F + 1) * sizeof(float));
    float *own = malloc(half * sizeof(float)), *other = malloc(half * sizeof(float));
    if (!send || !recv || !act || !whole || !own || !other) {
        free(send); free(recv); free(act); free(whole); free(own); free(other);
        return false;
    }
    free(f->tp_send); free(f->tp_recv); free(f->tp_act); free(f->tp_whole); free(f->head_own); free(f->head_other);
    f->tp_send = send;
    f->tp_recv = recv;
    f->tp_act = act;
    f->tp_whole = whole;
    f->head_own = own;
    f->head_other = other;
    f->split = *sp;
    f->split_heads = ds4_glm_split_heads(f->m);
    return true;
}
