/* tokenizer.c -- vocabulary tables, special-token matching, byte-level BPE,
 * decoding and the streaming detokenizer. Loading from HF JSON and the GGUF
 * export live in tokenizer_import.c, the pre-tokenizer in tokenizer_pretok.c. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"

/* ---------------------------------------------------------------- UTF-8 */

enum ds4_u8 ds4_utf8_scan(const unsigned char *s, size_t n, size_t *len, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) { *len = 1; *cp = c; return DS4_U8_OK; }
    /* Allowed range of the second byte per lead byte (Unicode Table 3-7);
     * every later byte is 80..BF. */
    size_t need; unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else { *len = 1; return DS4_U8_INVALID; }
    uint32_t v = c & (0x7F >> need);
    for (size_t i = 1; i < need; i++) {
        if (i >= n) { *len = n; return DS4_U8_TRUNCATED; }
        unsigned b = s[i];
        if (b < lo || b > hi) { *len = i; return DS4_U8_INVALID; }
        lo = 0x80; hi = 0xBF;
        v = v << 6 | (b & 0x3F);
    }
    *len = need; *cp = v;
    return DS4_U8_OK;
}

size_t ds4_utf8_valid_prefix(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        size_t l; uint32_t cp;
        if (ds4_utf8_scan(s + i, n - i, &l, &cp) != DS4_U8_OK) break;
        i += l;
    }
    return i;
}

/* Appends s[0..n) to out with every invalid subpart (and, when final, a
 * truncated tail) replaced by U+FFFD. Returns the bytes consumed: a truncated
 * tail is left unconsumed when !final. out needs 3*n bytes. */
static size_t utf8_sanitize(const unsigned char *s, size_t n, bool final, char *out, size_t *olen) {
    size_t i = 0, o = *olen;
    while (i < n) {
        size_t l; uint32_t cp;
        enum ds4_u8 r = ds4_utf8_scan(s + i, n - i, &l, &cp);
        if (r == DS4_U8_OK) { memcpy(out + o, s + i, l); o += l; }
        else if (r == DS4_U8_TRUNCATED && !final) break;
        else { memcpy(out + o, "\xef\xbf\xbd", 3); o += 3; }
        i += l;
    }
    *olen = o;
    return i;
}

/* ------------------------------------------------------- byte alphabet */

uint32_t ds4_byte_to_cp(uint8_t b) {
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    /* the other 68 bytes, in increasing order, take U+0100.. */
    if (b <= 0x20) return 0x100 + b;
    if (b <= 0xA0) return 0x100 + 0x21 + (b - 0x7F);
    return 0x143;   /* 0xAD */
}

int ds4_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return ds4_byte_to_cp((uint8_t)cp) == cp ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(cp - 0x121 + 0x7F);
    if (cp == 0x143) return 0xAD;
    return -1;
}

/* Byte-level string -> bytes into out (room for len bytes); -1 when a code
 * point is outside the alphabet. The alphabet is U+0021..U+0143, so only
 * one- and two-byte UTF-8 forms can occur. */
static long alphabet_decode(const char *s, size_t len, unsigned char *out) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, o = 0;
    while (i < len) {
        uint32_t cp = p[i];
        if (cp >= 0x80) {
            if (cp < 0xC2 || cp > 0xC5 || i + 1 >= len || (p[i + 1] & 0xC0) != 0x80) return -1;
            cp = (cp & 0x1F) << 6 | (p[i + 1] & 0x3F);
            i++;
        }
        i++;
        int b = ds4_cp_to_byte(cp);
        if (b < 0) return -1;
        out[o++] = (unsigned char)b;
    }
    return (long)o;
}

/* ------------------------------------------------------------- tables */

static uint64_t hash_u64(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL;
    return k ^ (k >> 33);
}

/* FNV-1a leaves the high bits poorly mixed for short strings; the final
 * avalanche makes every bit usable as a table index. */
static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL ^ n;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return hash_u64(h);
}

/* A merge slot packs (left id, right id, rank) into 63 bits, so the table
 * BPE probes for every adjacent pair stays half the size; the result id is
 * looked up by rank only when a merge is applied. */
#define MERGE_BITS 21
#define MERGE_LIMIT (1 << MERGE_BITS)
#define MERGE_EMPTY UINT64_MAX
static inline uint64_t merge_key(int32_t a, int32_t b) {
    return (uint64_t)(uint32_t)a << MERGE_BITS | (uint32_t)b;
}

