/* quant.c -- type traits, scalar conversions, row dequantization, the simple
 * quantizers (Q8_0, Q8_K, float types) and the scalar reference dots.
 * K-quant searches live in quant_kquants.c, IQ2_XXS in quant_iq2xxs.c.
 *
 * Dequantizers evaluate in f32 in the operation order gguf-py and ggml use
 * ((d*sc)*q - dmin*m), so their output is bit-identical to gguf-py's. */
#include "kernels/quant.h"
#include "kernels/quant_internal.h"

#include <float.h>
#include <string.h>
#include <strings.h>
#include <assert.h>

static_assert(sizeof(ds4_block_q8_0) == 34, "q8_0 block size");
static_assert(sizeof(ds4_block_q2_K) == 84, "q2_K block size");
static_assert(sizeof(ds4_block_q4_K) == 144, "q4_K block size");
static_assert(sizeof(ds4_block_q5_K) == 176, "q5_K block size");
static_assert(sizeof(ds4_block_q6_K) == 210, "q6_K block size");
static_assert(sizeof(ds4_block_q8_K) == 292, "q8_K block size");
static_assert(sizeof(ds4_block_iq2_xxs) == 66, "iq2_xxs block size");

/* ---- type traits ---- */

struct type_info { const char *name; uint16_t elems, bytes; };

/* Every id of gguf-and-quants.md section 2; the gaps are retired ids. Q8_1
 * uses ggml's 36-byte block (gguf-py's table says 40; it never occurs in
 * files). */
static const struct type_info TYPES[] = {
    [0] = {"F32", 1, 4},       [1] = {"F16", 1, 2},       [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},    [6] = {"Q5_0", 32, 22},    [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},    [9] = {"Q8_1", 32, 36},    [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110}, [12] = {"Q4_K", 256, 144}, [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210}, [15] = {"Q8_K", 256, 292}, [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74},[18] = {"IQ3_XXS", 256, 98},[19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18}, [21] = {"IQ3_S", 256, 110},[22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136},[24] = {"I8", 1, 1},      [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},      [27] = {"I64", 1, 8},      [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56}, [30] = {"BF16", 1, 2},     [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66}, [39] = {"MXFP4", 32, 17},  [40] = {"NVFP4", 64, 36},
    [41] = {"Q1_0", 128, 18},  [42] = {"Q2_0", 64, 18},
};
#define N_TYPES (sizeof(TYPES) / sizeof(TYPES[0]))

static const struct type_info *type_info(uint32_t type) {
    return type < N_TYPES && TYPES[type].name ? &TYPES[type] : NULL;
}

const char *ds4_type_name(uint32_t type) {
    const struct type_info *t = type_info(type);
    return t ? t->name : NULL;
}

int ds4_type_from_name(const char *name) {
    if (!name) return -1;
    for (uint32_t i = 0; i < N_TYPES; i++)
        if (TYPES[i].name && strcasecmp(TYPES[i].name, name) == 0) return (int)i;
    return -1;
}

size_t ds4_type_block_elems(uint32_t type) {
    const struct type_info *t = type_info(type);
    return t ? t->elems : 0;
}

size_t ds4_type_block_bytes(uint32_t type) {
    const struct type_info *t = type_info(type);
    return t ? t->bytes : 0;
}

size_t ds4_type_row_bytes(uint32_t type, uint64_t n) {
    const struct type_info *t = type_info(type);
    if (!t || n % t->elems) return 0;
    uint64_t blocks = n / t->elems;
    if (blocks > SIZE_MAX / t->bytes) return 0;
    return (size_t)(blocks * t->bytes);
}

uint32_t ds4_type_vec_dot_type(uint32_t type) {
    switch (type) {
    case DS4_TYPE_Q8_0: return DS4_TYPE_Q8_0;
    case DS4_TYPE_Q2_K: case DS4_TYPE_Q3_K: case DS4_TYPE_Q4_K: case DS4_TYPE_Q5_K:
    case DS4_TYPE_Q6_K: case DS4_TYPE_Q8_K: case DS4_TYPE_IQ2_XXS: return DS4_TYPE_Q8_K;
    default: return DS4_TYPE_F32;
    }
}

