/* attn_cpu.c -- ds4_attn_heads: scores, softmax with sink, and the weighted
 * row sum dispatched to the widest SIMD level in use (attn_cpu_accum.h). */
#include "kernels/attn_cpu.h"
#include "kernels/attn_cpu_internal.h"
#include "kernels/kernels_cpu.h"
#include "kernels/quant.h"

#include <math.h>

#define ATTN_VEC_BYTES 16
#define ATTN_ACCUM ds4_attn_accum_sse2
#include "kernels/attn_cpu_accum.h"

void ds4_attn_heads(const float *q, int n_heads, int D, const float *const *rows, int n, float scale,
                    const float *sinks, float *weights, float *out) {
    /* rows outer: a row stays in L1 while every head's query passes it, and
     * one load of it serves up to 8 heads */
    enum { HEADS_PER_DOT = 8 };
    for (int i = 0; i < n; i++)
        for (int h0 = 0; h0 < n_heads; h0 += HEADS_PER_DOT) {
            float dots[HEADS_PER_DOT];
            const int nh = n_heads - h0 < HEADS_PER_DOT ? n_heads - h0 : HEADS_PER_DOT;
            ds4_vec_dotn(DS4_TYPE_F32, rows[i], q + (size_t)h0 * D, (size_t)D * sizeof(float), D, nh, dots);
            for (int h = 0; h < nh; h++) weights[(size_t)(h0 + h) * n + i] = dots[h] * scale;
        }
    for (int h = 0; h < n_heads; h++) {
        float *p = weights + (size_t)h * n, mx = sinks[h];
        for (int i = 0; i < n; i++) mx = fmaxf(mx, p[i]);
        double den = exp((double)sinks[h] - mx);
        for (int i = 0; i < n; i++) { p[i] = (float)exp((double)p[i] - mx); den += p[i]; }
        for (int i = 0; i < n; i++) p[i] = (float)(p[i] / den);
    }
    const enum ds4_simd_level level = ds4_kernels_level();
    if (level >= DS4_SIMD_AVX512) ds4_attn_accum_avx512(weights, n_heads, n, rows, D, out);
    else if (level >= DS4_SIMD_AVX2) ds4_attn_accum_avx2(weights, n_heads, n, rows, D, out);
    else ds4_attn_accum_sse2(weights, n_heads, n, rows, D, out);
}
