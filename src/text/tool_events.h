/* tool_events.h -- the machinery both incremental tool-call parsers (dsml.c
 * for DeepSeek's DSML, glm_tools.c for GLM) share: the raw input they keep,
 * coalesced text events, error reports and the reasoning channel.
 *
 * Contract
 * - raw holds every byte fed so far; a parser consumes it from pos and
 *   leaves undecided bytes unconsumed (what makes any chunking give the same
 *   events).
 * - Text events (REASONING, CONTENT, ARGS) of one kind are coalesced until
 *   another event or ds4_tool_events_flush(); every event carries `call`,
 *   the index of the call being parsed.
 * - ds4_tool_events_error() reports ERROR with the message and all raw input.
 * - ds4_tool_events_reasoning() is the reasoning channel a thinking turn
 *   starts in: it skips one leading "<think>" and delivers reasoning up to
 *   the first "</think>" (emitting REASONING_END), never splitting UTF-8
 *   and holding back a possible "<think>" or "</think>" prefix until eof.
 *   It returns true once "</think>" is consumed (content follows), false
 *   when it needs more input.
 */
#ifndef DS4_TOOL_EVENTS_H
#define DS4_TOOL_EVENTS_H

#include <stdbool.h>
#include <stddef.h>

#include "text/dsml.h"

typedef struct {
    ds4_dsml_event_fn fn;
    void *ud;
    ds4_buf raw;
    size_t pos;
    int call;
    ds4_buf pend;
    ds4_dsml_event_kind pend_kind;
    bool has_pend;
    bool think_skipped;   /* the leading "<think>" question is settled */
} ds4_tool_events;

void ds4_tool_events_init(ds4_tool_events *e, ds4_dsml_event_fn fn, void *ud);
void ds4_tool_events_free(ds4_tool_events *e);
/* Appends fed bytes; false when out of memory. */
bool ds4_tool_events_append(ds4_tool_events *e, const char *s, size_t n);
void ds4_tool_events_text(ds4_tool_events *e, ds4_dsml_event_kind kind, const char *s, size_t n);
void ds4_tool_events_flush(ds4_tool_events *e);
void ds4_tool_events_emit(ds4_tool_events *e, ds4_dsml_event ev);
void ds4_tool_events_error(ds4_tool_events *e, const char *msg);

bool ds4_tool_events_reasoning(ds4_tool_events *e, const char *s, size_t n, bool eof);

#endif
