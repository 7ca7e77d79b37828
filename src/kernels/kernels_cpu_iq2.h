/* kernels_cpu_iq2.h -- the IQ2_XXS x Q8_K decode and single-row kernel
 * shared by the AVX-512 and AMX files (kernels_cpu_avx512.c, _amx.c).
 *
 * Contract
 * - Included only by ISA files compiled with the AVX-512 flags (F, BW, DQ,
 *   VL, VNNI), after kernels_cpu_simd.h; the VBMI/GFNI parts carry their
 *   own target attribute (VBMI) and run only where ds4_kernels_iq2_vbmi()
 *   said yes.
 * - iq2_nt(..., vbmi, blockwise) is the per-row kernel for nt <= NT_MAX
 *   tokens. Both decodes (gathers, or VBMI byte permutes) give the same
 *   integers. blockwise picks the float order: false is the AVX-512
 *   level's (16 lanes, each the scaled integer sum of its 4-element
 *   groups, one FMA per lane and super-block, the lanes reduced at the
 *   end); true is the AMX level's (ds4_vec_dot_iq2_xxs_blockwise in
 *   kernels_cpu.h: one FMA per super-block of its exact integer sum).
 * - IQ2_DOT_ENTRY_POINTS(blockwise) defines the dot, dotn and row-run
 *   functions (DOT_ENTRY_POINTS) of both decodes in that order.
 * - iq2_code_bits_vbmi() gives the 2-bit grid codes of a sub-block pair,
 *   from which the AMX tile builds its own weight bytes.
 */
#ifndef DS4_KERNELS_CPU_IQ2_H
#define DS4_KERNELS_CPU_IQ2_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels_cpu_simd.h"

/* ---- IQ2_XXS x Q8_K ----
 * A sub-block (32 elements) is one 8-byte word: four grid indices, then
 * four 7-bit sign indices and a 4-bit scale. The signs of a whole
 * super-block are decoded at once in vector registers: each 7-bit index
 * becomes its ksigns byte (the index plus an even-parity bit 7, the rule the
 * ksigns table encodes), and the four bytes of a sub-block are exactly the
 * 32 opmask bits of its elements. Two sub-blocks fill a register and a
 * 64-bit mask. The integer sums are the same as decoding through the table,
 * so results do not change.
 *
 * The grid rows (8 magnitude bytes each) come one of two ways, with the same
 * bytes: a gather of 8 rows per sub-block pair, or, with VBMI and GFNI,
 * register-only steps. Every grid byte is one of three magnitudes, so a row
 * is 8 two-bit codes: 256 rows x 16 bits fit 8 registers, one byte of the
 * even elements' codes and one of the odd. Per super-block four vpermi2b
 * (two 128-entry halves each, chosen by index bit 7) look up both code
 * bytes of its 32 rows; per sub-block pair one vpermb gives every word of a
 * row's qword its two code bytes, a word shift by 2w brings the codes of
 * elements 2w, 2w + 1 to the bottom of its two bytes, and one
 * vgf2p8affineqb maps each code to its magnitude (with code 3 unused, the
 * map is affine over GF(2)). The sign bytes, too: a multishift brings the
 * 7-bit sign indices to bytes, and a vgf2p8affineqb sets bit 7 to their
 * parity. Gathers cost more than the whole arithmetic of a sub-block pair,
 * which is why the single-row kernels were compute-bound. */
/* DS4_KERNELS_EMULATED (tests/kernels/test_avx512_emulated.sh) compiles this
 * against SIMDe's plain-C intrinsics: there the target attribute must go,
 * or gcc would emit real AVX-512 code for these functions (it implies
 * AVX512F and BW) and the emulated test would die on an AVX2 CPU. */
#ifdef DS4_KERNELS_EMULATED
#define VBMI
#else
#define VBMI __attribute__((target("avx512vbmi,gfni")))
#endif

/* one super-block decoded for its four sub-block pairs; the gather decode
 * fills neg and scale, the VBMI decode the rest */
