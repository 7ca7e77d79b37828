/* fuzz_dsml.c -- the DSML parser and the JSON <-> DSML conversions.
 * Input: byte 0 = parser options (bits 0-2) and chunking seed, the rest is
 * fed as generated text. Oracles beyond "no crash":
 *  - feeding in pseudo-random chunks gives the same events as one piece
 *    (text events coalesced, ERROR compared by message only);
 *  - the same bytes as tool-call arguments: the ds4 rendering parses back
 *    to exactly one call, JSON-equal to the input when that is a valid
 *    object free of entities and \u escapes (cJSON is the judge);
 *  - Python-style and compact JSON reformatting accept exactly the valid
 *    inputs and are idempotent. */
#include "text/dsml.h"
#include "base/json_util.h"
#include "tool_evlog.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void on_event(void *ud, const ds4_dsml_event *ev) {
    tool_evlog_add(ud, ev);
}

static void parse(const ds4_dsml_opts *o, const uint8_t *d, size_t n, uint32_t seed, tool_evlog *l) {
    tool_evlog_init(l);
    ds4_dsml_parser *p = ds4_dsml_new(o, on_event, l);
    if (!p) abort();
    for (size_t i = 0; i < n;) {
        size_t k = seed ? 1 + (seed = seed * 1103515245u + 12345u) % 13 : n;
        if (k > n - i) k = n - i;
        ds4_dsml_feed(p, (const char *)d + i, k);
        (void)ds4_dsml_in_structure(p);
        i += k;
    }
    ds4_dsml_finish(p);
    ds4_dsml_free(p);
}

static void check_parser(const uint8_t *d, size_t n, uint8_t ctl) {
    ds4_dsml_opts o = { .thinking = ctl & 1, .tools = ctl & 2, .decode_entities = ctl & 4 };
    tool_evlog a, b;
    parse(&o, d, n, 0, &a);
    parse(&o, d, n, (uint32_t)ctl * 2654435761u | 1, &b);
    tool_evlog_same(&a, &b);
}

static void check_render(const char *args) {
    ds4_tool_call call = { "id", "f<&\">", args };
    ds4_buf out = {0};
    if (!ds4_dsml_render_calls(&call, 1, DS4_DSML_OFFICIAL, &out, NULL, 0)) abort();
    ds4_buf_clear(&out);
    if (!ds4_dsml_render_calls(&call, 1, DS4_DSML_DS4, &out, NULL, 0)) abort();
    ds4_dsml_opts o = { .tools = true, .decode_entities = true };
    ds4_dsml_result r;
    ds4_dsml_parse(&o, out.data, out.len, &r);
    if (r.error || r.n_calls != 1 || strcmp(r.calls[0].name, call.name) != 0) abort();
    size_t n = strlen(args);
    if (!strchr(args, '&') && !strstr(args, "\\u") && ds4_json_valid(args, n)) {
        /* compared as cJSON's own serialisation: cJSON_Compare would look
         * duplicate keys up by name and call equal objects different */
        cJSON *x = cJSON_Parse(args), *y = cJSON_Parse(r.calls[0].arguments);
        char *px = x && cJSON_IsObject(x) ? cJSON_PrintUnformatted(x) : NULL;
        char *py = px && y ? cJSON_PrintUnformatted(y) : NULL;
        if (px && (!py || strcmp(px, py) != 0)) abort();
        cJSON_free(px);
        cJSON_free(py);
        cJSON_Delete(x);
        cJSON_Delete(y);
    }
    ds4_dsml_result_free(&r);
    ds4_buf_free(&out);
}

static void check_reformat(const char *s, size_t n) {
    for (int st = 0; st < 2; st++) {
        ds4_json_style style = st ? DS4_JSON_COMPACT : DS4_JSON_PY;
        ds4_buf a = {0}, b = {0};
        bool ok = ds4_json_reformat(s, n, style, &a);
        if (ok != ds4_json_valid(s, n)) abort();
        /* Python writes an overflowing float as Infinity, which is not JSON */
        if (ok && !memmem(a.data, a.len, "Infinity", 8)) {
            if (!ds4_json_reformat(a.data, a.len, style, &b)) abort();
            if (a.len != b.len || (a.len && memcmp(a.data, b.data, a.len) != 0)) abort();
        }
        ds4_buf_free(&a);
        ds4_buf_free(&b);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 1 << 16) return 0;
    uint8_t ctl = data[0];
    check_parser(data + 1, size - 1, ctl);
    char *text = malloc(size);
    if (!text) return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    check_render(text);
    check_reformat(text, size - 1);
    free(text);
    return 0;
}
