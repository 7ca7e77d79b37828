/* kernels_cpu.c -- SIMD level probe and dispatch, activation quantization,
 * and the matvec/matmul drivers over the thread pool.
 *
 * The scalar level is the reference dot of quant.c itself: the SIMD files
 * are tested against it, so there is exactly one scalar implementation.
 */
#include "kernels/kernels_cpu.h"

#include <cpuid.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/kernels_cpu_internal.h"
#include "base/threadpool.h"

/* ---- CPU probe ---- */

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

/* AMX needs the instructions (CPUID.7.0:EDX AMX-TILE bit 24, AMX-INT8 bit
 * 25), the OS managing the tile state (XCR0 bits 17 TILECFG and 18
 * TILEDATA), and on Linux the process's permission for the 8 KiB tile data
 * state (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), which the kernel
 * grants once for all threads; without it the first tile instruction
 * faults. A refusal just leaves the AVX-512 level. */
#define AMX_TILE_BIT (1u << 24)
#define AMX_INT8_BIT (1u << 25)
#define XCR0_TILE_BITS (3ull << 17)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static bool amx_usable(unsigned cpuid7_edx, uint64_t xcr0) {
    if ((cpuid7_edx & (AMX_TILE_BIT | AMX_INT8_BIT)) != (AMX_TILE_BIT | AMX_INT8_BIT)) return false;
    if ((xcr0 & XCR0_TILE_BITS) != XCR0_TILE_BITS) return false;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* Instruction support alone is not enough: the OS must save the wider
 * register state on context switches (XCR0), or the upper halves would be
 * silently lost. AVX-512 is used only together with VNNI, BW, DQ and VL,
 * the set its translation unit is compiled for. */
static enum ds4_simd_level probe_cpu(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return DS4_SIMD_SCALAR;
    const unsigned need1 = bit_OSXSAVE | bit_AVX | bit_FMA | bit_F16C;
    if ((c & need1) != need1) return DS4_SIMD_SCALAR;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return DS4_SIMD_SCALAR; /* XMM + YMM state */
    if (__get_cpuid_max(0, NULL) < 7) return DS4_SIMD_SCALAR;
    __cpuid_count(7, 0, a, b, c, d);
    if (!(b & bit_AVX2)) return DS4_SIMD_SCALAR;
    const unsigned need512 = bit_AVX512F | bit_AVX512DQ | bit_AVX512BW | bit_AVX512VL;
    if ((b & need512) != need512 || !(c & bit_AVX512VNNI) || (xcr0 & 0xE6) != 0xE6) /* + opmask, ZMM */
        return DS4_SIMD_AVX2;
    return amx_usable(d, xcr0) ? DS4_SIMD_AMX : DS4_SIMD_AVX512;
}

static enum ds4_simd_level probe_level(void) {
#ifdef DS4_KERNELS_EMULATED
    /* test build only: tests/kernels/test_avx512_emulated.sh links the
     * AVX-512 and AMX files compiled against an emulation of the
     * intrinsics. They fall back to the native AVX2 kernels and
     * quantizers, so a CPU without AVX2 keeps its own level. */
    enum ds4_simd_level native = probe_cpu();
    return native >= DS4_SIMD_AVX2 ? DS4_SIMD_AMX : native;
#else
    return probe_cpu();
#endif
}

/* AVX-512 VBMI (byte permutes) with GFNI (bit-matrix multiplies) is an
 * extension inside the AVX-512 level, not a level of its own: it only
 * changes how IQ2_XXS grids and signs and Q2_K quants are unpacked, never
 * an integer or the float order, so results do not depend on it. */
static bool probe_vbmi(void) {
    if (ds4_cpu_best_level() < DS4_SIMD_AVX512) return false;
#ifdef DS4_KERNELS_EMULATED
    return true; /* SIMDe emulates these instructions as well */
#else
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    return (c & bit_AVX512VBMI) && (c & bit_GFNI);
#endif
}

