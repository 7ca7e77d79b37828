/* forward_cpu_math.c -- small numeric pieces of the DS4 forward pass:
 * ds4's storage round trips (FP8/FP4/Hadamard/F16) and the bounded top-k. */
#include "forward_cpu.h"
#include "forward_cpu_impl.h"
#include "quant.h"

#include <math.h>

/* 2^ceil(log2(r)) for r > 0, exact (no log rounding at powers of two). */
static float pow2_ceil(float r) {
    int e;
    float m = frexpf(r, &e);            /* r = m * 2^e, m in [0.5, 1) */
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

/* Nearest E4M3 value of v in [0, 448], ties to the even code. Normal codes
 * (exponent >= 1) step by 2^(exp-3), subnormals by 2^-9; code parity equals
 * the parity of the integer rintf() rounds to, so rintf's ties-to-even is it. */
static float e4m3_round(float v) {
    if (v < 0x1p-6f) return rintf(v * 512.0f) / 512.0f;
    int e;
    frexpf(v, &e);                      /* v in [2^(e-1), 2^e) */
    float step = ldexpf(1.0f, e - 1 - 3);
    float r = rintf(v / step) * step;
    return r > 448.0f ? 448.0f : r;
}

void ds4_fp8_e4m3_roundtrip(float *x, int n) {
    for (int b = 0; b < n; b += 64) {
        float amax = 1e-4f;
        for (int i = 0; i < 64; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float scale = pow2_ceil(amax / 448.0f);
        for (int i = 0; i < 64; i++) {
            if (isnan(x[b + i])) continue;   /* a fault stays visible (fminf would clamp it to 448) */
            float v = fminf(fabsf(x[b + i]) / scale, 448.0f);
            x[b + i] = copysignf(e4m3_round(v), x[b + i]) * scale;
        }
    }
}

static const float e2m1_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

void ds4_fp4_e2m1_roundtrip(float *x, int n) {
    for (int b = 0; b < n; b += 32) {
        float amax = 6.0f * 0x1p-126f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float scale = pow2_ceil(amax / 6.0f);
        for (int i = 0; i < 32; i++) {
            if (isnan(x[b + i])) continue;   /* a fault stays visible (fminf would clamp it to 6) */
            float v = fminf(fabsf(x[b + i]) / scale, 6.0f);
            int best = 0;
            for (int k = 1; k < 8; k++) {
                float d = fabsf(v - e2m1_mag[k]), db = fabsf(v - e2m1_mag[best]);
                if (d < db || (d == db && (k & 1) == 0)) best = k;
            }
            x[b + i] = copysignf(e2m1_mag[best], x[b + i]) * scale;
        }
    }
}

void ds4_hadamard(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

void fwd_f16_round(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = ds4_half_to_f32(ds4_f32_to_half(x[i]));
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

int fwd_topk(const float *s, int n, int k, int *out) {
    if (k > n) k = n;
    for (int i = 0; i < k; i++) out[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(out, k, i, s);   /* heap root = worst kept */
    for (int i = k; i < n; i++)
        if (better(s, i, out[0])) { out[0] = i; sift_down(out, k, 0, s); }
    qsort(out, (size_t)k, sizeof(int), cmp_int);
    return k;
}
