/* glm_tools.c -- see glm_tools.h. Like dsml.c, the parser keeps every fed
 * byte in `raw` and consumes it from `pos`; a state that cannot decide yet
 * leaves its bytes unconsumed, which makes any chunking give the same events. */
#include "text/glm_tools.h"
#include "base/textscan.h"
#include "text/tool_events.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char CALL_OPEN[] = DS4_GLM_TOOL_CALL_OPEN;
static const char CALL_CLOSE[] = "</tool_call>";
static const char KEY_OPEN[] = "<arg_key>";
static const char KEY_CLOSE[] = "</arg_key>";
static const char VALUE_OPEN[] = "<arg_value>";
static const char VALUE_CLOSE[] = "</arg_value>";
/* Bounds how long a name or key without its closing tag is buffered. */
enum { MAX_TAG = 4096 };

enum state {
    S_REASONING, S_CONTENT,
    S_NAME, S_KEY, S_AFTER_KEY, S_VALUE, S_ARGS, S_BETWEEN,
    S_FAILED,
};

struct ds4_glm_parser {
    ds4_glm_opts o;
    ds4_tool_events ev;                /* raw input, events, call index */
    enum state st;
    size_t block_start, block_end;
    int nparams;
    bool vstring, js_in_str, js_esc;   /* the value being read */
    ds4_buf name, key, args, value, tmp;
};

/* ---- events ---------------------------------------------------------------- */

static void flush(ds4_glm_parser *p) { ds4_tool_events_flush(&p->ev); }

static void emit_text(ds4_glm_parser *p, ds4_dsml_event_kind kind, const char *s, size_t n) {
    ds4_tool_events_text(&p->ev, kind, s, n);
}

static void emit(ds4_glm_parser *p, ds4_dsml_event ev) { ds4_tool_events_emit(&p->ev, ev); }

static void fail(ds4_glm_parser *p, const char *msg) {
    ds4_tool_events_error(&p->ev, msg);
    p->st = S_FAILED;
}

static void emit_args(ds4_glm_parser *p, const char *s, size_t n) {
    ds4_buf_put(&p->args, s, n);
    emit_text(p, DS4_DSML_EV_ARGS, s, n);
}

/* s[0..n) without surrounding ASCII white space, NUL-terminated in out. */
static void put_trimmed(ds4_buf *out, const char *s, size_t n) {
    while (n && ds4_scan_ws(s[0])) { s++; n--; }
    while (n && ds4_scan_ws(s[n - 1])) n--;
    ds4_buf_clear(out);
    ds4_buf_put(out, s, n);
    ds4_buf_putc(out, 0);
    out->len--;
}

/* ---- call pieces -------------------------------------------------------------- */

static void open_call(ds4_glm_parser *p) {
    emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_CALL_START, .index = p->ev.call, .name = p->name.data });
    ds4_buf_clear(&p->args);
    p->nparams = 0;
    emit_args(p, "{", 1);
}

static void close_call(ds4_glm_parser *p) {
    emit_args(p, "}", 1);
    emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_CALL_END, .index = p->ev.call, .name = p->name.data,
                              .text = p->args.data, .len = p->args.len, .args_valid = true });
    p->ev.call++;
}

static void open_param(ds4_glm_parser *p) {
    ds4_glm_arg_type t = p->o.arg_type ? p->o.arg_type(p->o.arg_type_ud, p->name.data, p->key.data)
                                       : DS4_GLM_ARG_UNKNOWN;
    p->vstring = t == DS4_GLM_ARG_STRING;
    p->js_in_str = p->js_esc = false;
    ds4_buf_clear(&p->value);
    emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_PARAM_START, .index = p->ev.call,
                              .name = p->key.data, .is_string = p->vstring });
    ds4_buf_clear(&p->tmp);
    if (p->nparams) ds4_buf_putc(&p->tmp, ',');
    ds4_json_quote(p->key.data, p->key.len, DS4_JSON_COMPACT, &p->tmp);
    ds4_buf_putc(&p->tmp, ':');
    if (p->vstring) ds4_buf_putc(&p->tmp, '"');
    emit_args(p, p->tmp.data, p->tmp.len);
}

