/* test_kernels.c -- every SIMD level this CPU has, for every weight type,
 * against two oracles (and the AMX level's Q8_0 and IQ2_XXS dots against
 * the plain-C models of their float order, bit for bit): quant.c's scalar reference dot (same integer
 * algebra, written independently) and an f64 dot of the dequantized weight
 * row with the dequantized activation (sheet section 10.4: both must agree
 * up to f32 rounding). Weights are both properly quantized rows and raw
 * random bytes with sane f16 scales, so every bit pattern of the packed
 * fields (all IQ2_XXS sign indices, Q6_K scale -128, Q8_0 -128, ...) is hit.
 * Then matvec/matmul against per-row ds4_vec_dot with 1..4 threads, and
 * matmul on every batch size 1..40, odd row counts and rows at the packing
 * limits of the tiles (bit for bit). The AMX level's Q8_0 and IQ2_XXS float
 * orders have plain-C models, tested against both oracles everywhere; where the CPU has
 * AMX, every AMX path must equal it bit for bit (elsewhere that part says
 * it did not run).
 */
#include <cpuid.h>
#include <math.h>
#include <float.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "simd_levels.h"
#include "kernels/kernels_cpu.h"
#include "kernels/quant.h"
#include "base/threadpool.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next_u64() >> 40) / (float)(1 << 24); }

static const uint32_t types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0, DS4_TYPE_Q2_K,
                                 DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K, DS4_TYPE_IQ2_XXS};
#define N_TYPES (sizeof(types) / sizeof(types[0]))

/* floats whose magnitude varies by block, so scales differ between blocks */
static void random_floats(float *x, int64_t n) {
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = uniform(0.01f, 4.0f);
        x[i] = uniform(-scale, scale);
    }
}

static ds4_half random_half_scale(void) { return ds4_f32_to_half(uniform(-0.02f, 0.02f)); }

/* the AMX level's float orders, spelled out in plain C (kernels_cpu.h) */
typedef float (*model_fn)(const void *w, const void *act, int64_t n);
static model_fn blockwise_model(uint32_t type) {
    switch (type) {
    case DS4_TYPE_Q8_0: return ds4_vec_dot_q8_0_blockwise;
    case DS4_TYPE_IQ2_XXS: return ds4_vec_dot_iq2_xxs_blockwise;
    default: return NULL;
    }
}

/* Raw random bytes, then the f16 factors replaced by finite modest values
 * (random bytes there could be inf/NaN, which says nothing about kernels). */
static void random_raw_row(uint32_t type, void *row, int64_t n) {
    size_t bytes = ds4_type_row_bytes(type, (uint64_t)n);
    for (size_t i = 0; i < bytes; i++) ((uint8_t *)row)[i] = (uint8_t)next_u64();
    size_t nb = (size_t)n / ds4_type_block_elems(type);
    for (size_t b = 0; b < nb; b++) {
        switch (type) {
        case DS4_TYPE_F32: ((float *)row)[b] = uniform(-2, 2); break;
        case DS4_TYPE_F16: ((ds4_half *)row)[b] = ds4_f32_to_half(uniform(-2, 2)); break;
        case DS4_TYPE_BF16: ((uint16_t *)row)[b] = ds4_f32_to_bf16(uniform(-2, 2)); break;
        case DS4_TYPE_Q8_0: ((ds4_block_q8_0 *)row)[b].d = random_half_scale(); break;
        case DS4_TYPE_Q2_K:
            ((ds4_block_q2_K *)row)[b].d = random_half_scale();
            ((ds4_block_q2_K *)row)[b].dmin = random_half_scale();
            break;
        case DS4_TYPE_Q4_K:
            ((ds4_block_q4_K *)row)[b].d = random_half_scale();
            ((ds4_block_q4_K *)row)[b].dmin = random_half_scale();
            break;
        case DS4_TYPE_Q5_K:
            ((ds4_block_q5_K *)row)[b].d = random_half_scale();
            ((ds4_block_q5_K *)row)[b].dmin = random_half_scale();
            break;
        case DS4_TYPE_Q6_K: ((ds4_block_q6_K *)row)[b].d = random_half_scale(); break;
        case DS4_TYPE_IQ2_XXS: ((ds4_block_iq2_xxs *)row)[b].d = random_half_scale(); break;
        }
    }
}

static void quantized_row(uint32_t type, void *row, int64_t n) {
    float *x = malloc((size_t)n * sizeof(float)), *imp = malloc((size_t)n * sizeof(float));
    random_floats(x, n);
    for (int64_t i = 0; i < n; i++) imp[i] = uniform(0.1f, 1.0f);
    ds4_quantize_row(type, x, row, n, type == DS4_TYPE_IQ2_XXS ? imp : NULL);
    free(x);
    free(imp);
}

/* lengths: several block counts, odd ones included; float types any n */
static int lengths(uint32_t type, int64_t *out) {
    int64_t be = (int64_t)ds4_type_block_elems(type);
    if (be == 1) {
        const int64_t f[] = {1, 7, 8, 33, 100, 257, 1024};
        memcpy(out, f, sizeof(f));
        return 7;
    }
    const int64_t blocks[] = {1, 2, 3, 5, 9};
    for (int i = 0; i < 5; i++) out[i] = blocks[i] * be;
    return 5;
}

/* f64 oracle: dequantized weights · dequantized activation; also returns
 * Σ|w·a| as the scale for the rounding tolerance */
static double dequant_dot(uint32_t type, const void *w, const void *act, int64_t n, double *mag) {
    float *wf = malloc((size_t)n * sizeof(float)), *af = malloc((size_t)n * sizeof(float));
    ds4_dequantize_row(type, w, wf, n);
    uint32_t at = (type == DS4_TYPE_F16 || type == DS4_TYPE_BF16) ? DS4_TYPE_F32 : ds4_type_vec_dot_type(type);
    ds4_dequantize_row(at, act, af, n);
    double s = 0, m = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)wf[i] * af[i];
        m += fabs((double)wf[i] * af[i]);
    }
    free(wf);
    free(af);
    *mag = m;
    return s;
}

