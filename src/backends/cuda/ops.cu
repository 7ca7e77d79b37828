/* ops.cu -- CUDA kernels of the DS4 forward pass (see ops.h). Each kernel
 * follows the CPU function it names; block formats are read with the
 * layouts of quant.h (facts of the formats). */
#include "backends/cuda/ops.h"

extern "C" {
#include "models/dsv4/forward_shared.h"
#include "kernels/kernels_cpu.h"
#include "kernels/quant.h"
}

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>

#define WARP 32

__constant__ uint64_t c_iq2_grid[256];
__constant__ uint8_t c_iq2_signs[128];
__constant__ uint8_t c_iq2_mask[8];

extern "C" int ds4_cu_ops_init(void) {
    if (cudaMemcpyToSymbol(c_iq2_grid, ds4_iq2xxs_grid, sizeof c_iq2_grid) != cudaSuccess) return -1;
    if (cudaMemcpyToSymbol(c_iq2_signs, ds4_ksigns_iq2xs, sizeof c_iq2_signs) != cudaSuccess) return -1;
    return cudaMemcpyToSymbol(c_iq2_mask, ds4_kmask_iq2xs, sizeof c_iq2_mask) == cudaSuccess ? 0 : -1;
}

extern "C" int ds4_cu_probe(char *err, size_t errlen) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0) e = cudaSetDevice(0);
    if (e == cudaSuccess && n > 0) return 0;
    snprintf(err, errlen, "%s", e == cudaSuccess ? "no CUDA GPU found" : cudaGetErrorString(e));
    return -1;
}

