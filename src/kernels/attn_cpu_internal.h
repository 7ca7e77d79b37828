/* attn_cpu_internal.h -- the weighted row sum of ds4_attn_heads at each
 * SIMD level (one body, attn_cpu_accum.h; identical results at every
 * level). Calling the AVX2 / AVX-512 ones is only allowed once
 * ds4_kernels_level() has cleared that level. */
#ifndef DS4_ATTN_CPU_INTERNAL_H
#define DS4_ATTN_CPU_INTERNAL_H

void ds4_attn_accum_sse2(const float *weights, int n_heads, int n, const float *const *rows, int D, float *out);
void ds4_attn_accum_avx2(const float *weights, int n_heads, int n, const float *const *rows, int D, float *out);
void ds4_attn_accum_avx512(const float *weights, int n_heads, int n, const float *const *rows, int D, float *out);

#endif
