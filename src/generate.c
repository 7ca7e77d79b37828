#include "generate.h"

#include <stdio.h>

static void flush_text(ds4_detok *dt, const ds4_gen_hooks *h) {
    char piece[DS4_DETOK_OUT_MAX];
    size_t n = ds4_detok_flush(dt, piece);
    if (n && h->on_text) h->on_text(h->ud, piece, n);
}

ds4_gen_result ds4_generate(ds4_session *s, const ds4_tokenizer *tok, ds4_sampler *smp, int max_tokens,
                            const ds4_gen_hooks *h, char *err, size_t errlen) {
    const int fail_decode_after = ds4_session_test_fail_decode_after(s);
    ds4_gen_result r = {.end = DS4_GEN_LENGTH};
    ds4_detok dt;
    ds4_detok_init(&dt);
    char piece[DS4_DETOK_OUT_MAX];
    for (int step = 0;; step++) {
        if (h->cancelled && h->cancelled(h->ud)) { r.end = DS4_GEN_CANCELLED; break; }
        if (step >= max_tokens) { r.end = DS4_GEN_LENGTH; break; }
        const float *logits = ds4_session_logits(s);
        int id = h->forced ? h->forced(h->ud, step) : -1;
        if (id < 0) id = ds4_sampler_sample(smp, logits, h->greedy && h->greedy(h->ud));
        if (h->on_token) h->on_token(h->ud, id, logits);
        if (!h->ignore_stop && ds4_tokenizer_is_stop(tok, id)) { r.end = DS4_GEN_EOS; break; }
        size_t n = ds4_detok_push(&dt, tok, id, piece);
        bool stop = h->on_text && n ? h->on_text(h->ud, piece, n) : false;
        if (ds4_session_n_tokens(s) >= ds4_session_ctx(s)) { r.end = DS4_GEN_CTX_FULL; break; }
        if (fail_decode_after >= 0 && r.n_decoded >= fail_decode_after) {
            snprintf(err, errlen, "decode failed: injected by DS4_TEST_FAIL_DECODE_AFTER=%d", fail_decode_after);
            r.end = DS4_GEN_ERROR;
            break;
        }
        int rc = h->decode ? h->decode(h->ud, id, err, errlen) : ds4_session_decode(s, id, err, errlen);
        if (rc) { r.end = DS4_GEN_ERROR; break; }
        r.n_decoded++;
        if (h->after_decode) h->after_decode(h->ud);
        if (stop) { r.end = DS4_GEN_STOPPED; break; }
    }
    flush_text(&dt, h);
    return r;
}