/* ---- scalar conversions ---- */

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float ds4_half_to_f32(ds4_half h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) {
        float v = ldexpf((float)mant, -24);
        return sign ? -v : v;
    }
    if (exp == 31) return bits_f32(sign | 0x7f800000u | mant << 13);
    return bits_f32(sign | (exp + 112) << 23 | mant << 13);
}

ds4_half ds4_f32_to_half(float f) {
    uint32_t b = f32_bits(f);
    uint32_t sign = (b >> 16) & 0x8000, a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return (ds4_half)(sign | 0x7e00);
    int e = (int)(a >> 23) - 127 + 15;
    uint32_t mant = a & 0x7fffff;
    if (e >= 31) return (ds4_half)(sign | 0x7c00);
    uint32_t r, rem, halfway;
    if (e >= 1) {
        r = (uint32_t)e << 10 | mant >> 13;
        rem = mant & 0x1fff;
        halfway = 0x1000;
    } else {
        /* half subnormal: units of 2^-24, so shift the 24-bit significand */
        int s = 14 - e;
        if (s > 24) return (ds4_half)sign;
        uint32_t m = mant | 0x800000;
        r = m >> s;
        rem = m & ((1u << s) - 1);
        halfway = 1u << (s - 1);
    }
    /* a carry out of the mantissa correctly bumps the exponent (up to inf) */
    if (rem > halfway || (rem == halfway && (r & 1))) r++;
    return (ds4_half)(sign | r);
}

