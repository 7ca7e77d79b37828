/* kernels_cpu_amx.c -- the AMX level: Q8_0 x Q8_0 and IQ2_XXS x Q8_K on
 * AMX-INT8 tiles.
 *
 * TDPBSSD multiplies signed bytes by signed bytes and sums each group of K
 * products straight into an int32 of the C tile, so one instruction gives
 * the exact integer sum of a whole Q8_0 block (K = 32) for 16 weight rows
 * x 16 tokens. Those whole-block sums fix the float order of this level
 * (kernels_cpu.h, ds4_vec_dot_q8_0_blockwise): per (row, token) one FMA
 * per block in block order, acc = fma((float)isum_b, d_w[b] * d_a[b], acc).
 * Every Q8_0 path here runs exactly that: the tile (16 rows x 1..16
 * tokens, also the matvec; the last rows of a matrix as a tile of fewer
 * rows), and the dot / multi-token micro-kernel (ds4_vec_dot, and the
 * tokens of a batch too long to pack), which get the same integers from
 * AVX-512 VNNI instead. IQ2_XXS likewise does one FMA per super-block of
 * its exact integer sum (ds4_vec_dot_iq2_xxs_blockwise; its section below).
 * The other types have no AMX kernel and run the AVX-512 ones
 * (kernels_cpu.c falls back).
 *
 * Q8_0 tile registers (palette 1; a layout per number of C columns, loaded by a
 * thread when it changes):
 *   tmm0, tmm1  C: 16 rows x 1, 2, 4 or 16 int32 (the block sums of two
 *               blocks)
 *   tmm2, tmm3  A: 16 weight rows x the 32 quant bytes of one block, loaded
 *               straight from the weight rows (stride = row bytes; the qs
 *               follow each block's f16 scale)
 *   tmm4, tmm5  B: the token group's 32 bytes of that block in the VNNI
 *               layout TDPBSSD wants (8 rows of 4 bytes per token)
 * The 16 rows' f16 block scales come by one masked vector gather per block
 * (the scale tile loaded and stored before cost a quarter of the matvec
 * from L2 and a tenth at 16 tokens: docs/performance.md, "Ideas tried").
 * Two blocks are in flight per step.
 */
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/kernels_cpu_simd.h"
#include "kernels/kernels_cpu_iq2.h"

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

/* gcc 12's tile intrinsics are asm statements that declare no memory
 * operands (_tile_loadconfig only the first 8 of its 64 bytes): a
 * configuration built on the stack lost its stores to dead-store
 * elimination (and LDTILECFG faulted on the zeros), hence static ones; and
 * after the tile stores the compiler is told that memory changed. */
#define TILE_STORES_DONE() __asm__ volatile("" ::: "memory")

/* Layouts by the number of C columns: 16 tokens for the matmul, and 1, 2
 * or 4 for the matvec and small batches, whose C tile then stores as
 * 16 x cols contiguous sums (one to four vector loads, then a permute per
 * token to lanes = rows) instead of 16 lines of which a few lanes are used.
 * B always reads cols columns of 4 * nt bytes a row: nt = 3 runs with 4
 * columns, the fourth reading bytes of the next B row (never used). */
#define LAYOUT(cols)                                                                                         \
    {                                                                                                        \
        .palette = 1, .colsb = {4 * (cols), 4 * (cols), QS_BYTES, QS_BYTES, 4 * (cols), 4 * (cols)},          \
        .rows = {AMX_ROWS, AMX_ROWS, AMX_ROWS, AMX_ROWS, B_ROWS, B_ROWS},                                     \
    }
static const struct tile_config layouts[] = {LAYOUT(1), LAYOUT(2), LAYOUT(4), LAYOUT(AMX_TOKENS)};
enum { Q8_0_ROW_TILES = 0x0F }; /* C and A: the tiles whose rows are weight rows */

INLINE const struct tile_config *layout_for(int cols) {
    return &layouts[cols == 1 ? 0 : cols == 2 ? 1 : cols == 4 ? 2 : 3];
}

/* The tile configuration is per thread and loading it is not free (it
 * also clears the tiles), so each thread loads a layout only when it
 * differs from the one it has. Nothing else in the process uses tiles. */
