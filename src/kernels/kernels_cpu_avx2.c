/* kernels_cpu_avx2.c -- AVX2/FMA/F16C dot products (gguf-and-quants.md
 * section 10): integer multiply-accumulate inside each block, one float
 * multiply per block or super-block.
 *
 * The workhorse is maddubs (u8 x s8 -> pairs summed into i16). Every weight
 * format here is made unsigned first (Q8_0 via abs/sign, Q6_K via its +32
 * offset, IQ2_XXS by moving the signs onto the activation), and the sheet's
 * bound "two adjacent products stay below 2^15" makes the i16 step exact.
 * The following madd by the sub-block scale widens to i32.
 *
 * Every kernel is written once for NT activation rows (tokens): the weight
 * block is loaded and unpacked once, then multiplied against each token.
 * NT = 1 is the matvec dot, NT = 1..DS4_DOT_TOKENS the matmul micro-kernel;
 * the per-token arithmetic is the same in all, so they agree bit for bit.
 * Q8_0, IQ2_XXS and Q2_K also have matmul tiles (rows x packed tokens)
 * with the dot's integer sums and float order.
 */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "kernels/kernels_cpu.h"
#include "kernels/kernels_cpu_simd.h"

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- float weights against f32 activations ---- */

INLINE __m256 load8(enum float_kind k, const void *p, int64_t i) {
    switch (k) {
    case KIND_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
    case KIND_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i))), 16));
    default: return _mm256_loadu_ps((const float *)p + i);
    }
}

INLINE float load1(enum float_kind k, const void *p, int64_t i) {
    switch (k) {
    case KIND_F16: return h2f(((const uint16_t *)p)[i]);
    case KIND_BF16: return ds4_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* a (row, token)'s float result from its two chains, once the vector steps
 * reached element i: their lanes in hsum_ps's order, then elements i..n-1
 * one at a time */
INLINE float float_finish(enum float_kind k, const void *w, const float *a, int64_t i, int64_t n, __m256 chain0,
                          __m256 chain1) {
    float sum = hsum_ps(_mm256_add_ps(chain0, chain1));
    for (int64_t j = i; j < n; j++) sum += load1(k, w, j) * a[j];
    return sum;
}

/* two FMA chains per token; the row's lines are prefetched as it goes
 * where stream_prefetch() says so */
INLINE void float_nt(enum float_kind k, const void *w, const void *acts, size_t stride, int64_t n, int nt,
                     float *out) {
    __m256 acc[NT_MAX][2];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    const bool prefetch = stream_prefetch();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (prefetch) prefetch_float_lines(k, w, i, 16);
        __m256 w0 = load8(k, w, i), w1 = load8(k, w, i + 8);
        UNROLL
        for (int t = 0; t < nt; t++) {
            const float *a = tok(acts, stride, t);
            acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(a + i), acc[t][0]);
            acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(a + i + 8), acc[t][1]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 w0 = load8(k, w, i);
        UNROLL
        for (int t = 0; t < nt; t++)
            acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps((const float *)tok(acts, stride, t) + i), acc[t][0]);
    }
    UNROLL
    for (int t = 0; t < nt; t++) out[t] = float_finish(k, w, tok(acts, stride, t), i, n, acc[t][0], acc[t][1]);
}

FLOAT_KERNELS

/* the float tile's primitives (kernels_cpu_float_tile.h): 3 rows x 4
 * tokens in 12 accumulators, 3 weight vectors and one activation vector;
 * vectors are whole, the last elements go through float_finish */
typedef __m256 ft_vec;
enum { FT_LANES = 8, FT_ROWS = 6, FT_SUB_ROWS = 3 };
INLINE ft_vec ft_zero(void) { return _mm256_setzero_ps(); }
INLINE ft_vec ft_weights(enum float_kind k, const void *row, int64_t i, int64_t end) { return load8(k, row, i); }
INLINE ft_vec ft_acts(const float *a, int64_t i, int64_t end) { return _mm256_loadu_ps(a + i); }
INLINE ft_vec ft_fma(ft_vec w, ft_vec a, ft_vec acc) { return _mm256_fmadd_ps(w, a, acc); }
INLINE int64_t ft_tail_end(int64_t n) { return n / 8 * 8; }
INLINE float ft_result(enum float_kind k, const void *w, const float *a, int64_t n, ft_vec chain0, ft_vec chain1) {
    return float_finish(k, w, a, ft_tail_end(n), n, chain0, chain1);
}
#include "kernels/kernels_cpu_float_tile.h"

/* ---- Q8_0 x Q8_0 ----
 * Every Q8_0 product of this level -- the dot (1 row x 1 token), the
 * multi-token micro-kernel (1 x nt) and the matmul tiles -- sums the same
 * exact integers in the same float order, so a (row, token) result is the
 * same bit for bit whichever of them computes it. The float order per
 * (row, token): the blocks go in pairs (2p, 2p + 1), one 8-lane vector
 * holding the first halves (elements 0..15) of both blocks and another their
 * second halves, so lanes 0..3 belong to block 2p and lanes 4..7 to 2p + 1.
 * Lane 4i + j holds the exact integer sum of that block's products 4j..4j+3
 * and 16+4j..16+4j+3, converted to float and added by one FMA
 * with d_w * d_a (exact: two widened f16) into one of two 8-lane chains,
 * pair 2i into chain 0 and 2i + 1 into chain 1; an odd last block is paired
 * with itself and weighted 0 in lanes 4..7. The result is the sum of the
 * two chains' lanes in hsum_ps's order. Pairing the blocks halves the float
 * steps (a conversion, a multiply and an FMA per pair, not per block), which
 * were most of a tile's work.
 * The integer sums: maddubs of |w| by the activation carrying w's sign,
 * then madd by ones, the two halves added; where the CPU has AVX-VNNI, one
 * vpdpbusd per half (u8 x s8, groups of four summed into i32, without
 * saturation) replaces maddubs + madd, with the same exact sums (maddubs
 * cannot saturate here: |w| <= 128 and |a| <= 128 keep a pair's sum within
 * i16), so the same bits. The sign trick is exact for the activations the
 * quantizer writes (-127..127; it would turn -128 x a negative weight into
 * the wrong sign). The tiles share each weight pair's loads and scales
 * between their tokens, and each token's quants and scales (packed once per
 * token group) between their rows.
 * Both tiles take 2 rows x up to 8 tokens in one pass over the rows, both
 * chains at once: the plain one was 2 x 2 in a pass per chain. One thread,
 * the Xeon VM, alternating, without AVX-VNNI: 65536 x 4096 (285 MB) at 4
 * tokens 39.3-40.6 -> 27.7-28.0 ms, at 8 71.2-72.9 -> 44.1-44.8, from cache
 * (2048 rows) 71-73 -> 97-100 GFLOP/s at 8 tokens. */
enum { Q8_TILE_ROWS = 2, Q8_TILE_TOKENS = 8, Q8_SLOT_BYTES = 96 };

/* a block pair of a row or an activation: the halves and the scales */
struct q8_pair {
    __m256i lo, hi; /* elements 0..15 of blocks b0 | b1, elements 16..31 of b0 | b1 */
    __m256 d;       /* d of b0 in lanes 0..3, of b1 in lanes 4..7 (0 where b1 == b0) */
};

/* pair p of a row of nb blocks: blocks 2p and 2p + 1, or 2p twice for an
 * odd last block. `whole` (a constant) says the caller knows 2p + 1 < nb:
 * the hot loops then go without the check and its address steps, which
 * were a third of a one-token loop's instructions (and that loop was bound
 * by how many the core issues per cycle). */
INLINE struct q8_pair q8_0_pair(const ds4_block_q8_0 *x, int64_t p, int64_t nb, bool whole) {
    const __m256i lanes = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const int64_t b0 = 2 * p, b1 = whole || b0 + 1 < nb ? b0 + 1 : b0;
    struct q8_pair q;
    q.lo = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)x[b0].qs)),
                                   _mm_loadu_si128((const __m128i *)x[b1].qs), 1);
    q.hi = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(x[b0].qs + 16))),
                                   _mm_loadu_si128((const __m128i *)(x[b1].qs + 16)), 1);
    /* both f16 scales widened by one conversion (+0.0 for a lone block) */
    const uint32_t halves = x[b0].d | (uint32_t)(b1 != b0 ? x[b1].d : 0) << 16;
    q.d = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128((int)halves))), lanes);
    return q;
}