/* Words that recur (" the", "\n", "{") are BPE-encoded once and then served
 * from this direct-mapped table, guarded by striped try-locks. */
#define CACHE_BITS 15
#define CACHE_MAX_BYTES 22
#define CACHE_MAX_IDS 8
#define CACHE_STRIPES 64
struct cache_ent {
    uint64_t h;
    uint8_t len, n_ids;
    char bytes[CACHE_MAX_BYTES];
    int32_t ids[CACHE_MAX_IDS];
};
_Static_assert(sizeof(struct cache_ent) == 64, "a cache entry is one cache line");

/* A set of added tokens sorted by their bytes, for leftmost-longest matching. */
struct special_set {
    int32_t *ids;
    size_t n;
    uint8_t first[32];   /* bitmap of first bytes */
};

struct ds4_tokenizer {
    int32_t n_vocab;
    char *bytes;            /* every token's decoded bytes */
    uint32_t *off;          /* token i = bytes[off[i] .. off[i+1]) */
    uint8_t *type;          /* DS4_TT_* */
    int32_t byte_id[256];
    struct vocab_slot { int32_t id; uint32_t tag; } *vslots;   /* normal tokens by bytes */
    uint32_t vmask;
    uint64_t *mslots;       /* merge_key << MERGE_BITS | rank */
    int32_t *merge_result;  /* rank -> id */
    uint32_t mmask;
    struct special_set all, chat;
    ds4_special_ids sp;
    ds4_tok_config cfg;
    struct cache_ent *cache;
    atomic_bool locks[CACHE_STRIPES];
};

static inline const unsigned char *tok_ptr(const ds4_tokenizer *t, int32_t id) {
    return (const unsigned char *)t->bytes + t->off[id];
}
static inline size_t tok_len(const ds4_tokenizer *t, int32_t id) {
    return t->off[id + 1] - t->off[id];
}

/* The slot's tag (high hash bits) spares reading the token bytes of most
 * non-matching entries. */
static int32_t vocab_find(const ds4_tokenizer *t, const unsigned char *p, size_t n) {
    uint64_t h = hash_bytes(p, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t i = (uint32_t)h & t->vmask;; i = (i + 1) & t->vmask) {
        const struct vocab_slot *v = &t->vslots[i];
        if (v->id < 0) return -1;
        if (v->tag == tag && tok_len(t, v->id) == n && memcmp(tok_ptr(t, v->id), p, n) == 0) return v->id;
    }
}

/* Rank of the merge joining tokens a and b, or -1. */
static int32_t merge_rank(const ds4_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = merge_key(a, b);
    for (uint32_t i = (uint32_t)hash_u64(key) & t->mmask;; i = (i + 1) & t->mmask) {
        uint64_t m = t->mslots[i];
        if (m >> MERGE_BITS == key) return (int32_t)(m & (MERGE_LIMIT - 1));
        if (m == MERGE_EMPTY) return -1;
    }
}

static uint32_t pow2_at_least(size_t n) {
    uint32_t c = 1024;
    while (c < 2 * n) c <<= 1;
    return c;
}

/* -------------------------------------------------------- specials */