extern "C" void *ds4_cu_alloc(size_t bytes) {
    void *p = NULL;
    return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

extern "C" void ds4_cu_free(void *p) { cudaFree(p); }

extern "C" int ds4_cu_copy(void *dst, const void *src, size_t bytes, bool to_device) {
    return cudaMemcpy(dst, src, bytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

extern "C" int ds4_cu_finish(char *err, size_t errlen) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    snprintf(err, errlen, "%s", cudaGetErrorString(e));
    return -1;
}

static __device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ float f16_round(float v) { return __half2float(__float2half_rn(v)); }

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum of one value per thread over the block (blockDim a multiple of 32,
 * <= 1024); every thread gets the total. */
template <typename V> static __device__ V block_sum(V v) {
    __shared__ V part[32];
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, nw = blockDim.x / WARP;
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    V s = 0;
    for (int w = 0; w < nw; w++) s += part[w];
    __syncthreads();
    return s;
}

/* ------------------------------------------------------- block formats */

static __device__ __forceinline__ void k4_scale_min(const uint8_t *S, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = S[j] & 63;
        *m = S[j + 4] & 63;
    } else {
        *sc = (S[j + 4] & 15) | ((S[j - 4] >> 6) << 4);
        *m = (S[j + 4] >> 4) | ((S[j] >> 6) << 4);
    }
}

/* Element e of a weight row of type TY. */
template <int TY> static __device__ __forceinline__ float wval(const uint8_t *row, int e);

template <> __device__ __forceinline__ float wval<DS4_TYPE_F32>(const uint8_t *row, int e) {
    return ((const float *)row)[e];
}
template <> __device__ __forceinline__ float wval<DS4_TYPE_F16>(const uint8_t *row, int e) {
    return h2f(((const uint16_t *)row)[e]);
}
template <> __device__ __forceinline__ float wval<DS4_TYPE_BF16>(const uint8_t *row, int e) {
    return __uint_as_float((uint32_t)((const uint16_t *)row)[e] << 16);
}
template <> __device__ __forceinline__ float wval<DS4_TYPE_Q8_0>(const uint8_t *row, int e) {
    const ds4_block_q8_0 *b = (const ds4_block_q8_0 *)row + e / DS4_QK8_0;
    return (float)b->qs[e % DS4_QK8_0] * h2f(b->d);
}
template <> __device__ __forceinline__ float wval<DS4_TYPE_Q2_K>(const uint8_t *row, int e) {
    const ds4_block_q2_K *b = (const ds4_block_q2_K *)row + e / DS4_QK_K;
    const int i = e % DS4_QK_K;
    const uint8_t s = b->scales[i >> 4];
    const float dl = h2f(b->d) * (float)(s & 15), ml = h2f(b->dmin) * (float)(s >> 4);
    const int q = (b->qs[32 * (i >> 7) + (i & 31)] >> (2 * ((i & 127) >> 5))) & 3;
    return dl * (float)q - ml;
}
template <> __device__ __forceinline__ float wval<DS4_TYPE_Q3_K>(const uint8_t *row, int e) {
    const uint8_t *b = row + 110 * (e / DS4_QK_K);
    const int i = e % DS4_QK_K, j = i >> 4;
    const uint8_t *S = b + 96;
    const int lo = j < 8 ? S[j] & 15 : S[j - 8] >> 4, hi = (S[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    const int scale = (lo | hi << 4) - 32;
    const int h = i >> 7, k = (i >> 5) & 3, l = i & 31;
    const int q = ((b[32 + 32 * h + l] >> (2 * k)) & 3) - ((b[l] >> (4 * h + k)) & 1 ? 0 : 4);
    return h2f((uint16_t)(b[108] | b[109] << 8)) * (float)scale * (float)q;
}
template <> __device__ __forceinline__ float wval<DS4_TYPE_Q4_K>(const uint8_t *row, int e) {
    const ds4_block_q4_K *b = (const ds4_block_q4_K *)row + e / DS4_QK_K;
    const int i = e % DS4_QK_K;
    int sc, m;
    k4_scale_min(b->scales, i >> 5, &sc, &m);
    const int q = (b->qs[32 * (i >> 6) + (i & 31)] >> (4 * ((i >> 5) & 1))) & 15;
    return h2f(b->d) * (float)sc * (float)q - h2f(b->dmin) * (float)m;
}
template <> __device__ __forceinline__ float wval<DS4_TYPE_Q5_K>(const uint8_t *row, int e) {
    const ds4_block_q5_K *b = (const ds4_block_q5_K *)row + e / DS4_QK_K;
    const int i = e % DS4_QK_K;
    int sc, m;
    k4_scale_min(b->scales, i >> 5, &sc, &m);
    const int q = ((b->qs[32 * (i >> 6) + (i & 31)] >> (4 * ((i >> 5) & 1))) & 15) | ((b->qh[i & 31] >> (i >> 5)) & 1) << 4;
    return h2f(b->d) * (float)sc * (float)q - h2f(b->dmin) * (float)m;
}
template <> __device__ __forceinline__ float wval<DS4_TYPE_Q6_K>(const uint8_t *row, int e) {
    const ds4_block_q6_K *b = (const ds4_block_q6_K *)row + e / DS4_QK_K;
    const int i = e % DS4_QK_K, h = i >> 7, k = (i >> 5) & 3, l = i & 31;
    const int lo = (b->ql[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
    const int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
    return h2f(b->d) * (float)b->scales[i >> 4] * (float)((lo | hi << 4) - 32);
}
template <> __device__ __forceinline__ float wval<DS4_TYPE_IQ2_XXS>(const uint8_t *row, int e) {
    const ds4_block_iq2_xxs *b = (const ds4_block_iq2_xxs *)row + e / DS4_QK_K;
    const int i = e % DS4_QK_K, sb = i >> 5, k = (i >> 3) & 3, j = i & 7;
    const uint32_t w = (uint32_t)b->qs[4 * sb + 2] | (uint32_t)b->qs[4 * sb + 3] << 16;
    const float db = h2f(b->d) * (0.5f + (float)(w >> 28)) * 0.25f;
    const int gi = (b->qs[4 * sb + (k >> 1)] >> (8 * (k & 1))) & 0xff;
    const int v = (int)((c_iq2_grid[gi] >> (8 * j)) & 0xff);
    const uint8_t signs = c_iq2_signs[(w >> (7 * k)) & 127];
    return db * (float)(signs & c_iq2_mask[j] ? -v : v);
}

/* Element e of an activation row in the partner format AT. */
template <int AT> static __device__ __forceinline__ float aval(const uint8_t *act, int e);
template <> __device__ __forceinline__ float aval<DS4_TYPE_F32>(const uint8_t *act, int e) {
    return ((const float *)act)[e];
}
template <> __device__ __forceinline__ float aval<DS4_TYPE_Q8_0>(const uint8_t *act, int e) {
    const ds4_block_q8_0 *b = (const ds4_block_q8_0 *)act + e / DS4_QK8_0;
    return (float)b->qs[e % DS4_QK8_0] * h2f(b->d);
}
template <> __device__ __forceinline__ float aval<DS4_TYPE_Q8_K>(const uint8_t *act, int e) {
    const ds4_block_q8_K *b = (const ds4_block_q8_K *)act + e / DS4_QK_K;
    return b->d * (float)b->qs[e % DS4_QK_K];
}

/* The activation partner of a weight type (kernels_cpu.c act_type). */
static uint32_t act_type_of(uint32_t wtype) {
    switch (wtype) {
    case DS4_TYPE_F32: case DS4_TYPE_F16: case DS4_TYPE_BF16: return DS4_TYPE_F32;
    default: return ds4_type_vec_dot_type(wtype);
    }
}

/* --------------------------------------------- activation quantization */

/* quant.c quantize_q8_0: one warp per block of 32. */
__global__ void k_quant_q8_0(const float *x, int64_t xstride, int T, int n, uint8_t *act, size_t ab) {
    const int64_t gw = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    const int lane = threadIdx.x % WARP, nb = n / DS4_QK8_0;
    if (gw >= (int64_t)T * nb) return;
    const int t = (int)(gw / nb), b = (int)(gw % nb);
    const float v = x[(size_t)t * xstride + (size_t)b * DS4_QK8_0 + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    ds4_block_q8_0 *blk = (ds4_block_q8_0 *)(act + (size_t)t * ab) + b;
    if (lane == 0) blk->d = __half_as_ushort(__float2half_rn(d));
    blk->qs[lane] = (int8_t)roundf(v * id);
}

/* quant.c quantize_q8_K: one block of 256 threads per super-block; the scale
 * comes from the first element of largest magnitude. */
__global__ void k_quant_q8_K(const float *x, int64_t xstride, int T, int n, uint8_t *act, size_t ab) {
    __shared__ float s_abs[DS4_QK_K];
    __shared__ int s_idx[DS4_QK_K];
    const int nb = n / DS4_QK_K, t = blockIdx.x / nb, b = blockIdx.x % nb, i = threadIdx.x;
    const float *xb = x + (size_t)t * xstride + (size_t)b * DS4_QK_K;
    const float v = xb[i];
    s_abs[i] = fabsf(v);
    s_idx[i] = i;
    __syncthreads();
    for (int h = DS4_QK_K / 2; h > 0; h /= 2) {
        if (i < h) {
            const float a = s_abs[i], c = s_abs[i + h];
            const int ia = s_idx[i], ic = s_idx[i + h];
            if (c > a || (c == a && ic < ia)) { s_abs[i] = c; s_idx[i] = ic; }
        }
        __syncthreads();
    }
    const float m = xb[s_idx[0]];
    ds4_block_q8_K *blk = (ds4_block_q8_K *)(act + (size_t)t * ab) + b;
    int q = 0;
    float d = 0.0f;
    if (m != 0.0f) {
        const float iscale = -127.0f / m;
        q = (int)rintf(iscale * v);
        if (q > 127) q = 127;
        d = 1.0f / iscale;
    }
    blk->qs[i] = (int8_t)q;
    int s = q;
    for (int o = 8; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);   /* 16-lane groups */
    if ((i & 15) == 0) blk->bsums[i >> 4] = (int16_t)s;
    if (i == 0) blk->d = d;
}

__global__ void k_copy_rows(const float *x, int64_t xstride, int T, int n, float *y) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * n) return;
    y[i] = x[(size_t)(i / n) * xstride + (size_t)(i % n)];
}

extern "C" int ds4_cu_quantize_act(uint32_t wtype, const float *x, int64_t xstride, int T, int64_t n, void *act,
                                   ds4_cu_stream stream) {
    const size_t ab = ds4_act_bytes(wtype, n);
    if (!ab || T <= 0) return -1;
    const uint32_t at = act_type_of(wtype);
    const int64_t total = (int64_t)T * n;
    if (at == DS4_TYPE_F32) {
        k_copy_rows<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(x, xstride, T, (int)n, (float *)act);
    } else if (at == DS4_TYPE_Q8_0) {
        k_quant_q8_0<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(x, xstride, T, (int)n, (uint8_t *)act, ab);
    } else if (at == DS4_TYPE_Q8_K) {
        k_quant_q8_K<<<(unsigned)(total / DS4_QK_K), DS4_QK_K, 0, stream>>>(x, xstride, T, (int)n, (uint8_t *)act, ab);
    } else {
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------ matrix products */

enum { MM_WARPS = 4, MM_TILE = 4 };

/* One warp per weight row; a block's y-index walks token tiles (TILE tokens
 * share each decoded weight element) or, with eidx, single expert pairs. */
template <int TY, int AT, int TILE>
__global__ void __launch_bounds__(MM_WARPS * WARP)
k_matmul(const uint8_t *W, size_t row_bytes, size_t expert_bytes, const int32_t *eidx, int64_t rows, int n,
         const uint8_t *act, size_t ab, int act_div, int T, float *Y, int64_t ystride) {
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t r = (int64_t)blockIdx.x * MM_WARPS + warp;
    if (r >= rows) return;
    const int tiles = (T + TILE - 1) / TILE;
    for (int tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
        const int t0 = tile * TILE;
        const uint8_t *w = W + (size_t)r * row_bytes + (eidx ? (size_t)eidx[t0] * expert_bytes : 0);
        const uint8_t *a[TILE];
        float acc[TILE];
#pragma unroll
        for (int k = 0; k < TILE; k++) {
            acc[k] = 0.0f;
            a[k] = act + (size_t)((t0 + k < T ? t0 + k : t0) / act_div) * ab;
        }
        for (int e = lane; e < n; e += WARP) {
            const float wv = wval<TY>(w, e);
#pragma unroll
            for (int k = 0; k < TILE; k++) acc[k] += wv * aval<AT>(a[k], e);
        }
#pragma unroll
        for (int k = 0; k < TILE; k++) {
            const float s = warp_sum(acc[k]);
            if (lane == 0 && t0 + k < T) Y[(size_t)(t0 + k) * ystride + r] = s;
        }
    }
}

template <int TY, int AT>
static void launch_mm(const void *W, size_t row_bytes, size_t expert_bytes, const int32_t *eidx, int64_t rows, int64_t n,
                      const void *act, size_t ab, int act_div, int T, float *Y, int64_t ystride, cudaStream_t s) {
    const unsigned gx = (unsigned)((rows + MM_WARPS - 1) / MM_WARPS);
    if (eidx) {
        const unsigned gy = (unsigned)(T < 65535 ? T : 65535);
        k_matmul<TY, AT, 1><<<dim3(gx, gy), MM_WARPS * WARP, 0, s>>>((const uint8_t *)W, row_bytes, expert_bytes, eidx,
                                                                     rows, (int)n, (const uint8_t *)act, ab, act_div,
                                                                     T, Y, ystride);
    } else {
        const int tiles = (T + MM_TILE - 1) / MM_TILE;
        const unsigned gy = (unsigned)(tiles < 65535 ? tiles : 65535);
        k_matmul<TY, AT, MM_TILE><<<dim3(gx, gy), MM_WARPS * WARP, 0, s>>>(
            (const uint8_t *)W, row_bytes, 0, NULL, rows, (int)n, (const uint8_t *)act, ab, 1, T, Y, ystride);
    }
}

static int dispatch_mm(uint32_t wtype, const void *W, size_t row_bytes, size_t expert_bytes, const int32_t *eidx,
                       int64_t rows, int64_t n, const void *act, int act_div, int T, float *Y, int64_t ystride,
                       cudaStream_t s) {
    const size_t ab = ds4_act_bytes(wtype, n);
    if (!ab || T <= 0 || rows <= 0 || n > INT32_MAX) return -1;
#define MM(TY, AT) launch_mm<TY, AT>(W, row_bytes, expert_bytes, eidx, rows, n, act, ab, act_div, T, Y, ystride, s)
    switch (wtype) {
    case DS4_TYPE_F32: MM(DS4_TYPE_F32, DS4_TYPE_F32); break;
    case DS4_TYPE_F16: MM(DS4_TYPE_F16, DS4_TYPE_F32); break;
    case DS4_TYPE_BF16: MM(DS4_TYPE_BF16, DS4_TYPE_F32); break;
    case DS4_TYPE_Q8_0: MM(DS4_TYPE_Q8_0, DS4_TYPE_Q8_0); break;
    case DS4_TYPE_Q2_K: MM(DS4_TYPE_Q2_K, DS4_TYPE_Q8_K); break;
    case DS4_TYPE_Q3_K: MM(DS4_TYPE_Q3_K, DS4_TYPE_Q8_K); break;
    case DS4_TYPE_Q4_K: MM(DS4_TYPE_Q4_K, DS4_TYPE_Q8_K); break;
    case DS4_TYPE_Q5_K: MM(DS4_TYPE_Q5_K, DS4_TYPE_Q8_K); break;
    case DS4_TYPE_Q6_K: MM(DS4_TYPE_Q6_K, DS4_TYPE_Q8_K); break;
    case DS4_TYPE_IQ2_XXS: MM(DS4_TYPE_IQ2_XXS, DS4_TYPE_Q8_K); break;
    default: return -1;
    }
#undef MM
    return 0;
}

extern "C" int ds4_cu_matmul(uint32_t wtype, const void *W, size_t row_bytes, int64_t rows, int64_t n, const void *act,
                             int T, float *Y, int64_t ystride, ds4_cu_stream stream) {
    return dispatch_mm(wtype, W, row_bytes, 0, NULL, rows, n, act, 1, T, Y, ystride, stream);
}

extern "C" int ds4_cu_matmul_experts(uint32_t wtype, const void *W, size_t row_bytes, size_t expert_bytes,
                                     const int32_t *eidx, int64_t rows, int64_t n, const void *act, int act_div, int J,
                                     float *Y, int64_t ystride, ds4_cu_stream stream) {
    if (!eidx || act_div <= 0) return -1;
    return dispatch_mm(wtype, W, row_bytes, expert_bytes, eidx, rows, n, act, act_div, J, Y, ystride, stream);
}

/* ------------------------------------------------------------- embedding */

template <int TY>
__global__ void k_embed(const uint8_t *table, size_t row_bytes, const int32_t *toks, int T, int n, int copies, float *S) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * n) return;
    const int t = (int)(i / n), d = (int)(i % n);
    const float v = wval<TY>(table + (size_t)toks[t] * row_bytes, d);
    for (int c = 0; c < copies; c++) S[((size_t)t * copies + c) * n + d] = v;
}

extern "C" int ds4_cu_embed(uint32_t type, const void *table, size_t row_bytes, const int32_t *toks, int T, int n,
                            int copies, float *S, ds4_cu_stream stream) {
    const unsigned blocks = (unsigned)(((int64_t)T * n + 255) / 256);
    const uint8_t *tb = (const uint8_t *)table;
#define EMB(TY) k_embed<TY><<<blocks, 256, 0, stream>>>(tb, row_bytes, toks, T, n, copies, S)
    switch (type) {
    case DS4_TYPE_F32: EMB(DS4_TYPE_F32); break;
    case DS4_TYPE_F16: EMB(DS4_TYPE_F16); break;
    case DS4_TYPE_BF16: EMB(DS4_TYPE_BF16); break;
    case DS4_TYPE_Q8_0: EMB(DS4_TYPE_Q8_0); break;
    case DS4_TYPE_Q2_K: EMB(DS4_TYPE_Q2_K); break;
    case DS4_TYPE_Q3_K: EMB(DS4_TYPE_Q3_K); break;
    case DS4_TYPE_Q4_K: EMB(DS4_TYPE_Q4_K); break;
    case DS4_TYPE_Q5_K: EMB(DS4_TYPE_Q5_K); break;
    case DS4_TYPE_Q6_K: EMB(DS4_TYPE_Q6_K); break;
    case DS4_TYPE_IQ2_XXS: EMB(DS4_TYPE_IQ2_XXS); break;
    default: return -1;
    }
#undef EMB
    return 0;
}

/* ------------------------------------------- block-cooperative row helpers
 * Every thread of the block calls these with the same arguments; each ends
 * with a barrier so the row is complete for the next step. */

static __device__ void blk_rmsnorm(float *x, int n, const float *w, float eps) {
    double ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)x[i] * x[i];
    ss = block_sum<double>(ss);
    const float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = w ? w[i] * (x[i] * r) : x[i] * r;
    __syncthreads();
}

static __device__ void blk_rope(float *x, int dim, int n_rot, const float *cs, bool inverse) {
    float *r = x + dim - n_rot;
    for (int i = threadIdx.x; i < n_rot / 2; i += blockDim.x) {
        const float c = cs[2 * i], s = inverse ? -cs[2 * i + 1] : cs[2 * i + 1];
        const float a = r[2 * i], b = r[2 * i + 1];
        r[2 * i] = a * c - b * s;
        r[2 * i + 1] = b * c + a * s;
    }
    __syncthreads();
}

enum { MAX_SCALE_BLOCKS = 64 };

/* ds4_fp8_e4m3_roundtrip (blk 64, kind FP8) / ds4_fp4_e2m1_roundtrip (blk 32). */
static __device__ void blk_scaled_round(float *x, int n, bool fp8) {
    __shared__ float scale[MAX_SCALE_BLOCKS];
    const int bs = fp8 ? 64 : 32;
    for (int b = threadIdx.x; b < n / bs; b += blockDim.x) {
        float amax = 0;
        for (int i = 0; i < bs; i++) amax = fmaxf(amax, fabsf(x[b * bs + i]));
        scale[b] = fp8 ? ds4_fp8_block_scale(amax) : ds4_fp4_block_scale(amax);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        x[i] = fp8 ? ds4_fp8_value(x[i], scale[i / bs]) : ds4_fp4_value(x[i], scale[i / bs]);
    __syncthreads();
}

static __device__ void blk_hadamard(float *x, int n) {
    for (int h = 1; h < n; h *= 2) {
        for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
            const int j = (p / h) * 2 * h + p % h;
            const float a = x[j], b = x[j + h];
            x[j] = a + b;
            x[j + h] = a - b;
        }
        __syncthreads();
    }
    const float s = 1.0f / sqrtf((float)n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] *= s;
    __syncthreads();
}

static __device__ void blk_f16(float *x, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = f16_round(x[i]);
    __syncthreads();
}

__global__ void k_rmsnorm(const float *x, int64_t xstride, float *y, int64_t ystride, int n, const float *w, float eps) {
    const float *xr = x + (size_t)blockIdx.x * xstride;
    float *yr = y + (size_t)blockIdx.x * ystride;
    double ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum<double>(ss);
    const float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = w ? w[i] * (xr[i] * r) : xr[i] * r;
}

extern "C" void ds4_cu_rmsnorm(const float *x, int64_t xstride, float *y, int64_t ystride, int T, int n, const float *w,
                               float eps, ds4_cu_stream stream) {
    k_rmsnorm<<<T, 256, 0, stream>>>(x, xstride, y, ystride, n, w, eps);
}

__global__ void k_rope_tables(const int *pos0, int T, int n_rot, const float *inv_main, const float *inv_comp, float *cs) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, half = n_rot / 2;
    if (i >= T * 2 * half) return;
    const int t = i / (2 * half), kind = (i / half) % 2, k = i % half;
    const float ang = (float)(*pos0 + t) * (kind ? inv_comp : inv_main)[k];   /* f32 angle, as the reference */
    float *o = cs + ((size_t)t * 2 + kind) * n_rot;
    o[2 * k] = (float)cos((double)ang);
    o[2 * k + 1] = (float)sin((double)ang);
}

extern "C" void ds4_cu_rope_tables(const int *pos0, int T, int n_rot, const float *inv_freq_main,
                                   const float *inv_freq_comp, float *cs, ds4_cu_stream stream) {
    const int n = T * n_rot;
    k_rope_tables<<<(n + 255) / 256, 256, 0, stream>>>(pos0, T, n_rot, inv_freq_main, inv_freq_comp, cs);
}

__global__ void k_roundtrip(int kind, float *x, int n) {
    float *r = x + (size_t)blockIdx.x * n;
    if (kind == DS4_CU_FP8 || kind == DS4_CU_FP4) blk_scaled_round(r, n, kind == DS4_CU_FP8);
    else if (kind == DS4_CU_HADAMARD) blk_hadamard(r, n);
    else blk_f16(r, n);
}

extern "C" int ds4_cu_roundtrip(int kind, float *x, int rows, int n, ds4_cu_stream stream) {
    const int block = kind == DS4_CU_FP8 ? 64 : kind == DS4_CU_FP4 ? 32 : 1;
    if (n % block || (block > 1 && n / block > MAX_SCALE_BLOCKS) || (kind == DS4_CU_HADAMARD && (n & (n - 1))))
        return -1;
    k_roundtrip<<<rows, 256, 0, stream>>>(kind, x, n);
    return 0;
}

__global__ void k_swiglu(float *g, const float *u, int64_t n, float limit) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float gv = fminf(g[i], limit), uv = fminf(fmaxf(u[i], -limit), limit);
    g[i] = gv / (1.0f + expf(-gv)) * uv;
}

extern "C" void ds4_cu_swiglu(float *g, const float *u, int64_t n, float limit, ds4_cu_stream stream) {
    k_swiglu<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(g, u, n, limit);
}

/* ---------------------------------------------------- hyper-connections */

enum { HC_MAX = 16 };

/* hc_pre_task: thread 0 builds pre/post/comb, then the block collapses the
 * streams into a. */
__global__ void k_hc_pre(const float *mix, const float *sc, const float *bs, const float *S, float *hcw, float *a, int hc,
                         int E, int iters, float eps) {
    __shared__ float pre[HC_MAX];
    __shared__ double C[HC_MAX * HC_MAX];
    const int t = blockIdx.x, mixn = (2 + hc) * hc;
    float *post = hcw + (size_t)t * mixn;
    if (threadIdx.x == 0) ds4_hc_weights(mix + (size_t)t * mixn, sc, bs, hc, iters, eps, pre, post, post + hc, C);
    __syncthreads();
    const float *St = S + (size_t)t * hc * E;
    for (int d = threadIdx.x; d < E; d += blockDim.x) {
        float acc = 0;
        for (int s = 0; s < hc; s++) acc += pre[s] * St[(size_t)s * E + d];
        a[(size_t)t * E + d] = acc;
    }
}

extern "C" void ds4_cu_hc_pre(const float *mix, const float *scale, const float *base, const float *S, float *hcw,
                              float *a, int T, int hc, int E, int sinkhorn_iters, float hc_eps, ds4_cu_stream stream) {
    k_hc_pre<<<T, 256, 0, stream>>>(mix, scale, base, S, hcw, a, hc, E, sinkhorn_iters, hc_eps);
}

__global__ void k_hc_post(const float *hcw, const float *S, const float *y, float *out, int T, int hc, int E) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * hc * E) return;
    const int t = (int)(i / ((int64_t)hc * E)), k = (int)(i / E % hc), d = (int)(i % E);
    const float *post = hcw + (size_t)t * (2 + hc) * hc, *comb = post + hc;
    const float *St = S + (size_t)t * hc * E;
    float acc = post[k] * y[(size_t)t * E + d];
    for (int j = 0; j < hc; j++) acc += comb[j * hc + k] * St[(size_t)j * E + d];
    out[i] = acc;
}

