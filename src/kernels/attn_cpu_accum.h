/* attn_cpu_accum.h -- the weighted row sum of ds4_attn_heads, written once
 * with GCC vector extensions and compiled at each SIMD level: attn_cpu.c
 * (baseline SSE2), attn_cpu_avx2.c and attn_cpu_avx512.c include it after
 * defining ATTN_VEC_BYTES and ATTN_ACCUM (the function's name).
 *
 * out[h*D + d] = sum over i in order of weights[h*n + i] * rows[i][d], each
 * product and sum rounded to float: lanes are independent elements, so the
 * vector width changes nothing in any result. That needs products not to be
 * fused into the sums: GCC does not contract under -std=c11 (the build's
 * default, -ffp-contract=off), clang is told so below.
 */
#include <stddef.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

typedef float attn_vec __attribute__((vector_size(ATTN_VEC_BYTES)));
enum { ATTN_LANES = ATTN_VEC_BYTES / 4, ATTN_TILE_HEADS = 4, ATTN_TILE_VECS = 4 };

/* heads [h0, h0 + NH) x vectors [d0, d0 + NV * lanes): NH * NV accumulators
 * stay in registers while every row passes, so a row's slice is loaded once
 * for NH heads */
static inline __attribute__((always_inline)) void accum_tile(const float *weights, int n, const float *const *rows,
                                                             int D, float *out, int h0, int d0, const int NH,
                                                             const int NV) {
    attn_vec acc[ATTN_TILE_HEADS][ATTN_TILE_VECS];
    _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++)
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[h][v] = (attn_vec){0};
    for (int i = 0; i < n; i++) {
        attn_vec x[ATTN_TILE_VECS];
        memcpy(x, rows[i] + d0, (size_t)NV * sizeof(attn_vec));
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {
            const float p = weights[(size_t)(h0 + h) * n + i];
            _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[h][v] += p * x[v];
        }
    }
    _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++)
        memcpy(out + (size_t)(h0 + h) * D + d0, acc[h], (size_t)NV * sizeof(attn_vec));
}

/* the elements past the last whole vector, one at a time */
static void accum_tail(const float *weights, int n, const float *const *rows, int D, float *out, int h, int d0) {
    for (int d = d0; d < D; d++) {
        float acc = 0.0f;
        for (int i = 0; i < n; i++) acc += weights[(size_t)h * n + i] * rows[i][d];
        out[(size_t)h * D + d] = acc;
    }
}

void ATTN_ACCUM(const float *weights, int n_heads, int n, const float *const *rows, int D, float *out) {
    const int vecs = D / ATTN_LANES;
    int h = 0;
    for (; h + ATTN_TILE_HEADS <= n_heads; h += ATTN_TILE_HEADS) {
        int v = 0;
        for (; v + ATTN_TILE_VECS <= vecs; v += ATTN_TILE_VECS)
            accum_tile(weights, n, rows, D, out, h, v * ATTN_LANES, ATTN_TILE_HEADS, ATTN_TILE_VECS);
        for (; v < vecs; v++) accum_tile(weights, n, rows, D, out, h, v * ATTN_LANES, ATTN_TILE_HEADS, 1);
    }
    for (; h < n_heads; h++) {
        int v = 0;
        for (; v + ATTN_TILE_VECS <= vecs; v += ATTN_TILE_VECS)
            accum_tile(weights, n, rows, D, out, h, v * ATTN_LANES, 1, ATTN_TILE_VECS);
        for (; v < vecs; v++) accum_tile(weights, n, rows, D, out, h, v * ATTN_LANES, 1, 1);
    }
    for (h = 0; h < n_heads; h++) accum_tail(weights, n, rows, D, out, h, vecs * ATTN_LANES);
}
