/* glm_forward.c -- GLM 5.2 reference forward pass (see glm_forward.h). */
#include "glm_forward.h"
#include "glm_model.h"
#include "kernels_cpu.h"
#include "quant.h"
#include "threadpool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GLM_LATENT_NORM_EPS 1e-6f
#define GLM_INDEXER_NORM_EPS 1e-6f

typedef struct {
    struct ds4_pool *pool;
    void *act;                     /* one quantized activation row */
} ctx;

/* y[rows] = W[row0 .. row0+rows) . x for matrix `mat` of a (stacked) tensor. */
static void mv(ctx *c, const ds4_tensor *w, int64_t mat, int64_t row0, int64_t rows, const float *x, float *y) {
    const int64_t n = w->ne[0];
    ds4_quantize_act(w->type, x, c->act, n);
    const char *base = (const char *)w->data + ((size_t)mat * (size_t)w->ne[1] + (size_t)row0) * w->row_bytes;
    ds4_matvec(c->pool, w->type, base, rows, n, c->act, y);
}

static void rms(const float *x, const float *w, float eps, int n, float *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static void layer_norm(float *x, const float *w, const float *b, float eps, int n) {
    double mu = 0, var = 0;
    for (int i = 0; i < n; i++) mu += x[i];
    mu /= n;
    for (int i = 0; i < n; i++) var += (x[i] - mu) * (x[i] - mu);
    const float r = 1.0f / sqrtf((float)(var / n) + eps);
    for (int i = 0; i < n; i++) x[i] = (float)(x[i] - mu) * r * w[i] + b[i];
}

/* Adjacent pairs (x[2i], x[2i+1]) rotated by pos * base^(-2i/d). */
static void rope(float *x, int d, int pos, float base) {
    for (int i = 0; i < d / 2; i++) {
        const float inv = 1.0f / powf(base, (float)(2 * i) / (float)d);
        const float ang = (float)pos * inv, cs = cosf(ang), sn = sinf(ang);
        const float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cs - x1 * sn;
        x[2 * i + 1] = x0 * sn + x1 * cs;
    }
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

static float dot(const float *a, const float *b, int n) {
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Indices of the k largest of v[0..n), ties to the lower index. */
static void top_k(const float *v, int n, int k, int *out) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            bool taken = false;
            for (int q = 0; q < j; q++) taken |= out[q] == i;
            if (!taken && (best < 0 || v[i] > v[best])) best = i;
        }
        out[j] = best;
    }
}

typedef struct {
    float *x, *a, *qr, *q, *lat, *kpe, *qlat, *obar, *attn, *h, *y, *ffn, *tmp, *tmp2, *score;
    float *ik, *iq, *iw;           /* indexer keys [n][ID], one query [IH*ID], head weights [IH] */
    unsigned char *sel;            /* [n][n] selected keys of the last full layer */
    int *pick;
} scratch;

static void indexer(ctx *c, const glm_model *m, const glm_layer *L, scratch *s, int n) {
    const glm_hparams *hp = &m->hp;
    const int E = (int)hp->n_embd, IH = (int)hp->idx_n_head, ID = (int)hp->idx_head_dim, R = (int)hp->n_rot;
    const int LQ = (int)hp->q_lora_rank;
    for (int t = 0; t < n; t++) {
        float *k = s->ik + (size_t)t * ID;
        mv(c, &L->idx_k, 0, 0, ID, s->a + (size_t)t * E, k);
        layer_norm(k, L->idx_k_norm, L->idx_k_norm_b, GLM_INDEXER_NORM_EPS, ID);
        rope(k, R, t, hp->rope_base);
    }
    for (int t = 0; t < n; t++) {
        mv(c, &L->idx_q_b, 0, 0, (int64_t)IH * ID, s->qr + (size_t)t * LQ, s->iq);
        for (int j = 0; j < IH; j++) {
            rope(s->iq + (size_t)j * ID, R, t, hp->rope_base);
            s->iw[j] = dot(L->idx_proj + (size_t)j * E, s->a + (size_t)t * E, E);
        }
        for (int u = 0; u <= t; u++) {
            float sc = 0;
            for (int j = 0; j < IH; j++) {
                const float qk = dot(s->iq + (size_t)j * ID, s->ik + (size_t)u * ID, ID) / sqrtf((float)ID);
                sc += s->iw[j] * (qk > 0 ? qk : 0);
            }
            s->score[u] = sc / sqrtf((float)IH);
        }
        const int k = (int)hp->idx_topk < t + 1 ? (int)hp->idx_topk : t + 1;
        top_k(s->score, t + 1, k, s->pick);
        unsigned char *row = s->sel + (size_t)t * n;
        memset(row, 0, (size_t)n);
        for (int j = 0; j < k; j++) row[s->pick[j]] = 1;
    }
}