extern "C" void ds4_cu_hc_post(const float *hcw, const float *S, const float *y, float *out, int T, int hc, int E,
                               ds4_cu_stream stream) {
    const int64_t n = (int64_t)T * hc * E;
    k_hc_post<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(hcw, S, y, out, T, hc, E);
}

__global__ void k_steer(float *y, const float *d, const float *scale, int E) {
    const float s = *scale;
    if (s == 0.0f) return;   /* every thread of the block: the unsteered rows stay as they are */
    __shared__ double part[256];
    float *yt = y + (size_t)blockIdx.x * E;
    double acc = 0;
    for (int i = threadIdx.x; i < E; i += blockDim.x) acc += (double)d[i] * yt[i];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    /* the CPU's rounding steps (steering.c): k in float, then one product and one difference */
    const float k = (float)(s * part[0]);
    for (int i = threadIdx.x; i < E; i += blockDim.x) yt[i] = __fsub_rn(yt[i], __fmul_rn(k, d[i]));
}

extern "C" void ds4_cu_steer(float *y, const float *d, const float *scale, int T, int E, ds4_cu_stream stream) {
    k_steer<<<T, 256, 0, stream>>>(y, d, scale, E);
}

__global__ void k_head_mix(const float *mix, const float *sc, const float *bs, const float *S, const float *norm,
                           float *h, int hc, int E, float hc_eps, float rms_eps) {
    const int t = blockIdx.x;
    const float *St = S + (size_t)t * hc * E;
    float *ht = h + (size_t)t * E;
    for (int d = threadIdx.x; d < E; d += blockDim.x) {
        float acc = 0;
        for (int s = 0; s < hc; s++)
            acc += (ds4_sigmoid(mix[(size_t)t * hc + s] * sc[0] + bs[s]) + hc_eps) * St[(size_t)s * E + d];
        ht[d] = acc;
    }
    __syncthreads();
    blk_rmsnorm(ht, E, norm, rms_eps);
}

