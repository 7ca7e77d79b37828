/* glm_payload.c -- GLM session payload serialisation (layout in glm_payload.h). */
#include "models/glm/glm_payload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the GLM payload is little-endian");

enum { H_MAGIC, H_VERSION, H_FAMILY, H_CTX, H_TOKENS, H_LAYERS, H_LATENT, H_ROPE, H_INDEXER, H_VOCAB, H_COUNT };
_Static_assert(H_COUNT * 4 == GLM_PAYLOAD_HEADER_BYTES, "header size");

/* The layer rows of a state holding n_pos positions (ds4_payload_rows). */
static void walk_layers(const glm_kv *kv, int n_pos, ds4_payload_cursor *c) {
    for (int l = 0; l < kv->n_layer; l++) {
        ds4_payload_rows(c, kv->rows[l], 0, (size_t)kv->row_width, 0, n_pos);
        if (kv->idx[l]) ds4_payload_rows(c, kv->idx[l], 0, (size_t)kv->idx_width, 0, n_pos);
    }
}

static size_t fixed_bytes(size_t n_tokens, size_t n_vocab, size_t n_layer) {
    return GLM_PAYLOAD_HEADER_BYTES + 4 * (n_tokens + n_vocab + n_layer);
}

size_t ds4_glm_payload_bytes(const glm_kv *kv, int n_vocab) {
    ds4_payload_cursor c = {0};
    walk_layers(kv, kv->n_pos, &c);
    return fixed_bytes((size_t)kv->n_pos, (size_t)n_vocab, (size_t)kv->n_layer) + c.total;
}

bool ds4_glm_payload_write_to(const glm_kv *kv, const int32_t *toks, const float *logits, int n_vocab,
                          const ds4_sink *sink) {
    static const float zeros[1024];
    const int n = kv->n_pos;
    const uint32_t head[H_COUNT] = {
        [H_MAGIC] = GLM_PAYLOAD_MAGIC, [H_VERSION] = GLM_PAYLOAD_VERSION, [H_FAMILY] = GLM_PAYLOAD_FAMILY,
        [H_CTX] = (uint32_t)kv->ctx, [H_TOKENS] = (uint32_t)n, [H_LAYERS] = (uint32_t)kv->n_layer,
        [H_LATENT] = (uint32_t)kv->latent_width, [H_ROPE] = (uint32_t)(kv->row_width - kv->latent_width),
        [H_INDEXER] = (uint32_t)kv->idx_width, [H_VOCAB] = (uint32_t)n_vocab,
    };
    bool ok = sink->write(sink->ud, head, sizeof head) && sink->write(sink->ud, toks, (size_t)n * 4);
    /* an empty session has no logits; zeros keep the bytes deterministic */
    if (n) ok = ok && sink->write(sink->ud, logits, (size_t)n_vocab * 4);
    for (int left = n ? 0 : n_vocab; ok && left > 0; left -= 1024)
        ok = sink->write(sink->ud, zeros, (size_t)(left < 1024 ? left : 1024) * 4);
    for (int l = 0; ok && l < kv->n_layer; l++) {
        const uint32_t flag = kv->idx[l] != NULL;
        ok = sink->write(sink->ud, &flag, 4);
    }
    ds4_payload_cursor c = {.sink = sink, .ok = ok};
    walk_layers(kv, n, &c);
    return c.ok;
}

void ds4_glm_payload_write(const glm_kv *kv, const int32_t *toks, const float *logits, int n_vocab, void *dst) {
    ds4_memory_stream m = {.p = dst};
    const ds4_sink sink = ds4_memory_sink(&m);
    ds4_glm_payload_write_to(kv, toks, logits, n_vocab, &sink);
}

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return false; } while (0)

/* One geometry field of the payload against the target's. */
static bool same(const uint32_t *h, int field, const char *what, uint32_t want, char *err, size_t errlen) {
    if (h[field] != want) FAIL("GLM payload %s %u does not match this model/session (%u)", what, h[field], want);
    return true;
}