static _Thread_local const struct tile_config *tiles_loaded;

static void tiles_use(const struct tile_config *layout) {
    if (tiles_loaded == layout) return;
    _tile_loadconfig(layout);
    tiles_loaded = layout;
}

/* The last rows of a matrix (nr < 16): the layout with nr rows in the
 * tiles whose rows are weight rows (bit t of row_tiles: tile t), so no load
 * reads past the matrix. Built in thread storage (the barrier makes its
 * stores happen before LDTILECFG reads it) and loaded for this call only. */
static _Thread_local struct tile_config layout_partial;

static void tiles_use_rows(const struct tile_config *layout, unsigned row_tiles, int nr) {
    if (nr == AMX_ROWS) {
        tiles_use(layout);
        return;
    }
    layout_partial = *layout;
    for (int t = 0; t < 8; t++)
        if (row_tiles >> t & 1) layout_partial.rows[t] = (uint8_t)nr;
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&layout_partial);
    tiles_loaded = NULL;
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
    const bool prefetch = stream_prefetch();
    for (int64_t b = 0; b < n / DS4_QK8_0; b++) {
        if (prefetch) prefetch_weights(x + b);
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

/* Up to 4 tokens (the matvec, small batches), where the packing runs for
 * every few rows and must cost little: the B rows of a block are 8 * nt
 * dwords, dword k of token u at k * nt + u, picked from two token_pair
 * registers by at most two permutes. */
static void pack_few(const ds4_block_q8_0 *const *tk, int nt, int64_t nb, uint8_t *bq, ds4_half *da) {
    _Alignas(64) int32_t pick[2][16];
    __mmask16 keep[2] = {0, 0};
    for (int l = 0; l < 32; l++) {
        const int k = l / nt, u = l % nt; /* token u's dword k; in the pair registers at u/2, half u%2 */
        pick[l / 16][l % 16] = (u / 2) * 16 + (u % 2) * 8 + (k & 7);
        if (k < B_ROWS) keep[l / 16] |= (__mmask16)(1u << (l % 16));
    }
    const __m512i pick0 = _mm512_load_si512(pick[0]), pick1 = _mm512_load_si512(pick[1]);
    for (int64_t b = 0; b < nb; b++) {
        const __m512i p01 = token_pair(tk, nt, 0, b), p23 = token_pair(tk, nt, 2, b);
        int32_t *dst = (int32_t *)(bq + (size_t)b * (size_t)nt * QS_BYTES);
        _mm512_mask_storeu_epi32(dst, keep[0], _mm512_permutex2var_epi32(p01, pick0, p23));
        if (keep[1]) _mm512_mask_storeu_epi32(dst + 16, keep[1], _mm512_permutex2var_epi32(p01, pick1, p23));
        for (int t = 0; t < nt; t++) da[b * nt + t] = tk[t][b].d;
    }
    memset(da + nb * nt, 0, PACK_TAIL);
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
    if (nt <= 4) {
        pack_few(tk, nt, nb, bq, da);
        return true;
    }
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

/* the f16 scales of block `blk` of the present rows, widened (lane = row;
 * 0 for absent rows, which are not read): a gather of the dword at each
 * block start, whose low half is the scale. The offsets fit an int32: a
 * row whose token does not fit the driver's packing buffer (MM_PACK_BYTES)
 * never reaches the tile. */
INLINE __m512 row_scales(const uint8_t *blk, __m512i row_offsets, __mmask16 present) {
    const __m512i words = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), present, row_offsets, blk, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
}

/* acc[r] (lanes = tokens) += the block's C tile, stored at c, times
 * d_w[r] * d_a: the float step of ds4_vec_dot_q8_0_blockwise for 16 rows x
 * 16 token lanes; dw16 holds the 16 rows' scales (row_scales) */
INLINE void float_step_tokens(__m512 acc[AMX_ROWS], const int32_t *c, __m512 dw16, const ds4_half *da,
                              __mmask16 tokens) {
    _Alignas(64) float dwf[AMX_ROWS];
    _mm512_store_ps(dwf, dw16);
    const __m512 da16 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tokens, da));
    UNROLL
    for (int r = 0; r < AMX_ROWS; r++) {
        __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(c + r * AMX_TOKENS));
        acc[r] = _mm512_fmadd_ps(isum, _mm512_mul_ps(_mm512_set1_ps(dwf[r]), da16), acc[r]);
    }
}

