/* prefix.h -- the prompt planner: renders a chat-family request and decides
 * how much of the live session (or of the disk cache) the new prompt reuses,
 * tokenizing only what is new.
 *
 * Contract (worker thread only; it reads and updates the live-session memory
 * in `server`)
 * - ds4_srv_plan_prompt(): first hit wins: live tokens as an exact prefix of the new
 *   prompt's tokens; the visible transcript of the last thinking turn (what
 *   clients replay when reasoning is hidden or dropped); the live text (the
 *   decoded live tokens) as a byte prefix of the new prompt (only the byte
 *   suffix is tokenized); the disk cache's longest rendered prefix (restored
 *   into the session, only when the prompt fits the context: a prompt the
 *   caller will reject never replaces the live session); else the longest
 *   common token prefix.
 * - ds4_srv_plan_tool_tail(): trailing tool results that answer the live tool-call
 *   turn: only the tail (the chat spec's render_tail: what follows the live
 *   assistant turn, then the generation prompt) is rendered and tokenized
 *   after the live tokens.
 * - ds4_srv_remember_visible() records, after a thinking turn, the transcript a client
 *   will replay for it.
 */
#ifndef DS4_PREFIX_H
#define DS4_PREFIX_H

#include <stdbool.h>
#include <stddef.h>

#include "text/chat.h"
#include "models/chat_spec.h"
#include "server/server_state.h"

/* A rendered chat-family prompt: its text and where client text sits in it
 * (tokenized as plain text, chat.h). */
typedef struct {
    ds4_buf text;
    ds4_chat_spans client;
} srv_prompt;

void ds4_srv_prompt_free(srv_prompt *p);

typedef struct {
    ds4_token_ids toks;     /* the full prompt */
    int reuse;              /* tokens kept from the live session */
    const char *how;
} prompt_plan;

ds4_think_mode ds4_srv_effective_think(const server *s, const ds4_request *r);
/* The served model's chat spec (chat_spec.h), by its tokenizer. */
const ds4_chat_spec *ds4_srv_chat(const server *s);
/* Rendering in the served format (ds4_srv_chat); `replay` uses the tool-id map for
 * exact replay of sampled tool calls. false with err on failure. */
bool ds4_srv_render_prompt(server *s, const ds4_request *r, bool replay, srv_prompt *out, char *err, size_t errlen);
/* Tokens of prompt text[from..): template markers are protocol tokens,
 * client text never is. */
int ds4_srv_encode(server *s, const srv_prompt *prompt, size_t from, ds4_token_ids *out);

/* Whether every call id the request answers belongs to the live turn. */
bool ds4_srv_live_ids_match(server *s, const ds4_request *r);
/* prompt = live text + tail; -1 on tokenizer failure. */
int ds4_srv_plan_tool_tail(server *s, const ds4_request *r, srv_prompt *prompt, prompt_plan *p);
int ds4_srv_plan_prompt(server *s, const srv_prompt *prompt, prompt_plan *p);
void ds4_srv_remember_visible(server *s, const ds4_buf *prompt, const ds4_enc *enc);

#endif
