/* nn_math.h -- the neural-network math every family's forward pass shares,
 * one implementation each: the matrix product over quantized activations,
 * RMS norm, the rotary pair rotation, SwiGLU, the sigmoid, the router's
 * top-k and the indexer's top-k. Family files keep only what their
 * reference defines differently (DeepSeek V4's sqrt-softplus router and
 * hash layers, its cos/sin tables with YaRN; GLM's sigmoid-router weight
 * sum, its layer norm).
 *
 * Contract
 * - Everything here is deterministic per element or per row: a result does
 *   not depend on the thread count, the batch or which thread ran it, so
 *   the families' bit-identity guarantees (batched = alone) hold through it.
 * - ds4_linear(): y[t][0..rows) = rows [row0, row0 + rows) of matrix `mat`
 *   of W times x[t] (t < T, x rows xstride floats apart); each x row is
 *   quantized once into act (T x ds4_act_bytes(W->type, W->ne[0]) bytes) for
 *   W's type, then one matvec (T = 1) or matmul reads every weight row once
 *   for the batch. pool NULL: the calling thread (inside a pool task).
 * - ds4_rmsnorm(): y = x * r * w (w NULL: x * r) with
 *   r = 1 / sqrt(sum(x^2) / n + eps), the sum in double (element i into
 *   partial sum i % 8, the eight added as ((0 + 1) + (2 + 3)) + ((4 + 5) +
 *   (6 + 7))); `rule` says how r itself is rounded, as each family's
 *   reference does: F64 computes the mean + eps and the root in double
 *   (DeepSeek V4), F32 rounds the mean to float and takes a float root
 *   (GLM 5.2, transformers' f32 RMSNorm). y may be x.
 * - ds4_rope_pair(): (x[0], x[1]) rotated by the angle whose cosine and
 *   sine are c and s; ds4_rope_rotate(): the n_rot/2 interleaved pairs of x
 *   with a table cs[2i] = cos, cs[2i + 1] = sin (inverse: by minus the
 *   angle).
 * - ds4_swiglu(): gate[i] = silu(min(gate[i], limit)) *
 *   clamp(up[i], -limit, limit) over rows x width values (limit INFINITY:
 *   no clamp), silu(g) = g / (1 + exp(-g)).
 * - ds4_route_select(): the k best of s[i] + bias[i] (bias NULL: s[i]) in
 *   selection order, ties to the lower index: the router's choice, whose
 *   weights are summed in that order. Host and device (CUDA) code.
 * - ds4_topk(): indices of the k largest s[0..n) (ties: lower index first),
 *   ascending in out; returns min(k, n). The indexer's selection over many
 *   positions (a heap, O(n log k)).
 */
#ifndef DS4_NN_MATH_H
#define DS4_NN_MATH_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DS4_HD __host__ __device__
#else
#define DS4_HD
#endif

DS4_HD static inline float ds4_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

DS4_HD static inline void ds4_route_select(const float *s, const float *bias, int n, int k, int *out) {
    for (int i = 0; i < k; i++) {
        int best = -1;
        float bv = 0;
        for (int e = 0; e < n; e++) {
            bool used = false;
            for (int j = 0; j < i; j++) used |= out[j] == e;
            float v = s[e] + (bias ? bias[e] : 0.0f);
            if (!used && (best < 0 || v > bv)) { best = e; bv = v; }
        }
        out[i] = best;
    }
}

#ifndef __CUDACC__
#include "format/tensor.h"

struct ds4_pool;

void ds4_linear(struct ds4_pool *pool, void *act, const ds4_tensor *W, int64_t mat, int64_t row0, int64_t rows,
                const float *x, int64_t xstride, int T, float *y);

enum ds4_rms_rule { DS4_RMS_F64, DS4_RMS_F32 };
void ds4_rmsnorm(const float *x, const float *w, int n, float eps, enum ds4_rms_rule rule, float *y);

static inline void ds4_rope_pair(float *x, float c, float s) {
    const float re = x[0], im = x[1];
    x[0] = re * c - im * s;
    x[1] = im * c + re * s;
}
void ds4_rope_rotate(float *x, int n_rot, const float *cs, bool inverse);

void ds4_swiglu(struct ds4_pool *pool, float *gate, const float *up, int rows, int width, float limit);

int ds4_topk(const float *s, int n, int k, int *out);
#endif

#endif
