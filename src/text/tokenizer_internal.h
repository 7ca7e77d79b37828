/* tokenizer_internal.h -- what the tokenizer's translation units share (and
 * what its tests and fuzz target reach into): UTF-8 scanning, the
 * pre-tokenizer, and the vocabulary builder both loaders feed. Not a public
 * API: other modules use tokenizer.h.
 */
#ifndef DS4_TOKENIZER_INTERNAL_H
#define DS4_TOKENIZER_INTERNAL_H

#include "text/tokenizer.h"

/* ---- UTF-8 ----
 * Classifies the sequence at s[0..n) following the Unicode "maximal subpart"
 * practice (Python's decode(errors="replace") does the same): OK = one valid
 * character of *len bytes (code point in *cp); INVALID = *len bytes that
 * become one U+FFFD; TRUNCATED = s[0..n) is a proper prefix of a valid
 * sequence, so the answer depends on bytes not seen yet. */
enum ds4_u8 { DS4_U8_OK, DS4_U8_INVALID, DS4_U8_TRUNCATED };
enum ds4_u8 ds4_utf8_scan(const unsigned char *s, size_t n, size_t *len, uint32_t *cp);
/* Length of the longest valid UTF-8 prefix of s[0..n). */
size_t ds4_utf8_valid_prefix(const unsigned char *s, size_t n);

/* ---- Unicode classes ----
 * What the pre-tokenizer regexes test: \p{L} \p{M} \p{N} \p{P} \p{S} and
 * \s (the White_Space set). The ranges are generated from the HF tokenizers
 * regex engine (tokenizer_unicode.c), so they carry its Unicode version. */
enum { DS4_UC_OTHER, DS4_UC_L, DS4_UC_M, DS4_UC_N, DS4_UC_P, DS4_UC_S, DS4_UC_W };
typedef struct { uint32_t lo, hi; uint8_t cls; } ds4_uc_range;
extern const ds4_uc_range ds4_uc_ranges[];
extern const size_t ds4_uc_n_ranges;
int ds4_uc_class(uint32_t cp);

/* ---- pre-tokenizer ----
 * The three isolated regex splits of deepseek-v4-prompt-format.md 3.5 over
 * valid UTF-8 (callers sanitise first). Pieces are reported in order and
 * cover the input exactly; the callback returns nonzero to abort, and that
 * value is returned (0 otherwise).
 * ds4_pretok_run is the hand-written matcher the tokenizer uses; the PCRE2
 * version runs the regexes themselves and is the reference the tests and the
 * fuzz target hold the fast one to. */
typedef int (*ds4_piece_fn)(void *ctx, const char *p, size_t n);
int ds4_pretok_run(const char *s, size_t n, ds4_piece_fn fn, void *ctx);
/* GLM's glm4 split (one regex), same conventions. */
int ds4_pretok_glm4_run(const char *s, size_t n, ds4_piece_fn fn, void *ctx);

typedef struct ds4_pretok_regex ds4_pretok_regex;
ds4_pretok_regex *ds4_pretok_regex_new(char *err, size_t errlen);
ds4_pretok_regex *ds4_pretok_regex_glm4_new(char *err, size_t errlen);
void ds4_pretok_regex_free(ds4_pretok_regex *pt);
/* Returns 0, the callback's value, or -1 on a regex engine failure. */
int ds4_pretok_regex_run(const ds4_pretok_regex *pt, const char *s, size_t n,
                         ds4_piece_fn fn, void *ctx);

/* ---- vocabulary builder ----
 * tokens[i] is id i's vocabulary string (byte-level alphabet, or literal text
 * for added tokens); types[i] uses the GGUF token types (1 normal, 3 control,
 * 4 user-defined). types == NULL infers them: a token is normal when it is a
 * single byte symbol or the result of a merge, added otherwise. */
enum { DS4_TT_NORMAL = 1, DS4_TT_CONTROL = 3, DS4_TT_USER_DEFINED = 4 };
/* family picks the pre-tokenizer and the required chat-protocol tokens;
 * ignore_merges: a piece that is itself a vocabulary token is emitted as
 * that token without BPE (HF BPE "ignore_merges"; llama.cpp for glm4). */
typedef struct { ds4_tok_family family; bool ignore_merges; } ds4_tok_config;
ds4_tokenizer *ds4_tokenizer_build(const ds4_gguf_str *tokens, const int32_t *types,
                                   size_t n_tokens, const ds4_gguf_str *merges,
                                   size_t n_merges, const ds4_tok_config *cfg,
                                   char *err, size_t errlen);

/* GPT-2 byte-level alphabet: byte -> code point, and back (-1: not in it). */
uint32_t ds4_byte_to_cp(uint8_t b);
int ds4_cp_to_byte(uint32_t cp);

#endif