static void test_dots(enum ds4_simd_level lvl) {
    ds4_kernels_set_level(lvl);
    CHECK(ds4_kernels_level() == lvl, "level %s not applied", ds4_simd_level_name(lvl));
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = types[ti];
        int64_t ns[8];
        int nn = lengths(type, ns);
        for (int li = 0; li < nn; li++) {
            int64_t n = ns[li];
            void *w = malloc(ds4_type_row_bytes(type, (uint64_t)n));
            void *act = malloc(ds4_act_bytes(type, n));
            float *x = malloc((size_t)n * sizeof(float));
            for (int rep = 0; rep < 6; rep++) {
                if (rep % 2) random_raw_row(type, w, n);
                else quantized_row(type, w, n);
                random_floats(x, n);
                ds4_quantize_act(type, x, act, n);
                float got = ds4_vec_dot(type, w, act, n);
                float ref = ds4_vec_dot_ref(type, w, act, n);
                double mag, exact = dequant_dot(type, w, act, n, &mag);
                /* every block adds at most a few roundings of size eps·Σ|w·a| */
                double tol = 1e-5 * mag + 1e-30;
                CHECK(fabs((double)got - ref) <= tol, "%s %s n=%lld rep=%d: simd %.9g ref %.9g (tol %.3g)",
                      ds4_simd_level_name(lvl), ds4_type_name(type), (long long)n, rep, got, ref, tol);
                CHECK(fabs((double)got - exact) <= tol, "%s %s n=%lld rep=%d: simd %.9g dequant %.9g (tol %.3g)",
                      ds4_simd_level_name(lvl), ds4_type_name(type), (long long)n, rep, got, exact, tol);
                if (lvl == DS4_SIMD_AMX && blockwise_model(type)) {
                    /* the AMX level's own float order, bit for bit */
                    float model = blockwise_model(type)(w, act, n);
                    CHECK(!memcmp(&got, &model, sizeof got), "amx %s n=%lld rep=%d: %.9g, the order's model %.9g",
                          ds4_type_name(type), (long long)n, rep, got, model);
                }
            }
            free(w);
            free(act);
            free(x);
        }
    }
}

/* matvec must give exactly the per-row ds4_vec_dot result (same kernel),
 * whatever the thread count and however rows are chunked; so must matmul,
 * whose multi-token micro-kernels share the dot's per-token arithmetic
 * (prefill and decode then produce identical logits). */
static void test_drivers(enum ds4_simd_level lvl) {
    ds4_kernels_set_level(lvl);
    const int64_t rows_list[] = {1, 37, 301};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = types[ti];
        int64_t n = ds4_type_block_elems(type) == 1 ? 200 : 3 * (int64_t)ds4_type_block_elems(type);
        if (type == DS4_TYPE_Q8_0) n = 7 * 32;
        size_t rb = ds4_type_row_bytes(type, (uint64_t)n), ab = ds4_act_bytes(type, n);
        const int64_t T = 9; /* two 4-token groups and a remainder */
        int64_t max_rows = 301;
        uint8_t *W = malloc(rb * (size_t)max_rows);
        /* the activations on a line (as ds4_kernels_alloc gives them) and a
         * copy 16 bytes past one (as a large malloc does): the same results */
        uint8_t *acts = ds4_kernels_alloc(ab * (size_t)T), *off_line = ds4_kernels_alloc(ab * (size_t)T + 16);
        CHECK(((uintptr_t)acts & 63) == 0 && ((uintptr_t)off_line & 63) == 0, "ds4_kernels_alloc: 64-byte aligned");
        float *x = malloc((size_t)n * sizeof(float));
        float *y = malloc(sizeof(float) * (size_t)(max_rows * T)), *want = malloc(sizeof(float) * (size_t)(max_rows * T));
        for (int64_t r = 0; r < max_rows; r++) random_raw_row(type, W + rb * (size_t)r, n);
        for (int64_t t = 0; t < T; t++) {
            random_floats(x, n);
            ds4_quantize_act(type, x, acts + ab * (size_t)t, n);
        }
        memcpy(off_line + 16, acts, ab * (size_t)T);
        for (int nt = 1; nt <= 4; nt++) {
            ds4_pool *pool = nt == 1 ? NULL : ds4_pool_new(nt);
            for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++) {
                int64_t rows = rows_list[ri];
                for (int64_t r = 0; r < rows; r++) want[r] = ds4_vec_dot(type, W + rb * (size_t)r, acts, n);
                int bad = 0;
                for (int place = 0; place < 2; place++) {
                    for (int64_t r = 0; r < rows; r++) y[r] = NAN;
                    ds4_matvec(pool, type, W, rows, n, place ? off_line + 16 : acts, y);
                    for (int64_t r = 0; r < rows; r++) bad += memcmp(&y[r], &want[r], sizeof(float)) != 0;
                }
                CHECK(bad == 0, "%s matvec %s rows=%lld threads=%d: %d rows differ", ds4_simd_level_name(lvl),
                      ds4_type_name(type), (long long)rows, nt, bad);

                for (int64_t t = 0; t < T; t++)
                    for (int64_t r = 0; r < rows; r++)
                        want[t * rows + r] = ds4_vec_dot(type, W + rb * (size_t)r, acts + ab * (size_t)t, n);
                bad = 0;
                for (int place = 0; place < 2; place++) {
                    for (int64_t i = 0; i < rows * T; i++) y[i] = NAN;
                    ds4_matmul(pool, type, W, rows, n, place ? off_line + 16 : acts, T, y);
                    for (int64_t i = 0; i < rows * T; i++) bad += memcmp(&y[i], &want[i], sizeof(float)) != 0;
                }
                CHECK(bad == 0, "%s matmul %s rows=%lld T=%lld threads=%d: %d outputs differ",
                      ds4_simd_level_name(lvl), ds4_type_name(type), (long long)rows, (long long)T, nt, bad);
            }
            ds4_pool_free(pool);
        }
        free(W);
        free(acts);
        free(off_line);
        free(x);
        free(y);
        free(want);
    }
}

/* matmul result (rows x T) against ds4_vec_dot per (row, token), memcmp */
static int matmul_mismatches(ds4_pool *pool, uint32_t type, const uint8_t *W, int64_t rows, int64_t n,
                             const uint8_t *acts, int64_t T, float *y) {
    size_t rb = ds4_type_row_bytes(type, (uint64_t)n), ab = ds4_act_bytes(type, n);
    for (int64_t i = 0; i < rows * T; i++) y[i] = NAN;
    ds4_matmul(pool, type, W, rows, n, acts, T, y);
    int bad = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < rows; r++) {
            float want = ds4_vec_dot(type, W + rb * (size_t)r, acts + ab * (size_t)t, n);
            bad += memcmp(&y[t * rows + r], &want, sizeof want) != 0;
        }
    return bad;
}

/* random weight rows and quantized activation rows for a matmul test */
typedef struct {
    uint8_t *W, *acts;
    float *x, *y;
    size_t rb, ab;
} mm_case;