/* AVX-VNNI (CPUID.(7,1):EAX bit 4), the VEX form of vpdpbusd on ymm: an
 * extension inside the AVX2 level, like VBMI inside AVX-512 (same integers,
 * same float order). The AVX2 probe already cleared the YMM state. */
static bool probe_avxvnni(void) {
    if (ds4_cpu_best_level() < DS4_SIMD_AVX2) return false;
#ifdef DS4_KERNELS_EMULATED
    return true; /* the test build's shim emulates vpdpbusd and vpdpwssd */
#endif
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return false;
    __cpuid_count(7, 0, a, b, c, d);
    if (a < 1) return false; /* no sub-leaf 1 */
    __cpuid_count(7, 1, a, b, c, d);
    return (a & bit_AVXVNNI) != 0;
}

/* AMD's (and Hygon's, the same cores) vendor string, CPUID leaf 0 */
static bool probe_amd(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    char vendor[13];
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    vendor[12] = '\0';
    return !strcmp(vendor, "AuthenticAMD") || !strcmp(vendor, "HygonGenuine");
}

_Atomic int ds4_stream_prefetch_state = -1;

static atomic_int best_level = -1;
static atomic_int cur_level = -1;
static atomic_int has_vbmi = -1, use_vbmi = -1;
static atomic_int has_avxvnni = -1, use_avxvnni = -1;

enum ds4_simd_level ds4_cpu_best_level(void) {
    int l = atomic_load_explicit(&best_level, memory_order_relaxed);
    if (l < 0) {
        l = (int)probe_level();
        atomic_store_explicit(&best_level, l, memory_order_relaxed);
        int unset = -1; /* a setter's choice stays */
        atomic_compare_exchange_strong(&ds4_stream_prefetch_state, &unset, probe_amd() ? 0 : 1);
    }
    return (enum ds4_simd_level)l;
}

enum ds4_simd_level ds4_kernels_level(void) {
    int l = atomic_load_explicit(&cur_level, memory_order_relaxed);
    return l < 0 ? ds4_cpu_best_level() : (enum ds4_simd_level)l;
}

void ds4_kernels_set_level(enum ds4_simd_level lvl) {
    enum ds4_simd_level best = ds4_cpu_best_level();
    if ((int)lvl < 0) lvl = DS4_SIMD_SCALAR;
    atomic_store_explicit(&cur_level, (int)(lvl > best ? best : lvl), memory_order_relaxed);
}

static bool cpu_vbmi(void) {
    int v = atomic_load_explicit(&has_vbmi, memory_order_relaxed);
    if (v < 0) {
        v = probe_vbmi();
        atomic_store_explicit(&has_vbmi, v, memory_order_relaxed);
    }
    return v;
}

bool ds4_kernels_vbmi(void) {
    int v = atomic_load_explicit(&use_vbmi, memory_order_relaxed);
    return v < 0 ? cpu_vbmi() : v;
}

void ds4_kernels_set_vbmi(bool on) { atomic_store_explicit(&use_vbmi, on && cpu_vbmi(), memory_order_relaxed); }

static bool cpu_avxvnni(void) {
    int v = atomic_load_explicit(&has_avxvnni, memory_order_relaxed);
    if (v < 0) {
        v = probe_avxvnni();
        atomic_store_explicit(&has_avxvnni, v, memory_order_relaxed);
    }
    return v;
}

bool ds4_kernels_avxvnni(void) {
    int v = atomic_load_explicit(&use_avxvnni, memory_order_relaxed);
    return v < 0 ? cpu_avxvnni() : v;
}

void ds4_kernels_set_avxvnni(bool on) {
    atomic_store_explicit(&use_avxvnni, on && cpu_avxvnni(), memory_order_relaxed);
}

bool ds4_kernels_stream_prefetch(void) {
    ds4_cpu_best_level();
    return atomic_load_explicit(&ds4_stream_prefetch_state, memory_order_relaxed) != 0;
}

