/* test_glm_engine.c -- GLM 5.2 as an engine model (engine.h over
 * glm_backend / glm_kv / glm_payload), against transformers' golden logits
 * of tests/fixtures/glmtiny/A (300 tokens, indexer top-16, dense + MoE,
 * full + shared indexer layers) converted by make test to
 * $BUILD/glmtiny/A-<type>.gguf.
 * - f32 and f16: a 300-token prefill's logits at every position are within
 *   1e-5 of the logit scale of the oracle (its own float32-vs-float64 gap is
 *   2.6e-6) with every argmax equal; q8_0 within a bound derived from how far
 *   the oracle itself moves when its weights are rounded to Q8_0 (main()).
 * - Against that prefill, bit for bit (memcmp): uneven chunked prefill, an
 *   engine whose prefill chunk is 16, prefill-then-decode one by one, rewind
 *   (to inside and before the indexer's top-k reach, and to 0) then replay,
 *   snapshot / restore, the GLM payload into a fresh and a larger session,
 *   and a round trip through the disk KV cache (kvdisk over the engine's
 *   payload functions).
 * - Batched mixtures (ds4_sessions_step with several sessions' decode rows
 *   and prefill chunks, in varying groupings) equal each session alone;
 *   20 decode rows in one step and two long prefills packed across forward
 *   calls equal the prefill's rows.
 * - Bad input gets one line and leaves the session unchanged: a DeepSeek V4
 *   payload into a GLM session and a GLM payload into a DeepSeek V4 session
 *   (the micro model of the fuzz corpus), a truncated or corrupted payload,
 *   a payload for a larger context, a token id outside the vocabulary, a
 *   full context; the DeepSeek-only options refuse the GLM file by name. */
#include "models/chat_spec.h"
#include "check.h"
#include "engine_load.h"
#include "base/json_util.h"
#include "kvdisk/kvdisk.h"
#include "payload_values.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N_MAX = 300 };

static int32_t toks[N_MAX];
static int n_toks, V;
static float *gold;

static char *model_path(const char *type, char *buf, size_t n) {
    const char *b = getenv("BUILD");
    snprintf(buf, n, "%s/glmtiny/A-%s.gguf", b ? b : "build", type);
    return buf;
}

static bool load_fixture(void) {
    size_t len;
    char *tj = ds4_read_file("tests/fixtures/glmtiny/A/tokens", &len);
    gold = (float *)ds4_read_file("tests/fixtures/glmtiny/A/logits", &len);
    cJSON *j = tj ? cJSON_Parse(tj) : NULL;
    n_toks = j ? cJSON_GetArraySize(j) : 0;
    for (int i = 0; i < n_toks && i < N_MAX; i++) toks[i] = cJSON_GetArrayItem(j, i)->valueint;
    cJSON_Delete(j);
    free(tj);
    V = 256;
    return gold && n_toks == N_MAX && len == (size_t)n_toks * V * sizeof(float);
}

static bool same_row(const float *a, const float *b) { return memcmp(a, b, (size_t)V * sizeof(float)) == 0; }

static const float *row(const float *all, int t) { return all + (size_t)t * V; }

/* Every position's logits of one whole prefill (the reference for the
 * bit-exact checks). */
