/* backend.cu -- the CUDA backend (cuda_backend.h): device setup, placement
 * and upload through cuda_plan, session state mirrors, and the forward pass
 * as the same sequence of steps as forward_cpu.c, each a launch of ops.h. */
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/ops.h"

extern "C" {
#include "base/log.h"
#include "models/dsv4/forward_cpu.h"
#include "kernels/kernels_cpu.h"
#include "models/dsv4/kv.h"
#include "kernels/quant.h"
#include "nn/steering.h"
}

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A session's state on the device: the host ds4_kv's block, same offsets. */
typedef struct {
    ds4_kv *kv;
    char *block;
    float *iscore;                 /* indexer scores: max_batch x comp_cap */
    int comp_cap;
    cudaGraphExec_t decode;        /* captured one-token forward, or NULL */
    bool decode_steer;             /* the graph holds the steering launches */
    uint64_t decode_bytes;         /* weight bytes one replay streams */
} mirror;

enum { MAX_MIRRORS = 64, HEAD_CHUNK = 64 };

/* Device scratch of one batch, the CPU's grow_batch buffers plus the routed
 * pairs (max_batch x n_expert_used rows) the grouped expert products write. */
#define SCRATCH_FLOATS(X) \
    X(S, T * hcE) X(S2, T * hcE) X(flat, T * hcE) X(mix, T * mixn) X(hcw, T * mixn) \
    X(a, T * E) X(x, T * E) X(y, T * E) X(cq, T * c->q_lora) X(q, T * HD) X(o, T * HD) X(kvr, T * D) \
    X(ck, T * 2 * D) X(cz, T * 2 * D) X(ik, T * 2 * DI) X(iz, T * 2 * DI) \
    X(qi, T * c->n_idx_head * DI) X(om, T * c->n_idx_head) X(z, T * c->o_groups * c->o_lora) \
    X(rl, T * c->n_expert) X(ew, J) X(ge, T * F) X(ue, T * F) X(geR, J * F) X(ueR, J * F) X(oe, J * E) \
    X(rope_cs, T * 2 * c->n_rot) X(logits, (size_t)HEAD_CHUNK * c->n_vocab) X(inv_main, c->n_rot / 2) \
    X(inv_comp, c->n_rot / 2)

typedef struct cu {
    ds4_backend base;
    const ds4_model *m;
    const ds4_config *c;
    bool numerics;
    int device;
    cudaStream_t st;
    ds4_upload_plan *plan;
    char *arena;
#define DECL(name, n) float *name;
    SCRATCH_FLOATS(DECL)
#undef DECL
    int32_t *toks, *eidx;
    int *sel, *nsel, *pos0;
    void *act;
    /* directional steering: the engine's directions on the device, uploaded
     * with the first steered sequence (from steer_src), and the running
     * sequence's two scales (attention, FFN), which the launches read */
    float *steer_dir, *steer_scale;
    const float *steer_src;
    float steer_host[2];
    mirror mirrors[MAX_MIRRORS];
} cu;

/* ------------------------------------------------------------ accounting */

static size_t widest_input(const ds4_config *c) {
    const size_t E = c->n_embd, F = c->n_ff_exp, HD = (size_t)c->n_head * c->head_dim;
    size_t ins[] = {(size_t)c->n_hc * E, HD, F, (size_t)c->o_groups * c->o_lora, (size_t)c->q_lora, E};
    size_t w = 0;
    for (size_t i = 0; i < sizeof ins / sizeof ins[0]; i++) w = ins[i] > w ? ins[i] : w;
    return w;
}

/* Bytes of scratch for batches of T tokens (floats, ints, activations). */
static size_t scratch_bytes(const ds4_config *c, size_t T) {
    const size_t E = c->n_embd, hcE = (size_t)c->n_hc * E, D = c->head_dim, HD = (size_t)c->n_head * D;
    const size_t DI = c->idx_head_dim, F = c->n_ff_exp, J = T * c->n_expert_used, mixn = (size_t)(2 + c->n_hc) * c->n_hc;
    size_t n = 0;
#define SUM(name, count) n += ((size_t)(count) * sizeof(float) + DS4_GPU_ALIGN - 1) / DS4_GPU_ALIGN * DS4_GPU_ALIGN;
    SCRATCH_FLOATS(SUM)
#undef SUM
    n += 2 * J * sizeof(int32_t) + T * c->idx_topk * sizeof(int) + (T + 1) * sizeof(int) + T * sizeof(int32_t);
    const size_t acts = T * widest_input(c) > J * F ? T * widest_input(c) : J * F;
    return n + acts * sizeof(float);
}

