/* kernels_cpu_avx2.c -- AVX2/FMA/F16C dot products (gguf-and-quants.md
 * section 10): integer multiply-accumulate inside each block, one float
 * multiply per block or super-block.
 *
 * The workhorse is maddubs (u8 x s8 -> pairs summed into i16). Every weight
 * format here is made unsigned first (Q8_0 via abs/sign, Q6_K via its +32
 * offset, IQ2_XXS by moving the signs onto the activation), and the sheet's
 * bound "two adjacent products stay below 2^15" makes the i16 step exact.
 * The following madd by the sub-block scale widens to i32.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels_cpu_internal.h"
#include "quant.h"

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float h2f(ds4_half h) { return _cvtsh_ss(h); }

/* ---- float weights against f32 activations ---- */

enum float_kind { KIND_F32, KIND_F16, KIND_BF16 };

static inline __attribute__((always_inline)) __m256 load8(enum float_kind k, const void *p, int64_t i) {
    switch (k) {
    case KIND_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    case KIND_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
    default: return _mm256_loadu_ps((const float *)p + i);
    }
}

static inline __attribute__((always_inline)) float load1(enum float_kind k, const void *p, int64_t i) {
    switch (k) {
    case KIND_F16: return h2f(((const uint16_t *)p)[i]);
    case KIND_BF16: return ds4_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static inline __attribute__((always_inline)) float dot_float(enum float_kind k, const void *w, const float *a,
                                                            int64_t n) {
    /* four chains hide the FMA latency */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(load8(k, w, i), _mm256_loadu_ps(a + i), acc0);
        acc1 = _mm256_fmadd_ps(load8(k, w, i + 8), _mm256_loadu_ps(a + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(load8(k, w, i + 16), _mm256_loadu_ps(a + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(load8(k, w, i + 24), _mm256_loadu_ps(a + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load8(k, w, i), _mm256_loadu_ps(a + i), acc0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; i++) s += load1(k, w, i) * a[i];
    return s;
}

static float dot_f32(const void *w, const void *a, int64_t n) { return dot_float(KIND_F32, w, a, n); }
static float dot_f16(const void *w, const void *a, int64_t n) { return dot_float(KIND_F16, w, a, n); }
static float dot_bf16(const void *w, const void *a, int64_t n) { return dot_float(KIND_BF16, w, a, n); }

/* ---- Q8_0 x Q8_0 ---- */

static inline __m256 q8_0_block(const ds4_block_q8_0 *x, const ds4_block_q8_0 *y, __m256 acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i qx = _mm256_loadu_si256((const __m256i *)x->qs);
    __m256i qy = _mm256_loadu_si256((const __m256i *)y->qs);
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
    __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
    return _mm256_fmadd_ps(s, _mm256_set1_ps(h2f(x->d) * h2f(y->d)), acc);
}

static float dot_q8_0(const void *w, const void *act, int64_t n) {
    const ds4_block_q8_0 *x = w, *y = act;
    int64_t nb = n / DS4_QK8_0, b = 0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    for (; b + 2 <= nb; b += 2) {
        acc0 = q8_0_block(x + b, y + b, acc0);
        acc1 = q8_0_block(x + b + 1, y + b + 1, acc1);
    }
    if (b < nb) acc0 = q8_0_block(x + b, y + b, acc0);
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

/* ---- K-quants x Q8_K ---- */

/* Broadcast helpers: a 32-element vector spans two 16-element sub-blocks
 * (low 128-bit lane, high lane), so the i16 multiplier vector carries the
 * scale of sub-block j in the low lane and of j+1 in the high lane. The
 * shuffle masks select byte j / j+1 of a lane-broadcast scale vector, with
 * 0x80 (zero) for the high byte; adding 2 per step keeps 0x80 bytes >= 0x80. */
static inline __m256i pair_mask_u8(void) {
    return _mm256_setr_epi8(0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128,
                            1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128);
}

static inline __m256i madd_u8_scaled(__m256i q, const int8_t *a, __m256i scale16) {
    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)a));
    return _mm256_madd_epi16(p, scale16);
}

static float dot_q2_K(const void *w, const void *act, int64_t n) {
    const ds4_block_q2_K *x = w;
    const ds4_block_q8_K *y = act;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i two = _mm256_set1_epi8(2);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].dmin)),
                               _mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, bs)), accm);

        __m256i scales = _mm256_broadcastsi128_si256(_mm_and_si128(sc8, m4));
        __m256i mask = pair_mask_u8();
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            const int8_t *a = y[i].qs + 128 * h;
            for (int k = 0; k < 4; k++) {
                __m256i qk = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
                sumi = _mm256_add_epi32(sumi, madd_u8_scaled(qk, a + 32 * k, _mm256_shuffle_epi8(scales, mask)));
                mask = _mm256_add_epi8(mask, two);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc) - hsum_ps(accm);
}

