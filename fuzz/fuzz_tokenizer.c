/* Fuzz target: the tokenizer. The first byte picks what the rest is:
 *   0-2  text, encoded with specials NONE/CHAT/ALL: ids in range, decode
 *        gives valid UTF-8 (equal to the input when that is valid UTF-8),
 *        streaming decode equals whole decode;
 *   3    text, pre-tokenized by the hand-written matcher and by the PCRE2
 *        regexes: same pieces (when every code point has the same class in
 *        PCRE2's Unicode tables and in the generated ones);
 *   4    a GGUF file, loaded as a tokenizer: no crash, one-line errors;
 *   5    a tokenizer.json, loaded: the same;
 *   6-8  text, encoded like 0-2 by the constructed GLM tokenizer;
 *   9    text, pre-tokenized like 3 by the GLM (glm4) matcher and regex.
 * The real vocabulary comes from data/ (run from the repo root).
 * The seed corpus holds one input per mode; the GGUF and JSON seeds carry a
 * minimal valid vocabulary (256 byte tokens, the seven chat specials, one
 * merge). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "text/tokenizer_internal.h"

static ds4_tokenizer *tok, *glm_tok;
static ds4_pretok_regex *re, *glm_re;
static uint8_t *agree;   /* per code point: PCRE2 class == generated class */
static char json_path[64];

