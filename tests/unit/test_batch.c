/* test_batch.c -- the exactness contract of batched evaluation (backend.h,
 * ds4_sessions_step): a session's logits are bit-identical whether it
 * advances alone or together with any other sessions, and whatever chunks
 * its tokens arrived in.
 *
 * Random mixtures (seeded): up to 16 sessions of different lengths, each
 * round some prefill a chunk, some decode a token, some rewind (shallow or
 * deep) and some sit idle; the active ones advance in one ds4_sessions_step
 * in a shuffled order. A twin of every session takes the same steps alone.
 * After every round each stepped session's logits must equal its twin's bit
 * for bit; at the end each session must equal a fresh session fed its whole
 * token list one token at a time (decode path vs the chunked, batched and
 * rewound history). Models: the oracle models (f32 and q8_0 weights, ds4
 * numerics on and off), the micro model of the fuzz corpus and the demo
 * model (K-quant and IQ2_XXS experts), the demo model also at each SIMD
 * level from avx2 below the CPU's best. Plus the step's error cases. */
#include "check.h"
#include "engine_load.h"
#include "kernels/kernels_cpu.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_SESSIONS = 16, CHUNK = 48 };

static uint32_t rng_state;
static int deep_rewinds;   /* over all runs: the rewind-by-recompute path must be exercised */
static uint32_t rnd(uint32_t n) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return (rng_state >> 8) % n;
}

typedef struct {
    ds4_session *batched, *alone;
    int32_t toks[CHUNK];
    int n;              /* this round's tokens; 0 = idle */
} member;

static bool same_logits(const ds4_session *a, const ds4_session *b, int V) {
    return ds4_session_n_tokens(a) == ds4_session_n_tokens(b) &&
           memcmp(ds4_session_logits(a), ds4_session_logits(b), (size_t)V * sizeof(float)) == 0;
}

/* One random mixture on engine e; in 10 rounds a session rewinds once, idles
 * once, prefills a chunk `prefill` times and decodes otherwise. Returns the
 * number of batched steps run. */
