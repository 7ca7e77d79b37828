/* cuda_ops.c -- cuda-ops (built by `make cuda`): every CUDA kernel
 * against the CPU reference on random inputs of the model's real shapes,
 * then whole-model CPU-vs-CUDA checks.
 *
 *   cuda-ops                      per-op table (op, shape, max abs, rel, tolerance):
 *       activation bytes and matrix products for every weight type, grouped
 *       expert products, embedding, RMSNorm, RoPE/YaRN tables, FP8/FP4/
 *       Hadamard/F16 round trips, SwiGLU, sliding-window attention with sinks
 *       (oracle: softmax in double), HC pre/post and routing (oracle: the
 *       shared forward_shared.h definitions on the CPU), indexer top-k
 *       (oracle: a sort with the CPU's tie order). The compressor, q/kv
 *       preparation and the head mix are covered by the whole-model checks.
 *   cuda-ops [--numerics exact|ds4] [--tokens N] [--tol R] [--gold DIR] --model M.gguf
 *       prefill logits (every position), 8 greedy decode steps (the CUDA
 *       graph path), two sessions stepped together against one alone (bit
 *       for bit), a session payload saved on CUDA and continued on the CPU;
 *       with --gold, the CUDA logits against the transformers fixture.
 *       Directional steering (a direction file of random unit rows): zero
 *       scales on an engine with the file equal the plain CUDA engine bit
 *       for bit (prefill and graph decode); steered prefill and decode
 *       against the steered CPU; a session whose decode graph was captured
 *       before the file reached the device, then steered, against the CPU.
 *
 * rel = max|cuda - ref| / max|ref|. Tolerances: 0 where both sides do the
 * same IEEE operations in the same order (activation bytes, storage round
 * trips); 1e-5 for dot products and norms (summation order, FMA); whole
 * models --tol: gpu-check.sh gives f32/f16 models in exact numerics the
 * CPU's own tolerance against transformers (2e-5, test_forward.c) and
 * models with quantized activations or ds4 numerics 1e-3 (a summation-order
 * difference can move an activation across a rounding boundary; the CPU's
 * decode-vs-prefill agreement under ds4 numerics is 1e-4). Exit status 1 when
 * any check fails, 2 without a usable GPU. */
#include "backends/cuda/ops.h"
#include "engine/engine.h"
#include "models/dsv4/forward_cpu.h"
#include "models/dsv4/forward_shared.h"
#include "kernels/kernels_cpu.h"
#include "models/dsv4/model.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int n_checks, n_failed;

static void report(const char *op, const char *shape, double abs_err, double rel, double tol) {
    const bool pass = rel <= tol && !isnan(rel);
    printf("%-16s %-34s max_abs %.3e  rel %.3e  tol %.0e  %s\n", op, shape, abs_err, rel, tol, pass ? "ok" : "FAIL");
    n_checks++;
    if (!pass) n_failed++;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {   /* xorshift64*, uniform in [-1, 1) */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / (float)(1 << 23) - 1.0f;
}
static void fill(float *x, size_t n, float scale) { for (size_t i = 0; i < n; i++) x[i] = frand() * scale; }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "cuda-ops: out of memory\n"); exit(1); }
    return p;
}
static void *up(const void *h, size_t n) {
    void *d = ds4_cu_alloc(n);
    if (!d || ds4_cu_copy(d, h, n, true)) { fprintf(stderr, "cuda-ops: device allocation failed\n"); exit(1); }
    return d;
}
static void down(void *h, const void *d, size_t n) {
    char err[256];
    if (ds4_cu_finish(err, sizeof err) || ds4_cu_copy(h, d, n, false)) {
        fprintf(stderr, "cuda-ops: CUDA error: %s\n", err);
        exit(1);
    }
}

/* max |a-b| and that relative to max |b| */
static void errs(const float *a, const float *b, size_t n, double *abs_err, double *rel) {
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m || isnan(d)) m = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > s) s = fabs(b[i]);
    }
    *abs_err = m;
    *rel = s > 0 ? m / s : m;
}

static void *quantized_matrix(uint32_t type, int64_t rows, int64_t n, float scale) {
    const size_t rb = ds4_type_row_bytes(type, (uint64_t)n);
    char *w = xmalloc(rb * (size_t)rows);
    float *x = xmalloc((size_t)n * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        fill(x, (size_t)n, scale);
        ds4_quantize_row(type, x, w + (size_t)r * rb, n, NULL);
    }
    free(x);
    return w;
}

static const uint32_t weight_types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0, DS4_TYPE_Q2_K,
                                        DS4_TYPE_Q3_K, DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K, DS4_TYPE_IQ2_XXS};

/* Activation bytes and products for one weight type and shape. */
static void check_matmul(uint32_t type, int64_t rows, int64_t n, int T) {
    char shape[64];
    snprintf(shape, sizeof shape, "%s %lldx%lld T=%d", ds4_type_name(type), (long long)rows, (long long)n, T);
    const size_t rb = ds4_type_row_bytes(type, (uint64_t)n), ab = ds4_act_bytes(type, n);
    void *W = quantized_matrix(type, rows, n, 0.5f);
    float *X = xmalloc((size_t)T * n * sizeof(float)), *ref = xmalloc((size_t)T * rows * sizeof(float));
    float *got = xmalloc((size_t)T * rows * sizeof(float));
    char *act = xmalloc((size_t)T * ab), *gact = xmalloc((size_t)T * ab);
    fill(X, (size_t)T * n, 2.0f);
    for (int t = 0; t < T; t++) {
        ds4_quantize_act(type, X + (size_t)t * n, act + (size_t)t * ab, n);
        for (int64_t r = 0; r < rows; r++)
            ref[(size_t)t * rows + r] = ds4_vec_dot_ref(type, (char *)W + (size_t)r * rb, act + (size_t)t * ab, n);
    }
    void *dW = up(W, rb * (size_t)rows), *dX = up(X, (size_t)T * n * sizeof(float));
    void *dA = ds4_cu_alloc((size_t)T * ab), *dY = ds4_cu_alloc((size_t)T * rows * sizeof(float));
    int rc = ds4_cu_quantize_act(type, dX, n, T, n, dA, NULL);
    rc |= ds4_cu_matmul(type, dW, rb, rows, n, dA, T, dY, rows, NULL);
    if (rc) { report("matmul", shape, INFINITY, INFINITY, 0); goto out; }
    down(gact, dA, (size_t)T * ab);
    size_t differ = 0;
    for (size_t i = 0; i < (size_t)T * ab; i++) differ += gact[i] != act[i];
    report("quantize_act", shape, (double)differ, (double)differ, 0);
    down(got, dY, (size_t)T * rows * sizeof(float));
    double a, r;
    errs(got, ref, (size_t)T * rows, &a, &r);
    report("matmul", shape, a, r, 1e-5);
out:
    ds4_cu_free(dW); ds4_cu_free(dX); ds4_cu_free(dA); ds4_cu_free(dY);
    free(W); free(X); free(ref); free(got); free(act); free(gact);
}