static mm_case mm_case_new(uint32_t type, int64_t n, int64_t rows, int64_t T) {
    mm_case c = {.rb = ds4_type_row_bytes(type, (uint64_t)n), .ab = ds4_act_bytes(type, n)};
    c.W = malloc(c.rb * (size_t)rows);
    c.acts = malloc(c.ab * (size_t)T);
    c.x = malloc(sizeof(float) * (size_t)n);
    c.y = malloc(sizeof(float) * (size_t)(rows * T));
    for (int64_t r = 0; r < rows; r++) random_raw_row(type, c.W + c.rb * (size_t)r, n);
    for (int64_t t = 0; t < T; t++) {
        random_floats(c.x, n);
        ds4_quantize_act(type, c.x, c.acts + c.ab * (size_t)t, n);
    }
    return c;
}

static void mm_case_free(mm_case *c) {
    free(c->W);
    free(c->acts);
    free(c->x);
    free(c->y);
}

/* The kernels prefetch up to 2 KiB past the bytes they read, so near a
 * matrix's end they request lines beyond it: a prefetch never faults, a
 * load there would. A matrix whose last row ends where an inaccessible page
 * begins must give, through the dot, the multi-token kernel, matvec and
 * matmul, the results of the same bytes elsewhere, bit for bit. */
static void test_matrix_at_mapping_end(enum ds4_simd_level lvl) {
    ds4_kernels_set_level(lvl);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    enum { ROWS = 7, T = 5 };
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = types[ti];
        const int64_t n = 8 * (int64_t)ds4_type_block_elems(type) < 256 ? 256 : 8 * (int64_t)ds4_type_block_elems(type);
        mm_case c = mm_case_new(type, n, ROWS, T);
        const size_t bytes = c.rb * ROWS, span = (bytes + page - 1) / page * page;
        uint8_t *map = mmap(NULL, span + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(map != MAP_FAILED, "mmap");
        if (map == MAP_FAILED) { mm_case_free(&c); return; }
        CHECK(mprotect(map + span, page, PROT_NONE) == 0, "mprotect");
        uint8_t *W = map + span - bytes;
        memcpy(W, c.W, bytes);
        float want[ROWS * T], got[ROWS * T];
        int bad = 0;
        for (int64_t t = 0; t < T; t++)
            for (int64_t r = 0; r < ROWS; r++) {
                want[t * ROWS + r] = ds4_vec_dot(type, c.W + c.rb * (size_t)r, c.acts + c.ab * (size_t)t, n);
                got[t * ROWS + r] = ds4_vec_dot(type, W + c.rb * (size_t)r, c.acts + c.ab * (size_t)t, n);
            }
        bad += memcmp(got, want, sizeof want) != 0;
        float last[T];
        ds4_vec_dotn(type, W + c.rb * (ROWS - 1), c.acts, c.ab, n, T, last);
        for (int t = 0; t < T; t++) bad += memcmp(&last[t], &want[t * ROWS + ROWS - 1], sizeof(float)) != 0;
        ds4_matvec(NULL, type, W, ROWS, n, c.acts, got);
        bad += memcmp(got, want, ROWS * sizeof(float)) != 0;
        ds4_matmul(NULL, type, W, ROWS, n, c.acts, T, got);
        bad += memcmp(got, want, sizeof want) != 0;
        CHECK(bad == 0, "%s %s: a matrix ending at an inaccessible page: %d paths differ", ds4_simd_level_name(lvl),
              ds4_type_name(type), bad);
        munmap(map, span + page);
        mm_case_free(&c);
    }
}

/* The matmul kernels (row x token tiles, token groups of any size, packed
 * token groups) must reproduce the dot of every (row, token) exactly, for
 * any batch size and any row count: rows and T that are not multiples of
 * a tile, T = 1..40, with 1 and 2 threads. A token's result then does not
 * depend on which other tokens share its batch (prefill == decode). */
static void test_matmul_shapes(enum ds4_simd_level lvl) {
    ds4_kernels_set_level(lvl);
    const int64_t rows_list[] = {1, 3, 4, 5, 9, 38};
    enum { T_MAX = 40, ROWS_MAX = 38 };
    /* Q8_0 blocks go in pairs (AVX2) and quads (AVX-512): every count of
     * blocks left over in the last one */
    const int64_t q8_0_blocks[] = {1, 2, 3, 5, 6, 8};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = types[ti];
        const bool q8_0 = type == DS4_TYPE_Q8_0;
        for (size_t qi = 0; qi < (q8_0 ? sizeof q8_0_blocks / sizeof q8_0_blocks[0] : 1); qi++) {
            const int64_t n = q8_0 ? q8_0_blocks[qi] * 32
                              : ds4_type_block_elems(type) == 1 ? 72
                                                                 : 3 * (int64_t)ds4_type_block_elems(type);
            mm_case c = mm_case_new(type, n, ROWS_MAX, T_MAX);
            for (int threads = 1; threads <= 2; threads++) {
                ds4_pool *pool = threads == 1 ? NULL : ds4_pool_new(threads);
                for (size_t ri = 0; ri < sizeof(rows_list) / sizeof(rows_list[0]); ri++)
                    for (int64_t T = 1; T <= T_MAX; T++) {
                        int bad = matmul_mismatches(pool, type, c.W, rows_list[ri], n, c.acts, T, c.y);
                        CHECK(bad == 0, "%s matmul %s rows=%lld T=%lld threads=%d: %d outputs differ from the dot",
                              ds4_simd_level_name(lvl), ds4_type_name(type), (long long)rows_list[ri], (long long)T,
                              threads, bad);
                    }
                /* a batch that starts elsewhere in the same tokens gives the same rows */
                int bad = matmul_mismatches(pool, type, c.W, ROWS_MAX, n, c.acts + 3 * c.ab, T_MAX - 3, c.y);
                CHECK(bad == 0, "%s matmul %s offset batch: %d outputs differ", ds4_simd_level_name(lvl),
                      ds4_type_name(type), bad);
                ds4_pool_free(pool);
            }
            mm_case_free(&c);
        }
    }
}

/* rows around the longest a token group can be packed for in the 128 KiB
 * buffer, then one block more: Q8_0 16384 elements (AVX-512 and the AVX2
 * VNNI tile: groups of 4 tokens x 8 bytes an element) and 43648 (the plain
 * AVX2 tile: 2 tokens x 96 bytes a block pair), IQ2_XXS 7936 (31
 * super-blocks x a group of 16 tokens; at 8192 a group of 16 no longer
 * fits), and 7168 for the AVX2 IQ2_XXS and Q2_K tiles and the AVX-512 Q2_K
 * tile (28 super-blocks x 16 tokens x 292 bytes; one more and the group
 * shrinks to 15). The float tiles read their rows in place at any length:
 * the 24 x 16384 HC mixes, and lengths whose tails take each level's last
 * steps (a masked or 8-element vector step, single elements). The packed
 * tile and the per-row fallback both match the dot. */