void ds4_kernels_set_stream_prefetch(bool on) {
    ds4_cpu_best_level();
    atomic_store_explicit(&ds4_stream_prefetch_state, on ? 1 : 0, memory_order_relaxed);
}

void *ds4_kernels_alloc(size_t bytes) {
    const size_t line = 64;
    return aligned_alloc(line, bytes ? (bytes + line - 1) & ~(line - 1) : line);
}

const char *ds4_simd_level_name(enum ds4_simd_level lvl) {
    switch (lvl) {
    case DS4_SIMD_SCALAR: return "scalar";
    case DS4_SIMD_AVX2: return "avx2";
    case DS4_SIMD_AVX512: return "avx512";
    case DS4_SIMD_AMX: return "amx";
    }
    return "unknown";
}

const char *ds4_isa_cap_name(enum ds4_isa_cap cap) {
    switch (cap) {
    case DS4_ISA_SCALAR: return "scalar";
    case DS4_ISA_AVX2: return "avx2";
    case DS4_ISA_AVXVNNI: return "avxvnni";
    case DS4_ISA_AVX512: return "avx512";
    case DS4_ISA_AMX: return "amx";
    }
    return "unknown";
}

bool ds4_isa_cap_parse(const char *name, enum ds4_isa_cap *cap) {
    for (int c = DS4_ISA_SCALAR; c <= DS4_ISA_AMX; c++)
        if (name && !strcmp(name, ds4_isa_cap_name((enum ds4_isa_cap)c))) {
            *cap = (enum ds4_isa_cap)c;
            return true;
        }
    return false;
}

static const enum ds4_simd_level cap_level[] = {
    [DS4_ISA_SCALAR] = DS4_SIMD_SCALAR, [DS4_ISA_AVX2] = DS4_SIMD_AVX2, [DS4_ISA_AVXVNNI] = DS4_SIMD_AVX2,
    [DS4_ISA_AVX512] = DS4_SIMD_AVX512, [DS4_ISA_AMX] = DS4_SIMD_AMX};

void ds4_kernels_set_isa(enum ds4_isa_cap cap) {
    ds4_kernels_set_level(cap_level[cap]);
    ds4_kernels_set_avxvnni(cap != DS4_ISA_AVX2);
}

enum ds4_isa_cap ds4_kernels_isa(void) {
    switch (ds4_kernels_level()) {
    case DS4_SIMD_SCALAR: return DS4_ISA_SCALAR;
    case DS4_SIMD_AVX2: return ds4_kernels_avxvnni() ? DS4_ISA_AVXVNNI : DS4_ISA_AVX2;
    case DS4_SIMD_AVX512: return DS4_ISA_AVX512;
    case DS4_SIMD_AMX: break;
    }
    return DS4_ISA_AMX;
}

/* The per-row kernels of the highest level in use that has them, all three
 * from one file, so they agree bit for bit; all NULL means
 * ds4_vec_dot_ref. */
static struct ds4_dot_kernels dot_kernels(uint32_t type) {
    enum ds4_simd_level lvl = ds4_kernels_level();
    struct ds4_dot_kernels k = {0};
    if (lvl >= DS4_SIMD_AMX) k = ds4_kernels_amx_dots(type);
    if (!k.dot && lvl >= DS4_SIMD_AVX512) k = ds4_kernels_avx512_dots(type);
    if (!k.dot && lvl >= DS4_SIMD_AVX2) k = ds4_kernels_avx2_dots(type);
    return k;
}

/* the rows x tokens kernel of the same file as dot_kernels' choice, and its
 * kernel for a matrix's last rows where it has one; false means per-row
 * micro-kernels. A level's tile is never borrowed by a higher level, whose
 * dots run another float order. */
static bool tile_kernel(uint32_t type, struct ds4_tile_kernel *k, ds4_tile_rows_fn *rows_fn) {
    enum ds4_simd_level lvl = ds4_kernels_level();
    *rows_fn = NULL;
    if (lvl >= DS4_SIMD_AMX && ds4_kernels_amx_dots(type).dot) {
        *rows_fn = ds4_kernels_amx_tile_rows(type);
        return ds4_kernels_amx_tile(type, k);
    }
    if (lvl >= DS4_SIMD_AVX512) return ds4_kernels_avx512_tile(type, k);
    return lvl >= DS4_SIMD_AVX2 && ds4_kernels_avx2_tile(type, k);
}