static int cmp_bytes(const unsigned char *a, size_t la, const unsigned char *b, size_t lb) {
    int c = memcmp(a, b, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

static int cmp_tok(const void *x, const void *y, void *ctx) {
    const ds4_tokenizer *t = ctx;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return cmp_bytes(tok_ptr(t, a), tok_len(t, a), tok_ptr(t, b), tok_len(t, b));
}

static void special_set_sort(const ds4_tokenizer *t, struct special_set *s) {
    qsort_r(s->ids, s->n, sizeof *s->ids, cmp_tok, (void *)t);
    memset(s->first, 0, sizeof s->first);
    for (size_t i = 0; i < s->n; i++) {
        unsigned c = tok_ptr(t, s->ids[i])[0];
        s->first[c >> 3] |= (uint8_t)(1u << (c & 7));
    }
}

/* Longest member of s that is a prefix of p[0..n), or -1. The sorted order
 * keeps the members sharing a prefix contiguous, so each byte narrows the
 * range [lo, hi) with two binary searches. */
static int32_t special_match(const ds4_tokenizer *t, const struct special_set *s,
                             const unsigned char *p, size_t n, size_t *mlen) {
    size_t lo = 0, hi = s->n;
    int32_t best = -1;
    for (size_t k = 0; lo < hi; k++) {
        /* a member of length k sorts first in the range and matched fully */
        if (tok_len(t, s->ids[lo]) == k) { best = s->ids[lo]; *mlen = k; lo++; }
        if (k == n || lo == hi) break;
        unsigned c = p[k];
        size_t a = lo, b = hi;
        while (a < b) {   /* first member whose byte k >= c */
            size_t m = (a + b) / 2;
            if (tok_ptr(t, s->ids[m])[k] < c) a = m + 1; else b = m;
        }
        size_t e = a, f = hi;
        while (e < f) {   /* first member whose byte k > c */
            size_t m = (e + f) / 2;
            if (tok_ptr(t, s->ids[m])[k] <= c) e = m + 1; else f = m;
        }
        lo = a; hi = e;
    }
    return best;
}

int32_t ds4_tokenizer_find_special(const ds4_tokenizer *t, const char *s, size_t len) {
    size_t ml = 0;
    int32_t id = special_match(t, &t->all, (const unsigned char *)s, len, &ml);
    return id >= 0 && ml == len ? id : -1;
}

size_t ds4_tokenizer_chat_special_len(const ds4_tokenizer *t, const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t ml = 0;
    if (!n || !(t->chat.first[p[0] >> 3] & (1u << (p[0] & 7)))) return 0;
    return special_match(t, &t->chat, p, n, &ml) >= 0 ? ml : 0;
}

/* ------------------------------------------------------------- build */

void ds4_tokenizer_free(ds4_tokenizer *t) {
    if (!t) return;
    free(t->cache);
    free(t->bytes); free(t->off); free(t->type); free(t->vslots); free(t->mslots); free(t->merge_result);
    free(t->all.ids); free(t->chat.ids);
    free(t);
}

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); goto fail; } while (0)

#define MERGE_MAX_BYTES (8 * DS4_TOKEN_MAX_BYTES)

/* Parses merge r ("LEFT RIGHT") into the ids of both halves and the result.
 * Vocabularies trained by BPE list merge results in rank order, so the id
 * after the previous result is tried (and verified) before hashing; guess is
 * -1 when that shortcut could pick a different id than vocab_find. */
static int merge_ids(const ds4_tokenizer *t, ds4_gguf_str m, unsigned char *scratch,
                     int32_t guess, int32_t ids[3]) {
    const char *sp = m.len <= MERGE_MAX_BYTES ? memchr(m.ptr, ' ', m.len) : NULL;
    if (!sp || sp == m.ptr || sp == m.ptr + m.len - 1) return -1;
    long la = alphabet_decode(m.ptr, (size_t)(sp - m.ptr), scratch);
    if (la < 0) return -1;
    long lb = alphabet_decode(sp + 1, m.len - (size_t)(sp - m.ptr) - 1, scratch + la);
    if (lb < 0) return -1;
    size_t l = (size_t)(la + lb);
    ids[0] = vocab_find(t, scratch, (size_t)la);
    ids[1] = vocab_find(t, scratch + la, (size_t)lb);
    ids[2] = guess >= 0 && guess < t->n_vocab && t->type[guess] == DS4_TT_NORMAL &&
             tok_len(t, guess) == l && memcmp(tok_ptr(t, guess), scratch, l) == 0
           ? guess : vocab_find(t, scratch, l);
    return ids[0] < 0 || ids[1] < 0 || ids[2] < 0 ? -1 : 0;
}

/* Returns -1, or the id already holding the same bytes (which stays). */
static int32_t vocab_insert(ds4_tokenizer *t, int32_t id) {
    uint64_t h = hash_bytes(tok_ptr(t, id), tok_len(t, id));
    uint32_t i = (uint32_t)h & t->vmask;
    for (; t->vslots[i].id >= 0; i = (i + 1) & t->vmask) {
        int32_t o = t->vslots[i].id;
        if (t->vslots[i].tag == (uint32_t)(h >> 32) && tok_len(t, o) == tok_len(t, id) &&
            memcmp(tok_ptr(t, o), tok_ptr(t, id), tok_len(t, id)) == 0)
            return o;
    }
    t->vslots[i] = (struct vocab_slot){ id, (uint32_t)(h >> 32) };
    return -1;
}

