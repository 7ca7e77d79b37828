/* test_kernels_nonfinite.c -- the quantizers and kernels are total on
 * non-finite and overflowing input (a KV file holding NaN, infinities or
 * 3e38, a model with NaN weights): no crash, no read or write outside the
 * buffers, no hang, and a defined result, at every SIMD level this CPU has
 * (tests/kernels/test_avx512_emulated.sh runs it against the emulated
 * AVX-512 and AMX files too).
 * - Activation quantizers (ds4_quantize_act, Q8_0 and Q8_K): at every level
 *   the reference quantizer's bytes, and quant.h's rule: a block holding a
 *   NaN or an infinity has scale NaN and quants (and sums) 0; a block of
 *   magnitudes below ~3.7e-37 has quants 0; every other block is quantized
 *   exactly as it would be alone. Rows end on the planted block, so a scan
 *   that ran past it would leave the mapping (a guard page follows).
 * - Weight quantizers (ds4_quantize_row, every type): return, write exactly
 *   the row (guard bytes after it), the same bytes twice, and leave the
 *   finite blocks as they would be alone.
 * - ds4_vec_dot, ds4_vec_dotn, ds4_matvec, ds4_matmul (1 and 2 threads):
 *   a NaN or infinity in the activation or a NaN in the weights makes each
 *   of its outputs non-finite (NaN where the activation is quantized), huge
 *   and tiny finite activations give finite results within rounding of the
 *   f64 dot of the dequantized operands wherever that dot is far inside the
 *   float range, and all the paths of a level agree (NaN equals NaN).
 * An alarm turns a hang into a failure. Attention: tests/unit/test_attn_cpu.c.
 */
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "kernels/kernels_cpu.h"
#include "kernels/quant.h"
#include "simd_levels.h"
#include "base/threadpool.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static float uniform(float lo, float hi) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return lo + (hi - lo) * (float)(rng >> 40) / (float)(1 << 24);
}

static const uint32_t types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0, DS4_TYPE_Q2_K,
                                 DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K, DS4_TYPE_IQ2_XXS};
#define N_TYPES (sizeof types / sizeof types[0])
enum { N = 3 * DS4_QK_K }; /* three super-blocks, 24 Q8_0 blocks */

/* What a token's activation row holds besides modest random values. The
 * planted value goes into the row's last block (Q8_K's last super-block,
 * Q8_0's last block) at its last element and at one in its first half. */
enum pattern { FINITE, NAN_LAST, INF_LAST, NEG_INF_LAST, HUGE_LAST, NAN_BLOCK, HUGE_BLOCK, TINY_BLOCK, N_PATTERNS };
static const char *const pattern_names[] = {"finite", "NaN", "+inf", "-inf", "3e38", "all-NaN block",
                                            "all-3e38 block", "1e-40 block"};

static bool pattern_nonfinite(enum pattern p) { return p == NAN_LAST || p == INF_LAST || p == NEG_INF_LAST || p == NAN_BLOCK; }

static void activation_row(enum pattern p, float *x) {
    for (int i = 0; i < N; i++) x[i] = uniform(-1.0f, 1.0f);
    const int last = N - DS4_QK_K; /* the last super-block */
    switch (p) {
    case FINITE: break;
    case NAN_LAST: x[N - 1] = x[last + 5] = NAN; break;
    case INF_LAST: x[N - 1] = x[last + 5] = INFINITY; break;
    case NEG_INF_LAST: x[N - 1] = x[last + 5] = -INFINITY; break;
    case HUGE_LAST: x[N - 1] = 3e38f, x[last + 5] = -3e38f; break;
    case NAN_BLOCK: for (int i = last; i < N; i++) x[i] = NAN; break;
    case HUGE_BLOCK: for (int i = last; i < N; i++) x[i] = i % 2 ? 3e38f : -3e38f; break;
    case TINY_BLOCK: for (int i = last; i < N; i++) x[i] = (i % 3 - 1) * 1e-40f; break;
    default: break;
    }
}

/* a buffer whose last byte is followed by an inaccessible page */
struct guarded {
    uint8_t *map, *p;
    size_t map_bytes;
};
static struct guarded guarded_new(size_t bytes) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), data = (bytes + page - 1) / page * page;
    struct guarded g = {.map_bytes = data + page};
    g.map = mmap(NULL, g.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g.map == MAP_FAILED) abort();
    mprotect(g.map + data, page, PROT_NONE);
    g.p = g.map + data - bytes;
    return g;
}
static void guarded_free(struct guarded *g) { munmap(g->map, g->map_bytes); }

