/* test_layer_pipeline.c -- slices chained over hidden states (backend.h):
 * the model cut into 2 and 3 layer slices, each with its own binding,
 * backend and KV state, run stage after stage over the same tokens, gives
 * the whole model's logits bit for bit (memcmp) for a chunked prefill with
 * every position's logits and for decode steps after it, on the converted
 * oracle model and on the demo-layout random model. The whole model runs
 * with other chunk sizes than the stages, so the cut is the only thing the
 * comparison shares with the reference. */
#include "check.h"
#include "backends/backend.h"
#include "models/dsv4/forward_cpu.h"
#include "format/gguf.h"
#include "models/dsv4/kv.h"
#include "models/dsv4/model.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CTX = 96, N_PROMPT = 40, N_DECODE = 4, MAX_STAGES = 3 };

typedef struct {
    ds4_model *m;
    ds4_backend *be;
    ds4_kv *kv;
} stage;

static bool stage_open(stage *st, const ds4_gguf *g, const ds4_layer_slice *sl, char *err, size_t errlen) {
    memset(st, 0, sizeof *st);
    st->m = ds4_model_bind_slice(g, sl, err, errlen);
    if (!st->m) return false;
    st->be = ds4_cpu_backend_new(st->m, 2, 64, ds4_cpu_numerics_supported(&st->m->cfg), err, errlen);
    st->kv = st->be ? ds4_kv_new(&st->m->cfg, CTX, 16) : NULL;
    return st->kv != NULL;
}

static void stage_close(stage *st) {
    if (st->be) st->be->free(st->be);
    ds4_kv_free(st->kv);
    ds4_model_free(st->m);
}

/* Runs toks[0..n) through the stages in order; logits of every position
 * (all) or of the last one land in `logits`. */
static bool run(stage *stages, int n_stages, const int32_t *toks, int n, bool all, float *logits, float *hidden_a,
                float *hidden_b) {
    char err[256];
    const float *in = NULL;
    for (int i = 0; i < n_stages; i++) {
        float *out = i % 2 ? hidden_b : hidden_a;
        ds4_backend_seq sq = {.kv = stages[i].kv, .toks = toks, .n = n, .logits = logits, .all_logits = all,
                              .hidden_in = in, .hidden_out = out};
        if (stages[i].be->eval(stages[i].be, &sq, 1, err, sizeof err)) {
            fprintf(stderr, "stage %d: %s\n", i, err);
            return false;
        }
        in = out;
    }
    return true;
}

