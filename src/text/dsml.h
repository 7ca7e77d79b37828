/* dsml.h -- DeepSeek V4 DSML tool calls: the incremental output parser and
 * the JSON <-> DSML conversions (deepseek-v4-prompt-format.md 5.3-5.5, 6.3,
 * 7.1-7.2; server-api.md 4.4.1, 10.4).
 *
 * Contract: the parser
 * - ds4_dsml_parser consumes the model's generated text (everything after
 *   the prompt) in chunks of any size, including single bytes, and reports
 *   what it recognised through a callback. Feeding the same bytes in any
 *   chunking yields the same event sequence once consecutive text events of
 *   the same kind are concatenated (text events are coalesced within one
 *   ds4_dsml_feed call only), except for an ERROR's raw text, which is
 *   whatever had been fed when the error was detected.
 * - Channels: with `thinking` the text starts as reasoning (one leading
 *   "<think>" is skipped) until the first "</think>"; afterwards, or from the
 *   start without `thinking`, it is content. Reasoning is never scanned for
 *   tool calls.
 * - With `tools`, content is scanned for a tool-call block. Accepted tag
 *   families, in the order ds4 prefers them: "<｜DSML｜tool_calls>",
 *   "<DSML｜tool_calls>" (first bar lost) and "<tool_calls>" (plain tags);
 *   the opening tag fixes the family of every inner tag. White space between
 *   elements is skipped; `string` is optional on a parameter (absent = string).
 * - Text events never split a UTF-8 sequence and never deliver bytes that
 *   may still turn out to be markup: in reasoning a possible "</think>"
 *   prefix is held back; in content (with tools) trailing white space and a
 *   possible block-opening-tag prefix are held back, and the white space
 *   directly before a block is never delivered (content is right-trimmed).
 *   ds4_dsml_finish() releases whatever is still held back.
 * - Arguments: each call's ARGS deltas concatenate to its JSON object text:
 *   "{", then per parameter ["," ] "\"key\":" and either a JSON string
 *   (value entity-decoded when decode_entities, then JSON-escaped) or the
 *   minified JSON value, then "}". CALL_END carries the same text, or "{}"
 *   with args_valid = false when a string="false" value was not valid JSON
 *   (the deltas were already sent; the caller should prefer CALL_END).
 * - BLOCK_END carries the exact raw block bytes for exact-DSML replay: from
 *   the "\n\n" directly before the opening tag (when present) through the
 *   closing "</...tool_calls>". After it the parser is done: further white
 *   space is ignored, anything else is an error.
 * - Errors (unknown tag, missing name, over-long tag, text after the block,
 *   a block still open at finish) emit one ERROR event with a one-line
 *   message and the complete raw text fed so far; the parser then ignores
 *   further input. Never crashes, whatever the input.
 * - ds4_dsml_in_structure() tells the sampler whether the *next* token is
 *   protocol structure (greedy) or payload (normal sampling): true inside
 *   a block's tags, the white space between them, partial closing tags, and a
 *   string="false" value outside JSON string literals; false in reasoning,
 *   content, string="true" bodies and JSON string literals.
 *
 * Contract: conversions
 * - ds4_dsml_render_calls() renders a tool_calls block (leading "\n\n"
 *   included, no trailing newline) from JSON calls, in one of two styles:
 *   OFFICIAL (official encoder: no escaping, non-strings re-serialised
 *   Python style, zero-argument call has an empty line, invalid arguments
 *   -> one string parameter "arguments") or DS4 (ds4-server canonical form:
 *   minified non-strings, attribute-escaped names, closing-parameter-tag
 *   escapes, duplicates kept, no empty line for zero-argument calls).
 *   The _marked form reports which output ranges came from the calls
 *   (client text), so a renderer tokenizes them as plain text.
 * - ds4_dsml_parse_block() parses complete generated text (or a block) into
 *   calls with the same rules as the streaming parser.
 */
#ifndef DS4_DSML_H
#define DS4_DSML_H

#include <stddef.h>
#include <stdbool.h>
#include "base/json_util.h"

/* One tool call as clients send it: arguments is the JSON object text. */
typedef struct {
    const char *id;          /* may be NULL */
    const char *name;
    const char *arguments;   /* JSON text; NULL is rendered as "{}" */
} ds4_tool_call;

