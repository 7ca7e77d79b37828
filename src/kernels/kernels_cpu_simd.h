/* kernels_cpu_simd.h -- helpers shared by the ISA files kernels_cpu_avx2.c
 * and kernels_cpu_avx512.c (and only them).
 *
 * Contract
 * - Included only by files compiled with at least the AVX2 flags
 *   (-mavx2 -mfma -mf16c); everything here is valid at that level, so the
 *   AVX-512 file can share it. The ISA files get <immintrin.h> from here
 *   only (the SIMDe shim of tests/kernels/test_avx512_emulated.sh has no
 *   include guard).
 * - Every kernel is written once as NAME_nt(w, acts, stride, n, nt, out)
 *   for nt activation rows; DOT_ENTRY_POINTS(NAME) derives the dot (nt =
 *   1), the matmul micro-kernel (nt = 1..DS4_DOT_TOKENS, run as
 *   straight-line groups of 8, 4, 3, 2 and 1) and the matvec over a run of
 *   rows (the dot of each, inlined in one loop) from it, so all run the same
 *   per-token arithmetic; DOT_KERNELS(NAME) is the three as a struct
 *   ds4_dot_kernels.
 */
#ifndef DS4_KERNELS_CPU_SIMD_H
#define DS4_KERNELS_CPU_SIMD_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels_cpu_internal.h"
#include "kernels/quant.h"

#define INLINE static inline __attribute__((always_inline))
#define NT_MAX DS4_DOT_TOKENS
/* dotn runs any count as groups of 8, 4, 3, 2 and 1 tokens: five
 * straight-line instances per kernel (one per count 1..8 made the sanitizer
 * builds of the ISA files 10-20x slower to compile; 3 is there because
 * small expert batches of 3 tokens are common and 2 + 1 passes cost 1.5x
 * one pass of 3) */
_Static_assert(NT_MAX == 8, "DOT_ENTRY_POINTS splits counts into 8, 4, 3, 2, 1");
/* the fixed-count loops over tokens and sub-blocks must become straight-line
 * code: lane masks and shift counts then fold to immediates */
#define UNROLL _Pragma("GCC unroll 8")

INLINE float h2f(ds4_half h) { return _cvtsh_ss(h); }

/* whether a kernel reading one row asks for its lines itself
 * (ds4_kernels_stream_prefetch) */
INLINE bool stream_prefetch(void) {
    return atomic_load_explicit(&ds4_stream_prefetch_state, memory_order_relaxed) != 0;
}

/* one line of the weight stream DS4_PREFETCH_AHEAD bytes on: interleaved with
 * the arithmetic, so requests never queue up in a burst */
INLINE void prefetch_weights(const void *p) { _mm_prefetch((const char *)p + DS4_PREFETCH_AHEAD, _MM_HINT_T0); }

/* The same for kernels whose blocks are no whole number of lines (IQ2_XXS
 * 66 bytes, Q2_K 84), where one prefetch per block would skip a line every
 * few blocks: a cursor that requests every line of the row once, each
 * DS4_PREFETCH_AHEAD bytes before the kernel reads it. Start it at the row
 * with prefetch_cursor(w); before reading up to `end`, call
 * prefetch_lines(&cursor, end). */
INLINE const char *prefetch_cursor(const void *w) {
    return (const char *)((uintptr_t)((const char *)w + DS4_PREFETCH_AHEAD) & ~(uintptr_t)63);
}
INLINE void prefetch_lines(const char **cursor, const void *end) {
    for (const char *stop = (const char *)end + DS4_PREFETCH_AHEAD; *cursor < stop; *cursor += 64)
        _mm_prefetch(*cursor, _MM_HINT_T0);
}

/* activation row t of a token batch */
INLINE const void *tok(const void *acts, size_t stride, int t) { return (const uint8_t *)acts + stride * (size_t)t; }

/* attr: function attributes of both, e.g. the target of an ISA extension
 * the kernel needs beyond the file's flags */
