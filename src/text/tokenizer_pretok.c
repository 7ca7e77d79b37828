/* tokenizer_pretok.c -- the DeepSeek pre-tokenizer: three regex splits, each
 * with "isolated" behaviour (matches and the gaps between them both become
 * pieces), applied in sequence so no later split joins across an earlier cut.
 *
 *   1  \p{N}{1,3}
 *   2  [\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+
 *   3  [!-/:-@[-`{-~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
 *      | ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 *
 * GLM's glm4 pre-tokenizer (glm-5.2-model.md 8) is one isolated split:
 *
 *      (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3}
 *      | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 *
 * Two implementations of each: a hand-written matcher over a code point
 * class table (what encoding uses), and PCRE2 running the regexes verbatim
 * (the reference the tests and the fuzz target compare it with). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/tokenizer_internal.h"

/* ------------------------------------------------------- class table */

/* One byte per code point, filled once from the generated ranges: a single
 * load per character, and only the pages of scripts in use get touched. */
static uint8_t uc_table[0x110000];
static pthread_once_t uc_once = PTHREAD_ONCE_INIT;

static void uc_fill(void) {
    for (size_t i = 0; i < ds4_uc_n_ranges; i++)
        for (uint32_t c = ds4_uc_ranges[i].lo; c <= ds4_uc_ranges[i].hi; c++)
            uc_table[c] = ds4_uc_ranges[i].cls;
}

int ds4_uc_class(uint32_t cp) {
    pthread_once(&uc_once, uc_fill);
    return cp < 0x110000 ? uc_table[cp] : DS4_UC_OTHER;
}

/* ----------------------------------------------------- fast matcher */

/* Input is valid UTF-8, so decoding needs no checks. */
static inline uint32_t decode(const unsigned char *s, size_t *len) {
    unsigned c = s[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return (c & 0x1F) << 6 | (s[1] & 0x3F); }
    if (c < 0xF0) { *len = 3; return (c & 0x0F) << 12 | (s[1] & 0x3F) << 6 | (s[2] & 0x3F); }
    *len = 4;
    return (c & 0x07) << 18 | (s[1] & 0x3F) << 12 | (s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}

typedef struct { const unsigned char *s; size_t end; } zone;

static inline int cls_at(const zone *z, size_t i, uint32_t *cp, size_t *len) {
    *cp = decode(z->s + i, len);
    return uc_table[*cp];
}

static inline bool is_ascii_letter(unsigned c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }
static inline bool is_ascii_punct(unsigned c) {
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}
#define LM (1u << DS4_UC_L | 1u << DS4_UC_M)
#define PS (1u << DS4_UC_P | 1u << DS4_UC_S)
static inline bool in(int k, unsigned mask) { return k >= 0 && (mask >> k & 1); }

/* End of the run, starting at byte i, of characters whose class is in mask. */
static size_t run_end(const zone *z, size_t i, unsigned mask) {
    while (i < z->end) {
        uint32_t cp; size_t l;
        if (!in(cls_at(z, i, &cp, &l), mask)) break;
        i += l;
    }
    return i;
}

static size_t match_space(const zone *z, size_t i);

/* Split 3 at byte i: the end of the match of the first alternative that
 * matches there, or 0 when none does (the character then joins a gap). */
static size_t match3(const zone *z, size_t i) {
    const unsigned char *s = z->s;
    uint32_t c0, c1 = 0;
    size_t l0, l1;
    int k0 = cls_at(z, i, &c0, &l0), k1 = -1;
    size_t i1 = i + l0;
    if (i1 < z->end) k1 = cls_at(z, i1, &c1, &l1);

    /* [!-/:-@[-`{-~][A-Za-z]+ */
    if (c0 < 0x80 && is_ascii_punct(c0) && k1 >= 0 && c1 < 0x80 && is_ascii_letter(c1)) {
        size_t j = i1;
        while (j < z->end && is_ascii_letter(s[j])) j++;
        return j;
    }
    /* [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : with the optional character
     * first, then without it */
    if (c0 != '\r' && c0 != '\n' && k0 != DS4_UC_L && !in(k0, PS) && in(k1, LM))
        return run_end(z, i1, LM);
    if (in(k0, LM)) return run_end(z, i, LM);
    /*  ?[\p{P}\p{S}]+[\r\n]* */
    if (in(k0, PS) || (c0 == ' ' && in(k1, PS))) {
        size_t j = run_end(z, in(k0, PS) ? i : i1, PS);
        while (j < z->end && (s[j] == '\r' || s[j] == '\n')) j++;
        return j;
    }
    return k0 == DS4_UC_W ? match_space(z, i) : 0;
}

/* The white-space alternatives both pre-tokenizers end with, at a white-space
 * character:
 *   \s*[\r\n]+ : \s* backs off to the last CR/LF of the white-space run.
 *   \s+(?!\S) : the run less its last character, unless the run ends the
 *   text or is one character long; then \s+ takes the whole run. */
static size_t match_space(const zone *z, size_t i) {
    size_t j = i, last_nl = 0, last_start = i;
    while (j < z->end) {
        uint32_t cp; size_t l;
        if (cls_at(z, j, &cp, &l) != DS4_UC_W) break;
        if (cp == '\r' || cp == '\n') last_nl = j + 1;
        last_start = j;
        j += l;
    }
    if (last_nl) return last_nl;
    return j < z->end && last_start > i ? last_start : j;
}

static int split3(const unsigned char *s, size_t a, size_t b, ds4_piece_fn fn, void *ctx) {
    zone z = { s, b };
    size_t gap = a, i = a;
    while (i < b) {
        size_t m = match3(&z, i);
        if (!m) { size_t l; decode(s + i, &l); i += l; continue; }
        int r;
        if (gap < i && (r = fn(ctx, (const char *)s + gap, i - gap))) return r;
        if ((r = fn(ctx, (const char *)s + i, m - i))) return r;
        i = gap = m;
    }
    return gap < b ? fn(ctx, (const char *)s + gap, b - gap) : 0;
}

static inline bool is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF);
}