extern "C" void ds4_cu_head_mix(const float *mix, const float *scale, const float *base, const float *S,
                                const float *norm, float *h, int T, int hc, int E, float hc_eps, float rms_eps,
                                ds4_cu_stream stream) {
    k_head_mix<<<T, 256, 0, stream>>>(mix, scale, base, S, norm, h, hc, E, hc_eps, rms_eps);
}

/* -------------------------------------------------------------- attention */

static __device__ const float *rope_cs_of(const ds4_cu_attn_geom g, int t) {
    return g.rope_cs + ((size_t)t * 2 + g.rope_kind) * g.n_rot;
}

/* q_task: blocks (t, head) for q, (t, n_head) for the KV row. */
__global__ void k_q_prep(const ds4_cu_attn_geom g, float *q, float *kvr, const float *kv_norm) {
    const int t = blockIdx.x, h = blockIdx.y, D = g.head_dim;
    const float *cs = rope_cs_of(g, t);
    if (h < g.n_head) {
        float *r = q + ((size_t)t * g.n_head + h) * D;
        blk_rmsnorm(r, D, NULL, g.rms_eps);
        blk_rope(r, D, g.n_rot, cs, false);
        return;
    }
    float *r = kvr + (size_t)t * D;
    blk_rmsnorm(r, D, kv_norm, g.rms_eps);
    blk_rope(r, D, g.n_rot, cs, false);
    if (g.numerics) {
        blk_scaled_round(r, D - g.n_rot, true);
        blk_f16(r, D);
    }
}