static bool check_header(const glm_kv *kv, int n_vocab, const uint32_t *h, size_t n, char *err, size_t errlen) {
    if (h[H_MAGIC] == DS4_PAYLOAD_MAGIC) FAIL("this is a DeepSeek V4 session payload; the model is GLM 5.2");
    if (h[H_MAGIC] != GLM_PAYLOAD_MAGIC) FAIL("not a GLM payload (bad magic 0x%08x)", h[H_MAGIC]);
    if (h[H_VERSION] != GLM_PAYLOAD_VERSION)
        FAIL("GLM payload version %u, this build reads %u", h[H_VERSION], GLM_PAYLOAD_VERSION);
    if (h[H_FAMILY] != GLM_PAYLOAD_FAMILY)
        FAIL("GLM payload names model family %u, this model is GLM 5.2 (%u)", h[H_FAMILY], GLM_PAYLOAD_FAMILY);
    if (!same(h, H_LAYERS, "layer count", (uint32_t)kv->n_layer, err, errlen) ||
        !same(h, H_LATENT, "latent width", (uint32_t)kv->latent_width, err, errlen) ||
        !same(h, H_ROPE, "rope key width", (uint32_t)(kv->row_width - kv->latent_width), err, errlen) ||
        !same(h, H_INDEXER, "indexer key width", (uint32_t)kv->idx_width, err, errlen) ||
        !same(h, H_VOCAB, "vocabulary size", (uint32_t)n_vocab, err, errlen))
        return false;
    if (h[H_TOKENS] > h[H_CTX]) FAIL("GLM payload holds %u tokens for a %u-token context", h[H_TOKENS], h[H_CTX]);
    if (h[H_CTX] > (uint32_t)kv->ctx)
        FAIL("GLM payload was saved for a %u-token context, this session has %d", h[H_CTX], kv->ctx);
    ds4_payload_cursor size = {0};
    walk_layers(kv, (int)h[H_TOKENS], &size);
    const size_t want = fixed_bytes(h[H_TOKENS], h[H_VOCAB], h[H_LAYERS]) + size.total;
    if (n != want) FAIL("GLM payload is %zu bytes, its header describes %zu", n, want);
    return true;
}

bool ds4_glm_payload_load_from(glm_kv *kv, int32_t *toks, float *logits, int n_vocab, const ds4_source *src, size_t n,
                           char *err, size_t errlen) {
    uint32_t h[H_COUNT];
    if (n < sizeof h) FAIL("GLM payload truncated: %zu bytes, header needs %u", n, GLM_PAYLOAD_HEADER_BYTES);
    if (!src->read(src->ud, h, sizeof h)) FAIL("cannot read the GLM payload header");
    if (!check_header(kv, n_vocab, h, n, err, errlen)) return false;
    const int n_pos = (int)h[H_TOKENS];
    /* token ids, logits and flags are staged and checked before the target changes */
    const size_t staged_bytes = 4 * ((size_t)n_pos + (size_t)n_vocab + (size_t)kv->n_layer);
    uint32_t *staged = malloc(staged_bytes);
    if (!staged) FAIL("out of memory staging %zu bytes of GLM payload", staged_bytes);
    if (!src->read(src->ud, staged, staged_bytes)) { free(staged); FAIL("cannot read the GLM payload token list"); }
    const uint32_t *ids = staged, *flags = staged + n_pos + n_vocab;
    for (int i = 0; i < n_pos; i++)
        if (ids[i] >= (uint32_t)n_vocab) {
            snprintf(err, errlen, "GLM payload token %d is id %u, outside the vocabulary (%d)", i, ids[i], n_vocab);
            free(staged);
            return false;
        }
    const float *staged_logits = (const float *)(staged + n_pos);
    const size_t bad = n_pos ? ds4_kv_first_bad(staged_logits, (size_t)n_vocab) : (size_t)n_vocab;
    if (bad < (size_t)n_vocab) {
        snprintf(err, errlen, "GLM payload logit %zu is %g, not a value a session holds (finite, |x| <= %g)", bad,
                 (double)staged_logits[bad], (double)DS4_KV_MAX_ABS);
        free(staged);
        return false;
    }
    for (int l = 0; l < kv->n_layer; l++)
        if (flags[l] != (kv->idx[l] != NULL)) {
            snprintf(err, errlen, "GLM payload layer %d %s indexer keys, this model's layer %s", l,
                     flags[l] ? "has" : "has no", kv->idx[l] ? "keeps them" : "does not");
            free(staged);
            return false;
        }
    memcpy(toks, ids, (size_t)n_pos * 4);
    memcpy(logits, staged + n_pos, (size_t)n_vocab * 4);
    free(staged);
    ds4_payload_cursor c = {.src = src, .ok = true};
    walk_layers(kv, n_pos, &c);
    if (!c.ok) {
        /* rows are overwritten in place: a half-read state must not pass for one */
        kv->n_pos = 0;
        if (c.inadmissible)
            FAIL("GLM payload rows hold %g, not a value a session holds (finite, |x| <= %g); the session is now empty",
                 (double)c.bad_value, (double)DS4_KV_MAX_ABS);
        FAIL("GLM payload rows could not be read; the session is now empty");
    }
    kv->n_pos = n_pos;
    return true;
}

bool ds4_glm_payload_load(glm_kv *kv, int32_t *toks, float *logits, int n_vocab, const void *src, size_t n, char *err,
                      size_t errlen) {
    ds4_memory_stream m = {.src = src, .left = n};
    const ds4_source source = ds4_memory_source(&m);
    return ds4_glm_payload_load_from(kv, toks, logits, n_vocab, &source, n, err, errlen);
}