/* AVX-VNNI's VEX vpdpbusd, an extension inside this level (not the
 * AVX-512 level's EVEX form, which needs AVX512-VNNI and VL). The emulated
 * test build (tests/kernels/test_avx512_emulated.sh) drops the attribute:
 * its shim computes the two intrinsics element by element, so the AVX-VNNI
 * kernels run, and are checked, on any AVX2 CPU. */
#ifdef DS4_KERNELS_EMULATED
#define AVXVNNI
#else
#define AVXVNNI __attribute__((target("avxvnni")))
#endif

/* not always_inline: the kernels below that never take the vnni branch
 * are compiled without the target, and may only call it */
AVXVNNI static inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
    return _mm256_dpbusd_avx_epi32(acc, u, s);
}
/* acc + (word 2k x b's word 2k + word 2k+1 x b's word 2k+1) per lane k */
AVXVNNI static inline __m256i dpwssd(__m256i acc, __m256i a, __m256i b) {
    return _mm256_dpwssd_avx_epi32(acc, a, b);
}

/* lane k: the exact sum of the products 4k..4k+3 of ulo (unsigned) and slo
 * and of uhi and shi */
INLINE __m256i isums8(__m256i ulo, __m256i slo, __m256i uhi, __m256i shi, bool vnni) {
    if (vnni) return dpbusd(dpbusd(_mm256_setzero_si256(), ulo, slo), uhi, shi);
    const __m256i ones = _mm256_set1_epi16(1);
    return _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(ulo, slo), ones),
                            _mm256_madd_epi16(_mm256_maddubs_epi16(uhi, shi), ones));
}

/* a (row, token)'s pair into its chain */
INLINE __m256 q8_0_fold(__m256i isum, __m256 dw, __m256 da, __m256 chain) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, da), chain);
}

/* -128 x the sum of a pair's activations per lane, the VNNI tile's start */
INLINE __m256i q8_0_start(const struct q8_pair *a) {
    const __m256i u128 = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    return _mm256_sub_epi32(zero, dpbusd(dpbusd(zero, u128, a->lo), u128, a->hi));
}

/* packed activations: per block pair, `slots` slots of 32 bytes of the
 * first halves, 32 of the second and the 8 scale floats, then, for the
 * VNNI tile (`vnni`), each lane's -128 x its activations' sum */
enum { Q8V_SLOT_BYTES = Q8_SLOT_BYTES + 32 };

INLINE bool q8_0_pack_slots(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes,
                            int slots, bool vnni) {
    const int64_t nb = n / DS4_QK8_0, pairs = (nb + 1) / 2;
    const size_t slot_bytes = vnni ? Q8V_SLOT_BYTES : Q8_SLOT_BYTES;
    if ((size_t)pairs * (size_t)slots * slot_bytes > packed_bytes) return false;
    for (int64_t p = 0; p < pairs; p++)
        for (int t = 0; t < nt; t++) {
            uint8_t *s = (uint8_t *)packed + ((size_t)p * (size_t)slots + (size_t)t) * slot_bytes;
            const struct q8_pair a = q8_0_pair(tok(acts, stride, t), p, nb, false);
            _mm256_store_si256((__m256i *)s, a.lo);
            _mm256_store_si256((__m256i *)(s + 32), a.hi);
            _mm256_store_ps((float *)(s + 64), a.d);
            if (vnni) _mm256_store_si256((__m256i *)(s + 96), q8_0_start(&a));
        }
    return true;
}

static bool q8_0_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes) {
    return q8_0_pack_slots(acts, stride, n, nt, packed, packed_bytes, nt, false);
}

enum { RT_ROWS_MAX = Q8_TILE_ROWS, RT_TOKENS_MAX = NT_MAX };

/* pair p (of rows of nb blocks) of nr rows x nt tokens into chain `slot`;
 * the tokens come packed (acts NULL) or as activation rows */
INLINE void q8_0_pair_step(const void *w, size_t row_bytes, int nr, const void *acts, size_t stride,
                           const void *packed, int nt, int64_t p, int64_t nb, bool whole,
                           __m256 acc[RT_ROWS_MAX][RT_TOKENS_MAX][2], int slot, bool vnni) {
    struct q8_pair x[RT_ROWS_MAX];
    __m256i ulo[RT_ROWS_MAX], uhi[RT_ROWS_MAX];
    UNROLL
    for (int r = 0; r < nr; r++) {
        x[r] = q8_0_pair((const ds4_block_q8_0 *)((const uint8_t *)w + row_bytes * (size_t)r), p, nb, whole);
        ulo[r] = _mm256_sign_epi8(x[r].lo, x[r].lo);
        uhi[r] = _mm256_sign_epi8(x[r].hi, x[r].hi);
    }
    UNROLL
    for (int t = 0; t < nt; t++) {
        struct q8_pair a;
        if (!acts) {
            const uint8_t *s = (const uint8_t *)packed + ((size_t)p * (size_t)nt + (size_t)t) * Q8_SLOT_BYTES;
            a.lo = _mm256_load_si256((const __m256i *)s);
            a.hi = _mm256_load_si256((const __m256i *)(s + 32));
            a.d = _mm256_load_ps((const float *)(s + 64));
        } else {
            a = q8_0_pair(tok(acts, stride, t), p, nb, whole);
        }
        UNROLL
        for (int r = 0; r < nr; r++) {
            const __m256i isum = isums8(ulo[r], _mm256_sign_epi8(a.lo, x[r].lo), uhi[r],
                                        _mm256_sign_epi8(a.hi, x[r].hi), vnni);
            acc[r][t][slot] = q8_0_fold(isum, x[r].d, a.d, acc[r][t][slot]);
        }
    }
}

/* A tile's prefetches at pair p of its nr rows, two per 68 bytes: chain
 * 0's ask for the rows themselves, ahead of their reads; chain 1's for the
 * same bytes of the rows two tiles on (into L2; against the next tile's,
 * 65536 x 4096 from DRAM, one thread, plain avx2, Zen 4: 2 tokens
 * 20.5-21.7 -> 19.3-20.4 ms, 8 tokens 47.0-47.6 -> 45.7-46.3). Both tiles
 * make both requests in their one pass over the rows. */
INLINE void q8_0_tile_prefetch(const void *w, size_t row_bytes, int nr, int64_t p, int chain) {
    UNROLL
    for (int r = 0; r < nr; r++) {
        const ds4_block_q8_0 *x = (const ds4_block_q8_0 *)((const uint8_t *)w + row_bytes * (size_t)r) + 2 * p;
        if (!chain) {
            prefetch_weights(x);
            prefetch_weights(x + 2);
        } else {
            _mm_prefetch((const char *)(x - 2) + row_bytes * (size_t)(2 * nr), _MM_HINT_T1);
            _mm_prefetch((const char *)x + row_bytes * (size_t)(2 * nr), _MM_HINT_T1);
        }
    }
}

/* y[t * y_stride + r] for nr rows (row_bytes apart) x nt tokens; the tokens
 * come packed (nt <= Q8_TILE_TOKENS) or as activation rows */