/* A decided piece of a value: string values stream escaped; other values
 * are only tracked (string literals) until the whole value is known. */
static void value_bytes(ds4_glm_parser *p, const char *s, size_t n) {
    ds4_buf_put(&p->value, s, n);
    if (p->vstring) {
        ds4_buf_clear(&p->tmp);
        ds4_json_quote(s, n, DS4_JSON_COMPACT, &p->tmp);
        if (p->tmp.len >= 2) emit_args(p, p->tmp.data + 1, p->tmp.len - 2);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (p->js_esc) p->js_esc = false;
        else if (p->js_in_str && s[i] == '\\') p->js_esc = true;
        else if (s[i] == '"') p->js_in_str = !p->js_in_str;
    }
}

static void close_param(ds4_glm_parser *p) {
    const char *v = p->value.data ? p->value.data : "";
    bool is_string = p->vstring;
    ds4_buf_clear(&p->tmp);
    if (is_string) ds4_buf_putc(&p->tmp, '"');
    else if (!ds4_json_reformat(v, p->value.len, DS4_JSON_COMPACT, &p->tmp)) {
        ds4_buf_clear(&p->tmp);
        ds4_json_quote(v, p->value.len, DS4_JSON_COMPACT, &p->tmp);
        is_string = true;
    }
    emit_args(p, p->tmp.data, p->tmp.len);
    emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_PARAM_END, .index = p->ev.call, .name = p->key.data,
                              .is_string = is_string, .text = v, .len = p->value.len });
    p->nparams++;
}

/* ---- states ---------------------------------------------------------------------- */

/* Each step consumes what it can decide; false = nothing more until more
 * input (or, at eof, nothing more at all). */

static bool step_content(ds4_glm_parser *p, const char *s, size_t n, bool eof) {
    size_t hold = n;
    for (size_t i = 0; p->o.tools && i < n && hold == n; i++) {
        if (s[i] != '<') continue;
        enum ds4_scan_match m = ds4_scan_match(s + i, n - i, CALL_OPEN);
        if (m == DS4_SCAN_FULL) {
            size_t e = i;
            while (e > 0 && ds4_scan_ws(s[e - 1])) e--;
            emit_text(p, DS4_DSML_EV_CONTENT, s, e);
            p->block_start = p->ev.pos + e;
            p->ev.pos += i + strlen(CALL_OPEN);
            p->st = S_NAME;
            emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_BLOCK_START });
            return true;
        }
        if (m == DS4_SCAN_PARTIAL && !eof) hold = i;
    }
    size_t keep = hold;
    if (!eof) {
        /* trailing white space may belong to the block (held, not dropped) */
        while (p->o.tools && keep > 0 && ds4_scan_ws(s[keep - 1])) keep--;
        keep = ds4_scan_utf8_cut(s, keep);
    }
    emit_text(p, DS4_DSML_EV_CONTENT, s, keep);
    p->ev.pos += keep;
    return false;
}

/* Waits for, or fails on, a tag that is not complete yet. */
static bool need_more(ds4_glm_parser *p, size_t n, bool eof, const char *too_long) {
    if (n >= MAX_TAG) fail(p, too_long);
    else if (eof) fail(p, "unterminated tool call");
    return false;
}

/* Tool name up to <arg_key> or </tool_call>. */
static bool step_name(ds4_glm_parser *p, const char *s, size_t n, bool eof) {
    const char *lt = memchr(s, '<', n);
    if (!lt) return need_more(p, n, eof, "tool name too long");
    size_t i = (size_t)(lt - s);
    enum ds4_scan_match mk = ds4_scan_match(lt, n - i, KEY_OPEN), mc = ds4_scan_match(lt, n - i, CALL_CLOSE);
    if (mk == DS4_SCAN_NO && mc == DS4_SCAN_NO) {
        fail(p, "expected <arg_key> or </tool_call> after the tool name");
        return false;
    }
    if (mk != DS4_SCAN_FULL && mc != DS4_SCAN_FULL) return need_more(p, n, eof, "tool name too long");
    put_trimmed(&p->name, s, i);
    if (!p->name.len) { fail(p, "tool call without a name"); return false; }
    open_call(p);
    if (mk == DS4_SCAN_FULL) {
        p->ev.pos += i + strlen(KEY_OPEN);
        p->st = S_KEY;
    } else {
        p->ev.pos += i + strlen(CALL_CLOSE);
        close_call(p);
        p->block_end = p->ev.pos;
        p->st = S_BETWEEN;
    }
    return true;
}

