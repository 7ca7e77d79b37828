/* kv_payload.c -- DSV4 session payload serialisation (layout in kv_payload.h). */
#include "models/dsv4/kv_payload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Floats and u32 fields are copied in host order, which is the file order. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the DSV4 payload is little-endian");

static int min_int(int a, int b) { return a < b ? a : b; }

/* The per-layer tensor stream for a state holding n_pos positions. */
static void walk_layers(const ds4_kv *kv, int n_pos, ds4_payload_cursor *c) {
    const size_t D = (size_t)kv->head_dim, DI = (size_t)kv->idx_head_dim;
    for (int l = 0; l < kv->n_layer; l++) {
        const ds4_kv_layer *L = &kv->L[l];
        int raw_n = min_int(n_pos, kv->raw_cap);
        ds4_payload_rows(c, L->raw, kv->raw_cap, D, n_pos - raw_n, raw_n);
        if (!L->ratio) continue;
        int comp_n = n_pos / L->ratio, f_n = min_int(n_pos, L->f_cap);
        ds4_payload_rows(c, L->comp, 0, D, 0, comp_n);
        ds4_payload_rows(c, L->fk, L->f_cap, (size_t)L->coff * D, n_pos - f_n, f_n);
        ds4_payload_rows(c, L->fz, L->f_cap, (size_t)L->coff * D, n_pos - f_n, f_n);
        if (!L->idx) continue;
        ds4_payload_rows(c, L->idx, 0, DI, 0, comp_n);
        ds4_payload_rows(c, L->ik, L->f_cap, 2 * DI, n_pos - f_n, f_n);
        ds4_payload_rows(c, L->iz, L->f_cap, 2 * DI, n_pos - f_n, f_n);
    }
}

/* Largest compressed-row capacity any layer of kv would have for ctx. */
static uint32_t comp_capacity(const ds4_kv *kv, int ctx) {
    uint32_t cap = 0;
    for (int l = 0; l < kv->n_layer; l++)
        if (kv->L[l].ratio && (uint32_t)(ctx / kv->L[l].ratio + 1) > cap) cap = (uint32_t)(ctx / kv->L[l].ratio + 1);
    return cap;
}

static size_t fixed_bytes(uint32_t n_tokens, uint32_t n_vocab, uint32_t n_layer) {
    return DS4_PAYLOAD_HEADER_BYTES + 4 * ((size_t)n_tokens + n_vocab + 2 * (size_t)n_layer);
}

size_t ds4_payload_bytes(const ds4_kv *kv, int n_vocab) {
    ds4_payload_cursor c = {0};
    walk_layers(kv, kv->n_pos, &c);
    return fixed_bytes((uint32_t)kv->n_pos, (uint32_t)n_vocab, (uint32_t)kv->n_layer) + c.total;
}

static bool put_u32(const ds4_sink *sink, uint32_t v) { return sink->write(sink->ud, &v, 4); }

bool ds4_payload_write_to(const ds4_kv *kv, const int32_t *toks, const float *logits, int n_vocab, int prefill_chunk,
                          const ds4_sink *sink) {
    static const float zeros[1024];
    const int n = kv->n_pos;
    const uint32_t head[13] = {
        DS4_PAYLOAD_MAGIC, DS4_PAYLOAD_VERSION, (uint32_t)kv->ctx, (uint32_t)prefill_chunk, (uint32_t)kv->raw_cap,
        (uint32_t)(kv->raw_cap - kv->slack), comp_capacity(kv, kv->ctx), (uint32_t)n, (uint32_t)kv->n_layer,
        (uint32_t)kv->head_dim, (uint32_t)kv->idx_head_dim, (uint32_t)n_vocab, (uint32_t)min_int(n, kv->raw_cap),
    };
    bool ok = sink->write(sink->ud, head, sizeof head) && sink->write(sink->ud, toks, (size_t)n * 4);
    /* an empty session has no logits; zeros keep the file deterministic */
    if (n) ok = ok && sink->write(sink->ud, logits, (size_t)n_vocab * 4);
    for (int left = n ? 0 : n_vocab; ok && left > 0; left -= 1024)
        ok = sink->write(sink->ud, zeros, (size_t)min_int(left, 1024) * 4);
    for (int l = 0; ok && l < kv->n_layer; l++) ok = put_u32(sink, kv->L[l].ratio ? (uint32_t)(n / kv->L[l].ratio) : 0);
    for (int l = 0; ok && l < kv->n_layer; l++) ok = put_u32(sink, kv->L[l].idx ? (uint32_t)(n / kv->L[l].ratio) : 0);
    ds4_payload_cursor c = {.sink = sink, .ok = ok};
    walk_layers(kv, n, &c);
    return c.ok;
}


