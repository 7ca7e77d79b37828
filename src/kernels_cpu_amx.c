/* kernels_cpu_amx.c -- the AMX level: Q8_0 x Q8_0 on AMX-INT8 tiles.
 *
 * TDPBSSD multiplies signed bytes by signed bytes and sums each group of K
 * products straight into an int32 of the C tile, so one instruction gives
 * the exact integer sum of a whole Q8_0 block (K = 32) for 16 weight rows
 * x 16 tokens. Those whole-block sums fix the float order of this level
 * (kernels_cpu.h, ds4_vec_dot_q8_0_blockwise): per (row, token) one FMA
 * per block in block order, acc = fma((float)isum_b, d_w[b] * d_a[b], acc).
 * Every Q8_0 path here runs exactly that: the tile (16 rows x 1..16
 * tokens, also the matvec), and the dot / multi-token micro-kernel for the
 * rows left over after whole tiles, which get the same integers from
 * AVX-512 VNNI instead. The other types have no AMX kernel and run the
 * AVX-512 ones (kernels_cpu.c falls back).
 *
 * Tile registers (palette 1, configured once per thread):
 *   tmm0, tmm1  C: 16 rows x 16 int32 (the block sums of two blocks)
 *   tmm2, tmm3  A: 16 weight rows x the 32 quant bytes of one block, loaded
 *               straight from the weight rows (stride = row bytes; the qs
 *               follow each block's f16 scale)
 *   tmm4, tmm5  B: the token group's 32 bytes of that block in the VNNI
 *               layout TDPBSSD wants (8 rows of 4 bytes per token)
 *   tmm6, tmm7  the 16 rows' f16 block scales, loaded the same strided way
 *               so they come out contiguous (a tile load is a cheap
 *               16-row gather)
 * Two blocks are in flight per step.
 */
#include <stdbool.h>
#include <string.h>

#include "kernels_cpu_simd.h"

enum {
    AMX_ROWS = 16,              /* weight rows per tile (C and A rows) */
    AMX_TOKENS = 16,            /* tokens per tile (C columns) */
    QS_BYTES = DS4_QK8_0,       /* the K of one block */
    B_ROWS = QS_BYTES / 4,      /* VNNI: 4 bytes of K per B row and token */
    PACK_TAIL = 64,             /* the B loads of the last block read past it */
};

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};
_Static_assert(sizeof(struct tile_config) == 64, "LDTILECFG reads 64 bytes");

/* The tile configuration is per thread; loading it is not free, so each
 * thread loads it once, before its first tile instruction. Nothing else in
 * the process uses the tiles. */
static _Thread_local bool tiles_configured;

/* gcc 12's tile intrinsics are asm statements that declare no memory
 * operands (_tile_loadconfig only the first 8 of its 64 bytes): a
 * configuration built on the stack lost its stores to dead-store
 * elimination (and LDTILECFG faulted on the zeros), hence a static one; and
 * after the tile stores the compiler is told that memory changed. */
#define TILE_STORES_DONE() __asm__ volatile("" ::: "memory")

static const struct tile_config tile_layout = {
    .palette = 1,
    .colsb = {AMX_TOKENS * 4, AMX_TOKENS * 4, QS_BYTES, QS_BYTES, AMX_TOKENS * 4, AMX_TOKENS * 4, 4, 4},
    .rows = {AMX_ROWS, AMX_ROWS, AMX_ROWS, AMX_ROWS, B_ROWS, B_ROWS, AMX_ROWS, AMX_ROWS},
};

static void tiles_configure(void) {
    if (tiles_configured) return;
    _tile_loadconfig(&tile_layout);
    tiles_configured = true;
}

/* ---- the rows left over after whole tiles: AVX-512 VNNI, same order ---- */

/* exact sum of the 32 products of a block: vpdpbusd wants an unsigned
 * operand, so a + 128 (xor 0x80) goes in and 128 * sum(w) comes back out
 * through the accumulator start `base` */
INLINE int32_t block_isum(__m256i wq, __m256i base, const ds4_block_q8_0 *a) {
    __m256i au = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)a->qs), _mm256_set1_epi8((char)0x80));
    __m256i s = _mm256_dpbusd_epi32(base, au, wq);
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(h);
}

INLINE void q8_0_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    const ds4_block_q8_0 *x = w;
    float acc[NT_MAX];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t] = 0.0f;
    for (int64_t b = 0; b < n / DS4_QK8_0; b++) {
        prefetch_weights(x + b);
        __m256i wq = _mm256_loadu_si256((const __m256i *)x[b].qs);
        __m256i base = _mm256_sub_epi32(_mm256_setzero_si256(),
                                        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), wq));
        const float dw = h2f(x[b].d);
        UNROLL
        for (int t = 0; t < nt; t++) {
            const ds4_block_q8_0 *a = (const ds4_block_q8_0 *)tok(acts, stride, t) + b;
            const float scale = dw * h2f(a->d);
            acc[t] = __builtin_fmaf((float)block_isum(wq, base, a), scale, acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++) out[t] = acc[t];
}
DOT_ENTRY_POINTS(q8_0)

