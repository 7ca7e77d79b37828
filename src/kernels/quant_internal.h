/* quant_internal.h -- private glue between the quant*.c files (not part of
 * the public contract in quant.h).
 *
 * - ds4_round_even() is the rounding every reference quantizer uses (ties to
 *   even); it saturates instead of overflowing so NaN/inf input cannot cause
 *   undefined behaviour (the result is then merely meaningless).
 * - The per-type quantizers take whole super-blocks (n a multiple of 256).
 */
#ifndef DS4_QUANT_INTERNAL_H
#define DS4_QUANT_INTERNAL_H

#include <math.h>
#include <string.h>
#include "kernels/quant.h"

#define DS4_GROUP_MAX_EPS 1e-15f

static inline int ds4_round_even(float v) {
    if (fabsf(v) < 4194304.0f) {
        /* adding 1.5·2^23 leaves round_even(v) in the low mantissa bits; far
         * cheaper than rintf, which is a libm call on baseline x86-64 */
        float t = v + 12582912.0f;
        int32_t b;
        memcpy(&b, &t, 4);
        return (b & 0x007fffff) - 0x00400000;
    }
    if (!(v > -1073741824.0f)) return v != v ? 0 : -1073741824;
    return v > 1073741824.0f ? 1073741824 : (int)v;
}

/* Weighted positive-code search (sheet section 7): codes c[j] in 0..nmax for
 * v[j] with weights u[j]; returns the scale. Codes are clamped at 0 because
 * IQ2_XXS passes magnitudes where a parity-flipped element is negative. */
float ds4_quant_search_positive(int n, int nmax, const float *v, const float *u, uint8_t *c);

void ds4_quantize_q2_K(const float *x, ds4_block_q2_K *y, int64_t n, const float *imp);
void ds4_quantize_q4_K(const float *x, ds4_block_q4_K *y, int64_t n, const float *imp);
void ds4_quantize_q5_K(const float *x, ds4_block_q5_K *y, int64_t n, const float *imp);
void ds4_quantize_q6_K(const float *x, ds4_block_q6_K *y, int64_t n, const float *imp);
void ds4_quantize_iq2_xxs(const float *x, ds4_block_iq2_xxs *y, int64_t n, const float *imp);

#endif