INLINE void q8_0_rt(const void *w, size_t row_bytes, int nr, const void *acts, size_t stride, const void *packed,
                    int nt, int64_t n, float *y, int64_t y_stride, bool vnni) {
    const int64_t nb = n / DS4_QK8_0, pairs = (nb + 1) / 2;
    __m256 acc[RT_ROWS_MAX][RT_TOKENS_MAX][2];
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL
        for (int t = 0; t < nt; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
#define STEP(p, whole, chain) \
    q8_0_pair_step(w, row_bytes, nr, acts, stride, packed, nt, p, nb, whole, acc, chain, vnni)
    const bool prefetch = stream_prefetch(); /* a lone row's own lines */
    /* both chains in one pass: a tile's rows are read once, and the
     * accumulators that do not fit the registers (up to 2 x 8 x 2) wait
     * in L1, which its ALU-bound steps do not notice */
    int64_t p = 0;
    for (; p + 2 <= nb / 2; p += 2) {
        if (nr > 1 || prefetch) q8_0_tile_prefetch(w, row_bytes, nr, p, 0);
        if (nr > 1) q8_0_tile_prefetch(w, row_bytes, nr, p + 1, 1);
        STEP(p, true, 0);
        STEP(p + 1, true, 1);
    }
    /* at most two pairs are left, the last maybe a lone block */
    if (p < pairs) STEP(p, false, 0);
    if (p + 1 < pairs) STEP(p + 1, false, 1);
#undef STEP
    UNROLL
    for (int r = 0; r < nr; r++)
        UNROLL
        for (int t = 0; t < nt; t++) y[t * y_stride + r] = hsum_ps(_mm256_add_ps(acc[r][t][0], acc[r][t][1]));
}

INLINE void q8_0_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    q8_0_rt(w, 0, 1, acts, stride, NULL, nt, n, out, 1, false);
}
DOT_ENTRY_POINTS(q8_0)

AVXVNNI INLINE void q8_0_vnni_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    q8_0_rt(w, 0, 1, acts, stride, NULL, nt, n, out, 1, true);
}
DOT_ENTRY_POINTS_ATTR(q8_0_vnni, AVXVNNI)

static void q8_0_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                      int64_t y_stride) {
    switch (nt) {
    case 8: q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, 8, n, y, y_stride, false); break;
    case 7: q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, 7, n, y, y_stride, false); break;
    case 6: q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, 6, n, y, y_stride, false); break;
    case 5: q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, 5, n, y, y_stride, false); break;
    case 4: q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, 4, n, y, y_stride, false); break;
    case 3: q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, 3, n, y, y_stride, false); break;
    case 1:
        /* one token (a decode step's matvec) reads the rows one after
         * another, as the dot did: one sequential stream, with software
         * prefetch where stream_prefetch() says so. What the tile saves is
         * the activation pair, packed once per matvec instead of assembled
         * again for every row (9 of about 30 vector steps per block pair).
         * 4096-wide rows, one thread, plain avx2, Zen 4, against the dot:
         * from L2 24.5-26.1 -> 29.2-32.5 GB/s, from DRAM 22.9 -> 24.6. */
        for (int r = 0; r < Q8_TILE_ROWS; r++)
            q8_0_rt((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, 1, NULL, 0, packed, 1, n, y + r, y_stride,
                    false);
        break;
    default: q8_0_rt(w, row_bytes, Q8_TILE_ROWS, NULL, 0, packed, 2, n, y, y_stride, false); break;
    }
}

/* The AVX-VNNI tile: Q8_TILE_ROWS rows x 2..Q8V_TILE_TOKENS tokens, with
 * the weights made unsigned instead of the activations: vpdpbusd takes
 * w + 128 (w ^ 0x80, exact for every byte) and the signed activations, and
 * each (token, pair) starts its lane sums at -128 x the sum of its
 * activations, packed once per token group: lane k gets
 * sum (w_i + 128) a_i - 128 sum a_i = sum w_i a_i, the exact integers of
 * q8_0_pair_step, so the same floats in the same order and the same bits
 * as every other Q8_0 product of the level. Neither sign step remains, and
 * the activations are vpdpbusd's memory operands: a (row, token) costs a
 * load of its start, two vpdpbusd, a conversion, a multiply and an FMA per
 * pair of blocks.
 * It takes any group of 1..8 tokens, a matvec's single token too: the
 * per-row kernel would apply the signs and assemble the activation pairs
 * again for every row. From L2 (256 rows of 4096, one thread, the Xeon VM)
 * 25-27 -> 32-35 GB/s; from memory (1.1 GB) 13.7-15.3 -> 14.9-15.2. The
 * plain tile takes one token as its rows in turn (q8_0_tile): its two rows
 * side by side streamed 5% slower from memory than the per-row kernel.
 * Groups of 8 rather than 4, in one pass rather than a pass per chain (one
 * thread, alternating, 65536 x 4096 = 285 MB): 8 tokens 48.2 -> 38.0 ms, 16
 * tokens 85.7 -> 71.0-74.7, 4 tokens 26.5-26.7 -> 24.1-25.1, from cache
 * (2048 rows) the same 112-129 GFLOP/s; groups of 16 ran slower (84 ms). A
 * group of 8 reads the rows once where two groups of 4 read them from
 * memory and then computed the second group from cache. */
enum { Q8V_TILE_TOKENS = 8 };

AVXVNNI static bool q8_0_vnni_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed,
                                   size_t packed_bytes) {
    return q8_0_pack_slots(acts, stride, n, nt, packed, packed_bytes, nt, true);
}

/* pair p (of rows of nb blocks) of the tile's rows x nt tokens into chain `slot` */
AVXVNNI INLINE void q8_0_vnni_step(const void *w, size_t row_bytes, const void *packed, int nt, int64_t p,
                                   int64_t nb, bool whole, __m256 acc[Q8_TILE_ROWS][Q8V_TILE_TOKENS][2], int slot) {
    const __m256i u128 = _mm256_set1_epi8((char)0x80);
    struct q8_pair x[Q8_TILE_ROWS];
    UNROLL
    for (int r = 0; r < Q8_TILE_ROWS; r++) {
        x[r] = q8_0_pair((const ds4_block_q8_0 *)((const uint8_t *)w + row_bytes * (size_t)r), p, nb, whole);
        x[r].lo = _mm256_xor_si256(x[r].lo, u128);
        x[r].hi = _mm256_xor_si256(x[r].hi, u128);
    }
    UNROLL
    for (int t = 0; t < Q8V_TILE_TOKENS; t++) {
        if (t >= nt) break;
        const uint8_t *s = (const uint8_t *)packed + ((size_t)p * (size_t)nt + (size_t)t) * Q8V_SLOT_BYTES;
        const __m256i a_lo = _mm256_load_si256((const __m256i *)s), a_hi = _mm256_load_si256((const __m256i *)(s + 32));
        const __m256 da = _mm256_load_ps((const float *)(s + 64));
        UNROLL
        for (int r = 0; r < Q8_TILE_ROWS; r++) {
            const __m256i start = _mm256_load_si256((const __m256i *)(s + 96));
            const __m256i isum = dpbusd(dpbusd(start, x[r].lo, a_lo), x[r].hi, a_hi);
            acc[r][t][slot] = q8_0_fold(isum, x[r].d, da, acc[r][t][slot]);
        }
    }
}

/* Both chains in one pass over the tile's rows (the prefetches of q8_0_rt's
 * tile), for every group size: each row is read once for all nt tokens. Up
 * to 4 tokens the accumulators fit the registers; with 5..8 the compiler
 * keeps some in L1, which costs no throughput here (the tile is bound by
 * its vector ports, and a spilled accumulator adds a load and a store,
 * which have ports of their own). */
AVXVNNI INLINE void q8_0_vnni_rt(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                                 int64_t y_stride) {
    const int64_t nb = n / DS4_QK8_0, pairs = (nb + 1) / 2;
    __m256 acc[Q8_TILE_ROWS][Q8V_TILE_TOKENS][2];
    UNROLL
    for (int r = 0; r < Q8_TILE_ROWS; r++)
        UNROLL
        for (int t = 0; t < Q8V_TILE_TOKENS; t++) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 2 <= nb / 2; p += 2) {
        q8_0_tile_prefetch(w, row_bytes, Q8_TILE_ROWS, p, 0);
        q8_0_tile_prefetch(w, row_bytes, Q8_TILE_ROWS, p + 1, 1);
        q8_0_vnni_step(w, row_bytes, packed, nt, p, nb, true, acc, 0);
        q8_0_vnni_step(w, row_bytes, packed, nt, p + 1, nb, true, acc, 1);
    }
    if (p < pairs) q8_0_vnni_step(w, row_bytes, packed, nt, p, nb, false, acc, 0);
    if (p + 1 < pairs) q8_0_vnni_step(w, row_bytes, packed, nt, p + 1, nb, false, acc, 1);
    UNROLL
    for (int r = 0; r < Q8_TILE_ROWS; r++)
        UNROLL
        for (int t = 0; t < Q8V_TILE_TOKENS; t++)
            if (t < nt) y[t * y_stride + r] = hsum_ps(_mm256_add_ps(acc[r][t][0], acc[r][t][1]));
}