/* Grouped expert products: pair j reads expert eidx[j] and token j / k. */
static void check_experts(uint32_t type, int n_expert, int64_t rows, int64_t n, int T, int k) {
    char shape[64];
    snprintf(shape, sizeof shape, "%s %dx%lldx%lld T=%d k=%d", ds4_type_name(type), n_expert, (long long)rows,
             (long long)n, T, k);
    const int J = T * k;
    const size_t rb = ds4_type_row_bytes(type, (uint64_t)n), ab = ds4_act_bytes(type, n), eb = rb * (size_t)rows;
    void *W = quantized_matrix(type, rows * n_expert, n, 0.5f);
    float *X = xmalloc((size_t)T * n * sizeof(float));
    float *ref = xmalloc((size_t)J * rows * sizeof(float)), *got = xmalloc((size_t)J * rows * sizeof(float));
    char *act = xmalloc((size_t)T * ab);
    int32_t *eidx = xmalloc((size_t)J * sizeof(int32_t));
    fill(X, (size_t)T * n, 2.0f);
    for (int j = 0; j < J; j++) eidx[j] = (int32_t)((frand() + 1.0f) * 0.5f * n_expert) % n_expert;
    for (int t = 0; t < T; t++) ds4_quantize_act(type, X + (size_t)t * n, act + (size_t)t * ab, n);
    for (int j = 0; j < J; j++)
        for (int64_t r = 0; r < rows; r++)
            ref[(size_t)j * rows + r] =
                ds4_vec_dot_ref(type, (char *)W + (size_t)eidx[j] * eb + (size_t)r * rb, act + (size_t)(j / k) * ab, n);
    void *dW = up(W, eb * n_expert), *dX = up(X, (size_t)T * n * sizeof(float)), *dE = up(eidx, (size_t)J * 4);
    void *dA = ds4_cu_alloc((size_t)T * ab), *dY = ds4_cu_alloc((size_t)J * rows * sizeof(float));
    int rc = ds4_cu_quantize_act(type, dX, n, T, n, dA, NULL);
    rc |= ds4_cu_matmul_experts(type, dW, rb, eb, dE, rows, n, dA, k, J, dY, rows, NULL);
    double a = INFINITY, r = INFINITY;
    if (!rc) {
        down(got, dY, (size_t)J * rows * sizeof(float));
        errs(got, ref, (size_t)J * rows, &a, &r);
    }
    report("matmul_experts", shape, a, r, 1e-5);
    ds4_cu_free(dW); ds4_cu_free(dX); ds4_cu_free(dE); ds4_cu_free(dA); ds4_cu_free(dY);
    free(W); free(X); free(ref); free(got); free(act); free(eidx);
}

static void check_embed(uint32_t type, int n, int copies) {
    char shape[64];
    snprintf(shape, sizeof shape, "%s 64x%d copies=%d", ds4_type_name(type), n, copies);
    const int rows = 64, T = 5;
    const size_t rb = ds4_type_row_bytes(type, (uint64_t)n);
    void *W = quantized_matrix(type, rows, n, 1.0f);
    int32_t toks[5] = {3, 0, 63, 3, 17};
    float *ref = xmalloc((size_t)T * copies * n * sizeof(float)), *got = xmalloc((size_t)T * copies * n * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int c = 0; c < copies; c++)
            ds4_dequantize_row(type, (char *)W + (size_t)toks[t] * rb, ref + ((size_t)t * copies + c) * n, n);
    void *dW = up(W, rb * rows), *dT = up(toks, sizeof toks), *dS = ds4_cu_alloc((size_t)T * copies * n * sizeof(float));
    double a = INFINITY, r = INFINITY;
    if (!ds4_cu_embed(type, dW, rb, dT, T, n, copies, dS, NULL)) {
        down(got, dS, (size_t)T * copies * n * sizeof(float));
        errs(got, ref, (size_t)T * copies * n, &a, &r);
    }
    report("embed", shape, a, r, 1e-6);
    ds4_cu_free(dW); ds4_cu_free(dT); ds4_cu_free(dS);
    free(W); free(ref); free(got);
}

static void check_rmsnorm(int T, int n, bool weighted) {
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d n=%d %s", T, n, weighted ? "weighted" : "plain");
    float *x = xmalloc((size_t)T * n * sizeof(float)), *w = xmalloc((size_t)n * sizeof(float));
    float *ref = xmalloc((size_t)T * n * sizeof(float)), *got = xmalloc((size_t)T * n * sizeof(float));
    fill(x, (size_t)T * n, 3.0f);
    fill(w, (size_t)n, 1.0f);
    const float eps = 1e-6f;
    for (int t = 0; t < T; t++) {   /* the definition, in double */
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)x[(size_t)t * n + i] * x[(size_t)t * n + i];
        const double inv = 1.0 / sqrt(ss / n + eps);
        for (int i = 0; i < n; i++)
            ref[(size_t)t * n + i] = (float)(x[(size_t)t * n + i] * inv * (weighted ? w[i] : 1.0));
    }
    float *dx = up(x, (size_t)T * n * sizeof(float)), *dw = up(w, (size_t)n * sizeof(float));
    float *dy = ds4_cu_alloc((size_t)T * n * sizeof(float));
    ds4_cu_rmsnorm(dx, n, dy, n, T, n, weighted ? dw : NULL, eps, NULL);
    down(got, dy, (size_t)T * n * sizeof(float));
    double a, r;
    errs(got, ref, (size_t)T * n, &a, &r);
    report("rmsnorm", shape, a, r, 1e-5);
    ds4_cu_free(dx); ds4_cu_free(dw); ds4_cu_free(dy);
    free(x); free(w); free(ref); free(got);
}

