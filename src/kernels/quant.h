/* quant.h -- ggml block formats: layouts, traits, dequantize, quantize and
 * the scalar reference dot products.
 *
 * Contract
 * - Block structs are bit-exact with ggml/gguf-py (sizes checked by static
 *   asserts in quant.c). All fields little endian; half = IEEE binary16 bits.
 * - dequantize/quantize work on whole rows; n must be a multiple of the
 *   type's block size (ds4_type_block_elems).
 * - quantize follows ggml's reference procedures (so gguf-py dequantizes our
 *   blocks to the values we expect); IQ2_XXS takes optional importance
 *   weights (imatrix) and uses the grid search.
 * - Quantizers are total: any float input, NaN and infinities included,
 *   gives defined bytes, written inside the row only. The Q8_0 and Q8_K
 *   quantizers (the activation formats) store a block holding a NaN or an
 *   infinity as scale NaN with quants 0, so every dot over it is NaN; a
 *   block of magnitudes below about 3.7e-37 (its inverse scale overflows)
 *   gets quants 0. Finite values beyond a format's range overflow its
 *   scale (Q8_0: |x| > 65504 * 127 gives an infinite f16 scale).
 * - ds4_vec_dot_ref_<T>() are the *scalar reference* dot products of one
 *   weight row against an activation already quantized to the partner type
 *   (ds4_type_vec_dot_type). SIMD versions (kernels_cpu.h) must equal these
 *   within float rounding.
 */
#ifndef DS4_QUANT_H
#define DS4_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

enum ds4_type {
    DS4_TYPE_F32 = 0, DS4_TYPE_F16 = 1, DS4_TYPE_Q8_0 = 8, DS4_TYPE_Q2_K = 10,
    DS4_TYPE_Q3_K = 11, DS4_TYPE_Q4_K = 12, DS4_TYPE_Q5_K = 13, DS4_TYPE_Q6_K = 14,
    DS4_TYPE_Q8_K = 15, DS4_TYPE_IQ2_XXS = 16, DS4_TYPE_I8 = 24, DS4_TYPE_I16 = 25,
    DS4_TYPE_I32 = 26, DS4_TYPE_I64 = 27, DS4_TYPE_F64 = 28, DS4_TYPE_BF16 = 30,
};

#define DS4_QK8_0 32
#define DS4_QK_K 256

typedef uint16_t ds4_half;

typedef struct { ds4_half d; int8_t qs[DS4_QK8_0]; } ds4_block_q8_0;                 /* 34 */
typedef struct { uint8_t scales[16]; uint8_t qs[64]; ds4_half d, dmin; } ds4_block_q2_K; /* 84 */
typedef struct { ds4_half d, dmin; uint8_t scales[12]; uint8_t qs[128]; } ds4_block_q4_K; /* 144 */
typedef struct { ds4_half d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } ds4_block_q5_K; /* 176 */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; ds4_half d; } ds4_block_q6_K; /* 210 */
typedef struct { float d; int8_t qs[DS4_QK_K]; int16_t bsums[DS4_QK_K / 16]; } ds4_block_q8_K; /* 292 */
typedef struct { ds4_half d; uint16_t qs[DS4_QK_K / 8]; } ds4_block_iq2_xxs;            /* 66 */

/* ---- type traits (valid for every id gguf may contain; unknown -> 0) ---- */
const char *ds4_type_name(uint32_t type);            /* "Q8_0", ...; NULL if unknown */
int ds4_type_from_name(const char *name);            /* case-insensitive; -1 if unknown */
size_t ds4_type_block_elems(uint32_t type);          /* 0 if unknown */
size_t ds4_type_block_bytes(uint32_t type);          /* 0 if unknown */
size_t ds4_type_row_bytes(uint32_t type, uint64_t n);/* n elements; 0 if not a multiple */
uint32_t ds4_type_vec_dot_type(uint32_t type);       /* activation partner for dot */

/* ---- scalar conversions ---- */
float ds4_half_to_f32(ds4_half h);
ds4_half ds4_f32_to_half(float f);                   /* round to nearest even */
float ds4_bf16_to_f32(uint16_t h);
uint16_t ds4_f32_to_bf16(float f);                   /* round to nearest even */

/* ---- rows ---- */
/* Dequantize n elements of a row of `type` into y. Supports every type above
 * that has a float meaning (F32, F16, BF16, Q8_0, Q2_K..Q8_K, IQ2_XXS). */
void ds4_dequantize_row(uint32_t type, const void *x, float *y, int64_t n);
/* Quantize n floats into a row of `type`. imatrix (may be NULL) holds one
 * importance weight per element of the row (IQ2_XXS uses it; K-quants use it
 * when given). Returns bytes written. */
size_t ds4_quantize_row(uint32_t type, const float *x, void *y, int64_t n, const float *imatrix);
/* Whether ds4_quantize_row supports `type` as a weight format. IQ2_XXS builds
 * its search tables on first use; ds4_quant_init() does that ahead of time. */
bool ds4_type_can_quantize(uint32_t type);
void ds4_quant_init(void);                           /* thread-safe, idempotent */

/* Reference dot product: weight row (n elements of `type`) · activation row
 * already in ds4_type_vec_dot_type(type) format. F32/F16/BF16 take f32 acts.
 * Covers every type ds4_dequantize_row does; 0 for any other type. */
float ds4_vec_dot_ref(uint32_t type, const void *w, const void *act, int64_t n);
/* The exact integer of one IQ2_XXS super-block against its Q8_K partner:
 * sum over sub-blocks of (2 * scale + 1) x (signed grid values . quants).
 * Both the reference dot and the AMX level's float-order model build on it. */
int32_t ds4_iq2_xxs_isum(const ds4_block_iq2_xxs *w, const ds4_block_q8_K *a);

/* IQ2_XXS format tables (from tests/fixtures/quant/iq2xxs-tables.txt, facts of the format) */
extern const uint64_t ds4_iq2xxs_grid[256];
extern const uint8_t ds4_ksigns_iq2xs[128];
extern const uint8_t ds4_kmask_iq2xs[8];

#endif
