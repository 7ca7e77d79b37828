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
 * runs must both accept and reject drafts, or they prove nothing. The same
 * for the MTP drafter (with the oracle blocks, the demo's random block and
 * the trained tiny model's), plus snapshots and batched sessions with a
 * draft model attached. */
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

static uint64_t total_accepted, total_rejected, mtp_accepted, mtp_rejected, dspark_accepted, dspark_rejected;
static uint64_t sidecar_accepted, sidecar_rejected;

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
    if (sp->p.mtp_path) {
        mtp_accepted += sp->stats.accepted;
        mtp_rejected += sp->stats.proposed - sp->stats.accepted;
    }
    if (sp->p.dspark_path && !sp->p.lookup_max) {
        dspark_accepted += sp->stats.accepted;
        dspark_rejected += sp->stats.proposed - sp->stats.accepted;
        if (strstr(sp->p.dspark_path, "sidecar")) {
            sidecar_accepted += sp->stats.accepted;
            sidecar_rejected += sp->stats.proposed - sp->stats.accepted;
        }
    }
}

/* The drafters a model is checked with: prompt lookup at several lengths,
 * or, with a support file, MTP alone (every margin 0 drafts on every pass)
 * and MTP behind lookup, or DSpark (confidence 0: the whole block on every
 * pass) alone and behind lookup. */
typedef struct { int lookup, min_ngram, mtp_draft; float mtp_margin; bool dspark; float confidence; } drafter;

static void lossless(const char *path, const char *mtp, const char *dspark, int numerics, const drafter *drafts,
                     size_t n_drafts, size_t n_cases) {
    ds4_engine *e = test_engine_load_draft(path, mtp, dspark, numerics, 0);
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
    if (n_cases > sizeof cases / sizeof cases[0]) n_cases = sizeof cases / sizeof cases[0];
    for (size_t c = 0; c < n_cases; c++) {
        outcome ref = run(e, prompt, 48, cases[c].ctx, cases[c].max_tokens, cases[c].temp, cases[c].cancel_after,
                          cases[c].stop_after, NULL);
        for (size_t d = 0; d < n_drafts; d++) {
            ds4_spec sp;
            ds4_spec_params p;
            char err[128], what[512];
            ds4_spec_params_default(&p);
            p.lookup_max = drafts[d].lookup;
            p.lookup_min_ngram = drafts[d].min_ngram ? drafts[d].min_ngram : 2;
            p.mtp_path = drafts[d].mtp_draft ? mtp : NULL;
            p.mtp_draft = drafts[d].mtp_draft ? drafts[d].mtp_draft : 1;
            p.mtp_margin = drafts[d].mtp_margin;
            p.dspark_path = drafts[d].dspark ? dspark : NULL;
            p.dspark_confidence = drafts[d].confidence;
            p.draft_every_step = true;   /* as many verified drafts as possible */
            CHECK(ds4_spec_init(&sp, &p, err, sizeof err), "%s", err);
            outcome got = run(e, prompt, 48, cases[c].ctx, cases[c].max_tokens, cases[c].temp,
                              cases[c].cancel_after, cases[c].stop_after, &sp);
            snprintf(what, sizeof what, "%s numerics %d case %zu lookup %d/%d mtp %d/%g dspark %d/%g", path, numerics,
                     c, drafts[d].lookup, drafts[d].min_ngram, drafts[d].mtp_draft, (double)drafts[d].mtp_margin,
                     drafts[d].dspark, (double)drafts[d].confidence);
            compare(what, &ref, &got, &sp);
            free(got.payload);
        }
        free(ref.payload);
    }
    ds4_engine_free(e);
}

/* Greedy generation of n tokens on a prefilled session into t. */
static void gen(ds4_session *s, int n, ds4_spec *sp, trace *t) {
    char err[512];
    ds4_sampler_params sp_params;
    ds4_sampler_params_default(&sp_params);
    sp_params.temperature = 0;
    ds4_sampler *smp = ds4_sampler_new(&sp_params, t->n_vocab);
    ds4_gen_hooks h = {.on_token = on_token, .ud = t, .ignore_stop = true, .spec = sp};
    ds4_gen_result r = ds4_generate(s, NULL, smp, n, &h, err, sizeof err);
    CHECK(r.end == DS4_GEN_LENGTH && r.n_decoded == n, "generation ended %d after %d: %s", r.end, r.n_decoded, err);
    ds4_sampler_free(smp);
}

