/* kernels_cpu_avx512.c -- AVX-512 (F, BW, DQ, VL) + VNNI dot products.
 *
 * Only the formats where 512-bit registers and VNNI change the inner loop
 * are here: the float types, Q8_0 (two blocks per register), IQ2_XXS (two
 * sub-blocks per register, signs applied through a 64-bit opmask instead
 * of being expanded into bytes, grids decoded by byte permutes where the
 * CPU has VBMI and GFNI, else gathered) and Q2_K (the routed experts' down
 * projections). The other K-quants return NULL and run the AVX2 kernels.
 *
 * vpdpbusd multiplies u8 by s8 and sums groups of four straight into i32,
 * so unlike maddubs there is no i16 intermediate to saturate (Q8_0 needs
 * that). The IQ2_XXS kernels multiply by a sub-block scale anyway, which
 * vpdpwssd does on 16-bit words: there vpmaddubsw (pairs of products, far
 * from saturating) feeds it directly, which lets the tile below fold the
 * unsigned-activation offset into a per-row start value.
 *
 * As in the AVX2 file, each kernel is written once for NT tokens: NT = 1
 * is the dot, NT = 1..DS4_DOT_TOKENS the matmul micro-kernel, with the same
 * per-token arithmetic so all give identical results. Q8_0, IQ2_XXS and
 * Q2_K also have matmul tiles (rows x tokens, packed tokens) with the same
 * integer sums and float order.
 */
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/kernels_cpu.h"
#include "kernels/kernels_cpu_simd.h"
#include "kernels/kernels_cpu_iq2.h"

/* ---- float weights against f32 activations ---- */

INLINE __m512 load16(enum float_kind k, const void *p, int64_t i, __mmask16 m) {
    switch (k) {
    case KIND_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
    case KIND_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i)), 16));
    default: return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    }
}

/* the lanes of the 16 elements from i that lie before end */
INLINE __mmask16 lanes_before(int64_t i, int64_t end) {
    return end - i >= 16 ? 0xFFFF : (__mmask16)((1u << (end - i)) - 1);
}

/* a (row, token)'s result from its two chains */
INLINE float chains_sum(__m512 chain0, __m512 chain1) { return _mm512_reduce_add_ps(_mm512_add_ps(chain0, chain1)); }

/* two FMA chains per token; masked loads handle the tail; the row's lines
 * are prefetched as it goes where stream_prefetch() says so */
INLINE void float_nt(enum float_kind k, const void *w, const void *acts, size_t stride, int64_t n, int nt,
                     float *out) {
    __m512 acc[NT_MAX][2];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    const bool prefetch = stream_prefetch();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        if (prefetch) prefetch_float_lines(k, w, i, 32);
        __m512 w0 = load16(k, w, i, 0xFFFF), w1 = load16(k, w, i + 16, 0xFFFF);
        UNROLL
        for (int t = 0; t < nt; t++) {
            const float *a = tok(acts, stride, t);
            acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(a + i), acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(a + i + 16), acc[t][1]);
        }
    }
    for (; i < n; i += 16) {
        __mmask16 m = lanes_before(i, n);
        __m512 w0 = load16(k, w, i, m);
        UNROLL
        for (int t = 0; t < nt; t++)
            acc[t][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, (const float *)tok(acts, stride, t) + i),
                                        acc[t][0]);
    }
    UNROLL
    for (int t = 0; t < nt; t++) out[t] = chains_sum(acc[t][0], acc[t][1]);
}

FLOAT_KERNELS

/* the float tile's primitives (kernels_cpu_float_tile.h): 6 rows x 4
 * tokens in 24 accumulators, 6 weight vectors and one activation vector;
 * the last elements are a masked vector, as in float_nt */
typedef __m512 ft_vec;
enum { FT_LANES = 16, FT_ROWS = 12, FT_SUB_ROWS = 6 };
INLINE ft_vec ft_zero(void) { return _mm512_setzero_ps(); }
INLINE ft_vec ft_weights(enum float_kind k, const void *row, int64_t i, int64_t end) {
    return load16(k, row, i, lanes_before(i, end));
}
INLINE ft_vec ft_acts(const float *a, int64_t i, int64_t end) { return _mm512_maskz_loadu_ps(lanes_before(i, end), a + i); }
INLINE ft_vec ft_fma(ft_vec w, ft_vec a, ft_vec acc) { return _mm512_fmadd_ps(w, a, acc); }
INLINE int64_t ft_tail_end(int64_t n) { return n; }
INLINE float ft_result(enum float_kind k, const void *w, const float *a, int64_t n, ft_vec chain0, ft_vec chain1) {
    return chains_sum(chain0, chain1);
}
#include "kernels/kernels_cpu_float_tile.h"

