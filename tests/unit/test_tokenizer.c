/* test_tokenizer.c -- the tokenizer against independent oracles:
 *  - tests/fixtures/tokenizer/deepseek-bpe-cases.jsonl (ids from an
 *    independent implementation),
 *  - tests/fixtures/tokenizer/hf-cases.jsonl (HF `tokenizers` on DeepSeek V4's
 *    tokenizer.json, three special-token modes, raw invalid UTF-8 included),
 *  - the literal vectors of deepseek-v4-prompt-format.md 3.3-3.10,
 *  - tests/fixtures/tokenizer/glm-cases.jsonl (HF `tokenizers` on the
 *    constructed GLM tokenizer.json),
 * plus invariants: decode(encode(x)) == x, streaming decode == whole decode
 * at every split point, GGUF export -> load gives the same tokenizer, the
 * hand-written pre-tokenizers equal their regexes run by PCRE2. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "text/tokenizer_internal.h"
#include "base/json_util.h"

#define V3_JSON "data/deepseek-v3-tokenizer.json"
#define V4_ADDED "tests/fixtures/tokenizer/v4-added-tokens.json"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}


/* One oracle case: input bytes, the mode, the expected ids. */
typedef struct {
    char *text; size_t len;
    bool raw;                    /* not valid UTF-8 */
    enum ds4_tok_specials mode;
    int32_t *ids; size_t n;
} tcase;

static size_t load_cases(const char *path, tcase **out) {
    size_t len, n = 0, cap = 0;
    char *buf = ds4_read_file(path, &len);
    *out = NULL;
    if (!buf) return 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        if (n == cap) { cap = cap ? 2 * cap : 256; *out = realloc(*out, cap * sizeof **out); }
        tcase *c = &(*out)[n++];
        memset(c, 0, sizeof *c);
        const cJSON *t = cJSON_GetObjectItem(j, "text"), *h = cJSON_GetObjectItem(j, "hex");
        const cJSON *m = cJSON_GetObjectItem(j, "mode"), *ids = cJSON_GetObjectItem(j, "ids");
        if (cJSON_IsString(t)) { c->len = strlen(t->valuestring); c->text = strdup(t->valuestring); }
        else {
            c->len = strlen(h->valuestring) / 2;
            c->text = malloc(c->len + 1);
            for (size_t i = 0; i < c->len; i++) {
                unsigned v; sscanf(h->valuestring + 2 * i, "%2x", &v);
                c->text[i] = (char)v;
            }
        }
        c->raw = ds4_utf8_valid_prefix((unsigned char *)c->text, c->len) != c->len;
        c->mode = !cJSON_IsString(m) || !strcmp(m->valuestring, "none") ? DS4_TOK_SPECIALS_NONE
                : !strcmp(m->valuestring, "chat") ? DS4_TOK_SPECIALS_CHAT : DS4_TOK_SPECIALS_ALL;
        c->n = (size_t)cJSON_GetArraySize(ids);
        c->ids = malloc((c->n + 1) * sizeof *c->ids);
        for (size_t i = 0; i < c->n; i++) c->ids[i] = cJSON_GetArrayItem(ids, (int)i)->valueint;
        cJSON_Delete(j);
    }
    free(buf);
    return n;
}

static void free_cases(tcase *c, size_t n) {
    for (size_t i = 0; i < n; i++) { free(c[i].text); free(c[i].ids); }
    free(c);
}

static bool ids_equal(const ds4_token_ids *got, const int32_t *want, size_t n) {
    return got->n == n && (n == 0 || memcmp(got->v, want, n * sizeof *want) == 0);
}

static void print_ids(const char *what, const int32_t *v, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", v[i]);
    fprintf(stderr, "%s\n", n > 40 ? " ..." : "");
}

static void check_cases(const ds4_tokenizer *t, const char *path, tcase *c, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        ds4_token_ids got = {0};
        int rc = ds4_tokenizer_encode(t, c[i].text, c[i].len, c[i].mode, &got);
        bool ok = rc == 0 && ids_equal(&got, c[i].ids, c[i].n);
        CHECK(ok, "%s case %zu (mode %d): \"%.60s\"", path, i + 1, (int)c[i].mode, c[i].text);
        if (!ok && bad++ < 8) { print_ids("want", c[i].ids, c[i].n); print_ids("got ", got.v, got.n); }
        ds4_token_ids_free(&got);
    }
}

static void check_encode(const ds4_tokenizer *t, const char *text, enum ds4_tok_specials m,
                         const int32_t *want, size_t n) {
    ds4_token_ids got = {0};
    CHECK(ds4_tokenizer_encode(t, text, strlen(text), m, &got) == 0, "encode");
    bool ok = ids_equal(&got, want, n);
    CHECK(ok, "vector \"%.60s\" mode %d", text, (int)m);
    if (!ok) { print_ids("want", want, n); print_ids("got ", got.v, got.n); }
    ds4_token_ids_free(&got);
}