static bool same_payload(const ds4_session *a, const ds4_session *b) {
    size_t na = ds4_session_payload_bytes(a), nb = ds4_session_payload_bytes(b);
    unsigned char *pa = malloc(na), *pb = malloc(nb);
    ds4_session_save_payload(a, pa);
    ds4_session_save_payload(b, pb);
    bool same = na == nb && !memcmp(pa, pb, na);
    free(pa);
    free(pb);
    return same;
}

/* A draft model attached changes nothing across snapshots and batches: a
 * session restored from a snapshot taken mid-run (the draft state is not in
 * it) continues token for token and logit for logit as the original and as
 * target-only decoding, with payloads equal by memcmp; and the draft model's
 * logits after a prefill batched with another session equal those after the
 * same prefill alone. */
static void draft_snapshot_and_batch(const char *path, const char *mtp, const char *dspark) {
    char err[512];
    ds4_engine *e = test_engine_load_draft(path, mtp, dspark, 0, 0);
    CHECK(e != NULL, "cannot load %s with %s", path, mtp);
    if (!e) return;
    const int V = ds4_engine_n_vocab(e);
    int32_t prompt[48], other[31];
    for (int i = 0; i < 48; i++) prompt[i] = 3 + (int32_t)((i % 11) * 7919 % (V - 3));
    for (int i = 0; i < 31; i++) other[i] = 3 + (int32_t)((i * 104729) % (V - 3));
    ds4_spec sp;
    ds4_spec_params p;
    ds4_spec_params_default(&p);
    p.mtp_path = mtp;
    p.mtp_draft = 3;
    p.mtp_margin = 0;
    p.dspark_path = dspark;
    p.dspark_confidence = 0;
    CHECK(ds4_spec_init(&sp, &p, err, sizeof err), "%s", err);
    static trace ref, first, rest, resumed;
    ref = first = rest = resumed = (trace){.n_vocab = V};
    ds4_session *r = ds4_session_new(e, 400, err, sizeof err), *s = ds4_session_new(e, 400, err, sizeof err);
    ds4_session *t = ds4_session_new(e, 400, err, sizeof err);
    CHECK(r && s && t, "%s", err);
    if (!r || !s || !t) return;
    CHECK(!ds4_session_prefill(r, prompt, 48, NULL, NULL, NULL, err, sizeof err), "%s", err);
    CHECK(!ds4_session_prefill(s, prompt, 48, NULL, NULL, NULL, err, sizeof err), "%s", err);
    gen(r, 150, NULL, &ref);
    gen(s, 60, &sp, &first);
    ds4_snapshot *snap = ds4_session_snapshot(s);
    CHECK(snap != NULL, "snapshot failed");
    gen(s, 90, &sp, &rest);
    CHECK(snap && !ds4_session_restore(t, snap, err, sizeof err), "restore: %s", err);
    gen(t, 90, &sp, &resumed);
    bool same = first.n == 60 && rest.n == 90 && resumed.n == 90;
    for (int i = 0; same && i < 60; i++) same = first.toks[i] == ref.toks[i] && first.logit_hash[i] == ref.logit_hash[i];
    for (int i = 0; same && i < 90; i++)
        same = rest.toks[i] == ref.toks[60 + i] && rest.logit_hash[i] == ref.logit_hash[60 + i] &&
               resumed.toks[i] == rest.toks[i] && resumed.logit_hash[i] == rest.logit_hash[i];
    CHECK(same, "%s: a run with a snapshot taken and restored differs from target-only", path);
    CHECK(same_payload(r, s) && same_payload(r, t), "%s: payloads differ from target-only after the restore", path);
    CHECK(sp.stats.passes > 0, "%s: the draft model never drafted", path);

    /* batched with another session's prefill, or alone: the same draft */
    ds4_session *b1 = ds4_session_new(e, 400, err, sizeof err), *b2 = ds4_session_new(e, 400, err, sizeof err);
    ds4_session *alone = ds4_session_new(e, 400, err, sizeof err);
    ds4_step steps[2] = {{b1, prompt, 48}, {b2, other, 31}};
    CHECK(b1 && b2 && alone && !ds4_sessions_step(e, steps, 2, err, sizeof err), "batched step: %s", err);
    CHECK(!ds4_session_prefill(alone, prompt, 48, NULL, NULL, NULL, err, sizeof err), "%s", err);
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    CHECK(!ds4_session_draft_logits(b1, 7, lb, err, sizeof err) && !ds4_session_draft_logits(alone, 7, la, err, sizeof err),
          "%s", err);
    CHECK(!memcmp(la, lb, (size_t)V * sizeof(float)), "%s: the draft differs when the prefill was batched", path);
    free(la);
    free(lb);
    ds4_snapshot_free(snap);
    ds4_session_free(alone); ds4_session_free(b1); ds4_session_free(b2);
    ds4_session_free(r); ds4_session_free(s); ds4_session_free(t);
    ds4_engine_free(e);
}

