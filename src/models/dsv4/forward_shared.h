/* forward_shared.h -- per-token and per-element pieces of the DS4 forward
 * pass that the CPU backend (forward_cpu*.c) and the CUDA kernels
 * (cuda/ops.cu) run from one definition, so both do the same arithmetic in
 * the same order. Under nvcc they are host+device functions.
 *
 * Contract
 * - ds4_route_token(): router scores s[0..X) become sqrt(softplus(s)) in
 *   place; the k experts are the hash row when given, else the top-k of
 *   s + bias (ties to the lower id); weights are the chosen scores,
 *   normalised to sum 1 when norm (sum floored at 2^-14), times scale.
 * - ds4_hc_weights(): one token's hyper-connection mix m ((2+hc)*hc values)
 *   -> pre[hc], post[hc], comb[hc*hc] (sheet 6.2: sigmoid gates, softmax
 *   rows + eps, Sinkhorn normalisation in double). C is caller scratch of
 *   hc*hc doubles.
 * - ds4_hc_head_weights(): one token's output-head merge weights from its
 *   mix m (hc values): sigmoid(m * scale + base) + eps.
 * - ds4_hc_collapse(): one token's n_hc streams (n_hc x E) weighted by
 *   pre[] into one row; ds4_hc_expand(): the streams after a sublayer,
 *   next[k] = post[k] * out + sum_j comb[j][k] * streams[j].
 * - ds4_pool_lane(): lane j of compressed window w from a frontier ring
 *   (softmax over Z, K weighted; coff 2 mixes window w-1's A lanes with
 *   window w's B lanes).
 * - ds4_fp8_block_scale()/ds4_fp8_value() and the FP4 pair: ds4's
 *   storage round trips per element, given the block's absolute maximum.
 */
#ifndef DS4_FORWARD_SHARED_H
#define DS4_FORWARD_SHARED_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "nn/nn_math.h"   /* DS4_HD, ds4_sigmoid, ds4_route_select */

DS4_HD static inline void ds4_route_token(float *s, int X, int k, const int32_t *hash_row, const float *bias,
                                          bool norm, float scale, int *ei, float *ew) {
    for (int e = 0; e < X; e++) s[e] = sqrtf(s[e] > 20.0f ? s[e] : log1pf(expf(s[e])));
    if (hash_row) {
        for (int i = 0; i < k; i++) ei[i] = hash_row[i];
    } else {
        ds4_route_select(s, bias, X, k, ei);
    }
    double sum = 0;
    for (int i = 0; i < k; i++) sum += s[ei[i]];
    if (sum < 0x1p-14) sum = 0x1p-14;
    for (int i = 0; i < k; i++) ew[i] = (float)((norm ? s[ei[i]] / sum : s[ei[i]]) * scale);
}

DS4_HD static inline void ds4_hc_weights(const float *m, const float *sc, const float *bs, int hc, int iters, float eps,
                                         float *pre, float *post, float *comb, double *C) {
    for (int s = 0; s < hc; s++) {
        pre[s] = ds4_sigmoid(m[s] * sc[0] + bs[s]) + eps;
        post[s] = 2.0f * ds4_sigmoid(m[hc + s] * sc[1] + bs[hc + s]);
    }
    for (int j = 0; j < hc; j++) {
        float *z = comb + j * hc, mx = -INFINITY;   /* comb holds the logits until the end */
        for (int k = 0; k < hc; k++) {
            z[k] = m[2 * hc + j * hc + k] * sc[2] + bs[2 * hc + j * hc + k];
            mx = fmaxf(mx, z[k]);
        }
        double sum = 0;
        for (int k = 0; k < hc; k++) sum += exp((double)z[k] - mx);
        for (int k = 0; k < hc; k++) C[j * hc + k] = exp((double)z[k] - mx) / sum + eps;
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int j = 0; j < hc; j++) {
                double s = 0;
                for (int k = 0; k < hc; k++) s += C[j * hc + k];
                for (int k = 0; k < hc; k++) C[j * hc + k] /= s + eps;
            }
        for (int k = 0; k < hc; k++) {
            double s = 0;
            for (int j = 0; j < hc; j++) s += C[j * hc + k];
            for (int j = 0; j < hc; j++) C[j * hc + k] /= s + eps;
        }
    }
    for (int i = 0; i < hc * hc; i++) comb[i] = (float)C[i];
}