/* ---- Q8_0 x Q8_0 ----
 * Every Q8_0 product here -- the dot (1 row x 1 token), the multi-token
 * micro-kernel (1 x nt) and the matmul tile (Q8_TILE_ROWS x
 * Q8_TILE_TOKENS) -- is q8_0_rt, so a (row, token) result is the same bit
 * for bit whichever of them computes it. The float order per (row, token):
 * - The blocks go in quads (4q .. 4q + 3): one 16-lane vector holds the
 *   first halves (elements 0..15) of the four blocks, another their second
 *   halves, so lanes 4i..4i+3 belong to block 4q + i. Lane 4i + j holds the
 *   exact integer sum of that block's products 4j..4j+3 and 16+4j..16+4j+3,
 *   converted to float and added by one FMA with d_w * d_a (exact: two
 *   widened f16) into one 16-lane accumulator, quad after quad. The blocks
 *   a last quad lacks are weighted 0 (their lanes repeat its last block).
 *   The result is _mm512_reduce_add_ps of the accumulator.
 * - vpdpbusd wants one operand unsigned: the weights are made so by w + 128
 *   (xor 0x80), and 128 x the sum of the activations, which depends on the
 *   token alone, is subtracted back through the accumulator operand. The
 *   sums are exact for every byte (no saturation, |sum| < 2^19).
 * Per (row, token) and quad: two vpdpbusd, a conversion, a multiply and an
 * FMA; with two blocks per vector the float steps were twice as many.
 * The tile reads its tokens' quads, scales and starts from a buffer packed
 * once per token group (q8_0_pack), the others compute them in place; both
 * come from q8_0_quad and q8_0_start, so the values are the same. */

/* a quad of a row or an activation */
struct q8_quad {
    __m512i lo, hi; /* elements 0..15 of its four blocks, elements 16..31 */
    __m512 d;       /* the block scales, each in its four lanes (0 where a block is missing) */
};

INLINE __m512i quad_halves(const ds4_block_q8_0 *q, int i1, int i2, int i3, int offset) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(q[0].qs + offset)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(q[i1].qs + offset)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(q[i2].qs + offset)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(q[i3].qs + offset)), 3);
}

/* the quad of m (1..4) blocks at q. The four f16 scales (a missing
 * block's is 0) are read as integers into one 64-bit word, converted by a
 * 128-bit vcvtph2ps and spread to their lanes by one permute. (Two 64-byte
 * loads, a two-source word permute and a 512-bit conversion before: the
 * per-row kernel from L2, one thread, Zen 4, 33.8 -> 39.5 GB/s; the
 * four-row tile unchanged.) */
INLINE struct q8_quad q8_0_quad(const ds4_block_q8_0 *q, int m) {
    const int i1 = m > 1 ? 1 : 0, i2 = m > 2 ? 2 : i1, i3 = m > 3 ? 3 : i2;
    struct q8_quad v;
    v.lo = quad_halves(q, i1, i2, i3, 0);
    v.hi = quad_halves(q, i1, i2, i3, 16);
    uint64_t scales = 0;
    for (int k = 0; k < m; k++) {
        uint16_t d;
        memcpy(&d, &q[k].d, sizeof d);
        scales |= (uint64_t)d << (16 * k);
    }
    v.d = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)scales))));
    return v;
}

/* -128 x the sum of a quad's four activations per lane */
INLINE __m512i q8_0_start(const struct q8_quad *a) {
    const __m512i u128 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    return _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, u128, a->lo), u128, a->hi));
}

/* packed tile activations: per quad, nt slots (the group's tokens) of the
 * two halves, the 16 scale floats and the start */
enum { Q8_SLOT_BYTES = 256, Q8_TILE_ROWS = 4, Q8_TILE_TOKENS = 8 };

INLINE const uint8_t *q8_0_slot(const void *packed, int64_t b, int nt, int t) {
    return (const uint8_t *)packed + ((size_t)(b / 4) * (size_t)nt + (size_t)t) * Q8_SLOT_BYTES;
}

static bool q8_0_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes) {
    const int64_t nb = n / DS4_QK8_0;
    if ((size_t)((nb + 3) / 4) * (size_t)nt * Q8_SLOT_BYTES > packed_bytes) return false;
    for (int64_t b = 0; b < nb; b += 4)
        for (int t = 0; t < nt; t++) {
            uint8_t *s = (uint8_t *)q8_0_slot(packed, b, nt, t);
            const ds4_block_q8_0 *y = (const ds4_block_q8_0 *)tok(acts, stride, t) + b;
            const struct q8_quad a = q8_0_quad(y, nb - b < 4 ? (int)(nb - b) : 4);
            _mm512_store_si512(s, a.lo);
            _mm512_store_si512(s + 64, a.hi);
            _mm512_store_ps(s + 128, a.d);
            _mm512_store_si512(s + 192, q8_0_start(&a));
        }
    return true;
}

enum { TILE_ROWS_MAX = Q8_TILE_ROWS, TILE_TOKENS_MAX = Q8_TILE_TOKENS > NT_MAX ? Q8_TILE_TOKENS : NT_MAX };

/* How far ahead a tile asks for its own rows' lines: it streams up to
 * Q8_TILE_ROWS rows at once, so half of a single stream's distance keeps
 * the bytes in flight per thread near a single-row kernel's. On a 2-core
 * AMD EPYC (Zen 4) VM, Q8_0 matvec from DRAM at one thread went from
 * 20.7-22.2 to 23.1-25.1 GB/s and decode from 11.6-12.2 to 12.4-12.9 t/s;
 * on the 2-core Xeon VM 1 KiB measured within noise of 2 KiB. */
#define Q8_TILE_AHEAD (DS4_PREFETCH_AHEAD / 2)

/* the quad at block b (m blocks) of nr rows x nt tokens into the
 * accumulators; the tokens come packed (slots per quad) or as activation
 * rows; prefetch: stream_prefetch() */
