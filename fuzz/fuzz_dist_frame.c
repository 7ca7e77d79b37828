/* Fuzz target: the pipeline and tensor-parallel frame decoder (dist_proto.h). Invariants
 * (abort() on violation): a decoded frame's arrays and strings lie inside
 * the input; re-encoding a decoded frame gives the input back byte for byte
 * (the format has one spelling per frame; a hidden-state payload travels
 * on as it came, whatever its transport format). */
#include "dist/dist_proto.h"

#include <stdlib.h>
#include <string.h>

static void inside(const uint8_t *data, size_t size, const void *p, size_t n) {
    if (n && (!p || (const uint8_t *)p < data || (const uint8_t *)p + n > data + size)) abort();
}

/* The decoded hops (the encoded form is 32 bytes each, the struct's size). */
static ds4_dist_hop *hops_of(const uint8_t *enc, uint32_t n) {
    ds4_dist_hop *hops = malloc(sizeof(ds4_dist_hop) * (size_t)n + 1);
    if (!hops) abort();
    for (uint32_t i = 0; i < n; i++) hops[i] = ds4_dist_hop_at(enc, i);
    return hops;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds4_dist_frame f;
    char err[256];
    if (!ds4_dist_decode(data, size, &f, err, sizeof err)) return 0;
    uint8_t *again = NULL;
    size_t len = 0;
    switch (f.type) {
    case DS4_DIST_HELLO:
        inside(data, size, f.hello.challenge, DS4_DIST_NONCE_BYTES);
        inside(data, size, f.hello.nonce, DS4_DIST_NONCE_BYTES);
        inside(data, size, f.hello.model, f.hello.model_len);
        inside(data, size, f.hello.data_url, f.hello.data_url_len);
        again = ds4_dist_encode_hello(&f.hello, &len);
        break;
    case DS4_DIST_WORK: case DS4_DIST_KV_GET: case DS4_DIST_KV_PUT: {
        inside(data, size, f.work.tokens, 4 * (size_t)f.work.n);
        inside(data, size, f.work.floats, ds4_dist_act_bytes(f.work.act, f.work.row, f.work.n_floats));
        inside(data, size, f.work.hops, sizeof(ds4_dist_hop) * (size_t)f.work.n_hops);
        int32_t *toks = malloc(4 * (size_t)f.work.n);
        float *fl = malloc(4 * (size_t)f.work.n_floats + 4);
        ds4_dist_hop *hops = hops_of(f.work.hops, f.work.n_hops);
        if (!toks || !fl) abort();
        for (uint32_t i = 0; i < f.work.n; i++) toks[i] = ds4_dist_token_at(f.work.tokens, i);
        ds4_dist_work_floats(&f.work, fl);   /* any format decodes; the payload re-encodes as it came */
        again = ds4_dist_encode_work(f.type, &f.work, toks, fl, hops, &len);
        free(toks);
        free(fl);
        free(hops);
        break;
    }
    case DS4_DIST_RESULT: {
        inside(data, size, f.result.floats, 4 * (size_t)f.result.n_floats);
        inside(data, size, f.result.text, f.result.text_len);
        inside(data, size, f.result.hops, sizeof(ds4_dist_hop) * (size_t)f.result.n_hops);
        float *fl = malloc(4 * (size_t)f.result.n_floats + 4);
        ds4_dist_hop *hops = hops_of(f.result.hops, f.result.n_hops);
        if (!fl) abort();
        for (uint32_t i = 0; i < f.result.n_floats; i++) fl[i] = ds4_dist_float_at(f.result.floats, i);
        again = ds4_dist_encode_result(&f.result, fl, hops, &len);
        free(fl);
        free(hops);
        break;
    }
    case DS4_DIST_KNOCK: case DS4_DIST_CHALLENGE:
        inside(data, size, f.challenge.nonce, DS4_DIST_NONCE_BYTES);
        inside(data, size, f.challenge.proof, f.type == DS4_DIST_CHALLENGE ? DS4_DIST_SEAL_BYTES : 0);
        again = ds4_dist_encode_challenge(f.challenge.nonce, f.challenge.proof, &len);
        break;
    case DS4_DIST_ROUTE:
        inside(data, size, f.route.next, f.route.next_len);
        inside(data, size, f.route.home, f.route.home_len);
        inside(data, size, f.route.next_nonce, DS4_DIST_NONCE_BYTES);
        inside(data, size, f.route.home_nonce, DS4_DIST_NONCE_BYTES);
        again = ds4_dist_encode_route(&f.route, &len);
        break;
    case DS4_DIST_TP_STEP: {
        const ds4_dist_tp *t = &f.tp;
        inside(data, size, t->drop, 8 * (size_t)t->n_drop);
        inside(data, size, t->seqs, 21 * (size_t)t->n_seqs);
        inside(data, size, t->tokens, 4 * (size_t)t->n_tokens);
        uint64_t *drop = malloc(8 * (size_t)t->n_drop + 8);
        ds4_dist_tp_seq *seqs = malloc(sizeof *seqs * (size_t)t->n_seqs + 1);
        int32_t *toks = malloc(4 * (size_t)t->n_tokens + 4);
        if (!drop || !seqs || !toks) abort();
        uint64_t n = 0;
        for (uint32_t i = 0; i < t->n_drop; i++) drop[i] = ds4_dist_u64_at(t->drop, i);
        for (uint32_t i = 0; i < t->n_seqs; i++) { seqs[i] = ds4_dist_tp_seq_at(t->seqs, i); n += seqs[i].n; }
        if (n != t->n_tokens) abort();   /* the records account for the tokens */
        for (uint32_t i = 0; i < t->n_tokens; i++) toks[i] = ds4_dist_token_at(t->tokens, i);
        again = ds4_dist_encode_tp_step(t->counter, drop, t->n_drop, seqs, t->n_seqs, toks, &len);
        free(drop);
        free(seqs);
        free(toks);
        break;
    }
    case DS4_DIST_TP_STATE:
        inside(data, size, f.tp.bytes, f.tp.n_bytes);
        again = ds4_dist_encode_tp_state(f.tp.counter, f.tp.session, f.tp.ctx, f.tp.bytes, f.tp.n_bytes, &len);
        break;
    case DS4_DIST_TP_PART: {
        const ds4_dist_tp *t = &f.tp;
        inside(data, size, t->floats, 4 * (size_t)t->n_floats);
        inside(data, size, t->text, t->text_len);
        float *fl = malloc(4 * (size_t)t->n_floats + 4);
        char *text = malloc(t->text_len + 1);
        if (!fl || !text) abort();
        for (uint32_t i = 0; i < t->n_floats; i++) fl[i] = ds4_dist_float_at(t->floats, i);
        memcpy(text, t->text, t->text_len);
        text[t->text_len] = 0;
        /* one spelling: floats only with OK, a text only with ERROR, no NUL inside */
        if ((t->status == DS4_DIST_OK ? t->text_len == 0 : t->n_floats == 0) && strlen(text) == t->text_len)
            again = ds4_dist_encode_tp_part(t->counter, t->step, t->layer, t->status, fl, t->n_floats, text, &len);
        free(fl);
        free(text);
        if (!again) return 0;
        break;
    }
    case DS4_DIST_TP_RDMA:
        inside(data, size, f.rdma.gid, 16);
        again = ds4_dist_encode_tp_rdma(&f.rdma, &len);
        break;
    case DS4_DIST_WELCOME: case DS4_DIST_REFUSED: {
        inside(data, size, f.result.text, f.result.text_len);
        char *t = malloc(f.result.text_len + 1);
        if (!t) abort();
        memcpy(t, f.result.text, f.result.text_len);
        t[f.result.text_len] = 0;
        /* a text with a NUL inside re-encodes shorter: only compare clean ones */
        if (strlen(t) == f.result.text_len) again = ds4_dist_encode_text(f.type, t, &len);
        free(t);
        if (!again) return 0;
        break;
    }
    }
    if (!again || len != size || memcmp(again, data, size)) abort();
    free(again);
    return 0;
}
