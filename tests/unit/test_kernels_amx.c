/* test_kernels_amx.c -- the AMX level's Q8_0 float order.
 *
 * 1. Everywhere: the plain-C model of that order
 *    (ds4_vec_dot_q8_0_blockwise) against two independent oracles, quant.c's
 *    scalar reference dot and an f64 dot of the dequantized rows, within f32
 *    rounding, on properly quantized rows and on raw random bytes (every
 *    quant value, -128 included) for block counts 1..512 and odd ones.
 * 2. Where the CPU has AMX (and the OS allows it): at that level the tile
 *    (16 rows x 1..16 tokens), the matvec and the per-row kernels for the
 *    rows left over must equal the model BIT FOR BIT (memcmp): ds4_vec_dot,
 *    ds4_matvec, and ds4_matmul at every batch size 1..40, with row counts
 *    that are not multiples of 16, odd block counts, rows too long for a
 *    full token group in the packing buffer, 1 and 2 threads. Where it has
 *    not, this part says that it did NOT run and counts nothing: the
 *    kernels are then untested here, only the order they must follow.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels_cpu.h"
#include "quant.h"
#include "threadpool.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint64_t next_u64(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float uniform(float lo, float hi) { return lo + (hi - lo) * (float)(next_u64() >> 40) / (float)(1 << 24); }

/* floats whose magnitude varies by block, so the block scales differ */
static void random_floats(float *x, int64_t n) {
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 32 == 0) scale = uniform(0.01f, 4.0f);
        x[i] = uniform(-scale, scale);
    }
}

/* n/32 blocks of random bytes with finite, modest f16 scales */
static void random_raw_blocks(ds4_block_q8_0 *b, int64_t n) {
    for (int64_t i = 0; i < n / DS4_QK8_0; i++) {
        for (int k = 0; k < DS4_QK8_0; k++) b[i].qs[k] = (int8_t)next_u64();
        b[i].d = ds4_f32_to_half(uniform(-0.02f, 0.02f));
    }
}

static void quantized_blocks(ds4_block_q8_0 *b, int64_t n) {
    float *x = malloc(sizeof(float) * (size_t)n);
    random_floats(x, n);
    ds4_quantize_row(DS4_TYPE_Q8_0, x, b, n, NULL);
    free(x);
}

/* f64 dot of the dequantized rows, and sum |w * a| for the tolerance */
static double dequant_dot(const void *w, const void *a, int64_t n, double *mag) {
    float *wf = malloc(sizeof(float) * (size_t)n), *af = malloc(sizeof(float) * (size_t)n);
    ds4_dequantize_row(DS4_TYPE_Q8_0, w, wf, n);
    ds4_dequantize_row(DS4_TYPE_Q8_0, a, af, n);
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

static void test_model_against_references(void) {
    static const int64_t blocks[] = {1, 2, 3, 5, 16, 17, 33, 128, 129, 512};
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        const int64_t n = blocks[i] * DS4_QK8_0;
        ds4_block_q8_0 *w = malloc(sizeof(ds4_block_q8_0) * (size_t)blocks[i]);
        ds4_block_q8_0 *a = malloc(sizeof(ds4_block_q8_0) * (size_t)blocks[i]);
        for (int rep = 0; rep < 8; rep++) {
            if (rep % 2) random_raw_blocks(w, n);
            else quantized_blocks(w, n);
            if (rep % 4 == 3) random_raw_blocks(a, n);
            else quantized_blocks(a, n);
            const float model = ds4_vec_dot_q8_0_blockwise(w, a, n);
            const float ref = ds4_vec_dot_ref(DS4_TYPE_Q8_0, w, a, n);
            double mag, exact = dequant_dot(w, a, n, &mag);
            /* each block adds one rounding of at most eps * the running sum */
            const double tol = 1e-5 * mag + 1e-30;
            CHECK(fabs((double)model - ref) <= tol, "n=%lld rep=%d: model %.9g reference %.9g (tol %.3g)",
                  (long long)n, rep, model, ref, tol);
            CHECK(fabs((double)model - exact) <= tol, "n=%lld rep=%d: model %.9g f64 %.9g (tol %.3g)", (long long)n,
                  rep, model, exact, tol);
        }
        free(w);
        free(a);
    }
    /* the order is the documented one: blocks in sequence, one fma each */
    ds4_block_q8_0 w[3], a[3];
    quantized_blocks(w, 96);
    quantized_blocks(a, 96);
    float acc = 0.0f;
    for (int b = 0; b < 3; b++) {
        int32_t isum = 0;
        for (int k = 0; k < DS4_QK8_0; k++) isum += w[b].qs[k] * a[b].qs[k];
        acc = fmaf((float)isum, ds4_half_to_f32(w[b].d) * ds4_half_to_f32(a[b].d), acc);
    }
    const float model = ds4_vec_dot_q8_0_blockwise(w, a, 96);
    CHECK(!memcmp(&model, &acc, sizeof acc), "model %.9g, the order spelled out %.9g", model, acc);
}

enum { ROWS_MAX = 40, T_MAX = 40 };