extern "C" void ds4_cu_q_prep(const ds4_cu_attn_geom *g, float *q, float *kvr, const float *kv_norm,
                              ds4_cu_stream stream) {
    k_q_prep<<<dim3(g->T, g->n_head + 1), 128, 0, stream>>>(*g, q, kvr, kv_norm);
}

static __device__ void blk_pool_window(const float *fk, const float *fz, int f_cap, int coff, int d, int ratio, int64_t w,
                                       float *out) {
    for (int j = threadIdx.x; j < d; j += blockDim.x) out[j] = ds4_pool_lane(fk, fz, f_cap, coff, d, ratio, w, j);
    __syncthreads();
}

enum { MAX_ROT = 256 };

/* compress_batch, one block walking the batch in token order (a window's
 * frontier slots may be reused within one batch). */
__global__ void k_compress(const ds4_cu_attn_geom g, const float *ck, const float *cz, const float *ik_in,
                           const float *iz_in, const float *ape, const float *iape, const float *comp_norm,
                           const float *idx_norm, float *fk, float *fz, float *comp, float *ik, float *iz, float *idx) {
    __shared__ float cs[MAX_ROT];
    const int D = g.head_dim, DI = g.idx_head_dim, r = g.ratio, Wc = g.coff * D, Wi = 2 * DI;
    for (int t = 0; t < g.T; t++) {
        const int64_t p = (int64_t)*g.pos0 + t;
        const size_t slot = (size_t)(p % g.f_cap);
        const float *ap = ape + (size_t)(p % r) * Wc;
        for (int i = threadIdx.x; i < Wc; i += blockDim.x) {
            fk[slot * Wc + i] = ck[(size_t)t * Wc + i];
            fz[slot * Wc + i] = cz[(size_t)t * Wc + i] + ap[i];
        }
        if (idx) {
            const float *iap = iape + (size_t)(p % r) * Wi;
            for (int i = threadIdx.x; i < Wi; i += blockDim.x) {
                ik[slot * Wi + i] = ik_in[(size_t)t * Wi + i];
                iz[slot * Wi + i] = iz_in[(size_t)t * Wi + i] + iap[i];
            }
        }
        __syncthreads();
        if ((p + 1) % r) continue;
        const int64_t w = (p + 1) / r - 1;
        for (int i = threadIdx.x; i < g.n_rot / 2; i += blockDim.x) {
            const float ang = (float)(w * r) * g.inv_freq_comp[i];
            cs[2 * i] = (float)cos((double)ang);
            cs[2 * i + 1] = (float)sin((double)ang);
        }
        __syncthreads();
        float *row = comp + (size_t)w * D;
        blk_pool_window(fk, fz, g.f_cap, g.coff, D, r, w, row);
        blk_rmsnorm(row, D, comp_norm, g.rms_eps);
        blk_rope(row, D, g.n_rot, cs, false);
        if (g.numerics) {
            blk_scaled_round(row, D - g.n_rot, true);
            blk_f16(row, D);
        }
        if (idx) {
            float *ir = idx + (size_t)w * DI;
            blk_pool_window(ik, iz, g.f_cap, 2, DI, r, w, ir);
            blk_rmsnorm(ir, DI, idx_norm, g.rms_eps);
            blk_rope(ir, DI, g.n_rot, cs, false);
            if (g.numerics) {
                blk_hadamard(ir, DI);
                blk_scaled_round(ir, DI, false);
                blk_f16(ir, DI);
            }
        }
    }
}