float ds4_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t ds4_f32_to_bf16(float f) {
    uint32_t b = f32_bits(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40);
    return (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

/* ---- dequantization ---- */

/* Q4_K/Q5_K 6-bit scale and min codes of sub-block j (sheet 5.2) */
static void k4_scale_min(const uint8_t *S, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = S[j] & 63;
        *m = S[j + 4] & 63;
    } else {
        *sc = (S[j + 4] & 15) | ((S[j - 4] >> 6) << 4);
        *m = (S[j + 4] >> 4) | ((S[j] >> 6) << 4);
    }
}

/* Q3_K: 16 six-bit codes, low nibbles in S[0..7] (low then high nibble
 * halves), high bit pairs in S[8..11]; the signed scale is code - 32. */
static int q3k_scale(const uint8_t *S, int j) {
    int lo = j < 8 ? S[j] & 15 : S[j - 8] >> 4;
    int hi = (S[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (lo | hi << 4) - 32;
}

static inline int q2k_quant(const ds4_block_q2_K *b, int e) {
    return (b->qs[32 * (e >> 7) + (e & 31)] >> (2 * ((e & 127) >> 5))) & 3;
}

static inline int q3k_quant(const uint8_t *hmask, const uint8_t *qs, int e) {
    int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
    int lo = (qs[32 * h + l] >> (2 * k)) & 3;
    return lo - ((hmask[l] >> (4 * h + k)) & 1 ? 0 : 4);
}

static inline int q4k_low(const uint8_t *qs, int e) {
    int c = e >> 6, l = e & 31;
    return (qs[32 * c + l] >> (4 * ((e >> 5) & 1))) & 15;
}

static inline int q5k_quant(const ds4_block_q5_K *b, int e) {
    return q4k_low(b->qs, e) | ((b->qh[e & 31] >> (e >> 5)) & 1) << 4;
}

static inline int q6k_quant(const ds4_block_q6_K *b, int e) {
    int h = e >> 7, k = (e >> 5) & 3, l = e & 31;
    int lo = (b->ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
    int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
    return (lo | hi << 4) - 32;
}

/* IQ2_XXS sub-block b: its grid indices (bytes 0..3) and the u32 W */
static inline uint32_t iq2_w(const ds4_block_iq2_xxs *b, int sb) {
    return (uint32_t)b->qs[4 * sb + 2] | (uint32_t)b->qs[4 * sb + 3] << 16;
}
static inline int iq2_grid_index(const ds4_block_iq2_xxs *b, int sb, int k) {
    uint16_t v = b->qs[4 * sb + (k >> 1)];
    return (v >> (8 * (k & 1))) & 0xff;
}
/* signed grid values of group k of sub-block sb (magnitudes 8/25/43) */
static void iq2_group(const ds4_block_iq2_xxs *b, int sb, int k, int8_t out[8]) {
    uint64_t g = ds4_iq2xxs_grid[iq2_grid_index(b, sb, k)];
    uint8_t signs = ds4_ksigns_iq2xs[(iq2_w(b, sb) >> (7 * k)) & 127];
    for (int j = 0; j < 8; j++) {
        int v = (int)((g >> (8 * j)) & 0xff);
        out[j] = (int8_t)(signs & ds4_kmask_iq2xs[j] ? -v : v);
    }
}

void ds4_dequantize_row(uint32_t type, const void *vx, float *y, int64_t n) {
    size_t be = ds4_type_block_elems(type);
    int64_t nb = be ? n / (int64_t)be : 0;
    switch (type) {
    case DS4_TYPE_F32: memcpy(y, vx, (size_t)n * sizeof(float)); break;
    case DS4_TYPE_F16: {
        const ds4_half *x = vx;
        for (int64_t i = 0; i < n; i++) y[i] = ds4_half_to_f32(x[i]);
        break;
    }
    case DS4_TYPE_BF16: {
        const uint16_t *x = vx;
        for (int64_t i = 0; i < n; i++) y[i] = ds4_bf16_to_f32(x[i]);
        break;
    }
    case DS4_TYPE_Q8_0:
        for (int64_t i = 0; i < nb; i++) {
            const ds4_block_q8_0 *b = (const ds4_block_q8_0 *)vx + i;
            float d = ds4_half_to_f32(b->d);
            for (int e = 0; e < DS4_QK8_0; e++) y[i * DS4_QK8_0 + e] = (float)b->qs[e] * d;
        }
        break;
    case DS4_TYPE_Q2_K:
        for (int64_t i = 0; i < nb; i++, y += DS4_QK_K) {
            const ds4_block_q2_K *b = (const ds4_block_q2_K *)vx + i;
            float d = ds4_half_to_f32(b->d), dmin = ds4_half_to_f32(b->dmin);
            for (int e = 0; e < DS4_QK_K; e++) {
                uint8_t s = b->scales[e >> 4];
                float dl = d * (float)(s & 15), ml = dmin * (float)(s >> 4);
                y[e] = dl * (float)q2k_quant(b, e) - ml;
            }
        }
        break;
    case DS4_TYPE_Q3_K:
        for (int64_t i = 0; i < nb; i++, y += DS4_QK_K) {
            const uint8_t *b = (const uint8_t *)vx + 110 * i;
            ds4_half dh;
            memcpy(&dh, b + 108, 2);
            float d = ds4_half_to_f32(dh);
            for (int e = 0; e < DS4_QK_K; e++)
                y[e] = d * (float)q3k_scale(b + 96, e >> 4) * (float)q3k_quant(b, b + 32, e);
        }
        break;
    case DS4_TYPE_Q4_K:
        for (int64_t i = 0; i < nb; i++, y += DS4_QK_K) {
            const ds4_block_q4_K *b = (const ds4_block_q4_K *)vx + i;
            float d = ds4_half_to_f32(b->d), dmin = ds4_half_to_f32(b->dmin);
            for (int e = 0; e < DS4_QK_K; e++) {
                int sc, m;
                k4_scale_min(b->scales, e >> 5, &sc, &m);
                y[e] = d * (float)sc * (float)q4k_low(b->qs, e) - dmin * (float)m;
            }
        }
        break;
    case DS4_TYPE_Q5_K:
        for (int64_t i = 0; i < nb; i++, y += DS4_QK_K) {
            const ds4_block_q5_K *b = (const ds4_block_q5_K *)vx + i;
            float d = ds4_half_to_f32(b->d), dmin = ds4_half_to_f32(b->dmin);
            for (int e = 0; e < DS4_QK_K; e++) {
                int sc, m;
                k4_scale_min(b->scales, e >> 5, &sc, &m);
                y[e] = d * (float)sc * (float)q5k_quant(b, e) - dmin * (float)m;
            }
        }
        break;
    case DS4_TYPE_Q6_K:
        for (int64_t i = 0; i < nb; i++, y += DS4_QK_K) {
            const ds4_block_q6_K *b = (const ds4_block_q6_K *)vx + i;
            float d = ds4_half_to_f32(b->d);
            for (int e = 0; e < DS4_QK_K; e++)
                y[e] = d * (float)b->scales[e >> 4] * (float)q6k_quant(b, e);
        }
        break;
    case DS4_TYPE_Q8_K:
        for (int64_t i = 0; i < nb; i++, y += DS4_QK_K) {
            const ds4_block_q8_K *b = (const ds4_block_q8_K *)vx + i;
            for (int e = 0; e < DS4_QK_K; e++) y[e] = b->d * (float)b->qs[e];
        }
        break;
    case DS4_TYPE_IQ2_XXS:
        for (int64_t i = 0; i < nb; i++) {
            const ds4_block_iq2_xxs *b = (const ds4_block_iq2_xxs *)vx + i;
            float d = ds4_half_to_f32(b->d);
            for (int sb = 0; sb < 8; sb++) {
                float db = d * (0.5f + (float)(iq2_w(b, sb) >> 28)) * 0.25f;
                for (int k = 0; k < 4; k++, y += 8) {
                    int8_t g[8];
                    iq2_group(b, sb, k, g);
                    for (int j = 0; j < 8; j++) y[j] = db * (float)g[j];
                }
            }
        }
        break;
    default:
        memset(y, 0, (size_t)n * sizeof(float));
        break;
    }
}

/* ---- simple quantizers ----
 * Both are total (quant.h): a block holding a NaN or an infinity gets scale
 * NaN and quants (and Q8_K sums) 0, so every dot over it is NaN instead of
 * a number that silently dropped the element; a block whose magnitudes are
 * so small that the inverse scale overflows (below about 3.7e-37) gets
 * quants 0, as a zero block does (its f16 or f32 scale is 0 or nearly so).
 * Finite blocks above that keep exactly their bytes. The SIMD activation
 * quantizers (kernels_cpu_avx2.c) hand such blocks to these. */

static bool block_finite(const float *x, int n) {
    bool finite = true;
    for (int e = 0; e < n; e++) finite &= fabsf(x[e]) <= FLT_MAX;
    return finite;
}

static void quantize_q8_0(const float *x, ds4_block_q8_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / DS4_QK8_0; i++, x += DS4_QK8_0) {
        if (!block_finite(x, DS4_QK8_0)) {
            y[i].d = ds4_f32_to_half(NAN);
            memset(y[i].qs, 0, sizeof(y[i].qs));
            continue;
        }
        float amax = 0.0f;
        for (int e = 0; e < DS4_QK8_0; e++) amax = fmaxf(amax, fabsf(x[e]));
        float d = amax / 127.0f, id = 1.0f / d;
        if (!(id <= FLT_MAX)) id = 0.0f; /* d is 0 or subnormal: every quant 0 */
        y[i].d = ds4_f32_to_half(d);
        for (int e = 0; e < DS4_QK8_0; e++) y[i].qs[e] = (int8_t)roundf(x[e] * id);
    }
}

static void quantize_q8_K(const float *x, ds4_block_q8_K *y, int64_t n) {
    for (int64_t i = 0; i < n / DS4_QK_K; i++, x += DS4_QK_K) {
        memset(y[i].bsums, 0, sizeof(y[i].bsums));
        memset(y[i].qs, 0, sizeof(y[i].qs));
        if (!block_finite(x, DS4_QK_K)) {
            y[i].d = NAN;
            continue;
        }
        float m = 0.0f;
        for (int e = 0; e < DS4_QK_K; e++)
            if (fabsf(x[e]) > fabsf(m)) m = x[e];
        /* -127/m (not 128) so the largest element is exactly -127 */
        float iscale = -127.0f / m;
        if (!(fabsf(iscale) <= FLT_MAX)) { /* m is 0 or tiny: a zero block */
            y[i].d = 0.0f;
            continue;
        }
        for (int e = 0; e < DS4_QK_K; e++) {
            int v = ds4_round_even(iscale * x[e]);
            y[i].qs[e] = (int8_t)(v < 127 ? v : 127);
            y[i].bsums[e >> 4] = (int16_t)(y[i].bsums[e >> 4] + y[i].qs[e]);
        }
        y[i].d = 1.0f / iscale;
    }
}

bool ds4_type_can_quantize(uint32_t type) {
    switch (type) {
    case DS4_TYPE_F32: case DS4_TYPE_F16: case DS4_TYPE_BF16: case DS4_TYPE_Q8_0:
    case DS4_TYPE_Q2_K: case DS4_TYPE_Q4_K: case DS4_TYPE_Q5_K: case DS4_TYPE_Q6_K:
    case DS4_TYPE_Q8_K: case DS4_TYPE_IQ2_XXS: return true;
    default: return false;
    }
}

size_t ds4_quantize_row(uint32_t type, const float *x, void *y, int64_t n, const float *imatrix) {
    size_t bytes = ds4_type_row_bytes(type, (uint64_t)n);
    if (n < 0 || !ds4_type_can_quantize(type) || (n > 0 && bytes == 0)) return 0;
    switch (type) {
    case DS4_TYPE_F32: memcpy(y, x, bytes); break;
    case DS4_TYPE_F16:
        for (int64_t i = 0; i < n; i++) ((ds4_half *)y)[i] = ds4_f32_to_half(x[i]);
        break;
    case DS4_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)y)[i] = ds4_f32_to_bf16(x[i]);
        break;
    case DS4_TYPE_Q8_0: quantize_q8_0(x, y, n); break;
    case DS4_TYPE_Q8_K: quantize_q8_K(x, y, n); break;
    case DS4_TYPE_Q2_K: ds4_quantize_q2_K(x, y, n, imatrix); break;
    case DS4_TYPE_Q4_K: ds4_quantize_q4_K(x, y, n, imatrix); break;
    case DS4_TYPE_Q5_K: ds4_quantize_q5_K(x, y, n, imatrix); break;
    case DS4_TYPE_Q6_K: ds4_quantize_q6_K(x, y, n, imatrix); break;
    case DS4_TYPE_IQ2_XXS: ds4_quantize_iq2_xxs(x, y, n, imatrix); break;
    }
    return bytes;
}

/* ---- scalar reference dots (sheet section 10: integer sums per block, one
 * float multiply per block or super-block) ---- */

static float dot_q8_0(const ds4_block_q8_0 *w, const ds4_block_q8_0 *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int e = 0; e < DS4_QK8_0; e++) isum += w[i].qs[e] * a[i].qs[e];
        sum += ds4_half_to_f32(w[i].d) * ds4_half_to_f32(a[i].d) * (float)isum;
    }
    return sum;
}

