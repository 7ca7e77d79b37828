/* test_generate.c -- the shared generation loop (generate.h) on the demo
 * model (models/demo.gguf, a make test input): each end reason, the order of
 * hooks, what is decoded into the session, and that the text handed out is
 * exactly the tokenizer's decode of the tokens (the independent oracle). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/generate.h"
#include "base/json_util.h"

#define DEMO "models/demo.gguf"

typedef struct {
    const int32_t *forced;     /* NULL: sample */
    int n_forced;
    int stop_after;            /* on_text asks to stop at this token count (0 never) */
    int cancel_at;             /* cancelled() true at this step (0 never) */
    bool ignore_stop;          /* ds4_gen_hooks.ignore_stop */
    int n_tokens, n_cancel_calls;
    int32_t seen[64];
    ds4_buf text;
} probe;

static bool probe_cancelled(void *ud) {
    probe *p = ud;
    return p->cancel_at && ++p->n_cancel_calls > p->cancel_at;
}

static int probe_forced(void *ud, int step) {
    probe *p = ud;
    return p->forced && step < p->n_forced ? p->forced[step] : -1;
}

static void probe_token(void *ud, int32_t tok, const float *logits) {
    probe *p = ud;
    if (logits && p->n_tokens < 64) p->seen[p->n_tokens] = tok;
    p->n_tokens++;
}

static bool probe_text(void *ud, const char *text, size_t len) {
    probe *p = ud;
    ds4_buf_put(&p->text, text, len);
    return p->stop_after && p->n_tokens >= p->stop_after;
}

static ds4_gen_result run(ds4_session *s, const ds4_tokenizer *tok, ds4_sampler *smp, int max, probe *p,
                          char *err, size_t errlen) {
    ds4_gen_hooks h = {.cancelled = probe_cancelled, .forced = probe_forced, .on_token = probe_token,
                       .on_text = probe_text, .ud = p, .ignore_stop = p->ignore_stop};
    return ds4_generate(s, tok, smp, max, &h, err, errlen);
}

static ds4_session *fresh(ds4_engine *e, int ctx, const int32_t *prompt, int n) {
    char err[256];
    ds4_session *s = ds4_session_new(e, ctx, err, sizeof err);
    if (s && ds4_session_prefill(s, prompt, n, NULL, NULL, NULL, err, sizeof err)) {
        ds4_session_free(s);
        return NULL;
    }
    return s;
}