static void sheet_vectors(const ds4_tokenizer *t) {
    const ds4_special_ids *sp = ds4_tokenizer_specials(t);
    CHECK(ds4_tokenizer_n_vocab(t) == 129280, "n_vocab %d", ds4_tokenizer_n_vocab(t));
    CHECK(sp->bos == 0 && sp->eos == 1, "bos %d eos %d", sp->bos, sp->eos);
    CHECK(sp->user == 128803 && sp->assistant == 128804, "user %d assistant %d", sp->user, sp->assistant);
    CHECK(sp->think == 128821 && sp->think_end == 128822, "think %d/%d", sp->think, sp->think_end);
    CHECK(sp->dsml == 128825 && sp->latest_reminder == 128828, "dsml %d reminder %d", sp->dsml, sp->latest_reminder);
    static const struct { const char *s; int32_t id; } named[] = {
        { "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>", 2 },
        { "<\xef\xbd\x9cplace\xe2\x96\x81holder\xe2\x96\x81no\xe2\x96\x81" "0\xef\xbd\x9c>", 128000 },
        { "<|EOT|>", 128805 }, { "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>", 128814 },
        { "<\xef\xbd\x9c" "action\xef\xbd\x9c>", 128829 }, { "<\xef\xbd\x9ctitle\xef\xbd\x9c>", 128836 },
        { "<dsml:", 128840 }, { "<\xef\xbd\x9cread_url\xef\xbd\x9c>", 128845 },
    };
    for (size_t i = 0; i < sizeof named / sizeof *named; i++)
        CHECK(ds4_tokenizer_find_special(t, named[i].s, strlen(named[i].s)) == named[i].id,
              "special %s", named[i].s);
    CHECK(ds4_tokenizer_find_special(t, "<think", 6) == -1, "prefix of a special is not one");
    CHECK(ds4_tokenizer_find_special(t, "the", 3) == -1, "normal token is not special");
    CHECK(ds4_tokenizer_is_special(t, 0) && ds4_tokenizer_is_special(t, 128825), "is_special");
    CHECK(!ds4_tokenizer_is_special(t, 3) && !ds4_tokenizer_is_special(t, 127999), "normal");
    CHECK(!ds4_tokenizer_is_special(t, -1) && !ds4_tokenizer_is_special(t, 129280), "range");

    static const int32_t it[] = { 0, 128803, 52, 278, 4908, 75, 295, 89034, 399, 3919, 123003, 28,
                                  23442, 9861, 63030, 47121, 317, 805, 33, 128804, 128822 };
    check_encode(t, DS4_TOK_BOS DS4_TOK_USER "Rispondi in italiano con una frase: chi era Ada Lovelace?"
                 DS4_TOK_ASSISTANT DS4_TOK_THINK_END, DS4_TOK_SPECIALS_CHAT, it, 21);
    static const int32_t e1[] = { 0, 3476, 477, 260, 11502, 22896, 16, 128803, 3085, 344, 223, 20,
                                  13, 20, 33, 128804, 128822 };
    check_encode(t, DS4_TOK_BOS "You are a helpful assistant." DS4_TOK_USER "What is 2+2?"
                 DS4_TOK_ASSISTANT DS4_TOK_THINK_END, DS4_TOK_SPECIALS_CHAT, e1, 17);
    static const int32_t v4[] = { 128803, 30594, 128804, 128821, 36101, 128822, 7624, 1 };
    check_encode(t, DS4_TOK_USER "\xe4\xbd\xa0\xe5\xa5\xbd" DS4_TOK_ASSISTANT "<think>\xe6\x8e\xa8\xe7\x90\x86"
                 "</think>\xe7\xad\x94\xe6\xa1\x88" DS4_TOK_EOS, DS4_TOK_SPECIALS_ALL, v4, 8);
    static const int32_t close_tag[] = { 1718, 128825, 72461, 4941, 12548, 32 };
    check_encode(t, "</" DS4_TOK_DSML "tool_calls>", DS4_TOK_SPECIALS_CHAT, close_tag, 6);
    static const int32_t nn[] = { 271 };
    check_encode(t, "\n\n", DS4_TOK_SPECIALS_NONE, nn, 1);
    /* unmatched specials are plain text: "<think>" -> "<", "think", ">" */
    ds4_token_ids a = {0}, b = {0};
    ds4_tokenizer_encode(t, "<think>", 7, DS4_TOK_SPECIALS_NONE, &a);
    CHECK(a.n == 3 && a.v[0] != sp->think, "raw <think> is %zu plain tokens", a.n);
    /* CHAT mode leaves the non-chat added tokens as text, ALL matches them */
    ds4_tokenizer_encode(t, DS4_TOK_LATEST_REMINDER, strlen(DS4_TOK_LATEST_REMINDER), DS4_TOK_SPECIALS_CHAT, &b);
    CHECK(b.n > 1, "latest_reminder is text in CHAT mode");
    b.n = 0;
    ds4_tokenizer_encode(t, DS4_TOK_LATEST_REMINDER, strlen(DS4_TOK_LATEST_REMINDER), DS4_TOK_SPECIALS_ALL, &b);
    CHECK(b.n == 1 && b.v[0] == 128828, "latest_reminder is one token in ALL mode");
    ds4_token_ids_free(&a); ds4_token_ids_free(&b);
}

typedef struct { char pieces[64][64]; int n; } piece_list;

static int collect(void *ctx, const char *p, size_t n) {
    piece_list *l = ctx;
    if (l->n < 64 && n < 64) { memcpy(l->pieces[l->n], p, n); l->pieces[l->n][n] = 0; }
    l->n++;
    return 0;
}