struct iq2_decoded {
    uint64_t neg[4];      /* opmask of sub-blocks 2p, 2p+1 */
    __m256i scale;        /* 2 * (W >> 28) + 1 per sub-block, in both 16-bit halves */
    __m512i codes;        /* bytes 2R, 2R + 1: code bytes even, odd of grid row R = 4s + k */
    __m512i scale_words;  /* qword s: 2 * (W_s >> 28) + 1 in each 16-bit word */
    /* qword p: the ksigns bytes of sub-blocks 2p, 2p + 1, the 64 mask bits
     * of pair p. Memory the caller owns, apart from the struct, which then
     * stays in registers. */
    uint8_t *sign_bytes;
};

/* The grid's smallest magnitude, code 0: the constant term of the affine
 * map from codes to magnitudes (an instruction immediate). iq2_codes_init
 * checks it against the grid. */
#define IQ2_MAGNITUDE0 0x08

/* the code tables of the VBMI decode, derived once from the grid
 * (kernels_cpu_avx512.c) */
struct ds4_iq2_codes {
    /* codes of the even elements 0, 2, 4, 6 of row k, 2 bits each at bits
     * 0, 2, 4, 6; and of the odd elements 1, 3, 5, 7 */
    _Alignas(64) uint8_t code_even[256];
    _Alignas(64) uint8_t code_odd[256];
    uint64_t map;  /* GF(2) matrix: code bits 0, 1 -> magnitude ^ IQ2_MAGNITUDE0 */
    bool ok;       /* the grid has three magnitudes, the smallest IQ2_MAGNITUDE0 */
};
extern struct ds4_iq2_codes ds4_iq2_codes;

/* true where IQ2_XXS runs the VBMI decode (the CPU has VBMI and GFNI, they
 * are not switched off, and the grid fits the code tables), which are then
 * ready */
bool ds4_kernels_iq2_vbmi(void);


INLINE void iq2_decode_signs(const uint8_t *q, struct iq2_decoded *d) {
    __m512i words = _mm512_srli_epi64(_mm512_loadu_si512(q), 32); /* the W of each sub-block */
    const __m512i m7 = _mm512_set1_epi64(127);
    __m512i idx = _mm512_or_si512(
        _mm512_or_si512(_mm512_and_si512(words, m7), _mm512_slli_epi64(_mm512_and_si512(_mm512_srli_epi64(words, 7), m7), 8)),
        _mm512_or_si512(_mm512_slli_epi64(_mm512_and_si512(_mm512_srli_epi64(words, 14), m7), 16),
                        _mm512_slli_epi64(_mm512_and_si512(_mm512_srli_epi64(words, 21), m7), 24)));
    /* bit 0 of each byte becomes the parity of that byte: every shift only
     * brings higher bits of the same byte down to the bits still read */
    __m512i par = _mm512_xor_si512(idx, _mm512_srli_epi64(idx, 4));
    par = _mm512_xor_si512(par, _mm512_srli_epi64(par, 2));
    par = _mm512_xor_si512(par, _mm512_srli_epi64(par, 1));
    __m512i bytes = _mm512_or_si512(idx, _mm512_slli_epi64(_mm512_and_si512(par, _mm512_set1_epi64(0x01010101)), 7));
    _mm256_storeu_si256((__m256i *)d->neg, _mm512_cvtepi64_epi32(bytes));
    __m512i scale = _mm512_add_epi64(_mm512_slli_epi64(_mm512_srli_epi64(words, 28), 1), _mm512_set1_epi64(1));
    d->scale = _mm512_cvtepi64_epi32(_mm512_or_si512(scale, _mm512_slli_epi64(scale, 16)));
}

/* the grid bytes (unsigned magnitudes) of the two sub-blocks whose words
 * start at q and q + 8 */
INLINE __m512i iq2_grid_pair(const uint8_t *q) {
    uint32_t g0, g1;
    memcpy(&g0, q, 4);
    memcpy(&g1, q + 8, 4);
    return _mm512_i64gather_epi64(_mm512_cvtepu8_epi64(_mm_cvtsi64_si128((long long)((uint64_t)g1 << 32 | g0))),
                                  (const void *)ds4_iq2xxs_grid, 8);
}