INLINE void q8_0_quad_step(const void *w, size_t row_bytes, int nr, const void *acts, size_t stride,
                           const uint8_t *packed, int slots, int nt, int64_t b, int m, bool prefetch,
                           __m512 acc[TILE_ROWS_MAX][TILE_TOKENS_MAX]) {
    const __m512i u128 = _mm512_set1_epi8((char)0x80);
    __m512i wlo[TILE_ROWS_MAX], whi[TILE_ROWS_MAX];
    __m512 dw[TILE_ROWS_MAX];
    UNROLL
    for (int r = 0; r < nr; r++) {
        const ds4_block_q8_0 *x = (const ds4_block_q8_0 *)((const uint8_t *)w + row_bytes * (size_t)r) + b;
        /* Rows read side by side are several streams, which the hardware
         * prefetchers follow worse than one: a tile asks for each row's
         * lines Q8_TILE_AHEAD on, and for the same bytes of the rows two
         * tiles on (into L2), whose line prefetch would otherwise start
         * late at every tile (the next tile's rows: 3, 4 and 8 tokens,
         * 32768 x 4096 at one thread, AMD EPYC: 8.4 -> 5.9, 8.5 -> 5.7,
         * 12.2 -> 10.5 ms; two tiles on instead of one, Q8_0 matvec from
         * DRAM at one thread, Zen 4: 23.3-23.7 -> 25.1-25.3 GB/s, three on
         * 23.9-24.1). A lone row asks for its own lines only where
         * stream_prefetch() says so. */
        if (nr > 1) {
            const size_t ahead = row_bytes * (size_t)(2 * nr);
            _mm_prefetch((const char *)x + ahead, _MM_HINT_T1);
            _mm_prefetch((const char *)(x + 2) + ahead, _MM_HINT_T1);
        }
        if (nr > 1 || prefetch) {
            _mm_prefetch((const char *)x + Q8_TILE_AHEAD, _MM_HINT_T0);
            _mm_prefetch((const char *)(x + 2) + Q8_TILE_AHEAD, _MM_HINT_T0);
        }
        const struct q8_quad v = q8_0_quad(x, m);
        wlo[r] = _mm512_xor_si512(v.lo, u128);
        whi[r] = _mm512_xor_si512(v.hi, u128);
        dw[r] = v.d;
    }
    UNROLL
    for (int t = 0; t < nt; t++) {
        struct q8_quad a;
        __m512i start;
        if (packed) {
            const uint8_t *s = q8_0_slot(packed, b, slots, t);
            a.lo = _mm512_load_si512(s);
            a.hi = _mm512_load_si512(s + 64);
            a.d = _mm512_load_ps(s + 128);
            start = _mm512_load_si512(s + 192);
        } else {
            a = q8_0_quad((const ds4_block_q8_0 *)tok(acts, stride, t) + b, m);
            start = q8_0_start(&a);
        }
        UNROLL
        for (int r = 0; r < nr; r++) {
            const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(start, wlo[r], a.lo), whi[r], a.hi);
            acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], a.d), acc[r][t]);
        }
    }
}

/* y[t * y_stride + r] for nr rows (row_bytes apart) x nt tokens; the tokens
 * come packed (the first nt of a group of `slots`, nt <= slots <=
 * Q8_TILE_TOKENS) or as activation rows */
INLINE void q8_0_rt(const void *w, size_t row_bytes, int nr, const void *acts, size_t stride, const uint8_t *packed,
                    int slots, int nt, int64_t n, float *y, int64_t y_stride) {
    const int64_t nb = n / DS4_QK8_0;
    __m512 acc[TILE_ROWS_MAX][TILE_TOKENS_MAX];
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL
        for (int t = 0; t < nt; t++) acc[r][t] = _mm512_setzero_ps();
    const bool prefetch = stream_prefetch();
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) q8_0_quad_step(w, row_bytes, nr, acts, stride, packed, slots, nt, b, 4, prefetch, acc);
    if (b < nb) q8_0_quad_step(w, row_bytes, nr, acts, stride, packed, slots, nt, b, (int)(nb - b), prefetch, acc);
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL
        for (int t = 0; t < nt; t++) y[t * y_stride + r] = _mm512_reduce_add_ps(acc[r][t]);
}

INLINE void q8_0_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    q8_0_rt(w, 0, 1, acts, stride, NULL, 0, nt, n, out, 1);
}
DOT_ENTRY_POINTS(q8_0)

/* Every group takes the tile, down to one token (a matvec): the per-row
 * kernel assembles each token's activation quads and start again for every
 * row, which the tile packs once per group. One thread, the Xeon VM: one
 * token from L2 (256 rows of 4096) 22.6-23.4 -> 34.8-35.6 GB/s, from memory
 * (1.1 GB) 13.8-14.0 -> 14.5-15.1; two tokens over 32768 x 4096 11.0-11.5
 * -> 7.4-8.6 ms, a speculative pass of two tokens over the whole model
 * 80-82 -> 74 ms.
 * Where the kernels leave one row's stream to the hardware prefetchers
 * (ds4_kernels_stream_prefetch() false: AMD), one token reads the tile's
 * rows one after another, not side by side: a matvec is then a single
 * sequential stream, which such a core reads faster than four interleaved
 * ones (a plain read loop at one thread, Zen 4: 27-29 against 21-23 GB/s
 * for four rows in lockstep). Q8_0 matvec from DRAM, one thread, Zen 4,
 * with the scale read above: 21.4-23.9 -> 23.1-24.7 GB/s, two threads
 * 29.5-31.5 -> 31.6-33.1.
 * Groups of 5..8 tokens whose rows are in cache run as two passes of 2 rows
 * x nt (16 accumulators of the 32 registers): a row's quad, assembled once,
 * serves 8 tokens. Where the rows come from memory (the first token group
 * of a block, and so every group of a batched decode step), they run as
 * two passes over the four rows instead, the first four tokens then the
 * rest, which find the rows in L1: four streams in flight rather than two,
 * and a quarter of the packed-activation reads per row (a token's slots are
 * re-read for every row pair). 1 GiB from DRAM as 8192 x 4096 matrices,
 * one thread, Zen 4, against the cached arrangement: 5 tokens 91-98 ->
 * 130-135 GFLOP/s, 8 114-128 -> 161-162, 16 140-148 -> 164-168; eight
 * sessions at two threads 47.3-47.4 -> 51.3-51.6 t/s. From cache the 2 x 8
 * passes stay ahead: the four-row passes for every group slowed prefill 512
 * by 2-3% (54.3-55.3 -> 52.5-53.8 t/s). */