static bool is_nan_half(ds4_half h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }

/* quant.h's rule for each block of a Q8_0 or Q8_K activation row */
static void check_act_rule(uint32_t at, const float *x, const uint8_t *act, const char *what) {
    const bool k = at == DS4_TYPE_Q8_K;
    const int elems = k ? DS4_QK_K : DS4_QK8_0;
    const size_t bytes = ds4_type_block_bytes(at);
    for (int b = 0; b < N / elems; b++) {
        const float *xb = x + (size_t)b * elems;
        const uint8_t *blk = act + (size_t)b * bytes;
        bool finite = true, tiny = true;
        for (int e = 0; e < elems; e++) {
            finite &= isfinite(xb[e]);
            tiny &= fabsf(xb[e]) < 1e-37f;
        }
        const int8_t *qs = k ? ((const ds4_block_q8_K *)blk)->qs : ((const ds4_block_q8_0 *)blk)->qs;
        int nonzero = 0;
        for (int e = 0; e < elems; e++) nonzero += qs[e] != 0;
        if (!finite) {
            const bool scale_nan = k ? isnan(((const ds4_block_q8_K *)blk)->d) : is_nan_half(((const ds4_block_q8_0 *)blk)->d);
            int sums = 0;
            if (k)
                for (int j = 0; j < DS4_QK_K / 16; j++) sums += ((const ds4_block_q8_K *)blk)->bsums[j] != 0;
            CHECK(scale_nan && nonzero == 0 && sums == 0, "%s %s block %d: a non-finite block must be scale NaN, quants 0",
                  what, ds4_type_name(at), b);
        } else if (tiny) {
            CHECK(nonzero == 0, "%s %s block %d: a block below 3.7e-37 must have quants 0", what, ds4_type_name(at), b);
        }
        /* and exactly the bytes of quantizing the block alone */
        uint8_t alone[sizeof(ds4_block_q8_K)];
        ds4_quantize_row(at, xb, alone, elems, NULL);
        CHECK(!memcmp(alone, blk, bytes), "%s %s block %d: differs from the block quantized alone", what,
              ds4_type_name(at), b);
    }
}

/* the activation quantizers at the level in use against the reference bytes */
static void test_act_quantizers(const char *ln) {
    for (int p = 0; p < N_PATTERNS; p++) {
        static float x[N];
        activation_row(p, x);
        const uint32_t weight_for[] = {DS4_TYPE_Q8_0, DS4_TYPE_Q6_K};
        for (int k = 0; k < 2; k++) {
            const uint32_t at = k ? DS4_TYPE_Q8_K : DS4_TYPE_Q8_0;
            const size_t bytes = ds4_act_bytes(weight_for[k], N);
            /* the row ends where its mapping does, and so does the
             * activation it is written to */
            struct guarded gx = guarded_new(sizeof x), ga = guarded_new(bytes);
            memcpy(gx.p, x, sizeof x);
            ds4_quantize_act(weight_for[k], (const float *)gx.p, ga.p, N);
            uint8_t want[N / DS4_QK_K * sizeof(ds4_block_q8_K) + N / DS4_QK8_0 * sizeof(ds4_block_q8_0)];
            ds4_quantize_row(at, x, want, N, NULL);
            char what[96];
            snprintf(what, sizeof what, "%s act, %s row", ln, pattern_names[p]);
            CHECK(!memcmp(ga.p, want, bytes), "%s: %s bytes differ from the reference quantizer", what, ds4_type_name(at));
            check_act_rule(at, x, ga.p, what);
            guarded_free(&gx);
            guarded_free(&ga);
        }
    }
}

