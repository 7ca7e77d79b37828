/* dist_proto.h -- the pipeline-parallel wire format (README "Distributed
 * inference"): the frames a coordinator and its workers exchange, encoded
 * into and decoded from plain byte buffers. No sockets here: the transport
 * carries whole messages, this module only says what is in them.
 *
 * Contract
 * - Every frame starts with the magic "DS4P", a version (1) and a type;
 *   integers and floats are little endian, strings length-prefixed (u16).
 * - HELLO (worker -> coordinator): the shared secret, the model identity
 *   (name, layer count, hidden size, HC streams, vocabulary, routed-expert
 *   bits, numerics), the layer slice, the context capacity and the worker's
 *   data address. ds4_dist_hello_compatible() says whether a registration fits
 *   the coordinator's model and secret (secret compared in constant time)
 *   and words the refusal in one line.
 * - WORK (one pipeline hop): session id, first position, token count, the
 *   rolling token-prefix hashes before and after the span, whether every
 *   position's logits are wanted, the tokens and the hidden-state payload
 *   (n x n_hc x n_embd floats; empty for a slice that starts at layer 0).
 * - RESULT: session id, status (OK, HASH_MISMATCH, ERROR), the hash after
 *   the span, and floats (hidden states or logits) or an error line.
 * - ds4_dist_decode() checks every length against the buffer before reading
 *   (a truncated or oversized frame is an error, never a read past the end)
 *   and leaves pointers into the buffer for the arrays; floats and tokens
 *   are read through ds4_dist_float_at()/ds4_dist_token_at() because the
 *   buffer need not be aligned. Encoders return NULL only when out of memory.
 * - ds4_dist_hash_tokens() is the rolling 64-bit prefix hash (FNV-1a over
 *   the token ids' little-endian bytes): hash(prefix + span) is
 *   ds4_dist_hash_tokens(hash(prefix), span).
 */
#ifndef DS4_DIST_PROTO_H
#define DS4_DIST_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DS4_DIST_HASH_EMPTY 0xcbf29ce484222325ull

enum ds4_dist_type { DS4_DIST_HELLO = 1, DS4_DIST_WELCOME = 2, DS4_DIST_REFUSED = 3, DS4_DIST_WORK = 4,
                     DS4_DIST_RESULT = 5 };
enum ds4_dist_status { DS4_DIST_OK = 0, DS4_DIST_HASH_MISMATCH = 1, DS4_DIST_ERROR = 2 };

typedef struct {
    const char *secret; size_t secret_len;
    const char *model; size_t model_len;
    uint32_t n_layer, n_embd, n_hc, n_vocab, expert_bits;
    uint32_t first, last;
    bool output;
    uint32_t ctx;
    const char *data_url; size_t data_url_len;
    bool numerics;             /* the ds4 FP8/FP4 simulation (changes logits) */
} ds4_dist_hello;

typedef struct {
    uint64_t session;
    uint32_t pos, n;
    uint64_t hash_before, hash_after;
    bool all_logits;
    const uint8_t *tokens;     /* n little-endian i32 */
    uint32_t n_floats;
    const uint8_t *floats;     /* n_floats little-endian f32 */
} ds4_dist_work;

typedef struct {
    uint64_t session;
    uint8_t status;
    uint64_t hash_after;
    uint32_t n_floats;
    const uint8_t *floats;
    const char *text; size_t text_len;    /* ERROR / REFUSED line, WELCOME note */
} ds4_dist_result;

typedef struct {
    enum ds4_dist_type type;
    ds4_dist_hello hello;      /* HELLO */
    ds4_dist_work work;        /* WORK */
    ds4_dist_result result;    /* RESULT, WELCOME, REFUSED (text only) */
} ds4_dist_frame;

uint64_t ds4_dist_hash_tokens(uint64_t h, const int32_t *toks, int n);

/* Encoders: a malloc'd buffer (caller frees) and its size in *len. */
uint8_t *ds4_dist_encode_hello(const ds4_dist_hello *h, size_t *len);
uint8_t *ds4_dist_encode_text(enum ds4_dist_type type, const char *text, size_t *len);
uint8_t *ds4_dist_encode_work(const ds4_dist_work *w, const int32_t *toks, const float *floats, size_t *len);
uint8_t *ds4_dist_encode_result(const ds4_dist_result *r, const float *floats, size_t *len);

/* false (and one line in err) for anything but one whole valid frame */
bool ds4_dist_decode(const uint8_t *buf, size_t len, ds4_dist_frame *out, char *err, size_t errlen);
float ds4_dist_float_at(const uint8_t *floats, size_t i);
int32_t ds4_dist_token_at(const uint8_t *tokens, size_t i);

/* Whether a worker's HELLO fits: same secret, same model, a non-empty slice
 * inside the model. On false, one line in err naming the first difference. */
bool ds4_dist_hello_compatible(const ds4_dist_hello *mine, const ds4_dist_hello *theirs, char *err, size_t errlen);

#endif
