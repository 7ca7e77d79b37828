/* chat.h -- the chat templates: a plain C conversation model rendered to the
 * exact prompt text, for DeepSeek V4 (deepseek-v4-prompt-format.md sections
 * 4-6, 8, 9) and, through the GLM profiles, GLM (glm_chat.h).
 *
 * Contract
 * - Input is a list of messages (system, developer, user, assistant, tool)
 *   plus the request-level tool definitions; output is the prompt *text*
 *   appended to a ds4_buf. Tokenising it (special strings) is the
 *   tokenizer's job, not the renderer's: user text is copied as given.
 * - DS4_CHAT_GLM / DS4_CHAT_GLM47 render GLM's format (glm_chat.h states
 *   that contract; the Think Max context rule does not apply to them).
 * - Two DeepSeek profiles, byte-exact against the sheet's worked examples E1-E7:
 *   DS4_CHAT_OFFICIAL reproduces DeepSeek's official encoder (request tools
 *     attached to message 0 when it is a system message, else to an empty
 *     system message inserted in front, as SGLang/vLLM do; developer = user
 *     turn; consecutive user/tool messages merged into one turn with "\n\n";
 *     tool results sorted by call order; drop_thinking disabled when tools
 *     are present; schema lines re-serialised Python style).
 *   DS4_CHAT_DS4 reproduces ds4-server (tools block first, then all
 *     system/developer text hoisted; raw schema bytes; one <｜User｜> per
 *     user message; consecutive tool results share one turn in client
 *     order; "</tool_result>" inside results escaped; reasoning kept when
 *     any tool context exists; canonical DSML or exact replay for calls).
 *   The full list of differences is deepseek-v4-prompt-format.md 6.6.
 * - Thinking: NONE ends a generation prompt with "<｜Assistant｜></think>",
 *   HIGH with "<｜Assistant｜><think>", MAX = HIGH + the reasoning-effort
 *   preamble after BOS. MAX is demoted to HIGH when opts.ctx > 0 and
 *   opts.ctx < DS4_THINK_MAX_MIN_CTX (ds4's rule; ctx <= 0 = not enforced).
 * - A generation prompt is added after a trailing user/tool (and official
 *   developer) turn when add_generation_prompt is set; a conversation that
 *   ends with an assistant message ends with EOS either way.
 * - Assistant tool calls: when `replay` is set and returns the same
 *   non-NULL block for every call id of a message, those exact bytes are
 *   rendered (ds4 exact-DSML replay); otherwise the profile's canonical
 *   JSON -> DSML form (dsml.h) is rendered.
 * - Errors (unknown role or profile, a tool call without a name, invalid
 *   schema JSON in the OFFICIAL profile, out of memory) return false with
 *   one line in err; out may then hold a partial prompt.
 * - Client text: with opts.client_spans set, the renderer records the byte
 *   ranges that hold client-supplied text (system/developer/user contents,
 *   reasoning, assistant contents, tool results, tool schemas, and the
 *   names, argument keys and values of prior tool calls rendered inside the
 *   template's own DSML markup), and ds4_chat_encode() tokenizes a special
 *   string inside them as ordinary text, so a pasted document cannot forge
 *   turns or tool calls. An exact-DSML replay block (the model's own sampled
 *   text) is not client text.
 * - Not supported (official-only features): latest_reminder, quick-
 *   instruction tasks, response_format, wo_eos, context continuation.
 */
#ifndef DS4_CHAT_H
#define DS4_CHAT_H

#include <stddef.h>
#include <stdbool.h>
#include "base/json_util.h"
#include "text/dsml.h"

#define DS4_STR_BOS          "<｜begin▁of▁sentence｜>"
#define DS4_STR_EOS          "<｜end▁of▁sentence｜>"
#define DS4_STR_USER         "<｜User｜>"
#define DS4_STR_ASSISTANT    "<｜Assistant｜>"
#define DS4_STR_THINK_OPEN   "<think>"
#define DS4_STR_THINK_CLOSE  "</think>"
#define DS4_STR_DSML         "｜DSML｜"

/* Think Max needs at least 384 Ki tokens of context (model card; ds4). */
#define DS4_THINK_MAX_MIN_CTX 393216

typedef enum {
    DS4_ROLE_SYSTEM, DS4_ROLE_DEVELOPER, DS4_ROLE_USER, DS4_ROLE_ASSISTANT, DS4_ROLE_TOOL,
} ds4_chat_role;

typedef struct {
    ds4_chat_role role;
    const char *content;            /* NULL = empty */
    const char *reasoning_content;  /* assistant; NULL = none */
    const ds4_tool_call *tool_calls;/* assistant */
    int n_tool_calls;
    const char *tool_call_id;       /* tool */
} ds4_chat_msg;