/* the same step for nt <= cols <= 4 tokens, lanes = rows: c holds 16 rows
 * x cols sums, row-major; pick[t] gathers token t's column from two
 * registers of them (index l * cols + t mod 32) */
INLINE void float_step_columns(__m512 acc[AMX_ROWS], const int32_t *c, __m512 dw16, const ds4_half *da,
                               int nt, const int cols, const __m512i pick[4]) {
    __m512i sums[4];
    UNROLL
    for (int i = 0; i < cols; i++) sums[i] = _mm512_load_si512(c + AMX_ROWS * i);
    UNROLL
    for (int t = 0; t < cols; t++) {
        if (t >= nt) break;
        __m512i col = sums[0];
        if (cols >= 2) col = _mm512_permutex2var_epi32(sums[0], pick[t], sums[1]);
        if (cols == 4) col = _mm512_mask_blend_epi32(0xFF00, col, _mm512_permutex2var_epi32(sums[2], pick[t], sums[3]));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(col), _mm512_mul_ps(dw16, _mm512_set1_ps(h2f(da[t]))), acc[t]);
    }
}

/* block b into C tile `c` from A tile `a` and B tile `bt` (tile numbers
 * are instruction immediates, hence a macro) */
#define ISSUE_BLOCK(c, a, bt, blk, bsrc)                    \
    do {                                                    \
        _tile_zero(c);                                      \
        _tile_loadd(a, (blk) + sizeof(ds4_half), row_stride); \
        _tile_loadd(bt, bsrc, b_row);                       \
        _tile_dpbssd(c, a, bt);                             \
    } while (0)

/* nr <= 16 rows x nt tokens in a layout of cols >= nt columns; cols is a
 * constant, so each caller gets its float step inlined. Two blocks are in
 * flight per step. */