extern "C" void ds4_cu_compress(const ds4_cu_attn_geom *g, const float *ck, const float *cz, const float *ik_in,
                                const float *iz_in, const float *ape, const float *iape, const float *comp_norm,
                                const float *idx_norm, float *fk, float *fz, float *comp, float *ik, float *iz,
                                float *idx, ds4_cu_stream stream) {
    k_compress<<<1, 256, 0, stream>>>(*g, ck, cz, ik_in, iz_in, ape, iape, comp_norm, idx_norm, fk, fz, comp, ik, iz,
                                      idx);
}

static __device__ int n_visible(const ds4_cu_attn_geom g, int t) { return (int)(((int64_t)*g.pos0 + t + 1) / g.ratio); }

__global__ void k_idx_q(const ds4_cu_attn_geom g, float *qi) {
    const int t = blockIdx.x, h = blockIdx.y, DI = g.idx_head_dim;
    float *r = qi + ((size_t)t * g.n_idx_head + h) * DI;
    blk_rope(r, DI, g.n_rot, rope_cs_of(g, t), false);
    if (g.numerics) {
        blk_hadamard(r, DI);
        blk_scaled_round(r, DI, false);
    }
}

enum { SCORE_WARPS = 8 };

/* idx_score: one warp per (token, row). */
__global__ void k_idx_score(const ds4_cu_attn_geom g, const float *qi, const float *om, const float *rows, float *iscore) {
    const int t = blockIdx.y, warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int w = blockIdx.x * SCORE_WARPS + warp, DI = g.idx_head_dim, HI = g.n_idx_head;
    if (w >= n_visible(g, t)) return;
    const float *k = rows + (size_t)w * DI, *q = qi + (size_t)t * HI * DI, *omt = om + (size_t)t * HI;
    const float ks = 1.0f / sqrtf((float)DI), ws = 1.0f / sqrtf((float)HI);
    float acc = 0;
    for (int h = 0; h < HI; h++) {
        float dot = 0;
        for (int i = lane; i < DI; i += WARP) dot += k[i] * q[(size_t)h * DI + i];
        dot = warp_sum(dot);
        if (dot > 0) acc += dot * ks * (omt[h] * ws);
    }
    if (lane == 0) iscore[(size_t)t * g.comp_cap + w] = acc;
}