/* DS4 Flash RoPE settings (model sheet): 64 rotary dims, YaRN on compressed layers. */
static ds4_config rope_config(void) {
    ds4_config c;
    memset(&c, 0, sizeof c);
    c.n_rot = 64;
    c.rope_base = 10000.0f;
    c.compress_rope_base = 160000.0f;
    c.yarn_factor = 16.0f;
    c.yarn_beta_fast = 32.0f;
    c.yarn_beta_slow = 1.0f;
    c.yarn_orig_ctx = 65536;
    return c;
}

static void check_rope(void) {
    const ds4_config c = rope_config();
    const int T = 9, pos0 = 70000, nr = c.n_rot;
    float *inv[2] = {ds4_rope_inv_freq(&c, false), ds4_rope_inv_freq(&c, true)};
    float *ref = xmalloc((size_t)T * 2 * nr * sizeof(float)), *got = xmalloc((size_t)T * 2 * nr * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int kind = 0; kind < 2; kind++)
            for (int i = 0; i < nr / 2; i++) {
                const float ang = (float)(pos0 + t) * inv[kind][i];
                ref[((size_t)t * 2 + kind) * nr + 2 * i] = (float)cos(ang);
                ref[((size_t)t * 2 + kind) * nr + 2 * i + 1] = (float)sin(ang);
            }
    float *d0 = up(inv[0], (size_t)nr / 2 * sizeof(float)), *d1 = up(inv[1], (size_t)nr / 2 * sizeof(float));
    int *dp = up(&pos0, sizeof pos0);
    float *dcs = ds4_cu_alloc((size_t)T * 2 * nr * sizeof(float));
    ds4_cu_rope_tables(dp, T, nr, d0, d1, dcs, NULL);
    down(got, dcs, (size_t)T * 2 * nr * sizeof(float));
    double a, r;
    errs(got, ref, (size_t)T * 2 * nr, &a, &r);
    report("rope_tables", "n_rot=64 pos 70000.. T=9", a, r, 1e-6);
    ds4_cu_free(d0); ds4_cu_free(d1); ds4_cu_free(dp); ds4_cu_free(dcs);
    free(inv[0]); free(inv[1]); free(ref); free(got);
}

static void f16_rows(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = ds4_half_to_f32(ds4_f32_to_half(x[i]));
}

static void check_roundtrip(int kind, int rows, int n) {
    static const char *names[] = {"fp8_e4m3", "fp4_e2m1", "hadamard", "f16_round"};
    char shape[64];
    snprintf(shape, sizeof shape, "%dx%d", rows, n);
    float *x = xmalloc((size_t)rows * n * sizeof(float)), *got = xmalloc((size_t)rows * n * sizeof(float));
    fill(x, (size_t)rows * n, 40.0f);
    float *dx = up(x, (size_t)rows * n * sizeof(float));
    const int rc = ds4_cu_roundtrip(kind, dx, rows, n, NULL);
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * n;
        if (kind == DS4_CU_FP8) ds4_fp8_e4m3_roundtrip(row, n);
        else if (kind == DS4_CU_FP4) ds4_fp4_e2m1_roundtrip(row, n);
        else if (kind == DS4_CU_HADAMARD) ds4_hadamard(row, n);
        else f16_rows(row, n);
    }
    double a = INFINITY, r = INFINITY;
    if (!rc) {
        down(got, dx, (size_t)rows * n * sizeof(float));
        errs(got, x, (size_t)rows * n, &a, &r);
    }
    report(names[kind], shape, a, r, 0);
    ds4_cu_free(dx);
    free(x); free(got);
}

static void check_swiglu(int64_t n, float limit) {
    float *g = xmalloc((size_t)n * sizeof(float)), *u = xmalloc((size_t)n * sizeof(float));
    float *ref = xmalloc((size_t)n * sizeof(float)), *got = xmalloc((size_t)n * sizeof(float));
    fill(g, (size_t)n, 12.0f);
    fill(u, (size_t)n, 12.0f);
    for (int64_t i = 0; i < n; i++) {
        const double gv = fmin(g[i], limit), uv = fmin(fmax(u[i], -limit), limit);
        ref[i] = (float)(gv / (1.0 + exp(-gv)) * uv);
    }
    float *dg = up(g, (size_t)n * sizeof(float)), *du = up(u, (size_t)n * sizeof(float));
    ds4_cu_swiglu(dg, du, n, limit, NULL);
    down(got, dg, (size_t)n * sizeof(float));
    double a, r;
    errs(got, ref, (size_t)n, &a, &r);
    char shape[64];
    snprintf(shape, sizeof shape, "n=%lld limit=%g", (long long)n, limit);
    report("swiglu", shape, a, r, 1e-6);
    ds4_cu_free(dg); ds4_cu_free(du);
    free(g); free(u); free(ref); free(got);
}

/* Sliding-window attention with a sink over the ring and the batch's rows
 * (a layer without compression), against softmax in double. */