/* nt known at compile time in each branch: the token loop unrolls */
AVXVNNI static void q8_0_vnni_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                                   int64_t y_stride) {
    switch (nt) {
    case 8: q8_0_vnni_rt(w, row_bytes, packed, n, 8, y, y_stride); break;
    case 7: q8_0_vnni_rt(w, row_bytes, packed, n, 7, y, y_stride); break;
    case 6: q8_0_vnni_rt(w, row_bytes, packed, n, 6, y, y_stride); break;
    case 5: q8_0_vnni_rt(w, row_bytes, packed, n, 5, y, y_stride); break;
    case 4: q8_0_vnni_rt(w, row_bytes, packed, n, 4, y, y_stride); break;
    case 3: q8_0_vnni_rt(w, row_bytes, packed, n, 3, y, y_stride); break;
    case 2: q8_0_vnni_rt(w, row_bytes, packed, n, 2, y, y_stride); break;
    default: q8_0_vnni_rt(w, row_bytes, packed, n, 1, y, y_stride); break;
    }
}

/* ---- K-quants x Q8_K ---- */

INLINE const ds4_block_q8_K *q8k(const void *acts, size_t stride, int t, int64_t i) {
    return (const ds4_block_q8_K *)tok(acts, stride, t) + i;
}

INLINE __m256i madd_u8_scaled(__m256i q, const int8_t *a, __m256i scale16) {
    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)a));
    return _mm256_madd_epi16(p, scale16);
}

/* super-block i of the affine K-quants into each token's accumulator:
 * acc += (d_a·d)·sumi − (d_a·dmin)·Σ m·bsum, mins16 lined up with the bsums */
INLINE void fold_affine(__m256 acc[], const __m256i sumi[], __m256i mins16, const void *acts, size_t stride,
                        int64_t i, int nt, float d, float dmin) {
    UNROLL
    for (int t = 0; t < nt; t++) {
        const ds4_block_q8_K *y = q8k(acts, stride, t, i);
        __m256i m = _mm256_madd_epi16(mins16, _mm256_loadu_si256((const __m256i *)y->bsums));
        acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(y->d * d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(y->d * dmin), _mm256_cvtepi32_ps(m), acc[t]);
    }
}

INLINE void store_sums(const __m256 acc[], int nt, float *out) {
    UNROLL
    for (int t = 0; t < nt; t++) out[t] = hsum_ps(acc[t]);
}

/* Q2_K: a 32-element vector spans two 16-element sub-blocks (low 128-bit
 * lane, high lane), so the i16 multiplier carries the scale of sub-block j
 * in the low lane and of j+1 in the high lane. The shuffle mask selects
 * byte j / j+1 of the lane-broadcast scales with 0x80 (zero) as the high
 * byte; adding 2 per step keeps those bytes >= 0x80. */
INLINE __m256i q2_K_scale_mask0(void) {
    return _mm256_setr_epi8(0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128,
                            1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128, 1, -128);
}

INLINE void q2_K_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    const ds4_block_q2_K *x = w;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    const __m256i two = _mm256_set1_epi8(2);
    __m256 acc[NT_MAX];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    const char *prefetch = prefetch_cursor(x);
    const bool prefetch_on = stream_prefetch();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        if (prefetch_on) prefetch_lines(&prefetch, x + i + 1);
        __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
        __m256i scales = _mm256_broadcastsi128_si256(_mm_and_si128(sc8, m4));
        __m256i mask = q2_K_scale_mask0(), sumi[NT_MAX];
        UNROLL
        for (int t = 0; t < nt; t++) sumi[t] = _mm256_setzero_si256();
        UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
            UNROLL
            for (int k = 0; k < 4; k++) {
                __m256i qk = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), m3);
                __m256i sc = _mm256_shuffle_epi8(scales, mask);
                UNROLL
                for (int t = 0; t < nt; t++)
                    sumi[t] = _mm256_add_epi32(sumi[t], madd_u8_scaled(qk, q8k(acts, stride, t, i)->qs + 128 * h + 32 * k, sc));
                mask = _mm256_add_epi8(mask, two);
            }
        }
        fold_affine(acc, sumi, mins16, acts, stride, i, nt, h2f(x[i].d), h2f(x[i].dmin));
    }
    store_sums(acc, nt, out);
}
DOT_ENTRY_POINTS(q2_K)

/* Q4_K and Q5_K: the 6-bit codes (sheet 5.2) decoded four at a time in u32
 * words. Returns the 8 scales as bytes in both 128-bit lanes (for per
 * sub-block shuffles) and the mins as i16, each twice (one per bsum). */
INLINE __m256i k4_scales(const uint8_t *S, __m256i *mins16) {
    uint32_t a0, a1, a2;
    memcpy(&a0, S, 4);
    memcpy(&a1, S + 4, 4);
    memcpy(&a2, S + 8, 4);
    uint32_t sc03 = a0 & 0x3F3F3F3F, m03 = a1 & 0x3F3F3F3F;
    uint32_t sc47 = (a2 & 0x0F0F0F0F) | ((a0 >> 6) & 0x03030303) << 4;
    uint32_t m47 = ((a2 >> 4) & 0x0F0F0F0F) | ((a1 >> 6) & 0x03030303) << 4;
    __m128i mins = _mm_setr_epi32((int)m03, (int)m47, 0, 0);
    *mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins));
    return _mm256_broadcastsi128_si256(_mm_setr_epi32((int)sc03, (int)sc47, 0, 0));
}

/* bit j of every byte of qh, moved to bit 4 (the fifth quant bit). The
 * 16-bit shifts cannot leak between bytes because of the mask by 1 first. */
INLINE __m256i q5_high(__m256i qh, int j) {
    return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1)), 4);
}

/* one layout walk for both: Q5_K adds the fifth bit from qh (qh_off 0: Q4_K) */
INLINE void k45_nt(const uint8_t *blocks, size_t block_bytes, size_t qs_off, size_t qh_off, const void *acts,
                   size_t stride, int64_t n, int nt, float *out) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i one = _mm256_set1_epi8(1);
    /* selects scale byte j into every i16 lane; 0x80 zeroes the high byte */
    const __m256i mask0 = _mm256_set1_epi16((short)0x8000);
    __m256 acc[NT_MAX];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / DS4_QK_K; i++, blocks += block_bytes) {
        ds4_half d, dmin;
        memcpy(&d, blocks, 2);
        memcpy(&dmin, blocks + 2, 2);
        __m256i mins16, scales = k4_scales(blocks + 4, &mins16);
        __m256i qh = qh_off ? _mm256_loadu_si256((const __m256i *)(blocks + qh_off)) : _mm256_setzero_si256();
        __m256i mask = mask0, sumi[NT_MAX];
        UNROLL
        for (int t = 0; t < nt; t++) sumi[t] = _mm256_setzero_si256();
        UNROLL
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(blocks + qs_off + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (qh_off) {
                lo = _mm256_or_si256(lo, q5_high(qh, 2 * c));
                hi = _mm256_or_si256(hi, q5_high(qh, 2 * c + 1));
            }
            __m256i sc_lo = _mm256_shuffle_epi8(scales, mask);
            mask = _mm256_add_epi8(mask, one);
            __m256i sc_hi = _mm256_shuffle_epi8(scales, mask);
            mask = _mm256_add_epi8(mask, one);
            UNROLL
            for (int t = 0; t < nt; t++) {
                const int8_t *a = q8k(acts, stride, t, i)->qs + 64 * c;
                sumi[t] = _mm256_add_epi32(sumi[t], madd_u8_scaled(lo, a, sc_lo));
                sumi[t] = _mm256_add_epi32(sumi[t], madd_u8_scaled(hi, a + 32, sc_hi));
            }
        }
        fold_affine(acc, sumi, mins16, acts, stride, i, nt, h2f(d), h2f(dmin));
    }
    store_sums(acc, nt, out);
}