static void sheet_pretokenization(void) {
    static const char *const rows[][20] = {
        { "Rispondi in italiano con una frase: chi era Ada Lovelace?",
          "Rispondi", " in", " italiano", " con", " una", " frase", ":", " chi", " era", " Ada",
          " Lovelace", "?", NULL },
        { "    int x = 12345;\n  return x;\n\n",
          "   ", " int", " x", " =", " ", "123", "45", ";\n", " ", " return", " x", ";\n\n", NULL },
        { "Hello, world! \xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c \xe3\x81\xb2\xe3\x82\x89\xe3\x81\x8c\xe3\x81\xaa"
          " caf\xc3\xa9 \xe2\x80\x94 \xe2\x80\x9cquotes\xe2\x80\x9d \xc2\xbd \xc2\xb2",
          "Hello", ",", " world", "!", " ", "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c", " ",
          "\xe3\x81\xb2\xe3\x82\x89\xe3\x81\x8c\xe3\x81\xaa", " caf\xc3\xa9", " \xe2\x80\x94",
          " \xe2\x80\x9c", "quotes", "\xe2\x80\x9d", " ", "\xc2\xbd", " ", "\xc2\xb2", NULL },
    };
    char err[256];
    ds4_pretok_regex *pt = ds4_pretok_regex_new(err, sizeof err);
    CHECK(pt != NULL, "%s", err);
    if (!pt) return;
    for (size_t r = 0; r < 2 * sizeof rows / sizeof *rows; r++) {
        piece_list l = { .n = 0 };
        const char *const *row = rows[r / 2];
        if (r % 2) ds4_pretok_regex_run(pt, row[0], strlen(row[0]), collect, &l);
        else ds4_pretok_run(row[0], strlen(row[0]), collect, &l);
        int want = 0;
        while (row[want + 1]) want++;
        CHECK(l.n == want, "row %zu (%s): %d pieces, want %d", r / 2, r % 2 ? "regex" : "fast", l.n, want);
        for (int i = 0; i < want && i < l.n; i++)
            CHECK(!strcmp(l.pieces[i], row[i + 1]), "row %zu piece %d: \"%s\" want \"%s\"",
                  r / 2, i, l.pieces[i], row[i + 1]);
    }
    ds4_pretok_regex_free(pt);
}

/* The hand-written pre-tokenizer equals the PCRE2 regexes on random text
 * drawn from long-assigned blocks (whose classes PCRE2's Unicode tables and
 * the HF-generated ones agree on), with the class boundaries exercised:
 * marks, numbers of several scripts, white space variants, CR/LF, kana and
 * the edges of the CJK ranges. */
typedef struct { size_t off[512], len[512]; int n; const char *base; } span_list;

static int collect_span(void *ctx, const char *p, size_t n) {
    span_list *l = ctx;
    if (l->n < 512) { l->off[l->n] = (size_t)(p - l->base); l->len[l->n] = n; }
    l->n++;
    return 0;
}

static size_t put_utf8(char *o, uint32_t c) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | c >> 6); o[1] = (char)(0x80 | (c & 63)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12); o[1] = (char)(0x80 | (c >> 6 & 63)); o[2] = (char)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18); o[1] = (char)(0x80 | (c >> 12 & 63));
    o[2] = (char)(0x80 | (c >> 6 & 63)); o[3] = (char)(0x80 | (c & 63));
    return 4;
}

typedef int (*pretok_fn)(const char *, size_t, ds4_piece_fn, void *);
typedef ds4_pretok_regex *(*regex_ctor)(char *, size_t);

static void pretok_differential(const char *family, pretok_fn run, regex_ctor make_regex) {
    static const uint32_t blocks[][2] = {
        { 0x00, 0x7F }, { 0x20, 0x7E }, { 0x20, 0x7E }, { 0x80, 0xFF }, { 0x300, 0x36F },
        { 0x370, 0x3FF }, { 0x400, 0x4FF }, { 0x590, 0x6FF }, { 0x900, 0x97F }, { 0xE00, 0xE7F },
        { 0x1100, 0x11FF }, { 0x2000, 0x206F }, { 0x20A0, 0x20BF }, { 0x2100, 0x22FF },
        { 0x2460, 0x24FF }, { 0x3000, 0x30FF }, { 0x4E00, 0x4E40 }, { 0x9F90, 0x9FB0 },
        { 0xAC00, 0xAC40 }, { 0xFE00, 0xFE0F }, { 0xFF00, 0xFFEF }, { 0x1F300, 0x1F64F },
        { 0x1D400, 0x1D4FF }, { 0x20000, 0x20010 }, { 0xE0020, 0xE007F }, { 0xE000, 0xE010 },
        { '\r', '\r' }, { '\n', '\n' }, { ' ', ' ' }, { '0', '9' }, { 'a', 'z' },
        { '\'', '\'' }, { 0x17F, 0x17F }, { 'A', 'Z' },   /* glm4 contractions, long s */
    };
    const size_t nb = sizeof blocks / sizeof *blocks;
    char err[256];
    ds4_pretok_regex *re = make_regex(err, sizeof err);
    CHECK(re != NULL, "%s", err);
    if (!re) return;
    uint64_t rng = 0x9E3779B97F4A7C15ULL;
    int bad = 0;
    char buf[4 * 48];
    for (int it = 0; it < 4000; it++) {
        size_t n = 0;
        int len = 1 + (int)((rng >> 33) % 40);
        for (int k = 0; k < len; k++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            const uint32_t *b = blocks[(rng >> 33) % nb];
            uint32_t c = b[0] + (uint32_t)((rng >> 17) % (b[1] - b[0] + 1));
            n += put_utf8(buf + n, c);
        }
        span_list a = { .n = 0, .base = buf }, r = { .n = 0, .base = buf };
        run(buf, n, collect_span, &a);
        ds4_pretok_regex_run(re, buf, n, collect_span, &r);
        bool same = a.n == r.n;
        for (int i = 0; same && i < a.n && i < 512; i++)
            same = a.off[i] == r.off[i] && a.len[i] == r.len[i];
        if (!same && bad++ < 3) {
            fprintf(stderr, "  pretok mismatch on:");
            for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (unsigned char)buf[i]);
            fprintf(stderr, "\n");
        }
    }
    CHECK(bad == 0, "%s: %d random strings pre-tokenize differently (hand-written vs PCRE2)", family, bad);
    ds4_pretok_regex_free(re);
}