/* The VBMI decode of a super-block, steps chosen by port: on the AVX-512
 * cores this was measured on, one-source byte permutes and multishifts run
 * on one port (two-source ones take it twice), multiplies, adds, blends on
 * two, and vgf2p8affineqb and word shifts on the other. */
/* The code bytes of the 32 grid rows of the super-blocks at qa and qb:
 * codes[0] and codes[1], bytes 2R, 2R + 1 even and odd codes of row
 * R = 4s + k (grid index k of sub-block s). Two super-blocks share the
 * lookups: their indices fill one register, picked from both blocks' 64
 * bytes by one two-source byte permute, so four two-source permutes serve
 * 64 rows. Byte 16L + j holds row 8L + j of qa for j < 8 and of qb for
 * j >= 8; in memory sub-block 2L's indices are at 16L, 2L + 1's at 16L + 8.
 * The unpacks then interleave the even and odd code bytes of each half.
 * (Four zero-masking byte loads merged by logic instead of the permute took
 * 6.9 against 3.7 cycles per call on Zen 4.) */
/* the permute's index: byte b = 16L + j takes qa[16L + j] (j < 4),
 * qa[16L + 4 + j] (j < 8), then qb's (64 + its offset) the same way */
#define IQ2_PICK(b) ((b) + ((b)&4) + 7 * ((b)&8))
#define IQ2_PICK8(b)                                                                                          \
    IQ2_PICK(b), IQ2_PICK(b + 1), IQ2_PICK(b + 2), IQ2_PICK(b + 3), IQ2_PICK(b + 4), IQ2_PICK(b + 5), \
        IQ2_PICK(b + 6), IQ2_PICK(b + 7)
static const _Alignas(64) uint8_t iq2_pick[64] = {IQ2_PICK8(0),  IQ2_PICK8(8),  IQ2_PICK8(16), IQ2_PICK8(24),
                                                   IQ2_PICK8(32), IQ2_PICK8(40), IQ2_PICK8(48), IQ2_PICK8(56)};
#undef IQ2_PICK8
#undef IQ2_PICK

VBMI static inline void iq2_lookup_codes(const uint8_t *qa, const uint8_t *qb, __m512i codes[2]) {
    const __m512i pick = _mm512_load_si512(iq2_pick);
    __m512i idx = _mm512_permutex2var_epi8(_mm512_loadu_si512(qa), pick, _mm512_loadu_si512(qb));
    __mmask64 upper = _mm512_movepi8_mask(idx); /* rows 128..255 */
    const __m512i *even_codes = (const __m512i *)ds4_iq2_codes.code_even, *odd_codes = (const __m512i *)ds4_iq2_codes.code_odd;
    __m512i even = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(even_codes[0], idx, even_codes[1]),
                                          _mm512_permutex2var_epi8(even_codes[2], idx, even_codes[3]));
    __m512i odd = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(odd_codes[0], idx, odd_codes[1]),
                                         _mm512_permutex2var_epi8(odd_codes[2], idx, odd_codes[3]));
    codes[0] = _mm512_unpacklo_epi8(even, odd);
    codes[1] = _mm512_unpackhi_epi8(even, odd);
}