/* --------------------------------------------------------------- errors */

static bool ok(cudaError_t e, const char *what, char *err, size_t errlen) {
    if (e == cudaSuccess) return true;
    snprintf(err, errlen, "CUDA error in %s: %s", what, cudaGetErrorString(e));
    return false;
}

static const char *device_problem(cudaError_t e) {
    switch (e) {
    case cudaErrorNoDevice: return "no CUDA GPU found";
    case cudaErrorInsufficientDriver: return "the NVIDIA driver is missing or too old for this CUDA build";
    default: return cudaGetErrorString(e);
    }
}

/* ------------------------------------------------------------- pointers */

static const char *dev(const cu *f, const void *host) {
    if (!host) return NULL;
    const int i = ds4_upload_find(f->plan, host);
    return i < 0 ? NULL : f->arena + f->plan->e[i].offset;
}
static const float *devf(const cu *f, const float *host) { return (const float *)dev(f, host); }

static float *kvp(const mirror *mr, const float *host) {
    return host ? (float *)(mr->block + ((const char *)host - (const char *)mr->kv->block)) : NULL;
}

/* ------------------------------------------------------------ the steps */

typedef struct {
    cu *f;
    mirror *mr;
    int T, l;
    bool failed;                   /* a launch was refused (unsupported type) */
    uint64_t bytes;                /* weight bytes the pass's products stream */
} pass;

static void linear_rows(pass *b, const ds4_tensor *W, int64_t row0, int64_t rows, const float *x, int64_t xstride,
                        int T, float *y, int64_t ystride) {
    cu *f = b->f;
    const int64_t n = W->ne[0];
    const char *w = dev(f, W->data) + (size_t)row0 * W->row_bytes;
    if (ds4_cu_quantize_act(W->type, x, xstride, T, n, f->act, f->st) ||
        ds4_cu_matmul(W->type, w, W->row_bytes, rows, n, f->act, T, y, ystride, f->st))
        b->failed = true;
    b->bytes += (uint64_t)rows * W->row_bytes;
    f->base.weight_bytes += (uint64_t)rows * W->row_bytes;
}

static void linear(pass *b, const ds4_tensor *W, const float *x, int64_t xstride, int T, float *y) {
    linear_rows(b, W, 0, W->ne[1], x, xstride, T, y, W->ne[1]);
}

/* Routed experts over the T*k (token, slot) pairs of eidx. */
static void linear_experts(pass *b, const ds4_tensor *W, const float *x, int rows_in, int act_div, float *y) {
    cu *f = b->f;
    const int64_t n = W->ne[0];
    const size_t expert_bytes = (size_t)W->ne[1] * W->row_bytes;
    if (ds4_cu_quantize_act(W->type, x, n, rows_in, n, f->act, f->st) ||
        ds4_cu_matmul_experts(W->type, dev(f, W->data), W->row_bytes, expert_bytes, f->eidx, W->ne[1], n, f->act,
                              act_div, b->T * f->c->n_expert_used, y, W->ne[1], f->st))
        b->failed = true;
    /* one expert matrix per (token, slot) pair: an upper bound when pairs share an expert */
    const uint64_t read = (uint64_t)b->T * f->c->n_expert_used * expert_bytes;
    b->bytes += read;
    f->base.weight_bytes += read;
}

static void hc_pre(pass *b, const ds4_tensor *fn, const float *scale, const float *base, const float *norm) {
    cu *f = b->f;
    const ds4_config *c = f->c;
    const int hcE = c->n_hc * c->n_embd;
    ds4_cu_rmsnorm(f->S, hcE, f->flat, hcE, b->T, hcE, NULL, c->rms_eps, f->st);
    linear(b, fn, f->flat, hcE, b->T, f->mix);
    ds4_cu_hc_pre(f->mix, devf(f, scale), devf(f, base), f->S, f->hcw, f->a, b->T, c->n_hc, c->n_embd,
                  c->sinkhorn_iters, c->hc_eps, f->st);
    ds4_cu_rmsnorm(f->a, c->n_embd, f->x, c->n_embd, b->T, c->n_embd, devf(f, norm), c->rms_eps, f->st);
}