static void byte_alphabet(void) {
    CHECK(ds4_byte_to_cp(0x00) == 0x100 && ds4_byte_to_cp(0x09) == 0x109, "low controls");
    CHECK(ds4_byte_to_cp(0x0A) == 0x10A && ds4_byte_to_cp(0x20) == 0x120, "LF, space");
    CHECK(ds4_byte_to_cp(0x7F) == 0x121 && ds4_byte_to_cp(0xA0) == 0x142, "DEL, NBSP");
    CHECK(ds4_byte_to_cp(0xAD) == 0x143 && ds4_byte_to_cp('A') == 'A' && ds4_byte_to_cp(0xE9) == 0xE9, "others");
    int seen[0x144] = {0}, bad = 0;
    for (int b = 0; b < 256; b++) {
        uint32_t cp = ds4_byte_to_cp((uint8_t)b);
        if (cp >= 0x144 || seen[cp]++ || ds4_cp_to_byte(cp) != b) bad++;
    }
    CHECK(bad == 0, "byte alphabet is a bijection with its inverse (%d bad)", bad);
    CHECK(ds4_cp_to_byte(0x144) == -1 && ds4_cp_to_byte(0x20) == -1 && ds4_cp_to_byte(0xAD) == -1, "outside");
}

/* decode(encode(x)) == x (valid UTF-8; raw cases come back with U+FFFD), and
 * pushing the ids one at a time through ds4_detok equals the whole decode. */
static void roundtrip(const ds4_tokenizer *t, tcase *c, size_t n) {
    int bad_rt = 0, bad_stream = 0;
    for (size_t i = 0; i < n; i++) {
        ds4_token_ids ids = {0};
        ds4_tokenizer_encode(t, c[i].text, c[i].len, c[i].mode, &ids);
        size_t dl, sl;
        char *whole = ds4_tokenizer_decode(t, ids.v, ids.n, true, &dl);
        char *raw = ds4_tokenizer_decode(t, ids.v, ids.n, false, &sl);
        if (!c[i].raw && (dl != c[i].len || memcmp(whole, c[i].text, dl) || sl != dl || memcmp(raw, whole, dl)))
            bad_rt++;
        if (c[i].raw && (sl != dl || memcmp(raw, whole, dl) != 0 ||
                         ds4_utf8_valid_prefix((unsigned char *)whole, dl) != dl))
            bad_rt++;
        char *s = malloc(dl + DS4_DETOK_OUT_MAX);
        size_t o = 0;
        ds4_detok d;
        ds4_detok_init(&d);
        for (size_t k = 0; k < ids.n; k++) o += ds4_detok_push(&d, t, ids.v[k], s + o);
        o += ds4_detok_flush(&d, s + o);
        if (o != dl || memcmp(s, whole, dl)) bad_stream++;
        free(s); free(whole); free(raw);
        ds4_token_ids_free(&ids);
    }
    CHECK(bad_rt == 0, "%d cases fail decode(encode(x)) == x", bad_rt);
    CHECK(bad_stream == 0, "%d cases: streaming decode != whole decode", bad_stream);
}

/* Every byte split point: each byte of the input as its own single-byte
 * token, so the detokenizer sees a cut between every two bytes; the result
 * must equal the whole decode and, for raw input, the sanitised text that
 * encode() tokenised (decode(encode(x))). */
static void stream_every_split(const ds4_tokenizer *t, tcase *c, size_t n) {
    int32_t byte_tok[256];
    for (int32_t id = 0; id < ds4_tokenizer_n_vocab(t); id++) {
        size_t l;
        const char *p = ds4_tokenizer_token_bytes(t, id, &l);
        if (l == 1 && !ds4_tokenizer_is_special(t, id)) byte_tok[(unsigned char)p[0]] = id;
    }
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t *ids = malloc((c[i].len + 1) * sizeof *ids);
        for (size_t k = 0; k < c[i].len; k++) ids[k] = byte_tok[(unsigned char)c[i].text[k]];
        size_t dl, el;
        char *whole = ds4_tokenizer_decode(t, ids, c[i].len, true, &dl);
        ds4_token_ids enc = {0};
        ds4_tokenizer_encode(t, c[i].text, c[i].len, DS4_TOK_SPECIALS_NONE, &enc);
        char *via_enc = ds4_tokenizer_decode(t, enc.v, enc.n, false, &el);
        char *s = malloc(3 * c[i].len + DS4_DETOK_OUT_MAX);
        size_t o = 0;
        ds4_detok d;
        ds4_detok_init(&d);
        for (size_t k = 0; k < c[i].len; k++) o += ds4_detok_push(&d, t, ids[k], s + o);
        o += ds4_detok_flush(&d, s + o);
        if (o != dl || memcmp(s, whole, dl) || el != dl || memcmp(via_enc, whole, dl)) {
            if (bad++ < 3) fprintf(stderr, "  split case %zu: stream %zu bytes, whole %zu, via encode %zu\n", i, o, dl, el);
        }
        free(s); free(whole); free(via_enc); free(ids);
        ds4_token_ids_free(&enc);
    }
    CHECK(bad == 0, "%d cases: byte-split streaming differs", bad);
}