/* 1..4 tokens (the first nt of a packed group of `slots`) over the four rows */
INLINE void q8_0_rows4(const void *w, size_t row_bytes, const uint8_t *packed, int slots, int nt, int64_t n, float *y,
                       int64_t y_stride) {
    switch (nt) {
    case 1:
        if (stream_prefetch()) {
            q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, slots, 1, n, y, y_stride);
            break;
        }
        for (int r = 0; r < Q8_TILE_ROWS; r++)
            q8_0_rt((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, 1, NULL, 0, packed, slots, 1, n, y + r,
                    y_stride);
        break;
    case 2: q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, slots, 2, n, y, y_stride); break;
    case 3: q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, slots, 3, n, y, y_stride); break;
    default: q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, slots, 4, n, y, y_stride); break;
    }
}

static void q8_0_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                      int64_t y_stride) {
    const uint8_t *w2 = (const uint8_t *)w + 2 * row_bytes;
    switch (nt) {
#define HALVES(k) q8_0_rt(w, row_bytes, 2, NULL, 0, packed, k, k, n, y, y_stride); \
                  q8_0_rt(w2, row_bytes, 2, NULL, 0, packed, k, k, n, y + 2, y_stride)
    case 5: HALVES(5); break;
    case 6: HALVES(6); break;
    case 7: HALVES(7); break;
    case 8: HALVES(8); break;
#undef HALVES
    default: q8_0_rows4(w, row_bytes, packed, nt, nt, n, y, y_stride); break;
    }
}

static void q8_0_tile_from_memory(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                                  int64_t y_stride) {
    q8_0_rows4(w, row_bytes, packed, nt, nt < 4 ? nt : 4, n, y, y_stride);
    if (nt > 4)
        q8_0_rows4(w, row_bytes, (const uint8_t *)packed + 4 * Q8_SLOT_BYTES, nt, nt - 4, n, y + 4 * y_stride,
                   y_stride);
}

/* ---- IQ2_XXS x Q8_K: the decode and the per-row kernel are in
 * kernels_cpu_iq2.h ---- */

/* the code tables of the VBMI decode */
struct ds4_iq2_codes ds4_iq2_codes;
static pthread_once_t iq2_codes_once = PTHREAD_ONCE_INIT;

/* The three magnitudes in increasing order get codes 0, 1, 2. Code 3 never
 * occurs, so magnitude = m0 ^ (bit 0 ? m1 ^ m0 : 0) ^ (bit 1 ? m2 ^ m0 : 0)
 * is exact for every code: an affine map over GF(2), one vgf2p8affineqb.
 * Its output bit i is the parity of (matrix byte 7 - i) & input. */
static void iq2_codes_init(void) {
    uint8_t value[4] = {0};
    int count = 0;
    bool three = true;
    for (int k = 0; k < 256 * 8; k++) {
        uint8_t m = (uint8_t)(ds4_iq2xxs_grid[k / 8] >> (8 * (k % 8)));
        int v = 0;
        while (v < count && value[v] != m) v++;
        if (v == count) {
            if (count == 3) three = false;
            else value[count++] = m;
        }
    }
    for (int i = 1; i < count; i++) /* three values: insertion sort */
        for (int j = i; j > 0 && value[j - 1] > value[j]; j--) {
            uint8_t t = value[j];
            value[j] = value[j - 1];
            value[j - 1] = t;
        }
    ds4_iq2_codes.ok = three && count == 3 && value[0] == IQ2_MAGNITUDE0;
    ds4_iq2_codes.map = 0;
    for (int i = 0; i < 8; i++) {
        uint64_t row = (uint64_t)(((value[1] ^ value[0]) >> i & 1) | ((value[2] ^ value[0]) >> i & 1) << 1);
        ds4_iq2_codes.map |= row << (8 * (7 - i));
    }
    for (int row = 0; row < 256; row++) {
        unsigned even = 0, odd = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t m = (uint8_t)(ds4_iq2xxs_grid[row] >> (8 * j));
            unsigned code = 0;
            while (code < 3 && value[code] != m) code++;
            if (j % 2) odd |= code << (j - 1);
            else even |= code << j;
        }
        ds4_iq2_codes.code_even[row] = (uint8_t)even;
        ds4_iq2_codes.code_odd[row] = (uint8_t)odd;
    }
}

bool ds4_kernels_iq2_vbmi(void) {
    if (!ds4_kernels_vbmi()) return false;
    pthread_once(&iq2_codes_once, iq2_codes_init);
    return ds4_iq2_codes.ok;
}

IQ2_DOT_ENTRY_POINTS(false)