static void check_attention(int T, int H, int D, int window, int pos0) {
    const int n_rot = 64, raw_cap = window + 256;
    float *q = xmalloc((size_t)T * H * D * sizeof(float)), *kvr = xmalloc((size_t)T * D * sizeof(float));
    float *raw = xmalloc((size_t)raw_cap * D * sizeof(float)), *sinks = xmalloc((size_t)H * sizeof(float));
    float *cs = xmalloc((size_t)T * 2 * n_rot * sizeof(float));
    float *ref = xmalloc((size_t)T * H * D * sizeof(float)), *got = xmalloc((size_t)T * H * D * sizeof(float));
    fill(q, (size_t)T * H * D, 0.2f);
    fill(kvr, (size_t)T * D, 1.0f);
    fill(raw, (size_t)raw_cap * D, 1.0f);
    fill(sinks, (size_t)H, 2.0f);
    for (int i = 0; i < T * n_rot; i++) {
        const float ang = frand() * 3.0f;
        cs[2 * i] = cosf(ang);
        cs[2 * i + 1] = sinf(ang);
    }
    double *sc = xmalloc((size_t)(window + 1) * sizeof(double)), *o = xmalloc((size_t)D * sizeof(double));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const int p = pos0 + t, lo = p - window + 1 > 0 ? p - window + 1 : 0, n = p - lo + 1;
            const float *qr = q + ((size_t)t * H + h) * D;
            double mx = sinks[h];
            for (int i = 0; i < n; i++) {
                const int pos = lo + i;
                const float *row = pos >= pos0 ? kvr + (size_t)(pos - pos0) * D : raw + (size_t)(pos % raw_cap) * D;
                double dot = 0;
                for (int d = 0; d < D; d++) dot += (double)row[d] * qr[d];
                sc[i] = dot / sqrt((double)D);
                if (sc[i] > mx) mx = sc[i];
            }
            double den = exp(sinks[h] - mx);
            for (int i = 0; i < n; i++) den += exp(sc[i] - mx);
            for (int d = 0; d < D; d++) o[d] = 0;
            for (int i = 0; i < n; i++) {
                const int pos = lo + i;
                const float *row = pos >= pos0 ? kvr + (size_t)(pos - pos0) * D : raw + (size_t)(pos % raw_cap) * D;
                const double wgt = exp(sc[i] - mx) / den;
                for (int d = 0; d < D; d++) o[d] += wgt * row[d];
            }
            float *out = ref + ((size_t)t * H + h) * D;
            for (int d = 0; d < D; d++) out[d] = (float)o[d];
            const float *c = cs + (size_t)t * 2 * n_rot;   /* kind 0: inverse rotation of the rotary tail */
            float *rr = out + D - n_rot;
            for (int i = 0; i < n_rot / 2; i++) {
                const double a = rr[2 * i], b = rr[2 * i + 1], co = c[2 * i], si = -c[2 * i + 1];
                rr[2 * i] = (float)(a * co - b * si);
                rr[2 * i + 1] = (float)(b * co + a * si);
            }
        }
    float *dq = up(q, (size_t)T * H * D * sizeof(float)), *dk = up(kvr, (size_t)T * D * sizeof(float));
    float *dr = up(raw, (size_t)raw_cap * D * sizeof(float)), *ds = up(sinks, (size_t)H * sizeof(float));
    float *dcs = up(cs, (size_t)T * 2 * n_rot * sizeof(float)), *dout = ds4_cu_alloc((size_t)T * H * D * sizeof(float));
    int *dp = up(&pos0, sizeof pos0);
    ds4_cu_attn_geom g;
    memset(&g, 0, sizeof g);
    g.T = T; g.n_head = H; g.head_dim = D; g.n_rot = n_rot; g.window = window; g.raw_cap = raw_cap;
    g.pos0 = dp; g.rope_cs = dcs; g.rms_eps = 1e-6f;
    ds4_cu_attention(&g, dq, dk, dr, NULL, NULL, NULL, ds, dout, NULL);
    down(got, dout, (size_t)T * H * D * sizeof(float));
    double a, r;
    errs(got, ref, (size_t)T * H * D, &a, &r);
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d H=%d D=%d window=%d pos=%d", T, H, D, window, pos0);
    report("attention", shape, a, r, 1e-5);
    ds4_cu_free(dq); ds4_cu_free(dk); ds4_cu_free(dr); ds4_cu_free(ds); ds4_cu_free(dcs); ds4_cu_free(dout);
    ds4_cu_free(dp);
    free(q); free(kvr); free(raw); free(sinks); free(cs); free(ref); free(got); free(sc); free(o);
}

/* Hyper-connection pre (weights + collapse) and post mixes against the
 * shared per-token definition run on the CPU. */
static void check_hc(int T, int hc, int E) {
    const int mixn = (2 + hc) * hc;
    float *mix = xmalloc((size_t)T * mixn * sizeof(float)), *sc = xmalloc(3 * sizeof(float));
    float *bs = xmalloc((size_t)mixn * sizeof(float)), *S = xmalloc((size_t)T * hc * E * sizeof(float));
    float *y = xmalloc((size_t)T * E * sizeof(float));
    float *ra = xmalloc((size_t)T * E * sizeof(float)), *rs = xmalloc((size_t)T * hc * E * sizeof(float));
    float *ga = xmalloc((size_t)T * E * sizeof(float)), *gs = xmalloc((size_t)T * hc * E * sizeof(float));
    fill(mix, (size_t)T * mixn, 3.0f); fill(sc, 3, 1.0f); fill(bs, (size_t)mixn, 1.0f);
    fill(S, (size_t)T * hc * E, 1.0f); fill(y, (size_t)T * E, 1.0f);
    float pre[64], post[64], comb[64 * 64];
    double C[64 * 64];
    for (int t = 0; t < T; t++) {
        ds4_hc_weights(mix + (size_t)t * mixn, sc, bs, hc, 20, 1e-6f, pre, post, comb, C);
        const float *St = S + (size_t)t * hc * E;
        for (int d = 0; d < E; d++) {
            float acc = 0;
            for (int s = 0; s < hc; s++) acc += pre[s] * St[(size_t)s * E + d];
            ra[(size_t)t * E + d] = acc;
            for (int k = 0; k < hc; k++) {
                float o = post[k] * y[(size_t)t * E + d];
                for (int j = 0; j < hc; j++) o += comb[j * hc + k] * St[(size_t)j * E + d];
                rs[((size_t)t * hc + k) * E + d] = o;
            }
        }
    }
    float *dmix = up(mix, (size_t)T * mixn * 4), *dsc = up(sc, 12), *dbs = up(bs, (size_t)mixn * 4);
    float *dS = up(S, (size_t)T * hc * E * 4), *dy = up(y, (size_t)T * E * 4);
    float *dhcw = ds4_cu_alloc((size_t)T * mixn * 4), *da = ds4_cu_alloc((size_t)T * E * 4);
    float *dout = ds4_cu_alloc((size_t)T * hc * E * 4);
    ds4_cu_hc_pre(dmix, dsc, dbs, dS, dhcw, da, T, hc, E, 20, 1e-6f, NULL);
    ds4_cu_hc_post(dhcw, dS, dy, dout, T, hc, E, NULL);
    down(ga, da, (size_t)T * E * 4);
    down(gs, dout, (size_t)T * hc * E * 4);
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d hc=%d E=%d", T, hc, E);
    double a, r;
    errs(ga, ra, (size_t)T * E, &a, &r);
    report("hc_pre", shape, a, r, 1e-5);
    errs(gs, rs, (size_t)T * hc * E, &a, &r);
    report("hc_post", shape, a, r, 1e-5);
    ds4_cu_free(dmix); ds4_cu_free(dsc); ds4_cu_free(dbs); ds4_cu_free(dS); ds4_cu_free(dy); ds4_cu_free(dhcw);
    ds4_cu_free(da); ds4_cu_free(dout);
    free(mix); free(sc); free(bs); free(S); free(y); free(ra); free(rs); free(ga); free(gs);
}

