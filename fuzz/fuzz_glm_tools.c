/* fuzz_glm_tools.c -- the GLM tool-call parser and call rendering.
 * Input: byte 0 = parser options (bit 0 thinking, bit 1 tools, bits 2-3 how
 * argument types are answered) and chunking seed; the rest is fed as
 * generated text. Oracles beyond "no crash":
 *  - feeding in pseudo-random chunks gives the same events as one piece
 *    (text events coalesced, ERROR compared by message only);
 *  - every CALL_END carries valid JSON equal to its streamed ARGS;
 *  - the same bytes as tool-call arguments: when they are a JSON object
 *    whose text has no "</", the rendering parses back to exactly one call
 *    with that name and no error. */
#include "text/glm_chat.h"
#include "text/glm_tools.h"
#include "base/json_util.h"
#include "tool_evlog.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { tool_evlog events; ds4_buf streamed; } evlog;

static void on_event(void *ud, const ds4_dsml_event *ev) {
    evlog *l = ud;
    if (ev->kind == DS4_DSML_EV_CALL_START) ds4_buf_clear(&l->streamed);
    if (ev->kind == DS4_DSML_EV_ARGS) ds4_buf_put(&l->streamed, ev->text, ev->len);
    if (ev->kind == DS4_DSML_EV_CALL_END &&
        (!ds4_json_valid(ev->text, ev->len) || ev->len != l->streamed.len || memcmp(ev->text, l->streamed.data, ev->len)))
        abort();
    tool_evlog_add(&l->events, ev);
}

static ds4_glm_arg_type answer(void *ud, const char *tool, const char *key) {
    int mode = *(const int *)ud;
    if (mode == 3) return (strlen(tool) + strlen(key)) % 2 ? DS4_GLM_ARG_STRING : DS4_GLM_ARG_OTHER;
    return (ds4_glm_arg_type)mode;
}

static void parse(const ds4_glm_opts *o, const uint8_t *d, size_t n, uint32_t seed, evlog *l) {
    memset(l, 0, sizeof *l);
    tool_evlog_init(&l->events);
    ds4_glm_parser *p = ds4_glm_new(o, on_event, l);
    if (!p) abort();
    for (size_t i = 0; i < n;) {
        size_t k = seed ? 1 + (seed = seed * 1103515245u + 12345u) % 13 : n;
        if (k > n - i) k = n - i;
        ds4_glm_feed(p, (const char *)d + i, k);
        (void)ds4_glm_in_structure(p);
        i += k;
    }
    ds4_glm_finish(p);
    ds4_glm_free(p);
    ds4_buf_free(&l->streamed);
}

static void check_parser(const uint8_t *d, size_t n, uint8_t ctl) {
    int mode = ctl >> 2 & 3;
    ds4_glm_opts o = { .thinking = ctl & 1, .tools = ctl & 2, .arg_type = answer, .arg_type_ud = &mode };
    evlog a, b;
    parse(&o, d, n, 0, &a);
    parse(&o, d, n, (uint32_t)ctl * 2654435761u | 1, &b);
    tool_evlog_same(&a.events, &b.events);
}

typedef struct { int calls, errors; const char *name; bool name_ok; } tally;

static void count(void *ud, const ds4_dsml_event *ev) {
    tally *t = ud;
    if (ev->kind == DS4_DSML_EV_CALL_END) { t->calls++; t->name_ok = !strcmp(ev->name, t->name); }
    if (ev->kind == DS4_DSML_EV_ERROR) t->errors++;
}

static void check_render(const char *args) {
    ds4_tool_call call = { "id", "f", args };
    ds4_buf out = {0};
    bool ok = ds4_glm_render_calls(&call, 1, &out, NULL, NULL, 0);
    if (ok != (ds4_json_valid(args, strlen(args)) && args[strspn(args, " \t\r\n")] == '{')) abort();
    if (ok && !strstr(args, "</") && !strstr(args, "\\u")) {
        tally t = { .name = call.name };
        ds4_glm_opts o = { .tools = true };
        ds4_glm_parser *p = ds4_glm_new(&o, count, &t);
        if (!p) abort();
        ds4_glm_feed(p, out.data, out.len);
        ds4_glm_finish(p);
        ds4_glm_free(p);
        if (t.calls != 1 || t.errors || !t.name_ok) abort();
    }
    ds4_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 1 << 16) return 0;
    check_parser(data + 1, size - 1, data[0]);
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    check_render(text);
    free(text);
    return 0;
}