/* Orders floats as unsigned keys (larger float, larger key). */
static __device__ __forceinline__ uint32_t fkey(float f) {
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

/* Exclusive prefix sum of one int per thread over the block; returns the total. */
static __device__ int block_scan(int v, int *excl) {
    __shared__ int buf[1024];
    const int i = threadIdx.x;
    buf[i] = v;
    __syncthreads();
    for (int o = 1; o < (int)blockDim.x; o *= 2) {
        const int add = i >= o ? buf[i - o] : 0;
        __syncthreads();
        buf[i] += add;
        __syncthreads();
    }
    *excl = buf[i] - v;
    const int total = buf[blockDim.x - 1];
    __syncthreads();
    return total;
}

/* ds4_topk (nn_math.h): the k best rows (score desc, index asc), ascending indices. The
 * k-th best key is found bit by bit, then rows above it and the first tied
 * rows are written in index order. */
__global__ void k_topk(const ds4_cu_attn_geom g, const float *iscore, int *sel, int *nsel) {
    const int t = blockIdx.x, nv = n_visible(g, t), k = g.idx_topk;
    int *out = sel + (size_t)t * k;
    if (nv <= k) {
        for (int w = threadIdx.x; w < nv; w += blockDim.x) out[w] = w;
        if (threadIdx.x == 0) nsel[t] = nv;
        return;
    }
    const float *s = iscore + (size_t)t * g.comp_cap;
    uint32_t kth = 0;
    for (int bit = 31; bit >= 0; bit--) {
        const uint32_t cand = kth | (1u << bit);
        int c = 0;
        for (int w = threadIdx.x; w < nv; w += blockDim.x) c += fkey(s[w]) >= cand;
        if (block_sum<int>(c) >= k) kth = cand;
    }
    int above = 0;
    for (int w = threadIdx.x; w < nv; w += blockDim.x) above += fkey(s[w]) > kth;
    const int ties_kept = k - block_sum<int>(above);
    int written = 0, ties_seen = 0;
    for (int base = 0; base < nv; base += blockDim.x) {
        const int w = base + threadIdx.x;
        const uint32_t key = w < nv ? fkey(s[w]) : 0;
        const int tie = w < nv && key == kth;
        int tie_before;
        const int ties_here = block_scan(tie, &tie_before);
        const int keep = w < nv && (key > kth || (tie && ties_seen + tie_before < ties_kept));
        int pos;
        const int kept = block_scan(keep, &pos);
        if (keep) out[written + pos] = w;
        written += kept;
        ties_seen += ties_here;
    }
    if (threadIdx.x == 0) nsel[t] = k;
}

extern "C" void ds4_cu_indexer(const ds4_cu_attn_geom *g, float *qi, const float *om, const float *idx_rows,
                               float *iscore, int *sel, int *nsel, ds4_cu_stream stream) {
    k_idx_q<<<dim3(g->T, g->n_idx_head), 128, 0, stream>>>(*g, qi);
    k_idx_score<<<dim3((g->comp_cap + SCORE_WARPS - 1) / SCORE_WARPS, g->T), SCORE_WARPS * WARP, 0, stream>>>(
        *g, qi, om, idx_rows, iscore);
    k_topk<<<g->T, 256, 0, stream>>>(*g, iscore, sel, nsel);
}

enum { ATTN_WARPS = 4 };

/* attn_task: each warp keeps an online softmax over its share of the rows;
 * the warps' partial sums are merged with the sink at the end. */
__global__ void __launch_bounds__(ATTN_WARPS * WARP)
k_attention(const ds4_cu_attn_geom g, const float *q, const float *kvr, const float *raw, const float *comp,
            const int *sel, const int *nsel, const float *sinks, float *o) {
    extern __shared__ float acc[];          /* [ATTN_WARPS][D] */
    __shared__ float wmax[ATTN_WARPS], wsum[ATTN_WARPS];
    const int H = g.n_head, D = g.head_dim, t = blockIdx.x / H, h = blockIdx.x % H;
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int64_t p0 = *g.pos0, p = p0 + t, lo = p - g.window + 1 > 0 ? p - g.window + 1 : 0;
    const int n_raw = (int)(p - lo + 1);
    int n_comp = 0;
    if (g.ratio) n_comp = sel ? nsel[t] : n_visible(g, t);
    const int n = n_raw + n_comp;
    const float *qr = q + ((size_t)t * H + h) * D;
    const float scale = 1.0f / sqrtf((float)D);
    float *my = acc + (size_t)warp * D;
    for (int d = lane; d < D; d += WARP) my[d] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int i = warp; i < n; i += ATTN_WARPS) {
        const float *row;
        if (i < n_raw) {
            const int64_t pos = lo + i;
            row = pos >= p0 ? kvr + (size_t)(pos - p0) * D : raw + (size_t)(pos % g.raw_cap) * D;
        } else {
            row = comp + (size_t)(sel ? sel[(size_t)t * g.idx_topk + i - n_raw] : i - n_raw) * D;
        }
        float dot = 0;
        for (int d = lane; d < D; d += WARP) dot += row[d] * qr[d];
        const float s = warp_sum(dot) * scale, mn = fmaxf(m, s);
        const float corr = expf(m - mn), e = expf(s - mn);
        l = l * corr + e;
        for (int d = lane; d < D; d += WARP) my[d] = my[d] * corr + e * row[d];
        m = mn;
    }
    if (lane == 0) { wmax[warp] = m; wsum[warp] = l; }
    __syncthreads();
    const float sink = sinks[h];
    float M = sink;
    for (int w = 0; w < ATTN_WARPS; w++) M = fmaxf(M, wmax[w]);
    float den = expf(sink - M);
    for (int w = 0; w < ATTN_WARPS; w++) den += wsum[w] * expf(wmax[w] - M);
    float *out = o + ((size_t)t * H + h) * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v = 0;
        for (int w = 0; w < ATTN_WARPS; w++) v += acc[(size_t)w * D + d] * expf(wmax[w] - M);
        out[d] = v / den;
    }
    __syncthreads();
    blk_rope(out, D, g.n_rot, rope_cs_of(g, t), true);
}