/* Routing (hash rows or biased top-k) against the shared definition. */
static void check_route(int T, int X, int k, bool hash) {
    const int V = 50;
    float *s = xmalloc((size_t)T * X * 4), *bias = xmalloc((size_t)X * 4), *ew = xmalloc((size_t)T * k * 4);
    float *gew = xmalloc((size_t)T * k * 4);
    int32_t *tid = xmalloc((size_t)V * k * 4), toks[16];
    int *ei = xmalloc((size_t)T * k * sizeof(int)), *gei = xmalloc((size_t)T * k * sizeof(int));
    fill(s, (size_t)T * X, 4.0f); fill(bias, (size_t)X, 0.5f);
    for (int i = 0; i < V * k; i++) tid[i] = (int32_t)((frand() + 1.0f) * 0.5f * X) % X;
    for (int t = 0; t < T; t++) toks[t] = (int32_t)((frand() + 1.0f) * 0.5f * V) % V;
    float *ds = up(s, (size_t)T * X * 4), *db = up(bias, (size_t)X * 4);
    int32_t *dtid = up(tid, (size_t)V * k * 4), *dtok = up(toks, sizeof toks);
    int32_t *dei = ds4_cu_alloc((size_t)T * k * 4);
    float *dew = ds4_cu_alloc((size_t)T * k * 4);
    for (int t = 0; t < T; t++)
        ds4_route_token(s + (size_t)t * X, X, k, hash ? tid + (size_t)toks[t] * k : NULL, hash ? NULL : bias, true, 1.5f,
                        ei + (size_t)t * k, ew + (size_t)t * k);
    ds4_cu_route_geom g = {T, X, k, true, 1.5f, hash ? dtid : NULL, hash ? NULL : db, dtok};
    ds4_cu_route(&g, ds, dei, dew, NULL);
    down(gei, dei, (size_t)T * k * 4);
    down(gew, dew, (size_t)T * k * 4);
    int differ = 0;
    for (int i = 0; i < T * k; i++) differ += gei[i] != ei[i];
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d X=%d k=%d %s", T, X, k, hash ? "hash" : "top-k+bias");
    report("route_experts", shape, differ, differ, 0);
    double a, r;
    errs(gew, ew, (size_t)T * k, &a, &r);
    report("route_weights", shape, a, r, 1e-6);
    ds4_cu_free(ds); ds4_cu_free(db); ds4_cu_free(dtid); ds4_cu_free(dtok); ds4_cu_free(dei); ds4_cu_free(dew);
    free(s); free(bias); free(ew); free(gew); free(tid); free(ei); free(gei);
}