INLINE void q4_K_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    k45_nt(w, sizeof(ds4_block_q4_K), offsetof(ds4_block_q4_K, qs), 0, acts, stride, n, nt, out);
}
INLINE void q5_K_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    k45_nt(w, sizeof(ds4_block_q5_K), offsetof(ds4_block_q5_K, qs), offsetof(ds4_block_q5_K, qh), acts, stride, n,
           nt, out);
}
DOT_ENTRY_POINTS(q4_K)
DOT_ENTRY_POINTS(q5_K)

/* Q6_K: quants are used with their +32 offset (unsigned for maddubs) and
 * 32·Σ sc_j·bsum_j is subtracted. Scale pairs: i16 word 2p in the low lane,
 * word 2p+1 in the high lane, from a half-broadcast of the 16 scales. */
INLINE __m256i q6_quant(__m256i lo4, __m256i H, int k) {
    const __m256i m2 = _mm256_set1_epi8(0x03);
    return _mm256_or_si256(lo4, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2 * k), m2), 4));
}

INLINE void q6_K_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    const ds4_block_q6_K *x = w;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i four = _mm256_set1_epi8(4);
    const __m256i base = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    __m256 acc[NT_MAX];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        __m256i sumi[NT_MAX];
        UNROLL
        for (int t = 0; t < nt; t++) {
            __m256i offs = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)q8k(acts, stride, t, i)->bsums));
            sumi[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(offs, 5));
        }
        UNROLL
        for (int h = 0; h < 2; h++) {
            __m256i A = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            __m256i B = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            __m256i H = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            __m256i scales = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11) : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            __m256i mask = base;
            UNROLL
            for (int k = 0; k < 4; k++) {
                __m256i lo4 = _mm256_and_si256(k < 2 ? (k ? B : A) : _mm256_srli_epi16(k == 3 ? B : A, 4), m4);
                __m256i q = q6_quant(lo4, H, k);
                __m256i sc = _mm256_shuffle_epi8(scales, mask);
                UNROLL
                for (int t = 0; t < nt; t++)
                    sumi[t] = _mm256_add_epi32(sumi[t], madd_u8_scaled(q, q8k(acts, stride, t, i)->qs + 128 * h + 32 * k, sc));
                mask = _mm256_add_epi8(mask, four);
            }
        }
        float dx = h2f(x[i].d);
        UNROLL
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(q8k(acts, stride, t, i)->d * dx), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
    }
    store_sums(acc, nt, out);
}
DOT_ENTRY_POINTS(q6_K)

/* ---- IQ2_XXS x Q8_K ----
 * The signs are applied to the activation (sign_epi8), so the grid bytes
 * stay unsigned for maddubs; Q8_K never holds -128, so negation is exact.
 * iq2_sign8[k] holds the eight ±1 multipliers of 7-bit sign index k: bit
 * j < 7 of k gives element j, and element 7 is negative when k has odd
 * parity (sheet section 6: every group has an even number of negatives).
 * Built by the compiler, so it needs no run-time initialisation. */
#define SGN_BYTE(k, j) ((((k) >> (j)) & 1) ? 0xFFull : 0x01ull) << (8 * (j))
#define SGN_PARITY(k) (((k) ^ (k) >> 1 ^ (k) >> 2 ^ (k) >> 3 ^ (k) >> 4 ^ (k) >> 5 ^ (k) >> 6) & 1)
#define SGN(k)                                                                                        \
    (SGN_BYTE(k, 0) | SGN_BYTE(k, 1) | SGN_BYTE(k, 2) | SGN_BYTE(k, 3) | SGN_BYTE(k, 4) | SGN_BYTE(k, 5) | \
     SGN_BYTE(k, 6) | (SGN_PARITY(k) ? 0xFFull : 0x01ull) << 56)
#define SGN4(k) SGN(k), SGN(k + 1), SGN(k + 2), SGN(k + 3)
#define SGN16(k) SGN4(k), SGN4(k + 4), SGN4(k + 8), SGN4(k + 12)
static const uint64_t iq2_sign8[128] = {SGN16(0),  SGN16(16), SGN16(32), SGN16(48),
                                        SGN16(64), SGN16(80), SGN16(96), SGN16(112)};

INLINE __m256i iq2_sign_bytes(uint32_t W) {
    return _mm256_setr_epi64x((long long)iq2_sign8[W & 127], (long long)iq2_sign8[(W >> 7) & 127],
                              (long long)iq2_sign8[(W >> 14) & 127], (long long)iq2_sign8[(W >> 21) & 127]);
}

/* One token's dot decodes a super-block's eight sign words and scales
 * once, in vector registers, instead of through the table per sub-block
 * (eight scalar steps and four loads, then three steps to assemble the
 * vector): per sub-block there remain a shuffle and three vector steps for
 * the signs and a shuffle for the scale. 2048 x 4096 from L2, one thread,
 * plain avx2, Zen 4, interleaved: 4.0-4.4 -> 4.4-4.8 GB/s. Two to four
 * tokens keep the table, whose steps are mostly scalar: there the vector
 * steps bound the kernel, and this decode measured 4-10% slower.
 * A sub-block's word W holds four 7-bit sign indices and its 4-bit scale;
 * each index becomes its ksigns byte, the index plus bit 7 set to the
 * index's parity (the table's rule), so bit j of byte k is the sign of
 * element 8k + j. The words sit in the dwords of `words` as [W0 W4 W1 W5 |
 * W2 W6 W3 W7] (one blend puts them there); each 128-bit half is then
 * copied to both halves, so that one vpshufb per sub-block spreads its
 * bytes over the 32 elements. */
struct iq2_meta {
    __m256i signs[2]; /* the ksigns bytes of half h of `words`, in both halves */
    __m256i scales[2]; /* 2 * (W >> 28) + 1 in the low byte of each dword, the same way */
};

/* the dword of sub-block b within its half, and the half */
#define IQ2_META_HALF(b) (((b) >> 1) & 1)
#define IQ2_META_POS(b) (2 * ((b) & 1) + ((b) >> 2))

/* per position p: element bytes 0-15 take bytes 4p, 4p + 1 of the half (8
 * each), elements 16-31 bytes 4p + 2, 4p + 3; a scale's 16-bit words take
 * byte 4p and a zero */
#define IQ2_SIGN_CTRL(p)                                                                                                  \
    {4 * (p), 4 * (p), 4 * (p), 4 * (p), 4 * (p), 4 * (p), 4 * (p), 4 * (p), 4 * (p) + 1, 4 * (p) + 1, 4 * (p) + 1,       \
     4 * (p) + 1, 4 * (p) + 1, 4 * (p) + 1, 4 * (p) + 1, 4 * (p) + 1, 4 * (p) + 2, 4 * (p) + 2, 4 * (p) + 2, 4 * (p) + 2,  \
     4 * (p) + 2, 4 * (p) + 2, 4 * (p) + 2, 4 * (p) + 2, 4 * (p) + 3, 4 * (p) + 3, 4 * (p) + 3, 4 * (p) + 3, 4 * (p) + 3, \
     4 * (p) + 3, 4 * (p) + 3, 4 * (p) + 3}
#define IQ2_SCALE_CTRL(p)                                                                                                  \
    {4 * (p), -1, 4 * (p), -1, 4 * (p), -1, 4 * (p), -1, 4 * (p), -1, 4 * (p), -1, 4 * (p), -1, 4 * (p), -1,             \
     4 * (p), -1, 4 * (p), -1, 4 * (p), -1, 4 * (p), -1, 4 * (p), -1, 4 * (p), -1, 4 * (p), -1, 4 * (p), -1}
static const _Alignas(32) int8_t iq2_sign_ctrl[4][32] = {IQ2_SIGN_CTRL(0), IQ2_SIGN_CTRL(1), IQ2_SIGN_CTRL(2),
                                                          IQ2_SIGN_CTRL(3)};
