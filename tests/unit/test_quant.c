/* test_quant -- block formats: traits, conversions, the sheet's worked
 * examples, quantizer invariants and error bounds, reference dots against the
 * dequantize-then-multiply oracle.
 *
 * Bit-exact agreement with gguf-py (its dequantizers, and its Q8_0/F16/BF16
 * quantizers) is checked live by tests/quant/test_quant_ggufpy.py, which
 * drives this binary's pipe modes:
 *   test_quant --quantize TYPE N [IMATRIX.f32]   f32 rows on stdin -> blocks
 *   test_quant --dequantize TYPE N               blocks on stdin -> f32 rows
 *   test_quant --traits                          "id name elems bytes" lines */
#include "check.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- deterministic data ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_u64(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float rng_uniform(void) { return (float)((rng_u64() >> 40) + 0.5) / 16777216.0f; }
static float rng_gauss(void) {
    return sqrtf(-2.0f * logf(rng_uniform())) * cosf(6.28318530718f * rng_uniform());
}

/* ---- pipe modes for the python cross-check ---- */

static int pipe_mode(int argc, char **argv) {
    if (strcmp(argv[1], "--traits") == 0) {
        for (uint32_t id = 0; id < 64; id++)
            if (ds4_type_name(id))
                printf("%u %s %zu %zu\n", id, ds4_type_name(id), ds4_type_block_elems(id),
                       ds4_type_block_bytes(id));
        return 0;
    }
    if (argc < 4) return 2;
    int type = ds4_type_from_name(argv[2]);
    int64_t n = atoll(argv[3]);
    size_t rb = ds4_type_row_bytes((uint32_t)type, (uint64_t)n);
    if (type < 0 || n <= 0 || rb == 0) {
        fprintf(stderr, "test_quant: bad type or row length\n");
        return 2;
    }
    float *f = malloc((size_t)n * sizeof(float)), *imp = NULL;
    uint8_t *q = malloc(rb);
    if (argc > 4) {
        FILE *fi = fopen(argv[4], "rb");
        imp = malloc((size_t)n * sizeof(float));
        if (!fi || fread(imp, sizeof(float), (size_t)n, fi) != (size_t)n) {
            fprintf(stderr, "test_quant: cannot read imatrix %s\n", argv[4]);
            return 2;
        }
        fclose(fi);
    }
    bool quantize = strcmp(argv[1], "--quantize") == 0;
    for (;;) {
        if (quantize) {
            if (fread(f, sizeof(float), (size_t)n, stdin) != (size_t)n) break;
            ds4_quantize_row((uint32_t)type, f, q, n, imp);
            fwrite(q, 1, rb, stdout);
        } else {
            if (fread(q, 1, rb, stdin) != rb) break;
            ds4_dequantize_row((uint32_t)type, q, f, n);
            fwrite(f, sizeof(float), (size_t)n, stdout);
        }
    }
    free(f);
    free(q);
    free(imp);
    return 0;
}

/* ---- traits and conversions ---- */