static void detok_edges(const ds4_tokenizer *t) {
    /* "é" = C3 A9 split over two byte tokens: nothing, then both bytes */
    ds4_token_ids ids = {0};
    ds4_tokenizer_encode(t, "\xc3\xa9", 2, DS4_TOK_SPECIALS_NONE, &ids);
    char out[DS4_DETOK_OUT_MAX];
    ds4_detok d;
    ds4_detok_init(&d);
    int32_t c3 = -1, a9 = -1, x = -1;
    for (int32_t id = 0; id < 129280; id++) {
        size_t l;
        const char *p = ds4_tokenizer_token_bytes(t, id, &l);
        if (l == 1 && (unsigned char)*p == 0xC3) c3 = id;
        if (l == 1 && (unsigned char)*p == 0xA9) a9 = id;
        if (l == 1 && *p == 'x') x = id;
    }
    CHECK(ds4_detok_push(&d, t, c3, out) == 0, "lead byte held back");
    size_t n = ds4_detok_push(&d, t, a9, out);
    CHECK(n == 2 && !memcmp(out, "\xc3\xa9", 2), "completed character emitted");
    CHECK(ds4_detok_push(&d, t, c3, out) == 0, "lead byte held back again");
    n = ds4_detok_push(&d, t, x, out);
    CHECK(n == 4 && !memcmp(out, "\xef\xbf\xbdx", 4), "broken sequence -> U+FFFD then x");
    CHECK(ds4_detok_push(&d, t, c3, out) == 0 && ds4_detok_flush(&d, out) == 3 &&
          !memcmp(out, "\xef\xbf\xbd", 3), "dangling tail flushed as U+FFFD");
    CHECK(ds4_detok_push(&d, t, -5, out) == 0 && ds4_detok_push(&d, t, 1 << 30, out) == 0, "bad ids ignored");
    n = ds4_detok_push(&d, t, 128825, out);
    CHECK(n == 10 && !memcmp(out, DS4_TOK_DSML, 10), "special decodes to its literal text");
    size_t l;
    CHECK(ds4_tokenizer_token_bytes(t, 129280, &l) == NULL && l == 0, "token_bytes range");
    ds4_token_ids_free(&ids);
}

static void load_errors(void) {
    char err[256] = "";
    CHECK(ds4_tokenizer_from_hf_json("/nonexistent/tokenizer.json", NULL, err, sizeof err) == NULL &&
          strstr(err, "cannot open"), "missing file: %s", err);
    err[0] = 0;
    /* The V3 file alone lacks <think> and ｜DSML｜: refused, by name. */
    CHECK(ds4_tokenizer_from_hf_json(V3_JSON, NULL, err, sizeof err) == NULL &&
          strstr(err, "<think>"), "V3 without overlay: %s", err);
    char path[] = "/tmp/ds4_tok_XXXXXX";
    int fd = mkstemp(path);
    const char *bad[] = {
        "{not json",
        "{\"model\":{\"type\":\"Unigram\",\"vocab\":{},\"merges\":[]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":2},\"merges\":[]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}",
        "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[7]},\"added_tokens\":[]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(ftruncate(fd, 0) == 0 && pwrite(fd, bad[i], strlen(bad[i]), 0) == (ssize_t)strlen(bad[i]), "write");
        err[0] = 0;
        CHECK(ds4_tokenizer_from_hf_json(path, NULL, err, sizeof err) == NULL && err[0], "bad json %zu: %s", i, err);
    }
    close(fd);
    unlink(path);
}

/* Export to GGUF, load back: every token's bytes, specials and encodings equal.
 * Then a GGUF without token_type: the types are inferred from the merges. */
