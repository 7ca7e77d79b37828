/* kernels_cpu_float_tile.h -- the matmul tile of the float weight types
 * (F32, F16, BF16 against f32 activations), written once for the AVX2 and
 * AVX-512 files.
 *
 * Contract
 * - Included by an ISA file after kernels_cpu_simd.h and after it defines
 *   its vector primitives: the type ft_vec of FT_LANES floats; ft_zero();
 *   ft_weights(k, row, i, end) and ft_acts(a, i, end), the FT_LANES
 *   elements from i of a weight row and an activation row, those at or
 *   past `end` read as 0 where a level reads partial vectors; ft_fma(w, a,
 *   acc); ft_tail_end(n), where its dot's vector steps stop; and
 *   ft_result(k, w, a, n, chain0, chain1), its dot's result from the two
 *   chains. FT_ROWS (a multiple of FT_SUB_ROWS) and FT_SUB_ROWS, with
 *   FT_SUB_ROWS x FT_TOKENS accumulators plus FT_SUB_ROWS weight vectors
 *   fitting its register file.
 * - It defines f32_tile, f16_tile, bf16_tile (FT_ROWS rows x 2..FT_TOKENS
 *   tokens; float_pack packs for them) and float_tile_kernel().
 * - Per (row, token) the float order is the level's dot's: chain 0 takes
 *   the vectors at [2jL, 2jL + L) of every whole 2L elements (L =
 *   FT_LANES) and then the vectors of the tail up to ft_tail_end(n), chain
 *   1 those at [2jL + L, 2jL + 2L), each in ascending order; ft_result
 *   finishes. So a (row, token) result is the dot's, bit for bit.
 *
 * Why a tile: the per-row kernel reloads every token's activations for
 * every row, from L2 once a few tokens of 4096 floats fill L1, and that
 * traffic, not arithmetic, bounded it on few long rows (the 24 x 16384 HC
 * mixes). The tile converts each weight vector once for its tokens, loads
 * each activation vector once for the FT_SUB_ROWS rows it holds in
 * registers, and runs its FT_ROWS rows over FT_K elements at a time, so a
 * token group's slice of activations stays in L1 while every row reads it;
 * the partial chains wait in memory between slices.
 */
#ifndef DS4_KERNELS_CPU_FLOAT_TILE_H
#define DS4_KERNELS_CPU_FLOAT_TILE_H

enum { FT_TOKENS = 4, FT_K = 1024 };
_Static_assert(FT_K % (2 * FT_LANES) == 0, "a slice holds whole chain pairs");
_Static_assert(FT_ROWS % FT_SUB_ROWS == 0, "the tile's rows are whole register blocks");

/* elements [i0, i1) of one chain (a vector every `step` elements from i0)
 * for the FT_SUB_ROWS rows at w, on their chain accumulators in memory */
INLINE void float_tile_span(enum float_kind k, const void *w, size_t row_bytes, struct float_group g, int64_t i0,
                            int64_t i1, int64_t step, bool prefetch, int nt, ft_vec *acc) {
    ft_vec sum[FT_SUB_ROWS][FT_TOKENS];
    UNROLL
    for (int r = 0; r < FT_SUB_ROWS; r++)
        UNROLL
        for (int t = 0; t < nt; t++) sum[r][t] = acc[r * FT_TOKENS + t];
    for (int64_t i = i0; i < i1; i += step) {
        ft_vec wv[FT_SUB_ROWS];
        UNROLL
        for (int r = 0; r < FT_SUB_ROWS; r++) {
            const uint8_t *row = (const uint8_t *)w + row_bytes * (size_t)r;
            /* on the first chain's pass (i a multiple of the chain pair),
             * each line that starts in the pair's elements once */
            if (prefetch) prefetch_float_lines(k, row, i, 2 * FT_LANES);
            wv[r] = ft_weights(k, row, i, i1);
        }
        UNROLL
        for (int t = 0; t < nt; t++) {
            const ft_vec a = ft_acts((const float *)tok(g.acts, g.stride, t), i, i1);
            UNROLL
            for (int r = 0; r < FT_SUB_ROWS; r++) sum[r][t] = ft_fma(wv[r], a, sum[r][t]);
        }
    }
    UNROLL
    for (int r = 0; r < FT_SUB_ROWS; r++)
        UNROLL
        for (int t = 0; t < nt; t++) acc[r * FT_TOKENS + t] = sum[r][t];
}

INLINE void float_tile_nt(enum float_kind k, const void *w, size_t row_bytes, const void *packed, int64_t n, int nt,
                          float *y, int64_t y_stride) {
    const struct float_group g = float_group(packed);
    const int64_t pair = 2 * FT_LANES, whole = n / pair * pair;
    ft_vec acc[2][FT_ROWS][FT_TOKENS]; /* [chain][row][token] */
    for (int c = 0; c < 2; c++)
        for (int r = 0; r < FT_ROWS; r++)
            for (int t = 0; t < FT_TOKENS; t++) acc[c][r][t] = ft_zero();
    for (int64_t k0 = 0; k0 < whole; k0 += FT_K) {
        const int64_t k1 = k0 + FT_K < whole ? k0 + FT_K : whole;
        for (int chain = 0; chain < 2; chain++)
            for (int r = 0; r < FT_ROWS; r += FT_SUB_ROWS)
                float_tile_span(k, (const uint8_t *)w + row_bytes * (size_t)r, row_bytes, g, k0 + FT_LANES * chain, k1,
                                pair, chain == 0, nt, &acc[chain][r][0]);
    }
    for (int r = 0; r < FT_ROWS; r += FT_SUB_ROWS)
        float_tile_span(k, (const uint8_t *)w + row_bytes * (size_t)r, row_bytes, g, whole, ft_tail_end(n), FT_LANES,
                        false, nt, &acc[0][r][0]);
    for (int r = 0; r < FT_ROWS; r++)
        for (int t = 0; t < nt; t++)
            y[t * y_stride + r] = ft_result(k, (const uint8_t *)w + row_bytes * (size_t)r, tok(g.acts, g.stride, t), n,
                                            acc[0][r][t], acc[1][r][t]);
}

/* nt known at compile time in each branch: the token loops unroll */
#define FLOAT_TILE(name, kind)                                                                                 \
    static void name(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,         \
                     int64_t y_stride) {                                                                       \
        if (nt >= 4) float_tile_nt(kind, w, row_bytes, packed, n, 4, y, y_stride);                             \
        else if (nt == 3) float_tile_nt(kind, w, row_bytes, packed, n, 3, y, y_stride);                        \
        else float_tile_nt(kind, w, row_bytes, packed, n, 2, y, y_stride);                                     \
    }
FLOAT_TILE(f32_tile, KIND_F32)
FLOAT_TILE(f16_tile, KIND_F16)
FLOAT_TILE(bf16_tile, KIND_BF16)
#undef FLOAT_TILE

/* the tile of a float type; false for the others */
static inline bool float_tile_kernel(uint32_t type, struct ds4_tile_kernel *k) {
    void (*tile)(const void *, size_t, const void *, int64_t, int, float *, int64_t) =
        type == DS4_TYPE_F32 ? f32_tile : type == DS4_TYPE_F16 ? f16_tile : type == DS4_TYPE_BF16 ? bf16_tile : NULL;
    if (!tile) return false;
    *k = (struct ds4_tile_kernel){FT_ROWS, 2, FT_TOKENS, float_pack, tile, NULL};
    return true;
}

#endif
