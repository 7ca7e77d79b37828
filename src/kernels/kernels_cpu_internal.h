/* kernels_cpu_internal.h -- private glue between kernels_cpu.c (dispatch,
 * drivers) and the ISA-specific files kernels_cpu_avx2.c / _avx512.c /
 * _amx.c.
 *
 * - A dot function computes one weight row (n elements of its type) against
 *   an activation already in the partner format (ds4_quantize_act), with
 *   n a multiple of the type's block size.
 * - A dotn function does the same for nt <= DS4_DOT_TOKENS activation rows at once
 *   (act_stride bytes apart), unpacking each weight block only once: the
 *   matmul micro-kernel. Its result per token equals the dot function's.
 * - A tile kernel does `rows` weight rows (row_bytes apart) x a group of
 *   nt activation rows, writing y[t * y_stride + r]: the matmul kernel
 *   proper, where one weight load (and decode) serves several tokens and one
 *   activation load several rows. nt is any of min_tokens..tokens (with
 *   fewer tokens the tile costs more than the per-row kernels). pack()
 *   first lays a group of nt activation rows out for tile() (once per
 *   group, reused for every row), or returns false when packed_bytes is too
 *   small; the buffer is 64-byte aligned. Its result per (row, token)
 *   equals the dot function's.
 * - Each ISA file returns NULL for types it has no kernel for; the
 *   dispatcher then falls back to the next lower level (AMX -> AVX-512 ->
 *   AVX2 -> scalar reference). A type with an AMX dot takes its tile from
 *   the AMX file too, or none: the AVX-512 tiles run another float order.
 *   Calling anything from an ISA file is only allowed after the CPU/OS
 *   probe has cleared that level.
 */
#ifndef DS4_KERNELS_CPU_INTERNAL_H
#define DS4_KERNELS_CPU_INTERNAL_H

#include <stdint.h>

#include "kernels/quant.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#define DS4_DOT_TOKENS 8
/* Weight streams are prefetched this many bytes ahead of the row being
 * read (kernels_cpu.c explains why): by the matvec driver, row by row, or by
 * a kernel itself, line by line, where ds4_kernels_self_prefetch() says so;
 * the AVX-512 Q8_0 tile, which streams four rows at once, half as far. A
 * single row's stream is prefetched only where ds4_kernels_stream_prefetch()
 * says so. */
#define DS4_PREFETCH_AHEAD 2048

typedef float (*ds4_dot_fn)(const void *w, const void *act, int64_t n);
typedef void (*ds4_dotn_fn)(const void *w, const void *acts, size_t act_stride, int64_t n, int nt, float *out);
/* y[r] for rows r < rows (row_bytes apart) against one activation row */
typedef void (*ds4_rows_fn)(const void *w, size_t row_bytes, int64_t rows, const void *act, int64_t n, float *y);
/* a level's per-row kernels of a type, all three the same arithmetic (so
 * the same bits per row and token); all NULL where the level has none */
struct ds4_dot_kernels {
    ds4_dot_fn dot;
    ds4_dotn_fn dotn;
    ds4_rows_fn rows;
};
struct ds4_tile_kernel {
    int rows, min_tokens, tokens;
    bool (*pack)(const void *acts, size_t act_stride, int64_t n, int nt, void *packed, size_t packed_bytes);
    void (*tile)(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y, int64_t y_stride);
    /* the same products, bit for bit, for rows read from memory rather than
     * cache (the first token group over a block of rows), where passes
     * ordered for memory parallelism win; NULL: tile */
    void (*tile_from_memory)(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                             int64_t y_stride);
};
/* A tile kernel for the last nr < rows rows of a matrix (same packing, same
 * results); where a level has none, those rows go through the per-row
 * kernels. */
typedef void (*ds4_tile_rows_fn)(const void *w, size_t row_bytes, const void *packed, int64_t n, int nt, float *y,
                                 int64_t y_stride, int nr);

bool ds4_kernels_self_prefetch(uint32_t type);   /* at the level in use */
/* ds4_kernels_stream_prefetch() for the kernels' inner loops: 1 on, 0 off,
 * -1 before the CPU probe (on) */
extern _Atomic int ds4_stream_prefetch_state;

struct ds4_dot_kernels ds4_kernels_avx2_dots(uint32_t type);
bool ds4_kernels_avx2_tile(uint32_t type, struct ds4_tile_kernel *k); /* false: none for the type */
struct ds4_dot_kernels ds4_kernels_avx512_dots(uint32_t type);
bool ds4_kernels_avx512_tile(uint32_t type, struct ds4_tile_kernel *k); /* false: none for the type */
struct ds4_dot_kernels ds4_kernels_amx_dots(uint32_t type);
bool ds4_kernels_amx_tile(uint32_t type, struct ds4_tile_kernel *k);
ds4_tile_rows_fn ds4_kernels_amx_tile_rows(uint32_t type); /* non-NULL exactly where _tile is true */

/* fn(x, n): the plain read loop of ds4_read_sum with vec_bytes-wide loads
 * (the widest of the including file's ISA), four independent chains, and
 * every line prefetched DS4_PREFETCH_AHEAD bytes ahead as the weight
 * kernels do (where ds4_kernels_stream_prefetch() says so), so no kernel's
 * weight stream can beat it by reading smarter.
 * The loads are straight vector loads of a may_alias, 4-byte-aligned vector
 * type: a memcpy into a vector array here was compiled (GCC 12, AVX2) to
 * 16-byte loads stored to the stack and reloaded as 32 bytes, a
 * store-forwarding stall per vector that held the loop to 3-4 GB/s on a
 * core whose kernels streamed 20-30. */
#define READ_SUM_KERNEL(fn, vec_bytes)                                                        \
    uint32_t fn(const void *words, int64_t n) {                                              \
        const uint32_t *x = words;                                                           \
        typedef uint32_t vec __attribute__((vector_size(vec_bytes), aligned(4), may_alias)); \
        enum { LANES = (vec_bytes) / 4 };                                                    \
        vec a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                          \
        const bool prefetch = ds4_kernels_stream_prefetch();                                 \
        int64_t i = 0;                                                                       \
        for (; i + 4 * LANES <= n; i += 4 * LANES) {                                        \
            const vec *v = (const vec *)(x + i);                                             \
            if (prefetch)                                                                    \
                for (int l = 0; l < 4 * (vec_bytes); l += 64)                                \
                    __builtin_prefetch((const char *)v + DS4_PREFETCH_AHEAD + l, 0, 3);      \
            a0 += v[0];                                                                      \
            a1 += v[1];                                                                      \
            a2 += v[2];                                                                      \
            a3 += v[3];                                                                      \
        }                                                                                    \
        a0 += a1 + (a2 + a3);                                                                \
        uint32_t s = 0;                                                                      \
        for (int l = 0; l < LANES; l++) s += a0[l];                                          \
        for (; i < n; i++) s += x[i];                                                        \
        return s;                                                                            \
    }

uint32_t ds4_kernels_avx2_read_sum(const void *x, int64_t n);
uint32_t ds4_kernels_avx512_read_sum(const void *x, int64_t n);

/* activation quantizers, byte-identical to ds4_quantize_row's */
void ds4_kernels_avx2_quantize_q8_0(const float *x, ds4_block_q8_0 *y, int64_t n);
void ds4_kernels_avx2_quantize_q8_K(const float *x, ds4_block_q8_K *y, int64_t n);

#endif
