/* tokenizer.h -- the byte-level BPE tokenizers of both model families:
 * DeepSeek V4 (the DeepSeek three-regex pre-tokenizer) and GLM (the glm4
 * one-regex pre-tokenizer, glm-5.2-model.md 8); added (special) tokens,
 * streaming decode.
 *
 * Contract
 * - Load from a GGUF (tokenizer.ggml.tokens / merges / token_type) or from a
 *   Hugging Face tokenizer.json. Both build the same in-memory tokenizer; a
 *   bad or inconsistent vocabulary fails with one line in err, never a crash.
 *   The family comes from the file: GGUF tokenizer.ggml.pre "glm4", or a
 *   tokenizer.json whose pre-tokenizer is GLM's Split regex, is GLM;
 *   anything else is DeepSeek. Load fails when one of the family's
 *   chat-protocol strings is not an added token (DeepSeek: BOS, EOS, User,
 *   Assistant, <think>, </think>, ｜DSML｜; GLM: the strings of
 *   DS4_TOK_GLM_CHAT_STRINGS): ids are always resolved by string, never
 *   hard-coded. GLM vocabularies encode with ignore_merges (a piece that is
 *   a vocabulary token is that token) when the tokenizer.json says so, and
 *   always from a glm4 GGUF (llama.cpp's rule for glm4).
 * - Encoding is exactly Hugging Face `tokenizers` on the same tokenizer.json:
 *   specials are cut out first (leftmost-longest), every segment between them
 *   goes through the family's regex splits, then byte-level BPE by
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

#include "format/gguf.h"

/* The chat-protocol strings (U+FF5C fullwidth bars, U+2581 lower blocks). */
#define DS4_TOK_BOS        "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence" "\xef\xbd\x9c>"
#define DS4_TOK_EOS        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence" "\xef\xbd\x9c>"
#define DS4_TOK_USER       "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS4_TOK_ASSISTANT  "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DS4_TOK_THINK      "<think>"
#define DS4_TOK_THINK_END  "</think>"
#define DS4_TOK_DSML       "\xef\xbd\x9c" "DSML\xef\xbd\x9c"
#define DS4_TOK_LATEST_REMINDER "<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>"

/* GLM's protocol strings (glm-5.2-model.md 7.5). */
#define DS4_TOK_GLM_GMASK        "[gMASK]"
#define DS4_TOK_GLM_SOP          "<sop>"
#define DS4_TOK_GLM_ENDOFTEXT    "<|endoftext|>"
#define DS4_TOK_GLM_SYSTEM       "<|system|>"
#define DS4_TOK_GLM_USER         "<|user|>"
#define DS4_TOK_GLM_ASSISTANT    "<|assistant|>"
#define DS4_TOK_GLM_OBSERVATION  "<|observation|>"
/* Every string the GLM template writes: the GLM chat-special set. */
#define DS4_TOK_GLM_CHAT_STRINGS \
    DS4_TOK_GLM_GMASK, DS4_TOK_GLM_SOP, DS4_TOK_GLM_ENDOFTEXT, DS4_TOK_GLM_SYSTEM, DS4_TOK_GLM_USER, \
    DS4_TOK_GLM_ASSISTANT, DS4_TOK_GLM_OBSERVATION, DS4_TOK_THINK, DS4_TOK_THINK_END, "<tool_call>", \
    "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<tool_response>", \
    "</tool_response>"

typedef enum { DS4_TOK_FAMILY_DS4, DS4_TOK_FAMILY_GLM } ds4_tok_family;

/* No vocabulary entry may decode to more bytes than this (load rejects it). */
#define DS4_TOKEN_MAX_BYTES 256

typedef struct ds4_tokenizer ds4_tokenizer;

enum ds4_tok_specials {
    DS4_TOK_SPECIALS_NONE = 0, /* raw text: every byte is BPE-encoded */
    DS4_TOK_SPECIALS_CHAT,     /* the family's chat-protocol strings (what its template writes) */
    DS4_TOK_SPECIALS_ALL,      /* every added token (official / HF profile) */
};

/* Ids of the well-known added tokens; -1 when the family has none. DeepSeek:
 * bos..dsml required, latest_reminder optional. GLM: bos = [gMASK], eos =
 * <|endoftext|>, user, assistant, think, think_end, system, observation and
 * sop required; dsml and latest_reminder -1. */
typedef struct ds4_special_ids {
    int32_t bos, eos, user, assistant, think, think_end, dsml;
    int32_t latest_reminder;
    int32_t system, observation, sop;
} ds4_special_ids;

/* A growable id vector; zero-initialise, free with ds4_token_ids_free. */
typedef struct ds4_token_ids { int32_t *v; size_t n, cap; } ds4_token_ids;
void ds4_token_ids_free(ds4_token_ids *ids);

/* The tokenizer.* keys of a GGUF. tokenizer.ggml.pre picks the family: "glm4"
 * is GLM; "joyai-llm", "deepseek-v3" or no key is DeepSeek; any other name is
 * refused with one line naming it. */
ds4_tokenizer *ds4_tokenizer_from_gguf(const ds4_gguf *g, char *err, size_t errlen);
/* added_path (may be NULL): a second JSON whose "added_tokens" array extends or
 * overrides the first file's, e.g. the V4 added tokens over the V3 base file. */
ds4_tokenizer *ds4_tokenizer_from_hf_json(const char *path, const char *added_path,
                                          char *err, size_t errlen);
void ds4_tokenizer_free(ds4_tokenizer *t);

int32_t ds4_tokenizer_n_vocab(const ds4_tokenizer *t);
const ds4_special_ids *ds4_tokenizer_specials(const ds4_tokenizer *t);
ds4_tok_family ds4_tokenizer_family(const ds4_tokenizer *t);
/* Ends a generated turn: EOS; for GLM also <|user|> and <|observation|>
 * (the model's turn ends at the next role tag, glm-5.2-model.md 7.3). */
bool ds4_tokenizer_is_stop(const ds4_tokenizer *t, int32_t id);
/* Id of the added token whose literal text is s[0..len), or -1. */
int32_t ds4_tokenizer_find_special(const ds4_tokenizer *t, const char *s, size_t len);
/* Length of the longest chat-protocol string (the family's SPECIALS_CHAT
 * set) that s[0..n) starts with, or 0. */
size_t ds4_tokenizer_chat_special_len(const ds4_tokenizer *t, const char *s, size_t n);
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
 * model "gpt2", pre "joyai-llm" (DeepSeek) or "glm4" (GLM), bos/eos ids by
 * string, add_bos/add_eos false.
 * Returns 0, or -1 with err filled. */
int ds4_tokenizer_gguf_from_hf_json(ds4_gguf_writer *w, const char *path,
                                    const char *added_path, char *err, size_t errlen);

#endif