/* ---- the tile ----
 * packed, for nt tokens: per block b, B rows k = 0..7 of 4 * nt bytes
 * (token t's quant bytes 4k..4k+3 at 4t), at b * 32 * nt; after all blocks
 * the token scales (f16, as stored), d[b * nt + t]; then PACK_TAIL zero
 * bytes. The B tile always reads 16 tokens' columns with row stride 4 * nt,
 * so columns nt..15 hold bytes of other rows: those C columns are never
 * read. */

/* the 32 quant bytes of tokens t (low half) and t + 1 (high half) of block
 * b, zeros for tokens past nt */
INLINE __m512i token_pair(const ds4_block_q8_0 *const *tk, int nt, int t, int64_t b) {
    __m256i lo = t < nt ? _mm256_loadu_si256((const __m256i *)tk[t][b].qs) : _mm256_setzero_si256();
    __m256i hi = t + 1 < nt ? _mm256_loadu_si256((const __m256i *)tk[t + 1][b].qs) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* A block of 16 tokens x 8 dwords is transposed to the 8 B rows of 16
 * dwords in two steps: first each quad-word m (dwords 2m, 2m + 1) of 8
 * tokens is gathered into one register (a two-source qword permute per 4
 * tokens, then 128-bit lane shuffles), then the even and the odd dwords of
 * two such registers (tokens 0-7 and 8-15) are B rows 2m and 2m + 1. */
static bool q8_0_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes) {
    const int64_t nb = n / DS4_QK8_0;
    const size_t b_bytes = (size_t)nb * (size_t)nt * QS_BYTES;
    if (b_bytes + (size_t)nb * (size_t)nt * sizeof(ds4_half) + PACK_TAIL > packed_bytes) return false;
    uint8_t *bq = packed;
    ds4_half *da = (ds4_half *)(bq + b_bytes);
    const ds4_block_q8_0 *tk[AMX_TOKENS];
    for (int t = 0; t < nt; t++) tk[t] = tok(acts, stride, t);
    /* in a pair of token_pair registers: token u (0..3) quad-word m is u * 4 + m */
    const __m512i quads01 = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13);
    const __m512i quads23 = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __mmask16 tokens = (__mmask16)((1u << nt) - 1);
    for (int64_t b = 0; b < nb; b++) {
        __m512i quad[4][2]; /* [m][h]: quad-word m of tokens 8h..8h+7 */
        UNROLL
        for (int h = 0; h < 2; h++) {
            __m512i p0 = token_pair(tk, nt, 8 * h, b), p1 = token_pair(tk, nt, 8 * h + 2, b);
            __m512i p2 = token_pair(tk, nt, 8 * h + 4, b), p3 = token_pair(tk, nt, 8 * h + 6, b);
            __m512i x01 = _mm512_permutex2var_epi64(p0, quads01, p1), x23 = _mm512_permutex2var_epi64(p0, quads23, p1);
            __m512i y01 = _mm512_permutex2var_epi64(p2, quads01, p3), y23 = _mm512_permutex2var_epi64(p2, quads23, p3);
            quad[0][h] = _mm512_shuffle_i64x2(x01, y01, _MM_SHUFFLE(1, 0, 1, 0));
            quad[1][h] = _mm512_shuffle_i64x2(x01, y01, _MM_SHUFFLE(3, 2, 3, 2));
            quad[2][h] = _mm512_shuffle_i64x2(x23, y23, _MM_SHUFFLE(1, 0, 1, 0));
            quad[3][h] = _mm512_shuffle_i64x2(x23, y23, _MM_SHUFFLE(3, 2, 3, 2));
        }
        int32_t *dst = (int32_t *)(bq + (size_t)b * (size_t)nt * QS_BYTES);
        UNROLL
        for (int m = 0; m < 4; m++) {
            _mm512_mask_storeu_epi32(dst + 2 * m * nt, tokens, _mm512_permutex2var_epi32(quad[m][0], even, quad[m][1]));
            _mm512_mask_storeu_epi32(dst + (2 * m + 1) * nt, tokens, _mm512_permutex2var_epi32(quad[m][0], odd, quad[m][1]));
        }
        for (int t = 0; t < nt; t++) da[b * nt + t] = tk[t][b].d;
    }
    memset(da + nb * nt, 0, PACK_TAIL);
    return true;
}