/* one weight matrix of ROWS_MAX rows and T_MAX activations; want[t][r] is the
 * model's result, computed once (it does not depend on the batch) */
struct amx_case {
    int64_t n;
    size_t row_bytes, act_bytes;
    uint8_t *W, *acts;
    float *want, *y;
};

static struct amx_case amx_case_new(int64_t n) {
    struct amx_case c = {.n = n, .row_bytes = ds4_type_row_bytes(DS4_TYPE_Q8_0, (uint64_t)n),
                         .act_bytes = ds4_act_bytes(DS4_TYPE_Q8_0, n)};
    c.W = malloc(c.row_bytes * ROWS_MAX);
    c.acts = malloc(c.act_bytes * T_MAX);
    c.want = malloc(sizeof(float) * ROWS_MAX * T_MAX);
    c.y = malloc(sizeof(float) * ROWS_MAX * T_MAX);
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int r = 0; r < ROWS_MAX; r++) {
        ds4_block_q8_0 *row = (ds4_block_q8_0 *)(c.W + c.row_bytes * (size_t)r);
        if (r % 3 == 2) quantized_blocks(row, n);
        else random_raw_blocks(row, n);
    }
    for (int t = 0; t < T_MAX; t++) {
        ds4_block_q8_0 *act = (ds4_block_q8_0 *)(c.acts + c.act_bytes * (size_t)t);
        if (t % 5 == 4) {
            random_raw_blocks(act, n); /* -128 too, which the quantizer never writes */
        } else {
            random_floats(x, n);
            ds4_quantize_act(DS4_TYPE_Q8_0, x, act, n);
        }
    }
    free(x);
    for (int t = 0; t < T_MAX; t++)
        for (int r = 0; r < ROWS_MAX; r++)
            c.want[t * ROWS_MAX + r] =
                ds4_vec_dot_q8_0_blockwise(c.W + c.row_bytes * (size_t)r, c.acts + c.act_bytes * (size_t)t, n);
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
        for (int64_t r = 0; r < rows; r++) bad += memcmp(&c->y[t * rows + r], &c->want[t * ROWS_MAX + r], sizeof(float)) != 0;
    return bad;
}

static void test_amx_kernels_against_model(void) {
    /* 1, 3, 5, 33 blocks; 4096 the model's width; 16384 packs 7 tokens per
     * group, not 16 (the driver shrinks the group); 16416 an odd count too */
    static const int64_t widths[] = {32, 96, 160, 1056, 4096, 16384, 16416};
    static const int64_t row_counts[] = {1, 15, 16, 17, ROWS_MAX};
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        struct amx_case c = amx_case_new(widths[wi]);
        const int64_t n = c.n;
        for (int r = 0; r < ROWS_MAX; r++) {
            float got = ds4_vec_dot(DS4_TYPE_Q8_0, c.W + c.row_bytes * (size_t)r, c.acts, n);
            CHECK(!memcmp(&got, &c.want[r], sizeof got), "dot n=%lld row %d: %.9g, model %.9g", (long long)n, r, got,
                  c.want[r]);
        }
        for (int threads = 1; threads <= 2; threads++) {
            ds4_pool *pool = threads == 1 ? NULL : ds4_pool_new(threads);
            for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++) {
                const int64_t rows = row_counts[ri];
                for (int64_t t = 0; t < T_MAX; t += 7) {
                    for (int64_t r = 0; r < rows; r++) c.y[r] = NAN;
                    ds4_matvec(pool, DS4_TYPE_Q8_0, c.W, rows, n, c.acts + c.act_bytes * (size_t)t, c.y);
                    int bad = 0;
                    for (int64_t r = 0; r < rows; r++) bad += memcmp(&c.y[r], &c.want[t * ROWS_MAX + r], sizeof(float)) != 0;
                    CHECK(bad == 0, "matvec n=%lld rows=%lld token %lld threads=%d: %d rows differ from the model",
                          (long long)n, (long long)rows, (long long)t, threads, bad);
                }
                for (int64_t T = 1; T <= T_MAX; T++) {
                    for (int64_t i = 0; i < rows * T; i++) c.y[i] = NAN;
                    ds4_matmul(pool, DS4_TYPE_Q8_0, c.W, rows, n, c.acts, T, c.y);
                    int bad = mismatches(&c, rows, T);
                    CHECK(bad == 0, "matmul n=%lld rows=%lld T=%lld threads=%d: %d outputs differ from the model",
                          (long long)n, (long long)rows, (long long)T, threads, bad);
                }
            }
            ds4_pool_free(pool);
        }
        amx_case_free(&c);
    }
}

int main(void) {
    test_model_against_references();
    ds4_kernels_set_level(DS4_SIMD_AMX);
    if (ds4_kernels_level() != DS4_SIMD_AMX) {
        printf("test_kernels_amx: the AMX kernels did NOT run: this CPU (or OS) has no AMX-INT8 (best level: %s); "
               "only the model of their float order was tested (against the references)\n",
               ds4_simd_level_name(ds4_kernels_level()));
        return check_done("test_kernels_amx (model only)");
    }
    test_amx_kernels_against_model();
    return check_done("test_kernels_amx");
}