static void gguf_roundtrip(const ds4_tokenizer *ref, tcase *c, size_t n) {
    char err[256] = "", path[] = "/tmp/ds4_tok_gguf_XXXXXX", path2[] = "/tmp/ds4_tok_gguf2_XXXXXX";
    int fd = mkstemp(path), fd2 = mkstemp(path2);
    close(fd); close(fd2);
    ds4_gguf_writer *w = ds4_gguf_writer_new(32);
    int rc = ds4_tokenizer_gguf_from_hf_json(w, V3_JSON, V4_ADDED, err, sizeof err);
    CHECK(rc == 0, "export: %s", err);
    CHECK(ds4_gguf_writer_write_file(w, path, NULL, NULL, err, sizeof err) == 0, "write: %s", err);
    ds4_gguf_writer_free(w);
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "open: %s", err);
    if (!g) return;
    uint32_t bos = 99, eos = 99;
    ds4_gguf_str model = {0}, pre = {0};
    CHECK(ds4_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos) && bos == 0, "bos key");
    CHECK(ds4_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos) && eos == 1, "eos key");
    CHECK(ds4_gguf_get_str(g, "tokenizer.ggml.model", &model) && model.len == 4 && !memcmp(model.ptr, "gpt2", 4), "model");
    CHECK(ds4_gguf_get_str(g, "tokenizer.ggml.pre", &pre) && pre.len == 9, "pre");
    const ds4_gguf_kv *toks = ds4_gguf_find_kv(g, "tokenizer.ggml.tokens");
    const ds4_gguf_kv *merges = ds4_gguf_find_kv(g, "tokenizer.ggml.merges");
    CHECK(toks && toks->arr_n == 129280 && merges && merges->arr_n == 127741, "array sizes");
    double t0 = now_s();
    ds4_tokenizer *t = ds4_tokenizer_from_gguf(g, err, sizeof err);
    double load_ms = (now_s() - t0) * 1e3;
    CHECK(t != NULL, "load from gguf: %s", err);
    if (t) printf("tokenizer: load from GGUF (129280 tokens) %.1f ms\n", load_ms);
    int bad = 0;
    for (int32_t id = 0; t && id < ds4_tokenizer_n_vocab(ref); id++) {
        size_t la, lb;
        const char *a = ds4_tokenizer_token_bytes(ref, id, &la), *b = ds4_tokenizer_token_bytes(t, id, &lb);
        if (la != lb || memcmp(a, b, la) || ds4_tokenizer_is_special(ref, id) != ds4_tokenizer_is_special(t, id)) bad++;
    }
    CHECK(bad == 0, "%d tokens differ after the GGUF round trip", bad);
    if (t) check_cases(t, "gguf", c, n);

    /* tokens + merges only */
    w = ds4_gguf_writer_new(32);
    const char **ts = malloc(toks->arr_n * sizeof *ts), **ms = malloc(merges->arr_n * sizeof *ms);
    for (uint64_t i = 0; i < toks->arr_n; i++) ts[i] = strndup(toks->arr_strs[i].ptr, toks->arr_strs[i].len);
    for (uint64_t i = 0; i < merges->arr_n; i++) ms[i] = strndup(merges->arr_strs[i].ptr, merges->arr_strs[i].len);
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", ts, toks->arr_n);
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.merges", ms, merges->arr_n);
    CHECK(ds4_gguf_writer_write_file(w, path2, NULL, NULL, err, sizeof err) == 0, "write2: %s", err);
    ds4_gguf_writer_free(w);
    for (uint64_t i = 0; i < toks->arr_n; i++) free((void *)ts[i]);
    for (uint64_t i = 0; i < merges->arr_n; i++) free((void *)ms[i]);
    free(ts); free(ms);
    ds4_gguf *g2 = ds4_gguf_open(path2, err, sizeof err);
    ds4_tokenizer *t2 = g2 ? ds4_tokenizer_from_gguf(g2, err, sizeof err) : NULL;
    CHECK(t2 != NULL, "load without token_type: %s", err);
    bad = 0;
    for (int32_t id = 0; t2 && id < ds4_tokenizer_n_vocab(ref); id++)
        if (ds4_tokenizer_is_special(ref, id) != ds4_tokenizer_is_special(t2, id)) bad++;
    CHECK(bad == 0, "%d tokens typed differently when inferred", bad);
    if (t2) check_cases(t2, "gguf-no-types", c, n);
    ds4_tokenizer_free(t2);
    ds4_gguf_close(g2);
    ds4_tokenizer_free(t);
    ds4_gguf_close(g);
    unlink(path); unlink(path2);
}

/* A tiny GGUF without token_type: the seven chat specials, the 256 byte
 * symbols, "Ġt" (from the one merge) and "<é>", whose characters all lie in
 * the byte alphabet. Inference must make "<é>" an added token that decodes
 * to its literal UTF-8 (3C C3 A9 3E), not to the alphabet reading (3C E9 3E). */
static void inferred_types_tiny(void) {
    static const char *const chat[7] = { DS4_TOK_BOS, DS4_TOK_EOS, DS4_TOK_USER, DS4_TOK_ASSISTANT,
                                         DS4_TOK_THINK, DS4_TOK_THINK_END, DS4_TOK_DSML };
    const char *toks[265];
    char sym[256][4];
    for (int i = 0; i < 7; i++) toks[i] = chat[i];
    for (int b = 0; b < 256; b++) {
        sym[b][put_utf8(sym[b], ds4_byte_to_cp((uint8_t)b))] = 0;
        toks[7 + b] = sym[b];
    }
    toks[263] = "\xc4\xa0t";   /* Ġt */
    toks[264] = "<\xc3\xa9>";
    const char *merges[1] = { "\xc4\xa0 t" };
    char err[256] = "", path[] = "/tmp/ds4_tok_tiny_XXXXXX";
    close(mkstemp(path));
    ds4_gguf_writer *w = ds4_gguf_writer_new(32);
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 265);
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    CHECK(ds4_gguf_writer_write_file(w, path, NULL, NULL, err, sizeof err) == 0, "write: %s", err);
    ds4_gguf_writer_free(w);
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    ds4_tokenizer *t = g ? ds4_tokenizer_from_gguf(g, err, sizeof err) : NULL;
    CHECK(t != NULL, "tiny load: %s", err);
    if (t) {
        size_t l;
        const char *p = ds4_tokenizer_token_bytes(t, 264, &l);
        CHECK(l == 4 && !memcmp(p, "<\xc3\xa9>", 4), "inferred added token decodes literally");
        CHECK(ds4_tokenizer_is_special(t, 264) && !ds4_tokenizer_is_special(t, 263), "inferred types");
        CHECK(ds4_tokenizer_find_special(t, "<\xc3\xa9>", 4) == 264, "found by its text");
        ds4_token_ids ids = {0};
        ds4_tokenizer_encode(t, " t<\xc3\xa9>", 6, DS4_TOK_SPECIALS_ALL, &ids);
        CHECK(ids.n == 2 && ids.v[0] == 263 && ids.v[1] == 264, "tiny encode: %zu ids", ids.n);
        ds4_token_ids_free(&ids);
    }
    ds4_tokenizer_free(t);
    ds4_gguf_close(g);

    /* the pre-tokenizer names: DeepSeek's rules under either of llama.cpp's
     * names load; any other name is refused by name */
    static const struct { const char *pre; bool loads; } pres[] = {
        {"joyai-llm", true}, {"deepseek-v3", true}, {"gpt-2", false}, {"qwen2", false}};
    for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++) {
        w = ds4_gguf_writer_new(32);
        ds4_gguf_w_str(w, "tokenizer.ggml.pre", pres[i].pre);
        ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 265);
        ds4_gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, 1);
        CHECK(ds4_gguf_writer_write_file(w, path, NULL, NULL, err, sizeof err) == 0, "write: %s", err);
        ds4_gguf_writer_free(w);
        g = ds4_gguf_open(path, err, sizeof err);
        err[0] = 0;
        t = g ? ds4_tokenizer_from_gguf(g, err, sizeof err) : NULL;
        char quoted[64];
        snprintf(quoted, sizeof quoted, "pre is \"%s\"", pres[i].pre);
        if (pres[i].loads) CHECK(t != NULL, "pre %s: %s", pres[i].pre, err);
        else CHECK(t == NULL && strstr(err, quoted) && !strchr(err, '\n'), "pre %s refused: %s", pres[i].pre, err);
        ds4_tokenizer_free(t);
        ds4_gguf_close(g);
    }

    /* the same vocabulary declared as another tokenizer model is refused */
    w = ds4_gguf_writer_new(32);
    ds4_gguf_w_str(w, "tokenizer.ggml.model", "llama");
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 265);
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    CHECK(ds4_gguf_writer_write_file(w, path, NULL, NULL, err, sizeof err) == 0, "write: %s", err);
    ds4_gguf_writer_free(w);
    g = ds4_gguf_open(path, err, sizeof err);
    err[0] = 0;
    t = g ? ds4_tokenizer_from_gguf(g, err, sizeof err) : NULL;
    CHECK(t == NULL && strstr(err, "gpt2"), "non-BPE model refused: %s", err);
    ds4_tokenizer_free(t);
    ds4_gguf_close(g);
    unlink(path);
}

