/* nn_math.c -- the math both families' forward passes share (see nn_math.h). */
#include "nn/nn_math.h"
#include "kernels/kernels_cpu.h"
#include "kernels/quant.h"
#include "base/threadpool.h"

#include <stdlib.h>

typedef struct { uint32_t type; const float *x; int64_t xstride, n; char *act; size_t act_bytes; } quantize_ctx;

static void quantize_rows(void *ctx, int first, int end) {
    const quantize_ctx *q = ctx;
    for (int t = first; t < end; t++)
        ds4_quantize_act(q->type, q->x + (size_t)t * q->xstride, q->act + (size_t)t * q->act_bytes, q->n);
}

void ds4_linear(ds4_pool *pool, void *act, const ds4_tensor *W, int64_t mat, int64_t row0, int64_t rows,
                const float *x, int64_t xstride, int T, float *y) {
    const int64_t n = W->ne[0];
    quantize_ctx q = {W->type, x, xstride, n, act, ds4_act_bytes(W->type, n)};
    ds4_pool_run_ranges(pool, T, quantize_rows, &q);
    const char *w = (const char *)W->data + ((size_t)mat * (size_t)W->ne[1] + (size_t)row0) * W->row_bytes;
    if (T == 1) ds4_matvec(pool, W->type, w, rows, n, act, y);
    else ds4_matmul(pool, W->type, w, rows, n, act, T, y);
}

/* The sum of squares runs as RMS_PARTS interleaved partial sums, added in a
 * fixed tree at the end: one running double sum is a chain of dependent
 * adds (four cycles each), and the norms of a V4 decode step cover some
 * 300k values (the hyper-connection rows, every query head); eight sums
 * give the compiler independent adds to vectorize. Each square is exact in
 * double, so only the order of the additions changes. */
enum { RMS_PARTS = 8 };

static inline double square(float v) { return (double)v * v; }

static double sum_of_squares(const float *x, int n) {
    /* named sums, not an array: gcc kept an array of them in memory */
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    int i = 0;
    for (; i + RMS_PARTS <= n; i += RMS_PARTS) {
        s0 += square(x[i]), s1 += square(x[i + 1]), s2 += square(x[i + 2]), s3 += square(x[i + 3]);
        s4 += square(x[i + 4]), s5 += square(x[i + 5]), s6 += square(x[i + 6]), s7 += square(x[i + 7]);
    }
    /* the last n % 8 elements, each into its own sum (adding 0 changes none) */
    double tail[RMS_PARTS] = {0};
    for (int j = 0; i + j < n; j++) tail[j] = square(x[i + j]);
    s0 += tail[0], s1 += tail[1], s2 += tail[2], s3 += tail[3];
    s4 += tail[4], s5 += tail[5], s6 += tail[6], s7 += tail[7];
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
}

void ds4_rmsnorm(const float *x, const float *w, int n, float eps, enum ds4_rms_rule rule, float *y) {
    const double ss = sum_of_squares(x, n);
    const float r = rule == DS4_RMS_F64 ? (float)(1.0 / sqrt(ss / n + eps)) : 1.0f / sqrtf((float)(ss / n) + eps);
    if (w)
        for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
    else
        for (int i = 0; i < n; i++) y[i] = x[i] * r;
}

void ds4_rope_rotate(float *x, int n_rot, const float *cs, bool inverse) {
    for (int i = 0; i < n_rot / 2; i++) ds4_rope_pair(x + 2 * i, cs[2 * i], inverse ? -cs[2 * i + 1] : cs[2 * i + 1]);
}

typedef struct { float *gate; const float *up; int width; float limit; } swiglu_ctx;

/* fminf(x, hi) and fminf(fmaxf(x, lo), hi) as comparisons: the same values,
 * a NaN x included (it becomes the bound, as with fminf/fmaxf), without the
 * libm calls gcc makes for those (x86 min/max instructions treat NaN
 * otherwise) */
static inline float at_most(float x, float hi) { return x <= hi ? x : hi; }
static inline float clamped(float x, float lo, float hi) { return at_most(x >= lo ? x : lo, hi); }

static void swiglu_rows(void *ctx, int first, int end) {
    const swiglu_ctx *sw = ctx;
    for (size_t i = (size_t)first * sw->width; i < (size_t)end * sw->width; i++) {
        float g = at_most(sw->gate[i], sw->limit), u = clamped(sw->up[i], -sw->limit, sw->limit);
        sw->gate[i] = g / (1.0f + expf(-g)) * u;
    }
}

void ds4_swiglu(ds4_pool *pool, float *gate, const float *up, int rows, int width, float limit) {
    swiglu_ctx sw = {gate, up, width, limit};
    ds4_pool_run_ranges(pool, rows, swiglu_rows, &sw);
}

/* ---- top-k: a min-heap of the k best (score desc, index asc) ---- */

static bool better(const float *s, int a, int b) { return s[a] > s[b] || (s[a] == s[b] && a < b); }

static void sift_down(int *h, int n, int i, const float *s) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(s, h[w], h[l])) w = l;
        if (r < n && better(s, h[w], h[r])) w = r;
        if (w == i) return;
        int t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

static int cmp_int(const void *a, const void *b) { return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b); }

int ds4_topk(const float *s, int n, int k, int *out) {
    if (k > n) k = n;
    for (int i = 0; i < k; i++) out[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(out, k, i, s);   /* heap root = worst kept */
    for (int i = k; i < n; i++)
        if (better(s, i, out[0])) { out[0] = i; sift_down(out, k, 0, s); }
    qsort(out, (size_t)k, sizeof(int), cmp_int);
    return k;
}