#define DOT_ENTRY_POINTS_ATTR(name, attr)                                                           \
    attr static float dot_##name(const void *w, const void *act, int64_t n) {                      \
        float r;                                                                                    \
        name##_nt(w, act, 0, n, 1, &r);                                                             \
        return r;                                                                                   \
    }                                                                                               \
    attr static void dotn_##name(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) { \
        for (int t = 0; t < nt;) {                                                                  \
            const void *a = tok(acts, stride, t);                                                   \
            if (nt - t >= 8) { name##_nt(w, a, stride, n, 8, out + t); t += 8; }                    \
            else if (nt - t >= 4) { name##_nt(w, a, stride, n, 4, out + t); t += 4; }               \
            else if (nt - t >= 3) { name##_nt(w, a, stride, n, 3, out + t); t += 3; }               \
            else if (nt - t >= 2) { name##_nt(w, a, stride, n, 2, out + t); t += 2; }               \
            else { name##_nt(w, a, stride, n, 1, out + t); t += 1; }                                \
        }                                                                                           \
    }                                                                                               \
    attr static void rows_##name(const void *w, size_t row_bytes, int64_t rows, const void *act, int64_t n,        \
                                 float *y) {                                                                   \
        for (int64_t r = 0; r < rows; r++) name##_nt((const uint8_t *)w + row_bytes * (size_t)r, act, 0, n, 1, y + r); \
    }
#define DOT_ENTRY_POINTS(name) DOT_ENTRY_POINTS_ATTR(name, )

/* float weights: one float_nt(kind, ...) per file, three kernels from it */
enum float_kind { KIND_F32, KIND_F16, KIND_BF16 };

#define FLOAT_KERNELS                                                                                         \
    INLINE void f32_nt(const void *w, const void *a, size_t s, int64_t n, int nt, float *o) { float_nt(KIND_F32, w, a, s, n, nt, o); }   \
    INLINE void f16_nt(const void *w, const void *a, size_t s, int64_t n, int nt, float *o) { float_nt(KIND_F16, w, a, s, n, nt, o); }   \
    INLINE void bf16_nt(const void *w, const void *a, size_t s, int64_t n, int nt, float *o) { float_nt(KIND_BF16, w, a, s, n, nt, o); } \
    DOT_ENTRY_POINTS(f32)                                                                                     \
    DOT_ENTRY_POINTS(f16)                                                                                     \
    DOT_ENTRY_POINTS(bf16)

/* The float weights' matmul tiles read their f32 activations in place
 * (there is nothing to convert): their "pack" records where the token
 * group's rows are, and the tile reads that back. */
struct float_group {
    const float *acts;
    size_t stride; /* bytes between token rows */
};

static inline bool float_pack(const void *acts, size_t stride, int64_t n, int nt, void *packed, size_t packed_bytes) {
    if (packed_bytes < sizeof(struct float_group)) return false;
    const struct float_group g = {acts, stride};
    memcpy(packed, &g, sizeof g);
    return true;
}

INLINE struct float_group float_group(const void *packed) {
    struct float_group g;
    memcpy(&g, packed, sizeof g);
    return g;
}

INLINE size_t float_kind_bytes(enum float_kind k) { return k == KIND_F32 ? 4 : 2; }

/* prefetch_weights for a float row read `count` elements per step from
 * element i: each line that starts among them, so a pass asks for every
 * line of the row once */
INLINE void prefetch_float_lines(enum float_kind k, const void *row, int64_t i, int64_t count) {
    const int64_t line_elems = 64 / (int64_t)float_kind_bytes(k);
    for (int64_t e = 0; e < count; e += line_elems)
        if ((i + e) % line_elems == 0) prefetch_weights((const uint8_t *)row + (size_t)(i + e) * float_kind_bytes(k));
}

#define DOT_KERNELS(name) ((struct ds4_dot_kernels){dot_##name, dotn_##name, rows_##name})

/* The body of each file's ds4_kernels_ISA_dots lookup: the kernels every
 * ISA file has, then EXTRA, case lines for its own. */
#define DISPATCH(EXTRA)                                                                             \
    switch (type) {                                                                                 \
    case DS4_TYPE_F32: return DOT_KERNELS(f32);                                                     \
    case DS4_TYPE_F16: return DOT_KERNELS(f16);                                                     \
    case DS4_TYPE_BF16: return DOT_KERNELS(bf16);                                                   \
    case DS4_TYPE_Q8_0: return DOT_KERNELS(q8_0);                                                   \
    case DS4_TYPE_IQ2_XXS: return DOT_KERNELS(iq2_xxs);                                             \
    EXTRA                                                                                           \
    default: return (struct ds4_dot_kernels){0};                                                    \
    }

#endif