/* every weight quantizer: total, in bounds, deterministic, local */
static void test_weight_quantizers(void) {
    const uint32_t qtypes[] = {DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0, DS4_TYPE_Q8_K, DS4_TYPE_Q2_K,
                               DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K, DS4_TYPE_IQ2_XXS};
    static float x[N], imp[N];
    for (int i = 0; i < N; i++) imp[i] = uniform(0.1f, 1.0f);
    for (size_t ti = 0; ti < sizeof qtypes / sizeof qtypes[0]; ti++) {
        const uint32_t type = qtypes[ti];
        const size_t bytes = ds4_type_row_bytes(type, N), sb_bytes = ds4_type_row_bytes(type, DS4_QK_K);
        for (int p = 0; p < N_PATTERNS; p++) {
            activation_row(p, x);
            for (int with_imp = 0; with_imp <= 1; with_imp++) {
                const float *im = with_imp ? imp : NULL;
                uint8_t *a = malloc(bytes + 64), *b = malloc(bytes), *alone = malloc(sb_bytes);
                memset(a, 0xA5, bytes + 64);
                const size_t wrote = ds4_quantize_row(type, x, a, N, im);
                int spill = 0;
                for (int i = 0; i < 64; i++) spill += a[bytes + (size_t)i] != 0xA5;
                CHECK(wrote == bytes && spill == 0, "%s %s row (imatrix %d): wrote %zu of %zu bytes, %d past the row",
                      ds4_type_name(type), pattern_names[p], with_imp, wrote, bytes, spill);
                ds4_quantize_row(type, x, b, N, im);
                CHECK(!memcmp(a, b, bytes), "%s %s row: two runs differ", ds4_type_name(type), pattern_names[p]);
                /* the first super-block is finite in every pattern */
                ds4_quantize_row(type, x, alone, DS4_QK_K, im);
                CHECK(!memcmp(alone, a, sb_bytes), "%s %s row (imatrix %d): the finite super-block differs from itself alone",
                      ds4_type_name(type), pattern_names[p], with_imp);
                free(a);
                free(b);
                free(alone);
            }
        }
    }
}

/* f64 dot of the dequantized operands, and sum |w a| */
static double dequant_dot(uint32_t type, const void *w, const void *act, double *mag) {
    static float wf[N], af[N];
    ds4_dequantize_row(type, w, wf, N);
    const uint32_t at = type == DS4_TYPE_F16 || type == DS4_TYPE_BF16 ? DS4_TYPE_F32 : ds4_type_vec_dot_type(type);
    ds4_dequantize_row(at, act, af, N);
    double s = 0, m = 0;
    for (int i = 0; i < N; i++) {
        s += (double)wf[i] * af[i];
        m += fabs((double)wf[i] * af[i]);
    }
    *mag = m;
    return s;
}

/* a stored weight row's second block made NaN: its f16 scale, or for the
 * float types one element (a model file holding NaN weights) */
static void plant_nan_weight(uint32_t type, uint8_t *row) {
    const ds4_half nan_half = 0x7E00;
    switch (type) {
    case DS4_TYPE_F32: ((float *)row)[N / 2] = NAN; break;
    case DS4_TYPE_F16: ((ds4_half *)row)[N / 2] = nan_half; break;
    case DS4_TYPE_BF16: ((uint16_t *)row)[N / 2] = 0x7FC0; break;
    case DS4_TYPE_Q8_0: ((ds4_block_q8_0 *)row)[1].d = nan_half; break;
    case DS4_TYPE_Q2_K: ((ds4_block_q2_K *)row)[1].d = nan_half; break;
    case DS4_TYPE_Q4_K: ((ds4_block_q4_K *)row)[1].d = nan_half; break;
    case DS4_TYPE_Q5_K: ((ds4_block_q5_K *)row)[1].d = nan_half; break;
    case DS4_TYPE_Q6_K: ((ds4_block_q6_K *)row)[1].d = nan_half; break;
    case DS4_TYPE_IQ2_XXS: ((ds4_block_iq2_xxs *)row)[1].d = nan_half; break;
    default: abort();
    }
}

static bool same(float a, float b) { return !memcmp(&a, &b, sizeof a) || (isnan(a) && isnan(b)); }

enum { ROWS = 19, NAN_ROW = ROWS - 1, T = 17 }; /* rows: partial tiles; T: one past a 16-token tile */

/* one type at the level in use: rows of small weights (so 3e38 stays in
 * range), the last one with a NaN weight; tokens cycling through the
 * patterns */
