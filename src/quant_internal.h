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
#include "quant.h"

#define DS4_GROUP_MAX_EPS 1e-15f

static inline int ds4_round_even(float v) {
    float r = rintf(v);
    if (!(r > -1073741824.0f)) return r != r ? 0 : -1073741824;
    if (r > 1073741824.0f) return 1073741824;
    return (int)r;
}

/* Weighted positive-code search (sheet section 7): codes c[j] in 0..nmax for
 * non-negative v[j] with weights u[j]; returns the scale. */
float ds4_quant_search_positive(int n, int nmax, const float *v, const float *u, uint8_t *c);

void ds4_quantize_q2_K(const float *x, ds4_block_q2_K *y, int64_t n, const float *imp);
void ds4_quantize_q4_K(const float *x, ds4_block_q4_K *y, int64_t n, const float *imp);
void ds4_quantize_q5_K(const float *x, ds4_block_q5_K *y, int64_t n, const float *imp);
void ds4_quantize_q6_K(const float *x, ds4_block_q6_K *y, int64_t n, const float *imp);
void ds4_quantize_iq2_xxs(const float *x, ds4_block_iq2_xxs *y, int64_t n, const float *imp);

#endif