/* Splits 1 and 2 only cut the text into zones: runs of numbers (in chunks of
 * three), runs of the CJK/kana ranges, and runs of everything else. The CJK
 * ranges hold no \p{N} character, so the zones of split 2 never straddle a
 * split-1 cut, and a number chunk contains nothing split 3 could match. */
int ds4_pretok_run(const char *text, size_t n, ds4_piece_fn fn, void *ctx) {
    pthread_once(&uc_once, uc_fill);
    const unsigned char *s = (const unsigned char *)text;
    enum { OTHER, NUM, CJK } kind = OTHER;
    size_t start = 0, i = 0, digits = 0;
    int r = 0;
    while (i < n && !r) {
        size_t l;
        uint32_t c = decode(s + i, &l);
        int k = uc_table[c] == DS4_UC_N ? NUM : is_cjk(c) ? CJK : OTHER;
        if (k != (int)kind || (k == NUM && digits == 3)) {
            if (start < i) r = kind == NUM ? fn(ctx, text + start, i - start) : split3(s, start, i, fn, ctx);
            kind = k;
            start = i;
            digits = 0;
        }
        digits++;
        i += l;
    }
    if (!r && start < n) r = kind == NUM ? fn(ctx, text + start, n - start) : split3(s, start, n, fn, ctx);
    return r;
}

/* ------------------------------------------------------- GLM (glm4) */

/* The contraction alternative, case-insensitive as the HF regex engine
 * matches it: 's 't 'm 'd 're 've 'll, where the s also matches U+017F
 * (long s, whose case folding is s). Length of the match at s[i], or 0. */
