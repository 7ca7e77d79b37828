/* ops.h -- the CUDA kernels of the DS4 forward pass, as C-callable launches
 * on a stream (used by the CUDA backend and by cuda-ops, which checks
 * each one against the CPU reference).
 *
 * Contract
 * - Every pointer is device memory unless named host_*. Launches are
 *   asynchronous on `stream`; they return 0, or -1 for a shape or type the
 *   kernel does not support (nothing launched). Launch failures surface at
 *   the caller's next checked CUDA call.
 * - Each op mirrors the CPU function named in its comment (forward_cpu.c,
 *   forward_cpu_math.c, quant.c, kernels_cpu.c) op by op, in f32 with the same
 *   double-precision spots; results equal the CPU's up to float summation
 *   order. Activations are quantized exactly as ds4_quantize_act does (same
 *   bytes), so matrix products see the same integer inputs.
 * - Positions come from device memory (`pos0`: the batch's first position),
 *   so a captured graph replays for any position.
 * - ds4_cu_ops_init() copies the IQ2_XXS tables to constant memory; call it
 *   once per device before any IQ2_XXS product.
 */
#ifndef DS4_CUDA_OPS_H
#define DS4_CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *ds4_cu_stream;

int ds4_cu_ops_init(void);

/* Plain device memory for callers without CUDA headers (the op check):
 * NULL / -1 on failure, with the CUDA error in err. */
int ds4_cu_probe(char *err, size_t errlen);          /* 0 when device 0 is usable */
void *ds4_cu_alloc(size_t bytes);
void ds4_cu_free(void *p);
int ds4_cu_copy(void *dst, const void *src, size_t bytes, bool to_device);
int ds4_cu_finish(char *err, size_t errlen);         /* synchronize; the first kernel error */

/* ---- matrix products (kernels_cpu.h) ---- */
/* T rows of n floats (row stride xstride) -> T activations of ds4_act_bytes(wtype, n) bytes each. */
int ds4_cu_quantize_act(uint32_t wtype, const float *x, int64_t xstride, int T, int64_t n, void *act,
                        ds4_cu_stream stream);
/* Y[t*ystride + r] = W[r,:] . act[t] for r < rows, t < T (W: rows of row_bytes). */
int ds4_cu_matmul(uint32_t wtype, const void *W, size_t row_bytes, int64_t rows, int64_t n, const void *act, int T,
                  float *Y, int64_t ystride, ds4_cu_stream stream);
/* Expert products: pair j < J uses matrix eidx[j] of the stack (expert_bytes
 * apart) and activation j / act_div; Y row j. */
int ds4_cu_matmul_experts(uint32_t wtype, const void *W, size_t row_bytes, size_t expert_bytes, const int32_t *eidx,
                          int64_t rows, int64_t n, const void *act, int act_div, int J, float *Y, int64_t ystride,
                          ds4_cu_stream stream);

/* ---- row ops ---- */
/* Embedding: S[t] = copies x dequantized row toks[t] of the table (n floats each). */
int ds4_cu_embed(uint32_t type, const void *table, size_t row_bytes, const int32_t *toks, int T, int n, int copies,
                 float *S, ds4_cu_stream stream);
/* y = rmsnorm(x) (* w when w != NULL), T rows of n (forward_cpu.c rmsnorm). */
void ds4_cu_rmsnorm(const float *x, int64_t xstride, float *y, int64_t ystride, int T, int n, const float *w, float eps,
                    ds4_cu_stream stream);
/* RoPE cos/sin tables of tokens pos0..pos0+T-1 for both kinds: cs[(t*2+kind)*n_rot]. */
void ds4_cu_rope_tables(const int *pos0, int T, int n_rot, const float *inv_freq_main, const float *inv_freq_comp,
                        float *cs, ds4_cu_stream stream);
/* In-place per-row storage round trips (forward_cpu_math.c), rows of n
 * (a multiple of the block, at most 64 blocks; Hadamard: a power of two). */
int ds4_cu_roundtrip(int kind, float *x, int rows, int n, ds4_cu_stream stream);
enum { DS4_CU_FP8 = 0, DS4_CU_FP4 = 1, DS4_CU_HADAMARD = 2, DS4_CU_F16 = 3 };
/* g = silu(min(g, lim)) * clamp(u, +-lim), n floats (forward_cpu.c swiglu). */
void ds4_cu_swiglu(float *g, const float *u, int64_t n, float limit, ds4_cu_stream stream);