/* Once a steering file is on the device every pass carries the launches;
 * a zero scale makes them leave the rows alone. */
static void steer(pass *b, ds4_steer_site site) {
    cu *f = b->f;
    if (f->steer_dir)
        ds4_cu_steer(f->y, f->steer_dir + (size_t)b->l * f->c->n_embd, f->steer_scale + site, b->T, f->c->n_embd, f->st);
}

static void hc_post(pass *b) {
    cu *f = b->f;
    ds4_cu_hc_post(f->hcw, f->S, f->y, f->S2, b->T, f->c->n_hc, f->c->n_embd, f->st);
    float *t = f->S; f->S = f->S2; f->S2 = t;
}

static void attention(pass *b) {
    cu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    const ds4_kv_layer *L = &b->mr->kv->L[b->l];
    const int T = b->T, E = c->n_embd, D = c->head_dim, HD = c->n_head * D;
    ds4_cu_attn_geom g = {};
    g.T = T; g.n_head = c->n_head; g.head_dim = D; g.n_rot = c->n_rot; g.window = c->window;
    g.raw_cap = b->mr->kv->raw_cap; g.ratio = L->ratio; g.coff = L->coff; g.f_cap = L->f_cap;
    g.idx_head_dim = c->idx_head_dim; g.n_idx_head = c->n_idx_head; g.idx_topk = c->idx_topk;
    g.comp_cap = L->comp_cap; g.rms_eps = c->rms_eps; g.numerics = f->numerics; g.pos0 = f->pos0;
    g.rope_cs = f->rope_cs; g.rope_kind = L->ratio ? 1 : 0; g.inv_freq_comp = f->inv_comp;

    hc_pre(b, &W->hc_attn_fn, W->hc_attn_scale, W->hc_attn_base, W->attn_norm);
    linear(b, &W->q_a, f->x, E, T, f->cq);
    ds4_cu_rmsnorm(f->cq, c->q_lora, f->cq, c->q_lora, T, c->q_lora, devf(f, W->q_a_norm), c->rms_eps, f->st);
    linear(b, &W->q_b, f->cq, c->q_lora, T, f->q);
    linear(b, &W->kv, f->x, E, T, f->kvr);
    ds4_cu_q_prep(&g, f->q, f->kvr, devf(f, W->kv_norm), f->st);

    const bool has_idx = L->ratio && L->idx;
    if (L->ratio) {
        linear(b, &W->comp_kv, f->x, E, T, f->ck);
        linear(b, &W->comp_gate, f->x, E, T, f->cz);
        if (has_idx) {
            linear(b, &W->idx_kv, f->x, E, T, f->ik);
            linear(b, &W->idx_gate, f->x, E, T, f->iz);
        }
        mirror *mr = b->mr;
        ds4_cu_compress(&g, f->ck, f->cz, f->ik, f->iz, devf(f, W->comp_ape), devf(f, W->idx_ape),
                        devf(f, W->comp_norm), devf(f, W->idx_norm), kvp(mr, L->fk), kvp(mr, L->fz),
                        kvp(mr, L->comp), kvp(mr, L->ik), kvp(mr, L->iz), kvp(mr, L->idx), f->st);
        if (has_idx) {
            /* the CPU skips these while every row is visible; the selection is then all rows either way */
            linear(b, &W->idx_q_b, f->cq, c->q_lora, T, f->qi);
            linear(b, &W->idx_proj, f->x, E, T, f->om);
            ds4_cu_indexer(&g, f->qi, f->om, kvp(mr, L->idx), mr->iscore, f->sel, f->nsel, f->st);
        }
    }
    ds4_cu_attention(&g, f->q, f->kvr, kvp(b->mr, L->raw), kvp(b->mr, L->comp), has_idx ? f->sel : NULL, f->nsel,
                     devf(f, W->sinks), f->o, f->st);
    ds4_cu_ring_write(&g, f->kvr, kvp(b->mr, L->raw), f->st);

    const int G = c->o_groups, OL = c->o_lora, gin = HD / G;
    for (int gi = 0; gi < G; gi++)
        linear_rows(b, &W->out_a, (int64_t)gi * OL, OL, f->o + (size_t)gi * gin, HD, T, f->z + (size_t)gi * OL,
                    (int64_t)G * OL);
    linear(b, &W->out_b, f->z, (int64_t)G * OL, T, f->y);
    steer(b, DS4_STEER_ATTN);
    hc_post(b);
}