INLINE void q8_0_tiles(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                       int64_t y_stride, int nr, const int cols) {
    tiles_use_rows(layout_for(cols), Q8_0_ROW_TILES, nr);
    const int64_t nb = n / DS4_QK8_0;
    const uint8_t *bq = packed;
    const ds4_half *da = (const ds4_half *)(bq + (size_t)nb * (size_t)nt * QS_BYTES);
    const size_t b_stride = (size_t)nt * QS_BYTES;
    const long row_stride = (long)row_bytes, b_row = 4L * nt, c_row = 4L * cols;
    const __mmask16 tokens = (__mmask16)((1u << nt) - 1);
    const uint8_t *w0 = w;
    /* A tile reads 16 row streams side by side, each advancing only 68
     * bytes per step: the same block of the next tile's rows, a whole tile
     * ahead, is prefetched into L2 (matvec from DRAM, 1 thread, GB/s: 2 KiB
     * ahead in the same row, as the AVX-512 kernels do, 8.3; 4 KiB 9.1; the
     * next tile 11.2-11.4, against 8.9 for the AVX-512 dot in the same run) */
    const size_t next_tile = AMX_ROWS * row_bytes;
    _Alignas(64) int32_t c0[AMX_ROWS * AMX_TOKENS], c1[AMX_ROWS * AMX_TOKENS];
    const __m512i row_offsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                   _mm512_set1_epi32((int)row_bytes));
    const __mmask16 present = (__mmask16)((1u << nr) - 1);
    if (nr < AMX_ROWS) { /* the lanes of absent rows are computed too, from zeros */
        memset(c0, 0, sizeof c0), memset(c1, 0, sizeof c1);
    }
    __m512 acc[AMX_ROWS]; /* lanes = tokens (cols 16), else acc[t] with lanes = rows */
    UNROLL
    for (int r = 0; r < AMX_ROWS; r++) acc[r] = _mm512_setzero_ps();
    __m512i pick[4];
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int t = 0; t < 4; t++)
        pick[t] = _mm512_and_si512(_mm512_add_epi32(_mm512_mullo_epi32(lane, _mm512_set1_epi32(cols)), _mm512_set1_epi32(t)),
                                   _mm512_set1_epi32(31));
    for (int64_t b = 0; b < nb; b += 2) {
        const uint8_t *blk = w0 + (size_t)b * sizeof(ds4_block_q8_0);
        const bool pair = b + 1 < nb;
        UNROLL
        for (int r = 0; r < AMX_ROWS; r++) _mm_prefetch((const char *)blk + next_tile + (size_t)r * row_bytes, _MM_HINT_T1);
        ISSUE_BLOCK(0, 2, 4, blk, bq + (size_t)b * b_stride);
        if (pair) ISSUE_BLOCK(1, 3, 5, blk + sizeof(ds4_block_q8_0), bq + (size_t)(b + 1) * b_stride);
        const __m512 dw0 = row_scales(blk, row_offsets, present);
        const __m512 dw1 = pair ? row_scales(blk + sizeof(ds4_block_q8_0), row_offsets, present) : dw0;
        _tile_stored(0, c0, c_row);
        if (pair) _tile_stored(1, c1, c_row);
        TILE_STORES_DONE();
        for (int k = 0; k < (pair ? 2 : 1); k++) {
            if (cols == AMX_TOKENS) float_step_tokens(acc, k ? c1 : c0, k ? dw1 : dw0, da + (b + k) * nt, tokens);
            else float_step_columns(acc, k ? c1 : c0, k ? dw1 : dw0, da + (b + k) * nt, nt, cols, pick);
        }
    }
    if (cols < AMX_TOKENS) {
        const __mmask16 rows = (__mmask16)((1u << nr) - 1);
        for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + t * y_stride, rows, acc[t]);
        return;
    }
    _Alignas(64) float out[AMX_TOKENS];
    for (int r = 0; r < nr; r++) {
        _mm512_store_ps(out, acc[r]);
        for (int t = 0; t < nt; t++) y[t * y_stride + r] = out[t];
    }
}

static void q8_0_tile_rows(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                           int64_t y_stride, int nr) {
    if (nt == 1) q8_0_tiles(w, row_bytes, packed, n, 1, y, y_stride, nr, 1);
    else if (nt == 2) q8_0_tiles(w, row_bytes, packed, n, 2, y, y_stride, nr, 2);
    else if (nt <= 4) q8_0_tiles(w, row_bytes, packed, n, nt, y, y_stride, nr, 4);
    else q8_0_tiles(w, row_bytes, packed, n, nt, y, y_stride, nr, AMX_TOKENS);
}

static void q8_0_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                      int64_t y_stride) {
    q8_0_tile_rows(w, row_bytes, packed, n, nt, y, y_stride, AMX_ROWS);
}

/* ---- IQ2_XXS x Q8_K ----
 * The level's order (kernels_cpu.h, ds4_vec_dot_iq2_xxs_blockwise): per
 * (row, token) one FMA per super-block of its exact integer sum. The dot
 * and the multi-token micro-kernel are the AVX-512 ones (kernels_cpu_iq2.h)
 * with that float step. */
IQ2_DOT_ENTRY_POINTS(true)

/* The tile: 16 rows x 3..16 tokens (with VBMI, which every AMX CPU has).
 * A super-block's integer is sum_s scale_s x sum(w x a) with scale_s =
 * 2 * (4-bit) + 1 and |w| in {8, 25, 43}: scale x w (up to 1333) is not a
 * byte, so each is split as 64 hi + lo, hi in 0..21, lo in -32..31 (both
 * with w's sign), and TDPBSSD sums hi x a and lo x a over the whole
 * super-block (four K = 64 steps each) into two C tiles; 64 C_hi + C_lo is
 * then exactly the super-block's integer (|64 C_hi| < 2^26). hi and lo come
 * from 64-entry byte tables indexed by (scale, grid code): the VBMI decode
 * gives the 2-bit codes (kernels_cpu_iq2.h), one vpermb per table and 64
 * elements, the signs by the opmask as in the AVX-512 kernels. The float
 * step is one convert, one d_w x d_a and one FMA per row and 16 tokens.
 *
 * Tile registers (one layout, all 16 rows x 64 bytes):
 *   tmm0, tmm1  C: 16 rows x 16 tokens, the hi and lo sums
 *   tmm2, tmm3  A: hi and lo bytes of 16 rows x 64 elements (even K step)
 *   tmm4        B: the token group's 64 elements in the VNNI layout
 *   tmm5..7     the same for the odd K step
 */