/* Σ over 16-element groups g of bsums[g]·m(g): the min term of the affine
 * K-quants, computed without touching the activation quants */
static float dot_q2_K(const ds4_block_q2_K *w, const ds4_block_q8_K *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++) s += q2k_quant(&w[i], e) * a[i].qs[e];
            isum += (w[i].scales[j] & 15) * s;
            msum += (w[i].scales[j] >> 4) * a[i].bsums[j];
        }
        sum += a[i].d * (ds4_half_to_f32(w[i].d) * (float)isum -
                         ds4_half_to_f32(w[i].dmin) * (float)msum);
    }
    return sum;
}

static float dot_q3_K(const uint8_t *w, const ds4_block_q8_K *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++, w += 110) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++) s += q3k_quant(w, w + 32, e) * a[i].qs[e];
            isum += q3k_scale(w + 96, j) * s;
        }
        ds4_half dh;
        memcpy(&dh, w + 108, 2);
        sum += ds4_half_to_f32(dh) * a[i].d * (float)isum;
    }
    return sum;
}

/* Q4_K and Q5_K share everything but the quant extraction */
static float dot_q45_K(uint32_t type, const void *w, const ds4_block_q8_K *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        const ds4_block_q4_K *w4 = (const ds4_block_q4_K *)w + i;
        const ds4_block_q5_K *w5 = (const ds4_block_q5_K *)w + i;
        const uint8_t *S = type == DS4_TYPE_Q4_K ? w4->scales : w5->scales;
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m;
            k4_scale_min(S, j, &sc, &m);
            int32_t s = 0;
            for (int e = 32 * j; e < 32 * j + 32; e++)
                s += (type == DS4_TYPE_Q4_K ? q4k_low(w4->qs, e) : q5k_quant(w5, e)) * a[i].qs[e];
            isum += sc * s;
            msum += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
        }
        ds4_half d = type == DS4_TYPE_Q4_K ? w4->d : w5->d;
        ds4_half dmin = type == DS4_TYPE_Q4_K ? w4->dmin : w5->dmin;
        sum += a[i].d * (ds4_half_to_f32(d) * (float)isum - ds4_half_to_f32(dmin) * (float)msum);
    }
    return sum;
}