/* A tool definition. `json` is the schema object as the client sent it
 * (OpenAI: the `function` value; Anthropic: the whole tool object): the DS4
 * profile copies it byte for byte, the OFFICIAL profile re-serialises it.
 * When json is NULL the object {"name","description","parameters"} is built
 * from the other fields (description and parameters may be NULL = omitted;
 * parameters is JSON text). */
typedef struct {
    const char *name;
    const char *description;
    const char *parameters;
    const char *json;
} ds4_tool_def;

typedef enum { DS4_THINK_NONE, DS4_THINK_HIGH, DS4_THINK_MAX } ds4_think_mode;
/* GLM: GLM-5.2 (the official GLM-4.7 template plus the documented 5.2
 * deltas); GLM47: the official GLM-4.7 template itself (glm_chat.h). */
typedef enum { DS4_CHAT_OFFICIAL, DS4_CHAT_DS4, DS4_CHAT_GLM, DS4_CHAT_GLM47 } ds4_chat_profile;

/* Exact-DSML replay lookup: the sampled block (from its leading "\n\n"
 * through "</｜DSML｜tool_calls>") remembered for a tool-call id, or NULL. */
typedef const char *(*ds4_dsml_replay_fn)(void *ud, const char *tool_call_id);

/* Byte ranges [start, end) of a rendered prompt, in rendering order. */
typedef struct { size_t start, end; } ds4_chat_span;
typedef struct { ds4_chat_span *v; size_t n, cap; bool oom; } ds4_chat_spans;
void ds4_chat_spans_free(ds4_chat_spans *s);
/* Appends [start, end) (NULL s: nothing); an allocation failure sets oom. */
void ds4_chat_spans_add(ds4_chat_spans *s, size_t start, size_t end);

typedef struct {
    ds4_chat_profile profile;
    ds4_think_mode think;
    int ctx;                       /* context size for the Think Max rule; <= 0: unchecked */
    bool drop_thinking;            /* official drop_thinking (default true); DS4 ignores it */
    bool add_generation_prompt;    /* default true */
    const ds4_tool_def *tools;     /* active request tools (none when tool_choice is "none") */
    int n_tools;
    ds4_dsml_replay_fn replay;     /* DS4 profile only; NULL = canonical only */
    void *replay_ud;
    ds4_chat_spans *client_spans;  /* NULL = not recorded; appended to, never cleared */
} ds4_chat_opts;

/* profile DS4, think HIGH, ctx 0, drop_thinking, add_generation_prompt, no tools */
void ds4_chat_opts_default(ds4_chat_opts *o);

/* The profile a model's vocabulary speaks: GLM for a GLM tokenizer family,
 * else the ds4-server DeepSeek profile. */
struct ds4_tokenizer;
ds4_chat_profile ds4_chat_profile_for(const struct ds4_tokenizer *t);

/* The mode actually rendered: MAX -> HIGH when 0 < ctx < DS4_THINK_MAX_MIN_CTX. */
ds4_think_mode ds4_chat_effective_think(ds4_think_mode m, int ctx);

bool ds4_chat_render(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o,
                     ds4_buf *out, char *err, size_t errlen);

/* Tokenizes text[from..to) of a rendered prompt: the chat special strings
 * (DS4_TOK_SPECIALS_CHAT, the tokenizer family's set: GLM's for a GLM
 * vocabulary) become protocol tokens except where they overlap
 * a client span (offsets in text; NULL = none), where they stay text. With
 * no such overlap the ids equal ds4_tokenizer_encode(SPECIALS_CHAT) of the
 * same bytes. Returns 0, or -1 when out of memory. */
struct ds4_token_ids;
int ds4_chat_encode(const struct ds4_tokenizer *t, const char *text, size_t from, size_t to,
                    const ds4_chat_spans *client, struct ds4_token_ids *out);

/* "<tool_result>" + content + "</tool_result>" as the profile writes it
 * (DS4 escapes "</tool_result>" inside as "&lt;/tool_result>"). Servers use it
 * to build Anthropic user content where results and text blocks interleave. */
void ds4_chat_tool_result(const char *content, size_t n, ds4_chat_profile profile, ds4_buf *out);

/* The ds4 tools block (DS4 profile) or the official one, for the given
 * tools, exactly as ds4_chat_render inserts it. False on invalid schema JSON
 * (official profile only; DS4 copies bytes unchecked). */
bool ds4_chat_tools_block(const ds4_tool_def *tools, int n, ds4_chat_profile profile,
                          ds4_buf *out, char *err, size_t errlen);

#endif