static const float *sort_scores;
static int by_score(const void *a, const void *b) {   /* score desc, index asc */
    int i = *(const int *)a, j = *(const int *)b;
    if (sort_scores[i] != sort_scores[j]) return sort_scores[i] > sort_scores[j] ? -1 : 1;
    return (i > j) - (i < j);
}
static int by_index(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

/* Indexer scores + top-k selection. Integer inputs, one weighted head and an
 * identity rotation make every score exact, so ties are real and the order
 * (score desc, index asc; then ascending) is checked exactly. */
static void check_indexer(int T, int pos0, int topk) {
    const int HI = 4, DI = 128, ratio = 4, n_rot = 64, comp_cap = (pos0 + T) / ratio + 1;
    float *qi = xmalloc((size_t)T * HI * DI * 4), *om = xmalloc((size_t)T * HI * 4);
    float *rows = xmalloc((size_t)comp_cap * DI * 4), *cs = xmalloc((size_t)T * 2 * n_rot * 4);
    for (int i = 0; i < T * HI * DI; i++) qi[i] = (float)((int)((frand() + 1.0f) * 1.5f) - 1);
    for (int i = 0; i < comp_cap * DI; i++) rows[i] = (float)((int)((frand() + 1.0f) * 1.5f) - 1);
    for (int i = 0; i < T * HI; i++) om[i] = i % HI == 0 ? 1.0f : 0.0f;
    for (int i = 0; i < T * n_rot; i++) { cs[2 * i] = 1.0f; cs[2 * i + 1] = 0.0f; }
    int *gsel = xmalloc((size_t)T * topk * sizeof(int));
    int *order = xmalloc((size_t)comp_cap * sizeof(int)), gn[64];
    float *sc = xmalloc((size_t)comp_cap * 4);
    const float ks = 1.0f / sqrtf((float)DI), ws = 1.0f / sqrtf((float)HI);
    float *dq = up(qi, (size_t)T * HI * DI * 4), *dom = up(om, (size_t)T * HI * 4);
    float *drows = up(rows, (size_t)comp_cap * DI * 4), *dcs = up(cs, (size_t)T * 2 * n_rot * 4);
    float *dsc = ds4_cu_alloc((size_t)T * comp_cap * 4);
    int *dsel = ds4_cu_alloc((size_t)T * topk * sizeof(int)), *dn = ds4_cu_alloc((size_t)T * sizeof(int));
    int *dp = up(&pos0, sizeof pos0);
    ds4_cu_attn_geom g;
    memset(&g, 0, sizeof g);
    g.T = T; g.n_rot = n_rot; g.ratio = ratio; g.idx_head_dim = DI; g.n_idx_head = HI; g.idx_topk = topk;
    g.comp_cap = comp_cap; g.pos0 = dp; g.rope_cs = dcs;
    ds4_cu_indexer(&g, dq, dom, drows, dsc, dsel, dn, NULL);
    down(gsel, dsel, (size_t)T * topk * sizeof(int));
    down(gn, dn, (size_t)T * sizeof(int));
    int differ = 0;
    for (int t = 0; t < T; t++) {
        const int nv = (pos0 + t + 1) / ratio, n = nv < topk ? nv : topk;
        for (int w = 0; w < nv; w++) {
            float acc = 0;
            for (int h = 0; h < HI; h++) {
                float dot = 0;
                for (int i = 0; i < DI; i++) dot += rows[(size_t)w * DI + i] * qi[((size_t)t * HI + h) * DI + i];
                if (dot > 0) acc += dot * ks * (om[(size_t)t * HI + h] * ws);
            }
            sc[w] = acc;
            order[w] = w;
        }
        sort_scores = sc;
        qsort(order, (size_t)nv, sizeof(int), by_score);
        qsort(order, (size_t)n, sizeof(int), by_index);
        differ += gn[t] != n;
        for (int i = 0; i < n && gn[t] == n; i++) differ += gsel[(size_t)t * topk + i] != order[i];
    }
    char shape[64];
    snprintf(shape, sizeof shape, "T=%d pos=%d topk=%d HI=%d DI=%d", T, pos0, topk, HI, DI);
    report("indexer_topk", shape, differ, differ, 0);
    ds4_cu_free(dq); ds4_cu_free(dom); ds4_cu_free(drows); ds4_cu_free(dcs); ds4_cu_free(dsc); ds4_cu_free(dsel);
    ds4_cu_free(dn); ds4_cu_free(dp);
    free(qi); free(om); free(rows); free(cs); free(gsel); free(order); free(sc);
}

static void run_ops(void) {
    ds4_quant_init();
    ds4_kernels_set_level(DS4_SIMD_SCALAR);   /* the reference activation quantizers */
    /* Flash shapes: n_embd 4096 (q_a, kv, compressor, router, shared/routed
     * gate+up), q_lora 1024 (q_b, indexer q), n_ff_exp 2048 (down). */
    const struct { int64_t rows, n; int T; } shapes[] = {{256, 4096, 1}, {256, 4096, 7}, {128, 2048, 33}, {64, 1024, 3}};
    for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++) {
        if (!ds4_type_can_quantize(weight_types[t])) continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            check_matmul(weight_types[t], shapes[s].rows, shapes[s].n, shapes[s].T);
    }
    const uint32_t expert_types[] = {DS4_TYPE_IQ2_XXS, DS4_TYPE_Q2_K, DS4_TYPE_Q4_K, DS4_TYPE_Q8_0};
    for (size_t t = 0; t < sizeof expert_types / sizeof expert_types[0]; t++) {
        check_experts(expert_types[t], 8, 64, 4096, 1, 6);
        check_experts(expert_types[t], 8, 64, 2048, 5, 6);
    }
    for (size_t t = 0; t < sizeof weight_types / sizeof weight_types[0]; t++)
        if (ds4_type_can_quantize(weight_types[t])) check_embed(weight_types[t], 4096, 4);
    check_rmsnorm(5, 4096, true);
    check_rmsnorm(3, 16384, false);
    check_rmsnorm(7, 512, true);
    check_rope();
    check_roundtrip(DS4_CU_FP8, 9, 448);
    check_roundtrip(DS4_CU_FP4, 9, 128);
    check_roundtrip(DS4_CU_HADAMARD, 9, 128);
    check_roundtrip(DS4_CU_F16, 9, 512);
    check_swiglu(5 * 2048, 10.0f);
    check_hc(3, 4, 4096);
    check_route(9, 256, 6, false);
    check_route(9, 256, 6, true);
    check_indexer(5, 2040, 512);    /* 510..511 visible rows: all selected */
    check_indexer(7, 8190, 512);    /* 2047..2049 visible rows: top 512 */
    check_attention(1, 64, 512, 128, 5000);
    check_attention(6, 8, 512, 128, 125);
    check_attention(3, 4, 512, 128, 0);
}

/* ------------------------------------------------------------ whole model */

static ds4_engine *load_steered(const char *path, bool cuda, int numerics, int ctx, const char *steer) {
    char err[512];
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = path;
    p.steering.file = steer;
    p.numerics = numerics;
    p.quiet = true;
    p.gpu.backend = cuda ? DS4_BACKEND_CUDA : DS4_BACKEND_CPU;
    p.gpu_ctx = ctx;
    ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
    if (!e) fprintf(stderr, "cuda-ops: %s (%s): %s\n", path, cuda ? "cuda" : "cpu", err);
    return e;
}

static ds4_engine *load(const char *path, bool cuda, int numerics, int ctx) {
    return load_steered(path, cuda, numerics, ctx, NULL);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* Rows of logits: rel error and argmax disagreements where the reference's
 * top-2 gap exceeds 1e-3 of its largest logit (random models have near ties). */
static void compare_rows(const char *what, const char *model, const float *got, const float *ref, int rows, int V,
                         double tol) {
    double a, r;
    errs(got, ref, (size_t)rows * V, &a, &r);
    int bad = 0;
    for (int t = 0; t < rows; t++) {
        const float *g = got + (size_t)t * V, *f = ref + (size_t)t * V;
        const int ar = argmax(f, V);
        float second = -INFINITY, top = fabsf(f[ar]);
        for (int v = 0; v < V; v++) if (v != ar && f[v] > second) second = f[v];
        if (argmax(g, V) != ar && f[ar] - second > 1e-3f * top) bad++;
    }
    char shape[160];
    snprintf(shape, sizeof shape, "%s (%d rows, argmax diff %d)", model, rows, bad);
    report(what, shape, a, bad ? INFINITY : r, tol);
}

static int32_t *read_tokens(const char *dir, int *n) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokens", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    int32_t *t = xmalloc(1 << 16);
    int c = 0, v;
    while (c < (1 << 14) && fscanf(f, " %*[[,] %d", &v) == 1) t[c++] = v;
    fclose(f);
    *n = c;
    return t;
}