static const _Alignas(32) int8_t iq2_scale_ctrl[4][32] = {IQ2_SCALE_CTRL(0), IQ2_SCALE_CTRL(1), IQ2_SCALE_CTRL(2),
                                                           IQ2_SCALE_CTRL(3)};

INLINE void iq2_meta_decode(const uint8_t *q, struct iq2_meta *m) {
    __m256i words = _mm256_blend_epi32(_mm256_srli_epi64(_mm256_loadu_si256((const __m256i *)q), 32),
                                       _mm256_loadu_si256((const __m256i *)(q + 32)), 0xAA);
    const __m256i m7 = _mm256_set1_epi32(0x7F);
    __m256i idx = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(words, m7), _mm256_and_si256(_mm256_slli_epi32(words, 1), _mm256_slli_epi32(m7, 8))),
        _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(words, 2), _mm256_slli_epi32(m7, 16)),
                        _mm256_and_si256(_mm256_slli_epi32(words, 3), _mm256_slli_epi32(m7, 24))));
    /* bit 0 of each byte becomes the parity of that byte: every shift only
     * brings higher bits of the same byte down to the bits still read */
    __m256i par = _mm256_xor_si256(idx, _mm256_srli_epi32(idx, 4));
    par = _mm256_xor_si256(par, _mm256_srli_epi32(par, 2));
    par = _mm256_xor_si256(par, _mm256_srli_epi32(par, 1));
    __m256i signs = _mm256_or_si256(idx, _mm256_slli_epi32(_mm256_and_si256(par, _mm256_set1_epi32(0x01010101)), 7));
    __m256i scales = _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(words, 28), 1), _mm256_set1_epi32(1));
    m->signs[0] = _mm256_permute2x128_si256(signs, signs, 0x00);
    m->signs[1] = _mm256_permute2x128_si256(signs, signs, 0x11);
    m->scales[0] = _mm256_permute2x128_si256(scales, scales, 0x00);
    m->scales[1] = _mm256_permute2x128_si256(scales, scales, 0x11);
}

/* the ±1 multipliers of sub-block b's 32 elements */
INLINE __m256i iq2_signs(const struct iq2_meta *m, int b) {
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201ll);
    __m256i bytes = _mm256_shuffle_epi8(m->signs[IQ2_META_HALF(b)],
                                        _mm256_load_si256((const __m256i *)iq2_sign_ctrl[IQ2_META_POS(b)]));
    return _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(1));
}

/* sub-block b's scale in every 16-bit word */
INLINE __m256i iq2_scale(const struct iq2_meta *m, int b) {
    return _mm256_shuffle_epi8(m->scales[IQ2_META_HALF(b)],
                               _mm256_load_si256((const __m256i *)iq2_scale_ctrl[IQ2_META_POS(b)]));
}

/* sub-block b of super-block i into slot `slot` of every token; m is the
 * super-block's decoded signs and scales, or NULL for the table */
INLINE void iq2_subblock(const uint8_t *q8, const struct iq2_meta *m, const void *acts, size_t stride, int64_t i, int b,
                         int nt, __m256i sumi[][2], int slot, bool vnni) {
    __m256i grid = _mm256_setr_epi64x((long long)ds4_iq2xxs_grid[q8[0]], (long long)ds4_iq2xxs_grid[q8[1]],
                                      (long long)ds4_iq2xxs_grid[q8[2]], (long long)ds4_iq2xxs_grid[q8[3]]);
    __m256i sgn, scale;
    if (m) {
        sgn = iq2_signs(m, b);
        scale = iq2_scale(m, b);
    } else {
        uint32_t W;
        memcpy(&W, q8 + 4, 4);
        sgn = iq2_sign_bytes(W);
        scale = _mm256_set1_epi16((short)(2 * (W >> 28) + 1));
    }
    UNROLL
    for (int t = 0; t < nt; t++) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(q8k(acts, stride, t, i)->qs + 32 * b));
        __m256i p = _mm256_maddubs_epi16(grid, _mm256_sign_epi8(a, sgn));
        /* AVX-VNNI's vpdpwssd is madd + add in one step, the same exact sum */
        sumi[t][slot] = vnni ? dpwssd(sumi[t][slot], p, scale)
                             : _mm256_add_epi32(sumi[t][slot], _mm256_madd_epi16(p, scale));
    }
}

INLINE void iq2_xxs_rt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out, bool vnni) {
    const ds4_block_iq2_xxs *x = w;
    __m256 acc[NT_MAX];
    UNROLL
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        const uint8_t *q = (const uint8_t *)x[i].qs;
        struct iq2_meta meta;
        if (nt == 1) iq2_meta_decode(q, &meta);
        __m256i sumi[NT_MAX][2];
        UNROLL
        for (int t = 0; t < nt; t++) sumi[t][0] = sumi[t][1] = _mm256_setzero_si256();
        UNROLL
        for (int b = 0; b < 8; b += 2) {
            iq2_subblock(q + 8 * b, nt == 1 ? &meta : NULL, acts, stride, i, b, nt, sumi, 0, vnni);
            iq2_subblock(q + 8 * b + 8, nt == 1 ? &meta : NULL, acts, stride, i, b + 1, nt, sumi, 1, vnni);
        }
        float dx = 0.125f * h2f(x[i].d);
        UNROLL
        for (int t = 0; t < nt; t++)
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dx * q8k(acts, stride, t, i)->d),
                                     _mm256_cvtepi32_ps(_mm256_add_epi32(sumi[t][0], sumi[t][1])), acc[t]);
    }
    store_sums(acc, nt, out);
}
INLINE void iq2_xxs_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    iq2_xxs_rt(w, acts, stride, n, nt, out, false);
}
DOT_ENTRY_POINTS(iq2_xxs)

AVXVNNI INLINE void iq2_xxs_vnni_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {
    iq2_xxs_rt(w, acts, stride, n, nt, out, true);
}
DOT_ENTRY_POINTS_ATTR(iq2_xxs_vnni, AVXVNNI)

/* ---- IQ2_XXS and Q2_K tiles ----
 * The routed experts' matmuls: KT_ROWS row x up to KT_TOKENS tokens packed
 * once per group (kq_pack), each weight super-block decoded once for the
 * group (the multi-token kernels above decode it once per 8 tokens and pay
 * per-token steps the decoded form makes unnecessary). Both build each
 * lane of each super-block's integer vector as the dot does -- lane k the
 * exact sum of the products of elements 4k..4k+3 of every 32-element chunk,
 * each times its sub-block scale -- and run the dot's float steps on it in
 * the dot's order, so every (row, token) equals the dot bit for bit. Where
 * the CPU has AVX-VNNI, vpdpwssd (IQ2_XXS) and vpdpbusd (Q2_K) replace the
 * widening and adding steps: the same exact sums, so the same bits with or
 * without it. */
/* One row per tile: with two (each activation load serving both) the
 * decoded rows no longer fit the 16 registers, and the tiles measured
 * slower than with one (2048 x 4096 IQ2_XXS, 12 tokens, 1 thread, AMD
 * EPYC: 1.21x against 1.47x over the multi-token kernel; Q2_K 4096 x 2048
 * 1.47x against 1.93x). IQ2_XXS up to 4 tokens stays with the multi-token
 * kernel, which runs 3 tokens in one pass (the tile against it, 512 x 4096,
 * Zen 4: 0.89x at 3, 0.90x at 4, 1.28x at 5); Q2_K's tile wins
 * from 2 (1.22x; 1.87x at 12). */
enum { KT_ROWS = 1, KT_TOKENS = 16, IQ2_TILE_MIN_TOKENS = 5, Q2K_TILE_MIN_TOKENS = 2 };

/* per super-block, per token: the 256 quants (plus 128 for IQ2_XXS, below)
 * and the 16 bsums, 288 bytes; after all super-blocks the activation
 * scales d[super-block][token] */
enum { KT_SLOT = DS4_QK_K + 32 };

