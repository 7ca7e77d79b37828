/* quant_kquants.c -- K-quant quantizers (Q2_K, Q4_K, Q5_K, Q6_K) following
 * the reference procedures of gguf-and-quants.md sections 5 and 7: a
 * per-sub-block scale (and min) search, coding of those scales into small
 * integers against f16 super-block factors, then re-quantization of every
 * element with the factors as the decoder will see them. */
#include "kernels/quant.h"
#include "kernels/quant_internal.h"

#include <string.h>

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Affine search: x ≈ a·L + b with L in 0..nmax and b <= 0, weighted least
 * squares over nstep+1 trial grids. Returns a; *neg_min receives -b. */
static float affine_search(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *neg_min, float rmin, float rdelta, int nstep, bool abs_err) {
    float lo = x[0], hi = x[0], sw = 0.0f, sx = 0.0f;
    for (int i = 0; i < n; i++) {
        lo = fminf(lo, x[i]);
        hi = fmaxf(hi, x[i]);
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (lo > 0.0f) lo = 0.0f;
    if (!(hi > lo)) {
        memset(L, 0, (size_t)n);
        *neg_min = -lo;
        return 0.0f;
    }
    float iscale = (float)nmax / (hi - lo), scale = 1.0f / iscale, min = lo, best = 0.0f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(ds4_round_even(iscale * (x[i] - lo)), 0, nmax);
        float diff = scale * L[i] + lo - x[i];
        best += w[i] * (abs_err ? fabsf(diff) : diff * diff);
    }
    uint8_t trial[32];
    for (int t = 0; t <= nstep; t++) {
        float iv = (rmin + rdelta * (float)t + (float)nmax) / (hi - lo);
        float sl = 0.0f, sl2 = 0.0f, sxl = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = clampi(ds4_round_even(iv * (x[i] - lo)), 0, nmax);
            trial[i] = (uint8_t)l;
            sl += w[i] * (float)l;
            sl2 += w[i] * (float)(l * l);
            sxl += w[i] * (float)l * x[i];
        }
        float D = sw * sl2 - sl * sl;
        if (!(D > 0.0f)) continue;
        float a = (sw * sxl - sx * sl) / D, b = (sl2 * sx - sl * sxl) / D;
        if (b > 0.0f) {
            b = 0.0f;
            a = sxl / sl2;
        }
        float err = 0.0f;
        for (int i = 0; i < n; i++) {
            float diff = a * (float)trial[i] + b - x[i];
            err += w[i] * (abs_err ? fabsf(diff) : diff * diff);
        }
        if (err < best) {
            memcpy(L, trial, (size_t)n);
            best = err;
            scale = a;
            min = b;
        }
    }
    *neg_min = -min;
    return scale;
}

float ds4_quant_search_positive(int n, int nmax, const float *v, const float *u, uint8_t *c) {
    float vmax = 0.0f;
    for (int i = 0; i < n; i++) vmax = fmaxf(vmax, v[i]);
    if (!(vmax >= DS4_GROUP_MAX_EPS)) {
        memset(c, 0, (size_t)n);
        return 0.0f;
    }
    float best_iv = (float)nmax / vmax, best_err = INFINITY;
    for (int t = -4; t <= 4; t++) {
        float iv = ((float)nmax + 0.1f * (float)t) / vmax, s = 1.0f / iv, err = 0.0f;
        for (int i = 0; i < n; i++) {
            float diff = v[i] - s * (float)clampi(ds4_round_even(iv * v[i]), 0, nmax);
            err += u[i] * diff * diff;
        }
        if (err < best_err) {
            best_err = err;
            best_iv = iv;
        }
    }
    float sxl = 0.0f, sl2 = 0.0f;
    for (int i = 0; i < n; i++) {
        c[i] = (uint8_t)clampi(ds4_round_even(best_iv * v[i]), 0, nmax);
        sxl += u[i] * v[i] * (float)c[i];
        sl2 += u[i] * (float)(c[i] * c[i]);
    }
    /* coordinate refinement: move one code at a time towards the least-squares
     * optimum given the others, keeping moves that raise (Σuvc)²/Σuc² */
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float s1 = sxl - u[i] * v[i] * (float)c[i], s2 = sl2 - u[i] * (float)(c[i] * c[i]);
            if (!(s1 > 0.0f && s2 > 0.0f)) continue;
            int q = clampi(ds4_round_even(v[i] * s2 / s1), 0, nmax);
            if (q == c[i]) continue;
            s1 += u[i] * v[i] * (float)q;
            s2 += u[i] * (float)(q * q);
            if (s1 * s1 * sl2 > sxl * sxl * s2) {
                c[i] = (uint8_t)q;
                sxl = s1;
                sl2 = s2;
                changed++;
            }
        }
        if (!changed) break;
    }
    return sl2 > 0.0f ? sxl / sl2 : 0.0f;
}