static void test_traits(void) {
    static const struct { uint32_t id; const char *name; size_t elems, bytes; } T[] = {
        {0, "F32", 1, 4}, {1, "F16", 1, 2}, {8, "Q8_0", 32, 34}, {10, "Q2_K", 256, 84},
        {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176},
        {14, "Q6_K", 256, 210}, {15, "Q8_K", 256, 292}, {16, "IQ2_XXS", 256, 66},
        {19, "IQ1_S", 256, 50}, {20, "IQ4_NL", 32, 18}, {26, "I32", 1, 4},
        {30, "BF16", 1, 2}, {39, "MXFP4", 32, 17}, {41, "Q1_0", 128, 18},
    };
    for (size_t i = 0; i < sizeof(T) / sizeof(T[0]); i++) {
        CHECK(ds4_type_name(T[i].id) && strcmp(ds4_type_name(T[i].id), T[i].name) == 0, "%s", T[i].name);
        CHECK(ds4_type_from_name(T[i].name) == (int)T[i].id, "%s", T[i].name);
        CHECK(ds4_type_block_elems(T[i].id) == T[i].elems, "%s elems", T[i].name);
        CHECK(ds4_type_block_bytes(T[i].id) == T[i].bytes, "%s bytes", T[i].name);
    }
    uint32_t retired[] = {4, 5, 31, 32, 33, 36, 37, 38, 43, 1000};
    for (size_t i = 0; i < sizeof(retired) / sizeof(retired[0]); i++) {
        CHECK(ds4_type_name(retired[i]) == NULL, "id %u", retired[i]);
        CHECK(ds4_type_block_bytes(retired[i]) == 0 && ds4_type_row_bytes(retired[i], 256) == 0, "id %u", retired[i]);
    }
    CHECK(ds4_type_from_name("iq2_xxs") == DS4_TYPE_IQ2_XXS, "case-insensitive");
    CHECK(ds4_type_from_name("Q9_K") == -1 && ds4_type_from_name(NULL) == -1, "unknown name");
    CHECK(ds4_type_row_bytes(DS4_TYPE_Q4_K, 4096) == 16 * 144, "q4_K row");
    CHECK(ds4_type_row_bytes(DS4_TYPE_Q8_0, 48) == 0, "not a multiple");
    CHECK(ds4_type_row_bytes(DS4_TYPE_F32, 7) == 28, "f32 row");
    CHECK(ds4_type_row_bytes(DS4_TYPE_Q8_0, UINT64_MAX - 31) == 0, "overflow");
    CHECK(ds4_type_vec_dot_type(DS4_TYPE_Q8_0) == DS4_TYPE_Q8_0, "q8_0 partner");
    CHECK(ds4_type_vec_dot_type(DS4_TYPE_Q2_K) == DS4_TYPE_Q8_K &&
          ds4_type_vec_dot_type(DS4_TYPE_Q4_K) == DS4_TYPE_Q8_K &&
          ds4_type_vec_dot_type(DS4_TYPE_IQ2_XXS) == DS4_TYPE_Q8_K, "k partner");
    CHECK(ds4_type_vec_dot_type(DS4_TYPE_F16) == DS4_TYPE_F32 &&
          ds4_type_vec_dot_type(DS4_TYPE_BF16) == DS4_TYPE_F32, "float partner");
}

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static void test_conversions(void) {
    /* every finite half survives half -> f32 -> half; NaNs stay NaN */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ds4_half_to_f32((ds4_half)h);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) bad += !isnan(f);
        else bad += ds4_f32_to_half(f) != h;
    }
    CHECK(bad == 0, "%d halves do not round-trip", bad);
    CHECK(ds4_half_to_f32(0x3c00) == 1.0f && ds4_half_to_f32(0x0001) == ldexpf(1, -24), "half values");
    CHECK(ds4_half_to_f32(0x7bff) == 65504.0f && isinf(ds4_half_to_f32(0xfc00)), "half range");
    /* rounding: ties to even, overflow to inf, subnormal results kept */
    CHECK(ds4_f32_to_half(1.0f + ldexpf(1, -11)) == 0x3c00, "tie to even (down)");
    CHECK(ds4_f32_to_half(1.0f + 3 * ldexpf(1, -11)) == 0x3c02, "tie to even (up)");
    CHECK(ds4_f32_to_half(65519.0f) == 0x7bff && ds4_f32_to_half(65520.0f) == 0x7c00, "overflow");
    CHECK(ds4_f32_to_half(ldexpf(1, -25)) == 0 && ds4_f32_to_half(ldexpf(1.5f, -25)) == 1, "subnormal");
    CHECK(ds4_f32_to_half(ldexpf(3, -25)) == 2, "subnormal tie to even");
    CHECK(ds4_f32_to_half(-NAN) == 0xfe00 && ds4_f32_to_half(NAN) == 0x7e00, "nan");
    CHECK(ds4_f32_to_half(-0.0f) == 0x8000, "negative zero");
    /* bf16: upper half, nearest even, quiet NaN */
    CHECK(ds4_bf16_to_f32(0x3f80) == 1.0f, "bf16 one");
    CHECK(ds4_f32_to_bf16(1.0f) == 0x3f80, "bf16 exact");
    float tie_down, tie_up;
    uint32_t u1 = 0x3f808000u, u2 = 0x3f818000u;
    memcpy(&tie_down, &u1, 4);
    memcpy(&tie_up, &u2, 4);
    CHECK(ds4_f32_to_bf16(tie_down) == 0x3f80 && ds4_f32_to_bf16(tie_up) == 0x3f82, "bf16 ties");
    uint32_t snan = 0x7f800001u;
    float fsnan;
    memcpy(&fsnan, &snan, 4);
    CHECK(ds4_f32_to_bf16(fsnan) == 0x7fc0, "bf16 nan quieted: %04x", ds4_f32_to_bf16(fsnan));
    CHECK(bits(ds4_bf16_to_f32(ds4_f32_to_bf16(INFINITY))) == bits(INFINITY), "bf16 inf");
}