void ds4_payload_write(const ds4_kv *kv, const int32_t *toks, const float *logits, int n_vocab,
                       int prefill_chunk, void *dst) {
    ds4_memory_stream m = {.p = dst};
    const ds4_sink sink = ds4_memory_sink(&m);
    ds4_payload_write_to(kv, toks, logits, n_vocab, prefill_chunk, &sink);
}

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return false; } while (0)

bool ds4_payload_peek(const void *src, size_t n, ds4_payload_header *h, char *err, size_t errlen) {
    uint32_t f[13];
    if (n < DS4_PAYLOAD_HEADER_BYTES) FAIL("DSV4 payload truncated: %zu bytes, header needs %u", n, DS4_PAYLOAD_HEADER_BYTES);
    memcpy(f, src, sizeof f);
    if (f[0] == GLM_PAYLOAD_MAGIC) FAIL("this is a GLM 5.2 session payload; the model is DeepSeek V4");
    if (f[0] != DS4_PAYLOAD_MAGIC) FAIL("not a DSV4 payload (bad magic 0x%08x)", f[0]);
    if (f[1] != DS4_PAYLOAD_VERSION) FAIL("DSV4 payload version %u, this build reads %u", f[1], DS4_PAYLOAD_VERSION);
    *h = (ds4_payload_header){.version = f[1], .ctx = f[2], .prefill_chunk = f[3], .raw_cap = f[4], .window = f[5],
                              .comp_cap = f[6], .n_tokens = f[7], .n_layer = f[8], .head_dim = f[9],
                              .idx_head_dim = f[10], .n_vocab = f[11], .raw_rows = f[12]};
    if (h->n_tokens > h->ctx) FAIL("DSV4 payload holds %u tokens for a %u-token context", h->n_tokens, h->ctx);
    if (h->window > h->raw_cap) FAIL("DSV4 payload window %u exceeds its raw ring capacity %u", h->window, h->raw_cap);
    uint32_t want_raw = h->n_tokens < h->raw_cap ? h->n_tokens : h->raw_cap;
    if (h->raw_rows != want_raw) FAIL("DSV4 payload lists %u raw rows, %u tokens need %u", h->raw_rows, h->n_tokens, want_raw);
    if (fixed_bytes(h->n_tokens, h->n_vocab, h->n_layer) > n)
        FAIL("DSV4 payload truncated: %zu bytes for %u tokens, %u logits, %u layers", n, h->n_tokens, h->n_vocab, h->n_layer);
    return true;
}