/* ---- hyper-connections (forward_cpu.c hc_*_task) ---- */
void ds4_cu_hc_pre(const float *mix, const float *scale, const float *base, const float *S, float *hcw, float *a, int T,
                   int hc, int E, int sinkhorn_iters, float hc_eps, ds4_cu_stream stream);
void ds4_cu_hc_post(const float *hcw, const float *S, const float *y, float *out, int T, int hc, int E,
                    ds4_cu_stream stream);
/* Directional steering (nn/steering.h) of T rows of E: y[t] -= s * d * dot(d, y[t]),
 * the dot in double, s read from the device (*scale: a captured graph follows the
 * session's current scale); s == 0 leaves y untouched. */
void ds4_cu_steer(float *y, const float *d, const float *scale, int T, int E, ds4_cu_stream stream);
/* Output head mix: h[t] = rmsnorm(sum_s (sigmoid(mix*scale0 + base_s) + eps) S[t][s]; norm). */
void ds4_cu_head_mix(const float *mix, const float *scale, const float *base, const float *S, const float *norm,
                     float *h, int T, int hc, int E, float hc_eps, float rms_eps, ds4_cu_stream stream);

/* ---- attention ---- */
typedef struct {
    int T, n_head, head_dim, n_rot, window, raw_cap;
    int ratio, coff, f_cap, idx_head_dim, n_idx_head, idx_topk, comp_cap;
    float rms_eps;
    bool numerics;
    const int *pos0;
    const float *rope_cs;          /* ds4_cu_rope_tables output */
    int rope_kind;                 /* 0 main, 1 compressed layers */
    const float *inv_freq_comp;    /* the compressed-row RoPE */
} ds4_cu_attn_geom;

/* q_task: per-head rmsnorm + RoPE of q; kv rmsnorm(kv_norm) + RoPE (+ FP8/F16). */
void ds4_cu_q_prep(const ds4_cu_attn_geom *g, float *q, float *kvr, const float *kv_norm, ds4_cu_stream stream);
/* compress_batch: frontier rings, pooled rows, their norm/RoPE/round trips.
 * fk/fz/comp and (indexer) ik/iz/idx are the layer's device state. */
void ds4_cu_compress(const ds4_cu_attn_geom *g, const float *ck, const float *cz, const float *ik_in, const float *iz_in,
                     const float *ape, const float *iape, const float *comp_norm, const float *idx_norm, float *fk,
                     float *fz, float *comp, float *ik, float *iz, float *idx, ds4_cu_stream stream);
/* idx_q_task (RoPE, Hadamard + FP4 with numerics) then scores of every
 * visible row and the top-k selection (ds4_topk: ties to the lower index,
 * ascending); nv <= topk selects all visible rows. */
void ds4_cu_indexer(const ds4_cu_attn_geom *g, float *qi, const float *om, const float *idx_rows, float *iscore,
                    int *sel, int *nsel, ds4_cu_stream stream);
/* attn_task: softmax with sink over raw + compressed rows, inverse RoPE. */
void ds4_cu_attention(const ds4_cu_attn_geom *g, const float *q, const float *kvr, const float *raw, const float *comp,
                      const int *sel, const int *nsel, const float *sinks, float *o, ds4_cu_stream stream);
/* The batch's KV rows become the raw ring (after attention read the old one). */
void ds4_cu_ring_write(const ds4_cu_attn_geom *g, const float *kvr, float *raw, ds4_cu_stream stream);

/* ---- MoE (forward_cpu.c route_task, expert) ---- */
typedef struct {
    int T, n_expert, k;
    bool weights_norm;
    float weights_scale;
    const int32_t *tid2eid;        /* hash layers, else NULL */
    const float *bias;             /* exp_probs_b or NULL */
    const int32_t *toks;
} ds4_cu_route_geom;
void ds4_cu_route(const ds4_cu_route_geom *g, float *scores, int32_t *eidx, float *ew, ds4_cu_stream stream);
/* y[t] += sum_i ew[t*k+i] * oe[t*k+i], i in order. */
void ds4_cu_moe_combine(float *y, const float *oe, const float *ew, int T, int k, int E, ds4_cu_stream stream);

#ifdef __cplusplus
}
#endif

#endif