/* ---- worked examples of gguf-and-quants.md ---- */

static void test_worked_examples(void) {
    ds4_block_q4_K b4;
    memset(&b4, 0, sizeof(b4));
    b4.d = b4.dmin = 0x3c00;
    static const uint8_t S[12] = {0xC1, 0x02, 0x03, 0x04, 0x45, 0x06, 0x07, 0x08, 0x9A, 0, 0, 0};
    memcpy(b4.scales, S, 12);
    b4.qs[0] = 1;      /* element 0 */
    b4.qs[64] = 1;     /* element 128: chunk 2, byte 0, low nibble */
    float y[256];
    ds4_dequantize_row(DS4_TYPE_Q4_K, &b4, y, 256);
    CHECK(y[0] == -4 && y[1] == -5 && y[128] == 33 && y[129] == -25, "q4_K example: %g %g %g %g",
          y[0], y[1], y[128], y[129]);

    ds4_block_iq2_xxs bi;
    memset(&bi, 0, sizeof(bi));
    bi.d = 0x3c00;
    static const uint8_t sb0[8] = {0x01, 0, 0, 0, 0x01, 0, 0, 0xF0};
    memcpy(bi.qs, sb0, 8);
    ds4_dequantize_row(DS4_TYPE_IQ2_XXS, &bi, y, 256);
    static const float g0[8] = {-166.625f, 31, 31, 31, 31, 31, 31, -31};
    int bad = 0;
    for (int j = 0; j < 8; j++) bad += y[j] != g0[j] || y[8 + j] != 31.0f;
    CHECK(bad == 0, "iq2_xxs example: %g %g %g", y[0], y[7], y[8]);
}

static void test_iq2xxs_tables(void) {
    uint64_t sum = 0, x = 0;
    int counts[3] = {0, 0, 0}, ordered = 1;
    for (int i = 0; i < 256; i++) {
        sum += ds4_iq2xxs_grid[i];
        x ^= ds4_iq2xxs_grid[i];
        if (i) ordered &= ds4_iq2xxs_grid[i] > ds4_iq2xxs_grid[i - 1];
        for (int j = 0; j < 8; j++) {
            int v = (int)((ds4_iq2xxs_grid[i] >> (8 * j)) & 0xff);
            counts[0] += v == 0x08;
            counts[1] += v == 0x19;
            counts[2] += v == 0x2b;
        }
    }
    CHECK(ordered && sum == 0x8b267e217ce24363ull && x == 0x0000003232003211ull, "grid checksums");
    CHECK(counts[0] == 1127 && counts[1] == 556 && counts[2] == 365, "grid byte counts");
    int ks = 0, kbad = 0;
    for (int k = 0; k < 128; k++) {
        ks += ds4_ksigns_iq2xs[k];
        kbad += (ds4_ksigns_iq2xs[k] & 127) != k || (__builtin_popcount(ds4_ksigns_iq2xs[k]) & 1);
    }
    CHECK(ks == 16320 && kbad == 0, "ksigns");
    for (int j = 0; j < 8; j++) CHECK(ds4_kmask_iq2xs[j] == 1u << j, "kmask %d", j);
}

/* ---- quantizers ---- */

static const uint32_t WEIGHT_TYPES[] = {
    DS4_TYPE_Q8_0, DS4_TYPE_Q2_K, DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K, DS4_TYPE_IQ2_XXS,
};
#define N_WEIGHT_TYPES (sizeof(WEIGHT_TYPES) / sizeof(WEIGHT_TYPES[0]))

/* Relative RMSE bounds on N(0,1) rows, measured with this quantizer (fixed seed)
 * and given 5-8% headroom (see the printed table). */