enum {
    IQ2_STEP = 64,                        /* K bytes of one TDPBSSD */
    IQ2_STEPS = DS4_QK_K / IQ2_STEP,      /* per super-block */
    IQ2_ROW_TILES = 0x6F,                 /* C and A: every tile but the two B */
    IQ2_MIN_TOKENS = 3,                   /* fewer run the per-row kernels (faster at 2, measured) */
};
static const struct tile_config iq2_layout = {
    .palette = 1,
    .colsb = {IQ2_STEP, IQ2_STEP, IQ2_STEP, IQ2_STEP, IQ2_STEP, IQ2_STEP, IQ2_STEP, IQ2_STEP},
    .rows = {AMX_ROWS, AMX_ROWS, AMX_ROWS, AMX_ROWS, IQ2_STEP / 4, AMX_ROWS, AMX_ROWS, IQ2_STEP / 4},
};

/* hi and lo of scale x magnitude, entry 4 * (4-bit scale) + code */
static struct {
    _Alignas(64) int8_t hi[64];
    _Alignas(64) int8_t lo[64];
} iq2_split;
static pthread_once_t iq2_split_once = PTHREAD_ONCE_INIT;

static void iq2_split_init(void) {
    int magnitude[4] = {0}; /* by code, read back through the decode's own tables */
    for (int row = 0; row < 256; row++)
        for (int j = 0; j < 8; j++) {
            const int code = ((j % 2 ? ds4_iq2_codes.code_odd[row] >> (j - 1) : ds4_iq2_codes.code_even[row] >> j)) & 3;
            magnitude[code] = (int)(ds4_iq2xxs_grid[row] >> (8 * j) & 0xFF);
        }
    for (int scale = 0; scale < 16; scale++)
        for (int code = 0; code < 4; code++) {
            const int v = (2 * scale + 1) * magnitude[code], hi = (v + 32) >> 6;
            iq2_split.hi[4 * scale + code] = (int8_t)hi;
            iq2_split.lo[4 * scale + code] = (int8_t)(v - 64 * hi);
        }
}

/* packed, for nt tokens: per super-block i and K step c, 16 B rows of
 * 4 * nt bytes (token t's elements 64c + 4k..4k + 3 at row k, byte 4t);
 * after all of them the activation scales d[i * nt + t]; then PACK_TAIL
 * zero bytes. A B tile reads 16 tokens' columns with row stride 4 * nt, so
 * columns nt..15 hold bytes of other rows: those C columns are never read.
 * Packing runs once per token group and matrix, so it is plain. */
static bool iq2_xxs_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes) {
    const int64_t nb = n / DS4_QK_K;
    const size_t b_bytes = (size_t)nb * (size_t)nt * DS4_QK_K;
    if (b_bytes + (size_t)nb * (size_t)nt * sizeof(float) + PACK_TAIL > packed_bytes) return false;
    int32_t *bq = packed;
    float *da = (float *)((uint8_t *)packed + b_bytes);
    for (int64_t i = 0; i < nb; i++)
        for (int t = 0; t < nt; t++) {
            const ds4_block_q8_K *y = (const ds4_block_q8_K *)tok(acts, stride, t) + i;
            for (int k = 0; k < DS4_QK_K / 4; k++) memcpy(&bq[((size_t)i * DS4_QK_K / 4 + (size_t)k) * (size_t)nt + (size_t)t], y->qs + 4 * k, 4);
            da[i * nt + t] = y->d;
        }
    memset(da + nb * nt, 0, PACK_TAIL);
    return true;
}