extern "C" void ds4_cu_attention(const ds4_cu_attn_geom *g, const float *q, const float *kvr, const float *raw,
                                 const float *comp, const int *sel, const int *nsel, const float *sinks, float *o,
                                 ds4_cu_stream stream) {
    const size_t shm = (size_t)ATTN_WARPS * g->head_dim * sizeof(float);
    k_attention<<<g->T * g->n_head, ATTN_WARPS * WARP, shm, stream>>>(*g, q, kvr, raw, comp, sel, nsel, sinks, o);
}

__global__ void k_ring_write(const ds4_cu_attn_geom g, const float *kvr, float *raw, int t0) {
    const int t = t0 + blockIdx.x, D = g.head_dim;
    const int64_t slot = ((int64_t)*g.pos0 + t) % g.raw_cap;
    for (int d = threadIdx.x; d < D; d += blockDim.x) raw[(size_t)slot * D + d] = kvr[(size_t)t * D + d];
}

extern "C" void ds4_cu_ring_write(const ds4_cu_attn_geom *g, const float *kvr, float *raw, ds4_cu_stream stream) {
    const int t0 = g->T > g->raw_cap ? g->T - g->raw_cap : 0;
    k_ring_write<<<g->T - t0, 128, 0, stream>>>(*g, kvr, raw, t0);
}

/* -------------------------------------------------------------------- MoE */

__global__ void k_route(const ds4_cu_route_geom g, float *scores, int32_t *eidx, float *ew) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= g.T) return;
    ds4_route_token(scores + (size_t)t * g.n_expert, g.n_expert, g.k,
                    g.tid2eid ? g.tid2eid + (size_t)g.toks[t] * g.k : NULL, g.bias, g.weights_norm, g.weights_scale,
                    eidx + (size_t)t * g.k, ew + (size_t)t * g.k);
}

extern "C" void ds4_cu_route(const ds4_cu_route_geom *g, float *scores, int32_t *eidx, float *ew, ds4_cu_stream stream) {
    k_route<<<(g->T + 63) / 64, 64, 0, stream>>>(*g, scores, eidx, ew);
}

__global__ void k_moe_combine(float *y, const float *oe, const float *ew, int T, int k, int E) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * E) return;
    const int t = (int)(i / E), d = (int)(i % E);
    float acc = y[i];
    for (int j = 0; j < k; j++) acc += ew[(size_t)t * k + j] * oe[((size_t)t * k + j) * E + d];
    y[i] = acc;
}

extern "C" void ds4_cu_moe_combine(float *y, const float *oe, const float *ew, int T, int k, int E,
                                   ds4_cu_stream stream) {
    const int64_t n = (int64_t)T * E;
    k_moe_combine<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(y, oe, ew, T, k, E);
}