/* The chat-protocol strings of each family and where their ids go. */
static const char *const DS4_CHAT_STRS[] = {
    DS4_TOK_BOS, DS4_TOK_EOS, DS4_TOK_USER, DS4_TOK_ASSISTANT, DS4_TOK_THINK, DS4_TOK_THINK_END, DS4_TOK_DSML,
};
static const char *const GLM_CHAT_STRS[] = { DS4_TOK_GLM_CHAT_STRINGS };
#define N_OF(a) (sizeof (a) / sizeof (a)[0])

static int32_t *chat_slot(ds4_tokenizer *t, const char *s) {
    ds4_special_ids *sp = &t->sp;
    static const struct { const char *s; size_t off; } slots[] = {
        { DS4_TOK_BOS, offsetof(ds4_special_ids, bos) }, { DS4_TOK_EOS, offsetof(ds4_special_ids, eos) },
        { DS4_TOK_USER, offsetof(ds4_special_ids, user) }, { DS4_TOK_ASSISTANT, offsetof(ds4_special_ids, assistant) },
        { DS4_TOK_THINK, offsetof(ds4_special_ids, think) }, { DS4_TOK_THINK_END, offsetof(ds4_special_ids, think_end) },
        { DS4_TOK_DSML, offsetof(ds4_special_ids, dsml) },
        { DS4_TOK_GLM_GMASK, offsetof(ds4_special_ids, bos) }, { DS4_TOK_GLM_ENDOFTEXT, offsetof(ds4_special_ids, eos) },
        { DS4_TOK_GLM_USER, offsetof(ds4_special_ids, user) }, { DS4_TOK_GLM_ASSISTANT, offsetof(ds4_special_ids, assistant) },
        { DS4_TOK_GLM_SYSTEM, offsetof(ds4_special_ids, system) },
        { DS4_TOK_GLM_OBSERVATION, offsetof(ds4_special_ids, observation) },
        { DS4_TOK_GLM_SOP, offsetof(ds4_special_ids, sop) },
    };
    for (size_t k = 0; k < N_OF(slots); k++)
        if (!strcmp(slots[k].s, s)) return (int32_t *)((char *)sp + slots[k].off);
    return NULL;
}

