/* chat_spec.h -- what a front end needs to speak one model family's chat
 * format: its renderer profile (chat.h), its tool-call parser, the model ids
 * it answers to, its protocol strings and thinking defaults. One spec per
 * family (dsv4_family.c, glm_family.c); the server reads every
 * family-dependent choice from here and never compares families.
 *
 * Contract
 * - ds4_chat_spec_for() picks the spec of a tokenizer's family (NULL
 *   tokenizer: the DeepSeek V4 spec, the default of a bare request decoder).
 * - Stop tokens are the tokenizer's (ds4_tokenizer_is_stop, by the same
 *   family), not listed here.
 * - The tool-call parser: every parser emits dsml.h's events; create returns
 *   NULL when out of memory; defs (the request's tool definitions, kept
 *   alive by the caller for the parser's life) give argument types to the
 *   formats that need them.
 * - ds4_chat_alias_thinking(): the DeepSeek API's model names that switch
 *   thinking ("deepseek-chat" off, "deepseek-reasoner" on), honoured whatever
 *   the served family, since clients pick them by name.
 */
#ifndef DS4_CHAT_SPEC_H
#define DS4_CHAT_SPEC_H

#include <stdbool.h>
#include <stddef.h>

#include "text/chat.h"
#include "text/dsml.h"

struct ds4_tokenizer;

typedef struct {
    bool thinking, tools;
    const ds4_tool_def *defs;
    int n_defs;
} ds4_tool_parser_opts;

typedef struct {
    void *(*create)(const ds4_tool_parser_opts *o, ds4_dsml_event_fn fn, void *ud);
    void (*free)(void *p);
    void (*feed)(void *p, const char *s, size_t n);
    void (*finish)(void *p);
    bool (*done)(const void *p);          /* the turn's output is complete or failed: stop feeding */
    bool (*in_reasoning)(const void *p);
    bool (*in_calls)(const void *p);      /* a call block started */
    bool (*in_structure)(const void *p);  /* the next token is protocol structure */
} ds4_tool_parser_ops;

typedef struct { const char *id, *display; } ds4_model_id;

typedef struct ds4_chat_spec {
    ds4_chat_profile profile;               /* the renderer (chat.h) */
    const ds4_model_id *models;             /* /v1/models; models[0].id: the default model */
    int n_models;
    const char *bos_token, *eos_token;      /* as tokenizer_config reports them */
    const char *add_special_prefix;         /* what add_special_tokens prepends; NULL: nothing */
    bool think_max_default;                 /* unset effort thinks at Max (else High) */
    bool tool_result_turn;                  /* tool results have a turn of their own (Anthropic
                                             * tool_result blocks become tool messages) */
    /* the mode rendered for a context of ctx tokens */
    ds4_think_mode (*effective_think)(ds4_think_mode m, int ctx);
    /* a tool result written inline into a user turn */
    void (*inline_tool_result)(const char *content, size_t n, ds4_buf *out);
    /* The continuation after a live assistant turn: the user and tool
     * messages after it and the generation prompt for o->think (client text
     * recorded in o->client_spans). */
    void (*render_tail)(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o, ds4_buf *out);
    /* What a client may replay for the thinking turn just sampled (prompt
     * ending "<think>"): out[0] and out[1] cleared, then each form filled
     * (out[1] left empty when the format has one form). */
    void (*visible_turns)(const char *prompt, size_t prompt_len, const char *content, size_t content_len,
                          const char *calls, size_t calls_len, ds4_buf out[2]);
    const ds4_tool_parser_ops *parser;
} ds4_chat_spec;

extern const ds4_chat_spec ds4_chat_spec_dsv4, ds4_chat_spec_glm;

const ds4_chat_spec *ds4_chat_spec_for(const struct ds4_tokenizer *t);
/* true with *thinking set when model is one of those aliases */
bool ds4_chat_alias_thinking(const char *model, bool *thinking);

#endif
