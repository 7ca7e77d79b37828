#include "engine/generate.h"
#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void flush_text(ds4_detok *dt, const ds4_gen_hooks *h) {
    char piece[DS4_DETOK_OUT_MAX];
    size_t n = ds4_detok_flush(dt, piece);
    if (n && h->on_text) h->on_text(h->ud, piece, n);
}

/* A verification pass's tokens past the ones the loop has committed: draft[i]
 * is appended to the session already and rows + i * V are the logits after
 * its predecessor, i.e. what target-only decoding would sample draft[i]
 * from. `next` drafts have been confirmed; the session holds `pending` more. */
typedef struct {
    int32_t draft[DS4_SPEC_MAX_DRAFT];
    float *rows;            /* (DS4_SPEC_MAX_DRAFT + 1) x V */
    int n_draft, next;
    int n_vocab;
} spec_block;

static int pending(const spec_block *b) { return b->n_draft - b->next; }
static const float *block_logits(const spec_block *b) { return b->rows + (size_t)b->next * b->n_vocab; }

/* Drops the unconfirmed drafts: the session goes back to what target-only
 * decoding holds, with the logits after the last confirmed token. */
static int drop_pending(ds4_session *s, spec_block *b, char *err, size_t errlen) {
    if (!pending(b)) return 0;
    const int keep = ds4_session_n_tokens(s) - pending(b);
    int rc = ds4_session_truncate(s, keep, block_logits(b), err, errlen);
    b->n_draft = b->next = 0;
    return rc;
}

/* Appends `id`, and the drafter's proposal after it when there is one, in one
 * pass. `room` caps the proposal (tokens the loop may still decode). */
static int decode_with_draft(ds4_session *s, ds4_spec *sp, spec_block *b, int32_t id, int room, char *err,
                             size_t errlen) {
    const int n = ds4_session_n_tokens(s), ctx_room = ds4_session_ctx(s) - n - 1;
    int max = room < ctx_room ? room : ctx_room;
    if (max > DS4_SPEC_MAX_DRAFT) max = DS4_SPEC_MAX_DRAFT;
    int32_t block[DS4_SPEC_MAX_DRAFT + 1];   /* id, then the proposal */
    int k = ds4_spec_draft(sp, s, id, max, block + 1, err, errlen);
    if (k < 0) {
        /* the draft changes nothing the loop produces: decode without it */
        ds4_log(DS4_LOG_WARN, "ds4: draft model: %s; decoding without a draft\n", err);
        k = 0;
    }
    if (!k) return ds4_session_decode(s, id, err, errlen);
    block[0] = id;
    int rc = ds4_session_prefill(s, block, k + 1, b->rows, NULL, NULL, err, errlen);
    if (rc) return rc;
    /* draft[i] pairs with rows[i]: drafted token i+1 is sampled from the logits after block[i] */
    memcpy(b->draft, block + 1, (size_t)k * sizeof *block);
    b->n_draft = k;
    b->next = 0;
    ds4_spec_record_pass(sp, k);
    return 0;
}

ds4_gen_result ds4_generate(ds4_session *s, const ds4_tokenizer *tok, ds4_sampler *smp, int max_tokens,
                            const ds4_gen_hooks *h, char *err, size_t errlen) {
    const int fail_decode_after = ds4_session_test_fail_decode_after(s);
    ds4_gen_result r = {.end = DS4_GEN_LENGTH};
    ds4_detok dt;
    ds4_detok_init(&dt);
    char piece[DS4_DETOK_OUT_MAX];
    ds4_spec *sp = ds4_spec_enabled(h->spec) ? h->spec : NULL;
    spec_block b = {.n_vocab = ds4_session_n_vocab(s)};
    if (sp && !(b.rows = malloc((size_t)(DS4_SPEC_MAX_DRAFT + 1) * b.n_vocab * sizeof(float)))) sp = NULL;
    ds4_spec_begin(sp);
    for (int step = 0;; step++) {
        if (h->cancelled && h->cancelled(h->ud)) { r.end = DS4_GEN_CANCELLED; break; }
        if (step >= max_tokens) { r.end = DS4_GEN_LENGTH; break; }
        const float *logits = pending(&b) ? block_logits(&b) : ds4_session_logits(s);
        int id = h->forced ? h->forced(h->ud, step) : -1;
        if (id < 0) id = ds4_sampler_sample(smp, logits, h->greedy && h->greedy(h->ud));
        if (h->on_token) h->on_token(h->ud, id, logits);
        if (tok && !h->ignore_stop && ds4_tokenizer_is_stop(tok, id)) { r.end = DS4_GEN_EOS; break; }
        size_t n = tok ? ds4_detok_push(&dt, tok, id, piece) : 0;
        bool stop = h->on_text && n ? h->on_text(h->ud, piece, n) : false;
        if (ds4_session_n_tokens(s) - pending(&b) >= ds4_session_ctx(s)) { r.end = DS4_GEN_CTX_FULL; break; }
        if (fail_decode_after >= 0 && r.n_decoded >= fail_decode_after) {
            snprintf(err, errlen, "decode failed: injected by DS4_TEST_FAIL_DECODE_AFTER=%d", fail_decode_after);
            r.end = DS4_GEN_ERROR;
            break;
        }
        int rc = 0;
        if (pending(&b) && b.draft[b.next] == id) {
            ds4_spec_record_accept(sp, b.next++);   /* appended by the verification pass already */
        } else {
            if (pending(&b)) rc = drop_pending(s, &b, err, errlen);
            if (!rc && sp) rc = decode_with_draft(s, sp, &b, id, max_tokens - step - 1, err, errlen);
            else if (!rc) rc = h->decode ? h->decode(h->ud, id, err, errlen) : ds4_session_decode(s, id, err, errlen);
        }
        if (rc) { r.end = DS4_GEN_ERROR; break; }
        r.n_decoded++;
        if (h->after_decode) h->after_decode(h->ud);
        if (stop) { r.end = DS4_GEN_STOPPED; break; }
    }
    if (sp) {
        char terr[256];
        /* the loop's end drops what it did not confirm; this cannot fail
         * (a draft is far inside the rings' slack), but say so if it did */
        if (drop_pending(s, &b, terr, sizeof terr) && r.end != DS4_GEN_ERROR) {
            snprintf(err, errlen, "%s", terr);
            r.end = DS4_GEN_ERROR;
        }
        free(b.rows);
    }
    flush_text(&dt, h);
    return r;
}