#define DSPARK_FIXTURE "tests/fixtures/ds4tiny/A/dspark/dspark.gguf"
/* the released DeepSeek layout (MoE stages with hyper-connections) */
#define SIDECAR_A "tests/fixtures/ds4tiny/A/dspark-sidecar/dspark.gguf"
#define SIDECAR_B "tests/fixtures/ds4tiny/B/dspark-sidecar/dspark.gguf"

/* Simulates `steps` decode steps of `step_ms` with a draft model whose try
 * costs `try_cost` steps and commits `gain` extra tokens; returns the tries
 * and writes the time spent beyond target-only decoding (in steps). */
static int simulate_budget(int steps, double step_ms, double try_cost, int gain, double *extra) {
    ds4_draft_budget b;
    ds4_draft_budget_init(&b);
    int tries = 0;
    *extra = 0;
    for (int done = 0; done < steps;) {
        if (ds4_draft_budget_allows(&b)) {
            tries++;
            *extra += try_cost - gain;
            ds4_draft_budget_note(&b, (1 + try_cost) * step_ms, 1 + gain, true);
            done += 1 + gain;
        } else {
            ds4_draft_budget_note(&b, step_ms, 1, false);
            done++;
        }
    }
    return tries;
}

/* The budget alone: a drafter that never pays costs at most the starting
 * credit, DS4_SPEC_DRAFT_BUDGET of the steps and the try that overdraws it;
 * one that pays is tried on every step after the first. */
static void budget_case(void) {
    static const double costs[] = {0.05, 0.3, 0.7, 1.5, 4.0};
    for (size_t i = 0; i < sizeof costs / sizeof *costs; i++)
        for (int steps = 96; steps <= 4000; steps *= 4) {
            double extra;
            int tries = simulate_budget(steps, 40.0, costs[i], 0, &extra);
            double most = DS4_SPEC_DRAFT_CREDIT_START + DS4_SPEC_DRAFT_BUDGET * steps + costs[i];
            CHECK(extra <= most + 1e-9, "budget: a drafter costing %.2f steps spent %.2f steps of %d (at most %.2f)",
                  costs[i], extra, steps, most);
            /* and it keeps trying, as the budget allows */
            CHECK(tries >= (int)(DS4_SPEC_DRAFT_BUDGET * steps / costs[i]) - 1,
                  "budget: only %d tries of a drafter costing %.2f steps in %d", tries, costs[i], steps);
        }
    double extra;
    int tries = simulate_budget(400, 40.0, 0.3, 2, &extra);   /* each try saves 1.7 steps */
    CHECK(tries >= 400 / 3 - 2, "budget: a drafter that pays was tried %d times in 400 steps", tries);
    ds4_draft_budget b;
    ds4_draft_budget_init(&b);
    CHECK(!ds4_draft_budget_allows(&b), "budget: a try before any step was measured");
    ds4_draft_budget_note(&b, 10.0, 0, false);   /* nothing committed: not a step */
    CHECK(!ds4_draft_budget_allows(&b) && b.step_ms == 0, "budget: an interval without a token counted as a step");
}

/* End to end: a draft model that is never right (the demo's random MTP block
 * at margin 0.5, which proposes on most tries) runs on few of the steps, and
 * the output is target-only's; at margin 0 (the diagnostic) on every step. */