static int mixture(ds4_engine *e, const char *what, int n_sessions, int rounds, int ctx, int prefill) {
    char err[512];
    const int V = ds4_engine_n_vocab(e);
    member m[MAX_SESSIONS];
    memset(m, 0, sizeof m);
    for (int i = 0; i < n_sessions; i++) {
        m[i].batched = ds4_session_new(e, ctx, err, sizeof err);
        m[i].alone = ds4_session_new(e, ctx, err, sizeof err);
        CHECK(m[i].batched && m[i].alone, "%s: session: %s", what, err);
        if (!m[i].batched || !m[i].alone) return 0;
    }
    int steps_run = 0, mismatches = 0, rewinds = 0, deep = 0;
    for (int r = 0; r < rounds; r++) {
        ds4_step step[MAX_SESSIONS];
        int order[MAX_SESSIONS], n_steps = 0, rows = 0;
        for (int i = 0; i < n_sessions; i++) order[i] = i;
        for (int i = n_sessions - 1; i > 0; i--) {
            int j = (int)rnd((uint32_t)i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int k = 0; k < n_sessions; k++) {
            member *x = &m[order[k]];
            const int have = ds4_session_n_tokens(x->batched), action = (int)rnd(10);
            x->n = 0;
            if (action == 0 && have > 1) {
                /* rewind: mostly shallow, sometimes to the very start region */
                int to = rnd(3) == 0 ? (int)rnd((uint32_t)have) : have - 1 - (int)rnd(8);
                if (to < 0) to = 0;
                rewinds++;
                deep += to < have - 256;   /* beyond the rings' slack: recomputed (engine.c REWIND_SLACK) */
                CHECK(ds4_session_rewind(x->batched, to, err, sizeof err) == 0, "%s: rewind: %s", what, err);
                CHECK(ds4_session_rewind(x->alone, to, err, sizeof err) == 0, "%s: rewind: %s", what, err);
                continue;
            }
            if (action == 1) continue;                          /* idle */
            int want = action < 2 + prefill || have == 0 ? 2 + (int)rnd(CHUNK - 1) : 1;   /* chunk or decode */
            if (want > ctx - have) want = ctx - have;
            if (want > CHUNK - rows) want = CHUNK - rows;
            if (want <= 0) continue;
            for (int t = 0; t < want; t++) x->toks[t] = (int32_t)rnd((uint32_t)V);
            x->n = want;
            rows += want;
            step[n_steps++] = (ds4_step){x->batched, x->toks, want};
        }
        if (!n_steps) continue;
        CHECK(ds4_sessions_step(e, step, n_steps, err, sizeof err) == 0, "%s: batched step: %s", what, err);
        steps_run++;
        for (int i = 0; i < n_sessions; i++) {
            if (!m[i].n) continue;
            ds4_step solo = {m[i].alone, m[i].toks, m[i].n};
            CHECK(ds4_sessions_step(e, &solo, 1, err, sizeof err) == 0, "%s: solo step: %s", what, err);
            if (!same_logits(m[i].batched, m[i].alone, V)) mismatches++;
        }
    }
    CHECK(mismatches == 0, "%s: %d batched logits differ from the same session alone", what, mismatches);

    /* every history equals plain token-by-token decode of its token list */
    ds4_session *fresh = ds4_session_new(e, ctx, err, sizeof err);
    int history_bad = 0;
    for (int i = 0; i < n_sessions && fresh; i++) {
        const int n = ds4_session_n_tokens(m[i].batched);
        if (!n) continue;
        CHECK(ds4_session_rewind(fresh, 0, err, sizeof err) == 0, "%s", err);
        for (int t = 0; t < n; t++)
            CHECK(ds4_session_decode(fresh, ds4_session_tokens(m[i].batched)[t], err, sizeof err) == 0, "%s", err);
        if (!same_logits(fresh, m[i].batched, V)) history_bad++;
    }
    CHECK(history_bad == 0, "%s: %d sessions differ from token-by-token decode of their history", what, history_bad);
    ds4_session_free(fresh);
    for (int i = 0; i < n_sessions; i++) {
        ds4_session_free(m[i].batched);
        ds4_session_free(m[i].alone);
    }
    deep_rewinds += deep;
    printf("  %-26s %2d sessions, %3d batched steps, %2d rewinds (%d deep): bit-identical %s\n", what,
           n_sessions, steps_run, rewinds, deep, mismatches || history_bad ? "NO" : "yes");
    return steps_run;
}

/* Bad steps are refused whole: no session changes. */
static void step_errors(ds4_engine *e) {
    char err[512];
    const int V = ds4_engine_n_vocab(e);
    ds4_session *a = ds4_session_new(e, 8, err, sizeof err), *b = ds4_session_new(e, 8, err, sizeof err);
    if (!a || !b) { CHECK(false, "session: %s", err); ds4_session_free(a); ds4_session_free(b); return; }
    int32_t toks[CHUNK + 1] = {0}, bad = V;
    ds4_step dup[2] = {{a, toks, 1}, {a, toks, 1}};
    CHECK(ds4_sessions_step(e, dup, 2, err, sizeof err) == -1, "one session twice must fail");
    ds4_step over[2] = {{b, toks, 2}, {a, toks, 9}};
    CHECK(ds4_sessions_step(e, over, 2, err, sizeof err) == -1 && strstr(err, "context"), "ctx overflow: %s", err);
    ds4_step oov[2] = {{b, toks, 2}, {a, &bad, 1}};
    CHECK(ds4_sessions_step(e, oov, 2, err, sizeof err) == -1 && strstr(err, "out of range"), "bad token: %s", err);
    ds4_session *c = ds4_session_new(e, CHUNK + 8, err, sizeof err);
    ds4_step big[2] = {{b, toks, 2}, {c, toks, CHUNK}};
    CHECK(c && ds4_sessions_step(e, big, 2, err, sizeof err) == -1, "more rows than max_batch must fail");
    CHECK(ds4_session_n_tokens(a) == 0 && ds4_session_n_tokens(b) == 0 && ds4_session_n_tokens(c) == 0,
          "a refused step changed a session");
    ds4_step ok[2] = {{b, toks, 2}, {a, toks, 1}};
    CHECK(ds4_sessions_step(e, ok, 2, err, sizeof err) == 0 && ds4_session_n_tokens(a) == 1 &&
          ds4_session_n_tokens(b) == 2, "a good step after refused ones: %s", err);
    ds4_session_free(a);
    ds4_session_free(b);
    ds4_session_free(c);
}

int main(void) {
    const char *build = getenv("BUILD");
    char path[512];
    /* the two-session runs grow long enough to rewind beyond the rings */
    struct { const char *file; int numerics, sessions, rounds, ctx, prefill; } runs[] = {
        {"ds4tiny/A-f32.gguf", 0, 16, 24, 300, 2},
        {"ds4tiny/A-f32.gguf", 1, 6, 20, 300, 2},
        {"ds4tiny/B-q8_0.gguf", 0, 10, 24, 300, 2},
        {"ds4tiny/B-f32.gguf", 1, 2, 50, 700, 7},
        {"micro", 0, 2, 50, 700, 7},
        {"micro", 0, 16, 40, 400, 2},
        {"demo", -1, 4, 8, 120, 2},
    };
    rng_state = 20261201;
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        if (!strcmp(runs[i].file, "micro")) snprintf(path, sizeof path, "fuzz/corpus/model/micro-f16.gguf");
        else if (!strcmp(runs[i].file, "demo")) snprintf(path, sizeof path, "models/demo.gguf");
        else snprintf(path, sizeof path, "%s/%s", build ? build : "build", runs[i].file);
        ds4_engine *e = test_engine_load(path, runs[i].numerics, CHUNK);
        CHECK(e != NULL, "cannot load %s", path);
        if (!e) continue;
        char what[128];
        snprintf(what, sizeof what, "%s%s", runs[i].file, runs[i].numerics == 1 ? " ds4" : "");
        mixture(e, what, runs[i].sessions, runs[i].rounds, runs[i].ctx, runs[i].prefill);
        if (i == 0) step_errors(e);
        ds4_engine_free(e);
    }
    /* The demo model again at each SIMD level below the CPU's best (from
     * avx2; kernels of a level the CPU lacks never run): every level has its
     * own matmul tiles for the experts' IQ2_XXS and Q2_K, which must keep a
     * session's logits independent of its batch there too. */
    const enum ds4_simd_level best = ds4_cpu_best_level();
    for (int l = DS4_SIMD_AVX2; l < (int)best; l++) {
        ds4_kernels_set_level((enum ds4_simd_level)l);
        ds4_engine *e = test_engine_load("models/demo.gguf", -1, CHUNK);
        CHECK(e != NULL, "cannot load models/demo.gguf");
        if (!e) continue;
        char what[64];
        snprintf(what, sizeof what, "demo at %s", ds4_simd_level_name((enum ds4_simd_level)l));
        mixture(e, what, 4, 8, 120, 2);
        ds4_engine_free(e);
    }
    ds4_kernels_set_level(best);
    CHECK(deep_rewinds > 0, "no rewind went beyond the rings: the mixtures no longer cover recomputation");
    return check_done("test_batch");
}