/* the signs and scales of the super-block at q, with its looked-up codes */
VBMI static inline void iq2_decode_vbmi(const uint8_t *q, __m512i codes, struct iq2_decoded *d) {
    __m512i qs = _mm512_loadu_si512(q);
    d->codes = codes;
    /* byte k of each qword: bits 32 + 7k.. of it, sign index k of the
     * sub-block in the low 7 bits; the four of sub-blocks 2p and 2p + 1
     * side by side in qword p (a mask load from an 8-byte aligned place is
     * forwarded from the store, one that straddles 8 bytes measured far
     * slower); then bit 7 := parity of bits 0..6, the ksigns rule, as a
     * GF(2) matrix */
    const __m512i sign_bits = _mm512_set1_epi64(0x352e2720); /* 53, 46, 39, 32 */
    const __m512i pairs = _mm512_set_epi64(0, 0, 0, 0, 0x3b3a393833323130, 0x2b2a292823222120, 0x1b1a191813121110,
                                           0x0b0a090803020100);
    __m512i sign_idx = _mm512_permutexvar_epi8(pairs, _mm512_multishift_epi64_epi8(sign_bits, qs));
    __m512i sign_bytes = _mm512_gf2p8affine_epi64_epi8(sign_idx, _mm512_set1_epi64(0x010204081020407F), 0);
    _mm256_store_si256((__m256i *)d->sign_bytes, _mm512_castsi512_si256(sign_bytes));
    /* every byte: bits 59..63 of its qword (bit 27 of W, then the 4-bit
     * scale) and 3 bits wrapped around from the bottom; the low byte of
     * each word keeps 2 * scale + 1, the high one 0 */
    __m512i scale_bits = _mm512_multishift_epi64_epi8(_mm512_set1_epi8(59), qs);
    d->scale_words = _mm512_ternarylogic_epi64(scale_bits, _mm512_set1_epi16(0x1E), _mm512_set1_epi16(1), 0xEA);
}

/* the codes of sub-blocks 2p, 2p + 1, element e of the pair in bits 0, 1
 * of byte e (the bits above are other codes): qword r is row R = 8p + r;
 * word w of it gets the even and odd code bytes of R, shifted right by 2w,
 * which leaves the codes of elements 2w, 2w + 1 at the bottom of its two
 * bytes */
VBMI static inline __m512i iq2_code_bits_vbmi(const struct iq2_decoded *d, int p) {
    __m512i rows = _mm512_add_epi8(_mm512_set_epi64(0x0f0e0f0e0f0e0f0e, 0x0d0c0d0c0d0c0d0c, 0x0b0a0b0a0b0a0b0a,
                                                    0x0908090809080908, 0x0706070607060706, 0x0504050405040504,
                                                    0x0302030203020302, 0x0100010001000100),
                                   _mm512_set1_epi8((char)(16 * p)));
    return _mm512_srlv_epi16(_mm512_permutexvar_epi8(rows, d->codes), _mm512_set1_epi64(0x0006000400020000));
}

/* the grid bytes of sub-blocks 2p, 2p + 1: the affine map turns each code
 * into its magnitude (the bits above the code are ignored by the matrix) */
VBMI static inline __m512i iq2_grid_pair_vbmi(const struct iq2_decoded *d, int p) {
    return _mm512_gf2p8affine_epi64_epi8(iq2_code_bits_vbmi(d, p), _mm512_set1_epi64((long long)ds4_iq2_codes.map),
                                         IQ2_MAGNITUDE0);
}

/* One super-block's signs and scales, and what the grid reads need. The
 * empty asm makes the compiler take each pair's mask from memory (one
 * kmovq k, m64) instead of moving it through general registers (three
 * instructions, two on the vector ports the kernel is bound by). */
INLINE void iq2_decode(const uint8_t *q, bool vbmi, __m512i codes, struct iq2_decoded *d) {
    if (vbmi) {
        iq2_decode_vbmi(q, codes, d);
        __asm__("" : "+m"(*(uint8_t(*)[32])d->sign_bytes));
    } else {
        iq2_decode_signs(q, d);
    }
}

/* the grid bytes of sub-block pair p of the super-block at q */
INLINE __m512i iq2_grid(const uint8_t *q, bool vbmi, const struct iq2_decoded *d, int p) {
    return vbmi ? iq2_grid_pair_vbmi(d, p) : iq2_grid_pair(q + 16 * p);
}

/* the sign opmask of sub-block pair p */
INLINE __mmask64 iq2_neg(const struct iq2_decoded *d, bool vbmi, int p) {
    if (!vbmi) return d->neg[p];
    __mmask64 m;
    memcpy(&m, d->sign_bytes + 8 * p, sizeof m);
    return m;
}