static void ffn(pass *b) {
    cu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_layer *W = &f->m->layers[b->l];
    const int T = b->T, E = c->n_embd, F = c->n_ff_exp, k = c->n_expert_used;

    hc_pre(b, &W->hc_ffn_fn, W->hc_ffn_scale, W->hc_ffn_base, W->ffn_norm);
    linear(b, &W->gate_inp, f->x, E, T, f->rl);
    ds4_cu_route_geom rg = {T, c->n_expert, k, c->expert_weights_norm, c->expert_weights_scale,
                            (const int32_t *)dev(f, W->tid2eid), devf(f, W->exp_probs_b), f->toks};
    ds4_cu_route(&rg, f->rl, f->eidx, f->ew, f->st);

    linear(b, &W->gate_shexp, f->x, E, T, f->ge);
    linear(b, &W->up_shexp, f->x, E, T, f->ue);
    ds4_cu_swiglu(f->ge, f->ue, (int64_t)T * F, c->clamp_shexp[b->l], f->st);
    linear(b, &W->down_shexp, f->ge, F, T, f->y);

    linear_experts(b, &W->gate_exps, f->x, T, k, f->geR);
    linear_experts(b, &W->up_exps, f->x, T, k, f->ueR);
    ds4_cu_swiglu(f->geR, f->ueR, (int64_t)T * k * F, c->clamp_exp[b->l], f->st);
    linear_experts(b, &W->down_exps, f->geR, T * k, 1, f->oe);
    ds4_cu_moe_combine(f->y, f->oe, f->ew, T, k, E, f->st);
    steer(b, DS4_STEER_FFN);
    hc_post(b);
}

/* Output head for tokens [t0, t0+n) into f->logits (n <= HEAD_CHUNK). */
static void head(pass *b, int t0, int n) {
    cu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_model *m = f->m;
    const int hcE = c->n_hc * c->n_embd;
    ds4_cu_rmsnorm(f->S + (size_t)t0 * hcE, hcE, f->flat, hcE, n, hcE, NULL, c->rms_eps, f->st);
    linear(b, &m->output_hc_fn, f->flat, hcE, n, f->mix);
    ds4_cu_head_mix(f->mix, devf(f, m->output_hc_scale), devf(f, m->output_hc_base), f->S + (size_t)t0 * hcE,
                    devf(f, m->output_norm), f->x, n, c->n_hc, c->n_embd, c->hc_eps, c->rms_eps, f->st);
    linear(b, &m->output, f->x, c->n_embd, n, f->logits);
}

/* Everything of one batch up to the last hidden state, on the stream. */
static void layers(pass *b) {
    cu *f = b->f;
    const ds4_config *c = f->c;
    const ds4_tensor *te = &f->m->token_embd;
    if (ds4_cu_embed(te->type, dev(f, te->data), te->row_bytes, f->toks, b->T, c->n_embd, c->n_hc, f->S, f->st))
        b->failed = true;
    ds4_cu_rope_tables(f->pos0, b->T, c->n_rot, f->inv_main, f->inv_comp, f->rope_cs, f->st);
    for (b->l = 0; b->l < c->n_layer; b->l++) {
        attention(b);
        ffn(b);
    }
}

/* --------------------------------------------------------------- mirrors */

static void mirror_free(mirror *mr) {
    if (mr->decode) cudaGraphExecDestroy(mr->decode);
    cudaFree(mr->block);
    cudaFree(mr->iscore);
    memset(mr, 0, sizeof *mr);
}

static mirror *find_mirror(cu *f, const ds4_kv *kv) {
    for (int i = 0; i < MAX_MIRRORS; i++)
        if (f->mirrors[i].kv == kv) return &f->mirrors[i];
    return NULL;
}