/* n greedy steps (the CPU session's choice) on both sessions; false after a message. */
static bool decode_both(ds4_session *cpu, ds4_session *gpu, int n, int V) {
    char err[512];
    for (int step = 0; step < n; step++) {
        const int32_t next = argmax(ds4_session_logits(cpu), V);
        if (ds4_session_decode(cpu, next, err, sizeof err) || ds4_session_decode(gpu, next, err, sizeof err)) {
            fprintf(stderr, "cuda-ops: decode: %s\n", err);
            n_failed++;
            return false;
        }
    }
    return true;
}

/* Directional steering on CUDA (see the header). plain: the CUDA engine
 * without a file, the bit-for-bit reference of zero scales. */
static void run_steering(const char *path, ds4_engine *plain, int numerics, const int32_t *toks, int n, int ctx,
                         double tol) {
    char err[512], file[] = "/tmp/cuda-ops-steer-XXXXXX";
    const int L = ds4_engine_n_layers(plain), E = ds4_engine_n_embd(plain), V = ds4_engine_n_vocab(plain);
    const int fd = mkstemp(file);
    float *dir = xmalloc((size_t)L * E * sizeof(float));
    for (int l = 0; l < L; l++) {
        double norm = 0;
        fill(dir + (size_t)l * E, (size_t)E, 1.0f);
        for (int i = 0; i < E; i++) norm += (double)dir[(size_t)l * E + i] * dir[(size_t)l * E + i];
        for (int i = 0; i < E; i++) dir[(size_t)l * E + i] = (float)(dir[(size_t)l * E + i] / sqrt(norm));
    }
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    const bool written = f && fwrite(dir, sizeof(float), (size_t)L * E, f) == (size_t)L * E;
    if (f) fclose(f);
    free(dir);
    ds4_engine *cpu = written ? load_steered(path, false, numerics, ctx, file) : NULL;
    ds4_engine *gpu = cpu ? load_steered(path, true, numerics, ctx, file) : NULL;
    float *lc = xmalloc((size_t)n * V * sizeof(float)), *lg = xmalloc((size_t)n * V * sizeof(float));
    float *lp = xmalloc((size_t)n * V * sizeof(float));
    ds4_session *zp = NULL, *zg = NULL, *sc = NULL, *sg = NULL, *uc = NULL, *ug = NULL;
    if (!gpu) { fprintf(stderr, "cuda-ops: steering setup failed\n"); n_failed++; goto out; }
    zp = ds4_session_new(plain, ctx, err, sizeof err);
    zg = ds4_session_new(gpu, ctx, err, sizeof err);
    sc = ds4_session_new(cpu, ctx, err, sizeof err);
    sg = ds4_session_new(gpu, ctx, err, sizeof err);
    uc = ds4_session_new(cpu, ctx, err, sizeof err);
    ug = ds4_session_new(gpu, ctx, err, sizeof err);
    /* zero scales first, so uc/ug capture their decode graphs before the file reaches the device */
    if (!zp || !zg || !sc || !sg || !uc || !ug || ds4_session_set_steering(zg, 0, 0, err, sizeof err) ||
        ds4_session_set_steering(uc, 0, 0, err, sizeof err) || ds4_session_set_steering(ug, 0, 0, err, sizeof err) ||
        ds4_session_set_steering(sc, 0.8f, -0.4f, err, sizeof err) ||
        ds4_session_set_steering(sg, 0.8f, -0.4f, err, sizeof err) ||
        ds4_session_prefill(zp, toks, n, lp, NULL, NULL, err, sizeof err) ||
        ds4_session_prefill(zg, toks, n, lg, NULL, NULL, err, sizeof err) ||
        ds4_session_prefill(uc, toks, n / 2, NULL, NULL, NULL, err, sizeof err) ||
        ds4_session_prefill(ug, toks, n / 2, NULL, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "cuda-ops: steering: %s\n", err);
        n_failed++;
        goto out;
    }
    const int zero_prefill = memcmp(lg, lp, (size_t)n * V * sizeof(float)) != 0;
    report("steer_zero_prefill", path, zero_prefill, zero_prefill, 0);
    if (!decode_both(zp, zg, 4, V) || !decode_both(uc, ug, 2, V)) goto out;
    const int zero_decode = memcmp(ds4_session_logits(zg), ds4_session_logits(zp), (size_t)V * sizeof(float)) != 0;
    report("steer_zero_decode4", path, zero_decode, zero_decode, 0);
    if (ds4_session_prefill(sc, toks, n, lc, NULL, NULL, err, sizeof err) ||
        ds4_session_prefill(sg, toks, n, lg, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "cuda-ops: steered prefill: %s\n", err);
        n_failed++;
        goto out;
    }
    compare_rows("steer_prefill", path, lg, lc, n, V, tol);
    double moved, rel;
    errs(lc, lp, (size_t)n * V, &moved, &rel);
    /* the steered CPU run is far from the unsteered one, so a backend ignoring the file fails steer_prefill */
    report("steer_moves_logits", path, moved, rel > 10 * tol ? 0 : INFINITY, 0);
    if (!decode_both(sc, sg, 4, V)) goto out;
    compare_rows("steer_decode4", path, ds4_session_logits(sg), ds4_session_logits(sc), 1, V, tol);
    /* the file is on the device now: ug's graph, captured without it, is captured again */
    if (ds4_session_set_steering(uc, -0.5f, 0.3f, err, sizeof err) ||
        ds4_session_set_steering(ug, -0.5f, 0.3f, err, sizeof err)) {
        fprintf(stderr, "cuda-ops: steering: %s\n", err);
        n_failed++;
        goto out;
    }
    if (!decode_both(uc, ug, 3, V)) goto out;
    compare_rows("steer_recaptured", path, ds4_session_logits(ug), ds4_session_logits(uc), 1, V, tol);
out:
    ds4_session_free(zp); ds4_session_free(zg); ds4_session_free(sc);
    ds4_session_free(sg); ds4_session_free(uc); ds4_session_free(ug);
    ds4_engine_free(cpu);
    ds4_engine_free(gpu);
    free(lc); free(lg); free(lp);
    if (fd >= 0) unlink(file);
}

