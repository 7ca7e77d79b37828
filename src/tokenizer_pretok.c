/* tokenizer_pretok.c -- the DeepSeek pre-tokenizer: three regex splits, each
 * with "isolated" behaviour (matches and the gaps between them both become
 * pieces), applied in sequence so no later split joins across an earlier cut.
 * PCRE2 (UTF + UCP, JIT) supplies the Unicode classes. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>

#include "tokenizer_internal.h"

/* Split 3's \s is spelled out as the Unicode White_Space set because that is
 * what the HF tokenizers regex engine (Oniguruma) matches, while PCRE2's UCP
 * \s leaves out U+0085. */
#define WS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

static const char *const patterns[3] = {
    "\\p{N}{1,3}",
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\\r\\n]*"
    "|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+",
};

struct ds4_pretok { pcre2_code *re[3]; };

ds4_pretok *ds4_pretok_new(char *err, size_t errlen) {
    ds4_pretok *pt = calloc(1, sizeof *pt);
    if (!pt) { snprintf(err, errlen, "tokenizer: out of memory"); return NULL; }
    for (int k = 0; k < 3; k++) {
        int ec; PCRE2_SIZE eo;
        pt->re[k] = pcre2_compile((PCRE2_SPTR)patterns[k], PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ec, &eo, NULL);
        if (!pt->re[k] || pcre2_jit_compile(pt->re[k], PCRE2_JIT_COMPLETE) != 0) {
            char msg[128] = "JIT compilation failed";
            if (!pt->re[k]) pcre2_get_error_message(ec, (PCRE2_UCHAR *)msg, sizeof msg);
            snprintf(err, errlen, "tokenizer: pre-tokenizer regex %d: %s", k + 1, msg);
            ds4_pretok_free(pt);
            return NULL;
        }
    }
    return pt;
}

void ds4_pretok_free(ds4_pretok *pt) {
    if (!pt) return;
    for (int k = 0; k < 3; k++) pcre2_code_free(pt->re[k]);
    free(pt);
}

typedef struct {
    const ds4_pretok *pt;
    pcre2_match_data *md;
    ds4_piece_fn fn;
    void *ctx;
} run_state;

/* Cuts s[0..n) with split k and hands every match and gap to split k+1 (or
 * to the callback after the last split). Split 1's matches skip splits 2 and
 * 3: a run of \p{N} characters contains nothing either of them could match,
 * so they would return it whole. */
static int split(run_state *st, int k, const char *s, size_t n) {
    if (k == 3) return n ? st->fn(st->ctx, s, n) : 0;
    PCRE2_SIZE pos = 0;
    while (pos < n) {
        int rc = pcre2_jit_match(st->pt->re[k], (PCRE2_SPTR)s, n, pos, 0, st->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return -1;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        PCRE2_SIZE ms = ov[0], me = ov[1];
        int r = split(st, k + 1, s + pos, ms - pos);
        if (r) return r;
        r = split(st, k == 0 ? 3 : k + 1, s + ms, me - ms);
        if (r) return r;
        pos = me;
    }
    return split(st, k + 1, s + pos, n - pos);
}

int ds4_pretok_run(const ds4_pretok *pt, const char *s, size_t n, ds4_piece_fn fn, void *ctx) {
    run_state st = { pt, pcre2_match_data_create(1, NULL), fn, ctx };
    if (!st.md) return -1;
    int r = split(&st, 0, s, n);
    pcre2_match_data_free(st.md);
    return r;
}