static void test_matmul_long_rows(enum ds4_simd_level lvl) {
    ds4_kernels_set_level(lvl);
    static const struct { uint32_t type; int64_t n, T; } cases[] = {
        {DS4_TYPE_Q8_0, 16384, 9}, {DS4_TYPE_Q8_0, 16384 + 32, 9},
        {DS4_TYPE_Q8_0, 43648, 5}, {DS4_TYPE_Q8_0, 43648 + 32, 5},
        {DS4_TYPE_IQ2_XXS, 7936, 20}, {DS4_TYPE_IQ2_XXS, 8192, 20},
        {DS4_TYPE_IQ2_XXS, 7168, 20}, {DS4_TYPE_IQ2_XXS, 7168 + 256, 20},
        {DS4_TYPE_Q2_K, 7168, 20}, {DS4_TYPE_Q2_K, 7168 + 256, 20},
        {DS4_TYPE_F16, 16384, 9}, {DS4_TYPE_F16, 16384 + 13, 9}, {DS4_TYPE_F32, 1037, 7}, {DS4_TYPE_BF16, 77, 6},
        {DS4_TYPE_F32, 16 + 8 + 5, 4}};
    const int64_t rows = 5;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mm_case c = mm_case_new(cases[i].type, cases[i].n, rows, cases[i].T);
        int bad = matmul_mismatches(NULL, cases[i].type, c.W, rows, cases[i].n, c.acts, cases[i].T, c.y);
        CHECK(bad == 0, "%s matmul %s n=%lld: %d outputs differ from the dot", ds4_simd_level_name(lvl),
              ds4_type_name(cases[i].type), (long long)cases[i].n, bad);
        mm_case_free(&c);
    }
}

/* Every IQ2_XXS grid row (each in all four positions of a sub-block), every
 * 7-bit sign index and every 4-bit scale, against an exact integer oracle
 * decoded here from the format's definition: magnitudes from the grid
 * table, element k of a sign index negative when bit k of the index plus
 * its even-parity bit 7 is set, sub-block scale 2s + 1, d = 1/8 per unit
 * of the f16 factor. Rows of two super-blocks (the VBMI decode looks up
 * two at once). With d = 8 and activations in [-15, 15] (scale 1) every
 * partial sum is an integer below 512 * 31 * 43 * 15 < 2^24, so each
 * kernel's float result is exact whatever its order: the dot, the
 * multi-token kernel and the matmul tile must equal the oracle bit for bit. */
static void test_iq2_xxs_exhaustive(enum ds4_simd_level lvl, const char *decode) {
    enum { ROWS = 32, BLOCKS = 2, TOKENS = 16 }; /* one tile group: the most a tile takes */
    const int64_t n = BLOCKS * DS4_QK_K;
    ds4_block_iq2_xxs w[ROWS][BLOCKS];
    ds4_block_q8_K a[TOKENS][BLOCKS];
    for (int t = 0; t < TOKENS; t++)
        for (int i = 0; i < BLOCKS; i++) {
            a[t][i].d = 1.0f;
            for (int e = 0; e < DS4_QK_K; e++) a[t][i].qs[e] = (int8_t)((int)(next_u64() % 31) - 15);
            for (int g = 0; g < DS4_QK_K / 16; g++) {
                int sum = 0;
                for (int e = 0; e < 16; e++) sum += a[t][i].qs[16 * g + e];
                a[t][i].bsums[g] = (int16_t)sum;
            }
        }
    int64_t want[ROWS][TOKENS] = {{0}};
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < BLOCKS; i++) {
            w[r][i].d = ds4_f32_to_half(8.0f);
            for (int b = 0; b < 8; b++) {
                int sub = (r * BLOCKS + i) * 8 + b;
                uint8_t grid_idx[4];
                uint32_t word = (uint32_t)(sub % 16) << 28; /* scale */
                for (int k = 0; k < 4; k++) {
                    int slot = 4 * sub + k;
                    grid_idx[k] = (uint8_t)((slot + slot / 256) & 255); /* shifts a row's position every 256 slots */
                    word |= (uint32_t)((slot + slot / 128) & 127) << (7 * k);
                }
                memcpy(&w[r][i].qs[4 * b], grid_idx, 4);
                memcpy(&w[r][i].qs[4 * b + 2], &word, 4);
                for (int k = 0; k < 4; k++) {
                    unsigned sign_idx = (word >> (7 * k)) & 127;
                    unsigned signs = sign_idx | (unsigned)(__builtin_parity(sign_idx) << 7);
                    for (int j = 0; j < 8; j++) {
                        int e = 32 * b + 8 * k + j;
                        int64_t m = (int64_t)((ds4_iq2xxs_grid[grid_idx[k]] >> (8 * j)) & 0xFF);
                        if (signs >> j & 1) m = -m;
                        for (int t = 0; t < TOKENS; t++) want[r][t] += (2 * (sub % 16) + 1) * m * a[t][i].qs[e];
                    }
                }
            }
        }
    float y[TOKENS * ROWS], got[TOKENS];
    ds4_matmul(NULL, DS4_TYPE_IQ2_XXS, w, ROWS, n, a, TOKENS, y);
    int bad_dot = 0, bad_dotn = 0, bad_matmul = 0;
    for (int r = 0; r < ROWS; r++) {
        ds4_vec_dotn(DS4_TYPE_IQ2_XXS, w[r], a, sizeof a[0], n, TOKENS, got);
        for (int t = 0; t < TOKENS; t++) {
            bad_dot += ds4_vec_dot(DS4_TYPE_IQ2_XXS, w[r], a[t], n) != (float)want[r][t];
            bad_dotn += got[t] != (float)want[r][t];
            bad_matmul += y[t * ROWS + r] != (float)want[r][t];
        }
    }
    CHECK(bad_dot + bad_dotn + bad_matmul == 0, "%s (%s) IQ2_XXS grid/sign/scale sweep: %d dot, %d dotn, %d matmul of %d differ",
          ds4_simd_level_name(lvl), decode, bad_dot, bad_dotn, bad_matmul, ROWS * TOKENS);
}

/* The VBMI/GFNI kernels against the plain AVX-512 ones on raw random rows
 * (every bit pattern of the packed fields): IQ2_XXS (byte-permute decode vs
 * gathers) and Q2_K (bit-matrix quant extraction vs shifts). Dot, every
 * token count of the multi-token kernel and the tile, bit for bit (the
 * IQ2_XXS sweep above covers every table entry of both decodes). */
