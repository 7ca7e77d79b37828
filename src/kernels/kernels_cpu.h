/* kernels_cpu.h -- fast CPU dot products and matrix drivers with runtime SIMD
 * dispatch (scalar, AVX2, AVX-512/VNNI, AMX-INT8), over the block formats of
 * quant.h.
 *
 * Contract
 * - ds4_cpu_features() probes the CPU once; ds4_kernels_set_level() may force
 *   a lower level (tests compare every level the machine has against scalar).
 * - ds4_vec_dot(type, ...) equals ds4_vec_dot_ref within float rounding.
 *   Levels may differ from each other in float order (so within rounding);
 *   inside one level every path of a type runs the same order.
 * - The AMX level has its own Q8_0 and IQ2_XXS orders, which
 *   ds4_vec_dot_q8_0_blockwise and ds4_vec_dot_iq2_xxs_blockwise below
 *   spell out in plain C; its kernels match them bit for bit. Every other
 *   type runs the AVX-512 kernels there.
 * - ds4_quantize_act() turns an f32 activation row into the partner format
 *   of a weight type (Q8_0 for Q8_0; Q8_K for K-quants and IQ2_XXS; f32 for
 *   F32/F16/BF16), so it is done once per input and reused for every row.
 *   Its bytes are ds4_quantize_row's at every level, for every input
 *   (quant.h: NaN and infinities give a NaN block scale).
 * - ds4_matvec: y[r] = W[r,:]·x for r in [0,rows), x already converted with
 *   ds4_quantize_act; split across the thread pool by rows.
 * - ds4_matmul: Y[t,r] = W[r,:]·X[t,:] for a batch of T activations (prefill,
 *   batched decode): blocks of weight rows that stay in L2, and inside them
 *   rows x tokens tiles where the level has them (AVX2 Q8_0: 2 x 2..8 and
 *   its two rows in turn for one token, or 2 x 1..8 with AVX-VNNI;
 *   AVX-512 Q8_0: 4 x 1..4 and 2 x 5..8, or 4 x 4 then 4 x the rest where
 *   the rows come from memory; IQ2_XXS and Q2_K: 1 row (AVX2) or 2 rows
 *   (AVX-512) x up to 16 tokens, each weight block decoded once for all
 *   of them;
 *   AMX Q8_0: 16 rows x 1..16 tokens, also used by ds4_matvec;
 *   the token group packed once per block), else one row against up to 8
 *   tokens. Every Y[t,r] is bit-identical to ds4_matvec's
 *   y[r] for X[t] (same kernel arithmetic, whatever T, the other tokens or
 *   the threads).
 * - No allocation in the hot path: callers own scratch; ds4_matmul keeps a
 *   128 KiB packing buffer on the stack of each thread that runs it.
 * - Activations should start on a 64-byte line (ds4_kernels_alloc): the
 *   float kernels read them with full-line loads, and a load split over two
 *   lines costs them about a third to a half of their speed (measured on
 *   Zen 4: F16 matvec from DRAM 13.9 -> 22.3 GB/s, from L2 45 -> 54 GB/s,
 *   acts at 16 bytes past a line against on one). Results are the same
 *   either way.
 */
#ifndef DS4_KERNELS_CPU_H
#define DS4_KERNELS_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kernels/quant.h"

struct ds4_pool;

/* AMX: AVX-512 plus AMX-TILE/AMX-INT8, with the OS's permission to use
 * the tile registers (requested once per process by the probe). */
enum ds4_simd_level { DS4_SIMD_SCALAR = 0, DS4_SIMD_AVX2 = 1, DS4_SIMD_AVX512 = 2, DS4_SIMD_AMX = 3 };

enum ds4_simd_level ds4_cpu_best_level(void);        /* what this CPU supports */
enum ds4_simd_level ds4_kernels_level(void);         /* what is in use */
void ds4_kernels_set_level(enum ds4_simd_level lvl); /* clamped to best */
const char *ds4_simd_level_name(enum ds4_simd_level lvl);
/* Inside the AVX-512 level, IQ2_XXS blocks are decoded with VBMI byte
 * permutes and GFNI bit-matrix multiplies, and Q2_K quants extracted with
 * the latter, where the CPU has both; else with gathers and shifts. The
 * integers are the same, so results are bit-identical either way. Turning
 * it off (tests compare the two) is clamped to the CPU like the level. */
bool ds4_kernels_vbmi(void);
void ds4_kernels_set_vbmi(bool on);
/* Inside the AVX2 level, the Q8_0 kernels sum each group of four int8
 * products with AVX-VNNI's vpdpbusd instead of vpmaddubsw + vpmaddwd where
 * the CPU has it: the same exact integers, so the same float order and
 * bit-identical results. Turning it off is clamped to the CPU like VBMI. */
bool ds4_kernels_avxvnni(void);
void ds4_kernels_set_avxvnni(bool on);