/* one super-block of one row as hi and lo bytes (256 each) for the A tiles */
VBMI static inline void iq2_split_row(const ds4_block_iq2_xxs *x, __m512i codes, int8_t *hi, int8_t *lo) {
    const uint8_t *q = (const uint8_t *)x->qs;
    _Alignas(32) uint8_t sign_bytes[32];
    struct iq2_decoded d = {.sign_bytes = sign_bytes};
    iq2_decode(q, true, codes, &d);
    /* every byte of qword s: bits 58..63, 0, 1 of it, so bits 2..5 hold
     * sub-block s's 4-bit scale (bits 60..63) */
    const __m512i scale_bits = _mm512_multishift_epi64_epi8(_mm512_set1_epi8(58), _mm512_loadu_si512(q));
    const __m512i hi_table = _mm512_load_si512(iq2_split.hi), lo_table = _mm512_load_si512(iq2_split.lo);
    UNROLL
    for (int p = 0; p < 4; p++) {
        const int a = 2 * p, b = 2 * p + 1;
        const __m512i scales = _mm512_permutexvar_epi64(_mm512_setr_epi64(a, a, a, a, b, b, b, b), scale_bits);
        /* bits 0, 1 from the codes, the rest from the scales (vpermb reads bits 0..5) */
        const __m512i idx = _mm512_ternarylogic_epi64(iq2_code_bits_vbmi(&d, p), scales, _mm512_set1_epi8(3), 0xE4);
        const __mmask64 neg = iq2_neg(&d, true, p);
        const __m512i h = _mm512_permutexvar_epi8(idx, hi_table), l = _mm512_permutexvar_epi8(idx, lo_table);
        _mm512_store_si512(hi + IQ2_STEP * p, _mm512_mask_sub_epi8(h, neg, _mm512_setzero_si512(), h));
        _mm512_store_si512(lo + IQ2_STEP * p, _mm512_mask_sub_epi8(l, neg, _mm512_setzero_si512(), l));
    }
}

/* K step c of the super-block into the C tiles, from A tiles ah, al and B
 * tile bt (instruction immediates, hence a macro) */
#define IQ2_STEP_TILES(ah, al, bt, c)                                             \
    do {                                                                         \
        _tile_loadd(ah, split_hi[0] + IQ2_STEP * (c), DS4_QK_K);                 \
        _tile_loadd(al, split_lo[0] + IQ2_STEP * (c), DS4_QK_K);                 \
        _tile_loadd(bt, bq + ((size_t)i * IQ2_STEPS + (c)) * b_step, b_row);     \
        _tile_dpbssd(0, ah, bt);                                                 \
        _tile_dpbssd(1, al, bt);                                                 \
    } while (0)