/* The IQ2_XXS tile: IQ2_TILE_ROWS rows x 2..IQ2_TILE_TOKENS tokens (a lone
 * token is faster through the dot, measured), each super-block of a row
 * decoded once for the whole token group (grid gathers, sign masks and
 * scales cost more than a token's arithmetic).
 * The signs go onto the weights (signed bytes, |w| <= 43) instead of every
 * token's activations, which are packed as a + 128 (unsigned), so per token
 * and sub-block pair one vpmaddubsw gives words (a0 + 128) w0 + (a1 + 128)
 * w1, at most 2 * 255 * 43 < 2^15 (no saturation), and the vpdpwssd of
 * iq2_xxs_nt adds each lane's two words times the scale: the lane gets
 * scale * (sum of its four w * a) plus scale * 128 * (sum of its four w).
 * That second part depends on the row alone; it is subtracted by starting
 * each token's sum from `corr`. Every lane then holds exactly iq2_xxs_nt's
 * integer, and the float step is the same, so every (row, token) equals the
 * dot bit for bit: one vpmaddubsw and one vpdpwssd per (row, token, 64
 * elements), no sign operation and no accumulator copy. */
enum { IQ2_TILE_ROWS = 2, IQ2_TILE_TOKENS = 16 };
/* Below 5 tokens the single-row kernels, which decode a row once for all
 * its tokens and put the signs on the activations, beat the VBMI tile,
 * whose signed weights and offset sums cost about a token's products per
 * row (512 x 4096, one thread, Zen 4: 99 against 118 us at 2 tokens, 123
 * against 141 at 3, 148 against 164 at 4, 230 against 189 at 5). The
 * gather tile keeps 2, measured on the Xeon VM. */
enum { IQ2_VBMI_TILE_MIN_TOKENS = 5 };

/* packed: per super-block, per token, its 256 bytes a + 128; after all
 * super-blocks the activation scales, d[super-block][token] */
static bool iq2_xxs_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes) {
    int64_t nb = n / DS4_QK_K;
    if ((size_t)nb * (size_t)nt * (DS4_QK_K + sizeof(float)) > packed_bytes) return false;
    uint8_t *p = packed;
    float *d = (float *)(p + (size_t)nb * (size_t)nt * DS4_QK_K);
    for (int64_t i = 0; i < nb; i++)
        for (int t = 0; t < nt; t++, p += DS4_QK_K) {
            const ds4_block_q8_K *y = (const ds4_block_q8_K *)tok(acts, stride, t) + i;
            for (int k = 0; k < DS4_QK_K; k += 64)
                _mm512_store_si512(p + k, _mm512_xor_si512(_mm512_loadu_si512(y->qs + k), _mm512_set1_epi8((char)0x80)));
            d[i * nt + t] = y->d;
        }
    return true;
}

/* one super-block of a row, signed, per sub-block pair */
struct iq2_signed {
    __m512i w[4], scale[4];
    __m512i corr;   /* -scale * 128 * (sum of the lane's four w), over the pairs */
    float dx;
};

INLINE void iq2_decode_signed(const ds4_block_iq2_xxs *x, bool vbmi, __m512i codes, struct iq2_signed *s) {
    const uint8_t *q = (const uint8_t *)x->qs;
    _Alignas(32) uint8_t sign_bytes[32];
    struct iq2_decoded d = {.sign_bytes = sign_bytes};
    iq2_decode(q, vbmi, codes, &d);
    __m512i bias = _mm512_setzero_si512();
    UNROLL
    for (int p = 0; p < 4; p++) {
        __m512i grid = iq2_grid(q, vbmi, &d, p);
        s->w[p] = _mm512_mask_sub_epi8(grid, iq2_neg(&d, vbmi, p), _mm512_setzero_si512(), grid);
        s->scale[p] = iq2_pair_scale(&d, vbmi, p);
        bias = _mm512_dpwssd_epi32(bias, _mm512_maddubs_epi16(_mm512_set1_epi8((char)0x80), s->w[p]), s->scale[p]);
    }
    s->corr = _mm512_sub_epi32(_mm512_setzero_si512(), bias);
    s->dx = iq2_dx(x);
}