static void test_vbmi_matches_plain(void) {
    enum { ROWS = 7, T_MAX = 20 };
    static const uint32_t vbmi_types[] = {DS4_TYPE_IQ2_XXS, DS4_TYPE_Q2_K};
    for (size_t ti = 0; ti < sizeof vbmi_types / sizeof vbmi_types[0]; ti++) {
        uint32_t type = vbmi_types[ti];
        const int64_t n = 5 * DS4_QK_K;
        mm_case c = mm_case_new(type, n, ROWS, T_MAX);
        /* per path: the matmul (T x ROWS), then each row's dotn (ROWS x T), then each row's dot of token 0 */
        const size_t count = 2 * ROWS * T_MAX + ROWS;
        float *res[2] = {malloc(sizeof(float) * count), malloc(sizeof(float) * count)};
        int bad = 0;
        for (int64_t T = 1; T <= T_MAX; T++) {
            for (int vbmi = 0; vbmi <= 1; vbmi++) {
                ds4_kernels_set_vbmi(vbmi);
                float *out = res[vbmi];
                ds4_matmul(NULL, type, c.W, ROWS, n, c.acts, T, out);
                for (int64_t r = 0; r < ROWS; r++) {
                    const uint8_t *w = c.W + c.rb * (size_t)r;
                    ds4_vec_dotn(type, w, c.acts, c.ab, n, (int)T, out + ROWS * T + r * T);
                    out[2 * ROWS * T + r] = ds4_vec_dot(type, w, c.acts, n);
                }
            }
            bad += memcmp(res[0], res[1], sizeof(float) * (size_t)(2 * ROWS * T + ROWS)) != 0;
        }
        ds4_kernels_set_vbmi(true);
        CHECK(bad == 0, "%s: the VBMI/GFNI kernels differ from the plain AVX-512 ones in %d of %d batch sizes",
              ds4_type_name(type), bad, T_MAX);
        free(res[0]);
        free(res[1]);
        mm_case_free(&c);
    }
}

/* Inside the AVX2 level, the kernels on AVX-VNNI's vpdpbusd / vpdpwssd
 * against the vpmaddubsw + vpmaddwd ones: Q8_0 and IQ2_XXS (the dot, every
 * token count of the multi-token kernel, the tile at every batch size, and
 * matvec) and the Q2_K tile, bit for bit. Weights are raw
 * random blocks with an odd block count (-128 included); Q8_0's activations
 * too, in the quantizer's -127..127 (IQ2_XXS and Q2_K take the quantizer's
 * Q8_K rows, whose bsums they read). */
static void test_avxvnni_matches_plain(uint32_t type) {
    enum { ROWS = 7, T_MAX = 20 };
    const int64_t n = 5 * (int64_t)ds4_type_block_elems(type);
    ds4_kernels_set_level(DS4_SIMD_AVX2);
    mm_case c = mm_case_new(type, n, ROWS, T_MAX);
    if (type == DS4_TYPE_Q8_0)
        for (int t = 0; t < T_MAX; t++) {
            /* any quants the activation quantizer writes (-127..127): the
             * sign trick turns -128 x a negative weight into the wrong
             * sign, the VNNI tile's +128 form does not */
            ds4_block_q8_0 *a = (ds4_block_q8_0 *)(c.acts + c.ab * (size_t)t);
            random_raw_row(type, a, n);
            for (int64_t b = 0; b < n / 32; b++)
                for (int i = 0; i < 32; i++)
                    if (a[b].qs[i] == -128) a[b].qs[i] = -127;
        }
    /* per path: the matmul (T x ROWS), each row's dotn (ROWS x T), each row's dot of token 0, the matvec */
    const size_t count = 2 * ROWS * T_MAX + 2 * ROWS;
    float *res[2] = {malloc(sizeof(float) * count), malloc(sizeof(float) * count)};
    int bad = 0;
    for (int64_t T = 1; T <= T_MAX; T++) {
        for (int vnni = 0; vnni <= 1; vnni++) {
            ds4_kernels_set_avxvnni(vnni);
            float *out = res[vnni];
            ds4_matmul(NULL, type, c.W, ROWS, n, c.acts, T, out);
            for (int64_t r = 0; r < ROWS; r++) {
                const uint8_t *w = c.W + c.rb * (size_t)r;
                ds4_vec_dotn(type, w, c.acts, c.ab, n, (int)T, out + ROWS * T + r * T);
                out[2 * ROWS * T + r] = ds4_vec_dot(type, w, c.acts, n);
            }
            ds4_matvec(NULL, type, c.W, ROWS, n, c.acts, out + 2 * ROWS * T + ROWS);
        }
        bad += memcmp(res[0], res[1], sizeof(float) * (size_t)(2 * ROWS * T + 2 * ROWS)) != 0;
    }
    ds4_kernels_set_avxvnni(true);
    CHECK(bad == 0, "%s: the AVX-VNNI kernels differ from the plain AVX2 ones in %d of %d batch sizes",
          ds4_type_name(type), bad, T_MAX);
    free(res[0]);
    free(res[1]);
    mm_case_free(&c);
}

/* ds4_quantize_act must produce the reference quantizer's bytes at every
 * level, including rounding ties, all-zero blocks and a negative maximum */
