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
 */
#include <immintrin.h>
#include <string.h>

#include "kernels_cpu_internal.h"
#include "quant.h"

static inline float h2f(ds4_half h) { return _cvtsh_ss(h); }

/* ---- float weights against f32 activations ---- */

enum float_kind { KIND_F32, KIND_F16, KIND_BF16 };

static inline __attribute__((always_inline)) __m512 load16(enum float_kind k, const void *p, int64_t i,
                                                           __mmask16 m) {
    switch (k) {
    case KIND_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    case KIND_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
    default: return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    }
}

/* masked loads handle the tail, so there is no scalar remainder loop */
static inline __attribute__((always_inline)) float dot_float(enum float_kind k, const void *w, const float *a,
                                                            int64_t n) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        acc0 = _mm512_fmadd_ps(load16(k, w, i, 0xFFFF), _mm512_loadu_ps(a + i), acc0);
        acc1 = _mm512_fmadd_ps(load16(k, w, i + 16, 0xFFFF), _mm512_loadu_ps(a + i + 16), acc1);
        acc2 = _mm512_fmadd_ps(load16(k, w, i + 32, 0xFFFF), _mm512_loadu_ps(a + i + 32), acc2);
        acc3 = _mm512_fmadd_ps(load16(k, w, i + 48, 0xFFFF), _mm512_loadu_ps(a + i + 48), acc3);
    }
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        acc0 = _mm512_fmadd_ps(load16(k, w, i, m), _mm512_maskz_loadu_ps(m, a + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

static float dot_f32(const void *w, const void *a, int64_t n) { return dot_float(KIND_F32, w, a, n); }
static float dot_f16(const void *w, const void *a, int64_t n) { return dot_float(KIND_F16, w, a, n); }
static float dot_bf16(const void *w, const void *a, int64_t n) { return dot_float(KIND_BF16, w, a, n); }

/* ---- Q8_0 x Q8_0 ---- */

static inline __m512i pair256(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(lo)), _mm256_loadu_si256(hi), 1);
}

/* Σ x·y per group of four, for signed x: |x| as the unsigned operand and
 * the sign moved onto y */
static inline __m512i dot_s8s8(__m512i x, __m512i y) {
    __mmask64 neg = _mm512_movepi8_mask(x);
    __m512i ys = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), ys);
}

/* an odd last block is paired with itself and weighted 0 in the high half */
static float dot_q8_0(const void *w, const void *act, int64_t n) {
    const ds4_block_q8_0 *x = w, *y = act;
    int64_t nb = n / DS4_QK8_0;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        int64_t b1 = b + 1 < nb ? b + 1 : b;
        float d1 = b1 != b ? h2f(x[b1].d) * h2f(y[b1].d) : 0.0f;
        __m512i s = dot_s8s8(pair256(x[b].qs, x[b1].qs), pair256(y[b].qs, y[b1].qs));
        __m512 d = _mm512_insertf32x8(_mm512_set1_ps(h2f(x[b].d) * h2f(y[b].d)), _mm256_set1_ps(d1), 1);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* ---- IQ2_XXS x Q8_K ----
 * One sub-block (32 elements) takes 32 mask bits: the ksigns byte of each
 * group of eight. Two sub-blocks fill a register and a 64-bit mask. */
static inline uint32_t iq2_sign_mask(uint32_t W) {
    return (uint32_t)ds4_ksigns_iq2xs[W & 127] | (uint32_t)ds4_ksigns_iq2xs[(W >> 7) & 127] << 8 |
           (uint32_t)ds4_ksigns_iq2xs[(W >> 14) & 127] << 16 | (uint32_t)ds4_ksigns_iq2xs[(W >> 21) & 127] << 24;
}

static inline __m512i iq2_two_subblocks(const uint8_t *q, const int8_t *a) {
    uint32_t W0, W1;
    memcpy(&W0, q + 4, 4);
    memcpy(&W1, q + 12, 4);
    __m512i grid = _mm512_setr_epi64((long long)ds4_iq2xxs_grid[q[0]], (long long)ds4_iq2xxs_grid[q[1]],
                                     (long long)ds4_iq2xxs_grid[q[2]], (long long)ds4_iq2xxs_grid[q[3]],
                                     (long long)ds4_iq2xxs_grid[q[8]], (long long)ds4_iq2xxs_grid[q[9]],
                                     (long long)ds4_iq2xxs_grid[q[10]], (long long)ds4_iq2xxs_grid[q[11]]);
    __mmask64 neg = (__mmask64)iq2_sign_mask(W0) | (__mmask64)iq2_sign_mask(W1) << 32;
    __m512i av = _mm512_loadu_si512((const void *)a);
    __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), grid,
                                    _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av));
    __m512i scale = _mm512_inserti64x4(_mm512_set1_epi32((int)(2 * (W0 >> 28) + 1)),
                                       _mm256_set1_epi32((int)(2 * (W1 >> 28) + 1)), 1);
    return _mm512_mullo_epi32(s, scale);
}

static float dot_iq2_xxs(const void *w, const void *act, int64_t n) {
    const ds4_block_iq2_xxs *x = w;
    const ds4_block_q8_K *y = act;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        const uint8_t *q = (const uint8_t *)x[i].qs;
        __m512i sumi = _mm512_setzero_si512();
        for (int b = 0; b < 8; b += 2) sumi = _mm512_add_epi32(sumi, iq2_two_subblocks(q + 8 * b, y[i].qs + 32 * b));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(0.125f * y[i].d * h2f(x[i].d)), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

ds4_dot_fn ds4_kernels_avx512_dot(uint32_t type) {
    switch (type) {
    case DS4_TYPE_F32: return dot_f32;
    case DS4_TYPE_F16: return dot_f16;
    case DS4_TYPE_BF16: return dot_bf16;
    case DS4_TYPE_Q8_0: return dot_q8_0;
    case DS4_TYPE_IQ2_XXS: return dot_iq2_xxs;
    default: return NULL;
    }
}