static float dot_q6_K(const ds4_block_q6_K *w, const ds4_block_q8_K *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++) s += q6k_quant(&w[i], e) * a[i].qs[e];
            isum += w[i].scales[j] * s;
        }
        sum += ds4_half_to_f32(w[i].d) * a[i].d * (float)isum;
    }
    return sum;
}

static float dot_q8_K(const ds4_block_q8_K *w, const ds4_block_q8_K *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t isum = 0;
        for (int e = 0; e < DS4_QK_K; e++) isum += w[i].qs[e] * a[i].qs[e];
        sum += w[i].d * a[i].d * (float)isum;
    }
    return sum;
}

int32_t ds4_iq2_xxs_isum(const ds4_block_iq2_xxs *w, const ds4_block_q8_K *a) {
    int32_t isum = 0;
    for (int sb = 0; sb < 8; sb++) {
        int32_t s = 0;
        for (int k = 0; k < 4; k++) {
            int8_t g[8];
            iq2_group(w, sb, k, g);
            for (int j = 0; j < 8; j++) s += g[j] * a->qs[32 * sb + 8 * k + j];
        }
        isum += (2 * (int32_t)(iq2_w(w, sb) >> 28) + 1) * s;
    }
    return isum;
}

static float dot_iq2_xxs(const ds4_block_iq2_xxs *w, const ds4_block_q8_K *a, int64_t nb) {
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++)
        sum += ds4_half_to_f32(w[i].d) * a[i].d * 0.125f * (float)ds4_iq2_xxs_isum(&w[i], &a[i]);
    return sum;
}