/* the scales of sub-blocks 2p (low 8 lanes) and 2p + 1 (high 8 lanes) */
INLINE __m512i iq2_pair_scale(const struct iq2_decoded *d, bool vbmi, int p) {
    int a = 2 * p, b = 2 * p + 1;
    if (vbmi) return _mm512_permutexvar_epi64(_mm512_setr_epi64(a, a, a, a, b, b, b, b), d->scale_words);
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b),
                                    _mm512_castsi256_si512(d->scale));
}

/* sub-blocks b, b+1 of super-block i into every token's sum */
INLINE void iq2_two_subblocks(const uint8_t *q, bool vbmi, const struct iq2_decoded *d, const void *acts, size_t stride,
                              int64_t i, int b, int nt, __m512i sumi[]) {
    __m512i grid = iq2_grid(q, vbmi, d, b / 2);
    __mmask64 neg = iq2_neg(d, vbmi, b / 2);
    __m512i scale = iq2_pair_scale(d, vbmi, b / 2);
    UNROLL
    for (int t = 0; t < nt; t++) {
        const ds4_block_q8_K *y = (const ds4_block_q8_K *)tok(acts, stride, t) + i;
        __m512i av = _mm512_loadu_si512(y->qs + 32 * b);
        /* words of two grid * a products, |word| <= 2 * 43 * 127: no
         * saturation; vpdpwssd adds both words of a lane times the scale, so
         * the lane gets scale * (sum of its four products) */
        __m512i s = _mm512_maddubs_epi16(grid, _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av));
        sumi[t] = _mm512_dpwssd_epi32(sumi[t], s, scale);
    }
}

/* acc += (d_w * d_a) * sumi: the float step of the AVX-512 level's
 * IQ2_XXS kernels */
INLINE __m512 iq2_accumulate(__m512 acc, float dx, float da, __m512i sumi) {
    return _mm512_fmadd_ps(_mm512_set1_ps(dx * da), _mm512_cvtepi32_ps(sumi), acc);
}

/* The AMX level's order needs each super-block's exact integer sum before
 * its FMA. Summing one register's 16 lanes takes 4 shuffles and 4 adds;
 * the lane vectors of up to IQ2_GROUP super-blocks are kept instead and
 * summed together (24 instructions for 8 sums), then their FMAs run in
 * super-block order. Groups of 8 rather than 16 cost about the same per
 * sum and halve the chain of dependent FMAs left at the end of a row: the
 * first group's chain runs while the second group is computed. */
enum { IQ2_GROUP = 8 };

/* lane g < 8 of the result: the exact sum of the 16 lanes of v[g]
 * (|sum| < 2^26) */
INLINE __m512i iq2_lane_sums(const __m512i v[IQ2_GROUP]) {
    __m512i pair[4], quad[2];
    /* per 128-bit chunk: lanes 0, 2 and 1, 3 of v[2j] and v[2j + 1], interleaved */
    UNROLL
    for (int j = 0; j < 4; j++)
        pair[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * j], v[2 * j + 1]), _mm512_unpackhi_epi32(v[2 * j], v[2 * j + 1]));
    /* per chunk: the chunk's sums of v[4m], v[4m + 1], v[4m + 2], v[4m + 3] */
    UNROLL
    for (int m = 0; m < 2; m++)
        quad[m] = _mm512_add_epi32(_mm512_unpacklo_epi64(pair[2 * m], pair[2 * m + 1]),
                                   _mm512_unpackhi_epi64(pair[2 * m], pair[2 * m + 1]));
    /* chunks: quad[0]'s 0 + 1, 2 + 3, then quad[1]'s; then chunk 0 + 1 and
     * 2 + 3 of that, into chunks 0 and 1: lane g is v[g] */
    const __m512i half = _mm512_add_epi32(_mm512_shuffle_i32x4(quad[0], quad[1], 0x88),
                                          _mm512_shuffle_i32x4(quad[0], quad[1], 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(half, half, 0x08), _mm512_shuffle_i32x4(half, half, 0x0D));
}

