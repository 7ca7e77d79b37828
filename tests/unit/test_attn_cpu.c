/* test_attn_cpu.c -- ds4_attn_heads against the simple per-head loop it
 * replaced in forward_cpu (one head at a time: a dot per row, the softmax with
 * sink in double, then out += p * row element by element), compared with
 * memcmp at every SIMD level this CPU has: the kernel promises the very same
 * bits, whatever the number of heads per call, the head dimension (vector
 * tails included) or the row count. */
#include "check.h"
#include "simd_levels.h"

#include "kernels/attn_cpu.h"
#include "kernels/kernels_cpu.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rnd(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / (double)(1ull << 52) * 2.0 - 1.0);
}

/* the loop forward_cpu ran per head before ds4_attn_heads */
static void reference_head(const float *q, int D, const float *const *rows, int n, float scale, float sink,
                           float *scores, float *out) {
    float mx = sink;
    for (int i = 0; i < n; i++) {
        scores[i] = ds4_vec_dot(DS4_TYPE_F32, rows[i], q, D) * scale;
        mx = fmaxf(mx, scores[i]);
    }
    double den = exp((double)sink - mx);
    for (int i = 0; i < n; i++) { scores[i] = (float)exp((double)scores[i] - mx); den += scores[i]; }
    memset(out, 0, (size_t)D * sizeof(float));
    for (int i = 0; i < n; i++) {
        const float p = (float)(scores[i] / den);
        for (int d = 0; d < D; d++) out[d] += p * rows[i][d];
    }
}

/* A value planted into one case's inputs: the kernel must stay total on NaN,
 * infinities and huge finite values (3e38, whose scores overflow), giving
 * the loop's result; a NaN output then counts as equal to a NaN, whatever
 * its sign or payload bits. */
enum plant_site { PLANT_NONE, PLANT_QUERY, PLANT_ROW, PLANT_SINK };
struct plant {
    enum plant_site site;
    float value;
};

static int differing(const float *a, const float *b, size_t count, bool nan_equal) {
    int bad = 0;
    for (size_t i = 0; i < count; i++)
        bad += memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(nan_equal && isnan(a[i]) && isnan(b[i]));
    return bad;
}

/* n rows picked at random (repeats allowed, as a ring and the compressed rows
 * are separate arrays read in any order) out of a pool */
static void one_case(enum ds4_simd_level lvl, int n_heads, int D, int n, float logit_scale, struct plant plant) {
    const int pool_rows = n + 3;
    float *pool = malloc((size_t)pool_rows * D * sizeof(float));
    const float **rows = malloc(((size_t)n + 1) * sizeof(*rows));
    float *q = malloc((size_t)n_heads * D * sizeof(float)), *sinks = malloc((size_t)n_heads * sizeof(float));
    float *weights = malloc(((size_t)n_heads * n + 1) * sizeof(float)), *scores = malloc(((size_t)n + 1) * sizeof(float));
    float *out = malloc((size_t)n_heads * D * sizeof(float)), *want = malloc((size_t)n_heads * D * sizeof(float));
    if (!pool || !rows || !q || !sinks || !weights || !scores || !out || !want) {
        CHECK(0, "out of memory");
        goto done;
    }
    for (int i = 0; i < pool_rows * D; i++) pool[i] = rnd() * logit_scale;
    for (int i = 0; i < n_heads * D; i++) q[i] = rnd();
    for (int h = 0; h < n_heads; h++) sinks[h] = rnd() * 4.0f;
    for (int i = 0; i < n; i++) rows[i] = pool + (size_t)((unsigned)(rnd() * 1e6f + 2e6f) % (unsigned)pool_rows) * D;
    switch (plant.site) {
    case PLANT_QUERY: q[D / 2] = plant.value; break;
    case PLANT_ROW: pool[(size_t)(pool_rows / 2) * D + D - 1] = plant.value; break;
    case PLANT_SINK: sinks[0] = plant.value; break;
    case PLANT_NONE: break;
    }
    const float scale = 1.0f / sqrtf((float)D);
    for (int h = 0; h < n_heads; h++)
        reference_head(q + (size_t)h * D, D, rows, n, scale, sinks[h], scores, want + (size_t)h * D);
    memset(out, 0xA5, (size_t)n_heads * D * sizeof(float)); /* every element must be written */
    ds4_attn_heads(q, n_heads, D, rows, n, scale, sinks, weights, out);
    const int bad = differing(out, want, (size_t)n_heads * D, plant.site != PLANT_NONE);
    CHECK(bad == 0, "%s: %d heads, D %d, %d rows, scale %g, %g planted at site %d: %d outputs differ",
          ds4_simd_level_name(lvl), n_heads, D, n, logit_scale, plant.value, (int)plant.site, bad);
done:
    free(pool); free(rows); free(q); free(sinks); free(weights); free(scores); free(out); free(want);
}

int main(void) {
    const enum ds4_simd_level best = ds4_cpu_best_level();
    report_levels_not_run("test_attn_cpu");
    const int heads[] = {1, 3, 4, 5, 8, 9, 64};
    /* 512: Flash's head; 64: the oracle models; the others leave tails after
     * whole vectors and whole 4-vector tiles at every width */
    const int dims[] = {512, 64, 80, 36, 7};
    const int counts[] = {0, 1, 2, 17, 300};
    for (int l = DS4_SIMD_SCALAR; l <= (int)best; l++) {
        ds4_kernels_set_level((enum ds4_simd_level)l);
        for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++)
            for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
                for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
                    one_case((enum ds4_simd_level)l, heads[hi], dims[di], counts[ci], 1.0f, (struct plant){0});
        /* large logits: the softmax is dominated by one row or by the sink */
        one_case((enum ds4_simd_level)l, 8, 512, 40, 30.0f, (struct plant){0});
        /* non-finite and overflowing inputs in the query, a row, a sink */
        const float planted[] = {NAN, INFINITY, -INFINITY, 3e38f, -3e38f};
        for (int site = PLANT_QUERY; site <= PLANT_SINK; site++)
            for (size_t pi = 0; pi < sizeof planted / sizeof planted[0]; pi++)
                for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++)
                    one_case((enum ds4_simd_level)l, 9, dims[di], 17, 1.0f, (struct plant){site, planted[pi]});
    }
    ds4_kernels_set_level(best);
    return check_done("test_attn_cpu");
}