static double rmse_bound(uint32_t type) {
    switch (type) {
    case DS4_TYPE_Q8_0: return 0.0058;   /* measured 0.00536 */
    case DS4_TYPE_Q2_K: return 0.32;     /* measured 0.29993 */
    case DS4_TYPE_Q4_K: return 0.076;    /* measured 0.07173 */
    case DS4_TYPE_Q5_K: return 0.039;    /* measured 0.03627 */
    case DS4_TYPE_Q6_K: return 0.019;    /* measured 0.01776 */
    case DS4_TYPE_IQ2_XXS: return 0.365; /* measured 0.34444 */
    default: return 0.0;
    }
}

/* weighted relative error Σ imp·(x-y)² / Σ imp·x² */
static double rel_err(const float *x, const float *y, const float *imp, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double w = imp ? imp[i] : 1.0;
        num += w * (x[i] - y[i]) * (x[i] - y[i]);
        den += w * x[i] * x[i];
    }
    return num / den;
}

static void test_quantize_error(void) {
    enum { ROWS = 32, N = 2048 };
    float *x = malloc(sizeof(float) * ROWS * N), *y = malloc(sizeof(float) * N);
    uint8_t *q = malloc(ds4_type_row_bytes(DS4_TYPE_F32, N));
    for (int i = 0; i < ROWS * N; i++) x[i] = rng_gauss();
    printf("  %-8s %10s %10s\n", "type", "rel.rmse", "bound");
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++) {
        uint32_t type = WEIGHT_TYPES[t];
        double err = 0;
        for (int r = 0; r < ROWS; r++) {
            size_t nb = ds4_quantize_row(type, x + r * N, q, N, NULL);
            CHECK(nb == ds4_type_row_bytes(type, N), "%s bytes", ds4_type_name(type));
            ds4_dequantize_row(type, q, y, N);
            err += rel_err(x + r * N, y, NULL, N);
        }
        double rmse = sqrt(err / ROWS);
        printf("  %-8s %10.5f %10.5f\n", ds4_type_name(type), rmse, rmse_bound(type));
        CHECK(rmse < rmse_bound(type), "%s rel rmse %g", ds4_type_name(type), rmse);
    }
    free(x);
    free(y);
    free(q);
}

/* Importance weights must buy lower error where they are large: with a
 * strongly varying imatrix the weighted error beats the unweighted quantizer. */