/* How one affine K-quant type searches its sub-blocks. */
struct affine_kind {
    int sub;              /* sub-block length */
    int nmax;             /* largest quant */
    int cmax;             /* largest scale/min code */
    float sigma_mul;      /* σ² = sigma_mul · mean(x²) with an imatrix */
    bool abs_weights;     /* no imatrix: w = |x| (Q2_K) vs sqrt(mean x²)+|x| */
    float rmin, rdelta;   /* no-imatrix search grid */
    int nstep;
    bool abs_err;
};

static const struct affine_kind KIND_Q2 = {16, 3, 15, 1.0f, true, -0.5f, 0.1f, 15, true};
static const struct affine_kind KIND_Q4 = {32, 15, 63, 2.0f, false, -1.0f, 0.1f, 20, false};
static const struct affine_kind KIND_Q5 = {32, 31, 63, 2.0f, false, -0.5f, 0.1f, 15, false};

/* Codes for values v against their maximum: min(cmax, round(cmax·v/vmax)). */
static float code_by_max(int n, int cmax, const float *v, uint8_t *c) {
    float vmax = 0.0f;
    for (int j = 0; j < n; j++) vmax = fmaxf(vmax, v[j]);
    float inv = vmax > 0.0f ? (float)cmax / vmax : 0.0f;
    for (int j = 0; j < n; j++) c[j] = (uint8_t)clampi(ds4_round_even(inv * v[j]), 0, cmax);
    return vmax / (float)cmax;
}

/* One super-block of an affine K-quant: fills quants L[256], codes sc/mc and
 * the f16 factors *d, *dmin. */
static void affine_block(const struct affine_kind *k, const float *x, const float *imp,
                         uint8_t *L, uint8_t *sc, uint8_t *mc, ds4_half *d, ds4_half *dmin) {
    int nsub = DS4_QK_K / k->sub;
    float scales[16], mins[16], sw[16], w[32];
    float sumx2 = 0.0f;
    for (int i = 0; i < DS4_QK_K; i++) sumx2 += x[i] * x[i];
    float sigma2 = k->sigma_mul * sumx2 / DS4_QK_K;
    for (int j = 0; j < nsub; j++) {
        const float *xs = x + j * k->sub;
        if (imp) {
            sw[j] = 0.0f;
            for (int i = 0; i < k->sub; i++) {
                w[i] = imp[j * k->sub + i] * sqrtf(sigma2 + xs[i] * xs[i]);
                sw[j] += w[i];
            }
            scales[j] = affine_search(k->sub, k->nmax, xs, w, L + j * k->sub, &mins[j],
                                      -0.9f, 0.05f, 36, false);
        } else {
            float av = 0.0f;
            if (!k->abs_weights) {
                for (int i = 0; i < k->sub; i++) av += xs[i] * xs[i];
                av = sqrtf(av / (float)k->sub);
            }
            for (int i = 0; i < k->sub; i++) w[i] = av + fabsf(xs[i]);
            scales[j] = affine_search(k->sub, k->nmax, xs, w, L + j * k->sub, &mins[j],
                                      k->rmin, k->rdelta, k->nstep, k->abs_err);
        }
    }
    float fd, fdmin;
    if (imp) {
        fd = ds4_quant_search_positive(nsub, k->cmax, scales, sw, sc);
        fdmin = ds4_quant_search_positive(nsub, k->cmax, mins, sw, mc);
    } else {
        fd = code_by_max(nsub, k->cmax, scales, sc);
        fdmin = code_by_max(nsub, k->cmax, mins, mc);
    }
    *d = ds4_f32_to_half(fd);
    *dmin = ds4_f32_to_half(fdmin);
    fd = ds4_half_to_f32(*d);
    fdmin = ds4_half_to_f32(*dmin);
    for (int j = 0; j < nsub; j++) {
        float dl = fd * (float)sc[j], ml = fdmin * (float)mc[j];
        if (dl == 0.0f) continue;
        for (int i = j * k->sub; i < (j + 1) * k->sub; i++)
            L[i] = (uint8_t)clampi(ds4_round_even((x[i] + ml) / dl), 0, k->nmax);
    }
}

/* Q4_K/Q5_K 6-bit code packing (sheet 5.2) */
static void pack_k4_scales(const uint8_t *sc, const uint8_t *mc, uint8_t S[12]) {
    for (int j = 0; j < 4; j++) {
        S[j] = (uint8_t)(sc[j] | (sc[j + 4] >> 4) << 6);
        S[j + 4] = (uint8_t)(mc[j] | (mc[j + 4] >> 4) << 6);
        S[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mc[j + 4] & 15) << 4);
    }
}

/* low nibbles: byte l of 32-byte chunk c holds elements 64c+l and 64c+32+l */
static void pack_nibbles(const uint8_t *L, uint8_t qs[128]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            qs[32 * c + l] = (uint8_t)((L[64 * c + l] & 15) | (L[64 * c + 32 + l] & 15) << 4);
}