static float *prefill_all(ds4_engine *e, int ctx) {
    char err[512];
    float *all = malloc((size_t)n_toks * V * sizeof(float));
    ds4_session *s = ds4_session_new(e, ctx, err, sizeof err);
    CHECK(s && all && ds4_session_prefill(s, toks, n_toks, all, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
    CHECK(s && same_row(ds4_session_logits(s), row(all, n_toks - 1)), "session logits are the last row");
    ds4_session_free(s);
    return all;
}

static void against_oracle(const char *type, const float *all, double bound, double argmax_gap) {
    double scale = 0, worst = 0;
    int worst_t = -1, argmax_bad = 0, argmax_checked = 0;
    for (int t = 0; t < n_toks; t++) {
        int am = 0, gm = 0, g2 = -1;
        for (int v = 0; v < V; v++) {
            const float x = row(all, t)[v], y = row(gold, t)[v];
            scale = fmax(scale, fabs(y));
            if (!(fabs(x - y) <= worst)) { worst = fabs(x - y); worst_t = t; }
            if (x > row(all, t)[am]) am = v;
            if (y > row(gold, t)[gm]) gm = v;
        }
        for (int v = 0; v < V; v++)
            if (v != gm && (g2 < 0 || row(gold, t)[v] > row(gold, t)[g2])) g2 = v;
        /* argmax only where the oracle's top-2 gap exceeds what the weights' rounding can move */
        if (row(gold, t)[gm] - row(gold, t)[g2] > argmax_gap) {
            argmax_checked++;
            argmax_bad += am != gm;
        }
    }
    printf("glm engine %s: max |diff| %.3g at position %d (%.3g of max |logit| %.3g), argmax equal at %d/%d checked\n",
           type, worst, worst_t, worst / scale, scale, argmax_checked - argmax_bad, argmax_checked);
    CHECK(worst <= bound * scale, "%s: max |diff| %.3g > %.3g of the logit scale", type, worst, bound);
    CHECK(argmax_bad == 0, "%s: argmax differs at %d positions", type, argmax_bad);
}

/* Uneven chunks, each with every position's logits. */
static void chunked(ds4_engine *e, const float *all) {
    char err[512];
    static const int sizes[] = {1, 7, 3, 64, 2, 100, 5, 118};
    float *got = malloc((size_t)n_toks * V * sizeof(float));
    ds4_session *s = ds4_session_new(e, n_toks, err, sizeof err);
    int done = 0;
    for (size_t i = 0; s && got && i < sizeof sizes / sizeof sizes[0]; i++) {
        CHECK(ds4_session_prefill(s, toks + done, sizes[i], got + (size_t)done * V, NULL, NULL, err, sizeof err) == 0,
              "chunk: %s", err);
        done += sizes[i];
    }
    CHECK(done == n_toks && got && memcmp(got, all, (size_t)n_toks * V * sizeof(float)) == 0,
          "uneven chunked prefill differs from the whole prefill");
    free(got);
    ds4_session_free(s);
}

/* Prefill 150, then one token at a time. */
static void decode(ds4_engine *e, const float *all) {
    char err[512];
    ds4_session *s = ds4_session_new(e, n_toks, err, sizeof err);
    CHECK(s && ds4_session_prefill(s, toks, 150, NULL, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
    int bad = 0;
    for (int t = 150; s && t < n_toks; t++) {
        CHECK(ds4_session_decode(s, toks[t], err, sizeof err) == 0, "decode: %s", err);
        bad += !same_row(ds4_session_logits(s), row(all, t));
    }
    CHECK(bad == 0, "%d decoded positions differ from the prefill", bad);
    ds4_session_free(s);
}

/* Continues s (holding `have` tokens of the fixture) to the end and checks
 * every new position against the prefill. */
static void continue_exact(ds4_session *s, int have, const float *all, const char *what) {
    char err[512];
    CHECK(ds4_session_n_tokens(s) == have, "%s: %d tokens, expected %d", what, ds4_session_n_tokens(s), have);
    CHECK(have == 0 || same_row(ds4_session_logits(s), row(all, have - 1)), "%s: logits at %d", what, have);
    if (have >= n_toks) return;
    float *got = malloc((size_t)(n_toks - have) * V * sizeof(float));
    CHECK(got && ds4_session_prefill(s, toks + have, n_toks - have, got, NULL, NULL, err, sizeof err) == 0, "%s: %s",
          what, err);
    CHECK(got && memcmp(got, row(all, have), (size_t)(n_toks - have) * V * sizeof(float)) == 0,
          "%s: the continuation differs from the prefill", what);
    free(got);
}

static void rewind_and_snapshots(ds4_engine *e, const float *all) {
    char err[512];
    ds4_session *s = ds4_session_new(e, n_toks, err, sizeof err);
    if (!s) { CHECK(false, "session: %s", err); return; }
    CHECK(ds4_session_prefill(s, toks, n_toks, NULL, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
    /* 200: inside the state; 12: before the indexer prunes (top-k 16); 0: empty */
    const int to[] = {200, 12, 1, 0};
    for (size_t i = 0; i < sizeof to / sizeof to[0]; i++) {
        CHECK(ds4_session_rewind(s, to[i], err, sizeof err) == 0, "rewind to %d: %s", to[i], err);
        char what[64];
        snprintf(what, sizeof what, "rewind to %d", to[i]);
        continue_exact(s, to[i], all, what);
    }
    CHECK(ds4_session_rewind(s, n_toks + 1, err, sizeof err) == -1 && strstr(err, "cannot rewind"), "rewind past: %s",
          err);

    /* snapshot at 150, go on, restore */
    CHECK(ds4_session_rewind(s, 150, err, sizeof err) == 0, "%s", err);
    ds4_snapshot *snap = ds4_session_snapshot(s);
    CHECK(snap != NULL, "snapshot");
    CHECK(ds4_session_prefill(s, toks + 150, 100, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(snap && ds4_session_restore(s, snap, err, sizeof err) == 0, "restore: %s", err);
    continue_exact(s, 150, all, "snapshot restore");
    ds4_snapshot_free(snap);

    /* the payload at 180, into a fresh session and into a larger one */
    CHECK(ds4_session_rewind(s, 180, err, sizeof err) == 0, "%s", err);
    const size_t bytes = ds4_session_payload_bytes(s);
    unsigned char *payload = malloc(bytes);
    ds4_session *same = ds4_session_new(e, n_toks, err, sizeof err), *big = ds4_session_new(e, 2 * n_toks, err, sizeof err);
    if (payload && same && big) {
        ds4_session_save_payload(s, payload);
        CHECK(!memcmp(payload, "GLM5", 4), "payload magic");
        CHECK(ds4_session_load_payload(same, payload, bytes, err, sizeof err) == 0, "load: %s", err);
        continue_exact(same, 180, all, "payload");
        CHECK(ds4_session_load_payload(big, payload, bytes, err, sizeof err) == 0, "load into larger ctx: %s", err);
        continue_exact(big, 180, all, "payload into a larger context");

        /* bad payloads: one line, session unchanged */
        ds4_session *small = ds4_session_new(e, 100, err, sizeof err);
        CHECK(small && ds4_session_load_payload(small, payload, bytes, err, sizeof err) == -1 &&
                  strstr(err, "300-token context"), "larger saved context: %s", err);
        CHECK(ds4_session_rewind(same, 10, err, sizeof err) == 0, "%s", err);
        CHECK(ds4_session_load_payload(same, payload, bytes - 4, err, sizeof err) == -1 && strstr(err, "bytes"),
              "truncated: %s", err);
        unsigned char *bad = malloc(bytes);
        if (bad) {
            memcpy(bad, payload, bytes);
            const uint32_t id = 999;
            memcpy(bad + 40 + 4 * 3, &id, 4);   /* token 3 */
            CHECK(ds4_session_load_payload(same, bad, bytes, err, sizeof err) == -1 && strstr(err, "outside the vocabulary"),
                  "bad token id: %s", err);
            memcpy(bad, payload, bytes);
            bad[4] = 9;                          /* version */
            CHECK(ds4_session_load_payload(same, bad, bytes, err, sizeof err) == -1 && strstr(err, "version 9"),
                  "version: %s", err);
            free(bad);
            /* values no state holds; ends with the payload loaded, so back to 10 */
            payload_values_refused(same, payload, bytes, 40 + 4 * 180, 40 + 4 * (180 + (size_t)V + 4), V, "GLM");
            CHECK(ds4_session_rewind(same, 10, err, sizeof err) == 0, "%s", err);
        }
        CHECK(!strchr(err, '\n'), "one line");
        continue_exact(same, 10, all, "after refused payloads");
        ds4_session_free(small);
    }
    free(payload);
    ds4_session_free(same);
    ds4_session_free(big);
    ds4_session_free(s);
}

/* The disk cache's key text: the token ids, one byte each (vocab 256). */
static char *key_text(void *ud, const ds4_session *s, size_t *len) {
    const int n = ds4_session_n_tokens(s);
    char *t = malloc((size_t)n + 1);
    for (int i = 0; t && i < n; i++) t[i] = (char)(ds4_session_tokens(s)[i] + 1);
    if (t) t[n] = 0;
    *len = (size_t)n;
    return t;
}

/* The key text above is the ids themselves, so the payload's checks cover it. */
static int load_payload(void *ud, ds4_session *s, const ds4_source *src, size_t n, const char *key, size_t key_len,
                        char *err, size_t errlen) {
    return ds4_session_load_payload_from(s, src, n, err, errlen);
}

static void disk_cache(ds4_engine *e, const float *all) {
    char err[512], dir[] = "/tmp/ds4-glm-kvdisk-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(false, "mkdtemp"); return; }
    ds4_kvdisk_opts o;
    ds4_kvdisk_opts_default(&o);
    o.dir = dir;
    o.min_tokens = 16;
    const ds4_kvdisk_host host = {
        .ud = e, .quant_bits = (uint8_t)ds4_engine_expert_bits(e), .user_tok = -1, .assistant_tok = -1,
        .n_tokens = ds4_session_n_tokens, .ctx = ds4_session_ctx, .key_text = key_text,
        .payload_bytes = ds4_session_payload_bytes, .save_payload = ds4_session_save_payload_to,
        .load_payload = load_payload,
    };
    ds4_kvdisk *d = ds4_kvdisk_open(&o, &host, NULL, NULL, NULL, err, sizeof err);
    CHECK(d != NULL, "kvdisk: %s", err);
    ds4_session *a = ds4_session_new(e, n_toks, err, sizeof err), *b = ds4_session_new(e, n_toks, err, sizeof err);
    if (d && a && b) {
        CHECK(ds4_session_prefill(a, toks, 220, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        CHECK(ds4_kvdisk_save(d, a, DS4_KVC_SHUTDOWN) == 0, "save");
        size_t len;
        CHECK(ds4_session_prefill(a, toks + 220, n_toks - 220, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
        char *prompt = key_text(NULL, a, &len);
        CHECK(prompt && ds4_kvdisk_restore(d, b, prompt, len, 0) == 220, "restore from disk");
        free(prompt);
        continue_exact(b, 220, all, "disk KV cache");
    }
    ds4_session_free(a);
    ds4_session_free(b);
    ds4_kvdisk_close(d);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

/* Several sessions advanced together in varying groupings equal each alone. */
static void batched(ds4_engine *e) {
    char err[512];
    enum { S = 5, ROUNDS = 24 };
    ds4_session *mix[S], *alone[S];
    int pos[S] = {0}, mismatches = 0;
    for (int i = 0; i < S; i++) {
        mix[i] = ds4_session_new(e, n_toks, err, sizeof err);
        alone[i] = ds4_session_new(e, n_toks, err, sizeof err);
        if (!mix[i] || !alone[i]) { CHECK(false, "session: %s", err); return; }
    }
    uint32_t rng = 20261201;
    for (int r = 0; r < ROUNDS; r++) {
        ds4_step steps[S];
        int who[S], n_steps = 0;
        for (int i = 0; i < S; i++) {
            rng = rng * 1664525u + 1013904223u;
            const int pick = (int)((rng >> 8) % 6);   /* 0: idle, 1-3: decode, 4-5: prefill chunk */
            int n = pick == 0 ? 0 : pick < 4 ? 1 : 2 + (int)((rng >> 16) % 23);
            if (n > n_toks - pos[i]) n = n_toks - pos[i];
            if (!n) continue;
            /* each session reads the fixture from its own offset */
            who[n_steps] = i;
            steps[n_steps++] = (ds4_step){mix[i], toks + pos[i], n};
        }
        if (!n_steps) continue;
        CHECK(ds4_sessions_step(e, steps, n_steps, err, sizeof err) == 0, "batched step: %s", err);
        for (int k = 0; k < n_steps; k++) {
            const int i = who[k];
            ds4_step solo = {alone[i], steps[k].toks, steps[k].n};
            CHECK(ds4_sessions_step(e, &solo, 1, err, sizeof err) == 0, "solo step: %s", err);
            mismatches += !same_row(ds4_session_logits(mix[i]), ds4_session_logits(alone[i]));
            pos[i] += steps[k].n;
        }
    }
    CHECK(mismatches == 0, "%d batched logits differ from the same session alone", mismatches);
    /* bad steps are refused whole */
    int32_t bad = V;
    const int before = ds4_session_n_tokens(mix[0]);
    ds4_step refused[2] = {{mix[0], toks, 1}, {mix[1], &bad, 1}};
    CHECK(ds4_sessions_step(e, refused, 2, err, sizeof err) == -1 && strstr(err, "outside the vocabulary"),
          "bad token: %s", err);
    ds4_step twice[2] = {{mix[0], toks, 1}, {mix[0], toks, 1}};
    CHECK(ds4_sessions_step(e, twice, 2, err, sizeof err) == -1, "one session twice must fail");
    CHECK(ds4_session_n_tokens(mix[0]) == before, "a refused step changed a session");
    for (int i = 0; i < S; i++) {
        ds4_session_free(mix[i]);
        ds4_session_free(alone[i]);
    }
}

/* Steps the backend packs differently from a session alone: 20 decode rows
 * in one step (more than one output-head group) and two prefills of 200 and
 * 150 rows (more than one forward call, the second run split between them).
 * Each session's logits equal the whole prefill's row for its position. */
static void packed(ds4_engine *e, const float *all) {
    char err[512];
    enum { S = 20 };
    ds4_session *s[S] = {0};
    ds4_step steps[S];
    int bad = 0;
    for (int i = 0; i < S; i++) {
        s[i] = ds4_session_new(e, n_toks, err, sizeof err);
        if (!s[i] || ds4_session_prefill(s[i], toks, 10 + 7 * i, NULL, NULL, NULL, err, sizeof err)) {
            CHECK(false, "session: %s", err);
            goto done;
        }
        steps[i] = (ds4_step){s[i], toks + 10 + 7 * i, 1};
    }
    CHECK(ds4_sessions_step(e, steps, S, err, sizeof err) == 0, "decode step: %s", err);
    for (int i = 0; i < S; i++) bad += !same_row(ds4_session_logits(s[i]), row(all, 10 + 7 * i));
    CHECK(bad == 0, "%d of %d decode rows stepped together differ from the prefill", bad, S);
    for (int i = 0; i < 2; i++) CHECK(ds4_session_rewind(s[i], 0, err, sizeof err) == 0, "%s", err);
    steps[0] = (ds4_step){s[0], toks, 200};
    steps[1] = (ds4_step){s[1], toks, 150};
    CHECK(ds4_sessions_step(e, steps, 2, err, sizeof err) == 0, "prefill step: %s", err);
    CHECK(same_row(ds4_session_logits(s[0]), row(all, 199)) && same_row(ds4_session_logits(s[1]), row(all, 149)),
          "two prefills stepped together differ from the prefill");
done:
    for (int i = 0; i < S; i++) ds4_session_free(s[i]);
}

/* DSV4 and GLM payloads refuse each other's sessions. */
static void cross_family(ds4_engine *glm) {
    char err[512];
    ds4_engine *ds = test_engine_load("fuzz/corpus/model/micro-f16.gguf", 0, 0);
    CHECK(ds != NULL, "micro model");
    if (!ds) return;
    CHECK(ds4_engine_chat(ds) == &ds4_chat_spec_dsv4 && ds4_engine_chat(glm) == &ds4_chat_spec_glm, "families");
    ds4_session *d = ds4_session_new(ds, 32, err, sizeof err), *g = ds4_session_new(glm, 32, err, sizeof err);
    const int32_t few[4] = {1, 2, 3, 4};
    if (d && g && ds4_session_prefill(d, few, 4, NULL, NULL, NULL, err, sizeof err) == 0 &&
        ds4_session_prefill(g, few, 3, NULL, NULL, NULL, err, sizeof err) == 0) {
        size_t nd = ds4_session_payload_bytes(d), ng = ds4_session_payload_bytes(g);
        void *pd = malloc(nd), *pg = malloc(ng);
        if (pd && pg) {
            ds4_session_save_payload(d, pd);
            ds4_session_save_payload(g, pg);
            CHECK(ds4_session_load_payload(g, pd, nd, err, sizeof err) == -1 && strstr(err, "DeepSeek V4 session") &&
                      strstr(err, "GLM"), "DSV4 payload into GLM: %s", err);
            CHECK(ds4_session_load_payload(d, pg, ng, err, sizeof err) == -1 && strstr(err, "GLM 5.2 session") &&
                      strstr(err, "DeepSeek V4"), "GLM payload into DSV4: %s", err);
            CHECK(ds4_session_n_tokens(g) == 3 && ds4_session_n_tokens(d) == 4, "refused payloads changed nothing");
        }
        free(pd);
        free(pg);
    } else {
        CHECK(false, "cross-family sessions: %s", err);
    }
    ds4_session_free(d);
    ds4_session_free(g);
    ds4_engine_free(ds);
}

static void refused_options(const char *path) {
    char err[512];
    for (int i = 0; i < 5; i++) {
        ds4_engine_params p;
        ds4_engine_params_default(&p);
        p.model_path = path;
        p.quiet = true;
        const char *want = "";
        switch (i) {
        case 0: p.ssd.enabled = true; want = "--ssd-streaming"; break;
        case 1: p.numerics = 1; want = "--numerics ds4"; break;
        case 2: p.layers = "0:1"; want = "--layers"; break;
        case 3: p.gpu.backend = DS4_BACKEND_CUDA; want = "--cuda"; break;
        default: p.dist.role = DS4_DIST_COORDINATOR; want = "--role"; break;
        }
        ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
        CHECK(e == NULL && strstr(err, want) && strstr(err, "GLM 5.2") && !strchr(err, '\n'), "%s: %s", want, err);
        ds4_engine_free(e);
    }
}

static void errors(ds4_engine *e) {
    char err[512];
    ds4_session *s = ds4_session_new(e, 4, err, sizeof err);
    if (!s) { CHECK(false, "%s", err); return; }
    const int32_t bad[2] = {1, V};
    CHECK(ds4_session_prefill(s, bad, 2, NULL, NULL, NULL, err, sizeof err) == -1 && strstr(err, "outside the vocabulary"),
          "bad id: %s", err);
    CHECK(ds4_session_n_tokens(s) == 0, "a refused prefill changed the session");
    CHECK(ds4_session_prefill(s, toks, 5, NULL, NULL, NULL, err, sizeof err) == -1 && strstr(err, "context full"),
          "overflow: %s", err);
    ds4_session_free(s);
}

int main(void) {
    if (!load_fixture()) {
        CHECK(false, "fixture tests/fixtures/glmtiny/A");
        return check_done("test_glm_engine");
    }
    char path[512];
    /* f32 / f16 hold the bf16 weights exactly. q8_0: the oracle itself, its
     * weights rounded to Q8_0 (tests/oracles/glm_q8_bound.py), moves by 0.362
     * of max |logit| (indexer and router selections flip) and its argmax
     * flips only where the golden top-2 gap is below 0.49: q8_0 gets 0.5 and
     * argmax where the gap exceeds 1.0, the margins test_forward.c gives V4. */
    const struct { const char *type; double bound, argmax_gap; } types[] = {
        {"f32", 1e-5, 0}, {"f16", 1e-5, 0}, {"q8_0", 0.5, 1.0}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        ds4_engine *e = test_engine_load(model_path(types[i].type, path, sizeof path), 0, 0);
        CHECK(e != NULL, "load %s", path);
        if (!e) continue;
        CHECK(ds4_engine_n_vocab(e) == V && ds4_engine_n_layers(e) == 4, "geometry");
        float *all = prefill_all(e, n_toks);
        against_oracle(types[i].type, all, types[i].bound, types[i].argmax_gap);
        chunked(e, all);
        decode(e, all);
        rewind_and_snapshots(e, all);
        if (i == 0) {
            ds4_engine *small = test_engine_load(path, 0, 16);
            float *again = small ? prefill_all(small, n_toks) : NULL;
            CHECK(again && !memcmp(again, all, (size_t)n_toks * V * sizeof(float)), "prefill chunk 16 differs");
            free(again);
            ds4_engine_free(small);
            disk_cache(e, all);
            batched(e);
            packed(e, all);
            cross_family(e);
            errors(e);
            refused_options(path);
        }
        free(all);
        ds4_engine_free(e);
    }
    free(gold);
    return check_done("test_glm_engine");
}