/* The device copy of kv, created from the host state on first use. */
static mirror *get_mirror(cu *f, ds4_kv *kv, char *err, size_t errlen) {
    mirror *mr = find_mirror(f, kv);
    if (mr) return mr;
    mr = find_mirror(f, NULL);
    if (!mr) { snprintf(err, errlen, "more than %d sessions on one CUDA backend", MAX_MIRRORS); return NULL; }
    mr->kv = kv;
    for (int l = 0; l < kv->n_layer; l++) mr->comp_cap = kv->L[l].comp_cap > mr->comp_cap ? kv->L[l].comp_cap : mr->comp_cap;
    const size_t scores = (size_t)f->base.max_batch * (mr->comp_cap ? mr->comp_cap : 1) * sizeof(float);
    if (!ok(cudaMalloc((void **)&mr->block, kv->bytes), "allocating the session state", err, errlen) ||
        !ok(cudaMalloc((void **)&mr->iscore, scores), "allocating indexer scores", err, errlen) ||
        !ok(cudaMemcpy(mr->block, kv->block, kv->bytes, cudaMemcpyHostToDevice), "uploading the session", err, errlen)) {
        mirror_free(mr);
        return NULL;
    }
    return mr;
}

static int cu_kv_sync(ds4_backend *be, ds4_kv *kv, bool to_host, char *err, size_t errlen) {
    cu *f = (cu *)be;
    mirror *mr = find_mirror(f, kv);
    if (!mr) return 0;   /* never evaluated here: the host copy is the state */
    cudaError_t e = to_host ? cudaMemcpy(kv->block, mr->block, kv->bytes, cudaMemcpyDeviceToHost)
                            : cudaMemcpy(mr->block, kv->block, kv->bytes, cudaMemcpyHostToDevice);
    return ok(e, to_host ? "downloading the session" : "uploading the session", err, errlen) ? 0 : -1;
}

static void cu_kv_release(ds4_backend *be, ds4_kv *kv) {
    mirror *mr = find_mirror((cu *)be, kv);
    if (mr) mirror_free(mr);
}

/* ------------------------------------------------------------------ eval */

static bool run_head(pass *b, int n, float *logits, bool all_logits, char *err, size_t errlen) {
    cu *f = b->f;
    const size_t V = (size_t)f->c->n_vocab;
    const int first = all_logits ? 0 : n - 1;
    for (int t0 = first; t0 < n; t0 += HEAD_CHUNK) {
        const int len = n - t0 < HEAD_CHUNK ? n - t0 : HEAD_CHUNK;
        head(b, t0, len);
        float *dst = logits + (all_logits ? (size_t)t0 * V : 0);
        if (!ok(cudaMemcpyAsync(dst, f->logits, (size_t)len * V * sizeof(float), cudaMemcpyDeviceToHost, f->st),
                "copying logits", err, errlen))
            return false;
    }
    return true;
}