void ds4_quantize_q2_K(const float *x, ds4_block_q2_K *y, int64_t n, const float *imp) {
    for (int64_t b = 0; b < n / DS4_QK_K; b++, x += DS4_QK_K, y++) {
        uint8_t L[DS4_QK_K], sc[16], mc[16];
        affine_block(&KIND_Q2, x, imp ? imp + b * DS4_QK_K : NULL, L, sc, mc, &y->d, &y->dmin);
        for (int j = 0; j < 16; j++) y->scales[j] = (uint8_t)(sc[j] | mc[j] << 4);
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *q = L + 128 * h + l;
                y->qs[32 * h + l] = (uint8_t)(q[0] | q[32] << 2 | q[64] << 4 | q[96] << 6);
            }
    }
}

void ds4_quantize_q4_K(const float *x, ds4_block_q4_K *y, int64_t n, const float *imp) {
    for (int64_t b = 0; b < n / DS4_QK_K; b++, x += DS4_QK_K, y++) {
        uint8_t L[DS4_QK_K], sc[8], mc[8];
        affine_block(&KIND_Q4, x, imp ? imp + b * DS4_QK_K : NULL, L, sc, mc, &y->d, &y->dmin);
        pack_k4_scales(sc, mc, y->scales);
        pack_nibbles(L, y->qs);
    }
}

void ds4_quantize_q5_K(const float *x, ds4_block_q5_K *y, int64_t n, const float *imp) {
    for (int64_t b = 0; b < n / DS4_QK_K; b++, x += DS4_QK_K, y++) {
        uint8_t L[DS4_QK_K], sc[8], mc[8];
        affine_block(&KIND_Q5, x, imp ? imp + b * DS4_QK_K : NULL, L, sc, mc, &y->d, &y->dmin);
        pack_k4_scales(sc, mc, y->scales);
        pack_nibbles(L, y->qs);
        memset(y->qh, 0, sizeof(y->qh));
        for (int e = 0; e < DS4_QK_K; e++) y->qh[e & 31] |= (uint8_t)((L[e] >> 4) << (e >> 5));
    }
}

/* Symmetric search (sheet section 7) with nmax levels each side; codes are
 * stored offset by nmax. */
static float symmetric_search(int n, int nmax, const float *x, const float *w, uint8_t *L) {
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(m)) m = x[i];
    if (!(fabsf(m) >= DS4_GROUP_MAX_EPS)) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float best_scale = 0.0f, best = 0.0f;
    /* the plain -nmax/m grid first, then -0.9..+0.9 around it */
    for (int t = -10; t <= 9; t++) {
        if (t == 0) continue;
        float iv = -((float)nmax + (t == -10 ? 0.0f : 0.1f * (float)t)) / m, sxl = 0.0f, sl2 = 0.0f;
        for (int i = 0; i < n; i++) {
            int l = clampi(ds4_round_even(iv * x[i]), -nmax, nmax - 1);
            sxl += w[i] * x[i] * (float)l;
            sl2 += w[i] * (float)(l * l);
        }
        if (t != -10 && !(sl2 > 0.0f && sxl * sxl > best * sl2)) continue;
        best_scale = sl2 > 0.0f ? sxl / sl2 : 0.0f;
        best = best_scale * sxl;
        for (int i = 0; i < n; i++)
            L[i] = (uint8_t)(clampi(ds4_round_even(iv * x[i]), -nmax, nmax - 1) + nmax);
    }
    return best_scale;
}

void ds4_quantize_q6_K(const float *x, ds4_block_q6_K *y, int64_t n, const float *imp) {
    for (int64_t b = 0; b < n / DS4_QK_K; b++, x += DS4_QK_K, y++) {
        uint8_t L[DS4_QK_K];
        float scales[16], w[16], max_scale = 0.0f;
        for (int j = 0; j < 16; j++) {
            const float *xs = x + 16 * j;
            for (int i = 0; i < 16; i++) w[i] = imp ? imp[b * DS4_QK_K + 16 * j + i] : xs[i] * xs[i];
            scales[j] = symmetric_search(16, 32, xs, w, L + 16 * j);
            if (fabsf(scales[j]) > fabsf(max_scale)) max_scale = scales[j];
        }
        if (!(fabsf(max_scale) >= DS4_GROUP_MAX_EPS)) {
            memset(y, 0, sizeof(*y));
            continue;
        }
        float iscale = -128.0f / max_scale;
        y->d = ds4_f32_to_half(1.0f / iscale);
        float d = ds4_half_to_f32(y->d);
        for (int j = 0; j < 16; j++) {
            int s = ds4_round_even(iscale * scales[j]);
            y->scales[j] = (int8_t)clampi(s, -128, 127);
            float dl = d * (float)y->scales[j];
            if (dl == 0.0f) continue;
            for (int i = 16 * j; i < 16 * j + 16; i++)
                L[i] = (uint8_t)(clampi(ds4_round_even(x[i] / dl), -32, 31) + 32);
        }
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *q = L + 128 * h + l;
                y->ql[64 * h + l] = (uint8_t)((q[0] & 15) | (q[64] & 15) << 4);
                y->ql[64 * h + 32 + l] = (uint8_t)((q[32] & 15) | (q[96] & 15) << 4);
                y->qh[32 * h + l] = (uint8_t)(q[0] >> 4 | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 |
                                              (q[96] >> 4) << 6);
            }
    }
}