typedef struct { const ds4_tokenizer *t; tcase *c; size_t n; int bad; } thr_arg;

static void *thr_encode(void *p) {
    thr_arg *a = p;
    for (int rep = 0; rep < 3; rep++)
        for (size_t i = 0; i < a->n; i++) {
            ds4_token_ids got = {0};
            ds4_tokenizer_encode(a->t, a->c[i].text, a->c[i].len, a->c[i].mode, &got);
            if (!ids_equal(&got, a->c[i].ids, a->c[i].n)) a->bad++;
            ds4_token_ids_free(&got);
        }
    return NULL;
}

static void concurrent(const ds4_tokenizer *t, tcase *c, size_t n) {
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){ t, c, n, 0 };
        pthread_create(&th[i], NULL, thr_encode, &args[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) { pthread_join(th[i], NULL); bad += args[i].bad; }
    CHECK(bad == 0, "%d wrong encodings under 4 concurrent threads", bad);
}

/* GLM: the constructed tokenizer (tests/oracles/glm_tokenizer_make.py: GLM's
 * pre-tokenizer and added tokens, merges trained by HF) against HF's own
 * encodings; the GLM chat-special set; stop ids; the glm4 GGUF export. */
#define GLM_JSON "data/glm-constructed-tokenizer.json"

static void glm_chat_set(const ds4_tokenizer *t) {
    static const char *const strs[] = { DS4_TOK_GLM_CHAT_STRINGS };
    const char *other = "<|begin_of_image|>/nothink[MASK]";
    for (size_t k = 0; k < sizeof strs / sizeof *strs; k++) {
        ds4_token_ids ids = {0};
        ds4_tokenizer_encode(t, strs[k], strlen(strs[k]), DS4_TOK_SPECIALS_CHAT, &ids);
        CHECK(ids.n == 1 && ids.v[0] == ds4_tokenizer_find_special(t, strs[k], strlen(strs[k])),
              "chat set: %s is one protocol token", strs[k]);
        ds4_token_ids_free(&ids);
    }
    ds4_token_ids chat = {0}, none = {0};
    ds4_tokenizer_encode(t, other, strlen(other), DS4_TOK_SPECIALS_CHAT, &chat);
    ds4_tokenizer_encode(t, other, strlen(other), DS4_TOK_SPECIALS_NONE, &none);
    CHECK(chat.n == none.n && !memcmp(chat.v, none.v, chat.n * sizeof *chat.v),
          "added tokens the template never writes are text in the chat set");
    ds4_token_ids_free(&chat);
    ds4_token_ids_free(&none);
}