static inline float call_dot(ds4_dot_fn f, uint32_t type, const void *w, const void *act, int64_t n) {
    return f ? f(w, act, n) : ds4_vec_dot_ref(type, w, act, n);
}

float ds4_vec_dot(uint32_t type, const void *w, const void *act, int64_t n) {
    return call_dot(dot_kernels(type).dot, type, w, act, n);
}

void ds4_vec_dotn(uint32_t type, const void *w, const void *acts, size_t act_stride, int64_t n, int nt, float *out) {
    const ds4_dotn_fn f = dot_kernels(type).dotn;
    for (int t = 0; t < nt; t += DS4_DOT_TOKENS) {
        const int group = nt - t < DS4_DOT_TOKENS ? nt - t : DS4_DOT_TOKENS;
        const uint8_t *a = (const uint8_t *)acts + (size_t)t * act_stride;
        if (f) f(w, a, act_stride, n, group, out + t);
        else for (int j = 0; j < group; j++) out[t + j] = ds4_vec_dot_ref(type, w, a + (size_t)j * act_stride, n);
    }
}

float ds4_vec_dot_q8_0_blockwise(const void *w, const void *act, int64_t n) {
    const ds4_block_q8_0 *wb = w, *ab = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / DS4_QK8_0; b++) {
        int32_t isum = 0;
        for (int k = 0; k < DS4_QK8_0; k++) isum += (int32_t)wb[b].qs[k] * ab[b].qs[k];
        const float scale = ds4_half_to_f32(wb[b].d) * ds4_half_to_f32(ab[b].d);
        acc = fmaf((float)isum, scale, acc);
    }
    return acc;
}

float ds4_vec_dot_iq2_xxs_blockwise(const void *w, const void *act, int64_t n) {
    const ds4_block_iq2_xxs *wb = w;
    const ds4_block_q8_K *ab = act;
    float acc = 0.0f;
    for (int64_t i = 0; i < n / DS4_QK_K; i++)
        acc = fmaf((float)ds4_iq2_xxs_isum(&wb[i], &ab[i]), (0.125f * ds4_half_to_f32(wb[i].d)) * ab[i].d, acc);
    return acc;
}

/* the scalar level's: 16-byte vectors, which every x86-64 has (SSE2); a
 * serial scalar sum would be bound by the add latency, not by memory */
static READ_SUM_KERNEL(scalar_read_sum, 16)

uint32_t ds4_read_sum(const void *x, int64_t n) {
    enum ds4_simd_level lvl = ds4_kernels_level();
    if (lvl >= DS4_SIMD_AVX512) return ds4_kernels_avx512_read_sum(x, n);
    if (lvl >= DS4_SIMD_AVX2) return ds4_kernels_avx2_read_sum(x, n);
    return scalar_read_sum(x, n);
}

/* ---- activation quantization ---- */

static uint32_t act_type(uint32_t type) {
    switch (type) {
    case DS4_TYPE_F32:
    case DS4_TYPE_F16:
    case DS4_TYPE_BF16: return DS4_TYPE_F32;
    default: return ds4_type_vec_dot_type(type);
    }
}

size_t ds4_act_bytes(uint32_t type, int64_t n) {
    if (n < 0 || ds4_type_block_elems(type) == 0) return 0;
    return ds4_type_row_bytes(act_type(type), (uint64_t)n);
}