static bool step_key(ds4_glm_parser *p, const char *s, size_t n, bool eof) {
    size_t k = ds4_scan_find(s, n, KEY_CLOSE);
    if (k > n) return need_more(p, n, eof, "argument key too long");
    put_trimmed(&p->key, s, k);
    p->ev.pos += k + strlen(KEY_CLOSE);
    p->st = S_AFTER_KEY;
    return true;
}

/* Skips white space, then expects one of two tags: 0 / 1 = which matched
 * (consumed), -1 = undecided (wait), -2 = neither (failed with msg). */
static int expect_tag(ds4_glm_parser *p, const char *s, size_t n, bool eof, const char *a, const char *b,
                      const char *msg) {
    size_t i = 0;
    while (i < n && ds4_scan_ws(s[i])) i++;
    p->ev.pos += i;
    s += i; n -= i;
    enum ds4_scan_match ma = ds4_scan_match(s, n, a), mb = b ? ds4_scan_match(s, n, b) : DS4_SCAN_NO;
    if (ma == DS4_SCAN_FULL) { p->ev.pos += strlen(a); return 0; }
    if (mb == DS4_SCAN_FULL) { p->ev.pos += strlen(b); return 1; }
    if (n && ma == DS4_SCAN_NO && mb == DS4_SCAN_NO) { fail(p, msg); return -2; }
    return -1;
}

static bool step_after_key(ds4_glm_parser *p, const char *s, size_t n, bool eof) {
    int t = expect_tag(p, s, n, eof, VALUE_OPEN, NULL, "expected <arg_value> after </arg_key>");
    if (t == -1 && eof) fail(p, "unterminated tool call");
    if (t != 0) return false;
    open_param(p);
    p->st = S_VALUE;
    return true;
}

static bool step_value(ds4_glm_parser *p, const char *s, size_t n, bool eof) {
    size_t k = ds4_scan_find(s, n, VALUE_CLOSE);
    if (k <= n) {
        value_bytes(p, s, k);
        p->ev.pos += k + strlen(VALUE_CLOSE);
        close_param(p);
        p->st = S_ARGS;
        return true;
    }
    if (eof) { fail(p, "unterminated tool call"); return false; }
    size_t keep = ds4_scan_utf8_cut(s, n - ds4_scan_partial_suffix(s, n, VALUE_CLOSE));
    value_bytes(p, s, keep);
    p->ev.pos += keep;
    return false;
}

static bool step_args(ds4_glm_parser *p, const char *s, size_t n, bool eof) {
    int t = expect_tag(p, s, n, eof, KEY_OPEN, CALL_CLOSE, "expected <arg_key> or </tool_call> after </arg_value>");
    if (t == -1 && eof) fail(p, "unterminated tool call");
    if (t < 0) return false;
    if (t == 0) { p->st = S_KEY; return true; }
    close_call(p);
    p->block_end = p->ev.pos;
    p->st = S_BETWEEN;
    return true;
}

static bool step_between(ds4_glm_parser *p, const char *s, size_t n, bool eof) {
    int t = expect_tag(p, s, n, eof, CALL_OPEN, NULL, "text after the tool calls");
    if (t != 0) return false;
    p->st = S_NAME;
    return true;
}