static void test_act(enum ds4_simd_level lvl) {
    ds4_kernels_set_level(lvl);
    const char *ln = ds4_simd_level_name(lvl);
    CHECK(ds4_act_bytes(DS4_TYPE_Q4_K, 512) == 2 * sizeof(ds4_block_q8_K), "Q4_K act bytes");
    CHECK(ds4_act_bytes(DS4_TYPE_IQ2_XXS, 256) == sizeof(ds4_block_q8_K), "IQ2_XXS act bytes");
    CHECK(ds4_act_bytes(DS4_TYPE_Q8_0, 64) == 2 * sizeof(ds4_block_q8_0), "Q8_0 act bytes");
    CHECK(ds4_act_bytes(DS4_TYPE_F16, 10) == 40 && ds4_act_bytes(DS4_TYPE_BF16, 3) == 12, "float acts are f32");
    CHECK(ds4_act_bytes(12345, 256) == 0, "unknown type");
    CHECK(ds4_act_bytes(DS4_TYPE_Q4_K, 300) == 0, "partial block");
    {
        /* invalid shapes: nothing written to the act buffer, NaN outputs */
        uint8_t guard[8] = {0};
        float xs[300] = {0}, y[3] = {0, 0, 0};
        ds4_quantize_act(DS4_TYPE_Q4_K, xs, guard, 300);
        ds4_quantize_act(12345, xs, guard, 256);
        CHECK(!memcmp(guard, (uint8_t[8]){0}, 8), "%s: act written for an invalid shape", ln);
        ds4_matvec(NULL, DS4_TYPE_Q8_0, guard, 3, 40, guard, y);
        CHECK(isnan(y[0]) && isnan(y[2]), "%s: matvec with a partial block must give NaN", ln);
    }
    enum { N = 1024 };
    static float x[N];
    static uint8_t got[N * sizeof(float)], want[N * sizeof(float)]; /* the largest act format: f32 */
    for (int rep = 0; rep < 20; rep++) {
        random_floats(x, N);
        if (rep == 1) /* all-zero blocks */
            for (int i = 0; i < 256; i++) x[i] = 0.0f;
        if (rep == 2)                                    /* exact .5 ties after scaling by 127/127 */
            for (int i = 0; i < N; i++) x[i] = (i % 32 == 0) ? 127.0f : (float)((i * 7) % 254 - 127) / 2.0f;
        x[(rep * 37) % N] = -9.0f; /* negative maximum: Q8_K maps it to -127 */
        x[(rep * 37 + 3) % N] = 9.0f; /* tie in magnitude: the first one wins */
        const uint32_t weight_types[] = {DS4_TYPE_Q8_0, DS4_TYPE_Q6_K, DS4_TYPE_F16};
        for (int k = 0; k < 3; k++) {
            uint32_t at = k == 0 ? DS4_TYPE_Q8_0 : k == 1 ? DS4_TYPE_Q8_K : DS4_TYPE_F32;
            size_t bytes = ds4_act_bytes(weight_types[k], N);
            ds4_quantize_act(weight_types[k], x, got, N);
            ds4_quantize_row(at, x, want, N, NULL);
            CHECK(memcmp(got, want, bytes) == 0, "%s: act for %s differs from quantize_row (rep %d)", ln,
                  ds4_type_name(weight_types[k]), rep);
        }
    }
    ds4_block_q8_K a[N / 256];
    ds4_quantize_act(DS4_TYPE_Q6_K, x, a, N);
    int s = 0;
    for (int i = 16; i < 32; i++) s += a[1].qs[i];
    CHECK(a[1].bsums[1] == s, "%s: bsums", ln);
}

/* ds4_read_sum against the wrap-around sum of the words, for every length
 * remainder of the vector loop, from an aligned start and a start one word
 * off it; the words use all 32 bits (the sum wraps), and some are float
 * denormals, which an integer loop must read like any other bytes. */
static void test_read_sum(enum ds4_simd_level lvl) {
    ds4_kernels_set_level(lvl);
    static _Alignas(64) uint32_t x[1001];
    for (int i = 0; i < 1001; i++) x[i] = i % 5 ? (uint32_t)i * 2654435761u : (uint32_t)i; /* i % 5 == 0: a denormal */
    for (int off = 0; off <= 1; off++)
        for (int n = 0; n <= 1000; n += n < 130 ? 1 : 87) {
            uint32_t want = 0;
            for (int i = 0; i < n; i++) want += x[off + i];
            CHECK(ds4_read_sum(x + off, n) == want, "%s: read_sum n=%d at offset %d", ds4_simd_level_name(lvl), n, off);
        }
}

/* Activation quants replaced by raw random bytes, the scales kept: for
 * Q8_0 -128 too, which the quantizer never writes; for Q8_K -127..127, as
 * its quantizer writes (the IQ2_XXS dot moves each weight's sign onto the
 * activation, and -(-128) is no byte). */
static void raw_act_quants(uint32_t type, void *act, int64_t n) {
    const bool q8_0 = type == DS4_TYPE_Q8_0;
    const size_t block = q8_0 ? sizeof(ds4_block_q8_0) : sizeof(ds4_block_q8_K);
    const size_t qs = q8_0 ? offsetof(ds4_block_q8_0, qs) : offsetof(ds4_block_q8_K, qs);
    const int64_t elems = q8_0 ? DS4_QK8_0 : DS4_QK_K;
    for (int64_t b = 0; b < n / elems; b++)
        for (int64_t e = 0; e < elems; e++)
            ((int8_t *)act)[(size_t)b * block + qs + (size_t)e] =
                (int8_t)(q8_0 ? (int)(next_u64() % 256) - 128 : (int)(next_u64() % 255) - 127);
}

/* The AMX level's orders (ds4_vec_dot_*_blockwise, plain C, so this runs
 * everywhere) against both oracles, within f32 rounding, for block counts
 * from 1 to 512 (Q8_0) or 33 (IQ2_XXS) and odd ones, raw bytes (-128
 * included) and quantized rows; and the Q8_0 order spelled out once more
 * here (test_iq2_xxs_exhaustive checks the IQ2_XXS integers exactly). */
static void test_blockwise_models(void) {
    static const uint32_t model_types[] = {DS4_TYPE_Q8_0, DS4_TYPE_IQ2_XXS};
    static const int64_t blocks[] = {1, 2, 3, 5, 16, 17, 33, 128, 129, 512};
    for (size_t ti = 0; ti < sizeof model_types / sizeof model_types[0]; ti++) {
        const uint32_t type = model_types[ti];
        const int64_t elems = (int64_t)ds4_type_block_elems(type), max_blocks = type == DS4_TYPE_Q8_0 ? 512 : 33;
        for (size_t i = 0; i < sizeof blocks / sizeof blocks[0] && blocks[i] <= max_blocks; i++) {
            const int64_t n = blocks[i] * elems;
            void *w = malloc(ds4_type_row_bytes(type, (uint64_t)n)), *a = malloc(ds4_act_bytes(type, n));
            float *x = malloc(sizeof(float) * (size_t)n);
            for (int rep = 0; rep < 8; rep++) {
                if (rep % 2) random_raw_row(type, w, n);
                else quantized_row(type, w, n);
                random_floats(x, n);
                ds4_quantize_act(type, x, a, n);
                if (rep % 4 == 3) raw_act_quants(type, a, n);
                const float model = blockwise_model(type)(w, a, n);
                const float ref = ds4_vec_dot_ref(type, w, a, n);
                double mag, exact = dequant_dot(type, w, a, n, &mag);
                /* each block adds one rounding of at most eps * the running sum */
                const double tol = 1e-5 * mag + 1e-30;
                CHECK(fabs((double)model - ref) <= tol, "%s n=%lld rep=%d: model %.9g reference %.9g (tol %.3g)",
                      ds4_type_name(type), (long long)n, rep, model, ref, tol);
                CHECK(fabs((double)model - exact) <= tol, "%s n=%lld rep=%d: model %.9g f64 %.9g (tol %.3g)",
                      ds4_type_name(type), (long long)n, rep, model, exact, tol);
            }
            free(w);
            free(a);
            free(x);
        }
    }
    /* the order is the documented one: blocks in sequence, one fma each */
    ds4_block_q8_0 w[3], a[3];
    quantized_row(DS4_TYPE_Q8_0, w, 96);
    quantized_row(DS4_TYPE_Q8_0, a, 96);
    float acc = 0.0f;
    for (int b = 0; b < 3; b++) {
        int32_t isum = 0;
        for (int k = 0; k < DS4_QK8_0; k++) isum += w[b].qs[k] * a[b].qs[k];
        acc = fmaf((float)isum, ds4_half_to_f32(w[b].d) * ds4_half_to_f32(a[b].d), acc);
    }
    const float model = ds4_vec_dot_q8_0_blockwise(w, a, 96);
    CHECK(!memcmp(&model, &acc, sizeof acc), "model %.9g, the order spelled out %.9g", model, acc);
}