VBMI static void iq2_xxs_tile_rows(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                                   int64_t y_stride, int nr) {
    tiles_use_rows(&iq2_layout, IQ2_ROW_TILES, nr);
    const int64_t nb = n / DS4_QK_K;
    const uint8_t *bq = packed;
    const float *da = (const float *)(bq + (size_t)nb * (size_t)nt * DS4_QK_K);
    const size_t b_step = (size_t)nt * IQ2_STEP, next_tile = AMX_ROWS * row_bytes;
    const long b_row = 4L * nt;
    const __mmask16 tokens = (__mmask16)((1u << nt) - 1);
    _Alignas(64) int8_t split_hi[AMX_ROWS][DS4_QK_K], split_lo[AMX_ROWS][DS4_QK_K];
    _Alignas(64) int32_t c_hi[AMX_ROWS * AMX_TOKENS], c_lo[AMX_ROWS * AMX_TOKENS];
    if (nr < AMX_ROWS) { /* the lanes of absent rows are computed too, from zeros */
        memset(c_hi, 0, sizeof c_hi), memset(c_lo, 0, sizeof c_lo);
    }
    float dx[AMX_ROWS] = {0};
    __m512 acc[AMX_ROWS]; /* lanes = tokens */
    UNROLL
    for (int r = 0; r < AMX_ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        for (int r = 0; r < nr; r += 2) {
            const int r1 = r + 1 < nr ? r + 1 : r; /* an odd last row is decoded twice */
            const ds4_block_iq2_xxs *x0 = (const ds4_block_iq2_xxs *)((const uint8_t *)w + (size_t)r * row_bytes) + i;
            const ds4_block_iq2_xxs *x1 = (const ds4_block_iq2_xxs *)((const uint8_t *)w + (size_t)r1 * row_bytes) + i;
            /* the same super-block of the next tile's rows, a whole tile
             * ahead (16 row streams side by side advance 66 bytes a step) */
            _mm_prefetch((const char *)x0 + next_tile, _MM_HINT_T1);
            _mm_prefetch((const char *)x1 + next_tile, _MM_HINT_T1);
            __m512i codes[2];
            iq2_lookup_codes((const uint8_t *)x0->qs, (const uint8_t *)x1->qs, codes);
            iq2_split_row(x0, codes[0], split_hi[r], split_lo[r]);
            iq2_split_row(x1, codes[1], split_hi[r1], split_lo[r1]);
            dx[r] = iq2_dx(x0);
            dx[r1] = iq2_dx(x1);
        }
        _tile_zero(0);
        _tile_zero(1);
        IQ2_STEP_TILES(2, 3, 4, 0);
        IQ2_STEP_TILES(5, 6, 7, 1);
        IQ2_STEP_TILES(2, 3, 4, 2);
        IQ2_STEP_TILES(5, 6, 7, 3);
        _tile_stored(0, c_hi, AMX_TOKENS * 4);
        _tile_stored(1, c_lo, AMX_TOKENS * 4);
        TILE_STORES_DONE();
        const __m512 da16 = _mm512_maskz_loadu_ps(tokens, da + i * nt);
        UNROLL
        for (int r = 0; r < AMX_ROWS; r++) {
            const __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c_hi + r * AMX_TOKENS), 6),
                                                  _mm512_load_si512(c_lo + r * AMX_TOKENS));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(_mm512_set1_ps(dx[r]), da16), acc[r]);
        }
    }
    _Alignas(64) float out[AMX_TOKENS];
    for (int r = 0; r < nr; r++) {
        _mm512_store_ps(out, acc[r]);
        for (int t = 0; t < nt; t++) y[t * y_stride + r] = out[t];
    }
}

VBMI static void iq2_xxs_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                              int64_t y_stride) {
    iq2_xxs_tile_rows(w, row_bytes, packed, n, nt, y, y_stride, AMX_ROWS);
}

/* the IQ2_XXS tile needs the VBMI decode (every AMX CPU has it); where it
 * is off, matmul runs the level's per-row kernels, which give the same bits */
static bool iq2_tile_ready(void) {
    if (!ds4_kernels_iq2_vbmi()) return false;
    pthread_once(&iq2_split_once, iq2_split_init);
    return true;
}

struct ds4_dot_kernels ds4_kernels_amx_dots(uint32_t type) {
    switch (type) {
    case DS4_TYPE_Q8_0: return DOT_KERNELS(q8_0);
    case DS4_TYPE_IQ2_XXS: return ds4_kernels_iq2_vbmi() ? DOT_KERNELS(iq2_xxs_vbmi) : DOT_KERNELS(iq2_xxs);
    default: return (struct ds4_dot_kernels){0};
    }
}
bool ds4_kernels_amx_tile(uint32_t type, struct ds4_tile_kernel *k) {
    if (type == DS4_TYPE_Q8_0) {
        *k = (struct ds4_tile_kernel){AMX_ROWS, 1, AMX_TOKENS, q8_0_pack, q8_0_tile, NULL};
        return true;
    }
    if (type == DS4_TYPE_IQ2_XXS && iq2_tile_ready()) {
        *k = (struct ds4_tile_kernel){AMX_ROWS, IQ2_MIN_TOKENS, AMX_TOKENS, iq2_xxs_pack, iq2_xxs_tile, NULL};
        return true;
    }
    return false;
}
ds4_tile_rows_fn ds4_kernels_amx_tile_rows(uint32_t type) {
    if (type == DS4_TYPE_Q8_0) return q8_0_tile_rows;
    return type == DS4_TYPE_IQ2_XXS && iq2_tile_ready() ? iq2_xxs_tile_rows : NULL;
}