/* One sequence through the model; its state advances only in the caller. */
static int eval_seq(cu *f, mirror *mr, const ds4_backend_seq *q, char *err, size_t errlen) {
    const ds4_config *c = f->c;
    const int n = q->n, pos = q->kv->n_pos;
    if (!ok(cudaMemcpyAsync(f->toks, q->toks, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, f->st), "tokens",
            err, errlen) ||
        !ok(cudaMemcpyAsync(f->pos0, &pos, sizeof pos, cudaMemcpyHostToDevice, f->st), "position", err, errlen))
        return -1;
    f->steer_host[DS4_STEER_ATTN] = ds4_steering_scale(q->steer, DS4_STEER_ATTN);
    f->steer_host[DS4_STEER_FFN] = ds4_steering_scale(q->steer, DS4_STEER_FFN);
    if (f->steer_dir && !ok(cudaMemcpyAsync(f->steer_scale, f->steer_host, sizeof f->steer_host, cudaMemcpyHostToDevice,
                                            f->st), "steering scales", err, errlen))
        return -1;
    if (n == 1 && mr->decode && mr->decode_steer != (f->steer_dir != NULL)) {
        /* captured before the steering file came to the device: capture again with it */
        cudaGraphExecDestroy(mr->decode);
        mr->decode = NULL;
    }
    pass b = {f, mr, n, 0, false, 0};
    const uint64_t bytes_before = f->base.weight_bytes;
    if (n == 1 && !mr->decode) {
        /* decode: capture the one-token pass once per session, replay it after */
        cudaGraph_t graph;
        if (!ok(cudaStreamBeginCapture(f->st, cudaStreamCaptureModeThreadLocal), "graph capture", err, errlen))
            return -1;
        layers(&b);
        head(&b, 0, 1);
        cudaError_t e = cudaStreamEndCapture(f->st, &graph);
        f->base.weight_bytes = bytes_before;   /* counted per replay below */
        if (b.failed) {
            if (e == cudaSuccess) cudaGraphDestroy(graph);
            snprintf(err, errlen, "CUDA backend: a tensor type has no kernel");
            return -1;
        }
        if (!ok(e, "graph capture", err, errlen)) return -1;
        e = cudaGraphInstantiate(&mr->decode, graph, 0);
        cudaGraphDestroy(graph);
        if (!ok(e, "graph instantiation", err, errlen)) { mr->decode = NULL; return -1; }
        mr->decode_bytes = b.bytes;
        mr->decode_steer = f->steer_dir != NULL;
    }
    if (n == 1) {
        if (!ok(cudaGraphLaunch(mr->decode, f->st), "graph launch", err, errlen) ||
            !ok(cudaMemcpyAsync(q->logits, f->logits, (size_t)c->n_vocab * sizeof(float), cudaMemcpyDeviceToHost, f->st),
                "copying logits", err, errlen))
            return -1;
        f->base.weight_bytes += mr->decode_bytes;
    } else {
        layers(&b);
        if (b.failed) { snprintf(err, errlen, "CUDA backend: a tensor type has no kernel"); return -1; }
        if (!run_head(&b, n, q->logits, q->all_logits, err, errlen)) return -1;
    }
    return ok(cudaStreamSynchronize(f->st), "the forward pass", err, errlen) ? 0 : -1;
}

/* The directions of a steered sequence on the device (once: the engine has
 * one steering file). */
static bool upload_steering(cu *f, const ds4_steering *s, char *err, size_t errlen) {
    if (s->dir == f->steer_src) return true;
    const size_t bytes = (size_t)s->n_layer * s->n_embd * sizeof(float);
    if ((!f->steer_dir && !ok(cudaMalloc((void **)&f->steer_dir, bytes), "allocating the steering file", err, errlen)) ||
        (!f->steer_scale &&
         !ok(cudaMalloc((void **)&f->steer_scale, sizeof f->steer_host), "allocating the steering scales", err, errlen)) ||
        !ok(cudaMemcpy(f->steer_dir, s->dir, bytes, cudaMemcpyHostToDevice), "uploading the steering file", err, errlen))
        return false;
    f->steer_src = s->dir;
    return true;
}

/* Sequences run one after another, each exactly as alone (every kernel
 * computes a row from that row only), so batching never changes a result.
 * Inputs are checked and device state allocated before any sequence runs;
 * states advance only when all have run. A device fault past that point
 * leaves CUDA unusable (sticky errors) and is reported as such. */
static int cu_eval(ds4_backend *be, const ds4_backend_seq *seqs, int n_seqs, char *err, size_t errlen) {
    cu *f = (cu *)be;
    const ds4_config *c = f->c;
    mirror *mrs[MAX_MIRRORS];
    if (n_seqs > MAX_MIRRORS) { snprintf(err, errlen, "more than %d sequences in one call", MAX_MIRRORS); return -1; }
    for (int s = 0; s < n_seqs; s++) {
        for (int i = 0; i < seqs[s].n; i++)
            if (seqs[s].toks[i] < 0 || seqs[s].toks[i] >= c->n_vocab) {
                snprintf(err, errlen, "token id %d out of range [0, %d)", seqs[s].toks[i], c->n_vocab);
                return -1;
            }
        if (!(mrs[s] = get_mirror(f, seqs[s].kv, err, errlen))) return -1;
        if (seqs[s].steer && !upload_steering(f, seqs[s].steer, err, errlen)) return -1;
    }
    for (int s = 0; s < n_seqs; s++)
        if (seqs[s].n > 0 && eval_seq(f, mrs[s], &seqs[s], err, errlen)) return -1;
    for (int s = 0; s < n_seqs; s++) seqs[s].kv->n_pos += seqs[s].n;
    return 0;
}

/* -------------------------------------------------------------- creation */

