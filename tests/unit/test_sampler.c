/* test_sampler.c -- greedy, seeding, and the exact candidate sets of
 * top-k / top-p / min-p on crafted distributions whose answer is computed
 * here independently; frequency checks are chi-square tests with fixed
 * seeds, so they are deterministic. */
#include "check.h"
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static ds4_sampler *make(float t, int k, float p, float minp, uint64_t seed, int n) {
    ds4_sampler_params sp = { .temperature = t, .top_k = k, .top_p = p, .min_p = minp, .seed = seed };
    return ds4_sampler_new(&sp, n);
}

static void test_greedy(void) {
    float l[] = { 0.5f, 3.0f, NAN, 3.0f, -1.0f };
    ds4_sampler *s = make(0, 0, 1, 0, 1, 5);
    CHECK(ds4_sampler_sample(s, l, false) == 1, "argmax, lowest id on ties");
    ds4_sampler_free(s);
    s = make(-1, 0, 1, 0, 1, 5);
    CHECK(ds4_sampler_sample(s, l, false) == 1, "negative temperature is greedy");
    ds4_sampler_free(s);
    float nan_first[] = { NAN, -2.0f, -1.0f };
    s = make(1, 0, 1, 0, 1, 3);
    CHECK(ds4_sampler_sample(s, nan_first, true) == 2, "NaN never the argmax");
    for (int i = 0; i < 200; i++) CHECK(ds4_sampler_sample(s, nan_first, false) != 0, "NaN never sampled");
    float all_inf[] = { -INFINITY, -INFINITY, NAN };
    CHECK(ds4_sampler_sample(s, all_inf, false) == 0, "all -inf gives id 0");
    ds4_sampler_free(s);
}

/* Same seed -> same stream; force_greedy does not consume randomness. */
static void test_seed(void) {
    enum { N = 64, DRAWS = 500 };
    float l[N];
    for (int i = 0; i < N; i++) l[i] = (float)sin(i * 0.7) * 2;
    ds4_sampler *a = make(1, 0, 1, 0, 42, N), *b = make(1, 0, 1, 0, 42, N), *c = make(1, 0, 1, 0, 43, N);
    int same = 0, diff = 0;
    for (int i = 0; i < DRAWS; i++) {
        int x = ds4_sampler_sample(a, l, false);
        if (i % 3 == 0) CHECK(ds4_sampler_sample(b, l, true) == ds4_sampler_sample(c, l, true), "greedy");
        same += x == ds4_sampler_sample(b, l, false);
        diff += x != ds4_sampler_sample(c, l, false);
    }
    CHECK(same == DRAWS, "same seed reproduces: %d/%d", same, DRAWS);
    CHECK(diff > DRAWS / 2, "another seed differs: %d/%d", diff, DRAWS);
    ds4_sampler_free(a); ds4_sampler_free(b); ds4_sampler_free(c);
}

/* p = (0.4, 0.3, 0.2, 0.06, 0.04): expected sets worked out by hand. */
static void test_filters(void) {
    const double p[5] = { 0.4, 0.3, 0.2, 0.06, 0.04 };
    float l[5];
    for (int i = 0; i < 5; i++) l[i] = (float)log(p[i]);
    static const struct { float t; int k; float top_p, min_p; int n; const char *why; } cases[] = {
        { 1, 0, 1.0f, 0.0f,  5, "no filter" },
        { 1, 2, 1.0f, 0.0f,  2, "top-k 2" },
        { 1, 9, 1.0f, 0.0f,  5, "top-k above vocab" },
        { 1, 0, 0.75f, 0.0f, 3, "top-p .75: .4+.3 < .75 <= .9" },
        { 1, 0, 0.65f, 0.0f, 2, "top-p .65" },
        { 1, 0, 0.01f, 0.0f, 1, "tiny top-p keeps the top token" },
        { 1, 0, 1.0f, 0.12f, 4, "min-p .12: w = .15 survives, .1 does not" },
        { 1, 0, 1.0f, 0.8f,  1, "min-p .8" },
        /* renormalised after min-p: .7/.96 = .729 >= .72 -> 2 (3 without renormalising) */
        { 1, 0, 0.72f, 0.12f, 2, "min-p then top-p" },
        { 1, 3, 0.72f, 0.12f, 2, "top-k 3 + min-p + top-p" },
        { 1, 0, 2.0f, 0.0f,  5, "top-p > 1 means 1" },
        { 1, 0, -1.0f, 0.0f, 5, "top-p <= 0 means 1" },
        /* T = 2: w = sqrt(p / .4) = 1, .866, .707, .387, .316 */
        { 2, 0, 1.0f, 0.35f, 4, "min-p after temperature" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ds4_sampler *s = make(cases[c].t, cases[c].k, cases[c].top_p, cases[c].min_p, 7, 5);
        int ids[8];
        float probs[8];
        int n = ds4_sampler_candidates(s, l, ids, probs, 8);
        CHECK(n == cases[c].n, "%s: %d candidates, want %d", cases[c].why, n, cases[c].n);
        double z = 0;
        for (int i = 0; i < n && i < 5; i++) z += pow(p[i], 1.0 / cases[c].t);
        for (int i = 0; i < n && i < 5; i++) {
            CHECK(ids[i] == i, "%s: order", cases[c].why);
            double want = pow(p[i], 1.0 / cases[c].t) / z;
            CHECK(fabs(probs[i] - want) < 1e-6, "%s: p[%d] = %f, want %f", cases[c].why, i, probs[i], want);
        }
        ds4_sampler_free(s);
    }
}

/* Chi-square goodness of fit on the filtered distribution; filtered-out
 * tokens must never appear. Critical value: df = 3, alpha = 0.001 -> 16.27. */
static void test_frequencies(void) {
    const double p[6] = { 0.35, 0.25, 0.2, 0.12, 0.05, 0.03 };
    float l[6];
    for (int i = 0; i < 6; i++) l[i] = (float)log(p[i]);
    static const struct { uint64_t seed; float t; int k; float top_p, min_p; } cases[] = {
        { 1, 1, 4, 1, 0 }, { 2, 1, 0, 0.9f, 0 }, { 3, 1, 0, 1, 0.3f }, { 4, 0.7f, 4, 1, 0 },
    };
    enum { DRAWS = 40000 };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ds4_sampler *s = make(cases[c].t, cases[c].k, cases[c].top_p, cases[c].min_p, cases[c].seed, 6);
        int count[6] = {0};
        for (int i = 0; i < DRAWS; i++) count[ds4_sampler_sample(s, l, false)]++;
        double z = 0, chi2 = 0;
        for (int i = 0; i < 4; i++) z += pow(p[i], 1.0 / cases[c].t);
        for (int i = 0; i < 4; i++) {
            double e = DRAWS * pow(p[i], 1.0 / cases[c].t) / z;
            chi2 += (count[i] - e) * (count[i] - e) / e;
        }
        CHECK(count[4] == 0 && count[5] == 0, "case %zu: filtered tokens drawn (%d, %d)", c, count[4], count[5]);
        CHECK(chi2 < 16.27, "case %zu: chi2 %.2f", c, chi2);
        ds4_sampler_free(s);
    }
}