void ds4_quantize_act(uint32_t type, const float *x, void *dst, int64_t n) {
    if (ds4_act_bytes(type, n) == 0) return; /* unknown type or partial block: dst has no room */
    uint32_t at = act_type(type);
    if (ds4_kernels_level() >= DS4_SIMD_AVX2 && at == DS4_TYPE_Q8_0) ds4_kernels_avx2_quantize_q8_0(x, dst, n);
    else if (ds4_kernels_level() >= DS4_SIMD_AVX2 && at == DS4_TYPE_Q8_K) ds4_kernels_avx2_quantize_q8_K(x, dst, n);
    else ds4_quantize_row(at, x, dst, n, NULL);
}

/* ---- matvec / matmul drivers ---- */

/* A task should stream a contiguous run of weight rows long enough for the
 * hardware prefetchers to ramp up, yet there should be several tasks per
 * thread so the threads finish together even when one runs slower. */
#define MIN_TASK_BYTES (64 * 1024)
#define TASKS_PER_THREAD 8
/* matmul: a block of weight rows stays in L2 while every token tile reads it */
#define MM_BLOCK_BYTES (256 * 1024)
#define MM_TILE_ACT_BYTES (256 * 1024)
/* one token group packed for a tile kernel, on the task's stack: 8n bytes
 * for Q8_0, so rows of up to 16384 elements; about 16n for IQ2_XXS's 16
 * tokens, up to 7936 */
#define MM_PACK_BYTES (128 * 1024)

struct mm_ctx {
    bool prefetch;          /* the driver prefetches rows ahead (the kernel does not) */
    struct ds4_dot_kernels k; /* the per-row kernels (all NULL: the reference dot) */
    bool tiled;             /* tk holds the level's rows x tokens kernel for the type */
    struct ds4_tile_kernel tk;
    ds4_tile_rows_fn tile_rows; /* the same for a matrix's last rows, or NULL */
    uint32_t type;
    const uint8_t *W;
    size_t row_bytes, act_bytes;
    int64_t rows, n, chunk, T, tile;
    const uint8_t *acts;
    float *Y;
};

/* The hardware prefetchers stop at 4 KiB page boundaries, so a weight
 * stream read only through them restarts its ramp-up on every page. While
 * a row is computed, its own length of bytes DS4_PREFETCH_AHEAD further on
 * is requested, which keeps more than a page of reads in flight; the Q8_0
 * kernels (most of decode's bytes), the Q2_K and float kernels and the
 * AVX-512 IQ2_XXS kernel instead prefetch line by line, which measured
 * better for them.
 * On a 2-core AVX-512 Xeon (1 thread, 1 GiB of weights, GB/s of CPU time,
 * A/B pairs): Q8_0 6.4 -> 8.2 (driver) / 9.3 (in-kernel), IQ2_XXS 3.2 ->
 * 4.9, Q2_K 5.0 -> 7.3, plain read 10-13; later, `ds4-bench --kernels`,
 * wall clock: IQ2_XXS 4.5-4.9 (driver) / 5.7-5.8 (in-kernel), Q2_K 7.0-7.3
 * / 8.8-9.3 (docs/performance.md, "Ideas tried").
 * Prefetches never fault; the range is clipped to the matrix anyway. */
static inline void prefetch_ahead(const uint8_t *row, size_t row_bytes, const uint8_t *end) {
    const uint8_t *p = row + DS4_PREFETCH_AHEAD, *e = p + row_bytes < end ? p + row_bytes : end;
    for (; p < e; p += 64) __builtin_prefetch(p, 0, 3);
}

bool ds4_kernels_self_prefetch(uint32_t type) {
    const enum ds4_simd_level lvl = ds4_kernels_level();
    /* the float dots too: the driver's burst per row queued behind their
     * FMA chains (F16 matvec from DRAM, one thread, Xeon VM: avx2 11.9-13.0
     * -> 14.0-15.1 GB/s) */
    if (type == DS4_TYPE_Q8_0 || type == DS4_TYPE_Q2_K || type == DS4_TYPE_F16 || type == DS4_TYPE_BF16 ||
        type == DS4_TYPE_F32)
        return lvl >= DS4_SIMD_AVX2;
    /* the AVX2 IQ2_XXS kernel is bound by its table lookups (4 GB/s from L2):
     * prefetching in it measured slower than the driver's */
    return type == DS4_TYPE_IQ2_XXS && lvl >= DS4_SIMD_AVX512;
}