static void test_imatrix_helps(void) {
    enum { ROWS = 16, N = 1024 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    float *imp = malloc(sizeof(float) * N);
    uint8_t *q = malloc(ds4_type_row_bytes(DS4_TYPE_F32, N));
    for (int i = 0; i < N; i++) imp[i] = expf(3.0f * rng_gauss());
    for (size_t t = 1; t < N_WEIGHT_TYPES; t++) {
        uint32_t type = WEIGHT_TYPES[t];
        double with = 0, without = 0;
        for (int r = 0; r < ROWS; r++) {
            for (int i = 0; i < N; i++) x[i] = rng_gauss();
            ds4_quantize_row(type, x, q, N, imp);
            ds4_dequantize_row(type, q, y, N);
            with += rel_err(x, y, imp, N);
            ds4_quantize_row(type, x, q, N, NULL);
            ds4_dequantize_row(type, q, y, N);
            without += rel_err(x, y, imp, N);
        }
        printf("  %-8s weighted err with imatrix %.5f, without %.5f\n", ds4_type_name(type),
               with / ROWS, without / ROWS);
        CHECK(with < without, "%s: imatrix does not help (%g vs %g)", ds4_type_name(type), with, without);
    }
    free(x);
    free(y);
    free(imp);
    free(q);
}

static void test_q8_K(void) {
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = rng_gauss();
    x[77] = 9.0f;
    ds4_block_q8_K b;
    ds4_quantize_row(DS4_TYPE_Q8_K, x, &b, 256, NULL);
    CHECK(b.qs[77] == -127 && b.d == 1.0f / (-127.0f / 9.0f), "q8_K sign convention: %d %g", b.qs[77], b.d);
    int bad = 0;
    for (int g = 0; g < 16; g++) {
        int s = 0;
        for (int i = 0; i < 16; i++) s += b.qs[16 * g + i];
        bad += s != b.bsums[g];
    }
    CHECK(bad == 0, "bsums");
    for (int i = 0; i < 256; i++) bad += fabsf(b.d * b.qs[i] - x[i]) > fabsf(b.d) * 0.5f + 1e-6f;
    CHECK(bad == 0, "q8_K within half a step");
    memset(x, 0, sizeof(x));
    memset(&b, 0x55, sizeof(b));
    ds4_quantize_row(DS4_TYPE_Q8_K, x, &b, 256, NULL);
    ds4_block_q8_K zero;
    memset(&zero, 0, sizeof(zero));
    CHECK(memcmp(&b, &zero, sizeof(b)) == 0, "zero block is all zero bytes");
}

/* Degenerate rows: all zero, constant, a single spike, tiny values, and an
 * importance vector that is zero on the first block. Every quantizer must
 * give finite output, zero rows must decode to exact zeros. */
static void test_degenerate(void) {
    float x[512], y[512], imp[512];
    uint8_t q[1024];
    for (int i = 0; i < 512; i++) imp[i] = i < 256 ? 0.0f : 1.0f;
    for (size_t t = 0; t < N_WEIGHT_TYPES; t++) {
        uint32_t type = WEIGHT_TYPES[t];
        for (int c = 0; c < 8; c++) {
            for (int i = 0; i < 512; i++)
                x[i] = c % 4 == 0 ? 0.0f : c % 4 == 1 ? -0.75f : c % 4 == 2 ? (i == 300 ? 5.0f : 0.0f)
                                                                        : 1e-20f * rng_gauss();
            ds4_quantize_row(type, x, q, 512, c < 4 ? NULL : imp);
            ds4_dequantize_row(type, q, y, 512);
            int bad = 0;
            for (int i = 0; i < 512; i++) bad += !isfinite(y[i]) || (c == 0 && y[i] != 0.0f);
            CHECK(bad == 0, "%s case %d", ds4_type_name(type), c);
        }
    }
}

/* ---- reference dots ---- */

static void test_vec_dot(void) {
    enum { N = 1024 };
    static const uint32_t TYPES[] = {
        DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0, DS4_TYPE_Q2_K, DS4_TYPE_Q3_K,
        DS4_TYPE_Q4_K, DS4_TYPE_Q5_K, DS4_TYPE_Q6_K, DS4_TYPE_Q8_K, DS4_TYPE_IQ2_XXS,
    };
    float w[N], a[N], wd[N], ad[N];
    uint8_t wq[N * 4], aq[N * 4];
    for (size_t t = 0; t < sizeof(TYPES) / sizeof(TYPES[0]); t++) {
        uint32_t type = TYPES[t], at = ds4_type_vec_dot_type(type);
        for (int trial = 0; trial < 8; trial++) {
            for (int i = 0; i < N; i++) {
                w[i] = rng_gauss();
                a[i] = rng_gauss() * (trial & 1 ? 100.0f : 0.01f);
            }
            size_t rb = ds4_type_row_bytes(type, N);
            if (type == DS4_TYPE_Q3_K) {
                /* no Q3_K quantizer: random payload with a sane f16 scale */
                for (size_t i = 0; i < rb; i++) wq[i] = (uint8_t)rng_u64();
                for (int b = 0; b < N / 256; b++) {
                    ds4_half d = ds4_f32_to_half(rng_gauss() * 0.01f);
                    memcpy(wq + 110 * b + 108, &d, 2);
                }
            } else {
                ds4_quantize_row(type, w, wq, N, NULL);
            }
            ds4_quantize_row(at, a, aq, N, NULL);
            ds4_dequantize_row(type, wq, wd, N);
            ds4_dequantize_row(at, aq, ad, N);
            double ref = 0, mag = 0;
            for (int i = 0; i < N; i++) {
                ref += (double)wd[i] * ad[i];
                mag += fabs((double)wd[i] * ad[i]);
            }
            float got = ds4_vec_dot_ref(type, wq, aq, N);
            CHECK(fabs(got - ref) <= 1e-5 * mag, "%s trial %d: %.9g vs %.9g (mag %g)",
                  ds4_type_name(type), trial, got, ref, mag);
        }
    }
}

int main(int argc, char **argv) {
    if (argc > 1) return pipe_mode(argc, argv);
    ds4_quant_init();
    test_traits();
    test_conversions();
    test_worked_examples();
    test_iq2xxs_tables();
    test_q8_K();
    test_degenerate();
    test_quantize_error();
    test_imatrix_helps();
    test_vec_dot();
    return check_done("test_quant");
}