typedef enum {
    DS4_DSML_EV_REASONING,      /* text: a reasoning delta */
    DS4_DSML_EV_REASONING_END,  /* "</think>" consumed */
    DS4_DSML_EV_CONTENT,        /* text: a visible-content delta */
    DS4_DSML_EV_BLOCK_START,    /* opening tool_calls tag consumed */
    DS4_DSML_EV_CALL_START,     /* index, name */
    DS4_DSML_EV_PARAM_START,    /* index, name (parameter key), is_string */
    DS4_DSML_EV_ARGS,           /* index, text: arguments JSON fragment */
    DS4_DSML_EV_PARAM_END,      /* index, name, is_string, text: raw value */
    DS4_DSML_EV_CALL_END,       /* index, name, text: arguments, args_valid */
    DS4_DSML_EV_BLOCK_END,      /* text: the exact raw block bytes */
    DS4_DSML_EV_ERROR,          /* message, text: all raw input so far */
} ds4_dsml_event_kind;

typedef struct {
    ds4_dsml_event_kind kind;
    const char *text; size_t len;   /* not NUL-terminated; valid during the callback */
    int index;                      /* call index within the block, from 0 */
    const char *name;               /* NUL-terminated, decoded */
    bool is_string;
    bool args_valid;
    const char *message;            /* ERROR only */
} ds4_dsml_event;

typedef void (*ds4_dsml_event_fn)(void *ud, const ds4_dsml_event *ev);

typedef struct {
    bool thinking;          /* output starts in the reasoning channel */
    bool tools;             /* look for tool-call blocks in content */
    bool decode_entities;   /* ds4: &amp; &lt; &gt; &quot; &apos; in names and string bodies */
} ds4_dsml_opts;

typedef struct ds4_dsml_parser ds4_dsml_parser;

ds4_dsml_parser *ds4_dsml_new(const ds4_dsml_opts *o, ds4_dsml_event_fn fn, void *ud);
void ds4_dsml_free(ds4_dsml_parser *p);
void ds4_dsml_feed(ds4_dsml_parser *p, const char *s, size_t n);
/* End of generation: flushes held-back text; a block that is still open
 * becomes an ERROR ("unterminated tool call"). */
void ds4_dsml_finish(ds4_dsml_parser *p);

bool ds4_dsml_in_structure(const ds4_dsml_parser *p);
bool ds4_dsml_in_reasoning(const ds4_dsml_parser *p);
bool ds4_dsml_block_open(const ds4_dsml_parser *p);  /* a block started, not closed */
bool ds4_dsml_done(const ds4_dsml_parser *p);        /* block closed: stop generating */
bool ds4_dsml_failed(const ds4_dsml_parser *p);

typedef enum { DS4_DSML_OFFICIAL, DS4_DSML_DS4 } ds4_dsml_style;

/* Appends the block to out. False (with a one-line err) only for a call
 * without a name; invalid arguments use the "arguments" fallback. */
bool ds4_dsml_render_calls(const ds4_tool_call *calls, int n, ds4_dsml_style style,
                           ds4_buf *out, char *err, size_t errlen);
/* A byte range [start, end) of the output that holds client text. */
typedef void (*ds4_dsml_mark_fn)(void *ud, size_t start, size_t end);
/* ds4_dsml_render_calls() reporting through mark (may be NULL) every range
 * it copies from the calls: names, parameter keys and values (escaped as the
 * style escapes them). The rest is the block's own markup. */
bool ds4_dsml_render_calls_marked(const ds4_tool_call *calls, int n, ds4_dsml_style style, ds4_buf *out,
                                  ds4_dsml_mark_fn mark, void *mark_ud, char *err, size_t errlen);

/* A parsed call: malloc'ed strings, freed by ds4_dsml_result_free(). */
typedef struct {
    char *name;
    char *arguments;   /* compact JSON object text ("{}" when invalid) */
    bool args_valid;
} ds4_dsml_call;

typedef struct {
    ds4_dsml_call *calls; int n_calls;
    char *reasoning;   /* NULL when the text had no reasoning channel */
    char *content;     /* visible content, right-trimmed before a block */
    char *raw_block;   /* NULL when no complete block */
    char *error;       /* NULL on success */
} ds4_dsml_result;

/* Parses a complete generation in one go (same rules as the parser). */
void ds4_dsml_parse(const ds4_dsml_opts *o, const char *s, size_t n, ds4_dsml_result *r);
void ds4_dsml_result_free(ds4_dsml_result *r);

#endif