/* whether the driver asks for each row's bytes ahead (prefetch_ahead) */
static bool driver_prefetch(uint32_t type) { return !ds4_kernels_self_prefetch(type) && ds4_kernels_stream_prefetch(); }

/* tokens [t, t1) against row r, up to DS4_DOT_TOKENS at a time where the
 * level has a micro-kernel: a weight row is unpacked once per group, so
 * leftover tokens form one smaller group rather than single dots */
static void row_tokens(const struct mm_ctx *c, int64_t r, int64_t t, int64_t t1) {
    const uint8_t *w = c->W + (size_t)r * c->row_bytes;
    if (c->k.dotn) {
        while (t < t1) {
            int nt = t1 - t < DS4_DOT_TOKENS ? (int)(t1 - t) : DS4_DOT_TOKENS;
            float out[DS4_DOT_TOKENS];
            c->k.dotn(w, c->acts + (size_t)t * c->act_bytes, c->act_bytes, c->n, nt, out);
            for (int j = 0; j < nt; j++) c->Y[(t + j) * c->rows + r] = out[j];
            t += nt;
        }
    }
    for (; t < t1; t++) c->Y[t * c->rows + r] = call_dot(c->k.dot, c->type, w, c->acts + (size_t)t * c->act_bytes, c->n);
}