/* The blockwise float steps of a token, waiting for their integer sums:
 * lanes[g] and scale[g] of the group's super-block g. */
struct iq2_pending {
    __m512i lanes[IQ2_GROUP];
    _Alignas(64) float scale[IQ2_GROUP];
};

/* acc after the FMAs of the first count pending super-blocks, in order
 * (a last group's unused lane vectors are zeroed for the sums, and skipped) */
INLINE float iq2_flush(struct iq2_pending *p, int count, float acc) {
    _Alignas(32) float sums[IQ2_GROUP];
    for (int g = count; g < IQ2_GROUP; g++) p->lanes[g] = _mm512_setzero_si512();
    _mm256_store_ps(sums, _mm512_castps512_ps256(_mm512_cvtepi32_ps(iq2_lane_sums(p->lanes))));
    for (int g = 0; g < count; g++) acc = __builtin_fmaf(sums[g], p->scale[g], acc);
    return acc;
}

INLINE float iq2_dx(const ds4_block_iq2_xxs *x) { return 0.125f * h2f(x->d); }

/* the decode of super-blocks i and i1 (i1 == i for an odd last one), which
 * share the VBMI grid lookups; the sign bytes are the caller's */
struct iq2_decoded_pair {
    struct iq2_decoded d[2];
};

/* the second super-block of the pair starting at i of nb */
INLINE int64_t iq2_pair_second(int64_t i, int64_t nb) { return i + 1 < nb ? i + 1 : i; }