static void run(ds4_glm_parser *p, bool eof) {
    for (bool more = true; more;) {
        const char *s = p->ev.raw.data ? p->ev.raw.data + p->ev.pos : "";
        size_t n = p->ev.raw.len - p->ev.pos;
        switch (p->st) {
        case S_REASONING:
            if ((more = ds4_tool_events_reasoning(&p->ev, s, n, eof))) p->st = S_CONTENT;
            break;
        case S_CONTENT:     more = step_content(p, s, n, eof); break;
        case S_NAME:        more = step_name(p, s, n, eof); break;
        case S_KEY:         more = step_key(p, s, n, eof); break;
        case S_AFTER_KEY:   more = step_after_key(p, s, n, eof); break;
        case S_VALUE:       more = step_value(p, s, n, eof); break;
        case S_ARGS:        more = step_args(p, s, n, eof); break;
        case S_BETWEEN:     more = step_between(p, s, n, eof); break;
        default:            more = false; break;
        }
    }
    flush(p);
}

/* ---- public API ------------------------------------------------------------------ */

ds4_glm_parser *ds4_glm_new(const ds4_glm_opts *o, ds4_dsml_event_fn fn, void *ud) {
    ds4_glm_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->o = *o;
    ds4_tool_events_init(&p->ev, fn, ud);
    p->st = o->thinking ? S_REASONING : S_CONTENT;
    return p;
}

void ds4_glm_free(ds4_glm_parser *p) {
    if (!p) return;
    ds4_buf *bufs[] = { &p->name, &p->key, &p->args, &p->value, &p->tmp };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ds4_buf_free(bufs[i]);
    ds4_tool_events_free(&p->ev);
    free(p);
}

void ds4_glm_feed(ds4_glm_parser *p, const char *s, size_t n) {
    if (p->st == S_FAILED || !n) return;
    if (!ds4_tool_events_append(&p->ev, s, n)) { fail(p, "out of memory"); return; }
    run(p, false);
}

void ds4_glm_finish(ds4_glm_parser *p) {
    if (p->st == S_FAILED) return;
    run(p, true);
    if (p->st == S_BETWEEN)
        emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_BLOCK_END, .text = p->ev.raw.data + p->block_start,
                                  .len = p->block_end - p->block_start });
    if (p->args.oom || p->ev.pend.oom || p->tmp.oom || p->value.oom) fail(p, "out of memory");
}

bool ds4_glm_in_structure(const ds4_glm_parser *p) {
    switch (p->st) {
    case S_NAME: case S_KEY: case S_AFTER_KEY: case S_ARGS: case S_BETWEEN:
        return true;
    case S_VALUE: {
        size_t held = p->ev.raw.len - p->ev.pos;
        if (held >= 2 && ds4_scan_match(p->ev.raw.data + p->ev.pos, held, VALUE_CLOSE) == DS4_SCAN_PARTIAL)
            return true;
        return !p->vstring && !p->js_in_str;
    }
    default:
        return false;
    }
}

bool ds4_glm_in_reasoning(const ds4_glm_parser *p) { return p->st == S_REASONING; }
bool ds4_glm_block_open(const ds4_glm_parser *p) { return p->st >= S_NAME && p->st <= S_BETWEEN; }
bool ds4_glm_failed(const ds4_glm_parser *p) { return p->st == S_FAILED; }

/* ---- schema ------------------------------------------------------------------------ */

ds4_glm_arg_type ds4_glm_schema_arg_type(const char *tool_json, const char *key) {
    cJSON *root = tool_json ? cJSON_Parse(tool_json) : NULL;
    cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "parameters");
    if (!params) params = cJSON_GetObjectItemCaseSensitive(root, "input_schema");
    cJSON *prop = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(params, "properties"), key);
    cJSON *type = cJSON_GetObjectItemCaseSensitive(prop, "type");
    ds4_glm_arg_type t = DS4_GLM_ARG_UNKNOWN;
    if (cJSON_IsString(type)) {
        t = strcmp(type->valuestring, "string") ? DS4_GLM_ARG_OTHER : DS4_GLM_ARG_STRING;
    } else if (cJSON_IsArray(type)) {
        t = DS4_GLM_ARG_OTHER;
        for (cJSON *e = type->child; e; e = e->next)
            if (cJSON_IsString(e) && !strcmp(e->valuestring, "string")) t = DS4_GLM_ARG_STRING;
    }
    cJSON_Delete(root);
    return t;
}