static void mm_task(void *p, int task, int n_tasks, int thread) {
    const struct mm_ctx *c = p;
    int64_t r0 = (int64_t)task * c->chunk, r1 = r0 + c->chunk < c->rows ? r0 + c->chunk : c->rows;
    const uint8_t *w_end = c->W + (size_t)c->rows * c->row_bytes;
    _Alignas(64) uint8_t packed[MM_PACK_BYTES];
    for (int64_t t0 = 0; t0 < c->T; t0 += c->tile) {
        int64_t t1 = t0 + c->tile < c->T ? t0 + c->tile : c->T;
        int64_t r = r0;
        if (c->tiled) {
            /* whole tiles, each token group packed once for all the rows,
             * and the rows after the last whole tile where the kernel takes
             * fewer rows; the leftover tokens and rows (and every token of a
             * row too long to pack) go through the per-row kernels, which
             * give the same results */
            const struct ds4_tile_kernel *k = &c->tk;
            int64_t rt = r0 + (r1 - r0) / k->rows * k->rows, tt = t0;
            const int64_t r_tiled = c->tile_rows ? r1 : rt;
            while (tt < t1) {
                int nt = t1 - tt < k->tokens ? (int)(t1 - tt) : k->tokens;
                /* a long row packs fewer tokens per group, down to the least */
                while (nt >= k->min_tokens &&
                       !k->pack(c->acts + (size_t)tt * c->act_bytes, c->act_bytes, c->n, nt, packed, sizeof packed))
                    nt--;
                if (nt < k->min_tokens) break;
                /* the block's rows come from memory for its first group only */
                const bool from_memory = tt == 0 && k->tile_from_memory;
                for (int64_t i = r0; i < rt; i += k->rows)
                    (from_memory ? k->tile_from_memory : k->tile)(c->W + (size_t)i * c->row_bytes, c->row_bytes, packed,
                                                                  c->n, nt, c->Y + tt * c->rows + i, c->rows);
                if (r_tiled > rt)
                    c->tile_rows(c->W + (size_t)rt * c->row_bytes, c->row_bytes, packed, c->n, nt,
                                 c->Y + tt * c->rows + rt, c->rows, (int)(r_tiled - rt));
                tt += nt;
            }
            for (; r < r_tiled; r++) row_tokens(c, r, tt, t1);
        }
        /* One token: the task's rows in one call of the level's row-run
         * kernel, the same arithmetic per row as the dot. A call per row
         * cost about 20 cycles each (the kernel's set-up, and its result's
         * latency at the return): one thread, Zen 4, 4096 x 2048 Q2_K from
         * cache 14.8-14.9 -> 15.6-16.1 GB/s, 2048 x 4096 IQ2_XXS 7.3-7.7 ->
         * 7.5-7.9, the experts' shapes. Where the driver prefetches each
         * row, it stays per row. */
        if (c->T == 1 && c->k.rows && !c->prefetch) {
            c->k.rows(c->W + (size_t)r * c->row_bytes, c->row_bytes, r1 - r, c->acts, c->n, c->Y + r);
            r = r1;
        }
        for (; r < r1; r++) {
            if (t0 == 0 && c->prefetch) prefetch_ahead(c->W + (size_t)r * c->row_bytes, c->row_bytes, w_end);
            row_tokens(c, r, t0, t1);
        }
    }
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static void run_rows(struct ds4_pool *pool, struct mm_ctx *c, int64_t max_chunk) {
    if (c->rows <= 0) return;
    if (c->row_bytes == 0 && c->n > 0) {
        /* n is not a whole number of blocks (or the type is unknown): there
         * is no row layout to read, so the outputs say so loudly */
        for (int64_t i = 0; i < c->rows * c->T; i++) c->Y[i] = NAN;
        return;
    }
    int64_t want_tasks = (int64_t)ds4_pool_threads(pool) * TASKS_PER_THREAD;
    int64_t chunk = ceil_div(c->rows, want_tasks);
    int64_t min_rows = ceil_div(MIN_TASK_BYTES, (int64_t)c->row_bytes > 0 ? (int64_t)c->row_bytes : 1);
    if (chunk < min_rows) chunk = min_rows;
    if (max_chunk > 0 && chunk > max_chunk) chunk = max_chunk;
    if (c->tiled) chunk = ceil_div(chunk, c->tk.rows) * c->tk.rows; /* no row falls off a tile */
    c->chunk = chunk;
    ds4_pool_run(pool, mm_task, c, (int)ceil_div(c->rows, chunk));
}

/* A tile that takes a single token serves the matvec too: AMX (one tile
 * instruction per 16 rows and block, whatever the token count) and the
 * Q8_0 tiles of avx512 and of avx2 with AVX-VNNI (the token's activations
 * prepared once for all rows rather than per row). */
void ds4_matvec(struct ds4_pool *pool, uint32_t type, const void *W, int64_t rows, int64_t n, const void *act,
                float *y) {
    struct mm_ctx c = {.prefetch = driver_prefetch(type), .k = dot_kernels(type), .type = type, .W = W,
                       .row_bytes = ds4_type_row_bytes(type, (uint64_t)n), .act_bytes = ds4_act_bytes(type, n),
                       .rows = rows, .n = n, .T = 1, .tile = 1, .acts = act, .Y = y};
    c.tiled = tile_kernel(type, &c.tk, &c.tile_rows) && c.tk.min_tokens <= 1;
    run_rows(pool, &c, 0);
}

void ds4_matmul(struct ds4_pool *pool, uint32_t type, const void *W, int64_t rows, int64_t n, const void *acts,
                int64_t T, float *Y) {
    if (T <= 0) return;
    struct mm_ctx c = {.prefetch = driver_prefetch(type), .k = dot_kernels(type),
                       .type = type, .W = W, .row_bytes = ds4_type_row_bytes(type, (uint64_t)n), .act_bytes = ds4_act_bytes(type, n),
                       .rows = rows, .n = n, .T = T, .acts = acts, .Y = Y};
    c.tiled = tile_kernel(type, &c.tk, &c.tile_rows);
    c.tile = c.act_bytes ? MM_TILE_ACT_BYTES / (int64_t)c.act_bytes : T;
    if (c.tile < 1) c.tile = 1;
    int64_t block = MM_BLOCK_BYTES / (c.row_bytes ? (int64_t)c.row_bytes : 1);
    run_rows(pool, &c, block < 1 ? 1 : block);
}
