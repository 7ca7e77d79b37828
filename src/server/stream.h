/* stream.h -- turns generated text into each API family's response: SSE
 * events while generating (stream) or one JSON body at the end.
 *
 * Contract
 * - One ds4_enc per chat-style request (chat completions, Responses,
 *   Messages). ds4_enc_feed() takes the decoded text of each sampled token;
 *   it applies the client's stop strings (holding back bytes that may start
 *   one), runs the tool-call parser of the request's chat spec (chat_spec.h;
 *   argument types from the request's tool schemas where the format needs
 *   them: reasoning / content / tool calls) and, when
 *   streaming, writes the family's events through `out` as soon as the
 *   parser releases text. Event order, field sets and terminal events follow
 *   server-api.md 4.4-4.5, 6.4-6.6 and 7.3-7.4.
 * - Tool calls get their id (toolmem.h) when the invoke header is parsed;
 *   argument bytes stream as JSON fragments that only parse at the end.
 *   ds4_enc_feed() returns true when generation must stop: the parser is
 *   done (a closed tool block, where the format has a closing tag, or text
 *   that failed to parse) or a stop string matched (other formats end the
 *   turn at the model's stop token).
 * - ds4_enc_finish() ends the response: terminal events (stream) or the
 *   complete body (ds4_enc_body). The finish reason is derived from what was
 *   seen: tool calls > stop string > the caller's cause (EOS or length).
 *   A tool block that never closed or did not parse is an in-stream error
 *   when streaming (partial arguments cannot be retracted); non-streaming
 *   returns the raw text as plain content.
 * - ds4_enc_fail() reports an engine failure in the family's in-stream
 *   error shape (only meaningful after ds4_enc_begin()).
 * - The stop-string filter is also used alone by legacy completions.
 */
#ifndef DS4_STREAM_H
#define DS4_STREAM_H

#include <stdbool.h>
#include <stddef.h>

#include "base/json_util.h"
#include "server/request.h"
#include "text/toolmem.h"

struct cJSON;
typedef int (*ds4_out_fn)(void *ud, const char *data, size_t len);

typedef struct {
    int prompt_tokens;      /* P */
    int cached_tokens;      /* C <= P */
    int completion_tokens;  /* G */
    int reasoning_tokens;   /* R */
} ds4_usage;

typedef enum { DS4_CAUSE_EOS, DS4_CAUSE_LENGTH } ds4_cause;

/* Stop strings over a byte stream: push() appends text and returns how many
 * bytes (from the start of the not-yet-released region) may be released;
 * `matched` is set when a stop string was found (text from it on is dropped). */
typedef struct {
    const char *const *stop; int n_stop;
    size_t maxlen;
    ds4_buf text;           /* everything pushed */
    size_t released;
    int matched;            /* index of the matched stop string, -1 none */
} ds4_stopper;

void ds4_stopper_init(ds4_stopper *s, const char *const *stop, int n_stop);
/* Appends; returns the newly releasable span [released_before, released). */
size_t ds4_stopper_push(ds4_stopper *s, const char *p, size_t n, const char **span);
/* End of text: releases the held-back tail (unless matched). */
size_t ds4_stopper_flush(ds4_stopper *s, const char **span);
void ds4_stopper_free(ds4_stopper *s);

typedef struct ds4_enc ds4_enc;

typedef struct {
    const ds4_request *req;
    bool thinking;          /* the prompt ended with <think> */
    ds4_toolmem *mem;       /* ids are checked unique against it; NULL allowed */
    ds4_out_fn out;         /* stream writer; NULL for non-streaming */
    void *ud;
} ds4_enc_opts;

ds4_enc *ds4_enc_new(const ds4_enc_opts *o);
void ds4_enc_free(ds4_enc *e);

void ds4_enc_begin(ds4_enc *e, const ds4_usage *u);
/* Keep-alive events while the response waits (queue, prefill); the caller
 * writes the SSE comment. Before begin it sends the opening events that need
 * no usage (Chat's role chunk, Responses' created + in_progress; a later
 * begin adds only Messages' message_start); Messages gets pings throughout. */
void ds4_enc_keepalive(ds4_enc *e);
bool ds4_enc_feed(ds4_enc *e, const char *s, size_t n);
bool ds4_enc_in_structure(const ds4_enc *e);
bool ds4_enc_in_reasoning(const ds4_enc *e);
void ds4_enc_finish(ds4_enc *e, ds4_cause cause, const ds4_usage *u);
void ds4_enc_fail(ds4_enc *e, const char *message, const char *code);

/* Non-streaming body, valid after finish. */
const char *ds4_enc_body(const ds4_enc *e, size_t *len);
/* The tool-call turn just produced (for the replay map and live bindings):
 * the exact block (NULL if none) and the call ids. */
const char *ds4_enc_block(const ds4_enc *e, size_t *len);
/* Fills up to max ids; returns how many the turn has (all of them matter). */
int ds4_enc_call_ids(const ds4_enc *e, const char **ids, int max);
/* The DSML parser's error message (malformed or unterminated tool block), or NULL. */
const char *ds4_enc_error(const ds4_enc *e);
/* The visible content (valid after finish), and whether "</think>" closed
 * the reasoning channel. */
const char *ds4_enc_content(const ds4_enc *e, size_t *len);
bool ds4_enc_reasoning_closed(const ds4_enc *e);
/* True when a stop string cut the output (the live KV then holds more). */
bool ds4_enc_stop_matched(const ds4_enc *e);
/* Chat logprobs (server-api.md 4.6): when requested, the caller passes one
 * entry {"token","logprob","bytes","top_logprobs"} per sampled token that
 * is visible content (ds4_enc_in_content() before feeding it); entries ride
 * on the next content delta (stream) or in choices[0].logprobs.content. */
bool ds4_enc_wants_logprobs(const ds4_enc *e);
bool ds4_enc_in_content(const ds4_enc *e);
void ds4_enc_logprob(ds4_enc *e, struct cJSON *entry);   /* takes ownership */
/* True when the output writer failed (client gone). */
bool ds4_enc_broken(const ds4_enc *e);

#endif