static void check_model(const char *path) {
    char err[512];
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "%s: %s", path, err);
    if (!g) return;
    stage whole;
    ds4_layer_slice all_layers = DS4_SLICE_ALL;
    if (!stage_open(&whole, g, &all_layers, err, sizeof err)) {
        CHECK(0, "%s: %s", path, err);
        stage_close(&whole);
        ds4_gguf_close(g);
        return;
    }
    const ds4_config *c = &whole.m->cfg;
    const int V = c->n_vocab, L = c->n_layer;
    const size_t hcE = (size_t)c->n_hc * c->n_embd;
    int32_t toks[N_PROMPT + N_DECODE];
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N_PROMPT + N_DECODE; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((r >> 33) % (uint64_t)V);
    }
    /* reference: the prompt in chunks of 16, then decode */
    float *want = malloc((size_t)(N_PROMPT + N_DECODE) * V * sizeof(float));
    float *got = malloc((size_t)(N_PROMPT + N_DECODE) * V * sizeof(float));
    float *ha = malloc((size_t)N_PROMPT * hcE * sizeof(float)), *hb = malloc((size_t)N_PROMPT * hcE * sizeof(float));
    CHECK(want && got && ha && hb, "memory");
    bool ok = want && got && ha && hb;
    for (int p = 0; ok && p < N_PROMPT; p += 16) {
        const int n = N_PROMPT - p < 16 ? N_PROMPT - p : 16;
        ok = run(&whole, 1, toks + p, n, true, want + (size_t)p * V, NULL, NULL);
    }
    for (int i = N_PROMPT; ok && i < N_PROMPT + N_DECODE; i++) ok = run(&whole, 1, toks + i, 1, false, want + (size_t)i * V, NULL, NULL);
    CHECK(ok, "%s: whole-model reference", path);

    /* cuts: after layer a (2 stages) and after a and b (3 stages) */
    const int cuts[][2] = {{0, -1}, {L / 2 - 1, -1}, {L - 2, -1}, {0, L / 2}, {L / 3, 2 * L / 3}};
    for (size_t k = 0; ok && k < sizeof cuts / sizeof cuts[0]; k++) {
        if (cuts[k][0] >= L - 1 || cuts[k][1] >= L - 1) continue;
        ds4_layer_slice sl[MAX_STAGES];
        int n_stages = 0, first = 0;
        for (int j = 0; j < 2 && cuts[k][j] >= 0; j++) {
            sl[n_stages++] = (ds4_layer_slice){first, cuts[k][j], false};
            first = cuts[k][j] + 1;
        }
        sl[n_stages++] = (ds4_layer_slice){first, -1, true};
        stage st[MAX_STAGES];
        bool open = true;
        for (int i = 0; i < n_stages; i++) open &= stage_open(&st[i], g, &sl[i], err, sizeof err);
        CHECK(open, "%s: %s", path, err);
        /* the stages take the prompt in chunks of 7, then decode */
        bool ran = open;
        for (int p = 0; ran && p < N_PROMPT; p += 7) {
            const int n = N_PROMPT - p < 7 ? N_PROMPT - p : 7;
            ran = run(st, n_stages, toks + p, n, true, got + (size_t)p * V, ha, hb);
        }
        for (int i = N_PROMPT; ran && i < N_PROMPT + N_DECODE; i++)
            ran = run(st, n_stages, toks + i, 1, false, got + (size_t)i * V, ha, hb);
        CHECK(ran, "%s: %d stages ran", path, n_stages);
        if (ran)
            CHECK(!memcmp(want, got, (size_t)(N_PROMPT + N_DECODE) * V * sizeof(float)),
                  "%s: %d stages cut after %d/%d: logits differ from the whole model", path, n_stages, cuts[k][0],
                  cuts[k][1]);
        for (int i = 0; i < n_stages; i++) stage_close(&st[i]);
    }

    /* a stage that needs hidden states refuses a sequence without them */
    ds4_layer_slice tail = {1, -1, true};
    stage t;
    if (stage_open(&t, g, &tail, err, sizeof err)) {
        ds4_backend_seq sq = {.kv = t.kv, .toks = toks, .n = 1, .logits = got};
        err[0] = 0;
        CHECK(t.be->eval(t.be, &sq, 1, err, sizeof err) == -1 && strstr(err, "needs hidden states in") &&
              t.kv->n_pos == 0, "%s: missing hidden_in -> %s", path, err);
    }
    stage_close(&t);
    /* state-only rows (backend.h) belong to MTP blocks: a main model refuses them and keeps its state */
    {
        const int before = whole.kv->n_pos;
        ds4_backend_seq sq = {.kv = whole.kv, .toks = toks, .n = 2, .state_only = true};
        err[0] = 0;
        CHECK(whole.be->eval(whole.be, &sq, 1, err, sizeof err) == -1 && strstr(err, "state-only rows") &&
                  whole.kv->n_pos == before,
              "%s: state-only rows on a main model -> %s", path, err);
    }
    free(want); free(got); free(ha); free(hb);
    stage_close(&whole);
    ds4_gguf_close(g);
}

int main(void) {
    const char *b = getenv("BUILD");
    char tiny[512], demo[512];
    snprintf(tiny, sizeof tiny, "%s/ds4tiny/A-f32.gguf", b ? b : "build");
    snprintf(demo, sizeof demo, "%s/dist/whole.gguf", b ? b : "build");
    if (access(tiny, R_OK) || access(demo, R_OK))
        return check_skipped("test_layer_pipeline", "no oracle/demo-layout models (make builds them for make test)");
    check_model(tiny);
    check_model(demo);
    return check_done("test_layer_pipeline");
}