enum { AMX_ROWS_MAX = 40, AMX_T_MAX = 40 };

/* one weight matrix of AMX_ROWS_MAX rows and AMX_T_MAX activations; want[t][r] is the
 * model's result, computed once (it does not depend on the batch) */
struct amx_case {
    uint32_t type;
    int64_t n;
    size_t row_bytes, act_bytes;
    uint8_t *W, *acts;
    float *want, *y;
};

static struct amx_case amx_case_new(uint32_t type, int64_t n) {
    struct amx_case c = {.type = type, .n = n, .row_bytes = ds4_type_row_bytes(type, (uint64_t)n),
                         .act_bytes = ds4_act_bytes(type, n)};
    c.W = malloc(c.row_bytes * AMX_ROWS_MAX);
    c.acts = malloc(c.act_bytes * AMX_T_MAX);
    c.want = malloc(sizeof(float) * AMX_ROWS_MAX * AMX_T_MAX);
    c.y = malloc(sizeof(float) * AMX_ROWS_MAX * AMX_T_MAX);
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int r = 0; r < AMX_ROWS_MAX; r++) {
        uint8_t *row = c.W + c.row_bytes * (size_t)r;
        if (r % 3 == 2 && (type == DS4_TYPE_Q8_0 || r < 16)) quantized_row(type, row, n); /* IQ2_XXS's search is slow */
        else random_raw_row(type, row, n);
    }
    for (int t = 0; t < AMX_T_MAX; t++) {
        uint8_t *act = c.acts + c.act_bytes * (size_t)t;
        random_floats(x, n);
        ds4_quantize_act(type, x, act, n);
        if (t % 5 == 4) raw_act_quants(type, act, n);
    }
    free(x);
    for (int t = 0; t < AMX_T_MAX; t++)
        for (int r = 0; r < AMX_ROWS_MAX; r++)
            c.want[t * AMX_ROWS_MAX + r] =
                blockwise_model(type)(c.W + c.row_bytes * (size_t)r, c.acts + c.act_bytes * (size_t)t, n);
    return c;
}

static void amx_case_free(struct amx_case *c) {
    free(c->W);
    free(c->acts);
    free(c->want);
    free(c->y);
}

/* outputs of a rows x T result (row-major by token) that differ from the model */
static int mismatches(const struct amx_case *c, int64_t rows, int64_t T) {
    int bad = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t r = 0; r < rows; r++) bad += memcmp(&c->y[t * rows + r], &c->want[t * AMX_ROWS_MAX + r], sizeof(float)) != 0;
    return bad;
}

/* Where the CPU has AMX: at that level the tiles (Q8_0: 16 rows x 1..16
 * tokens; IQ2_XXS: 16 rows x 3..16; fewer rows at a matrix's end), the
 * matvec and the per-row kernels must equal the model BIT FOR BIT:
 * ds4_vec_dot, ds4_matvec, and ds4_matmul at every batch size 1..40 (a
 * dozen of them on the wider rows), row counts that are not multiples of
 * 16, odd block counts, rows too long for a full token group in the
 * packing buffer, 1 and 2 threads. */
static void test_amx_kernels_against_model(void) {
    static const struct {
        uint32_t type;
        int64_t n;
        bool all_batches; /* every T = 1..40, else a dozen covering each path */
    } cases[] = {
        /* Q8_0: 1, 3, 5, 33 blocks; 4096 the model's width; 16384 packs 7
         * tokens per group, not 16 (the driver shrinks the group); 16416 an
         * odd count too */
        {DS4_TYPE_Q8_0, 32, true}, {DS4_TYPE_Q8_0, 96, true}, {DS4_TYPE_Q8_0, 160, true},
        {DS4_TYPE_Q8_0, 1056, true}, {DS4_TYPE_Q8_0, 4096, false}, {DS4_TYPE_Q8_0, 16384, false},
        {DS4_TYPE_Q8_0, 16416, false},
        /* IQ2_XXS: 1, 3, 5 super-blocks; 4096 the experts' width; 7936 the
         * longest row a group of 16 tokens packs for, 8192 packs 15 */
        {DS4_TYPE_IQ2_XXS, 256, true}, {DS4_TYPE_IQ2_XXS, 768, true}, {DS4_TYPE_IQ2_XXS, 1280, true},
        {DS4_TYPE_IQ2_XXS, 4096, false}, {DS4_TYPE_IQ2_XXS, 7936, false}, {DS4_TYPE_IQ2_XXS, 8192, false},
    };
    static const int64_t row_counts[] = {1, 15, 16, 17, AMX_ROWS_MAX};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        struct amx_case c = amx_case_new(cases[ci].type, cases[ci].n);
        const int64_t n = c.n;
        const char *tn = ds4_type_name(c.type);
        for (int r = 0; r < AMX_ROWS_MAX; r++) {
            float got = ds4_vec_dot(c.type, c.W + c.row_bytes * (size_t)r, c.acts, n);
            CHECK(!memcmp(&got, &c.want[r], sizeof got), "%s dot n=%lld row %d: %.9g, model %.9g", tn, (long long)n, r,
                  got, c.want[r]);
        }
        for (int threads = 1; threads <= 2; threads++) {
            ds4_pool *pool = threads == 1 ? NULL : ds4_pool_new(threads);
            for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++) {
                const int64_t rows = row_counts[ri];
                for (int64_t t = 0; t < AMX_T_MAX; t += 7) {
                    for (int64_t r = 0; r < rows; r++) c.y[r] = NAN;
                    ds4_matvec(pool, c.type, c.W, rows, n, c.acts + c.act_bytes * (size_t)t, c.y);
                    int bad = 0;
                    for (int64_t r = 0; r < rows; r++) bad += memcmp(&c.y[r], &c.want[t * AMX_ROWS_MAX + r], sizeof(float)) != 0;
                    CHECK(bad == 0, "%s matvec n=%lld rows=%lld token %lld threads=%d: %d rows differ from the model", tn,
                          (long long)n, (long long)rows, (long long)t, threads, bad);
                }
                for (int64_t T = 1; T <= AMX_T_MAX; T++) {
                    /* a few batch sizes cover every tile path and the
                     * shrunken groups (7 tokens at 16384 for Q8_0) */
                    if (!cases[ci].all_batches && !(T <= 9 || T == 16 || T == 17 || T == 33 || T == AMX_T_MAX)) continue;
                    for (int64_t i = 0; i < rows * T; i++) c.y[i] = NAN;
                    ds4_matmul(pool, c.type, c.W, rows, n, c.acts, T, c.y);
                    int bad = mismatches(&c, rows, T);
                    CHECK(bad == 0, "%s matmul n=%lld rows=%lld T=%lld threads=%d: %d outputs differ from the model", tn,
                          (long long)n, (long long)rows, (long long)T, threads, bad);
                }
            }
            /* a batch that starts elsewhere in the same tokens gives the same rows */
            for (int64_t i = 0; i < AMX_ROWS_MAX * (AMX_T_MAX - 3); i++) c.y[i] = NAN;
            ds4_matmul(pool, c.type, c.W, AMX_ROWS_MAX, n, c.acts + 3 * c.act_bytes, AMX_T_MAX - 3, c.y);
            int bad = 0;
            for (int64_t t = 0; t < AMX_T_MAX - 3; t++)
                for (int64_t r = 0; r < AMX_ROWS_MAX; r++)
                    bad += memcmp(&c.y[t * AMX_ROWS_MAX + r], &c.want[(t + 3) * AMX_ROWS_MAX + r], sizeof(float)) != 0;
            CHECK(bad == 0, "%s matmul n=%lld offset batch threads=%d: %d outputs differ from the model", tn, (long long)n,
                  threads, bad);
            ds4_pool_free(pool);
        }
        amx_case_free(&c);
    }
}

