/* kernels_cpu_avx512.c -- AVX-512 (F, BW, DQ, VL) + VNNI dot products.
 *
 * Only the formats where 512-bit registers and vpdpbusd change the inner
 * loop are here: the float types, Q8_0 (two blocks per register) and
 * IQ2_XXS (two sub-blocks per register, signs applied through a 64-bit
 * opmask instead of being expanded into bytes). The K-quants return NULL
 * and run the AVX2 kernels, which are already bound by memory bandwidth.
 *
 * vpdpbusd multiplies u8 by s8 and sums groups of four straight into i32,
 * so unlike maddubs there is no i16 intermediate to saturate.
 *
 * As in the AVX2 file, each kernel is written once for NT tokens: NT = 1
 * is the dot, NT = DS4_DOT_TOKENS the matmul micro-kernel, with the same
 * per-token arithmetic so both give identical results.
 */
#include <string.h>

#include "kernels_cpu_simd.h"

/* ---- float weights against f32 activations ---- */

INLINE __m512 load16(enum float_kind k, const void *p, int64_t i, __mmask16 m) {
    switch (k) {
    case KIND_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    case KIND_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
    default: return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    }
}

/* two FMA chains per token; masked loads handle the tail */
INLINE void float_nt(enum float_kind k, const void *w, const void *acts, size_t stride, int64_t n, int nt,
                     float *out) {
    __m512 acc[NT_MAX][2];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 w0 = load16(k, w, i, 0xFFFF), w1 = load16(k, w, i + 16, 0xFFFF);
        UNROLL
        for (int t = 0; t < nt; t++) {
            const float *a = tok(acts, stride, t);
            acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(a + i), acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(a + i + 16), acc[t][1]);
        }
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 w0 = load16(k, w, i, m);
        UNROLL
        for (int t = 0; t < nt; t++)
            acc[t][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, (const float *)tok(acts, stride, t) + i),
                                        acc[t][0]);
    }
    UNROLL
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
}

FLOAT_KERNELS

/* ---- Q8_0 x Q8_0 ---- */

INLINE __m512i pair256(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(lo)), _mm256_loadu_si256(hi), 1);
}

/* an odd last block is paired with itself and weighted 0 in the high half;
 * the weights' |x| and sign mask are shared by all tokens */
INLINE void q8_0_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    const ds4_block_q8_0 *x = w;
    int64_t nb = n / DS4_QK8_0;
    __m512 acc[NT_MAX];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        int64_t b1 = b + 1 < nb ? b + 1 : b;
        __m512i qx = pair256(x[b].qs, x[b1].qs);
        __mmask64 neg = _mm512_movepi8_mask(qx);
        __m512i ux = _mm512_abs_epi8(qx);
        float d0 = h2f(x[b].d), d1 = b1 != b ? h2f(x[b1].d) : 0.0f;
        UNROLL
        for (int t = 0; t < nt; t++) {
            const ds4_block_q8_0 *y = tok(acts, stride, t);
            __m512i qy = pair256(y[b].qs, y[b1].qs);
            __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ux,
                                            _mm512_mask_sub_epi8(qy, neg, _mm512_setzero_si512(), qy));
            __m512 d = _mm512_insertf32x8(_mm512_set1_ps(d0 * h2f(y[b].d)), _mm256_set1_ps(d1 * h2f(y[b1].d)), 1);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}
DOT_ENTRY_POINTS(q8_0)

/* ---- IQ2_XXS x Q8_K ----
 * One sub-block (32 elements) takes 32 mask bits: the ksigns byte of each
 * group of eight. Two sub-blocks fill a register and a 64-bit mask. */
INLINE uint32_t iq2_sign_mask(uint32_t W) {
    return (uint32_t)ds4_ksigns_iq2xs[W & 127] | (uint32_t)ds4_ksigns_iq2xs[(W >> 7) & 127] << 8 |
           (uint32_t)ds4_ksigns_iq2xs[(W >> 14) & 127] << 16 | (uint32_t)ds4_ksigns_iq2xs[(W >> 21) & 127] << 24;
}

/* sub-blocks b, b+1 of super-block i into every token's sum */
INLINE void iq2_two_subblocks(const uint8_t *q, const void *acts, size_t stride, int64_t i, int b, int nt,
                              __m512i sumi[]) {
    uint32_t W0, W1;
    memcpy(&W0, q + 4, 4);
    memcpy(&W1, q + 12, 4);
    __m512i grid = _mm512_setr_epi64((long long)ds4_iq2xxs_grid[q[0]], (long long)ds4_iq2xxs_grid[q[1]],
                                     (long long)ds4_iq2xxs_grid[q[2]], (long long)ds4_iq2xxs_grid[q[3]],
                                     (long long)ds4_iq2xxs_grid[q[8]], (long long)ds4_iq2xxs_grid[q[9]],
                                     (long long)ds4_iq2xxs_grid[q[10]], (long long)ds4_iq2xxs_grid[q[11]]);
    __mmask64 neg = (__mmask64)iq2_sign_mask(W0) | (__mmask64)iq2_sign_mask(W1) << 32;
    __m512i scale = _mm512_inserti64x4(_mm512_set1_epi32((int)(2 * (W0 >> 28) + 1)),
                                       _mm256_set1_epi32((int)(2 * (W1 >> 28) + 1)), 1);
    UNROLL
    for (int t = 0; t < nt; t++) {
        const ds4_block_q8_K *y = (const ds4_block_q8_K *)tok(acts, stride, t) + i;
        __m512i av = _mm512_loadu_si512(y->qs + 32 * b);
        __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), grid,
                                        _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av));
        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(s, scale));
    }
}

INLINE void iq2_xxs_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    const ds4_block_iq2_xxs *x = w;
    __m512 acc[NT_MAX];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        const uint8_t *q = (const uint8_t *)x[i].qs;
        __m512i sumi[NT_MAX];
        UNROLL
        for (int t = 0; t < nt; t++) sumi[t] = _mm512_setzero_si512();
        UNROLL
        for (int b = 0; b < 8; b += 2) iq2_two_subblocks(q + 8 * b, acts, stride, i, b, nt, sumi);
        float dx = 0.125f * h2f(x[i].d);
        UNROLL
        for (int t = 0; t < nt; t++) {
            const ds4_block_q8_K *y = (const ds4_block_q8_K *)tok(acts, stride, t) + i;
            acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(dx * y->d), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}
DOT_ENTRY_POINTS(iq2_xxs)

/* ---- plain read loop (bandwidth denominator) ---- */

float ds4_kernels_avx512_read_sum(const float *x, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(x + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(x + i + 48));
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; i < n; i++) s += x[i];
    return s;
}

/* the K-quants fall back to the AVX2 kernels */
#define NO_EXTRA(prefix)

ds4_dot_fn ds4_kernels_avx512_dot(uint32_t type) { DISPATCH(dot_, NO_EXTRA) }
ds4_dotn_fn ds4_kernels_avx512_dotn(uint32_t type) { DISPATCH(dotn_, NO_EXTRA) }