/* Whether the kernels that read one weight row at a time (the per-row dots,
 * a one-token Q8_0 matvec at the AVX-512 level, the read loop) also ask
 * for its lines in software, a few KiB ahead. Measured opposite ways: on
 * the Xeon VMs far faster with it (Q8_0 matvec from DRAM, one thread, 6.4
 * -> 9.3 GB/s), on Zen 4 faster with the hardware prefetchers alone (F16
 * 16 -> 22, avx2 Q8_0 19.5 -> 21.7), where one sequential stream also beats
 * four rows read side by side. So it is on by default except on AMD (and
 * Hygon) CPUs; kernels reading several rows at once keep their requests
 * either way. It never changes a result. */
bool ds4_kernels_stream_prefetch(void);
void ds4_kernels_set_stream_prefetch(bool on);

/* Scratch for activations and for blocks carved into them: `bytes` rounded
 * up to whole 64-byte lines, starting on one (glibc's malloc gives 16 bytes
 * past a page for large blocks). NULL when out of memory; free() it. */
void *ds4_kernels_alloc(size_t bytes);

/* The caps --isa names: the levels above, with avx2 split in two, so that
 * the AVX2 kernels of a CPU without AVX-VNNI (Haswell to Zen 3) can be run
 * and measured on one that has it. "avx2" is AVX2 without AVX-VNNI,
 * "avxvnni" AVX2 with it; avx512 and amx use AVX-VNNI where the CPU has it
 * (wherever an AVX2 kernel serves them). Results are bit-identical between
 * avx2 and avxvnni. */
enum ds4_isa_cap { DS4_ISA_SCALAR, DS4_ISA_AVX2, DS4_ISA_AVXVNNI, DS4_ISA_AVX512, DS4_ISA_AMX };
const char *ds4_isa_cap_name(enum ds4_isa_cap cap);
/* the inverse of ds4_isa_cap_name; false (and *cap untouched) for anything else */
bool ds4_isa_cap_parse(const char *name, enum ds4_isa_cap *cap);
/* the level and the AVX-VNNI switch a cap sets, each clamped to the CPU */
void ds4_kernels_set_isa(enum ds4_isa_cap cap);
/* the cap in use: the level's, avxvnni for avx2 with AVX-VNNI on */
enum ds4_isa_cap ds4_kernels_isa(void);

/* bytes needed to hold n activations converted for weight type `type` */
size_t ds4_act_bytes(uint32_t type, int64_t n);
void ds4_quantize_act(uint32_t type, const float *x, void *dst, int64_t n);

float ds4_vec_dot(uint32_t type, const void *w, const void *act, int64_t n);
/* out[t] = ds4_vec_dot(type, w, acts + t * act_stride bytes, n) bit for bit,
 * for t < nt, with each weight block loaded once for up to 8 activations */
void ds4_vec_dotn(uint32_t type, const void *w, const void *acts, size_t act_stride, int64_t n, int nt, float *out);

/* The AMX level's Q8_0 float order, in plain C (compiled everywhere, so the
 * order is tested against the reference on any machine): per (row, token),
 * acc = 0, then for each block b in order
 *     acc = fmaf((float)isum_b, d_w[b] * d_a[b], acc)
 * where isum_b is the block's exact integer sum of 32 products (|isum_b| <
 * 2^19, exact as a float) and d_w[b] * d_a[b], two f16 values widened, is
 * exact in f32; so each block adds its exact term with one rounding, and
 * any implementation with a true FMA gets the same bits. The result is acc. */
float ds4_vec_dot_q8_0_blockwise(const void *w, const void *act, int64_t n);

/* The AMX level's IQ2_XXS x Q8_K float order, in plain C: per (row, token),
 * acc = 0, then for each super-block i in order
 *     acc = fmaf((float)isum_i, (0.125f * d_w[i]) * d_a[i], acc)
 * where isum_i = sum over its 8 sub-blocks of (2 * scale + 1) x the exact
 * integer sum of the sub-block's 32 products (|isum_i| < 2^26; the
 * conversion rounds to nearest beyond 2^24) and d_w[i] is the f16 factor
 * widened, d_a[i] the activation's f32 scale. One rounding of the product
 * 0.125 d_w d_a, one of the conversion and one per fmaf: any implementation
 * with a true FMA gets the same bits. The result is acc. */
float ds4_vec_dot_iq2_xxs_blockwise(const void *w, const void *act, int64_t n);

/* The wrap-around sum of the 32-bit words x[0..n), read with the widest
 * vector loads of the level in use (64 bytes on AVX-512, 32 on AVX2, 16 at
 * the scalar level; four independent accumulators; lines prefetched ahead as
 * the weight kernels do): the plain read loop whose bandwidth is a
 * denominator for the streaming kernels. Integer adds, so any bytes (weights
 * too, whose bit patterns as floats include denormals, slow on some cores)
 * read at the same speed. x needs only 4-byte alignment. */
uint32_t ds4_read_sum(const void *x, int64_t n);

/* W: rows x n of `type` (row stride = ds4_type_row_bytes(type,n)). */
void ds4_matvec(struct ds4_pool *pool, uint32_t type, const void *W, int64_t rows, int64_t n,
                const void *act, float *y);
/* acts: T rows, each ds4_act_bytes(type,n) bytes; Y: T x rows floats (row-major by token). */
void ds4_matmul(struct ds4_pool *pool, uint32_t type, const void *W, int64_t rows, int64_t n,
                const void *acts, int64_t T, float *Y);

#endif
