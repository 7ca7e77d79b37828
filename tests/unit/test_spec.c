/* test_spec.c -- speculative decoding is lossless by construction.
 *
 * The prompt-lookup drafter against hand-worked proposals, then, for the
 * transformers-oracle models (DeepSeek V4 f32 and q8_0, both numerics, GLM)
 * and the demo model: every generation run twice, target-only and with the
 * drafter at several draft lengths, must give the same tokens, the same
 * logits at every step (memcmp), the same end and count, and a session whose
 * payload compares equal with memcmp; greedy and sampled, ended by length,
 * by a cancel and a stop in the middle of a verified block, and by a full
 * context. The
 * runs must both accept and reject drafts, or they prove nothing. */
#include "check.h"
#include "engine_load.h"
#include "engine/generate.h"
#include "engine/spec.h"

#include <stdlib.h>
#include <string.h>

static void lookup_cases(void) {
    ds4_spec sp;
    ds4_spec_params p;
    char err[128];
    ds4_spec_params_default(&p);
    p.lookup_max = 4;
    CHECK(ds4_spec_init(&sp, &p, err, sizeof err), "%s", err);
    int32_t out[DS4_SPEC_MAX_DRAFT];
    /* [1 2 3 4 1 2] + 3: suffix 1 2 3 matched at 0, followed by 4 1 2 3 */
    const int32_t a[] = {1, 2, 3, 4, 1, 2};
    int k = ds4_spec_propose(&sp, a, 6, 3, 8, out);
    CHECK(k == 4 && out[0] == 4 && out[1] == 1 && out[2] == 2 && out[3] == 3, "k=%d", k);
    /* max caps the proposal */
    k = ds4_spec_propose(&sp, a, 6, 3, 2, out);
    CHECK(k == 2 && out[0] == 4 && out[1] == 1, "k=%d", k);
    /* the most recent of two earlier copies: 5 6 -> 7 at 0, 8 at 3 */
    const int32_t b[] = {5, 6, 7, 5, 6, 8, 9, 5};
    k = ds4_spec_propose(&sp, b, 8, 6, 4, out);
    CHECK(k >= 1 && out[0] == 8, "k=%d first=%d", k, out[0]);
    /* the longest suffix wins over a more recent shorter match:
     * 1 2 3 at 0 is followed by 4; 2 3 at 5 by 9 */
    const int32_t c[] = {1, 2, 3, 4, 0, 2, 3, 9, 1, 2};
    k = ds4_spec_propose(&sp, c, 10, 3, 1, out);
    CHECK(k == 1 && out[0] == 4, "k=%d first=%d", k, out[0]);
    /* a suffix shorter than the minimum n-gram proposes nothing */
    const int32_t d[] = {7, 1, 8};
    CHECK(ds4_spec_propose(&sp, d, 3, 7, 4, out) == 0, "1-gram matched with min n-gram 2");
    p.lookup_min_ngram = 1;
    CHECK(ds4_spec_init(&sp, &p, err, sizeof err), "%s", err);
    k = ds4_spec_propose(&sp, d, 3, 7, 4, out);
    CHECK(k == 3 && out[0] == 1 && out[1] == 8 && out[2] == 7, "k=%d", k);
    /* no earlier copy, and a disabled drafter, propose nothing */
    const int32_t e[] = {1, 2, 3};
    CHECK(ds4_spec_propose(&sp, e, 3, 4, 4, out) == 0, "matched nothing");
    p.lookup_max = DS4_SPEC_MAX_DRAFT + 1;
    CHECK(!ds4_spec_init(&sp, &p, err, sizeof err), "an over-long draft was accepted");
}

/* What one generation run saw: its tokens and a hash of each step's logits
 * (FNV-1a over the bytes), its end, and its session's payload. */
typedef struct {
    int32_t toks[1024];
    uint64_t logit_hash[1024];
    int n, n_vocab, cancel_after, stop_after;
} trace;

static void on_token(void *ud, int32_t tok, const float *logits) {
    trace *t = ud;
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)logits;
    for (size_t i = 0; i < (size_t)t->n_vocab * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ull;
    if (t->n < 1024) { t->toks[t->n] = tok; t->logit_hash[t->n] = h; }
    t->n++;
}

static bool cancelled(void *ud) {
    const trace *t = ud;
    return t->cancel_after > 0 && t->n >= t->cancel_after;
}

/* models without a vocabulary have no text, so only the demo model stops here */
static bool on_text(void *ud, const char *text, size_t len) {
    trace *t = ud;
    (void)text; (void)len;
    return t->stop_after > 0 && t->n >= t->stop_after;
}

typedef struct {
    ds4_gen_result r;
    trace t;
    unsigned char *payload;
    size_t payload_bytes;
    int n_tokens;
} outcome;