DS4_HD static inline void ds4_hc_head_weights(const float *m, float scale, const float *base, int hc, float eps,
                                              float *pre) {
    for (int k = 0; k < hc; k++) pre[k] = ds4_sigmoid(m[k] * scale + base[k]) + eps;
}

DS4_HD static inline void ds4_hc_collapse(const float *pre, const float *streams, int hc, int E, float *out) {
    for (int d = 0; d < E; d++) {
        float acc = 0;
        for (int k = 0; k < hc; k++) acc += pre[k] * streams[(size_t)k * E + d];
        out[d] = acc;
    }
}

DS4_HD static inline void ds4_hc_expand(const float *post, const float *comb, const float *streams, const float *out,
                                        int hc, int E, float *next) {
    for (int k = 0; k < hc; k++)
        for (int d = 0; d < E; d++) {
            float acc = post[k] * out[d];
            for (int j = 0; j < hc; j++) acc += comb[j * hc + k] * streams[(size_t)j * E + d];
            next[(size_t)k * E + d] = acc;
        }
}

DS4_HD static inline float ds4_pool_lane(const float *fk, const float *fz, int f_cap, int coff, int d, int ratio,
                                         int64_t w, int j) {
    const int Wc = coff * d;
    const int64_t first = (coff == 2 && w > 0) ? (w - 1) * ratio : w * ratio, end = (w + 1) * ratio;
    float mx = -INFINITY;
    for (int64_t p = first; p < end; p++) {
        int lane = (coff == 2 && p >= w * ratio) ? d + j : j;
        mx = fmaxf(mx, fz[(size_t)(p % f_cap) * Wc + lane]);
    }
    double num = 0, den = 0;
    for (int64_t p = first; p < end; p++) {
        int lane = (coff == 2 && p >= w * ratio) ? d + j : j;
        size_t o = (size_t)(p % f_cap) * Wc + lane;
        double e = exp((double)fz[o] - mx);
        den += e;
        num += e * fk[o];
    }
    return (float)(num / den);
}

/* 2^ceil(log2(r)) for r > 0, exact (no log rounding at powers of two). */
DS4_HD static inline float ds4_pow2_ceil(float r) {
    int e;
    float m = frexpf(r, &e);            /* r = m * 2^e, m in [0.5, 1) */
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

DS4_HD static inline float ds4_fp8_block_scale(float amax) { return ds4_pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f); }

/* Nearest E4M3 value of |x|/scale in [0, 448], ties to the even code (normal
 * codes step by 2^(exp-3), subnormals by 2^-9; code parity equals the parity
 * of the integer rintf() rounds to), with x's sign, times scale. NaN stays
 * NaN so a fault stays visible (fminf would clamp it). */
DS4_HD static inline float ds4_fp8_value(float x, float scale) {
    if (isnan(x)) return x;
    float v = fminf(fabsf(x) / scale, 448.0f), r;
    if (v < 0x1p-6f) {
        r = rintf(v * 512.0f) / 512.0f;
    } else {
        int e;
        frexpf(v, &e);                  /* v in [2^(e-1), 2^e) */
        float step = ldexpf(1.0f, e - 1 - 3);
        r = rintf(v / step) * step;
        r = r > 448.0f ? 448.0f : r;
    }
    return copysignf(r, x) * scale;
}

DS4_HD static inline float ds4_fp4_block_scale(float amax) { return ds4_pow2_ceil(fmaxf(amax, 6.0f * 0x1p-126f) / 6.0f); }

/* Nearest E2M1 magnitude of |x|/scale (ties to the even code), signed, times
 * scale; NaN stays NaN. */
DS4_HD static inline float ds4_fp4_value(float x, float scale) {
    if (isnan(x)) return x;
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = fminf(fabsf(x) / scale, 6.0f);
    int best = 0;
    for (int k = 1; k < 8; k++) {
        float d = fabsf(v - mag[k]), db = fabsf(v - mag[best]);
        if (d < db || (d == db && (k & 1) == 0)) best = k;
    }
    return copysignf(mag[best], x) * scale;
}

#endif