/* acc[r] (lanes = tokens) += the block's C tile, stored at c, times
 * d_w[r] * d_a: the float step of ds4_vec_dot_q8_0_blockwise for 16 rows x
 * 16 token lanes; dw holds the 16 rows' scale words (f16 in the low half) */
INLINE void block_float_step(__m512 acc[AMX_ROWS], const int32_t *c, const uint32_t *dw, __m512 da) {
    _Alignas(64) float dwf[AMX_ROWS];
    _mm512_store_ps(dwf, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_load_si512(dw))));
    UNROLL
    for (int r = 0; r < AMX_ROWS; r++) {
        __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(c + r * AMX_TOKENS));
        acc[r] = _mm512_fmadd_ps(isum, _mm512_mul_ps(_mm512_set1_ps(dwf[r]), da), acc[r]);
    }
}

INLINE __m512 token_scales(const ds4_half *d, __mmask16 tokens) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tokens, d));
}

static void q8_0_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                      int64_t y_stride) {
    tiles_configure();
    const int64_t nb = n / DS4_QK8_0;
    const uint8_t *bq = packed;
    const ds4_half *da = (const ds4_half *)(bq + (size_t)nb * (size_t)nt * QS_BYTES);
    const size_t b_stride = (size_t)nt * QS_BYTES, b_row = 4 * (size_t)nt;
    const __mmask16 tokens = (__mmask16)((1u << nt) - 1);
    const uint8_t *w0 = w;
    _Alignas(64) int32_t c0[AMX_ROWS * AMX_TOKENS], c1[AMX_ROWS * AMX_TOKENS];
    _Alignas(64) uint32_t d0[AMX_ROWS], d1[AMX_ROWS];
    __m512 acc[AMX_ROWS];
    UNROLL
    for (int r = 0; r < AMX_ROWS; r++) acc[r] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t *blk = w0 + (size_t)b * sizeof(ds4_block_q8_0);
        UNROLL
        for (int r = 0; r < AMX_ROWS; r++) prefetch_weights(blk + (size_t)r * row_bytes);
        _tile_zero(0);
        _tile_zero(1);
        _tile_loadd(2, blk + 2, (long)row_bytes);
        _tile_loadd(3, blk + 2 + sizeof(ds4_block_q8_0), (long)row_bytes);
        _tile_loadd(4, bq + (size_t)b * b_stride, (long)b_row);
        _tile_loadd(5, bq + (size_t)(b + 1) * b_stride, (long)b_row);
        _tile_loadd(6, blk, (long)row_bytes);
        _tile_loadd(7, blk + sizeof(ds4_block_q8_0), (long)row_bytes);
        _tile_dpbssd(0, 2, 4);
        _tile_dpbssd(1, 3, 5);
        _tile_stored(6, d0, 4);
        _tile_stored(7, d1, 4);
        _tile_stored(0, c0, AMX_TOKENS * 4);
        _tile_stored(1, c1, AMX_TOKENS * 4);
        TILE_STORES_DONE();
        block_float_step(acc, c0, d0, token_scales(da + b * nt, tokens));
        block_float_step(acc, c1, d1, token_scales(da + (b + 1) * nt, tokens));
    }
    if (b < nb) { /* an odd last block */
        const uint8_t *blk = w0 + (size_t)b * sizeof(ds4_block_q8_0);
        _tile_zero(0);
        _tile_loadd(2, blk + 2, (long)row_bytes);
        _tile_loadd(4, bq + (size_t)b * b_stride, (long)b_row);
        _tile_loadd(6, blk, (long)row_bytes);
        _tile_dpbssd(0, 2, 4);
        _tile_stored(6, d0, 4);
        _tile_stored(0, c0, AMX_TOKENS * 4);
        TILE_STORES_DONE();
        block_float_step(acc, c0, d0, token_scales(da + b * nt, tokens));
    }
    _Alignas(64) float out[AMX_TOKENS];
    for (int r = 0; r < AMX_ROWS; r++) {
        _mm512_store_ps(out, acc[r]);
        for (int t = 0; t < nt; t++) y[t * y_stride + r] = out[t];
    }
}

ds4_dot_fn ds4_kernels_amx_dot(uint32_t type) { return type == DS4_TYPE_Q8_0 ? dot_q8_0 : NULL; }
ds4_dotn_fn ds4_kernels_amx_dotn(uint32_t type) { return type == DS4_TYPE_Q8_0 ? dotn_q8_0 : NULL; }
bool ds4_kernels_amx_tile(uint32_t type, struct ds4_tile_kernel *k) {
    if (type != DS4_TYPE_Q8_0) return false;
    *k = (struct ds4_tile_kernel){AMX_ROWS, 1, AMX_TOKENS, q8_0_pack, q8_0_tile};
    return true;
}