ds4_tokenizer *ds4_tokenizer_build(const ds4_gguf_str *tokens, const int32_t *types,
                                   size_t n_tokens, const ds4_gguf_str *merges,
                                   size_t n_merges, const ds4_tok_config *cfg,
                                   char *err, size_t errlen) {
    ds4_tokenizer *t = calloc(1, sizeof *t);
    unsigned char scratch[MERGE_MAX_BYTES];
    if (!t) { snprintf(err, errlen, "tokenizer: out of memory"); return NULL; }
    t->cfg = *cfg;
    memset(&t->sp, 0xff, sizeof t->sp);   /* every id -1 until found */
    if (n_tokens < 256 || n_tokens >= MERGE_LIMIT) FAIL("tokenizer: unsupported vocabulary size %zu", n_tokens);
    if (n_merges >= MERGE_LIMIT) FAIL("tokenizer: unsupported number of merges %zu", n_merges);
    t->n_vocab = (int32_t)n_tokens;
    size_t total = 0;
    for (size_t i = 0; i < n_tokens; i++) total += tokens[i].len;
    t->bytes = malloc(total + 1);
    t->off = malloc((n_tokens + 1) * sizeof *t->off);
    t->type = malloc(n_tokens);
    t->vmask = pow2_at_least(n_tokens) - 1;
    t->vslots = malloc(((size_t)t->vmask + 1) * sizeof *t->vslots);
    t->mmask = pow2_at_least(n_merges) - 1;
    t->mslots = malloc(((size_t)t->mmask + 1) * sizeof *t->mslots);
    t->merge_result = malloc((n_merges + 1) * sizeof *t->merge_result);
    if (!t->bytes || !t->off || !t->type || !t->vslots || !t->mslots || !t->merge_result || total > UINT32_MAX)
        FAIL("tokenizer: out of memory");
    memset(t->vslots, 0xff, ((size_t)t->vmask + 1) * sizeof *t->vslots);
    memset(t->mslots, 0xff, ((size_t)t->mmask + 1) * sizeof *t->mslots);

    /* Decode every token. Without types, anything in the byte alphabet is
     * provisionally normal; the merges below settle it. */
    size_t o = 0;
    for (size_t i = 0; i < n_tokens; i++) {
        int32_t ty = types ? types[i] : DS4_TT_NORMAL;
        if (ty != DS4_TT_NORMAL && ty != DS4_TT_CONTROL && ty != DS4_TT_USER_DEFINED)
            FAIL("tokenizer: token %zu has unsupported type %d", i, (int)ty);
        if (tokens[i].len == 0) FAIL("tokenizer: token %zu is empty", i);
        t->off[i] = (uint32_t)o;
        long l = -1;
        if (ty == DS4_TT_NORMAL) l = alphabet_decode(tokens[i].ptr, tokens[i].len, (unsigned char *)t->bytes + o);
        if (l < 0) {
            if (ty == DS4_TT_NORMAL && types)
                FAIL("tokenizer: normal token %zu is not a byte-level string", i);
            if (ty == DS4_TT_NORMAL) ty = DS4_TT_CONTROL;
            memcpy(t->bytes + o, tokens[i].ptr, tokens[i].len);
            l = (long)tokens[i].len;
        }
        if (l > DS4_TOKEN_MAX_BYTES) FAIL("tokenizer: token %zu is longer than %d bytes", i, DS4_TOKEN_MAX_BYTES);
        t->type[i] = (uint8_t)ty;
        o += (size_t)l;
    }
    t->off[n_tokens] = (uint32_t)o;
    /* Two normal tokens with the same bytes would make BPE ambiguous. When
     * the types are inferred, the higher id of such a pair is never found by
     * a merge below, so it ends up an added token. */
    bool dups = false;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        int32_t d = t->type[i] == DS4_TT_NORMAL ? vocab_insert(t, i) : -1;
        if (d >= 0 && types) FAIL("tokenizer: tokens %d and %d have the same bytes", d, i);
        dups |= d >= 0;
    }

    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        t->byte_id[b] = vocab_find(t, &c, 1);
        if (t->byte_id[b] < 0) FAIL("tokenizer: no token for byte 0x%02x", b);
    }
    uint8_t *is_result = types ? NULL : calloc(n_tokens, 1);
    if (!types && !is_result) FAIL("tokenizer: out of memory");
    int32_t guess = -1;
    for (size_t r = 0; r < n_merges; r++) {
        int32_t ids[3];
        if (merge_ids(t, merges[r], scratch, dups ? -1 : guess, ids) < 0) {
            free(is_result);
            FAIL("tokenizer: merge %zu (\"%.*s\") does not join two vocabulary tokens into one",
                 r, (int)(merges[r].len > 60 ? 60 : merges[r].len), merges[r].ptr);
        }
        if (is_result) is_result[ids[2]] = 1;
        guess = ids[2] + 1;
        t->merge_result[r] = ids[2];
        uint64_t key = merge_key(ids[0], ids[1]);
        uint32_t i = (uint32_t)hash_u64(key) & t->mmask;
        while (t->mslots[i] != MERGE_EMPTY && t->mslots[i] >> MERGE_BITS != key) i = (i + 1) & t->mmask;
        if (t->mslots[i] != MERGE_EMPTY) continue;   /* a repeated rule keeps its first rank */
        t->mslots[i] = key << MERGE_BITS | r;
    }
    if (is_result) {
        /* Tokens that turned out to be added decode to their literal text,
         * not to the byte-alphabet reading stored so far: rebuild the bytes
         * (vocab_find is not used after this point). */
        for (int b = 0; b < 256; b++) is_result[t->byte_id[b]] = 1;
        char *nb = malloc(total + 1);
        if (!nb) { free(is_result); FAIL("tokenizer: out of memory"); }
        o = 0;
        for (int32_t i = 0; i < t->n_vocab; i++) {
            if (t->type[i] == DS4_TT_NORMAL && !is_result[i]) t->type[i] = DS4_TT_CONTROL;
            bool lit = t->type[i] != DS4_TT_NORMAL;
            size_t l = lit ? tokens[i].len : tok_len(t, i);
            if (l > DS4_TOKEN_MAX_BYTES) {
                free(nb); free(is_result);
                FAIL("tokenizer: token %d is longer than %d bytes", i, DS4_TOKEN_MAX_BYTES);
            }
            memcpy(nb + o, lit ? (const unsigned char *)tokens[i].ptr : tok_ptr(t, i), l);
            t->off[i] = (uint32_t)o;
            o += l;
        }
        t->off[t->n_vocab] = (uint32_t)o;
        free(t->bytes);
        t->bytes = nb;
        free(is_result);
    }
    size_t n_added = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) n_added += t->type[i] != DS4_TT_NORMAL;
    bool glm = cfg->family == DS4_TOK_FAMILY_GLM;
    const char *const *chat_strs = glm ? GLM_CHAT_STRS : DS4_CHAT_STRS;
    size_t n_chat = glm ? N_OF(GLM_CHAT_STRS) : N_OF(DS4_CHAT_STRS);
    t->all.ids = malloc((n_added + 1) * sizeof *t->all.ids);
    t->chat.ids = malloc(n_chat * sizeof *t->chat.ids);
    if (!t->all.ids || !t->chat.ids) FAIL("tokenizer: out of memory");
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->type[i] != DS4_TT_NORMAL) t->all.ids[t->all.n++] = i;
    special_set_sort(t, &t->all);
    for (size_t i = 1; i < t->all.n; i++)
        if (cmp_tok(&t->all.ids[i - 1], &t->all.ids[i], t) == 0)
            FAIL("tokenizer: added tokens %d and %d have the same text", t->all.ids[i - 1], t->all.ids[i]);

    for (size_t k = 0; k < n_chat; k++) {
        int32_t id = ds4_tokenizer_find_special(t, chat_strs[k], strlen(chat_strs[k]));
        if (id < 0) FAIL("tokenizer: %s vocabulary has no added token \"%s\"", glm ? "GLM" : "DeepSeek", chat_strs[k]);
        int32_t *slot = chat_slot(t, chat_strs[k]);
        if (slot) *slot = id;
        t->chat.ids[t->chat.n++] = id;
    }
    special_set_sort(t, &t->chat);
    if (!glm)
        t->sp.latest_reminder = ds4_tokenizer_find_special(t, DS4_TOK_LATEST_REMINDER, strlen(DS4_TOK_LATEST_REMINDER));

    /* line-aligned, so a lookup touches one cache line */
    t->cache = aligned_alloc(64, ((size_t)1 << CACHE_BITS) * sizeof *t->cache);
    if (!t->cache) FAIL("tokenizer: out of memory");
    memset(t->cache, 0, ((size_t)1 << CACHE_BITS) * sizeof *t->cache);
    for (int i = 0; i < CACHE_STRIPES; i++) atomic_init(&t->locks[i], false);
    return t;