INLINE void iq2_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y, int64_t y_stride,
                     bool vbmi) {
    const int64_t nb = n / DS4_QK_K;
    const uint8_t *au = packed;
    const float *da = (const float *)(au + (size_t)nb * (size_t)nt * DS4_QK_K);
    __m512 acc[IQ2_TILE_ROWS][IQ2_TILE_TOKENS];
    for (int t = 0; t < nt; t++)
        UNROLL
        for (int r = 0; r < IQ2_TILE_ROWS; r++) acc[r][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        struct iq2_signed sb[IQ2_TILE_ROWS];
        const ds4_block_iq2_xxs *x[IQ2_TILE_ROWS];
        UNROLL
        for (int r = 0; r < IQ2_TILE_ROWS; r++) {
            x[r] = (const ds4_block_iq2_xxs *)((const uint8_t *)w + row_bytes * (size_t)r) + i;
            prefetch_weights(x[r]);
        }
        /* the two rows' super-blocks share the VBMI grid lookups */
        _Static_assert(IQ2_TILE_ROWS == 2, "one lookup pair per tile");
        __m512i codes[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        if (vbmi) iq2_lookup_codes((const uint8_t *)x[0]->qs, (const uint8_t *)x[1]->qs, codes);
        UNROLL
        for (int r = 0; r < IQ2_TILE_ROWS; r++) iq2_decode_signed(x[r], vbmi, codes[r], &sb[r]);
        for (int t = 0; t < nt; t++) {
            const uint8_t *a = au + ((size_t)i * (size_t)nt + (size_t)t) * DS4_QK_K;
            __m512i sumi[IQ2_TILE_ROWS];
            UNROLL
            for (int r = 0; r < IQ2_TILE_ROWS; r++) sumi[r] = sb[r].corr;
            UNROLL
            for (int p = 0; p < 4; p++) {
                __m512i av = _mm512_load_si512(a + 64 * p);
                UNROLL
                for (int r = 0; r < IQ2_TILE_ROWS; r++)
                    sumi[r] = _mm512_dpwssd_epi32(sumi[r], _mm512_maddubs_epi16(av, sb[r].w[p]), sb[r].scale[p]);
            }
            UNROLL
            for (int r = 0; r < IQ2_TILE_ROWS; r++)
                acc[r][t] = iq2_accumulate(acc[r][t], sb[r].dx, da[i * nt + t], sumi[r]);
        }
    }
    for (int t = 0; t < nt; t++)
        UNROLL
        for (int r = 0; r < IQ2_TILE_ROWS; r++) y[t * y_stride + r] = _mm512_reduce_add_ps(acc[r][t]);
}

static void iq2_xxs_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                         int64_t y_stride) {
    iq2_tile(w, row_bytes, packed, n, nt, y, y_stride, false);
}
VBMI static void iq2_xxs_vbmi_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                                   int64_t y_stride) {
    iq2_tile(w, row_bytes, packed, n, nt, y, y_stride, true);
}

/* ---- Q2_K x Q8_K ----
 * 64 elements per register: the quants (0..3, unsigned, as vpdpbusd wants)
 * of activation bytes 64m..64m+63 are one 32-byte qs half shifted by 4(m%2)
 * (low 256 bits) and 4(m%2) + 2 (high 256 bits). vpdpbusd sums them in
 * groups of four, each group inside one 16-element sub-block, and a
 * vpdpwssd multiplies each group by its sub-block's scale: |group| <= 4 * 3
 * * 127 fits the low 16 bits (the high 16 are its sign extension) and the
 * scale's high 16 bits are zero, so the sum is exact. The mins term uses the
 * activation's 16-element sums (bsums), as the AVX2 kernel does. (The
 * vpmaddubsw form of the IQ2_XXS kernels gives the same integers here but
 * measured no faster.) */
/* the 2-bit quants of elements 64m..64m+63 from their 32-byte qs half
 * (in both 256-bit halves of half): bits 4(m % 2) of each byte in the low
 * 256 bits, 4(m % 2) + 2 in the high. With GFNI one bit-matrix multiply
 * per byte (output bits 0, 1 := input bits s, s + 1) replaces the shift
 * and the mask: one instruction of a kernel bound by its instruction count
 * (L2-resident matvec 12.5 -> 15 GB/s of CPU time, 1 thread). */
VBMI static inline __m512i q2_K_quants_gfni(__m512i half, int m) {
    const long long low = 1ll << (56 + 4 * (m % 2)) | 1ll << (48 + 4 * (m % 2) + 1);
    const long long high = 1ll << (56 + 4 * (m % 2) + 2) | 1ll << (48 + 4 * (m % 2) + 3);
    return _mm512_gf2p8affine_epi64_epi8(half, _mm512_set_epi64(high, high, high, high, low, low, low, low), 0);
}

INLINE __m512i q2_K_quants(__m512i half, int m, bool gfni) {
    if (gfni) return q2_K_quants_gfni(half, m);
    __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16((short)(4 * (m % 2))), _mm256_set1_epi16((short)(4 * (m % 2) + 2)), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(half, shift), _mm512_set1_epi8(3));
}