static void backoff_case(void) {
    ds4_engine *e = test_engine_load_draft("models/demo.gguf", "models/demo-mtp.gguf", NULL, -1, 0);
    CHECK(e != NULL, "cannot load the demo model with its MTP file");
    if (!e) return;
    int32_t prompt[16];
    for (int i = 0; i < 16; i++) prompt[i] = 1000 + 37 * i;
    outcome ref = run(e, prompt, 16, 400, 240, 0.0f, 0, 0, NULL);
    ds4_spec sp;
    ds4_spec_params p;
    char err[128];
    ds4_spec_params_default(&p);
    p.mtp_path = "models/demo-mtp.gguf";
    p.mtp_margin = 0;
    CHECK(ds4_spec_init(&sp, &p, err, sizeof err), "%s", err);
    outcome every = run(e, prompt, 16, 400, 240, 0.0f, 0, 0, &sp);
    compare("demo MTP at margin 0", &ref, &every, &sp);
    CHECK(sp.stats.draft_tries == sp.stats.draft_calls && sp.stats.draft_calls >= 120,
          "margin 0: the draft model ran on %llu of %llu passes", (unsigned long long)sp.stats.draft_tries,
          (unsigned long long)sp.stats.draft_calls);
    free(every.payload);
    p.mtp_margin = 0.5f;
    CHECK(ds4_spec_init(&sp, &p, err, sizeof err), "%s", err);
    outcome got = run(e, prompt, 16, 400, 240, 0.0f, 0, 0, &sp);
    compare("demo MTP on its budget", &ref, &got, &sp);
    /* a try (the MTP block, the 129k-row head, a two-token pass) costs more
     * than half a step here, so the budget allows a handful; without it
     * every one of the 240 steps would try */
    CHECK(sp.stats.accepted > 0 || (sp.stats.draft_tries >= 1 && sp.stats.draft_tries <= 40),
          "budget: the draft model ran on %llu of %llu passes", (unsigned long long)sp.stats.draft_tries,
          (unsigned long long)sp.stats.draft_calls);
    free(ref.payload);
    free(got.payload);
    ds4_engine_free(e);
}

static const drafter LOOKUP[] = {{4, 2, 0, 0, false, 0}, {8, 1, 0, 0, false, 0}, {16, 2, 0, 0, false, 0}};
static const drafter MTP[] = {{0, 0, 1, 0, false, 0}, {0, 0, 3, 0, false, 0}, {0, 0, 5, 0.5f, false, 0},
                              {4, 2, 2, 0, false, 0}};
static const drafter DSPARK[] = {{0, 0, 0, 0, true, 0}, {4, 2, 0, 0, true, 0.3f}};
/* the demo's 129k-row output head makes every block row costly: fixed blocks only */
static const drafter DSPARK_FIXED[] = {{0, 0, 0, 0, true, 0}};