fail:
    ds4_tokenizer_free(t);
    return NULL;
}

/* ------------------------------------------------------------ queries */

int32_t ds4_tokenizer_n_vocab(const ds4_tokenizer *t) { return t->n_vocab; }
ds4_tok_family ds4_tokenizer_family(const ds4_tokenizer *t) { return t->cfg.family; }

bool ds4_tokenizer_is_stop(const ds4_tokenizer *t, int32_t id) {
    if (id < 0) return false;
    if (id == t->sp.eos) return true;
    return t->cfg.family == DS4_TOK_FAMILY_GLM && (id == t->sp.user || id == t->sp.observation);
}
const ds4_special_ids *ds4_tokenizer_specials(const ds4_tokenizer *t) { return &t->sp; }

bool ds4_tokenizer_is_special(const ds4_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->type[id] != DS4_TT_NORMAL;
}

const char *ds4_tokenizer_token_bytes(const ds4_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) { *len = 0; return NULL; }
    *len = tok_len(t, id);
    return (const char *)tok_ptr(t, id);
}

/* ------------------------------------------------------------- encode */

void ds4_token_ids_free(ds4_token_ids *ids) {
    free(ids->v);
    ids->v = NULL; ids->n = ids->cap = 0;
}

static int ids_reserve(ds4_token_ids *v, size_t extra) {
    if (v->n + extra <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra) cap *= 2;
    int32_t *p = realloc(v->v, cap * sizeof *p);
    if (!p) return -1;
    v->v = p; v->cap = cap;
    return 0;
}

/* BPE over one piece: repeatedly merge the adjacent pair with the lowest
 * rank, leftmost first. Symbols live in a linked list over byte positions
 * (a merged symbol keeps its left position); candidate pairs sit in a binary
 * heap keyed by (rank, position). A heap entry goes stale when either side
 * has changed since it was pushed, which shows as a different right end. */
struct cand { int32_t rank; uint32_t pos, end; };