INLINE bool kq_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes,
                    bool offset) {
    const int64_t nb = n / DS4_QK_K;
    if ((size_t)nb * (size_t)nt * (KT_SLOT + sizeof(float)) > packed_bytes) return false;
    uint8_t *p = packed;
    float *d = (float *)(p + (size_t)nb * (size_t)nt * KT_SLOT);
    const __m256i bias = _mm256_set1_epi8(offset ? (char)0x80 : 0);
    for (int64_t i = 0; i < nb; i++)
        for (int t = 0; t < nt; t++, p += KT_SLOT) {
            const ds4_block_q8_K *y = q8k(acts, stride, t, i);
            for (int k = 0; k < DS4_QK_K; k += 32)
                _mm256_store_si256((__m256i *)(p + k), _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(y->qs + k)), bias));
            _mm256_store_si256((__m256i *)(p + DS4_QK_K), _mm256_loadu_si256((const __m256i *)y->bsums));
            d[i * nt + t] = y->d;
        }
    return true;
}

/* IQ2_XXS: the signs go onto the weights (signed bytes, |w| <= 43), and the
 * activations are packed as a + 128 (unsigned, a != -128 in Q8_K), so one
 * vpmaddubsw per (row, token, sub-block) gives words (a0 + 128) w0 + (a1 +
 * 128) w1, at most 2 * 255 * 43 < 2^15, and the vpmaddwd by the scale puts
 * scale * (its four w * a) + scale * 128 * (its four w) into each lane. The
 * second part depends on the row alone: each token's sum starts from
 * `corr`, its negation, which leaves exactly the dot's lane. */
struct kt_iq2 {
    __m256i w[8], scale[8], corr;
    float dx;
};

INLINE void kt_iq2_decode(const ds4_block_iq2_xxs *x, struct kt_iq2 *s) {
    const uint8_t *q = (const uint8_t *)x->qs;
    __m256i bias = _mm256_setzero_si256();
    UNROLL
    for (int b = 0; b < 8; b++) {
        uint32_t W;
        memcpy(&W, q + 8 * b + 4, 4);
        __m256i grid = _mm256_setr_epi64x((long long)ds4_iq2xxs_grid[q[8 * b]], (long long)ds4_iq2xxs_grid[q[8 * b + 1]],
                                          (long long)ds4_iq2xxs_grid[q[8 * b + 2]], (long long)ds4_iq2xxs_grid[q[8 * b + 3]]);
        s->w[b] = _mm256_sign_epi8(grid, iq2_sign_bytes(W));
        s->scale[b] = _mm256_set1_epi16((short)(2 * (W >> 28) + 1));
        bias = _mm256_add_epi32(bias, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8((char)0x80), s->w[b]), s->scale[b]));
    }
    s->corr = _mm256_sub_epi32(_mm256_setzero_si256(), bias);
    s->dx = 0.125f * h2f(x->d);
}

/* Q2_K: each 2-bit quant times its sub-block scale is at most 45, still a
 * byte, so the scale goes into the weights once per row (a word multiply:
 * the low byte's product cannot carry into the high one), and a token's
 * chunk is one vpdpbusd, or vpmaddubsw pairs (at most 2 * 45 * 128) of two
 * chunks added as words (at most 23040) then widened by vpmaddwd. */
struct kt_q2k {
    __m256i w[8], mins16;
    float d, dmin;
};

INLINE void kt_q2k_decode(const ds4_block_q2_K *x, struct kt_q2k *s) {
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i sc8 = _mm_loadu_si128((const __m128i *)x->scales);
    s->mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
    __m256i scales = _mm256_broadcastsi128_si256(_mm_and_si128(sc8, m4)), mask = q2_K_scale_mask0();
    UNROLL
    for (int h = 0; h < 2; h++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        UNROLL
        for (int k = 0; k < 4; k++) {
            __m256i qk = _mm256_and_si256(_mm256_srli_epi16(q, 2 * k), _mm256_set1_epi8(3));
            s->w[4 * h + k] = _mm256_mullo_epi16(qk, _mm256_shuffle_epi8(scales, mask));
            mask = _mm256_add_epi8(mask, _mm256_set1_epi8(2));
        }
    }
    s->d = h2f(x->d);
    s->dmin = h2f(x->dmin);
}

INLINE void kt_tile(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                    int64_t y_stride, bool q2k, bool vnni) {
    const int64_t nb = n / DS4_QK_K;
    const uint8_t *au = packed;
    const float *da = (const float *)(au + (size_t)nb * (size_t)nt * KT_SLOT);
    const size_t block_bytes = q2k ? sizeof(ds4_block_q2_K) : sizeof(ds4_block_iq2_xxs);
    __m256 acc[KT_ROWS][KT_TOKENS];
    for (int t = 0; t < nt; t++)
        UNROLL
        for (int r = 0; r < KT_ROWS; r++) acc[r][t] = _mm256_setzero_ps();
    const char *prefetch[KT_ROWS];
    UNROLL
    for (int r = 0; r < KT_ROWS; r++) prefetch[r] = prefetch_cursor((const uint8_t *)w + row_bytes * (size_t)r);
    for (int64_t i = 0; i < nb; i++) {
        struct kt_iq2 iq[KT_ROWS];
        struct kt_q2k q2[KT_ROWS];
        UNROLL
        for (int r = 0; r < KT_ROWS; r++) {
            const uint8_t *x = (const uint8_t *)w + row_bytes * (size_t)r + block_bytes * (size_t)i;
            prefetch_lines(&prefetch[r], x + block_bytes);
            if (q2k) kt_q2k_decode((const ds4_block_q2_K *)x, &q2[r]);
            else kt_iq2_decode((const ds4_block_iq2_xxs *)x, &iq[r]);
        }
        for (int t = 0; t < nt; t++) {
            const uint8_t *a = au + ((size_t)i * (size_t)nt + (size_t)t) * KT_SLOT;
            const float d_a = da[i * nt + t];
            __m256i sumi[KT_ROWS];
            if (q2k) {
                UNROLL
                for (int r = 0; r < KT_ROWS; r++) sumi[r] = _mm256_setzero_si256();
                UNROLL
                for (int c = 0; c < 8; c += 2) {
                    __m256i a0 = _mm256_load_si256((const __m256i *)(a + 32 * c));
                    __m256i a1 = _mm256_load_si256((const __m256i *)(a + 32 * c + 32));
                    UNROLL
                    for (int r = 0; r < KT_ROWS; r++) {
                        if (vnni) {
                            sumi[r] = dpbusd(dpbusd(sumi[r], q2[r].w[c], a0), q2[r].w[c + 1], a1);
                        } else {
                            __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(q2[r].w[c], a0),
                                                         _mm256_maddubs_epi16(q2[r].w[c + 1], a1));
                            sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
                        }
                    }
                }
                __m256i bsums = _mm256_load_si256((const __m256i *)(a + DS4_QK_K));
                UNROLL
                for (int r = 0; r < KT_ROWS; r++) {
                    /* fold_affine's steps */
                    __m256i m = _mm256_madd_epi16(q2[r].mins16, bsums);
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(d_a * q2[r].d), _mm256_cvtepi32_ps(sumi[r]), acc[r][t]);
                    acc[r][t] = _mm256_fnmadd_ps(_mm256_set1_ps(d_a * q2[r].dmin), _mm256_cvtepi32_ps(m), acc[r][t]);
                }
            } else {
                UNROLL
                for (int r = 0; r < KT_ROWS; r++) sumi[r] = iq[r].corr;
                UNROLL
                for (int b = 0; b < 8; b++) {
                    __m256i av = _mm256_load_si256((const __m256i *)(a + 32 * b));
                    UNROLL
                    for (int r = 0; r < KT_ROWS; r++) {
                        __m256i p = _mm256_maddubs_epi16(av, iq[r].w[b]);
                        sumi[r] = vnni ? dpwssd(sumi[r], p, iq[r].scale[b])
                                       : _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, iq[r].scale[b]));
                    }
                }
                UNROLL
                for (int r = 0; r < KT_ROWS; r++)
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(iq[r].dx * d_a), _mm256_cvtepi32_ps(sumi[r]), acc[r][t]);
            }
        }
    }
    for (int t = 0; t < nt; t++)
        UNROLL
        for (int r = 0; r < KT_ROWS; r++) y[t * y_stride + r] = hsum_ps(acc[r][t]);
}

