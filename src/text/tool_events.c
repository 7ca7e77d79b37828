/* tool_events.c -- see tool_events.h. */
#include "text/tool_events.h"
#include "base/textscan.h"

#include <string.h>

static const char THINK_OPEN[] = "<think>";
static const char THINK_CLOSE[] = "</think>";

void ds4_tool_events_init(ds4_tool_events *e, ds4_dsml_event_fn fn, void *ud) {
    memset(e, 0, sizeof *e);
    e->fn = fn;
    e->ud = ud;
}

void ds4_tool_events_free(ds4_tool_events *e) {
    ds4_buf_free(&e->raw);
    ds4_buf_free(&e->pend);
}

bool ds4_tool_events_append(ds4_tool_events *e, const char *s, size_t n) {
    ds4_buf_put(&e->raw, s, n);
    return !e->raw.oom;
}

void ds4_tool_events_flush(ds4_tool_events *e) {
    if (!e->has_pend) return;
    e->has_pend = false;
    ds4_dsml_event ev = { .kind = e->pend_kind, .text = e->pend.data, .len = e->pend.len, .index = e->call };
    e->fn(e->ud, &ev);
    ds4_buf_clear(&e->pend);
}

void ds4_tool_events_text(ds4_tool_events *e, ds4_dsml_event_kind kind, const char *s, size_t n) {
    if (!n) return;
    if (e->has_pend && e->pend_kind != kind) ds4_tool_events_flush(e);
    e->has_pend = true;
    e->pend_kind = kind;
    ds4_buf_put(&e->pend, s, n);
}

void ds4_tool_events_emit(ds4_tool_events *e, ds4_dsml_event ev) {
    ds4_tool_events_flush(e);
    e->fn(e->ud, &ev);
}

void ds4_tool_events_error(ds4_tool_events *e, const char *msg) {
    ds4_tool_events_emit(e, (ds4_dsml_event){ .kind = DS4_DSML_EV_ERROR, .message = msg,
                                              .text = e->raw.data ? e->raw.data : "", .len = e->raw.len,
                                              .index = e->call });
}

bool ds4_tool_events_reasoning(ds4_tool_events *e, const char *s, size_t n, bool eof) {
    if (!e->think_skipped) {
        enum ds4_scan_match m = ds4_scan_match(s, n, THINK_OPEN);
        if (m == DS4_SCAN_PARTIAL && !eof) return false;
        e->think_skipped = true;
        if (m == DS4_SCAN_FULL) {
            e->pos += strlen(THINK_OPEN);
            s += strlen(THINK_OPEN);
            n -= strlen(THINK_OPEN);
        }
    }
    size_t k = ds4_scan_find(s, n, THINK_CLOSE);
    if (k <= n) {
        ds4_tool_events_text(e, DS4_DSML_EV_REASONING, s, k);
        ds4_tool_events_emit(e, (ds4_dsml_event){ .kind = DS4_DSML_EV_REASONING_END });
        e->pos += k + strlen(THINK_CLOSE);
        return true;
    }
    size_t keep = eof ? n : ds4_scan_utf8_cut(s, n - ds4_scan_partial_suffix(s, n, THINK_CLOSE));
    ds4_tool_events_text(e, DS4_DSML_EV_REASONING, s, keep);
    e->pos += keep;
    return false;
}