static void cu_free(ds4_backend *be) {
    cu *f = (cu *)be;
    if (!f) return;
    for (int i = 0; i < MAX_MIRRORS; i++)
        if (f->mirrors[i].kv) mirror_free(&f->mirrors[i]);
#define FREE(name, n) cudaFree(f->name);
    SCRATCH_FLOATS(FREE)
#undef FREE
    cudaFree(f->toks); cudaFree(f->eidx); cudaFree(f->sel); cudaFree(f->nsel); cudaFree(f->pos0); cudaFree(f->act);
    cudaFree(f->steer_dir); cudaFree(f->steer_scale);
    cudaFree(f->arena);
    if (f->st) cudaStreamDestroy(f->st);
    ds4_upload_plan_free(f->plan);
    free(f);
}

static bool alloc_scratch(cu *f, size_t T, char *err, size_t errlen) {
    const ds4_config *c = f->c;
    const size_t E = c->n_embd, hcE = (size_t)c->n_hc * E, D = c->head_dim, HD = (size_t)c->n_head * D;
    const size_t DI = c->idx_head_dim, F = c->n_ff_exp, J = T * c->n_expert_used, mixn = (size_t)(2 + c->n_hc) * c->n_hc;
#define ALLOC(name, count) \
    if (!ok(cudaMalloc((void **)&f->name, (size_t)(count) * sizeof(float)), "allocating scratch " #name, err, errlen)) \
        return false;
    SCRATCH_FLOATS(ALLOC)
#undef ALLOC
    const size_t acts = T * widest_input(c) > J * F ? T * widest_input(c) : J * F;
    return ok(cudaMalloc((void **)&f->toks, T * sizeof(int32_t)), "allocating scratch", err, errlen) &&
           ok(cudaMalloc((void **)&f->eidx, J * sizeof(int32_t)), "allocating scratch", err, errlen) &&
           ok(cudaMalloc((void **)&f->sel, T * (c->idx_topk > 0 ? c->idx_topk : 1) * sizeof(int)), "allocating scratch",
              err, errlen) &&
           ok(cudaMalloc((void **)&f->nsel, T * sizeof(int)), "allocating scratch", err, errlen) &&
           ok(cudaMalloc((void **)&f->pos0, sizeof(int)), "allocating scratch", err, errlen) &&
           ok(cudaMalloc(&f->act, acts * sizeof(float)), "allocating scratch", err, errlen);
}

/* Budgets in bytes for the devices in placement order. */
static int resolve_devices(const ds4_gpu_opts *o, int *ids, uint64_t *budgets, char *err, size_t errlen) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(err, errlen, "--cuda: %s; run without --cuda for the CPU backend",
                 e != cudaSuccess ? device_problem(e) : "no CUDA GPU found");
        return -1;
    }
    int n = o->n_devices ? o->n_devices : o->n_budgets ? o->n_budgets : 1;
    if (o->n_devices && o->n_budgets && o->n_devices != o->n_budgets) {
        snprintf(err, errlen, "--gpu-devices lists %d devices but --gpu-vram %d budgets", o->n_devices, o->n_budgets);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        ids[i] = o->n_devices ? o->devices[i] : i;
        if (ids[i] >= count) {
            snprintf(err, errlen, "CUDA device %d does not exist (this machine has %d)", ids[i], count);
            return -1;
        }
        if (o->n_budgets) {
            budgets[i] = (uint64_t)(o->budget_gib[i] * (double)(1ull << 30));
        } else {
            size_t free_b = 0, total_b = 0;
            if (!ok(cudaSetDevice(ids[i]), "selecting a device", err, errlen) ||
                !ok(cudaMemGetInfo(&free_b, &total_b), "reading free memory", err, errlen))
                return -1;
            budgets[i] = free_b;
        }
    }
    return n;
}

extern "C" const char *ds4_backends_built(void) { return "cpu, cuda"; }