static void test_dots(uint32_t type, const char *ln) {
    const size_t rb = ds4_type_row_bytes(type, N), ab = ds4_act_bytes(type, N);
    const uint32_t at = type == DS4_TYPE_F16 || type == DS4_TYPE_BF16 ? DS4_TYPE_F32 : ds4_type_vec_dot_type(type);
    const bool quantized_act = at != DS4_TYPE_F32;
    uint8_t *W = malloc(rb * ROWS), *acts = malloc(ab * T);
    float *dot = malloc(sizeof(float) * ROWS * T), *y = malloc(sizeof(float) * ROWS * T);
    static float x[N];
    for (int r = 0; r < ROWS; r++) {
        for (int i = 0; i < N; i++) x[i] = uniform(-1e-3f, 1e-3f);
        ds4_quantize_row(type, x, W + rb * r, N, NULL);
        if (r == NAN_ROW) plant_nan_weight(type, W + rb * r);
    }
    for (int t = 0; t < T; t++) {
        activation_row((enum pattern)(t % N_PATTERNS), x);
        ds4_quantize_act(type, x, acts + ab * t, N);
    }
    for (int t = 0; t < T; t++) {
        const enum pattern p = (enum pattern)(t % N_PATTERNS);
        for (int r = 0; r < ROWS; r++) {
            const float got = dot[t * ROWS + r] = ds4_vec_dot(type, W + rb * r, acts + ab * t, N);
            double mag, exact = dequant_dot(type, W + rb * r, acts + ab * t, &mag);
            if (r == NAN_ROW || pattern_nonfinite(p)) {
                const bool want_nan = r == NAN_ROW || p == NAN_LAST || p == NAN_BLOCK || quantized_act;
                CHECK(want_nan ? isnan(got) : !isfinite(got), "%s %s, %s activation, row %d: dot %g, want %s", ln,
                      ds4_type_name(type), pattern_names[p], r, got, want_nan ? "NaN" : "non-finite");
            } else if (mag < 1e37) {
                CHECK(isfinite(got) && fabs(got - exact) <= 1e-5 * mag + 1e-30, "%s %s, %s activation, row %d: dot %.9g, f64 %.9g",
                      ln, ds4_type_name(type), pattern_names[p], r, got, exact);
            }
        }
    }
    for (int r = 0; r < ROWS; r++) {
        float out[T];
        ds4_vec_dotn(type, W + rb * r, acts, ab, N, T, out);
        int bad = 0;
        for (int t = 0; t < T; t++) bad += !same(out[t], dot[t * ROWS + r]);
        CHECK(bad == 0, "%s %s row %d: %d dotn outputs differ from the dot", ln, ds4_type_name(type), r, bad);
    }
    for (int threads = 1; threads <= 2; threads++) {
        ds4_pool *pool = threads == 1 ? NULL : ds4_pool_new(threads);
        for (int t = 0; t < T; t++) {
            for (int r = 0; r < ROWS; r++) y[r] = 12345.0f;
            ds4_matvec(pool, type, W, ROWS, N, acts + ab * t, y);
            int bad = 0;
            for (int r = 0; r < ROWS; r++) bad += !same(y[r], dot[t * ROWS + r]);
            CHECK(bad == 0, "%s %s matvec, %s activation, %d threads: %d rows differ from the dot", ln,
                  ds4_type_name(type), pattern_names[t % N_PATTERNS], threads, bad);
        }
        for (int nt = 1; nt <= T; nt += nt < 4 ? 1 : 6) {
            for (int i = 0; i < ROWS * nt; i++) y[i] = 12345.0f;
            ds4_matmul(pool, type, W, ROWS, N, acts, nt, y);
            int bad = 0;
            for (int i = 0; i < ROWS * nt; i++) bad += !same(y[i], dot[i]);
            CHECK(bad == 0, "%s %s matmul T=%d, %d threads: %d outputs differ from the dot", ln, ds4_type_name(type), nt,
                  threads, bad);
        }
        ds4_pool_free(pool);
    }
    free(W);
    free(acts);
    free(dot);
    free(y);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_kernels_nonfinite: FAIL: still running after 120 s (a kernel hangs)\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(1);
    _exit(1);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(120);
    const enum ds4_simd_level best = ds4_cpu_best_level();
    report_levels_not_run("test_kernels_nonfinite");
    ds4_quant_init();
    test_weight_quantizers();
    for (int l = DS4_SIMD_SCALAR; l <= (int)best; l++) {
        ds4_kernels_set_level((enum ds4_simd_level)l);
        /* where the CPU has them, with and without the VBMI/GFNI kernels */
        ds4_kernels_set_vbmi(true);
        const bool vbmi = l >= DS4_SIMD_AVX512 && ds4_kernels_vbmi();
        for (int pass = 0; pass < (vbmi ? 2 : 1); pass++) {
            ds4_kernels_set_vbmi(pass == 0);
            char ln[32];
            snprintf(ln, sizeof ln, "%s%s", ds4_simd_level_name((enum ds4_simd_level)l), vbmi && pass == 0 ? "+vbmi" : "");
            test_act_quantizers(ln);
            for (size_t ti = 0; ti < N_TYPES; ti++) test_dots(types[ti], ln);
        }
    }
    ds4_kernels_set_vbmi(true);
    ds4_kernels_set_level(best);
    return check_done("test_kernels_nonfinite");
}