INLINE void iq2_decode_pair(const ds4_block_iq2_xxs *x, int64_t i, int64_t i1, bool vbmi, struct iq2_decoded_pair *p) {
    __m512i codes[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    if (vbmi) iq2_lookup_codes((const uint8_t *)x[i].qs, (const uint8_t *)x[i1].qs, codes);
    UNROLL
    for (int k = 0; k < 2; k++) iq2_decode((const uint8_t *)x[k ? i1 : i].qs, vbmi, codes[k], &p->d[k]);
}

/* super-block i, decoded, into every token's accumulator (the AVX-512
 * order) or pending steps (blockwise) */
INLINE void iq2_super_block(const ds4_block_iq2_xxs *x, int64_t i, bool vbmi, bool blockwise,
                            const struct iq2_decoded *d, const void *acts, size_t stride, int nt, __m512 acc[],
                            struct iq2_pending pending[]) {
    const uint8_t *q = (const uint8_t *)x[i].qs;
    __m512i sumi[NT_MAX];
    UNROLL
    for (int t = 0; t < nt; t++) sumi[t] = _mm512_setzero_si512();
    UNROLL
    for (int b = 0; b < 8; b += 2) iq2_two_subblocks(q, vbmi, d, acts, stride, i, b, nt, sumi);
    float dx = iq2_dx(&x[i]);
    UNROLL
    for (int t = 0; t < nt; t++) {
        const float da = ((const ds4_block_q8_K *)tok(acts, stride, t) + i)->d;
        if (blockwise) {
            pending[t].lanes[i % IQ2_GROUP] = sumi[t];
            pending[t].scale[i % IQ2_GROUP] = dx * da;
        } else {
            acc[t] = iq2_accumulate(acc[t], dx, da, sumi[t]);
        }
    }
}

/* the pair of super-blocks at i, decoded in *now, into the accumulators
 * or pending steps, with the next pair decoded into *next first; the
 * row's lines asked for through *prefetch unless it is NULL */
INLINE void iq2_pair_step(const ds4_block_iq2_xxs *x, int64_t i, int64_t nb, bool vbmi, bool blockwise,
                          const struct iq2_decoded_pair *now, struct iq2_decoded_pair *next, const char **prefetch,
                          const void *acts, size_t stride, int nt, __m512 acc[], struct iq2_pending pending[],
                          float total[]) {
    const int64_t i1 = iq2_pair_second(i, nb);
    if (prefetch) prefetch_lines(prefetch, x + i1 + 1);
    if (i + 2 < nb) iq2_decode_pair(x, i + 2, iq2_pair_second(i + 2, nb), vbmi, next);
    iq2_super_block(x, i, vbmi, blockwise, &now->d[0], acts, stride, nt, acc, pending);
    if (i1 > i) iq2_super_block(x, i1, vbmi, blockwise, &now->d[1], acts, stride, nt, acc, pending);
    const int64_t done = i1 + 1;
    if (blockwise && (done % IQ2_GROUP == 0 || done == nb)) {
        const int count = (int)((done - 1) % IQ2_GROUP) + 1;
        UNROLL
        for (int t = 0; t < nt; t++) total[t] = iq2_flush(&pending[t], count, total[t]);
    }
}

INLINE void iq2_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out, bool vbmi,
                   bool blockwise) {
    const ds4_block_iq2_xxs *x = w;
    const int64_t nb = n / DS4_QK_K;
    __m512 acc[NT_MAX];
    float total[NT_MAX];
    struct iq2_pending pending[NT_MAX]; /* blockwise only */
    UNROLL
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps(), total[t] = 0.0f;
    /* Super-blocks in twos, which share the VBMI grid lookups (an odd last
     * one is looked up twice and used once); the order of the float steps
     * is unchanged. IQ2_GROUP is even, so a pair never straddles groups.
     * The next pair is decoded before this one's products: the decode is a
     * long dependent chain, and interleaving it in program order leaves the
     * out-of-order window free for the products (one token on Zen 4: 33.8
     * -> 31.3 cycles per super-block). */
    const char *cursor = prefetch_cursor(x), **prefetch = stream_prefetch() ? &cursor : NULL;
    /* Two named pairs taking turns, the loop unrolled by two steps: with
     * pair[cur] indexed at run time the decoded vectors went through the
     * stack every step, and the sign bytes' pointers took general registers
     * the compiler then spilled; named, they stay in registers (one token
     * from L2 on Zen 4 7.5 -> 7.9 GB/s; 512 rows of 4096 from cache 89 ->
     * 73 us at one token, 2 to 4 tokens 2-10% faster). */
    _Alignas(32) uint8_t signs[2][2][32];
    struct iq2_decoded_pair even = {{{.sign_bytes = signs[0][0]}, {.sign_bytes = signs[0][1]}}},
                            odd = {{{.sign_bytes = signs[1][0]}, {.sign_bytes = signs[1][1]}}};
    if (nb > 0) iq2_decode_pair(x, 0, iq2_pair_second(0, nb), vbmi, &even);
    for (int64_t i = 0; i < nb; i += 4) {
        iq2_pair_step(x, i, nb, vbmi, blockwise, &even, &odd, prefetch, acts, stride, nt, acc, pending, total);
        if (i + 2 < nb)
            iq2_pair_step(x, i + 2, nb, vbmi, blockwise, &odd, &even, prefetch, acts, stride, nt, acc, pending, total);
    }
    UNROLL
    for (int t = 0; t < nt; t++) out[t] = blockwise ? total[t] : _mm512_reduce_add_ps(acc[t]);
}

/* dot_iq2_xxs / dotn_iq2_xxs (gather decode) and dot_iq2_xxs_vbmi /
 * dotn_iq2_xxs_vbmi in the including file, in the float order blockwise
 * picks */
#define IQ2_DOT_ENTRY_POINTS(blockwise)                                                                        \
    INLINE void iq2_xxs_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) {      \
        iq2_nt(w, acts, stride, n, nt, out, false, blockwise);                                                 \
    }                                                                                                          \
    DOT_ENTRY_POINTS(iq2_xxs)                                                                                  \
    VBMI INLINE void iq2_xxs_vbmi_nt(const void *w, const void *acts, size_t stride, int64_t n, int nt, float *out) { \
        iq2_nt(w, acts, stride, n, nt, out, true, blockwise);                                                  \
    }                                                                                                          \
    DOT_ENTRY_POINTS_ATTR(iq2_xxs_vbmi, VBMI)

#endif