static bool iq2_xxs_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes) {
    return kq_pack(acts, stride, n, nt, packed, packed_bytes, true);
}
static bool q2_K_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes) {
    return kq_pack(acts, stride, n, nt, packed, packed_bytes, false);
}

#define KT_TILE(name, q2k, vnni, attr)                                                                       \
    attr static void name(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,  \
                          int64_t y_stride) {                                                                \
        kt_tile(w, row_bytes, packed, n, nt, y, y_stride, q2k, vnni);                                        \
    }
KT_TILE(iq2_xxs_tile, false, false, )
KT_TILE(iq2_xxs_vnni_tile, false, true, AVXVNNI)
KT_TILE(q2_K_tile, true, false, )
KT_TILE(q2_K_vnni_tile, true, true, AVXVNNI)

/* ---- activation quantization, byte-identical to ds4_quantize_row ---- */

static inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

/* The largest magnitude of n floats (a multiple of 8) as bits, by an integer
 * max: magnitudes order like their bit patterns, so a finite block gets
 * exactly the float maximum, and a NaN or infinity anywhere gives bits >=
 * INF_BITS whatever its lane (the float max would drop a NaN by operand
 * order). Such blocks go to the reference quantizer, which makes them
 * total (quant.c); the others never meet a value the fast path mishandles. */
enum { INF_BITS = 0x7F800000 };
static inline int32_t amax_bits(const float *x, int n) {
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i mx = _mm256_setzero_si256();
    for (int k = 0; k < n; k += 8) mx = _mm256_max_epi32(mx, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + k)), magnitude));
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(mx), _mm256_extracti128_si256(mx, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4E));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xB1));
    return _mm_cvtsi128_si32(m);
}

/* 32 integral floats (within int8 range) to bytes in element order: the
 * two packs interleave 128-bit lanes, the dword permute undoes it */
static inline __m256i pack_i8(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    __m256i p01 = _mm256_packs_epi32(_mm256_cvttps_epi32(v0), _mm256_cvttps_epi32(v1));
    __m256i p23 = _mm256_packs_epi32(_mm256_cvttps_epi32(v2), _mm256_cvttps_epi32(v3));
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* roundf: ties away from zero. v - trunc(v) is exact, so the tie test is. */
static inline __m256 round_away(__m256 v) {
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 up = _mm256_cmp_ps(abs_ps(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 step = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(up, step));
}

READ_SUM_KERNEL(ds4_kernels_avx2_read_sum, 32)

void ds4_kernels_avx2_quantize_q8_0(const float *x, ds4_block_q8_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / DS4_QK8_0; b++, x += DS4_QK8_0) {
        const int32_t bits = amax_bits(x, DS4_QK8_0);
        if (bits >= INF_BITS) {
            ds4_quantize_row(DS4_TYPE_Q8_0, x, &y[b], DS4_QK8_0, NULL);
            continue;
        }
        float amax;
        memcpy(&amax, &bits, sizeof amax);
        float d = amax / 127.0f, id = 1.0f / d;
        if (!(id <= FLT_MAX)) id = 0.0f; /* as the reference: d is 0 or subnormal */
        y[b].d = ds4_f32_to_half(d);
        __m256 v[4], vid = _mm256_set1_ps(id);
        for (int k = 0; k < 4; k++) v[k] = round_away(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vid));
        _mm256_storeu_si256((__m256i *)y[b].qs, pack_i8(v[0], v[1], v[2], v[3]));
    }
}

/* Σ of each 16-byte group of four 32-byte vectors: per vector the dword
 * sums of 4; two hadds leave the 8 groups in [0,2,4,6 | 1,3,5,7] order */
static inline __m256i group_sums8(const __m256i q[4]) {
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256i s[4];
    for (int k = 0; k < 4; k++) s[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q[k]), ones16);
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    return _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void ds4_kernels_avx2_quantize_q8_K(const float *x, ds4_block_q8_K *y, int64_t n) {
    for (int64_t b = 0; b < n / DS4_QK_K; b++, x += DS4_QK_K) {
        const int32_t bits = amax_bits(x, DS4_QK_K);
        if (bits >= INF_BITS) {
            ds4_quantize_row(DS4_TYPE_Q8_K, x, &y[b], DS4_QK_K, NULL);
            continue;
        }
        float amax;
        memcpy(&amax, &bits, sizeof amax);
        /* the reference keeps the first element of largest magnitude; a
         * finite amax is some element's, so the scan stops inside the block */
        int e = 0;
        while (fabsf(x[e]) != amax) e++;
        float iscale = -127.0f / x[e];
        if (!(fabsf(iscale) <= FLT_MAX)) { /* as the reference: 0 or tiny, a zero block */
            memset(&y[b], 0, sizeof(y[b]));
            continue;
        }
        __m256 vs = _mm256_set1_ps(iscale), lim = _mm256_set1_ps(127.0f);
        __m256i q[8];
        for (int g = 0; g < 8; g++) {
            __m256 v[4];
            for (int k = 0; k < 4; k++)
                v[k] = _mm256_min_ps(lim, _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * g + 8 * k), vs),
                                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            q[g] = pack_i8(v[0], v[1], v[2], v[3]);
            _mm256_storeu_si256((__m256i *)(y[b].qs + 32 * g), q[g]);
        }
        __m256i bs = _mm256_packs_epi32(group_sums8(q), group_sums8(q + 4));
        _mm256_storeu_si256((__m256i *)y[b].bsums, _mm256_permute4x64_epi64(bs, 0xD8));
        y[b].d = 1.0f / iscale;
    }
}

#define K_QUANTS                                                                                    \
    case DS4_TYPE_Q2_K: return DOT_KERNELS(q2_K);                                                   \
    case DS4_TYPE_Q4_K: return DOT_KERNELS(q4_K);                                                   \
    case DS4_TYPE_Q5_K: return DOT_KERNELS(q5_K);                                                   \
    case DS4_TYPE_Q6_K: return DOT_KERNELS(q6_K);

/* the AVX-VNNI kernels where they are on (ds4_kernels_avxvnni): Q8_0 and
 * IQ2_XXS (one step less per sub-block: dot 1.03-1.04x, 2 tokens 1.12x) */
struct ds4_dot_kernels ds4_kernels_avx2_dots(uint32_t type) {
    if (ds4_kernels_avxvnni() && type == DS4_TYPE_Q8_0) return DOT_KERNELS(q8_0_vnni);
    if (ds4_kernels_avxvnni() && type == DS4_TYPE_IQ2_XXS) return DOT_KERNELS(iq2_xxs_vnni);
    DISPATCH(K_QUANTS)
}

bool ds4_kernels_avx2_tile(uint32_t type, struct ds4_tile_kernel *k) {
    const bool vnni = ds4_kernels_avxvnni();
    if (float_tile_kernel(type, k)) return true;
    switch (type) {
    case DS4_TYPE_Q8_0:
        *k = vnni ? (struct ds4_tile_kernel){Q8_TILE_ROWS, 1, Q8V_TILE_TOKENS, q8_0_vnni_pack, q8_0_vnni_tile, NULL}
                  : (struct ds4_tile_kernel){Q8_TILE_ROWS, 1, Q8_TILE_TOKENS, q8_0_pack, q8_0_tile, NULL};
        return true;
    case DS4_TYPE_IQ2_XXS:
        *k = (struct ds4_tile_kernel){KT_ROWS, IQ2_TILE_MIN_TOKENS, KT_TOKENS, iq2_xxs_pack,
                                      vnni ? iq2_xxs_vnni_tile : iq2_xxs_tile, NULL};
        return true;
    case DS4_TYPE_Q2_K:
        *k = (struct ds4_tile_kernel){KT_ROWS, Q2K_TILE_MIN_TOKENS, KT_TOKENS, q2_K_pack,
                                      vnni ? q2_K_vnni_tile : q2_K_tile, NULL};
        return true;
    default: return false;
    }
}
