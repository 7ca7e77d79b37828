/* tool_evlog.h -- the event log the tool-call parser fuzz targets
 * (fuzz_dsml, fuzz_glm_tools) compare two chunkings with: text events of one
 * kind coalesced, every other event's fields verbatim, ERROR by message only
 * (its raw text depends on the chunking). */
#ifndef DS4_FUZZ_TOOL_EVLOG_H
#define DS4_FUZZ_TOOL_EVLOG_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/dsml.h"

typedef struct { ds4_buf log; int last; } tool_evlog;

static inline void tool_evlog_init(tool_evlog *l) {
    l->log = (ds4_buf){0};
    l->last = -1;
}

static inline void tool_evlog_add(tool_evlog *l, const ds4_dsml_event *ev) {
    bool text = ev->kind == DS4_DSML_EV_REASONING || ev->kind == DS4_DSML_EV_CONTENT || ev->kind == DS4_DSML_EV_ARGS;
    if (text && ev->len == 0) return;
    if (!(text && (int)ev->kind == l->last)) {
        char head[64];
        int n = snprintf(head, sizeof head, "\x1e%d|%d|%d|%d|", ev->kind, ev->index, ev->is_string, ev->args_valid);
        ds4_buf_put(&l->log, head, (size_t)n);
        if (ev->name) ds4_buf_puts(&l->log, ev->name);
        if (ev->message) ds4_buf_puts(&l->log, ev->message);
        ds4_buf_putc(&l->log, '|');
    }
    if (ev->kind != DS4_DSML_EV_ERROR && ev->text) ds4_buf_put(&l->log, ev->text, ev->len);
    l->last = text ? (int)ev->kind : -1;
}

/* Aborts unless both logs hold the same bytes; frees them. */
static inline void tool_evlog_same(tool_evlog *a, tool_evlog *b) {
    if (a->log.len != b->log.len || (a->log.len && memcmp(a->log.data, b->log.data, a->log.len) != 0)) abort();
    ds4_buf_free(&a->log);
    ds4_buf_free(&b->log);
}

#endif