static void glm_tokenizer(void) {
    char err[256] = "";
    ds4_tokenizer *t = ds4_tokenizer_from_hf_json(GLM_JSON, NULL, err, sizeof err);
    CHECK(t != NULL, "GLM load: %s", err);
    if (!t) return;
    const ds4_special_ids *sp = ds4_tokenizer_specials(t);
    CHECK(ds4_tokenizer_family(t) == DS4_TOK_FAMILY_GLM && ds4_tokenizer_n_vocab(t) == 4096, "family, n_vocab");
    /* the 36 added tokens follow the 4060 base tokens in GLM's order (sheet 7.5) */
    CHECK(sp->eos == 4060 && sp->bos == 4062 && sp->sop == 4064 && sp->system == 4066 && sp->user == 4067 &&
          sp->assistant == 4068 && sp->observation == 4069 && sp->think == 4081 && sp->think_end == 4082,
          "GLM specials eos %d bos %d user %d", sp->eos, sp->bos, sp->user);
    CHECK(sp->dsml == -1 && sp->latest_reminder == -1, "no DeepSeek tokens");
    CHECK(ds4_tokenizer_is_stop(t, sp->eos) && ds4_tokenizer_is_stop(t, sp->user) &&
          ds4_tokenizer_is_stop(t, sp->observation) && !ds4_tokenizer_is_stop(t, sp->assistant) &&
          !ds4_tokenizer_is_stop(t, sp->think_end) && !ds4_tokenizer_is_stop(t, 100), "GLM stop ids");
    tcase *gc;
    size_t ng = load_cases("tests/fixtures/tokenizer/glm-cases.jsonl", &gc);
    CHECK(ng > 800, "glm-cases: %zu cases", ng);
    check_cases(t, "glm-cases", gc, ng);
    roundtrip(t, gc, ng);
    glm_chat_set(t);

    /* GGUF: pre "glm4", bos [gMASK], eos <|endoftext|>; loads back as GLM with
     * ignore_merges (llama.cpp's glm4 rule) and encodes the same */
    char path[] = "/tmp/ds4_glm_tok_XXXXXX";
    close(mkstemp(path));
    ds4_gguf_writer *w = ds4_gguf_writer_new(32);
    CHECK(ds4_tokenizer_gguf_from_hf_json(w, GLM_JSON, NULL, err, sizeof err) == 0, "GLM export: %s", err);
    CHECK(ds4_gguf_writer_write_file(w, path, NULL, NULL, err, sizeof err) == 0, "write: %s", err);
    ds4_gguf_writer_free(w);
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    ds4_gguf_str pre = {0};
    uint32_t bos = 0, eos = 0;
    CHECK(g && ds4_gguf_get_str(g, "tokenizer.ggml.pre", &pre) && pre.len == 4 && !memcmp(pre.ptr, "glm4", 4), "pre glm4");
    CHECK(g && ds4_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos) && bos == 4062, "bos key %u", bos);
    CHECK(g && ds4_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &eos) && eos == 4060, "eos key %u", eos);
    ds4_tokenizer *tg = g ? ds4_tokenizer_from_gguf(g, err, sizeof err) : NULL;
    CHECK(tg && ds4_tokenizer_family(tg) == DS4_TOK_FAMILY_GLM, "GLM from GGUF: %s", err);
    if (tg) check_cases(tg, "glm-cases/gguf", gc, ng);
    ds4_tokenizer_free(tg);
    if (g) ds4_gguf_close(g);
    unlink(path);
    free_cases(gc, ng);
    ds4_tokenizer_free(t);

    /* a GLM vocabulary lacking a protocol token is refused, naming it */
    char *text = ds4_read_file(GLM_JSON, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    cJSON *added = cJSON_GetObjectItem(j, "added_tokens");
    cJSON_SetValuestring(cJSON_GetObjectItem(cJSON_GetArrayItem(added, 9), "content"), "<|other|>");   /* <|observation|> */
    char *out = cJSON_PrintUnformatted(j);
    char bad[] = "/tmp/ds4_glm_bad_XXXXXX";
    int fd = mkstemp(bad);
    CHECK(fd >= 0 && out && write(fd, out, strlen(out)) == (ssize_t)strlen(out), "write %s", bad);
    close(fd);
    t = ds4_tokenizer_from_hf_json(bad, NULL, err, sizeof err);
    CHECK(!t && strstr(err, "GLM vocabulary has no added token \"<|observation|>\""), "missing GLM token: %s", err);
    ds4_tokenizer_free(t);
    unlink(bad);
    free(out);
    cJSON_Delete(j);
    free(text);

    t = ds4_tokenizer_from_hf_json(V3_JSON, V4_ADDED, err, sizeof err);
    CHECK(t && ds4_tokenizer_family(t) == DS4_TOK_FAMILY_DS4 && ds4_tokenizer_specials(t)->observation == -1 &&
          ds4_tokenizer_is_stop(t, ds4_tokenizer_specials(t)->eos) && !ds4_tokenizer_is_stop(t, ds4_tokenizer_specials(t)->user),
          "DeepSeek family: only EOS stops");
    ds4_tokenizer_free(t);
}

int main(void) {
    char err[256] = "";
    double t0 = now_s();
    ds4_tokenizer *t = ds4_tokenizer_from_hf_json(V3_JSON, V4_ADDED, err, sizeof err);
    CHECK(t != NULL, "load: %s", err);
    if (!t) return check_done("test_tokenizer");
    printf("tokenizer: load from tokenizer.json %.1f ms\n", (now_s() - t0) * 1e3);

    tcase *bc, *hc;
    size_t nb = load_cases("tests/fixtures/tokenizer/deepseek-bpe-cases.jsonl", &bc);
    size_t nh = load_cases("tests/fixtures/tokenizer/hf-cases.jsonl", &hc);
    CHECK(nb == 87, "deepseek-bpe-cases: %zu cases", nb);
    CHECK(nh > 500, "hf-cases: %zu cases", nh);
    check_cases(t, "deepseek-bpe-cases", bc, nb);
    for (size_t i = 0; i < nb; i++) bc[i].mode = DS4_TOK_SPECIALS_ALL;  /* no specials inside */
    check_cases(t, "deepseek-bpe-cases/all", bc, nb);
    check_cases(t, "hf-cases", hc, nh);

    sheet_vectors(t);
    sheet_pretokenization();
    pretok_differential("deepseek", ds4_pretok_run, ds4_pretok_regex_new);
    pretok_differential("glm4", ds4_pretok_glm4_run, ds4_pretok_regex_glm4_new);
    byte_alphabet();
    roundtrip(t, bc, nb);
    roundtrip(t, hc, nh);
    stream_every_split(t, hc, nh);
    detok_edges(t);
    load_errors();
    gguf_roundtrip(t, hc, nh);
    inferred_types_tiny();
    concurrent(t, hc, nh);
    glm_tokenizer();

    free_cases(bc, nb);
    free_cases(hc, nh);
    ds4_tokenizer_free(t);
    return check_done("test_tokenizer");
}