static void test_top_k_cap_and_large_vocab(void) {
    enum { N = 129280 };
    float *l = malloc(N * sizeof *l);
    for (int i = 0; i < N; i++) l[i] = 0;
    ds4_sampler *s = make(1, 5000, 1, 0, 9, N);
    int *ids = malloc(N * sizeof *ids);
    float *probs = malloc(N * sizeof *probs);
    CHECK(ds4_sampler_candidates(s, l, ids, probs, N) == DS4_SAMPLER_MAX_TOP_K, "top-k capped at 1024");
    CHECK(ids[0] == 0 && ids[DS4_SAMPLER_MAX_TOP_K - 1] == DS4_SAMPLER_MAX_TOP_K - 1, "ties by lower id");
    ds4_sampler_free(s);
    /* default parameters on a model-sized vocabulary */
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) { x = x * 6364136223846793005ull + 1442695040888963407ull; l[i] = (float)(x >> 40) / (1 << 24) * 12; }
    ds4_sampler_params dp;
    ds4_sampler_params_default(&dp);
    CHECK(dp.temperature == 1 && dp.top_k == 0 && dp.top_p == 1 && fabsf(dp.min_p - 0.05f) < 1e-9f, "defaults");
    s = ds4_sampler_new(&dp, N);
    int m = ds4_sampler_candidates(s, l, ids, probs, N);
    double sum = 0;
    float lmax = l[ids[0]];
    for (int i = 0; i < m; i++) {
        sum += probs[i];
        CHECK(l[ids[i]] - lmax >= logf(0.05f) - 1e-5f, "min-p survivor %d", ids[i]);
    }
    int beyond = 0;
    for (int i = 0; i < N; i++) beyond += l[i] - lmax >= logf(0.05f) + 1e-5f;
    CHECK(m >= beyond && m > 1, "every token above min-p kept: %d >= %d", m, beyond);
    CHECK(fabs(sum - 1) < 1e-4, "probabilities sum to 1: %f", sum);
    for (int i = 0; i < 20; i++) {
        int t = ds4_sampler_sample(s, l, false);
        CHECK(l[t] - lmax >= logf(0.05f) - 1e-5f, "sampled token passes min-p");
    }
    ds4_sampler_free(s);
    free(l); free(ids); free(probs);
}

static void test_logprobs(void) {
    float l[5] = { 1, 3, 2, 3, -1 };
    double z = 0;
    for (int i = 0; i < 5; i++) z += exp(l[i]);
    for (int i = 0; i < 5; i++)
        CHECK(fabs(ds4_logprob(l, 5, i) - (l[i] - log(z))) < 1e-6, "logprob %d", i);
    CHECK(isinf(ds4_logprob(l, 5, 7)), "out of range id");
    int ids[5];
    float lp[5];
    CHECK(ds4_top_logprobs(l, 5, 3, ids, lp) == 3, "three");
    CHECK(ids[0] == 1 && ids[1] == 3 && ids[2] == 2, "order %d %d %d", ids[0], ids[1], ids[2]);
    CHECK(fabs(lp[2] - (2 - log(z))) < 1e-6, "value");
    CHECK(ds4_top_logprobs(l, 5, 9, ids, lp) == 5 && ids[4] == 4, "k above vocab");
}

int main(void) {
    test_greedy();
    test_seed();
    test_filters();
    test_frequencies();
    test_top_k_cap_and_large_vocab();
    test_logprobs();
    return check_done("test_sampler");
}