static void run_model(const char *path, const char *gold, int numerics, int n_tokens, double tol) {
    char err[512];
    int n = n_tokens;
    int32_t *toks = gold ? read_tokens(gold, &n) : NULL;
    if (gold && !toks) { fprintf(stderr, "cuda-ops: cannot read %s/tokens\n", gold); n_failed++; return; }
    const int ctx = n + 32;
    ds4_engine *cpu = load(path, false, numerics, ctx), *gpu = load(path, true, numerics, ctx);
    if (!cpu || !gpu) { n_failed++; ds4_engine_free(cpu); ds4_engine_free(gpu); free(toks); return; }
    const int V = ds4_engine_n_vocab(cpu);
    if (!toks) {
        toks = xmalloc((size_t)n * sizeof(int32_t));
        for (int i = 0; i < n; i++) toks[i] = (int32_t)((frand() + 1.0f) * 0.5f * (V - 1));
    }
    float *lc = xmalloc((size_t)n * V * sizeof(float)), *lg = xmalloc((size_t)n * V * sizeof(float));
    ds4_session *sc = ds4_session_new(cpu, ctx, err, sizeof err), *sg = ds4_session_new(gpu, ctx, err, sizeof err);
    if (!sc || !sg || ds4_session_prefill(sc, toks, n, lc, NULL, NULL, err, sizeof err) ||
        ds4_session_prefill(sg, toks, n, lg, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "cuda-ops: %s: %s\n", path, err);
        n_failed++;
        goto out;
    }
    compare_rows("model_prefill", path, lg, lc, n, V, tol);
    if (gold) {
        char lp[512];
        snprintf(lp, sizeof lp, "%s/logits", gold);
        FILE *f = fopen(lp, "rb");
        float *g = xmalloc((size_t)n * V * sizeof(float));
        if (f && fread(g, sizeof(float), (size_t)n * V, f) == (size_t)n * V) compare_rows("model_vs_gold", path, lg, g, n, V, tol);
        else { fprintf(stderr, "cuda-ops: cannot read %s\n", lp); n_failed++; }
        if (f) fclose(f);
        free(g);
    }
    /* decode: the first step captures the graph, the rest replay it */
    for (int step = 0; step < 8; step++) {
        const int32_t next = argmax(ds4_session_logits(sc), V);
        if (ds4_session_decode(sc, next, err, sizeof err) || ds4_session_decode(sg, next, err, sizeof err)) {
            fprintf(stderr, "cuda-ops: decode: %s\n", err);
            n_failed++;
            goto out;
        }
    }
    compare_rows("model_decode8", path, ds4_session_logits(sg), ds4_session_logits(sc), 1, V, tol);
    {   /* batched == solo: two sessions stepped together give each one's solo logits, bit for bit */
        ds4_session *a = ds4_session_new(gpu, ctx, err, sizeof err), *b2 = ds4_session_new(gpu, ctx, err, sizeof err);
        ds4_session *solo = ds4_session_new(gpu, ctx, err, sizeof err);
        const int32_t next[2] = {toks[0], toks[n - 1]};
        int differ = -1;
        if (a && b2 && solo && !ds4_session_prefill(a, toks, n, NULL, NULL, NULL, err, sizeof err) &&
            !ds4_session_prefill(b2, toks, n / 2, NULL, NULL, NULL, err, sizeof err) &&
            !ds4_session_prefill(solo, toks, n / 2, NULL, NULL, NULL, err, sizeof err) &&
            !ds4_session_decode(solo, next[1], err, sizeof err)) {
            ds4_step steps[2] = {{a, &next[0], 1}, {b2, &next[1], 1}};
            if (!ds4_sessions_step(gpu, steps, 2, err, sizeof err))
                differ = memcmp(ds4_session_logits(b2), ds4_session_logits(solo), (size_t)V * sizeof(float)) != 0;
        }
        if (differ < 0) fprintf(stderr, "cuda-ops: batched step: %s\n", err);
        report("batched_vs_solo", path, differ < 0 ? INFINITY : differ, differ < 0 ? INFINITY : differ, 0);
        ds4_session_free(a);
        ds4_session_free(b2);
        ds4_session_free(solo);
    }
    {   /* the CUDA session's payload continues on the CPU */
        const size_t pb = ds4_session_payload_bytes(sg);
        void *payload = xmalloc(pb);
        ds4_session_save_payload(sg, payload);
        ds4_session *moved = ds4_session_new(cpu, ctx, err, sizeof err);
        const int32_t next = argmax(ds4_session_logits(sc), V);
        if (!moved || ds4_session_load_payload(moved, payload, pb, err, sizeof err) ||
            ds4_session_decode(moved, next, err, sizeof err) || ds4_session_decode(sc, next, err, sizeof err)) {
            fprintf(stderr, "cuda-ops: payload: %s\n", err);
            n_failed++;
        } else {
            compare_rows("payload_cuda2cpu", path, ds4_session_logits(moved), ds4_session_logits(sc), 1, V, tol);
        }
        ds4_session_free(moved);
        free(payload);
    }
    run_steering(path, gpu, numerics, toks, n, ctx, tol);
out:
    ds4_session_free(sc);
    ds4_session_free(sg);
    ds4_engine_free(cpu);
    ds4_engine_free(gpu);
    free(lc); free(lg); free(toks);
}

int main(int argc, char **argv) {
    char err[256];
    if (ds4_cu_probe(err, sizeof err)) {
        fprintf(stderr, "cuda-ops: no usable GPU: %s\n", err);
        return 2;
    }
    int numerics = 0, n_tokens = 64, models = 0;
    double tol = 1e-3;
    const char *gold = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--numerics") && v) { numerics = !strcmp(v, "ds4"); i++; }
        else if (!strcmp(a, "--tokens") && v) { n_tokens = atoi(v) > 0 ? atoi(v) : 64; i++; }
        else if (!strcmp(a, "--gold") && v) { gold = v; i++; }
        else if (!strcmp(a, "--tol") && v) { tol = atof(v) > 0 ? atof(v) : tol; i++; }
        else if (!strcmp(a, "--model") && v) { run_model(v, gold, numerics, n_tokens, tol); gold = NULL; models++; i++; }
        else {
            fprintf(stderr, "usage: cuda-ops [--numerics exact|ds4] [--tokens N] [--tol R] [[--gold DIR] --model M.gguf]...\n");
            return 2;
        }
    }
    if (!models) run_ops();
    printf("cuda-ops: %d checks, %d failed\n", n_checks, n_failed);
    return n_failed ? 1 : 0;
}