static bool cand_less(const struct cand *a, const struct cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

typedef struct {
    int32_t *id;
    uint32_t *next, *prev;
    struct cand *heap;
    size_t nheap;
} bpe_work;

static void heap_push(bpe_work *w, struct cand c) {
    size_t i = w->nheap++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = c;
}

static struct cand heap_pop(bpe_work *w) {
    struct cand top = w->heap[0], last = w->heap[--w->nheap];
    size_t i = 0, n = w->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!cand_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static void push_pair(const ds4_tokenizer *t, bpe_work *w, uint32_t l, uint32_t n) {
    uint32_t r = w->next[l];
    if (r >= n) return;
    int32_t rank = merge_rank(t, w->id[l], w->id[r]);
    if (rank >= 0) heap_push(w, (struct cand){ rank, l, w->next[r] });
}

static int bpe(const ds4_tokenizer *t, const unsigned char *p, size_t n, ds4_token_ids *out) {
    enum { SMALL = 128 };
    int32_t id_s[SMALL]; uint32_t next_s[SMALL], prev_s[SMALL]; struct cand heap_s[3 * SMALL];
    bpe_work w = { id_s, next_s, prev_s, heap_s, 0 };
    void *mem = NULL;
    if (n > SMALL) {
        /* the heap holds at most n-1 initial pairs plus two per merge */
        mem = malloc(n * (sizeof *w.id + 2 * sizeof *w.next + 3 * sizeof *w.heap));
        if (!mem) return -1;
        w.heap = mem;
        w.id = (int32_t *)(w.heap + 3 * n);
        w.next = (uint32_t *)(w.id + n);
        w.prev = w.next + n;
    }
    for (size_t i = 0; i < n; i++) {
        w.id[i] = t->byte_id[p[i]];
        w.next[i] = (uint32_t)i + 1;
        w.prev[i] = (uint32_t)i - 1;   /* wraps to UINT32_MAX for the first */
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, &w, (uint32_t)i, (uint32_t)n);
    while (w.nheap) {
        struct cand c = heap_pop(&w);
        uint32_t r = w.next[c.pos];
        /* stale: c.pos was absorbed (its next no longer points forward from
         * a live symbol) or a side changed (the pair's right end moved) */
        if (r >= n || w.next[r] != c.end || w.prev[r] != c.pos) continue;
        w.id[c.pos] = t->merge_result[c.rank];
        w.next[c.pos] = c.end;
        if (c.end < n) w.prev[c.end] = c.pos;
        w.prev[r] = UINT32_MAX - 1;   /* dead */
        if (w.prev[c.pos] < n) push_pair(t, &w, w.prev[c.pos], (uint32_t)n);
        push_pair(t, &w, c.pos, (uint32_t)n);
    }
    int rc = 0;
    size_t cnt = 0;
    for (uint32_t i = 0; i < n; i = w.next[i]) cnt++;
    if (ids_reserve(out, cnt) < 0) rc = -1;
    else for (uint32_t i = 0; i < n; i = w.next[i]) out->v[out->n++] = w.id[i];
    free(mem);
    return rc;
}

typedef struct { const ds4_tokenizer *t; ds4_token_ids *out; } piece_ctx;

static int encode_piece(void *vctx, const char *s, size_t n) {
    piece_ctx *pc = vctx;
    const ds4_tokenizer *t = pc->t;
    const unsigned char *p = (const unsigned char *)s;
    int32_t whole = t->cfg.ignore_merges && n > 1 ? vocab_find(t, p, n) : -1;
    if (whole >= 0 && t->type[whole] == DS4_TT_NORMAL) {
        if (ids_reserve(pc->out, 1) < 0) return -1;
        pc->out->v[pc->out->n++] = whole;
        return 0;
    }
    if (n == 1) {
        if (ids_reserve(pc->out, 1) < 0) return -1;
        pc->out->v[pc->out->n++] = t->byte_id[p[0]];
        return 0;
    }
    if (n > CACHE_MAX_BYTES) return bpe(t, p, n, pc->out);
    if (ids_reserve(pc->out, CACHE_MAX_IDS) < 0) return -1;
    uint64_t h = hash_bytes(p, n);
    size_t slot = (size_t)(h >> (64 - CACHE_BITS));
    atomic_bool *lock = (atomic_bool *)&t->locks[slot % CACHE_STRIPES];
    struct cache_ent *e = &t->cache[slot];
    /* try-locks: a thread that finds the stripe busy just runs BPE itself */
    if (!atomic_exchange_explicit(lock, true, memory_order_acquire)) {
        bool hit = e->h == h && e->len == n && memcmp(e->bytes, p, n) == 0;
        if (hit) {
            memcpy(pc->out->v + pc->out->n, e->ids, e->n_ids * sizeof *e->ids);
            pc->out->n += e->n_ids;
        }
        atomic_store_explicit(lock, false, memory_order_release);
        if (hit) return 0;
    }
    size_t before = pc->out->n;
    if (bpe(t, p, n, pc->out) < 0) return -1;
    size_t k = pc->out->n - before;
    if (k <= CACHE_MAX_IDS && !atomic_exchange_explicit(lock, true, memory_order_acquire)) {
        e->h = h; e->len = (uint8_t)n; e->n_ids = (uint8_t)k;
        memcpy(e->bytes, p, n);
        memcpy(e->ids, pc->out->v + before, k * sizeof *e->ids);
        atomic_store_explicit(lock, false, memory_order_release);
    }
    return 0;
}

static int encode_segment(const ds4_tokenizer *t, const char *s, size_t n, ds4_token_ids *out) {
    if (!n) return 0;
    piece_ctx pc = { t, out };
    int rc = t->cfg.family == DS4_TOK_FAMILY_GLM ? ds4_pretok_glm4_run(s, n, encode_piece, &pc)
                                                 : ds4_pretok_run(s, n, encode_piece, &pc);
    return rc ? -1 : 0;
}

int ds4_tokenizer_encode(const ds4_tokenizer *t, const char *text, size_t len,
                         enum ds4_tok_specials specials, ds4_token_ids *out) {
    char *clean = NULL;
    if (ds4_utf8_valid_prefix((const unsigned char *)text, len) != len) {
        clean = malloc(3 * len);
        if (!clean) return -1;
        size_t cl = 0;
        utf8_sanitize((const unsigned char *)text, len, true, clean, &cl);
        text = clean; len = cl;
    }
    const struct special_set *set = specials == DS4_TOK_SPECIALS_ALL ? &t->all
                                  : specials == DS4_TOK_SPECIALS_CHAT ? &t->chat : NULL;
    const unsigned char *p = (const unsigned char *)text;
    size_t seg = 0, i = 0;
    int rc = 0;
    if (set) {
        while (i < len && rc == 0) {
            size_t ml;
            int32_t id;
            if (!(set->first[p[i] >> 3] & (1u << (p[i] & 7))) ||
                (id = special_match(t, set, p + i, len - i, &ml)) < 0) { i++; continue; }
            rc = encode_segment(t, text + seg, i - seg, out);
            if (rc == 0 && (rc = ids_reserve(out, 1)) == 0) out->v[out->n++] = id;
            i += ml;
            seg = i;
        }
    }
    if (rc == 0) rc = encode_segment(t, text + seg, len - seg, out);
    free(clean);
    return rc;
}

/* ------------------------------------------------------------- decode */

char *ds4_tokenizer_decode(const ds4_tokenizer *t, const int32_t *ids, size_t n,
                           bool valid_utf8, size_t *len) {
    size_t raw = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_vocab) raw += tok_len(t, ids[i]);
    char *buf = malloc(raw + 1);
    if (!buf) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_vocab) {
            memcpy(buf + o, tok_ptr(t, ids[i]), tok_len(t, ids[i]));
            o += tok_len(t, ids[i]);
        }
    if (valid_utf8 && ds4_utf8_valid_prefix((unsigned char *)buf, o) != o) {
        char *clean = malloc(3 * o + 1);
        if (!clean) { free(buf); return NULL; }
        size_t cl = 0;
        utf8_sanitize((unsigned char *)buf, o, true, clean, &cl);
        free(buf);
        buf = clean; o = cl;
    }
    buf[o] = 0;
    *len = o;
    return buf;
}

size_t ds4_detok_push(ds4_detok *d, const ds4_tokenizer *t, int32_t id, char *out) {
    if (id < 0 || id >= t->n_vocab) return 0;
    unsigned char buf[4 + DS4_TOKEN_MAX_BYTES];
    size_t l = tok_len(t, id);
    memcpy(buf, d->pend, d->npend);
    memcpy(buf + d->npend, tok_ptr(t, id), l);
    l += d->npend;
    size_t o = 0, used = utf8_sanitize(buf, l, false, out, &o);
    d->npend = (unsigned)(l - used);   /* a truncated tail is at most 3 bytes */
    memcpy(d->pend, buf + used, d->npend);
    return o;
}

size_t ds4_detok_flush(ds4_detok *d, char *out) {
    size_t o = 0;
    utf8_sanitize(d->pend, d->npend, true, out, &o);
    d->npend = 0;
    return o;
}
