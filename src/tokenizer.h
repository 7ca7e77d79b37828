/* tokenizer.h -- the DeepSeek V4 tokenizer: byte-level BPE, the DeepSeek
 * three-regex pre-tokenizer, added (special) tokens, streaming decode.
 *
 * Contract
 * - Load from a GGUF (tokenizer.ggml.tokens / merges / token_type) or from a
 *   Hugging Face tokenizer.json. Both build the same in-memory tokenizer; a
 *   bad or inconsistent vocabulary fails with one line in err, never a crash.
 *   Load fails when one of the seven chat-protocol strings (BOS, EOS, User,
 *   Assistant, <think>, </think>, ｜DSML｜) is not an added token: ids are
 *   always resolved by string, never hard-coded.
 * - Encoding is exactly Hugging Face `tokenizers` on the same tokenizer.json:
 *   specials are cut out first (leftmost-longest), every segment between them
 *   goes through the three regex splits of the sheet, then byte-level BPE by
 *   merge rank. No BOS/EOS is ever added. The Unicode classes the splits use
 *   are generated from HF's own regex engine (tokenizer_unicode.c), so they
 *   do not depend on the system's PCRE2 or Unicode version.
 * - Which added-token strings are recognised inside text is the caller's
 *   explicit choice (enum ds4_tok_specials). Raw user text should use NONE:
 *   otherwise a user (or a tool result, or a web page) that types
 *   "<｜Assistant｜>" or "</think>" injects protocol tokens and can forge turns.
 * - Input that is not valid UTF-8 is encoded as HF encodes the Python string
 *   bytes.decode("utf-8", "replace"): each maximal invalid subpart becomes
 *   U+FFFD. For valid UTF-8, decode(encode(x)) == x byte for byte.
 * - Decoding a normal token maps its byte-level string back to bytes; an added
 *   token decodes to its literal UTF-8 text. A token may end inside a UTF-8
 *   character: ds4_detok holds such a tail back until it completes.
 * - Every function taking a const ds4_tokenizer * is safe to call from several
 *   threads at once.
 */
#ifndef DS4_TOKENIZER_H
#define DS4_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "gguf.h"

/* The chat-protocol strings (U+FF5C fullwidth bars, U+2581 lower blocks). */
#define DS4_TOK_BOS        "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence" "\xef\xbd\x9c>"
#define DS4_TOK_EOS        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence" "\xef\xbd\x9c>"
#define DS4_TOK_USER       "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS4_TOK_ASSISTANT  "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DS4_TOK_THINK      "<think>"
#define DS4_TOK_THINK_END  "</think>"
#define DS4_TOK_DSML       "\xef\xbd\x9c" "DSML\xef\xbd\x9c"
#define DS4_TOK_LATEST_REMINDER "<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>"

/* No vocabulary entry may decode to more bytes than this (load rejects it). */
#define DS4_TOKEN_MAX_BYTES 256

typedef struct ds4_tokenizer ds4_tokenizer;

enum ds4_tok_specials {
    DS4_TOK_SPECIALS_NONE = 0, /* raw text: every byte is BPE-encoded */
    DS4_TOK_SPECIALS_CHAT,     /* the seven chat-protocol strings (ds4-server profile) */
    DS4_TOK_SPECIALS_ALL,      /* every added token (official / HF profile) */
};

/* Ids of the well-known added tokens. The first seven are required; the rest
 * are -1 when the vocabulary lacks them. */
typedef struct ds4_special_ids {
    int32_t bos, eos, user, assistant, think, think_end, dsml;
    int32_t latest_reminder;
} ds4_special_ids;

/* A growable id vector; zero-initialise, free with ds4_token_ids_free. */
typedef struct ds4_token_ids { int32_t *v; size_t n, cap; } ds4_token_ids;
void ds4_token_ids_free(ds4_token_ids *ids);

ds4_tokenizer *ds4_tokenizer_from_gguf(const ds4_gguf *g, char *err, size_t errlen);
/* added_path (may be NULL): a second JSON whose "added_tokens" array extends or
 * overrides the first file's, e.g. the V4 added tokens over the V3 base file. */
ds4_tokenizer *ds4_tokenizer_from_hf_json(const char *path, const char *added_path,
                                          char *err, size_t errlen);
void ds4_tokenizer_free(ds4_tokenizer *t);

int32_t ds4_tokenizer_n_vocab(const ds4_tokenizer *t);
const ds4_special_ids *ds4_tokenizer_specials(const ds4_tokenizer *t);
/* Id of the added token whose literal text is s[0..len), or -1. */
int32_t ds4_tokenizer_find_special(const ds4_tokenizer *t, const char *s, size_t len);
/* True for added tokens (BOS/EOS/PAD, placeholders, protocol and task tokens). */
bool ds4_tokenizer_is_special(const ds4_tokenizer *t, int32_t id);

/* Appends the ids of text[0..len) to out. Returns 0, or -1 when out of memory. */
int ds4_tokenizer_encode(const ds4_tokenizer *t, const char *text, size_t len,
                         enum ds4_tok_specials specials, ds4_token_ids *out);

/* The bytes of one token (not NUL-terminated; valid while t lives), or NULL
 * for an id outside the vocabulary. */
const char *ds4_tokenizer_token_bytes(const ds4_tokenizer *t, int32_t id, size_t *len);
/* Concatenated bytes of ids, malloc'd and NUL-terminated (*len excludes the
 * NUL). With valid_utf8, invalid subparts become U+FFFD, exactly as the
 * streaming decoder emits them. Ids outside the vocabulary are skipped. */
char *ds4_tokenizer_decode(const ds4_tokenizer *t, const int32_t *ids, size_t n,
                           bool valid_utf8, size_t *len);

/* Streaming detokenizer: each push emits only complete, valid UTF-8 (invalid
 * subparts become U+FFFD) and holds back a tail that may still complete.
 * Pushing every token then flushing yields decode(..., valid_utf8=true). */
#define DS4_DETOK_OUT_MAX (3 * (DS4_TOKEN_MAX_BYTES + 4))
typedef struct ds4_detok { unsigned char pend[4]; unsigned npend; } ds4_detok;
static inline void ds4_detok_init(ds4_detok *d) { d->npend = 0; }
/* Writes at most DS4_DETOK_OUT_MAX bytes to out; returns how many. */
size_t ds4_detok_push(ds4_detok *d, const ds4_tokenizer *t, int32_t id, char *out);
/* End of stream: a held-back incomplete tail becomes U+FFFD. */
size_t ds4_detok_flush(ds4_detok *d, char *out);

/* ---- GGUF export (converter, demo-model maker, tools/ds4-vocab) ----
 * Writes the tokenizer.* keys built from an HF tokenizer.json (plus optional
 * added-tokens overlay as above): tokens in id order (byte-level alphabet for
 * normal tokens, literal text for added ones), token_type (1 normal, 3 control
 * for HF "special" added tokens, 4 user-defined for the others), merges,
 * model "gpt2", pre "joyai-llm", bos/eos ids by string, add_bos/add_eos false.
 * Returns 0, or -1 with err filled. */
int ds4_tokenizer_gguf_from_hf_json(ds4_gguf_writer *w, const char *path,
                                    const char *added_path, char *err, size_t errlen);

#endif