INLINE void q2_K_core(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out, bool gfni) {
    const ds4_block_q2_K *x = w;
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m512 acc[NT_MAX];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    const char *prefetch = prefetch_cursor(x);
    const bool prefetch_on = stream_prefetch();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        if (prefetch_on) prefetch_lines(&prefetch, x + i + 1);
        __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        const __m512i scales16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sc8, m4)));
        __m512i sumi[NT_MAX];
        UNROLL
        for (int t = 0; t < nt; t++) sumi[t] = _mm512_setzero_si512();
        UNROLL
        for (int m = 0; m < 4; m += 2) {
            __m512i half = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * (m / 2))));
            __m512i q0 = q2_K_quants(half, m, gfni), q1 = q2_K_quants(half, m + 1, gfni);
            /* lane L: the scales of its groups in m (low word) and m + 1 */
            const __m512i sc = _mm512_permutexvar_epi16(
                _mm512_set_epi16(4 * m + 7, 4 * m + 3, 4 * m + 7, 4 * m + 3, 4 * m + 7, 4 * m + 3, 4 * m + 7, 4 * m + 3,
                                 4 * m + 6, 4 * m + 2, 4 * m + 6, 4 * m + 2, 4 * m + 6, 4 * m + 2, 4 * m + 6, 4 * m + 2,
                                 4 * m + 5, 4 * m + 1, 4 * m + 5, 4 * m + 1, 4 * m + 5, 4 * m + 1, 4 * m + 5, 4 * m + 1,
                                 4 * m + 4, 4 * m + 0, 4 * m + 4, 4 * m + 0, 4 * m + 4, 4 * m + 0, 4 * m + 4, 4 * m + 0),
                scales16);
            UNROLL
            for (int t = 0; t < nt; t++) {
                const ds4_block_q8_K *y = (const ds4_block_q8_K *)tok(acts, stride, t) + i;
                /* each lane's two group sums (|sum| <= 4 * 3 * 127) as its
                 * two words, so one vpdpwssd scales both */
                __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q0, _mm512_loadu_si512(y->qs + 64 * m));
                __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q1, _mm512_loadu_si512(y->qs + 64 * m + 64));
                sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_mask_blend_epi16(0xAAAAAAAA, s0, _mm512_slli_epi32(s1, 16)), sc);
            }
        }
        /* d and dmin (adjacent halves) converted together, and each times
         * the token's scale in one multiply: the same float products as
         * two scalar ones, in fewer instructions */
        _Static_assert(offsetof(ds4_block_q2_K, dmin) == offsetof(ds4_block_q2_K, d) + 2, "d, dmin adjacent");
        int32_t d_dmin;
        memcpy(&d_dmin, &x[i].d, sizeof d_dmin);
        const __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128(d_dmin));
        UNROLL
        for (int t = 0; t < nt; t++) {
            const ds4_block_q8_K *y = (const ds4_block_q8_K *)tok(acts, stride, t) + i;
            __m256i mb = _mm256_madd_epi16(mins16, _mm256_loadu_si256((const __m256i *)y->bsums));
            __m512 scales = _mm512_castps128_ps512(_mm_mul_ps(dw, _mm_set1_ps(y->d))); /* d * d_a, dmin * d_a */
            acc[t] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_setzero_si512(), scales), _mm512_cvtepi32_ps(sumi[t]),
                                     acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_permutexvar_ps(_mm512_set1_epi32(1), scales),
                                      _mm512_cvtepi32_ps(_mm512_zextsi256_si512(mb)), acc[t]);
        }
    }
    UNROLL
    for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}

INLINE void q2_K_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    q2_K_core(w, acts, stride, n, nt, out, false);
}
DOT_ENTRY_POINTS(q2_K)
VBMI INLINE void q2_K_gfni_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    q2_K_core(w, acts, stride, n, nt, out, true);
}
DOT_ENTRY_POINTS_ATTR(q2_K_gfni, VBMI)

/* The Q2_K tile: Q2K_TILE_ROWS rows x 2..Q2K_TILE_TOKENS tokens packed once
 * per group, each super-block of a row decoded once for the group. A
 * quant times its sub-block scale is at most 3 * 15 = 45, still a byte, so
 * the scale goes into the weights once per row (a word multiply by a scale
 * in both bytes' words: the low byte's product cannot carry into the high
 * one), and a token's 64 elements are one vpdpbusd, against the dot's
 * vpdpbusd + vpdpwssd. Lane L of a super-block's sum is then the dot's:
 * over m, the scale of sub-block 4m + L/4 times the sum of the products of
 * elements 64m + 4L..64m + 4L + 3, exact, and the float steps are the dot's,
 * so every (row, token) equals the dot bit for bit. */
enum { Q2K_TILE_ROWS = 2, Q2K_TILE_TOKENS = 16 };

/* packed: per super-block, per token, the 256 quants; then per super-block,
 * per token, the 16 bsums; then the scales d[super-block][token] */
static bool q2_K_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes) {
    const int64_t nb = n / DS4_QK_K;
    const size_t slots = (size_t)nb * (size_t)nt;
    if (slots * (DS4_QK_K + 32 + sizeof(float)) > packed_bytes) return false;
    uint8_t *qs = packed, *bsums = qs + slots * DS4_QK_K;
    float *d = (float *)(bsums + slots * 32);
    for (int64_t i = 0; i < nb; i++)
        for (int t = 0; t < nt; t++) {
            const ds4_block_q8_K *y = (const ds4_block_q8_K *)tok(acts, stride, t) + i;
            const size_t s = (size_t)i * (size_t)nt + (size_t)t;
            for (int k = 0; k < DS4_QK_K; k += 64)
                _mm512_store_si512(qs + s * DS4_QK_K + k, _mm512_loadu_si512(y->qs + k));
            _mm256_store_si256((__m256i *)(bsums + s * 32), _mm256_loadu_si256((const __m256i *)y->bsums));
            d[s] = y->d;
        }
    return true;
}

struct q2k_scaled {
    __m512i w[4];
    __m256i mins16;
    __m128 dw; /* d, dmin */
};

INLINE void q2_K_decode_scaled(const ds4_block_q2_K *x, struct q2k_scaled *s) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
    s->mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
    __m512i scales32 = _mm512_cvtepu8_epi32(_mm_and_si128(sc8, m4));
    scales32 = _mm512_or_si512(scales32, _mm512_slli_epi32(scales32, 16)); /* the scale in both words */
    UNROLL
    for (int m = 0; m < 4; m++) {
        __m512i half = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * (m / 2))));
        __m512i sc = _mm512_permutexvar_epi32(
            _mm512_setr_epi32(4 * m, 4 * m, 4 * m, 4 * m, 4 * m + 1, 4 * m + 1, 4 * m + 1, 4 * m + 1, 4 * m + 2,
                              4 * m + 2, 4 * m + 2, 4 * m + 2, 4 * m + 3, 4 * m + 3, 4 * m + 3, 4 * m + 3),
            scales32);
        s->w[m] = _mm512_mullo_epi16(q2_K_quants(half, m, false), sc);
    }
    int32_t d_dmin;
    memcpy(&d_dmin, &x->d, sizeof d_dmin);
    s->dw = _mm_cvtph_ps(_mm_cvtsi32_si128(d_dmin));
}