static void attention(ctx *c, const glm_model *m, const glm_layer *L, scratch *s, int n) {
    const glm_hparams *hp = &m->hp;
    const int E = (int)hp->n_embd, H = (int)hp->n_head, R = (int)hp->n_rot, LQ = (int)hp->q_lora_rank;
    const int LKV = (int)hp->kv_lora_rank, DK = (int)hp->key_length_mla, nope = DK - R, DV = (int)hp->value_length_mla;
    const float scale = 1.0f / sqrtf((float)DK);
    for (int t = 0; t < n; t++) {
        float *kv = s->tmp;
        mv(c, &L->kv_a_mqa, 0, 0, LKV + R, s->a + (size_t)t * E, kv);
        rms(kv, L->kv_a_norm, GLM_LATENT_NORM_EPS, LKV, s->lat + (size_t)t * LKV);
        memcpy(s->kpe + (size_t)t * R, kv + LKV, (size_t)R * sizeof(float));
        rope(s->kpe + (size_t)t * R, R, t, hp->rope_base);
    }
    for (int t = 0; t < n; t++) {
        mv(c, &L->q_b, 0, 0, (int64_t)H * DK, s->qr + (size_t)t * LQ, s->q);
        for (int h = 0; h < H; h++) {
            float *qh = s->q + (size_t)h * DK;
            rope(qh + nope, R, t, hp->rope_base);
            mv(c, &L->k_b, h, 0, LKV, qh, s->qlat);              /* W_k,h^T q_nope */
            const unsigned char *row = s->sel + (size_t)t * n;
            float mx = -INFINITY;
            for (int u = 0; u <= t; u++) {
                s->score[u] = row[u] ? scale * (dot(s->qlat, s->lat + (size_t)u * LKV, LKV) +
                                                dot(qh + nope, s->kpe + (size_t)u * R, R)) : -INFINITY;
                if (s->score[u] > mx) mx = s->score[u];
            }
            double den = 0;
            for (int u = 0; u <= t; u++) den += s->score[u] = row[u] ? expf(s->score[u] - mx) : 0.0f;
            memset(s->obar, 0, (size_t)LKV * sizeof(float));
            for (int u = 0; u <= t; u++) {
                if (!row[u]) continue;
                const float p = (float)(s->score[u] / den);
                const float *lu = s->lat + (size_t)u * LKV;
                for (int i = 0; i < LKV; i++) s->obar[i] += p * lu[i];
            }
            mv(c, &L->v_b, h, 0, DV, s->obar, s->attn + (size_t)h * DV);
        }
        mv(c, &L->attn_output, 0, 0, E, s->attn, s->h + (size_t)t * E);
    }
}

static void swiglu(ctx *c, const ds4_tensor *gate, const ds4_tensor *up, const ds4_tensor *down, int64_t mat,
                   const float *y, scratch *s, float *out) {
    const int64_t F = gate->ne[1];
    mv(c, gate, mat, 0, F, y, s->tmp);
    mv(c, up, mat, 0, F, y, s->tmp2);
    for (int64_t i = 0; i < F; i++) s->tmp[i] = silu(s->tmp[i]) * s->tmp2[i];
    mv(c, down, mat, 0, down->ne[1], s->tmp, out);
}

static void moe(ctx *c, const glm_model *m, const glm_layer *L, scratch *s, const float *y, float *out) {
    const glm_hparams *hp = &m->hp;
    const int E = (int)hp->n_embd, X = (int)hp->n_expert, K = (int)hp->n_expert_used;
    float *prob = s->score, *choice = s->score + X, *eo = s->attn;
    for (int e = 0; e < X; e++) {
        prob[e] = 1.0f / (1.0f + expf(-dot(L->gate_inp + (size_t)e * E, y, E)));
        choice[e] = prob[e] + (L->exp_probs_b ? L->exp_probs_b[e] : 0.0f);
    }
    top_k(choice, X, K, s->pick);
    float sum = 0;
    for (int j = 0; j < K; j++) sum += prob[s->pick[j]];
    swiglu(c, &L->gate_shexp, &L->up_shexp, &L->down_shexp, 0, y, s, out);
    for (int j = 0; j < K; j++) {
        float w = prob[s->pick[j]];
        if (hp->expert_weights_norm) w /= sum + 1e-20f;
        w *= hp->expert_weights_scale;
        swiglu(c, &L->gate_exps, &L->up_exps, &L->down_exps, s->pick[j], y, s, eo);
        for (int i = 0; i < E; i++) out[i] += w * eo[i];
    }
}

static void free_scratch(scratch *s) {
    float *f[] = {s->x, s->a, s->qr, s->q, s->lat, s->kpe, s->qlat, s->obar, s->attn, s->h, s->y, s->ffn,
                  s->tmp, s->tmp2, s->score, s->ik, s->iq, s->iw};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    free(s->sel);
    free(s->pick);
}