int main(void) {
    lookup_cases();
    const char *build = getenv("BUILD");
    char path[512], mtp[512];
    /* paths under BUILD, or under models/ when they start with "models/" */
    struct { const char *file, *mtp, *dspark; int numerics; size_t cases; } models[] = {
        {"ds4tiny/A-f32.gguf", NULL, NULL, 0, 5}, {"ds4tiny/A-f32.gguf", NULL, NULL, 1, 5},
        {"ds4tiny/B-q8_0.gguf", NULL, NULL, 0, 5}, {"glmtiny/A-f32.gguf", NULL, NULL, -1, 5},
        {"models/demo.gguf", NULL, NULL, -1, 5},
        /* MTP: the oracle blocks (tests/fixtures/ds4tiny/<X>/mtp), the demo's
         * random one and the trained tiny model's, which accepts most drafts */
        {"ds4tiny/A-f32.gguf", "ds4tiny/A-mtp-f32.gguf", NULL, 0, 5},
        {"ds4tiny/A-f32.gguf", "ds4tiny/A-mtp-f32.gguf", NULL, 1, 1},
        {"ds4tiny/B-q8_0.gguf", "ds4tiny/B-mtp-f32.gguf", NULL, 0, 1},
        {"models/demo.gguf", "models/demo-mtp.gguf", NULL, -1, 1},
        {"models/ds4-tiny.gguf", "models/ds4-tiny-mtp.gguf", NULL, -1, 1},
        /* DSpark: the oracle drafters (tests/fixtures/ds4tiny/A/dspark, and the
         * sidecar layout's of A and B) in both numerics, the demo's random one */
        {"ds4tiny/A-f32.gguf", NULL, DSPARK_FIXTURE, 0, 5}, {"ds4tiny/A-f32.gguf", NULL, DSPARK_FIXTURE, 1, 1},
        {"ds4tiny/A-f32.gguf", NULL, SIDECAR_A, 0, 5}, {"ds4tiny/A-f32.gguf", NULL, SIDECAR_A, 1, 1},
        {"ds4tiny/B-q8_0.gguf", NULL, SIDECAR_B, 0, 2},
        {"models/demo.gguf", NULL, "models/demo-dspark.gguf", -1, 1},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        const char *f = models[i].file, *m = models[i].mtp, *b = build ? build : "build";
        snprintf(path, sizeof path, "%s%s%s", strncmp(f, "models/", 7) ? b : "", strncmp(f, "models/", 7) ? "/" : "", f);
        if (m) snprintf(mtp, sizeof mtp, "%s%s%s", strncmp(m, "models/", 7) ? b : "", strncmp(m, "models/", 7) ? "/" : "", m);
        if (models[i].dspark && !strncmp(models[i].dspark, "models/demo", 11))
            lossless(path, NULL, models[i].dspark, models[i].numerics, DSPARK_FIXED, 1, models[i].cases);
        else if (models[i].dspark)
            lossless(path, NULL, models[i].dspark, models[i].numerics, DSPARK, sizeof DSPARK / sizeof DSPARK[0],
                     models[i].cases);
        else if (m) lossless(path, mtp, NULL, models[i].numerics, MTP, sizeof MTP / sizeof MTP[0], models[i].cases);
        else lossless(path, NULL, NULL, models[i].numerics, LOOKUP, sizeof LOOKUP / sizeof LOOKUP[0], models[i].cases);
    }
    snprintf(path, sizeof path, "%s/ds4tiny/A-f32.gguf", build ? build : "build");
    snprintf(mtp, sizeof mtp, "%s/ds4tiny/A-mtp-f32.gguf", build ? build : "build");
    draft_snapshot_and_batch(path, mtp, NULL);
    draft_snapshot_and_batch("models/ds4-tiny.gguf", "models/ds4-tiny-mtp.gguf", NULL);
    draft_snapshot_and_batch(path, NULL, DSPARK_FIXTURE);
    draft_snapshot_and_batch(path, NULL, SIDECAR_A);
    budget_case();
    backoff_case();
    CHECK(total_accepted > 0 && total_rejected > 0,
          "drafts accepted %llu, rejected %llu: both must happen for the comparison to mean anything",
          (unsigned long long)total_accepted, (unsigned long long)total_rejected);
    CHECK(mtp_accepted > 0 && mtp_rejected > 0, "MTP drafts accepted %llu, rejected %llu",
          (unsigned long long)mtp_accepted, (unsigned long long)mtp_rejected);
    CHECK(dspark_accepted > 0 && dspark_rejected > 0, "DSpark drafts accepted %llu, rejected %llu",
          (unsigned long long)dspark_accepted, (unsigned long long)dspark_rejected);
    CHECK(sidecar_accepted > 0 && sidecar_rejected > 0, "DSpark sidecar drafts accepted %llu, rejected %llu",
          (unsigned long long)sidecar_accepted, (unsigned long long)sidecar_rejected);
    printf("drafts accepted %llu, rejected %llu (MTP runs: %llu, %llu; DSpark runs: %llu, %llu, of which the "
           "sidecar layout's %llu, %llu)\n",
           (unsigned long long)total_accepted, (unsigned long long)total_rejected, (unsigned long long)mtp_accepted,
           (unsigned long long)mtp_rejected, (unsigned long long)dspark_accepted, (unsigned long long)dspark_rejected,
           (unsigned long long)sidecar_accepted, (unsigned long long)sidecar_rejected);
    return check_done("test_spec");
}