static size_t put_utf8(uint8_t *o, uint32_t c) {
    if (c < 0x80) { o[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { o[0] = (uint8_t)(0xC0 | c >> 6); o[1] = (uint8_t)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | c >> 12); o[1] = (uint8_t)(0x80 | (c >> 6 & 63)); o[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | c >> 18); o[1] = (uint8_t)(0x80 | (c >> 12 & 63));
    o[2] = (uint8_t)(0x80 | (c >> 6 & 63)); o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

/* Classifies every code point with PCRE2 in one pass over a string holding
 * all of them, and marks where it agrees with ds4_uc_class. */
static void build_agree(void) {
    static const char *pat = "(\\p{L})|(\\p{M})|(\\p{N})|(\\p{P})|(\\p{S})"
        "|([\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}])";
    int ec; PCRE2_SIZE eo;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
    agree = calloc(0x110000, 1);
    uint8_t buf[4];
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp < 0xE000) continue;
        size_t n = put_utf8(buf, cp);
        int rc = pcre2_match(c, buf, n, 0, PCRE2_ANCHORED, md, NULL);
        agree[cp] = (rc < 0 ? DS4_UC_OTHER : rc - 1) == ds4_uc_class(cp);
    }
    pcre2_match_data_free(md);
    pcre2_code_free(c);
}

/* the mode-5 scratch file goes when libFuzzer exits (it ends with exit()) */
static void remove_json(void) {
    unlink(json_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    char err[256];
    tok = ds4_tokenizer_from_hf_json("data/deepseek-v3-tokenizer.json",
                                     "tests/fixtures/tokenizer/v4-added-tokens.json", err, sizeof err);
    re = ds4_pretok_regex_new(err, sizeof err);
    if (!tok || !re) { fprintf(stderr, "fuzz_tokenizer: %s\n", err); exit(1); }
    glm_tok = ds4_tokenizer_from_hf_json("data/glm-constructed-tokenizer.json", NULL, err, sizeof err);
    glm_re = ds4_pretok_regex_glm4_new(err, sizeof err);
    if (!glm_tok || !glm_re) { fprintf(stderr, "fuzz_tokenizer: %s\n", err); exit(1); }
    build_agree();
    snprintf(json_path, sizeof json_path, "/tmp/fuzz_tokenizer_%d.json", (int)getpid());
    atexit(remove_json);
    return 0;
}

typedef struct { size_t off[4096], len[4096]; size_t n; const char *base; } spans;

static int collect(void *ctx, const char *p, size_t n) {
    spans *s = ctx;
    if (s->n < 4096) { s->off[s->n] = (size_t)(p - s->base); s->len[s->n] = n; }
    s->n++;
    return 0;
}

static void check_encode(const ds4_tokenizer *tok, const uint8_t *d, size_t n, enum ds4_tok_specials mode) {
    ds4_token_ids ids = {0};
    if (ds4_tokenizer_encode(tok, (const char *)d, n, mode, &ids) < 0) abort();
    for (size_t i = 0; i < ids.n; i++)
        if (ids.v[i] < 0 || ids.v[i] >= ds4_tokenizer_n_vocab(tok)) abort();
    size_t wl, rl;
    char *whole = ds4_tokenizer_decode(tok, ids.v, ids.n, true, &wl);
    char *raw = ds4_tokenizer_decode(tok, ids.v, ids.n, false, &rl);
    if (ds4_utf8_valid_prefix((const unsigned char *)raw, rl) != rl) abort();
    if (rl != wl || memcmp(raw, whole, wl)) abort();
    if (ds4_utf8_valid_prefix(d, n) == n && (rl != n || memcmp(raw, d, n))) abort();
    char *s = malloc(wl + DS4_DETOK_OUT_MAX);
    size_t o = 0;
    ds4_detok dt;
    ds4_detok_init(&dt);
    for (size_t i = 0; i < ids.n; i++) o += ds4_detok_push(&dt, tok, ids.v[i], s + o);
    o += ds4_detok_flush(&dt, s + o);
    if (o != wl || memcmp(s, whole, wl)) abort();
    free(s); free(whole); free(raw);
    ds4_token_ids_free(&ids);
}

static void check_pretok(const uint8_t *d, size_t n, int (*run)(const char *, size_t, ds4_piece_fn, void *),
                         const ds4_pretok_regex *regex) {
    if (ds4_utf8_valid_prefix(d, n) != n) return;
    for (size_t i = 0; i < n;) {
        size_t l; uint32_t cp;
        ds4_utf8_scan(d + i, n - i, &l, &cp);
        if (!agree[cp]) return;
        i += l;
    }
    static spans a, b;
    a.n = b.n = 0;
    a.base = b.base = (const char *)d;
    run((const char *)d, n, collect, &a);
    if (ds4_pretok_regex_run(regex, (const char *)d, n, collect, &b) < 0) return;
    if (a.n != b.n) abort();
    for (size_t i = 0; i < a.n && i < 4096; i++)
        if (a.off[i] != b.off[i] || a.len[i] != b.len[i]) abort();
}

static void check_load(ds4_tokenizer *t, const char *err) {
    if (!t) { if (!err[0] || strchr(err, '\n')) abort(); return; }
    check_encode(t, (const uint8_t *)"Hello, world! 123 <think>", 25, DS4_TOK_SPECIALS_ALL);
    ds4_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    char err[256] = "";
    switch (data[0] % 10) {
    case 0: case 1: case 2:
        check_encode(tok, d, n, (enum ds4_tok_specials)(data[0] % 10));
        break;
    case 3:
        check_pretok(d, n, ds4_pretok_run, re);
        break;
    case 6: case 7: case 8:
        check_encode(glm_tok, d, n, (enum ds4_tok_specials)(data[0] % 10 - 6));
        break;
    case 9:
        check_pretok(d, n, ds4_pretok_glm4_run, glm_re);
        break;
    case 4: {
        ds4_gguf *g = ds4_gguf_open_buffer(d, n, err, sizeof err);
        if (g) check_load(ds4_tokenizer_from_gguf(g, err, sizeof err), err);
        ds4_gguf_close(g);
        break;
    }
    case 5: {
        FILE *f = fopen(json_path, "wb");
        if (!f) return 0;
        fwrite(d, 1, n, f);
        fclose(f);
        check_load(ds4_tokenizer_from_hf_json(json_path, NULL, err, sizeof err), err);
        break;
    }
    }
    return 0;
}