static void q2_K_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                      int64_t y_stride) {
    const int64_t nb = n / DS4_QK_K;
    const size_t slots = (size_t)nb * (size_t)nt;
    const uint8_t *qs = packed, *bsums = qs + slots * DS4_QK_K;
    const float *da = (const float *)(bsums + slots * 32);
    __m512 acc[Q2K_TILE_ROWS][Q2K_TILE_TOKENS];
    for (int t = 0; t < nt; t++)
        UNROLL
        for (int r = 0; r < Q2K_TILE_ROWS; r++) acc[r][t] = _mm512_setzero_ps();
    const char *prefetch[Q2K_TILE_ROWS];
    UNROLL
    for (int r = 0; r < Q2K_TILE_ROWS; r++) prefetch[r] = prefetch_cursor((const uint8_t *)w + row_bytes * (size_t)r);
    for (int64_t i = 0; i < nb; i++) {
        struct q2k_scaled sb[Q2K_TILE_ROWS];
        UNROLL
        for (int r = 0; r < Q2K_TILE_ROWS; r++) {
            const ds4_block_q2_K *x = (const ds4_block_q2_K *)((const uint8_t *)w + row_bytes * (size_t)r) + i;
            prefetch_lines(&prefetch[r], x + 1);
            q2_K_decode_scaled(x, &sb[r]);
        }
        for (int t = 0; t < nt; t++) {
            const size_t s = (size_t)i * (size_t)nt + (size_t)t;
            const uint8_t *a = qs + s * DS4_QK_K;
            __m512i sumi[Q2K_TILE_ROWS];
            UNROLL
            for (int r = 0; r < Q2K_TILE_ROWS; r++) sumi[r] = _mm512_setzero_si512();
            UNROLL
            for (int m = 0; m < 4; m++) {
                __m512i av = _mm512_load_si512(a + 64 * m);
                UNROLL
                for (int r = 0; r < Q2K_TILE_ROWS; r++) sumi[r] = _mm512_dpbusd_epi32(sumi[r], sb[r].w[m], av);
            }
            const __m256i bs = _mm256_load_si256((const __m256i *)(bsums + s * 32));
            const __m128 d_a = _mm_set1_ps(da[s]);
            UNROLL
            for (int r = 0; r < Q2K_TILE_ROWS; r++) {
                /* q2_K_core's float steps */
                __m256i mb = _mm256_madd_epi16(sb[r].mins16, bs);
                __m512 scales = _mm512_castps128_ps512(_mm_mul_ps(sb[r].dw, d_a));
                acc[r][t] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_setzero_si512(), scales),
                                            _mm512_cvtepi32_ps(sumi[r]), acc[r][t]);
                acc[r][t] = _mm512_fnmadd_ps(_mm512_permutexvar_ps(_mm512_set1_epi32(1), scales),
                                             _mm512_cvtepi32_ps(_mm512_zextsi256_si512(mb)), acc[r][t]);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        UNROLL
        for (int r = 0; r < Q2K_TILE_ROWS; r++) y[t * y_stride + r] = _mm512_reduce_add_ps(acc[r][t]);
}

/* ---- plain read loop (bandwidth denominator) ---- */

READ_SUM_KERNEL(ds4_kernels_avx512_read_sum, 64)

/* the other K-quants fall back to the AVX2 kernels */
#define Q2_K_EXTRA case DS4_TYPE_Q2_K: return DOT_KERNELS(q2_K);

static bool iq2_vbmi(uint32_t type) { return type == DS4_TYPE_IQ2_XXS && ds4_kernels_iq2_vbmi(); }

struct ds4_dot_kernels ds4_kernels_avx512_dots(uint32_t type) {
    /* the VBMI/GFNI kernels where they are on */
    if (iq2_vbmi(type)) return DOT_KERNELS(iq2_xxs_vbmi);
    if (type == DS4_TYPE_Q2_K && ds4_kernels_vbmi()) return DOT_KERNELS(q2_K_gfni);
    DISPATCH(Q2_K_EXTRA)
}
bool ds4_kernels_avx512_tile(uint32_t type, struct ds4_tile_kernel *k) {
    if (float_tile_kernel(type, k)) return true;
    if (iq2_vbmi(type)) {
        *k = (struct ds4_tile_kernel){IQ2_TILE_ROWS, IQ2_VBMI_TILE_MIN_TOKENS, IQ2_TILE_TOKENS, iq2_xxs_pack,
                                      iq2_xxs_vbmi_tile, NULL};
        return true;
    }
    switch (type) {
    case DS4_TYPE_Q8_0:
        *k = (struct ds4_tile_kernel){Q8_TILE_ROWS, 1, Q8_TILE_TOKENS, q8_0_pack, q8_0_tile, q8_0_tile_from_memory};
        return true;
    case DS4_TYPE_IQ2_XXS:
        *k = (struct ds4_tile_kernel){IQ2_TILE_ROWS, 2, IQ2_TILE_TOKENS, iq2_xxs_pack, iq2_xxs_tile, NULL};
        return true;
    case DS4_TYPE_Q2_K:
        *k = (struct ds4_tile_kernel){Q2K_TILE_ROWS, 2, Q2K_TILE_TOKENS, q2_K_pack, q2_K_tile, NULL};
        return true;
    default: return false;
    }
}
