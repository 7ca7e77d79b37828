/* test_kv_payload -- the DSV4 session payload: saving, restoring and then
 * continuing must give bit-identical logits to never stopping (tiny model A
 * from mk/models.mk, and models/demo.gguf when present), across ring wrap,
 * into a larger context, and through a rewind; every damaged or mismatched
 * payload is rejected with the target session left untouched (and one whose
 * floats no state holds, NaN, Inf, 3e38, is refused); the streaming
 * forms write the same bytes piece by piece and never leave a half-restored
 * session. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/engine.h"
#include "models/dsv4/kv_payload.h"
#include "payload_values.h"

enum { STEPS = 12 };

static ds4_engine *load(const char *path) {
    char err[512];
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 2;
    p.numerics = 0;
    p.quiet = true;
    ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
    if (!e) fprintf(stderr, "load %s: %s\n", path, err);
    return e;
}

static void make_tokens(int32_t *t, int n, int V, uint32_t seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        t[i] = (int32_t)((seed >> 8) % (uint32_t)V);
    }
}

static ds4_session *session(ds4_engine *e, int ctx) {
    char err[256];
    ds4_session *s = ds4_session_new(e, ctx, err, sizeof err);
    CHECK(s != NULL, "session: %s", err);
    return s;
}

static void *save(const ds4_session *s, size_t *n) {
    *n = ds4_session_payload_bytes(s);
    void *p = malloc(*n);
    ds4_session_save_payload(s, p);
    return p;
}

/* Decodes steps tokens, returning the logits after each (steps x V). */
static float *continue_run(ds4_session *s, const int32_t *toks, int steps, int V) {
    char err[256];
    float *out = malloc((size_t)steps * V * sizeof(float));
    for (int i = 0; i < steps; i++) {
        CHECK(ds4_session_decode(s, toks[i], err, sizeof err) == 0, "decode: %s", err);
        memcpy(out + (size_t)i * V, ds4_session_logits(s), (size_t)V * sizeof(float));
    }
    return out;
}

static bool rejects(ds4_session *s, const void *p, size_t n, const char *what) {
    char err[256] = "";
    bool rejected = ds4_session_load_payload(s, p, n, err, sizeof err) != 0;
    CHECK(rejected, "%s was accepted", what);
    CHECK(!rejected || err[0], "%s: no error message", what);
    return rejected;
}

static void put32(void *p, size_t field, uint32_t v) { memcpy((char *)p + 4 * field, &v, 4); }
static uint32_t get32(const void *p, size_t field) {
    uint32_t v;
    memcpy(&v, (const char *)p + 4 * field, 4);
    return v;
}

/* Round trips at one length: prefill n, save, continue = the reference;
 * restore into a dirty session and a larger one, continue, compare bits. */
