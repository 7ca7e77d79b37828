/* agent/loop.h -- the ds4-agent conversation: one live engine session whose
 * token list *is* the transcript, and the turn loop (prefill, generate,
 * parse the model's tool calls as they stream, run the tools, append the
 * results, generate again) and compaction.
 *
 * Contract
 * - The chat format is the loaded model family's (ds4_engine_chat():
 *   renderer profile, tail renderer, tool-call parser); nothing here names
 *   a family, so DeepSeek V4 and GLM 5.2 files run the same loop.
 * - The transcript is token-level and append-only: the first step renders
 *   the whole prompt (tools block, system prompt, the user message,
 *   generation prompt) with ds4_chat_render; every later step appends only
 *   the family's tail after the live assistant message (DeepSeek: the EOS
 *   that closes it, "<｜User｜>" + the user text or the tool results as
 *   "<tool_result>...</tool_result>", then "<｜Assistant｜>" + "<think>" or
 *   "</think>"; GLM: "<|user|>" or "<|observation|><tool_response>...",
 *   then "<|assistant|>" + the think tag). The sampled tokens are decoded
 *   into the session as they are sampled and are never re-rendered, so the
 *   KV state always holds exactly what the model wrote, and the text equals
 *   ds4_chat_render of the same conversation.
 * - Client text (user prompts, tool results, file contents, the system
 *   prompt) is tokenized as text (ds4_chat_encode with client spans):
 *   typing "<｜User｜>" cannot forge a turn. Only the template's own
 *   markers are special tokens.
 * - A model message that ends in a complete tool-call block stops there;
 *   the calls run in order and their results go back as one tool-result
 *   turn. Malformed DSML becomes an error tool result and the model tries
 *   again. Up to max_steps tool rounds per user turn.
 * - Tool results never wedge the session: room for the next answer is kept
 *   (max_gen_tokens, at most a quarter of the context), and one round's
 *   results share at most half of the rest. A longer result keeps its head
 *   and tail at token boundaries with a marker saying how many tokens and
 *   bytes were cut; when too little is left it becomes a short note; and
 *   results that still do not fit are dropped (the user is told), never
 *   left pending to fail the next turns.
 * - Ctrl+C (*interrupted) stops prefill (the session is rewound to the
 *   start of that prefill: the step did not happen), generation (the
 *   message keeps what was written) or a running tool (its result says so
 *   and is sent with the next user message). The session stays consistent.
 * - Scripted mode: sampled tokens come from the script entry (tokenized
 *   with chat specials) and are decoded one by one like sampled ones; the
 *   prefill of everything else is real.
 * - Compaction: when a prefill (a message, a round of results) would take
 *   the session past compact_percent of the context, or before a round's
 *   tools run when it already is, or on ds4_agent_compact(): the session is
 *   saved to sessions_dir, the model writes a summary (thinking off, at most
 *   an eighth of the context), and the session is rebuilt as the prompt, one
 *   user message holding the summary, and the last messages' tokens as they
 *   were (from the earliest message start whose tail fits in a quarter of
 *   the context; at least the last one); it gets a new id. A failed or
 *   interrupted summary leaves the conversation as it was. After an
 *   automatic compaction the next automatic one waits until the session
 *   has grown by an eighth of the context.
 * - Counters: every token in the session was restored from a payload,
 *   prefilled or decoded exactly once (restored + prefilled + decoded ==
 *   n_tokens); the trace file gets one line per prefill and generation.
 */
#ifndef DS4_AGENT_LOOP_H
#define DS4_AGENT_LOOP_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "text/chat.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "agent/display.h"
#include "base/turn_script.h"
#include "agent/store.h"
#include "agent/tools.h"

typedef struct {
    ds4_engine *engine;
    int ctx;
    ds4_think_mode think;
    ds4_sampler_params sampling;
    ds4_spec *spec;                  /* speculative decoding's drafter, or NULL */
    int max_gen_tokens;              /* per assistant message */
    int max_steps;                   /* tool rounds per user turn */
    const char *system_prompt;       /* NULL: the built-in one */
    const char *sessions_dir;        /* where compaction saves the old session; NULL: not saved */
    int compact_percent;             /* compact when a step would fill more than this; 0: never */
    ds4_agent_tools_opts tools;
    ds4_turn_script *script;         /* NULL: sample from the model */
    FILE *trace;                     /* may be NULL */
    volatile sig_atomic_t *interrupted;
    ds4_agent_display *display;
} ds4_agent_opts;

typedef struct ds4_agent ds4_agent;

typedef struct {
    int n_tokens, ctx;
    long long prefilled, decoded;    /* since the last reset or switch */
    int restored;                    /* tokens the last switch loaded from a payload */
    int last_prefill_from, last_prefill_n;
} ds4_agent_stats;

ds4_agent *ds4_agent_new(const ds4_agent_opts *o, char *err, size_t errlen);
void ds4_agent_free(ds4_agent *a);

/* One user message and everything the model does until it answers.
 * 0 done, 1 interrupted, -1 error (printed). */
int ds4_agent_turn(ds4_agent *a, const char *user_text);
/* Summarises the conversation with the model and continues in a new
 * session made of the summary and the last messages (the old one is saved
 * to sessions_dir first). 0 done, 1 interrupted, -1 not done (printed; the
 * conversation is unchanged unless the new session's prefill failed, which
 * leaves an empty session and names the saved one). */
int ds4_agent_compact(ds4_agent *a);
/* Forget the conversation: empty session, a new id at the next prompt. */
void ds4_agent_reset(ds4_agent *a);
void ds4_agent_set_think(ds4_agent *a, ds4_think_mode m);
/* The conversation's last n messages, one line each ("user: ...",
 * "assistant: ..." with the answer after the reasoning and "[tool calls]"
 * when it called tools, "tool: <tool_result>..."), decoded from the
 * session's tokens and cut to 160 bytes. */
void ds4_agent_history(const ds4_agent *a, int n, FILE *out);

/* "" until the first user message. */
const char *ds4_agent_id(const ds4_agent *a);
void ds4_agent_stats_get(const ds4_agent *a, ds4_agent_stats *st);
const ds4_session *ds4_agent_session(const ds4_agent *a);

int ds4_agent_save(ds4_agent *a, const char *dir, char *err, size_t errlen);
/* Replaces the conversation with a saved one: a full session resumes from
 * its payload, a stripped one re-prefills its text (progress bar, Ctrl+C
 * leaves an empty session). 0, 1 interrupted, -1 err. */
int ds4_agent_switch(ds4_agent *a, const char *dir, const char *id, char *err, size_t errlen);

#endif