float ds4_vec_dot_ref(uint32_t type, const void *w, const void *act, int64_t n) {
    const float *af = act;
    int64_t nbk = n / DS4_QK_K;
    float sum = 0.0f;
    switch (type) {
    case DS4_TYPE_F32:
        for (int64_t i = 0; i < n; i++) sum += ((const float *)w)[i] * af[i];
        return sum;
    case DS4_TYPE_F16:
        for (int64_t i = 0; i < n; i++) sum += ds4_half_to_f32(((const ds4_half *)w)[i]) * af[i];
        return sum;
    case DS4_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) sum += ds4_bf16_to_f32(((const uint16_t *)w)[i]) * af[i];
        return sum;
    case DS4_TYPE_Q8_0: return dot_q8_0(w, act, n / DS4_QK8_0);
    case DS4_TYPE_Q2_K: return dot_q2_K(w, act, nbk);
    case DS4_TYPE_Q3_K: return dot_q3_K(w, act, nbk);
    case DS4_TYPE_Q4_K: case DS4_TYPE_Q5_K: return dot_q45_K(type, w, act, nbk);
    case DS4_TYPE_Q6_K: return dot_q6_K(w, act, nbk);
    case DS4_TYPE_Q8_K: return dot_q8_K(w, act, nbk);
    case DS4_TYPE_IQ2_XXS: return dot_iq2_xxs(w, act, nbk);
    default: return 0.0f;
    }
}
