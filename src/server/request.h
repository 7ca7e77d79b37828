/* request.h -- decoding of API request bodies into one internal request.
 *
 * Contract
 * - ds4_request_decode() parses the JSON body of one API family (OpenAI chat
 *   completions, legacy completions, Responses, Anthropic Messages and
 *   count_tokens) into a ds4_request: the chat.h conversation (messages,
 *   tool definitions), resolved thinking mode, sampling parameters, limits,
 *   stop strings, streaming flags, and for completions the prompt list.
 *   Semantics follow server-api.md sections 2, 4-7 and
 *   the prompt-format sheets; a template's own thinking switch is also read
 *   from chat_template_kwargs.enable_thinking (vLLM / SGLang clients).
 * - Unknown fields are ignored everywhere; duplicate keys: the last wins.
 *   Wrong types, missing required fields, unsupported values, message
 *   roles the API family does not define (named in the message; the official
 *   encoding's latest_reminder is accepted by chat and renders nothing) and invalid
 *   UTF-8 fail with an HTTP status (400) and a message, `param` and `code`
 *   for the family's error shape; the request is then empty.
 * - Sampling: omitted knobs take the ds4 defaults (temperature 1, top_p 1,
 *   min_p 0.05, no top_k), explicit ones always win, also in thinking mode.
 *   Out-of-range values (negative temperature or top_k, top_p or min_p
 *   outside [0, 1]) fail with 400 naming the field.
 * - Tool continuation: tool results (Responses function_call_output,
 *   Anthropic tool_result) whose id is not matched by a call replayed
 *   earlier in the same request are listed in live_ids; the server accepts
 *   the request only if those ids belong to its live tool-call turn.
 * - All strings belong to the request and live until ds4_request_free().
 * - The decoder never touches the engine; it is safe on any thread.
 */
#ifndef DS4_REQUEST_H
#define DS4_REQUEST_H

#include <stdint.h>
#include <stdbool.h>

#include "text/chat.h"
#include "engine/sampler.h"

struct cJSON;

typedef enum {
    DS4_API_CHAT, DS4_API_COMPLETIONS, DS4_API_RESPONSES, DS4_API_MESSAGES, DS4_API_COUNT_TOKENS,
} ds4_api;

/* How a Responses tool is returned to the client. */
typedef enum { DS4_TOOL_FUNCTION, DS4_TOOL_SEARCH, DS4_TOOL_CUSTOM } ds4_tool_kind;

typedef struct {
    const char *name;       /* the name the model sees (namespace + name) */
    const char *ns;         /* Responses namespace, or NULL */
    const char *short_name; /* name without the namespace */
    ds4_tool_kind kind;
} ds4_tool_meta;

typedef struct {
    const char *text;       /* string prompt, or NULL */
    size_t text_len;
    const int32_t *ids;     /* token-id prompt, or NULL */
    int n_ids;
} ds4_prompt;

typedef struct {
    int status;             /* 0 = no error */
    char message[400];
    char param[32];         /* "" = null */
    char code[40];          /* "" = null */
} ds4_req_error;

typedef struct ds4_request {
    ds4_api api;
    const struct ds4_chat_spec *chat;  /* the served model's chat format (decode_for); NULL: ds4_chat_spec_for(NULL) */
    const char *model;      /* echoed back verbatim */
    bool stream, include_usage;

    ds4_sampler_params sampling;
    bool seed_set;
    /* "dir_steering": {"file": NAME, "ffn": F, "attn": F} (docs/steering.md):
     * steer with the file the server was started with; NULL: the server's
     * own scales */
    const char *steer_file;
    float steer_ffn, steer_attn;
    int max_tokens;         /* -1: server default */
    const char **stop; int n_stop;

    ds4_think_mode think;   /* before the context rule (chat.h demotes MAX) */
    bool expose_reasoning;  /* Responses: reasoning.summary opted in */

    ds4_chat_msg *msgs; int n_msgs;
    ds4_tool_def *tools; int n_tools;      /* active tools only */
    ds4_tool_meta *tool_meta;              /* parallel to tools */
    const char **live_ids; int n_live_ids; /* tool results needing live state */

    /* legacy completions */
    ds4_prompt *prompts; int n_prompts;
    bool echo;
    int logprobs;           /* completions: top-k count; chat: top_logprobs; -1 = off */

    struct ds4_req_alloc *allocs;   /* private */
    void *json;                     /* private: the parsed body */
} ds4_request;

/* The strict body parse every JSON route uses: valid UTF-8, no NUL
 * character (raw or \u0000; text is never cut short silently), every \u
 * escape four hex digits (lone surrogates become U+FFFD), exactly one JSON
 * value with only whitespace after it. NULL with e filled (400). */
struct cJSON *ds4_json_body_parse(const char *body, size_t len, ds4_req_error *e);

/* Returns 0, or the HTTP status with e filled (r is then freed/empty).
 * decode_for() decodes for a chat spec (chat_spec.h): where the format has
 * a tool-result turn, Anthropic tool_result blocks become tool messages
 * ahead of the user's text; thinking without an effort means Max where the
 * spec says so; a request naming no model gets the spec's first model id.
 * ds4_request_decode() is decode_for(ds4_chat_spec_for(NULL)). */
int ds4_request_decode(ds4_api api, const char *body, size_t len, ds4_request *r,
                       ds4_req_error *e);
int ds4_request_decode_for(ds4_api api, const struct ds4_chat_spec *chat, const char *body, size_t len,
                           ds4_request *r, ds4_req_error *e);
/* r->chat, or the default spec for a request built without one. */
const struct ds4_chat_spec *ds4_request_chat(const ds4_request *r);
void ds4_request_free(ds4_request *r);

/* A lower bound on the prompt a request renders to, for rejecting what
 * cannot fit the context before any tokenizing: the bytes of its client
 * text (chat families: message contents and tool schemas, which
 * the ds4-server prompt contains verbatim or escaped longer; completions: the longest
 * string prompt, each prompt being checked alone), and in *max_ids the
 * longest token-id prompt. */
size_t ds4_request_text_bytes(const ds4_request *r, int *max_ids);

/* True when s[0..n) is valid UTF-8 (no overlongs, surrogates or > U+10FFFF). */
bool ds4_utf8_valid(const char *s, size_t n);

#endif