/* Shared by Q4_K and Q5_K: decodes the 6-bit codes (sheet 5.2) into sm
 * (scales in bytes 0..7, mins in 8..15) and folds dmin·Σ m_j·(the two
 * bsums of sub-block j) into accm. */
static inline void k4_prepare(const uint8_t *S, const ds4_block_q8_K *y, float dmin, uint8_t sm[16],
                              __m256 *accm) {
    for (int j = 0; j < 4; j++) {
        sm[j] = S[j] & 63;
        sm[8 + j] = S[j + 4] & 63;
        sm[4 + j] = (uint8_t)((S[j + 8] & 15) | ((S[j] >> 6) << 4));
        sm[12 + j] = (uint8_t)((S[j + 8] >> 4) | ((S[j + 4] >> 6) << 4));
    }
    __m128i v = _mm_loadu_si128((const __m128i *)sm);
    __m128i mins = _mm_unpackhi_epi8(v, v); /* m_j twice: one per 16-element bsum */
    __m256i p = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mins), _mm256_loadu_si256((const __m256i *)y->bsums));
    *accm = _mm256_fmadd_ps(_mm256_set1_ps(y->d * dmin), _mm256_cvtepi32_ps(p), *accm);
}

static float dot_q4_K(const void *w, const void *act, int64_t n) {
    const ds4_block_q4_K *x = w;
    const ds4_block_q8_K *y = act;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        uint8_t sm[16];
        k4_prepare(x[i].scales, &y[i], h2f(x[i].dmin), sm, &accm);
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const int8_t *a = y[i].qs + 64 * c;
            sumi = _mm256_add_epi32(sumi, madd_u8_scaled(_mm256_and_si256(q, m4), a, _mm256_set1_epi16(sm[2 * c])));
            sumi = _mm256_add_epi32(sumi, madd_u8_scaled(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), a + 32,
                                                         _mm256_set1_epi16(sm[2 * c + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc) - hsum_ps(accm);
}

/* bit j of every byte of qh, moved to bit 4 (the fifth quant bit). The
 * 16-bit shifts cannot leak between bytes because of the mask by 1 first. */
static inline __m256i q5_high(__m256i qh, int j) {
    return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1)), 4);
}

