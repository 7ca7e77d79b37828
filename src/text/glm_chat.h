/* glm_chat.h -- the GLM chat format: the renderer behind chat.h's GLM
 * profiles, and the protocol strings (glm-5.2-model.md 7.1-7.5).
 *
 * Contract
 * - DS4_CHAT_GLM47 renders exactly what the official zai-org GLM-4.7 Jinja
 *   template renders under Hugging Face's settings (trim_blocks,
 *   lstrip_blocks, tojson ensure_ascii=False), for the conversations chat.h
 *   can hold: "[gMASK]<sop>", the tools system block (each tool as
 *   {"type": "function", "function": SCHEMA} in Python json.dumps style),
 *   <|system|> / <|user|> / <|assistant|> turns, one <|observation|> per
 *   run of tool results each as <tool_response>..</tool_response>, the
 *   assistant's reasoning (reasoning_content, else the text between the
 *   last <think> and the first </think> of its content) kept as
 *   <think>R.strip()</think> after the last user message or when
 *   drop_thinking is false (clear_thinking=false), else "</think>"; content
 *   Python-strip()ped; calls as <tool_call>NAME<arg_key>K</arg_key>
 *   <arg_value>V</arg_value>..</tool_call>; and with add_generation_prompt
 *   "<|assistant|>" + "<think>" (thinking) or "</think>" (think NONE).
 * - DS4_CHAT_GLM (GLM-5.2) applies only the documented 5.2 deltas: with
 *   thinking, "<|system|>Reasoning Effort: High|Max" (think HIGH / MAX)
 *   right after "[gMASK]<sop>"; "<think></think>" wherever 4.7 writes a
 *   lone "</think>" (dropped reasoning, thinking-off generation prompt).
 * - Differences from the template, by design: a developer message renders
 *   as a system turn (the template drops it); a NULL content renders empty
 *   (the template would print "None"); replayed calls (o->replay, every id
 *   of the message mapped to one block) are written as sampled.
 * - Tool-call arguments must be a JSON object (the template iterates
 *   .items()); otherwise, or for a call without a name, rendering fails
 *   with one line in err.
 * - Client text (contents, reasoning, results, tool schemas, call names,
 *   keys and values) is recorded in o->client_spans as for DS4.
 */
#ifndef DS4_GLM_CHAT_H
#define DS4_GLM_CHAT_H

#include "text/chat.h"
#include "text/tokenizer.h"

/* The calls of one assistant message as the template writes them
 * (spans: client text ranges, may be NULL). */
bool ds4_glm_render_calls(const ds4_tool_call *calls, int n, ds4_buf *out, ds4_chat_spans *spans,
                          char *err, size_t errlen);

/* The continuation of a live assistant turn that the model ended with a
 * stop token (which the session does not hold): the user and tool messages
 * of msgs[0..n) exactly as ds4_chat_render writes them after an assistant
 * message (an <|observation|> opens each run of results; other roles are
 * skipped), then the generation prompt for o->think. */
void ds4_glm_chat_render_tail(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o, ds4_buf *out);

/* What a client replays for the thinking turn just sampled once its
 * reasoning is dropped (the next user message makes it historical):
 * prompt (ending "<think>") with "<think></think>" in place of "<think>"
 * (GLM-5.2; GLM47: "</think>"), then content Python-strip()ped, then the
 * exact tool-call text. */
void ds4_glm_chat_visible_turn(const char *prompt, size_t prompt_len, const char *content, size_t content_len,
                               const char *calls, size_t calls_len, ds4_chat_profile profile, ds4_buf *out);

#endif
