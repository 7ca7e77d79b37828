/* glm_tools.h -- GLM tool calls in model output: the incremental parser
 * (glm-5.2-model.md 7.2, 7.6); glm_chat.h renders calls into prompts.
 *
 * The GLM call syntax is
 *   <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>
 * repeated for parallel calls; the model then ends its turn with the stop
 * token <|observation|>, which the generation loop consumes (never fed here).
 *
 * Contract: the parser
 * - Same event interface as dsml.h (ds4_dsml_event), so the server streams
 *   GLM and DSML calls through one path. Feeding the same bytes in any
 *   chunking yields the same events once consecutive text events of one
 *   kind are concatenated (ERROR's raw text excepted, as in dsml.h).
 * - Channels: with `thinking` the text is reasoning (one leading "<think>"
 *   skipped) until the first "</think>", then content. Reasoning is never
 *   scanned for calls. With `tools`, content is scanned for "<tool_call>";
 *   content white space directly before the first call is dropped, and a
 *   possible tag prefix or trailing white space is held back until decided.
 * - Tags match only when complete: "</" that turns out to start
 *   "</arg_value>" or "</tool_call>" is decided by the bytes after it, so a
 *   key or value may contain any text except its own closing tag. White
 *   space around names, keys and between tags is skipped.
 * - Events per call: BLOCK_START before the first call; CALL_START (name)
 *   once the name is complete; ARGS fragments concatenating to the JSON
 *   object text; PARAM_START / PARAM_END per argument; CALL_END with the
 *   whole object (always valid JSON, args_valid true). A value is a JSON
 *   string when arg_type says STRING (its escaped bytes stream as they
 *   arrive); otherwise it is held until </arg_value> and becomes the
 *   minified JSON when it parses as JSON, else a JSON string of its bytes
 *   (vLLM's and llama.cpp's fallback for untyped or mistyped values).
 * - BLOCK_END (at ds4_glm_finish) carries the exact sampled bytes from the
 *   white space directly before the first "<tool_call>" (the bytes content
 *   loses to its right-trim) through the last "</tool_call>": rendered
 *   after the Python-strip()ped content, as the template writes a turn, it
 *   reproduces the sampled text for exact replay.
 * - Errors (empty name, text between or after calls that is not a call, an
 *   unknown tag inside a call, a tag longer than 4 KiB, a call still open at
 *   finish): one ERROR event with a one-line message and the raw text fed so
 *   far; later input is ignored. Never crashes, whatever the input.
 * - ds4_glm_in_structure(): true when the next token is protocol structure
 *   (names, keys, tags, between calls, a non-string value outside JSON
 *   string literals, a closing tag under way), false in reasoning, content
 *   and string values.
 */
#ifndef DS4_GLM_TOOLS_H
#define DS4_GLM_TOOLS_H

#include <stdbool.h>
#include <stddef.h>

#include "text/dsml.h"

#define DS4_GLM_TOOL_CALL_OPEN "<tool_call>"

typedef enum { DS4_GLM_ARG_UNKNOWN, DS4_GLM_ARG_STRING, DS4_GLM_ARG_OTHER } ds4_glm_arg_type;

/* How the parser learns an argument's schema type (tool name, key). */
typedef ds4_glm_arg_type (*ds4_glm_arg_type_fn)(void *ud, const char *tool, const char *key);

typedef struct {
    bool thinking;
    bool tools;
    ds4_glm_arg_type_fn arg_type;   /* NULL: every type unknown */
    void *arg_type_ud;
} ds4_glm_opts;

typedef struct ds4_glm_parser ds4_glm_parser;

ds4_glm_parser *ds4_glm_new(const ds4_glm_opts *o, ds4_dsml_event_fn fn, void *ud);
void ds4_glm_free(ds4_glm_parser *p);
void ds4_glm_feed(ds4_glm_parser *p, const char *s, size_t n);
void ds4_glm_finish(ds4_glm_parser *p);
bool ds4_glm_in_structure(const ds4_glm_parser *p);
bool ds4_glm_in_reasoning(const ds4_glm_parser *p);
bool ds4_glm_block_open(const ds4_glm_parser *p);   /* a call started */
bool ds4_glm_failed(const ds4_glm_parser *p);

/* The type of `key` in one tool's JSON definition: the function object
 * (OpenAI) or the tool object (Anthropic): parameters / input_schema ->
 * properties -> key -> type, where a type list counts as STRING when it
 * holds "string". UNKNOWN when the schema does not say. */
ds4_glm_arg_type ds4_glm_schema_arg_type(const char *tool_json, const char *key);

#endif
