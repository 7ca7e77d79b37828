/* test_runtime_controls.c -- --power and per-session steering through the
 * engine API, on the tiny transformers models of both families
 * ($BUILD/ds4tiny/A-f32.gguf, $BUILD/glmtiny/A-f32.gguf, made by make test).
 * - --power only sleeps: an engine at --power 30 prefills (in chunks of 8, so
 *   several evaluations) and greedily decodes the same tokens, the same
 *   logits and the same session payload, memcmp, as one at --power 100. No
 *   timing is asserted (docs/performance.md has the measured ratio).
 * - Per-session steering in a batch: a steered and an unsteered session
 *   decoded together by ds4_sessions_step() give, bit for bit, what each
 *   gives alone; the steered one differs from the unsteered one (the
 *   steering reaches the rows of its own sequence only).
 * - --power above 100 and ds4_session_set_steering() on an engine
 *   without a file are refused with one line. */
#include "check.h"
#include "engine/engine.h"
#include "base/json_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N_PROMPT = 24, N_GEN = 12, CTX = 64 };

typedef struct {
    int32_t toks[N_PROMPT + N_GEN];
    float *logits;      /* [N_GEN][V] after each decode */
    void *payload;
    size_t payload_bytes;
} run_out;

static ds4_engine *load(const char *path, int power, const char *steer_file, float ffn, float attn, char *err,
                        size_t errlen) {
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 2;
    p.numerics = 0;
    p.prefill_chunk = 8;
    p.quiet = true;
    p.power = power;
    p.steering.file = steer_file;
    p.steering.ffn = ffn;
    p.steering.attn = attn;
    return ds4_engine_load(&p, err, errlen);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* prefill the prompt, then N_GEN greedy decode steps */
static bool generate(ds4_engine *e, const int32_t *prompt, run_out *o) {
    char err[256];
    const int V = ds4_engine_n_vocab(e);
    ds4_session *s = ds4_session_new(e, CTX, err, sizeof err);
    if (!s || ds4_session_prefill(s, prompt, N_PROMPT, NULL, NULL, NULL, err, sizeof err)) {
        fprintf(stderr, "prefill: %s\n", err);
        ds4_session_free(s);
        return false;
    }
    memcpy(o->toks, prompt, N_PROMPT * sizeof(int32_t));
    o->logits = malloc((size_t)N_GEN * V * sizeof(float));
    for (int i = 0; i < N_GEN; i++) {
        o->toks[N_PROMPT + i] = argmax(ds4_session_logits(s), V);
        if (ds4_session_decode(s, o->toks[N_PROMPT + i], err, sizeof err)) { fprintf(stderr, "decode: %s\n", err); break; }
        memcpy(o->logits + (size_t)i * V, ds4_session_logits(s), (size_t)V * sizeof(float));
    }
    o->payload_bytes = ds4_session_payload_bytes(s);
    o->payload = malloc(o->payload_bytes);
    ds4_session_save_payload(s, o->payload);
    ds4_session_free(s);
    return true;
}

static void power_identity(const char *path, const int32_t *prompt) {
    char err[256];
    run_out full = {0}, paced = {0};
    ds4_engine *e = load(path, 100, NULL, NAN, NAN, err, sizeof err);
    CHECK(e && generate(e, prompt, &full), "%s at --power 100: %s", path, err);
    const int V = e ? ds4_engine_n_vocab(e) : 0;
    ds4_engine_free(e);
    e = load(path, 30, NULL, NAN, NAN, err, sizeof err);
    CHECK(e && generate(e, prompt, &paced), "%s at --power 30: %s", path, err);
    ds4_engine_free(e);
    CHECK(!memcmp(full.toks, paced.toks, sizeof full.toks), "%s: same tokens at --power 30", path);
    CHECK(full.logits && paced.logits && !memcmp(full.logits, paced.logits, (size_t)N_GEN * V * sizeof(float)),
          "%s: same logits at --power 30", path);
    CHECK(full.payload_bytes == paced.payload_bytes && full.payload &&
          !memcmp(full.payload, paced.payload, full.payload_bytes), "%s: same session payload at --power 30", path);
    free(full.logits); free(full.payload); free(paced.logits); free(paced.payload);
}

/* a steered and an unsteered session decoded together equal each alone */
static void steering_batched(const char *path, const char *dir_file, const int32_t *prompt) {
    char err[256];
    ds4_engine *e = load(path, 100, dir_file, 0.0f, 0.0f, err, sizeof err);
    CHECK(e != NULL, "%s with %s: %s", path, dir_file, err);
    if (!e) return;
    const int V = ds4_engine_n_vocab(e);
    ds4_session *s[4];
    for (int i = 0; i < 4; i++) {
        s[i] = ds4_session_new(e, CTX, err, sizeof err);
        CHECK(s[i] != NULL, "session: %s", err);
        if (!s[i]) return;
    }
    /* 0, 2: steered; 1, 3: not; 0 and 1 alone, 2 and 3 together */
    CHECK(ds4_session_set_steering(s[0], -1.5f, 1.0f, err, sizeof err) == 0, "set steering: %s", err);
    CHECK(ds4_session_set_steering(s[2], -1.5f, 1.0f, err, sizeof err) == 0, "set steering: %s", err);
    for (int i = 0; i < 2; i++)
        CHECK(ds4_session_prefill(s[i], prompt, N_PROMPT, NULL, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
    /* chunks of 4 + 4 rows: the engine's batch is its prefill chunk, 8 */
    for (int i = 0; i < N_PROMPT; i += 4) {
        const ds4_step both[2] = {{s[2], prompt + i, 4}, {s[3], prompt + i, 4}};
        CHECK(ds4_sessions_step(e, both, 2, err, sizeof err) == 0, "batched prefill: %s", err);
    }
    bool same = true, differs = false;
    for (int t = 0; t < 6; t++) {
        int32_t tok[2] = {argmax(ds4_session_logits(s[0]), V), argmax(ds4_session_logits(s[1]), V)};
        CHECK(ds4_session_decode(s[0], tok[0], err, sizeof err) == 0, "decode: %s", err);
        CHECK(ds4_session_decode(s[1], tok[1], err, sizeof err) == 0, "decode: %s", err);
        const ds4_step step[2] = {{s[2], &tok[0], 1}, {s[3], &tok[1], 1}};
        CHECK(ds4_sessions_step(e, step, 2, err, sizeof err) == 0, "batched decode: %s", err);
        same = same && !memcmp(ds4_session_logits(s[0]), ds4_session_logits(s[2]), (size_t)V * sizeof(float)) &&
               !memcmp(ds4_session_logits(s[1]), ds4_session_logits(s[3]), (size_t)V * sizeof(float));
        differs = differs || memcmp(ds4_session_logits(s[0]), ds4_session_logits(s[1]), (size_t)V * sizeof(float));
    }
    CHECK(same, "%s: steered and unsteered sessions batched together equal each alone", path);
    CHECK(differs, "%s: the steered session differs from the unsteered one", path);
    for (int i = 0; i < 4; i++) ds4_session_free(s[i]);
    ds4_engine_free(e);
}

static bool read_tokens(const char *fixture, int32_t *out) {
    size_t len;
    char *tj = ds4_read_file(fixture, &len);
    cJSON *j = tj ? cJSON_Parse(tj) : NULL;
    const bool ok = j && cJSON_GetArraySize(j) >= N_PROMPT;
    for (int i = 0; ok && i < N_PROMPT; i++) out[i] = cJSON_GetArrayItem(j, i)->valueint;
    cJSON_Delete(j);
    free(tj);
    return ok;
}

int main(void) {
    const char *b = getenv("BUILD");
    static const struct { const char *family, *tokens, *dir; } models[] = {
        {"ds4tiny", "tests/fixtures/ds4tiny/A/tokens", "tests/fixtures/steering/ds4tiny-A/dir.f32"},
        {"glmtiny", "tests/fixtures/glmtiny/A/tokens", "tests/fixtures/steering/glmtiny-A/dir.f32"},
    };
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s/A-f32.gguf", b ? b : "build", models[m].family);
        int32_t prompt[N_PROMPT];
        if (access(path, R_OK) || !read_tokens(models[m].tokens, prompt)) {
            CHECK(0, "%s or %s missing (make test builds the model)", path, models[m].tokens);
            continue;
        }
        power_identity(path, prompt);
        steering_batched(path, models[m].dir, prompt);
        char err[256];
        ds4_engine *e = load(path, 101, NULL, NAN, NAN, err, sizeof err);
        CHECK(!e && strstr(err, "--power") && !strchr(err, '\n'), "--power 101 refused in one line: %s", err);
        ds4_engine_free(e);
        e = load(path, 100, NULL, NAN, NAN, err, sizeof err);
        ds4_session *s = e ? ds4_session_new(e, CTX, err, sizeof err) : NULL;
        CHECK(s && ds4_session_set_steering(s, 1, 0, err, sizeof err) == -1 && strstr(err, "--dir-steering-file"),
              "per-session steering without a file refused: %s", err);
        ds4_session_free(s);
        ds4_engine_free(e);
    }
    return check_done("test_runtime_controls");
}