extern "C" ds4_backend *ds4_cuda_backend_new(const ds4_model *m, const ds4_gpu_opts *o, int ctx, int kv_slack,
                                             int max_batch, bool numerics, bool quiet, char *err, size_t errlen) {
    const ds4_config *c = &m->cfg;
    if (c->n_hc > 16 || c->n_rot > 256 || (c->idx_head_dim && c->idx_head_dim > 2048)) {
        snprintf(err, errlen, "CUDA backend: more than 16 HC streams, 256 rotary dims or a 2048-wide indexer head");
        return NULL;
    }
    int ids[DS4_GPU_MAX_DEVICES];
    uint64_t budgets[DS4_GPU_MAX_DEVICES];
    const int n_dev = resolve_devices(o, ids, budgets, err, errlen);
    if (n_dev < 0) return NULL;

    cu *f = (cu *)calloc(1, sizeof *f);
    if (!f) { snprintf(err, errlen, "out of memory"); return NULL; }
    f->base.name = "cuda";
    f->base.max_batch = max_batch > 0 ? max_batch : 1;
    f->base.eval = cu_eval;
    f->base.free = cu_free;
    f->base.kv_sync = cu_kv_sync;
    f->base.kv_release = cu_kv_release;
    f->m = m;
    f->c = c;
    f->numerics = numerics;
    f->device = ids[0];

    uint64_t layer_kv[DS4_MAX_LAYERS];
    ds4_gpu_layer_kv_bytes(m, ctx, kv_slack, layer_kv);
    /* the session's indexer scores (get_mirror) count as its KV: max_batch
     * scores per compressed row of the first indexer layer */
    for (int l = 0; l < c->n_layer; l++)
        if (ds4_cfg_has_indexer(c, l)) {
            layer_kv[l] += (uint64_t)f->base.max_batch * (uint64_t)(ctx / ds4_cfg_ratio(c, l) + 1) * sizeof(float);
            break;
        }
    ds4_gpu_placement pl;
    f->plan = ds4_upload_plan_new(m, err, errlen);
    if (!f->plan ||
        !ds4_gpu_place(f->plan, layer_kv, scratch_bytes(c, (size_t)f->base.max_batch), budgets, n_dev, &pl, err, errlen))
        goto fail;
    if (pl.n_devices > 1) {
        snprintf(err, errlen, "the model needs %d GPUs under these budgets; this CUDA backend runs on one GPU so far "
                 "(the layer split across devices is planned but not implemented)", pl.n_devices);
        goto fail;
    }
    if (!ok(cudaSetDevice(f->device), "selecting the device", err, errlen) ||
        !ok(cudaStreamCreateWithFlags(&f->st, cudaStreamNonBlocking), "creating a stream", err, errlen) ||
        !ok(cudaMalloc((void **)&f->arena, pl.weight_bytes[0]), "allocating the weights", err, errlen) ||
        !alloc_scratch(f, (size_t)f->base.max_batch, err, errlen) ||
        !ok(ds4_cu_ops_init() ? cudaErrorInitializationError : cudaSuccess, "loading the IQ2_XXS tables", err, errlen))
        goto fail;
    for (int i = 0; i < f->plan->n; i++) {
        const ds4_upload_entry *u = &f->plan->e[i];
        if (!ok(cudaMemcpy(f->arena + u->offset, u->host, u->bytes, cudaMemcpyHostToDevice), "uploading weights", err,
                errlen))
            goto fail;
    }
    {
        float *inv[2] = {ds4_rope_inv_freq(c, false), ds4_rope_inv_freq(c, true)};
        const size_t bytes = (size_t)(c->n_rot / 2) * sizeof(float);
        const bool up = inv[0] && inv[1] &&
                        ok(cudaMemcpy(f->inv_main, inv[0], bytes, cudaMemcpyHostToDevice), "RoPE table", err, errlen) &&
                        ok(cudaMemcpy(f->inv_comp, inv[1], bytes, cudaMemcpyHostToDevice), "RoPE table", err, errlen);
        if (!inv[0] || !inv[1]) snprintf(err, errlen, "out of memory");
        free(inv[0]);
        free(inv[1]);
        if (!up) goto fail;
    }
    if (!quiet) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, f->device) == cudaSuccess)
            ds4_log(DS4_LOG_INFO, "ds4: cuda device %d (%s): %.2f GiB weights, %.2f GiB KV reserved for ctx %d, "
                                  "%.2f GiB scratch, budget %.2f GiB\n",
                    f->device, prop.name, (double)pl.weight_bytes[0] / (1u << 30), (double)pl.kv_bytes[0] / (1u << 30),
                    ctx, (double)pl.scratch_bytes[0] / (1u << 30), (double)pl.budget_bytes[0] / (1u << 30));
    }
    return &f->base;
fail:
    cu_free(&f->base);
    return NULL;
}