static void round_trip(ds4_engine *e, const char *model, int n, int ctx) {
    const int V = ds4_engine_n_vocab(e);
    int32_t *toks = malloc((size_t)(n + STEPS + 64) * sizeof(int32_t));
    make_tokens(toks, n + STEPS, V, 7u + (uint32_t)n);
    char err[256];
    ds4_session *a = session(e, ctx);
    if (n) CHECK(ds4_session_prefill(a, toks, n, NULL, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
    size_t pn;
    void *p = save(a, &pn);
    CHECK(get32(p, 7) == (uint32_t)n && get32(p, 2) == (uint32_t)ctx && get32(p, 11) == (uint32_t)V,
          "%s n=%d: header fields tokens/ctx/vocab", model, n);
    CHECK(!memcmp((char *)p + DS4_PAYLOAD_HEADER_BYTES, toks, (size_t)n * 4), "%s n=%d: tokens follow the header", model, n);
    if (n)
        CHECK(!memcmp((char *)p + DS4_PAYLOAD_HEADER_BYTES + (size_t)n * 4, ds4_session_logits(a), (size_t)V * 4),
              "%s n=%d: logits follow the tokens", model, n);
    float *ref = continue_run(a, toks + n, STEPS, V);

    /* a session holding other state first: restore must replace all of it */
    int32_t junk[40];
    make_tokens(junk, 40, V, 99);
    const int sizes[2] = {ctx, 2 * ctx};
    for (int k = 0; k < 2; k++) {
        ds4_session *b = session(e, sizes[k]);
        CHECK(ds4_session_prefill(b, junk, 40, NULL, NULL, NULL, err, sizeof err) == 0, "junk prefill: %s", err);
        CHECK(ds4_session_load_payload(b, p, pn, err, sizeof err) == 0, "%s n=%d ctx %d: load: %s", model, n, sizes[k], err);
        CHECK(ds4_session_n_tokens(b) == n, "%s n=%d: restored %d tokens", model, n, ds4_session_n_tokens(b));
        CHECK(!memcmp(ds4_session_tokens(b), toks, (size_t)n * 4), "%s n=%d: restored tokens", model, n);
        if (k == 0) {
            size_t qn;
            void *q = save(b, &qn);
            CHECK(qn == pn && !memcmp(p, q, pn), "%s n=%d: save(restore(x)) == x byte for byte", model, n);
            free(q);
        }
        float *got = continue_run(b, toks + n, STEPS, V);
        CHECK(!memcmp(ref, got, (size_t)STEPS * V * sizeof(float)),
              "%s n=%d ctx %d: continued logits differ from the uninterrupted run", model, n, sizes[k]);
        free(got);
        ds4_session_free(b);
    }
    free(ref);
    free(p);
    free(toks);
    ds4_session_free(a);
}

/* A restored session must rewind within its rings exactly as the original:
 * shallow, and as deep as the engine's 256-position slack allows (the
 * kept state then needs the oldest raw rows the payload carries). */
static void rewind_after_restore(ds4_engine *e, int n, int ctx) {
    const int V = ds4_engine_n_vocab(e);
    int32_t *toks = malloc((size_t)(n + STEPS) * sizeof(int32_t));
    make_tokens(toks, n + STEPS, V, 5);
    char err[256];
    const int backs[2] = {n - 5, n - 255};
    for (int k = 0; k < 2; k++) {
        ds4_session *a = session(e, ctx), *b = session(e, ctx);
        CHECK(ds4_session_prefill(a, toks, n, NULL, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
        size_t pn;
        void *p = save(a, &pn);
        CHECK(ds4_session_load_payload(b, p, pn, err, sizeof err) == 0, "load: %s", err);
        CHECK(ds4_session_rewind(a, backs[k], err, sizeof err) == 0 && ds4_session_rewind(b, backs[k], err, sizeof err) == 0,
              "rewind: %s", err);
        float *ra = continue_run(a, toks + backs[k], STEPS, V), *rb = continue_run(b, toks + backs[k], STEPS, V);
        CHECK(!memcmp(ra, rb, (size_t)STEPS * V * sizeof(float)), "rewind to %d after restore differs from the original",
              backs[k]);
        free(ra);
        free(rb);
        free(p);
        ds4_session_free(a);
        ds4_session_free(b);
    }
    free(toks);
}

enum { SAVED_N = 300, SAVED_CTX = 1024 };

/* A ctx-1024 session after SAVED_N tokens and its payload. */
typedef struct {
    int32_t toks[SAVED_N + STEPS];
    ds4_session *a;
    void *p;
    size_t pn;
} saved;

static void saved_session(ds4_engine *e, uint32_t seed, saved *sv) {
    char err[256];
    make_tokens(sv->toks, SAVED_N + STEPS, ds4_engine_n_vocab(e), seed);
    sv->a = session(e, SAVED_CTX);
    CHECK(ds4_session_prefill(sv->a, sv->toks, SAVED_N, NULL, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
    sv->p = save(sv->a, &sv->pn);
}

static void corruption(ds4_engine *e, ds4_engine *other) {
    const int V = ds4_engine_n_vocab(e), n = SAVED_N, ctx = SAVED_CTX;
    saved sv;
    saved_session(e, 11, &sv);
    char err[256];
    const int32_t *toks = sv.toks;
    ds4_session *a = sv.a;
    void *p = sv.p;
    size_t pn = sv.pn;
    float *ref = continue_run(a, toks + n, STEPS, V);
    ds4_session *b = session(e, ctx);
    CHECK(ds4_session_load_payload(b, p, pn, err, sizeof err) == 0, "load: %s", err);
    unsigned char *q = malloc(pn + 4);

    /* truncation: every header/token offset, then a stride, then the tail */
    int bad = 0, tried = 0;
    for (size_t cut = 0; cut < pn; cut += cut < 2048 ? 1 : cut > pn - 64 ? 1 : 997) {
        tried++;
        if (ds4_session_load_payload(b, p, cut, err, sizeof err) == 0) bad++;
    }
    CHECK(bad == 0, "%d of %d truncated payloads were accepted", bad, tried);
    memcpy(q, p, pn);
    q[pn] = 0;
    rejects(b, q, pn + 1, "payload with a trailing byte");

    /* every header field off by one; the prefill chunk is informational */
    for (size_t f = 0; f < 13; f++) {
        memcpy(q, p, pn);
        put32(q, f, get32(p, f) + 1);
        char what[64];
        snprintf(what, sizeof what, "header field %zu + 1", f);
        if (f == 3) CHECK(ds4_session_load_payload(b, q, pn, err, sizeof err) == 0, "prefill chunk field: %s", err);
        else rejects(b, q, pn, what);
        put32(q, f, get32(p, f) - 1);
        snprintf(what, sizeof what, "header field %zu - 1", f);
        if (f != 3) rejects(b, q, pn, what);
    }
    /* a bad compressed-row count, a token outside the vocabulary */
    const size_t counts = 13 + (size_t)n + (size_t)V;
    for (size_t l = 0; l < 12; l++) {
        memcpy(q, p, pn);
        put32(q, counts + l, get32(p, counts + l) ^ 1);
        rejects(b, q, pn, "altered row count");
    }
    memcpy(q, p, pn);
    put32(q, 13 + 17, (uint32_t)V);
    rejects(b, q, pn, "token id == vocabulary size");

    /* values no state holds, in the logits and in the layer rows */
    const int n_layers = ds4_engine_n_layers(e);
    payload_values_refused(b, p, pn, DS4_PAYLOAD_HEADER_BYTES + 4 * (size_t)n,
                           DS4_PAYLOAD_HEADER_BYTES + 4 * ((size_t)n + (size_t)V + 2 * (size_t)n_layers), V, "DSV4");

    /* geometry: a smaller context, another model */
    ds4_session *small = session(e, 512);
    CHECK(rejects(small, p, pn, "payload saved for ctx 1024 into ctx 512") && ds4_session_n_tokens(small) == 0,
          "small session untouched");
    ds4_session_free(small);
    if (other) {
        ds4_session *o = session(other, ctx);
        rejects(o, p, pn, "payload of model A into model B");
        ds4_session_free(o);
    }

    /* after all of that, b still holds exactly what the good load put there */
    float *got = continue_run(b, toks + n, STEPS, V);
    CHECK(!memcmp(ref, got, (size_t)STEPS * V * sizeof(float)), "failed loads changed the session");
    free(got);
    free(ref);
    free(q);
    free(p);
    ds4_session_free(a);
    ds4_session_free(b);
}

/* A sink collecting the pieces, and a source that fails after `fail_at`. */
typedef struct { unsigned char *p; size_t n, pieces, largest; } collected;
static bool collect(void *ud, const void *data, size_t n) {
    collected *c = ud;
    unsigned char *g = realloc(c->p, c->n + n + 1);
    if (!g) return false;
    c->p = g;
    memcpy(c->p + c->n, data, n);
    c->n += n;
    c->pieces++;
    if (n > c->largest) c->largest = n;
    return true;
}

typedef struct { const unsigned char *p; size_t n, off, fail_at; } failing;
static bool failing_read(void *ud, void *data, size_t n) {
    failing *f = ud;
    if (f->off + n > f->fail_at || f->off + n > f->n) return false;
    memcpy(data, f->p + f->off, n);
    f->off += n;
    return true;
}

/* The streaming forms move the same bytes as the buffer forms, piece by
 * piece; a source that fails before the rows leaves the session unchanged,
 * one that fails inside them leaves it empty, never half restored. */
static void streaming(ds4_engine *e) {
    const int V = ds4_engine_n_vocab(e), n = SAVED_N, ctx = SAVED_CTX;
    saved sv;
    saved_session(e, 13, &sv);
    char err[256];
    collected c = {0};
    const ds4_sink sink = {collect, &c};
    CHECK(ds4_session_save_payload_to(sv.a, &sink), "streamed save");
    CHECK(c.n == sv.pn && !memcmp(c.p, sv.p, sv.pn), "streamed save differs from the buffer form (%zu vs %zu bytes)",
          c.n, sv.pn);
    CHECK(c.pieces > 100 && c.largest < sv.pn / 4, "not streamed: %zu pieces, largest %zu of %zu bytes", c.pieces,
          c.largest, sv.pn);
    float *ref = continue_run(sv.a, sv.toks + n, STEPS, V);

    ds4_session *b = session(e, ctx);
    failing f = {.p = sv.p, .n = sv.pn, .fail_at = sv.pn};
    ds4_source src = {failing_read, &f};
    CHECK(ds4_session_load_payload_from(b, &src, sv.pn, err, sizeof err) == 0, "streamed load: %s", err);
    /* fails in the token list: b keeps what it has */
    f = (failing){.p = sv.p, .n = sv.pn, .fail_at = DS4_PAYLOAD_HEADER_BYTES + 40};
    CHECK(ds4_session_load_payload_from(b, &src, sv.pn, err, sizeof err) != 0 && ds4_session_n_tokens(b) == n,
          "a source failing before the rows changed the session");
    float *got = continue_run(b, sv.toks + n, STEPS, V);
    CHECK(!memcmp(ref, got, (size_t)STEPS * V * sizeof(float)), "streamed load differs from the original");
    free(got);
    /* fails in the rows: b is empty */
    ds4_session *d = session(e, ctx);
    CHECK(ds4_session_prefill(d, sv.toks, n, NULL, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
    f = (failing){.p = sv.p, .n = sv.pn, .fail_at = sv.pn - sv.pn / 3};
    CHECK(ds4_session_load_payload_from(d, &src, sv.pn, err, sizeof err) != 0 && ds4_session_n_tokens(d) == 0,
          "a source failing inside the rows left %d tokens", ds4_session_n_tokens(d));
    free(ref);
    free(c.p);
    free(sv.p);
    ds4_session_free(sv.a);
    ds4_session_free(b);
    ds4_session_free(d);
}

int main(void) {
    const char *build = getenv("BUILD");
    char a_path[512], b_path[512];
    snprintf(a_path, sizeof a_path, "%s/ds4tiny/A-f32.gguf", build ? build : "build");
    snprintf(b_path, sizeof b_path, "%s/ds4tiny/B-f32.gguf", build ? build : "build");
    ds4_engine *a = load(a_path), *b = load(b_path);
    CHECK(a != NULL, "cannot load %s (make %s)", a_path, a_path);
    if (a) {
        /* A: window 8, ratios 4 and 16, rewind slack 256: 300+ wraps every ring */
        const int lens[] = {0, 1, 3, 4, 5, 16, 17, 64, 271, 272, 300, 530};
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) round_trip(a, "A", lens[i], 1024);
        rewind_after_restore(a, 300, 1024);
        corruption(a, b);
        streaming(a);
    }
    FILE *f = fopen("models/demo.gguf", "rb");
    bool have_demo = f != NULL;
    if (have_demo) {
        fclose(f);
        ds4_engine *d = load("models/demo.gguf");
        CHECK(d != NULL, "cannot load models/demo.gguf");
        if (d) round_trip(d, "demo", 150, 512);
        ds4_engine_free(d);
    }
    ds4_engine_free(a);
    ds4_engine_free(b);
    return have_demo ? check_done("test_kv_payload")
             : check_skipped("test_kv_payload", "models/demo.gguf absent, demo round trip not run");
}