static size_t contraction(const zone *z, size_t i) {
    const unsigned char *s = z->s;
    size_t n = z->end - i;
    if (n < 2 || s[i] != '\'') return 0;
    unsigned a = s[i + 1] | 0x20, b = n >= 3 ? (s[i + 2] | 0x20) : 0;
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (n >= 3 && s[i + 1] == 0xC5 && s[i + 2] == 0xBF) return 3;   /* U+017F */
    if (((a == 'r' || a == 'v') && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

#define L1 (1u << DS4_UC_L)
#define N1 (1u << DS4_UC_N)
/* [^\s\p{L}\p{N}] */
#define NOT_WLN (1u << DS4_UC_OTHER | 1u << DS4_UC_M | 1u << DS4_UC_P | 1u << DS4_UC_S)

/* The glm4 regex at byte i; every character starts some alternative, so the
 * result is always > i:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3}
 *   | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+ */
static size_t match_glm4(const zone *z, size_t i) {
    size_t m = contraction(z, i);
    if (m) return i + m;
    uint32_t c0, c1 = 0;
    size_t l0, l1;
    int k0 = cls_at(z, i, &c0, &l0), k1 = -1;
    size_t i1 = i + l0;
    if (i1 < z->end) k1 = cls_at(z, i1, &c1, &l1);
    if (c0 != '\r' && c0 != '\n' && !in(k0, L1 | N1) && k1 == DS4_UC_L) return run_end(z, i1, L1);
    if (k0 == DS4_UC_L) return run_end(z, i, L1);
    if (k0 == DS4_UC_N) {
        size_t j = i;
        for (int d = 0; d < 3 && j < z->end; d++) {
            uint32_t cp; size_t l;
            if (cls_at(z, j, &cp, &l) != DS4_UC_N) break;
            j += l;
        }
        return j;
    }
    if (in(k0, NOT_WLN) || (c0 == ' ' && in(k1, NOT_WLN))) {
        size_t j = run_end(z, in(k0, NOT_WLN) ? i : i1, NOT_WLN);
        while (j < z->end && (z->s[j] == '\r' || z->s[j] == '\n')) j++;
        return j;
    }
    return match_space(z, i);
}

int ds4_pretok_glm4_run(const char *text, size_t n, ds4_piece_fn fn, void *ctx) {
    pthread_once(&uc_once, uc_fill);
    zone z = { (const unsigned char *)text, n };
    for (size_t i = 0; i < n;) {
        size_t m = match_glm4(&z, i);
        int r = fn(ctx, text + i, m - i);
        if (r) return r;
        i = m;
    }
    return 0;
}

/* ---------------------------------------------------- PCRE2 reference */

/* \s is spelled out as the White_Space set: that is what the HF regex engine
 * (Oniguruma) matches, while PCRE2's UCP \s leaves out U+0085. */
#define WS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

static const char *const ds4_patterns[3] = {
    "\\p{N}{1,3}",
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+",
};

/* HF's glm4 Split regex with \s spelled out as above; PCRE2's caseless UTF
 * matching folds U+017F to s as the HF engine does. */
static const char *const glm4_patterns[1] = {
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+",
};

struct ds4_pretok_regex { pcre2_code *re[3]; int n; };

static ds4_pretok_regex *regex_new(const char *const *patterns, int n, char *err, size_t errlen) {
    ds4_pretok_regex *pt = calloc(1, sizeof *pt);
    if (!pt) { snprintf(err, errlen, "tokenizer: out of memory"); return NULL; }
    pt->n = n;
    for (int k = 0; k < n; k++) {
        int ec; PCRE2_SIZE eo;
        pt->re[k] = pcre2_compile((PCRE2_SPTR)patterns[k], PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ec, &eo, NULL);
        if (!pt->re[k] || pcre2_jit_compile(pt->re[k], PCRE2_JIT_COMPLETE) != 0) {
            char msg[128] = "JIT compilation failed";
            if (!pt->re[k]) pcre2_get_error_message(ec, (PCRE2_UCHAR *)msg, sizeof msg);
            snprintf(err, errlen, "tokenizer: pre-tokenizer regex %d: %s", k + 1, msg);
            ds4_pretok_regex_free(pt);
            return NULL;
        }
    }
    return pt;
}

ds4_pretok_regex *ds4_pretok_regex_new(char *err, size_t errlen) {
    return regex_new(ds4_patterns, 3, err, errlen);
}

ds4_pretok_regex *ds4_pretok_regex_glm4_new(char *err, size_t errlen) {
    return regex_new(glm4_patterns, 1, err, errlen);
}

void ds4_pretok_regex_free(ds4_pretok_regex *pt) {
    if (!pt) return;
    for (int k = 0; k < pt->n; k++) pcre2_code_free(pt->re[k]);
    free(pt);
}

typedef struct {
    const ds4_pretok_regex *pt;
    pcre2_match_data *md;
    ds4_piece_fn fn;
    void *ctx;
} run_state;

/* Cuts s[0..n) with split k and hands every match and gap to split k+1 (or
 * to the callback after the last split). */
static int split(run_state *st, int k, const char *s, size_t n) {
    if (k == st->pt->n) return n ? st->fn(st->ctx, s, n) : 0;
    PCRE2_SIZE pos = 0;
    while (pos < n) {
        int rc = pcre2_jit_match(st->pt->re[k], (PCRE2_SPTR)s, n, pos, 0, st->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return -1;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        PCRE2_SIZE ms = ov[0], me = ov[1];
        int r = split(st, k + 1, s + pos, ms - pos);
        if (!r) r = split(st, k + 1, s + ms, me - ms);
        if (r) return r;
        pos = me;
    }
    return split(st, k + 1, s + pos, n - pos);
}

int ds4_pretok_regex_run(const ds4_pretok_regex *pt, const char *s, size_t n,
                         ds4_piece_fn fn, void *ctx) {
    run_state st = { pt, pcre2_match_data_create(1, NULL), fn, ctx };
    if (!st.md) return -1;
    int r = split(&st, 0, s, n);
    pcre2_match_data_free(st.md);
    return r;
}