static float dot_q5_K(const void *w, const void *act, int64_t n) {
    const ds4_block_q5_K *x = w;
    const ds4_block_q8_K *y = act;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        uint8_t sm[16];
        k4_prepare(x[i].scales, &y[i], h2f(x[i].dmin), sm, &accm);
        __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const int8_t *a = y[i].qs + 64 * c;
            __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), q5_high(qh, 2 * c));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), q5_high(qh, 2 * c + 1));
            sumi = _mm256_add_epi32(sumi, madd_u8_scaled(lo, a, _mm256_set1_epi16(sm[2 * c])));
            sumi = _mm256_add_epi32(sumi, madd_u8_scaled(hi, a + 32, _mm256_set1_epi16(sm[2 * c + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc) - hsum_ps(accm);
}

static float dot_q6_K(const void *w, const void *act, int64_t n) {
    const ds4_block_q6_K *x = w;
    const ds4_block_q8_K *y = act;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(0x03);
    const __m256i four = _mm256_set1_epi8(4);
    /* i16 scale pairs: word 2p in the low lane, word 2p+1 in the high lane */
    const __m256i base = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        /* the +32 offset of the quants: subtract 32·Σ sc_j·bsum_j */
        __m256i offs = _mm256_slli_epi32(
            _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y[i].bsums)), 5);
        __m256i sumi = _mm256_sub_epi32(_mm256_setzero_si256(), offs);
        for (int h = 0; h < 2; h++) {
            __m256i A = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            __m256i B = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            __m256i H = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_slli_epi16(_mm256_and_si256(H, m2), 4)),
                _mm256_or_si256(_mm256_and_si256(B, m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), m2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), m2), 4)),
            };
            __m256i scales = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                               : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            __m256i mask = base;
            for (int k = 0; k < 4; k++) {
                sumi = _mm256_add_epi32(
                    sumi, madd_u8_scaled(q[k], y[i].qs + 128 * h + 32 * k, _mm256_shuffle_epi8(scales, mask)));
                mask = _mm256_add_epi8(mask, four);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h2f(x[i].d)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

/* ---- IQ2_XXS x Q8_K ----
 * The signs are applied to the activation (sign_epi8), so the grid bytes
 * stay unsigned for maddubs; Q8_K never holds -128, so negation is exact.
 * Sign bits are expanded in registers instead of through ksigns: bit j < 7
 * of group k is bit 7k+j of W, and bit 7 is the parity of the other seven
 * (every group has an even number of negatives, sheet section 6). */
static inline __m256i iq2_sign_bytes(uint32_t W) {
    /* byte 8k+j selects the byte of W holding bit 7k+j, and tests that bit */
    const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, -128, 0, 1, 1, 1, 1, 1, 1, -128,
                                         1, 1, 2, 2, 2, 2, 2, -128, 2, 2, 2, 3, 3, 3, 3, -128);
    const __m256i bit = _mm256_setr_epi8(1, 2, 4, 8, 16, 32, 64, -1, -128, 1, 2, 4, 8, 16, 32, -1,
                                         64, -128, 1, 2, 4, 8, 16, -1, 32, 64, -128, 1, 2, 4, 8, -1);
    __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)W), idx), bit);
    __m256i neg7 = _mm256_cmpeq_epi8(v, bit); /* byte 7 of each group: 0 == 0xFF fails */
    __m256i count = _mm256_sad_epu8(_mm256_and_si256(neg7, _mm256_set1_epi8(1)), _mm256_setzero_si256());
    __m256i odd = _mm256_slli_epi64(_mm256_and_si256(count, _mm256_set1_epi64x(1)), 56);
    return _mm256_or_si256(neg7, _mm256_sub_epi64(_mm256_setzero_si256(), odd));
}

static inline __m256i iq2_subblock(const uint8_t *q8, const int8_t *a) {
    uint32_t W;
    memcpy(&W, q8 + 4, 4);
    __m256i grid = _mm256_setr_epi64x((long long)ds4_iq2xxs_grid[q8[0]], (long long)ds4_iq2xxs_grid[q8[1]],
                                      (long long)ds4_iq2xxs_grid[q8[2]], (long long)ds4_iq2xxs_grid[q8[3]]);
    __m256i sgn = _mm256_or_si256(iq2_sign_bytes(W), _mm256_set1_epi8(1));
    __m256i p = _mm256_maddubs_epi16(grid, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)a), sgn));
    return _mm256_madd_epi16(p, _mm256_set1_epi16((short)(2 * (W >> 28) + 1)));
}

static float dot_iq2_xxs(const void *w, const void *act, int64_t n) {
    const ds4_block_iq2_xxs *x = w;
    const ds4_block_q8_K *y = act;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        const uint8_t *q = (const uint8_t *)x[i].qs;
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
        for (int b = 0; b < 8; b += 2) {
            s0 = _mm256_add_epi32(s0, iq2_subblock(q + 8 * b, y[i].qs + 32 * b));
            s1 = _mm256_add_epi32(s1, iq2_subblock(q + 8 * b + 8, y[i].qs + 32 * b + 32));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(0.125f * y[i].d * h2f(x[i].d)),
                              _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
    }
    return hsum_ps(acc);
}

ds4_dot_fn ds4_kernels_avx2_dot(uint32_t type) {
    switch (type) {
    case DS4_TYPE_F32: return dot_f32;
    case DS4_TYPE_F16: return dot_f16;
    case DS4_TYPE_BF16: return dot_bf16;
    case DS4_TYPE_Q8_0: return dot_q8_0;
    case DS4_TYPE_Q2_K: return dot_q2_K;
    case DS4_TYPE_Q4_K: return dot_q4_K;
    case DS4_TYPE_Q5_K: return dot_q5_K;
    case DS4_TYPE_Q6_K: return dot_q6_K;
    case DS4_TYPE_IQ2_XXS: return dot_iq2_xxs;
    default: return NULL;
    }
}