/* Compares one geometry field of the payload with the target's. */
#define SAME(field, want) \
    if (h.field != (uint32_t)(want)) FAIL("DSV4 payload " #field " %u does not match this model/session (%u)", h.field, (uint32_t)(want))

/* Everything between the header and the layer rows: the token ids, the
 * logits and the two per-layer row-count arrays, staged so they are checked
 * before the target is touched. */
typedef struct {
    uint32_t *toks, *counts;
    float *logits;
    void *block;
} staged_prefix;

static bool check_prefix(const ds4_kv *kv, const staged_prefix *sp, int n_pos, int n_vocab, char *err, size_t errlen) {
    for (int i = 0; i < n_pos; i++)
        if (sp->toks[i] >= (uint32_t)n_vocab)
            FAIL("DSV4 payload token %d is id %u, outside the vocabulary (%d)", i, sp->toks[i], n_vocab);
    const size_t bad = n_pos ? ds4_kv_first_bad(sp->logits, (size_t)n_vocab) : (size_t)n_vocab;
    if (bad < (size_t)n_vocab)
        FAIL("DSV4 payload logit %zu is %g, not a value a session holds (finite, |x| <= %g)", bad,
             (double)sp->logits[bad], (double)DS4_KV_MAX_ABS);
    for (int l = 0; l < kv->n_layer; l++) {
        uint32_t rc = sp->counts[l], ri = sp->counts[kv->n_layer + l];
        const ds4_kv_layer *L = &kv->L[l];
        uint32_t want_c = L->ratio ? (uint32_t)(n_pos / L->ratio) : 0, want_i = L->idx ? want_c : 0;
        if (rc != want_c || ri != want_i)
            FAIL("DSV4 payload layer %d lists %u compressed / %u indexer rows, %d tokens give %u / %u", l, rc, ri,
                 n_pos, want_c, want_i);
    }
    return true;
}

bool ds4_payload_load_from(ds4_kv *kv, int32_t *toks, float *logits, int n_vocab, const ds4_source *src, size_t n,
                           char *err, size_t errlen) {
    unsigned char head[DS4_PAYLOAD_HEADER_BYTES];
    ds4_payload_header h;
    if (n < sizeof head) FAIL("DSV4 payload truncated: %zu bytes, header needs %u", n, DS4_PAYLOAD_HEADER_BYTES);
    if (!src->read(src->ud, head, sizeof head)) FAIL("cannot read the DSV4 payload header");
    if (!ds4_payload_peek(head, n, &h, err, errlen)) return false;
    SAME(n_layer, kv->n_layer);
    SAME(head_dim, kv->head_dim);
    SAME(idx_head_dim, kv->idx_head_dim);
    SAME(n_vocab, n_vocab);
    SAME(raw_cap, kv->raw_cap);
    SAME(window, kv->raw_cap - kv->slack);
    if (h.ctx > (uint32_t)kv->ctx) FAIL("DSV4 payload was saved for a %u-token context, this session has %d", h.ctx, kv->ctx);
    SAME(comp_cap, comp_capacity(kv, (int)h.ctx));
    const int n_pos = (int)h.n_tokens;
    ds4_payload_cursor size = {0};
    walk_layers(kv, n_pos, &size);
    const size_t want = fixed_bytes(h.n_tokens, h.n_vocab, h.n_layer) + size.total;
    if (n != want) FAIL("DSV4 payload is %zu bytes, its header describes %zu", n, want);
    const size_t prefix_bytes = want - DS4_PAYLOAD_HEADER_BYTES - size.total;
    staged_prefix sp = {.block = malloc(prefix_bytes)};
    if (!sp.block) FAIL("out of memory staging %zu bytes of DSV4 payload", prefix_bytes);
    sp.toks = sp.block;
    sp.logits = (float *)(sp.toks + n_pos);
    sp.counts = (uint32_t *)(sp.logits + n_vocab);
    if (!src->read(src->ud, sp.block, prefix_bytes)) {
        free(sp.block);
        FAIL("cannot read the DSV4 payload token list");
    }
    if (!check_prefix(kv, &sp, n_pos, n_vocab, err, errlen)) { free(sp.block); return false; }
    memcpy(toks, sp.toks, (size_t)n_pos * 4);
    memcpy(logits, sp.logits, (size_t)n_vocab * 4);
    free(sp.block);
    ds4_payload_cursor c = {.src = src, .ok = true};
    walk_layers(kv, n_pos, &c);
    if (!c.ok) {
        /* rows are overwritten in place: a half-read state must not pass for one */
        ds4_kv_reset(kv);
        if (c.inadmissible)
            FAIL("DSV4 payload rows hold %g, not a value a session holds (finite, |x| <= %g); the session is now empty",
                 (double)c.bad_value, (double)DS4_KV_MAX_ABS);
        FAIL("DSV4 payload rows could not be read; the session is now empty");
    }
    kv->n_pos = n_pos;
    return true;
}

bool ds4_payload_load(ds4_kv *kv, int32_t *toks, float *logits, int n_vocab, const void *src, size_t n,
                      char *err, size_t errlen) {
    ds4_memory_stream m = {.src = src, .left = n};
    const ds4_source source = ds4_memory_source(&m);
    return ds4_payload_load_from(kv, toks, logits, n_vocab, &source, n, err, errlen);
}