int glm_forward_sequence(const glm_model *m, struct ds4_pool *pool, const int32_t *tokens, int n, float *logits,
                         char *err, size_t errlen) {
    const glm_hparams *hp = &m->hp;
    const size_t E = hp->n_embd, H = hp->n_head, T = (size_t)n, V = hp->n_vocab;
    /* the widest single-token row any step reads or writes */
    const size_t dims[] = {E, hp->dense_ff, hp->expert_ff, H * hp->key_length_mla, H * hp->value_length_mla, hp->q_lora_rank,
                           (size_t)hp->kv_lora_rank + hp->n_rot, (size_t)hp->idx_n_head * hp->idx_head_dim};
    size_t big = 0;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) big = dims[i] > big ? dims[i] : big;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || (uint32_t)tokens[t] >= hp->n_vocab) {
            snprintf(err, errlen, "token id %d at position %d is outside the vocabulary (%u)", tokens[t], t,
                     hp->n_vocab);
            return -1;
        }
    const size_t X2 = 2 * (size_t)hp->n_expert;   /* router probabilities + selection scores */
    scratch s = {
        .x = malloc(T * E * sizeof(float)), .a = malloc(T * E * sizeof(float)),
        .qr = malloc(T * hp->q_lora_rank * sizeof(float)), .q = malloc(big * sizeof(float)),
        .lat = malloc(T * hp->kv_lora_rank * sizeof(float)), .kpe = malloc(T * hp->n_rot * sizeof(float)),
        .qlat = malloc(hp->kv_lora_rank * sizeof(float)), .obar = malloc(hp->kv_lora_rank * sizeof(float)),
        .attn = malloc((H * hp->value_length_mla > E ? H * hp->value_length_mla : E) * sizeof(float)),
        .h = malloc(T * E * sizeof(float)), .y = malloc(E * sizeof(float)), .ffn = malloc(E * sizeof(float)),
        .tmp = malloc(big * sizeof(float)), .tmp2 = malloc(big * sizeof(float)),
        .score = malloc((T > X2 ? T : X2) * sizeof(float)),
        .ik = malloc(T * hp->idx_head_dim * sizeof(float)),
        .iq = malloc((size_t)hp->idx_n_head * hp->idx_head_dim * sizeof(float)),
        .iw = malloc(hp->idx_n_head * sizeof(float)), .sel = malloc(T * T),
        .pick = malloc(((T > hp->n_expert ? T : hp->n_expert) + 1) * sizeof(int)),
    };
    /* one activation row of the widest input, in the largest per-type form */
    static const uint32_t types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0, DS4_TYPE_Q2_K,
                                     DS4_TYPE_Q3_K, DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K, DS4_TYPE_IQ2_XXS};
    size_t act = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const size_t b = ds4_act_bytes(types[i], (int64_t)big);
        act = b > act ? b : act;
    }
    ctx c = {.pool = pool, .act = malloc(act)};
    if (!s.x || !s.a || !s.qr || !s.q || !s.lat || !s.kpe || !s.qlat || !s.obar || !s.attn || !s.h || !s.y ||
        !s.ffn || !s.tmp || !s.tmp2 || !s.score || !s.ik || !s.iq || !s.iw || !s.sel || !s.pick || !c.act) {
        free_scratch(&s);
        free(c.act);
        snprintf(err, errlen, "out of memory for a %d-token GLM forward pass", n);
        return -1;
    }
    for (int t = 0; t < n; t++)
        ds4_dequantize_row(m->token_embd.type, (const char *)m->token_embd.data + (size_t)tokens[t] * m->token_embd.row_bytes,
                           s.x + (size_t)t * E, (int64_t)E);
    const uint32_t trunk = glm_n_trunk(hp);
    for (uint32_t l = 0; l < trunk; l++) {
        const glm_layer *L = &m->layers[l];
        for (int t = 0; t < n; t++) {
            rms(s.x + (size_t)t * E, L->attn_norm, hp->rms_eps, (int)E, s.a + (size_t)t * E);
            float *qa = s.tmp;
            mv(&c, &L->q_a, 0, 0, hp->q_lora_rank, s.a + (size_t)t * E, qa);
            rms(qa, L->q_a_norm, GLM_LATENT_NORM_EPS, (int)hp->q_lora_rank, s.qr + (size_t)t * hp->q_lora_rank);
        }
        if (hp->indexer_full[l]) indexer(&c, m, L, &s, n);
        attention(&c, m, L, &s, n);
        for (int t = 0; t < n; t++) {
            float *x = s.x + (size_t)t * E, *h = s.h + (size_t)t * E;
            for (size_t i = 0; i < E; i++) h[i] += x[i];
            rms(h, L->ffn_norm, hp->rms_eps, (int)E, s.y);
            if (glm_block_dense(hp, (int)l)) swiglu(&c, &L->ffn_gate, &L->ffn_up, &L->ffn_down, 0, s.y, &s, s.ffn);
            else moe(&c, m, L, &s, s.y, s.ffn);
            for (size_t i = 0; i < E; i++) x[i] = h[i] + s.ffn[i];
        }
    }
    for (int t = 0; t < n; t++) {
        rms(s.x + (size_t)t * E, m->output_norm, hp->rms_eps, (int)E, s.y);
        mv(&c, &m->output, 0, 0, (int64_t)V, s.y, logits + (size_t)t * V);
    }
    free_scratch(&s);
    free(c.act);
    return 0;
}
