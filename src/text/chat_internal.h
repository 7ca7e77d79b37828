/* chat_internal.h -- what the chat renderers (chat.c: DeepSeek V4,
 * glm_chat.c: GLM) share. Not a public API: other modules use chat.h.
 *
 * Contract
 * - ds4_chat_put_text() appends s[0..n) and records it as a client span
 *   (o->client_spans, when set).
 * - ds4_chat_replay_block() is the exact sampled tool-call text remembered
 *   for every call id of an assistant message (o->replay), when all ids map
 *   to the same block; NULL otherwise.
 * - ds4_chat_tool_json() is the tool's JSON object text: t->json, or one
 *   composed into tmp from name / description / parameters.
 * - ds4_chat_fail() writes one formatted line (one %d) to err, returns false.
 */
#ifndef DS4_CHAT_INTERNAL_H
#define DS4_CHAT_INTERNAL_H

#include "text/chat.h"

void ds4_chat_put_text(const ds4_chat_opts *o, ds4_buf *out, const char *s, size_t n);
const char *ds4_chat_replay_block(const ds4_chat_msg *m, const ds4_chat_opts *o);
const char *ds4_chat_tool_json(const ds4_tool_def *t, ds4_buf *tmp);
bool ds4_chat_fail(char *err, size_t errlen, const char *fmt, int i);

/* The GLM profiles (glm_chat.c); think is the mode as requested. */
bool ds4_glm_chat_render(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o,
                         ds4_buf *out, char *err, size_t errlen);

#endif