static outcome run(ds4_engine *e, const int32_t *prompt, int n_prompt, int ctx, int max_tokens, float temp,
                   int cancel_after, int stop_after, ds4_spec *sp) {
    outcome o = {0};
    char err[512];
    ds4_session *s = ds4_session_new(e, ctx, err, sizeof err);
    CHECK(s != NULL, "%s", err);
    if (!s) return o;
    CHECK(ds4_session_prefill(s, prompt, n_prompt, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    ds4_sampler_params sp_params;
    ds4_sampler_params_default(&sp_params);
    sp_params.temperature = temp;
    sp_params.seed = 42;
    ds4_sampler *smp = ds4_sampler_new(&sp_params, ds4_engine_n_vocab(e));
    o.t.n_vocab = ds4_engine_n_vocab(e);
    o.t.cancel_after = cancel_after;
    o.t.stop_after = stop_after;
    ds4_gen_hooks h = {.cancelled = cancelled, .on_token = on_token, .on_text = on_text, .ud = &o.t, .ignore_stop = true, .spec = sp};
    o.r = ds4_generate(s, ds4_engine_tokenizer(e), smp, max_tokens, &h, err, sizeof err);
    CHECK(o.r.end != DS4_GEN_ERROR, "%s", err);
    o.n_tokens = ds4_session_n_tokens(s);
    o.payload_bytes = ds4_session_payload_bytes(s);
    o.payload = malloc(o.payload_bytes);
    ds4_session_save_payload(s, o.payload);
    ds4_sampler_free(smp);
    ds4_session_free(s);
    return o;
}

static uint64_t total_accepted, total_rejected;

static void compare(const char *what, const outcome *ref, const outcome *got, const ds4_spec *sp) {
    CHECK(ref->r.end == got->r.end && ref->r.n_decoded == got->r.n_decoded, "%s: end %d/%d decoded %d/%d", what,
          ref->r.end, got->r.end, ref->r.n_decoded, got->r.n_decoded);
    CHECK(ref->t.n == got->t.n, "%s: %d tokens, target-only %d", what, got->t.n, ref->t.n);
    int n = ref->t.n < got->t.n ? ref->t.n : got->t.n;
    if (n > 1024) n = 1024;
    int first_bad = -1;
    for (int i = 0; i < n && first_bad < 0; i++)
        if (ref->t.toks[i] != got->t.toks[i] || ref->t.logit_hash[i] != got->t.logit_hash[i]) first_bad = i;
    CHECK(first_bad < 0, "%s: step %d differs from target-only", what, first_bad);
    CHECK(ref->n_tokens == got->n_tokens, "%s: session holds %d tokens, target-only %d", what, got->n_tokens,
          ref->n_tokens);
    CHECK(ref->payload_bytes == got->payload_bytes && !memcmp(ref->payload, got->payload, ref->payload_bytes),
          "%s: the session payload differs from target-only", what);
    total_accepted += sp->stats.accepted;
    total_rejected += sp->stats.proposed - sp->stats.accepted;
}

static void lossless(const char *path, int numerics) {
    ds4_engine *e = test_engine_load(path, numerics, 0);
    CHECK(e != NULL, "cannot load %s", path);
    if (!e) return;
    const int V = ds4_engine_n_vocab(e);
    /* a prompt with a repeated motif, so lookup finds matches from the start */
    int32_t prompt[48];
    for (int i = 0; i < 48; i++) prompt[i] = 3 + (int32_t)((i % 11) * 7919 % (V - 3));
    struct { int ctx, max_tokens, cancel_after, stop_after; float temp; } cases[] = {
        {400, 240, 0, 0, 0.0f},      /* greedy, ends by length */
        {400, 200, 0, 0, 0.8f},      /* sampled */
        {400, 240, 97, 0, 0.0f},     /* cancelled wherever step 97 falls in a block */
        {400, 240, 0, 101, 0.0f},    /* stopped by the text at step 101 */
        {48 + 61, 200, 0, 0, 0.0f},  /* a full context */
    };
    const int drafts[][2] = {{4, 2}, {8, 1}, {16, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        outcome ref = run(e, prompt, 48, cases[c].ctx, cases[c].max_tokens, cases[c].temp, cases[c].cancel_after,
                          cases[c].stop_after, NULL);
        for (size_t d = 0; d < sizeof drafts / sizeof drafts[0]; d++) {
            ds4_spec sp;
            ds4_spec_params p;
            char err[128], what[256];
            ds4_spec_params_default(&p);
            p.lookup_max = drafts[d][0];
            p.lookup_min_ngram = drafts[d][1];
            CHECK(ds4_spec_init(&sp, &p, err, sizeof err), "%s", err);
            outcome got = run(e, prompt, 48, cases[c].ctx, cases[c].max_tokens, cases[c].temp,
                              cases[c].cancel_after, cases[c].stop_after, &sp);
            snprintf(what, sizeof what, "%s numerics %d case %zu draft %d/%d", path, numerics, c, drafts[d][0],
                     drafts[d][1]);
            compare(what, &ref, &got, &sp);
            free(got.payload);
        }
        free(ref.payload);
    }
    ds4_engine_free(e);
}

int main(void) {
    lookup_cases();
    const char *build = getenv("BUILD");
    char path[512];
    struct { const char *file; int numerics; } models[] = {
        {"ds4tiny/A-f32.gguf", 0}, {"ds4tiny/A-f32.gguf", 1}, {"ds4tiny/B-q8_0.gguf", 0},
        {"glmtiny/A-f32.gguf", -1}, {"demo", -1},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        if (!strcmp(models[i].file, "demo")) snprintf(path, sizeof path, "models/demo.gguf");
        else snprintf(path, sizeof path, "%s/%s", build ? build : "build", models[i].file);
        lossless(path, models[i].numerics);
    }
    CHECK(total_accepted > 0 && total_rejected > 0,
          "drafts accepted %llu, rejected %llu: both must happen for the comparison to mean anything",
          (unsigned long long)total_accepted, (unsigned long long)total_rejected);
    printf("drafts accepted %llu, rejected %llu\n", (unsigned long long)total_accepted,
           (unsigned long long)total_rejected);
    return check_done("test_spec");
}