/* The stream-prefetch default follows the vendor string CPUID gives this
 * process (under qemu-x86_64 the emulated CPU's, which /proc/cpuinfo does
 * not show): off on AMD and Hygon, on elsewhere; the setter overrides it */
static void test_stream_prefetch_default(void) {
    unsigned a, regs[3];
    if (!__get_cpuid(0, &a, &regs[0], &regs[2], &regs[1])) {
        printf("test_kernels: NOT RUN: the stream-prefetch default against the CPU vendor (no CPUID leaf 0)\n");
        return;
    }
    char vendor[13];
    memcpy(vendor, regs, 12);
    vendor[12] = '\0';
    const bool amd = !strcmp(vendor, "AuthenticAMD") || !strcmp(vendor, "HygonGenuine");
    CHECK(ds4_kernels_stream_prefetch() == !amd, "stream prefetch %s by default on a %s CPU",
          ds4_kernels_stream_prefetch() ? "on" : "off", vendor);
    ds4_kernels_set_stream_prefetch(amd);
    CHECK(ds4_kernels_stream_prefetch() == amd, "ds4_kernels_set_stream_prefetch sets it");
    ds4_kernels_set_stream_prefetch(!amd);
}

int main(void) {
    enum ds4_simd_level best = ds4_cpu_best_level();
    report_levels_not_run("test_kernels");
    CHECK(!strcmp(ds4_simd_level_name(DS4_SIMD_AVX2), "avx2"), "names");
    ds4_kernels_set_level(DS4_SIMD_AMX);
    CHECK(ds4_kernels_level() == best, "set_level clamps to the best level");
    for (int l = DS4_SIMD_SCALAR; l <= (int)best; l++) {
        test_act((enum ds4_simd_level)l);
        test_dots((enum ds4_simd_level)l);
        test_drivers((enum ds4_simd_level)l);
        test_matmul_shapes((enum ds4_simd_level)l);
        test_matmul_long_rows((enum ds4_simd_level)l);
        test_matrix_at_mapping_end((enum ds4_simd_level)l);
        test_read_sum((enum ds4_simd_level)l);
        test_iq2_xxs_exhaustive((enum ds4_simd_level)l, ds4_kernels_vbmi() ? "vbmi" : "no vbmi");
    }
    /* the kernels that read one row, and a one-token Q8_0 matvec at
     * avx512 (rows side by side or one after another), the other way
     * round from this CPU's default: the same results */
    test_stream_prefetch_default();
    const bool stream_default = ds4_kernels_stream_prefetch();
    ds4_kernels_set_stream_prefetch(!stream_default);
    for (int l = DS4_SIMD_SCALAR; l <= (int)best; l++) {
        test_drivers((enum ds4_simd_level)l);
        test_matrix_at_mapping_end((enum ds4_simd_level)l);
        test_read_sum((enum ds4_simd_level)l);
    }
    ds4_kernels_set_stream_prefetch(stream_default);
    ds4_kernels_set_vbmi(true);
    if (ds4_kernels_vbmi()) {
        ds4_kernels_set_level(DS4_SIMD_AVX512);
        ds4_kernels_set_vbmi(false);
        test_iq2_xxs_exhaustive(DS4_SIMD_AVX512, "gather");
        test_vbmi_matches_plain();
    } else {
        printf("test_kernels: NOT RUN: the AVX-512 VBMI/GFNI kernels (this CPU lacks AVX-512, VBMI or GFNI)\n");
    }
    ds4_kernels_set_avxvnni(true);
    if (ds4_kernels_avxvnni()) {
        test_avxvnni_matches_plain(DS4_TYPE_Q8_0);
        test_avxvnni_matches_plain(DS4_TYPE_IQ2_XXS);
        test_avxvnni_matches_plain(DS4_TYPE_Q2_K);
        /* the levels above ran the AVX-VNNI kernels at avx2: the
         * plain ones against the oracles and the drivers too */
        ds4_kernels_set_avxvnni(false);
        test_dots(DS4_SIMD_AVX2);
        test_drivers(DS4_SIMD_AVX2);
        test_matmul_shapes(DS4_SIMD_AVX2);
        test_matmul_long_rows(DS4_SIMD_AVX2);
        ds4_kernels_set_avxvnni(true);
    } else {
        printf("test_kernels: NOT RUN: the AVX-VNNI kernels of the avx2 level (this CPU lacks AVX2 or "
               "AVX-VNNI)\n");
    }
    test_blockwise_models();
    if (best >= DS4_SIMD_AMX) {
        ds4_kernels_set_level(DS4_SIMD_AMX);
        test_amx_kernels_against_model();
    } else {
        /* says so, and counts nothing for it */
        printf("test_kernels: NOT RUN: the AMX kernels against the model of their float order (this CPU or OS "
               "has no AMX-INT8; tests/kernels/test_avx512_emulated.sh runs them emulated)\n");
    }
    ds4_kernels_set_level(best);
    return check_done("test_kernels");
}