int main(void) {
    char err[256];
    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = DEMO;
    ep.quiet = true;
    ds4_engine *e = ds4_engine_load(&ep, err, sizeof err);
    CHECK(e != NULL, "load %s: %s (make demo-model)", DEMO, err);
    if (!e) return check_done("test_generate");
    const ds4_tokenizer *tok = ds4_engine_tokenizer(e);
    const int eos = ds4_tokenizer_specials(tok)->eos;
    ds4_sampler_params sp;
    ds4_sampler_params_default(&sp);
    sp.temperature = 0;
    ds4_sampler *smp = ds4_sampler_new(&sp, ds4_engine_n_vocab(e));
    ds4_token_ids prompt = {0}, words = {0};
    ds4_tokenizer_encode(tok, "Hello there", 11, DS4_TOK_SPECIALS_NONE, &prompt);
    ds4_tokenizer_encode(tok, "caf\xc3\xa9 \xe2\x82\xac and more words", 22, DS4_TOK_SPECIALS_NONE, &words);
    const int P = (int)prompt.n, W = (int)words.n;

    /* LENGTH: forced tokens all decoded; the text is the tokenizer's decode */
    ds4_session *s = fresh(e, 64, prompt.v, P);
    probe p = {.forced = words.v, .n_forced = W};
    ds4_gen_result r = run(s, tok, smp, W, &p, err, sizeof err);
    size_t want_len = 0;
    char *want = ds4_tokenizer_decode(tok, words.v, words.n, true, &want_len);
    CHECK(r.end == DS4_GEN_LENGTH && r.n_decoded == W, "end %d decoded %d of %d", r.end, r.n_decoded, W);
    CHECK(ds4_session_n_tokens(s) == P + W, "session %d", ds4_session_n_tokens(s));
    CHECK(!memcmp(ds4_session_tokens(s) + P, words.v, (size_t)W * 4), "session holds the forced tokens");
    CHECK(p.text.len == want_len && !memcmp(p.text.data, want, want_len), "text equals decode");
    free(want);
    ds4_buf_free(&p.text);
    ds4_session_free(s);

    /* EOS: seen by on_token, never decoded */
    int32_t eos_script[3] = {words.v[0], eos, words.v[1]};
    s = fresh(e, 64, prompt.v, P);
    p = (probe){.forced = eos_script, .n_forced = 3};
    r = run(s, tok, smp, 10, &p, err, sizeof err);
    CHECK(r.end == DS4_GEN_EOS && r.n_decoded == 1 && p.n_tokens == 2 && p.seen[1] == eos,
          "eos end %d decoded %d seen %d", r.end, r.n_decoded, p.n_tokens);
    CHECK(ds4_session_n_tokens(s) == P + 1, "EOS not in the session");
    ds4_buf_free(&p.text);
    ds4_session_free(s);

    /* ignore_stop (ds4 --ignore-eos): EOS is decoded like any token, the
     * loop runs to max_tokens */
    s = fresh(e, 64, prompt.v, P);
    p = (probe){.forced = eos_script, .n_forced = 3, .ignore_stop = true};
    r = run(s, tok, smp, 5, &p, err, sizeof err);
    CHECK(r.end == DS4_GEN_LENGTH && r.n_decoded == 5 && p.n_tokens == 5 && p.seen[1] == eos,
          "ignore_stop end %d decoded %d seen %d", r.end, r.n_decoded, p.n_tokens);
    CHECK(ds4_session_n_tokens(s) == P + 5 && ds4_session_tokens(s)[P + 1] == eos, "EOS decoded into the session");
    ds4_buf_free(&p.text);
    ds4_session_free(s);

    /* STOPPED: the stopping token is decoded, nothing after it */
    s = fresh(e, 64, prompt.v, P);
    p = (probe){.forced = words.v, .n_forced = W, .stop_after = 2};
    r = run(s, tok, smp, W, &p, err, sizeof err);
    CHECK(r.end == DS4_GEN_STOPPED && r.n_decoded == 2 && ds4_session_n_tokens(s) == P + 2,
          "stop end %d decoded %d", r.end, r.n_decoded);
    ds4_buf_free(&p.text);
    ds4_session_free(s);

    /* CANCELLED before the third step */
    s = fresh(e, 64, prompt.v, P);
    p = (probe){.forced = words.v, .n_forced = W, .cancel_at = 2};
    r = run(s, tok, smp, W, &p, err, sizeof err);
    CHECK(r.end == DS4_GEN_CANCELLED && r.n_decoded == 2, "cancel end %d decoded %d", r.end, r.n_decoded);
    ds4_buf_free(&p.text);
    ds4_session_free(s);

    /* CTX_FULL: the last token is shown, not decoded past the context */
    s = fresh(e, P + 2, prompt.v, P);
    p = (probe){.forced = words.v, .n_forced = W};
    r = run(s, tok, smp, W, &p, err, sizeof err);
    CHECK(r.end == DS4_GEN_CTX_FULL && r.n_decoded == 2 && p.n_tokens == 3 && ds4_session_n_tokens(s) == P + 2,
          "ctx end %d decoded %d seen %d", r.end, r.n_decoded, p.n_tokens);
    ds4_buf_free(&p.text);
    ds4_session_free(s);

    /* ERROR: a decode failure (an id outside the vocabulary) ends the loop
     * with the engine's message, distinct from every normal end */
    int32_t bad[2] = {words.v[0], ds4_engine_n_vocab(e)};
    s = fresh(e, 64, prompt.v, P);
    p = (probe){.forced = bad, .n_forced = 2};
    err[0] = 0;
    r = run(s, tok, smp, 10, &p, err, sizeof err);
    CHECK(r.end == DS4_GEN_ERROR && r.n_decoded == 1 && err[0], "error end %d decoded %d '%s'", r.end, r.n_decoded, err);
    ds4_buf_free(&p.text);
    ds4_session_free(s);

    /* Sampling (no forced hook) is the greedy argmax of the session logits */
    s = fresh(e, 64, prompt.v, P);
    p = (probe){0};
    const float *lg = ds4_session_logits(s);
    int best = 0;
    for (int i = 1; i < ds4_engine_n_vocab(e); i++) if (lg[i] > lg[best]) best = i;
    r = run(s, tok, smp, 1, &p, err, sizeof err);
    CHECK(p.n_tokens == 1 && p.seen[0] == best, "greedy picked %d, argmax %d", p.seen[0], best);
    ds4_buf_free(&p.text);
    ds4_session_free(s);

    ds4_token_ids_free(&prompt);
    ds4_token_ids_free(&words);
    ds4_sampler_free(smp);
    ds4_engine_free(e);
    return check_done("test_generate");
}
