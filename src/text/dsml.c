/* dsml.c -- see dsml.h. The parser keeps every fed byte in `raw` (needed for
 * error reports and the exact replay block) and consumes it from `pos` with a
 * small state machine; a state that cannot decide yet leaves its bytes
 * unconsumed, which is what makes any chunking give the same events. */
#include "text/dsml.h"
#include "base/textscan.h"
#include "text/tool_events.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSML_TAGS(F) { "<" F "tool_calls>", "</" F "tool_calls>", "<" F "invoke", \
                       "</" F "invoke>", "<" F "parameter", "</" F "parameter>" }
enum { T_OPEN_BLOCK, T_CLOSE_BLOCK, T_OPEN_INVOKE, T_CLOSE_INVOKE, T_OPEN_PARAM, T_CLOSE_PARAM };
enum { N_FAMILIES = 3 };
/* Families in ds4's order of preference: canonical, first bar lost, plain. */
static const char *const TAGS[N_FAMILIES][6] = {
    DSML_TAGS("｜DSML｜"), DSML_TAGS("DSML｜"), DSML_TAGS(""),
};
/* Longer than any real tag; bounds how long an unclosed tag is buffered. */
enum { MAX_TAG = 4096 };
/* "&quot;" and "&apos;" are the longest entities. */
enum { MAX_ENTITY = 6 };

enum state {
    S_REASONING, S_CONTENT,
    S_BLOCK, S_INVOKE_TAG, S_INVOKE, S_PARAM_TAG, S_VALUE,
    S_DONE, S_FAILED,
};

struct ds4_dsml_parser {
    ds4_dsml_opts o;
    ds4_tool_events ev;                /* raw input, events, call index */
    enum state st;
    int fam;
    size_t block_start;
    int nparams;
    bool pstring, args_valid;
    bool js_in_str, js_esc;            /* minifier state inside a string="false" value */
    ds4_buf name, pname, args, value, tmp;
};

/* ---- small helpers ------------------------------------------------------ */

static void decode_entities(const char *s, size_t n, ds4_buf *out) {
    static const struct { const char *e; char c; } ents[] = {
        { "&amp;", '&' }, { "&lt;", '<' }, { "&gt;", '>' }, { "&quot;", '"' }, { "&apos;", '\'' },
    };
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '&') continue;
        for (size_t k = 0; k < sizeof ents / sizeof ents[0]; k++) {
            if (ds4_scan_match(s + i, n - i, ents[k].e) != DS4_SCAN_FULL) continue;
            ds4_buf_put(out, s + run, i - run);
            ds4_buf_putc(out, ents[k].c);
            i += strlen(ents[k].e) - 1;
            run = i + 1;
            break;
        }
    }
    ds4_buf_put(out, s + run, n - run);
}

/* Cut before an '&' whose entity could still complete past n. */
static size_t entity_cut(const char *s, size_t n) {
    for (size_t i = n > MAX_ENTITY - 1 ? n - (MAX_ENTITY - 1) : 0; i < n; i++)
        if (s[i] == '&' && !memchr(s + i, ';', n - i)) return i;
    return n;
}

/* ---- events --------------------------------------------------------------- */

static void flush(ds4_dsml_parser *p) { ds4_tool_events_flush(&p->ev); }

static void emit_text(ds4_dsml_parser *p, ds4_dsml_event_kind kind, const char *s, size_t n) {
    ds4_tool_events_text(&p->ev, kind, s, n);
}

static void emit(ds4_dsml_parser *p, ds4_dsml_event ev) { ds4_tool_events_emit(&p->ev, ev); }

static void fail(ds4_dsml_parser *p, const char *msg) {
    ds4_tool_events_error(&p->ev, msg);
    p->st = S_FAILED;
}

static void emit_args(ds4_dsml_parser *p, const char *s, size_t n) {
    ds4_buf_put(&p->args, s, n);
    emit_text(p, DS4_DSML_EV_ARGS, s, n);
}

/* ---- tag attributes ------------------------------------------------------- */

typedef struct { const char *name; size_t name_len; const char *str; size_t str_len; bool has_name, has_str; } attrs;

/* ` name="v" string="v"` in any order; unknown attributes are skipped. */
static bool parse_attrs(const char *s, size_t n, attrs *a) {
    memset(a, 0, sizeof *a);
    size_t i = 0;
    for (;;) {
        while (i < n && ds4_scan_ws(s[i])) i++;
        if (i >= n) return true;
        size_t k = i;
        while (i < n && s[i] != '=' && !ds4_scan_ws(s[i])) i++;
        size_t klen = i - k;
        while (i < n && ds4_scan_ws(s[i])) i++;
        if (i >= n || s[i] != '=') return false;
        i++;
        while (i < n && ds4_scan_ws(s[i])) i++;
        if (i >= n || s[i] != '"') return false;
        size_t v = ++i;
        while (i < n && s[i] != '"') i++;
        if (i >= n) return false;
        if (klen == 4 && memcmp(s + k, "name", 4) == 0) {
            a->name = s + v; a->name_len = i - v; a->has_name = true;
        } else if (klen == 6 && memcmp(s + k, "string", 6) == 0) {
            a->str = s + v; a->str_len = i - v; a->has_str = true;
        }
        i++;
    }
}

static void decode_name(ds4_dsml_parser *p, const char *s, size_t n, ds4_buf *out) {
    ds4_buf_clear(out);
    if (p->o.decode_entities) decode_entities(s, n, out);
    else ds4_buf_put(out, s, n);
    ds4_buf_putc(out, 0);   /* names are NUL-terminated for the event */
    out->len--;
}

/* ---- states ---------------------------------------------------------------- */

/* Each step consumes what it can decide; false = nothing more until more
 * input (or, at eof, nothing more at all). */

static bool step_content(ds4_dsml_parser *p, const char *s, size_t n, bool eof) {
    if (!p->o.tools) {
        size_t keep = eof ? n : ds4_scan_utf8_cut(s, n);
        emit_text(p, DS4_DSML_EV_CONTENT, s, keep);
        p->ev.pos += keep;
        return false;
    }
    size_t hold = n;
    for (size_t i = 0; i < n && hold == n; i++) {
        if (s[i] != '<') continue;
        for (int f = 0; f < N_FAMILIES; f++) {
            enum ds4_scan_match m = ds4_scan_match(s + i, n - i, TAGS[f][T_OPEN_BLOCK]);
            if (m == DS4_SCAN_FULL) {
                size_t e = i;
                while (e > 0 && ds4_scan_ws(s[e - 1])) e--;
                emit_text(p, DS4_DSML_EV_CONTENT, s, e);
                p->block_start = p->ev.pos + i - (i >= 2 && s[i - 1] == '\n' && s[i - 2] == '\n' ? 2 : 0);
                p->fam = f;
                p->ev.pos += i + strlen(TAGS[f][T_OPEN_BLOCK]);
                p->st = S_BLOCK;
                emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_BLOCK_START });
                return true;
            }
            if (m == DS4_SCAN_PARTIAL && !eof) hold = i;
        }
    }
    size_t keep = hold;
    if (!eof) {
        while (keep > 0 && ds4_scan_ws(s[keep - 1])) keep--;
        keep = ds4_scan_utf8_cut(s, keep);
    }
    emit_text(p, DS4_DSML_EV_CONTENT, s, keep);
    p->ev.pos += keep;
    return false;
}

static void open_call(ds4_dsml_parser *p) {
    emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_CALL_START, .index = p->ev.call, .name = p->name.data });
    ds4_buf_clear(&p->args);
    p->nparams = 0;
    p->args_valid = true;
    emit_args(p, "{", 1);
}

static void close_call(ds4_dsml_parser *p) {
    emit_args(p, "}", 1);
    emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_CALL_END, .index = p->ev.call, .name = p->name.data,
                              .text = p->args_valid ? p->args.data : "{}",
                              .len = p->args_valid ? p->args.len : 2, .args_valid = p->args_valid });
    p->ev.call++;
}

static void open_param(ds4_dsml_parser *p) {
    emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_PARAM_START, .index = p->ev.call,
                              .name = p->pname.data, .is_string = p->pstring });
    ds4_buf_clear(&p->tmp);
    if (p->nparams) ds4_buf_putc(&p->tmp, ',');
    ds4_json_quote(p->pname.data, p->pname.len, DS4_JSON_COMPACT, &p->tmp);
    ds4_buf_putc(&p->tmp, ':');
    if (p->pstring) ds4_buf_putc(&p->tmp, '"');
    emit_args(p, p->tmp.data, p->tmp.len);
    ds4_buf_clear(&p->value);
    p->js_in_str = p->js_esc = false;
}

/* Streams a decided piece of a parameter value into the arguments. */
static void value_bytes(ds4_dsml_parser *p, const char *s, size_t n) {
    ds4_buf_put(&p->value, s, n);
    ds4_buf_clear(&p->tmp);
    if (p->pstring) {
        ds4_buf dec = {0};
        if (p->o.decode_entities) { decode_entities(s, n, &dec); s = dec.data ? dec.data : ""; n = dec.len; }
        ds4_json_quote(s, n, DS4_JSON_COMPACT, &p->tmp);
        ds4_buf_free(&dec);
        emit_args(p, p->tmp.data + 1, p->tmp.len - 2);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (p->js_in_str) {
            if (p->js_esc) p->js_esc = false;
            else if (c == '\\') p->js_esc = true;
            else if (c == '"') p->js_in_str = false;
        } else if (c == '"') {
            p->js_in_str = true;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            continue;
        }
        ds4_buf_putc(&p->tmp, c);
    }
    emit_args(p, p->tmp.data, p->tmp.len);
}

static void close_param(ds4_dsml_parser *p) {
    if (p->pstring) emit_args(p, "\"", 1);
    else if (!ds4_json_valid(p->value.data ? p->value.data : "", p->value.len)) p->args_valid = false;
    emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_PARAM_END, .index = p->ev.call, .name = p->pname.data,
                              .is_string = p->pstring, .text = p->value.data ? p->value.data : "",
                              .len = p->value.len });
    p->nparams++;
}

/* Between elements: after the opening block tag (S_BLOCK) or inside an
 * invoke (S_INVOKE). */
static bool step_between(ds4_dsml_parser *p, const char *s, size_t n, bool eof) {
    size_t i = 0;
    while (i < n && ds4_scan_ws(s[i])) i++;
    p->ev.pos += i;
    s += i; n -= i;
    const char *const *t = TAGS[p->fam];
    bool in_block = p->st == S_BLOCK;
    const char *open = t[in_block ? T_OPEN_INVOKE : T_OPEN_PARAM];
    const char *close = t[in_block ? T_CLOSE_BLOCK : T_CLOSE_INVOKE];
    enum ds4_scan_match mo = ds4_scan_match(s, n, open), mc = ds4_scan_match(s, n, close);
    if (mo == DS4_SCAN_FULL) {
        p->ev.pos += strlen(open);
        p->st = in_block ? S_INVOKE_TAG : S_PARAM_TAG;
        return true;
    }
    if (mc == DS4_SCAN_FULL) {
        p->ev.pos += strlen(close);
        if (!in_block) { close_call(p); p->st = S_BLOCK; return true; }
        if (!p->ev.call) { fail(p, "tool_calls block without any invoke"); return false; }
        p->st = S_DONE;
        emit(p, (ds4_dsml_event){ .kind = DS4_DSML_EV_BLOCK_END, .text = p->ev.raw.data + p->block_start,
                                  .len = p->ev.pos - p->block_start });
        return true;
    }
    if (n == 0 || mo == DS4_SCAN_PARTIAL || mc == DS4_SCAN_PARTIAL) {
        if (eof) fail(p, "unterminated tool call");
        return false;
    }
    fail(p, in_block ? "expected an invoke tag in the tool_calls block"
                     : "expected a parameter tag in the invoke");
    return false;
}

static bool step_tag(ds4_dsml_parser *p, const char *s, size_t n, bool eof) {
    size_t gt = ds4_scan_find(s, n < MAX_TAG ? n : MAX_TAG, ">");
    if (gt > n || gt >= MAX_TAG) {
        if (n >= MAX_TAG) fail(p, "tool-call tag too long");
        else if (eof) fail(p, "unterminated tool call");
        return false;
    }
    bool invoke = p->st == S_INVOKE_TAG;
    attrs a;
    if ((gt && !ds4_scan_ws(s[0])) || !parse_attrs(s, gt, &a)) {
        fail(p, invoke ? "malformed invoke tag" : "malformed parameter tag");
        return false;
    }
    if (!a.has_name || (invoke && a.name_len == 0)) {
        fail(p, invoke ? "invoke tag without a name" : "parameter tag without a name");
        return false;
    }
    p->ev.pos += gt + 1;
    if (invoke) {
        decode_name(p, a.name, a.name_len, &p->name);
        open_call(p);
        p->st = S_INVOKE;
    } else {
        decode_name(p, a.name, a.name_len, &p->pname);
        p->pstring = !a.has_str || (a.str_len == 4 && memcmp(a.str, "true", 4) == 0);
        open_param(p);
        p->st = S_VALUE;
    }
    return true;
}

static bool step_value(ds4_dsml_parser *p, const char *s, size_t n, bool eof) {
    const char *close = TAGS[p->fam][T_CLOSE_PARAM];
    size_t k = ds4_scan_find(s, n, close);
    if (k <= n) {
        value_bytes(p, s, k);
        p->ev.pos += k + strlen(close);
        close_param(p);
        p->st = S_INVOKE;
        return true;
    }
    if (eof) { fail(p, "unterminated tool call"); return false; }
    size_t keep = n - ds4_scan_partial_suffix(s, n, close);
    if (p->pstring && p->o.decode_entities) keep = entity_cut(s, keep);
    keep = ds4_scan_utf8_cut(s, keep);
    value_bytes(p, s, keep);
    p->ev.pos += keep;
    return false;
}

static bool step_done(ds4_dsml_parser *p, const char *s, size_t n) {
    size_t i = 0;
    while (i < n && ds4_scan_ws(s[i])) i++;
    p->ev.pos += i;
    if (i < n) fail(p, "text after the tool_calls block");
    return false;
}

static void run(ds4_dsml_parser *p, bool eof) {
    for (;;) {
        const char *s = p->ev.raw.data ? p->ev.raw.data + p->ev.pos : "";
        size_t n = p->ev.raw.len - p->ev.pos;
        bool more;
        switch (p->st) {
        case S_REASONING:
            if ((more = ds4_tool_events_reasoning(&p->ev, s, n, eof))) p->st = S_CONTENT;
            break;
        case S_CONTENT:     more = step_content(p, s, n, eof); break;
        case S_BLOCK:
        case S_INVOKE:      more = step_between(p, s, n, eof); break;
        case S_INVOKE_TAG:
        case S_PARAM_TAG:   more = step_tag(p, s, n, eof); break;
        case S_VALUE:       more = step_value(p, s, n, eof); break;
        case S_DONE:        more = step_done(p, s, n); break;
        default:            more = false; break;
        }
        if (!more) break;
    }
    flush(p);
}

/* ---- public parser API ------------------------------------------------------ */

ds4_dsml_parser *ds4_dsml_new(const ds4_dsml_opts *o, ds4_dsml_event_fn fn, void *ud) {
    ds4_dsml_parser *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->o = *o;
    ds4_tool_events_init(&p->ev, fn, ud);
    p->st = o->thinking ? S_REASONING : S_CONTENT;
    return p;
}

void ds4_dsml_free(ds4_dsml_parser *p) {
    if (!p) return;
    ds4_buf *bufs[] = { &p->name, &p->pname, &p->args, &p->value, &p->tmp };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ds4_buf_free(bufs[i]);
    ds4_tool_events_free(&p->ev);
    free(p);
}

void ds4_dsml_feed(ds4_dsml_parser *p, const char *s, size_t n) {
    if (p->st == S_FAILED || !n) return;
    if (!ds4_tool_events_append(&p->ev, s, n)) { fail(p, "out of memory"); return; }
    run(p, false);
}

void ds4_dsml_finish(ds4_dsml_parser *p) {
    if (p->st != S_FAILED) run(p, true);
}

bool ds4_dsml_in_structure(const ds4_dsml_parser *p) {
    switch (p->st) {
    case S_BLOCK: case S_INVOKE_TAG: case S_INVOKE: case S_PARAM_TAG:
        return true;
    case S_VALUE: {
        /* a closing tag under way ("</" or more held back) is structure */
        size_t held = p->ev.raw.len - p->ev.pos;
        if (held >= 2 && ds4_scan_match(p->ev.raw.data + p->ev.pos, held, TAGS[p->fam][T_CLOSE_PARAM]) == DS4_SCAN_PARTIAL)
            return true;
        return !p->pstring && !p->js_in_str;
    }
    default:
        return false;
    }
}

bool ds4_dsml_in_reasoning(const ds4_dsml_parser *p) { return p->st == S_REASONING; }
bool ds4_dsml_block_open(const ds4_dsml_parser *p) { return p->st >= S_BLOCK && p->st <= S_VALUE; }
bool ds4_dsml_done(const ds4_dsml_parser *p) { return p->st == S_DONE; }
bool ds4_dsml_failed(const ds4_dsml_parser *p) { return p->st == S_FAILED; }

/* ---- one-shot parse ---------------------------------------------------------- */

typedef struct { ds4_dsml_result *r; ds4_buf reasoning, content; bool oom; } collect;

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) { memcpy(d, s, n); d[n] = 0; }
    return d;
}

static void collect_event(void *ud, const ds4_dsml_event *ev) {
    collect *c = ud;
    ds4_dsml_result *r = c->r;
    switch (ev->kind) {
    case DS4_DSML_EV_REASONING: ds4_buf_put(&c->reasoning, ev->text, ev->len); break;
    case DS4_DSML_EV_CONTENT:   ds4_buf_put(&c->content, ev->text, ev->len); break;
    case DS4_DSML_EV_CALL_END: {
        ds4_dsml_call *calls = realloc(r->calls, (size_t)(r->n_calls + 1) * sizeof *calls);
        if (!calls) { c->oom = true; break; }
        r->calls = calls;
        ds4_dsml_call *k = &calls[r->n_calls++];
        k->name = dup_n(ev->name, strlen(ev->name));
        k->arguments = dup_n(ev->text, ev->len);
        k->args_valid = ev->args_valid;
        if (!k->name || !k->arguments) c->oom = true;
        break;
    }
    case DS4_DSML_EV_BLOCK_END:
        free(r->raw_block);
        if (!(r->raw_block = dup_n(ev->text, ev->len))) c->oom = true;
        break;
    case DS4_DSML_EV_ERROR:
        if (!r->error) r->error = dup_n(ev->message, strlen(ev->message));
        break;
    default: break;
    }
}

void ds4_dsml_parse(const ds4_dsml_opts *o, const char *s, size_t n, ds4_dsml_result *r) {
    memset(r, 0, sizeof *r);
    collect c = { .r = r };
    ds4_dsml_parser *p = ds4_dsml_new(o, collect_event, &c);
    if (p) {
        ds4_dsml_feed(p, s, n);
        ds4_dsml_finish(p);
        ds4_dsml_free(p);
    }
    if (o->thinking) r->reasoning = ds4_buf_take(&c.reasoning);
    else ds4_buf_free(&c.reasoning);
    r->content = ds4_buf_take(&c.content);
    if ((!p || c.oom || !r->content || (o->thinking && !r->reasoning)) && !r->error)
        r->error = dup_n("out of memory", 13);
}

void ds4_dsml_result_free(ds4_dsml_result *r) {
    for (int i = 0; i < r->n_calls; i++) { free(r->calls[i].name); free(r->calls[i].arguments); }
    free(r->calls);
    free(r->reasoning);
    free(r->content);
    free(r->raw_block);
    free(r->error);
    memset(r, 0, sizeof *r);
}

/* ---- JSON -> DSML -------------------------------------------------------------- */

static const char PARAM_CLOSE[] = "</｜DSML｜parameter>";

static void put_attr(ds4_buf *out, const char *s, size_t n, ds4_dsml_style style) {
    if (style == DS4_DSML_OFFICIAL) { ds4_buf_put(out, s, n); return; }
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        const char *e = s[i] == '&' ? "&amp;" : s[i] == '<' ? "&lt;" : s[i] == '>' ? "&gt;"
                      : s[i] == '"' ? "&quot;" : NULL;
        if (!e) continue;
        ds4_buf_put(out, s + run, i - run);
        ds4_buf_puts(out, e);
        run = i + 1;
    }
    ds4_buf_put(out, s + run, n - run);
}

typedef struct {
    ds4_buf *out;
    ds4_dsml_style style;
    ds4_buf tmp;
    ds4_dsml_mark_fn mark;
    void *mark_ud;
} render_ctx;

/* put_attr() of client text, reported to the caller as such. */
static void put_attr_marked(render_ctx *c, const char *s, size_t n) {
    const size_t start = c->out->len;
    put_attr(c->out, s, n, c->style);
    if (c->mark) c->mark(c->mark_ud, start, c->out->len);
}

static void put_param(render_ctx *c, const char *key, size_t key_len, bool is_string,
                      const char *v, size_t vn) {
    ds4_buf *out = c->out;
    ds4_buf_puts(out, "<｜DSML｜parameter name=\"");
    put_attr_marked(c, key, key_len);
    ds4_buf_puts(out, is_string ? "\" string=\"true\">" : "\" string=\"false\">");
    const size_t start = out->len;
    if (c->style == DS4_DSML_OFFICIAL) ds4_buf_put(out, v, vn);
    else ds4_buf_put_replaced(out, v, vn, PARAM_CLOSE, is_string ? "&lt;/｜DSML｜parameter>" : "\\u003c/｜DSML｜parameter>");
    if (c->mark) c->mark(c->mark_ud, start, out->len);
    ds4_buf_puts(out, PARAM_CLOSE);
}

static bool render_member(void *ud, const ds4_json_member *m) {
    render_ctx *c = ud;
    ds4_buf key = {0};
    ds4_json_unquote(m->key, m->key_len, &key);
    ds4_buf_clear(&c->tmp);
    bool is_string = m->value[0] == '"';
    if (is_string) ds4_json_unquote(m->value, m->value_len, &c->tmp);
    else if (c->style == DS4_DSML_OFFICIAL) ds4_buf_put(&c->tmp, m->value, m->value_len);  /* already Python style */
    else ds4_json_reformat(m->value, m->value_len, DS4_JSON_COMPACT, &c->tmp);
    if (c->style == DS4_DSML_OFFICIAL && c->out->data[c->out->len - 1] != '\n') ds4_buf_putc(c->out, '\n');
    put_param(c, key.data ? key.data : "", key.len, is_string, c->tmp.data ? c->tmp.data : "", c->tmp.len);
    if (c->style == DS4_DSML_DS4) ds4_buf_putc(c->out, '\n');
    ds4_buf_free(&key);
    return true;
}

static bool is_object(const char *s, size_t n) {
    if (!ds4_json_valid(s, n)) return false;
    while (n && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')) { s++; n--; }
    return *s == '{';
}

bool ds4_dsml_render_calls(const ds4_tool_call *calls, int n, ds4_dsml_style style,
                           ds4_buf *out, char *err, size_t errlen) {
    return ds4_dsml_render_calls_marked(calls, n, style, out, NULL, NULL, err, errlen);
}

bool ds4_dsml_render_calls_marked(const ds4_tool_call *calls, int n, ds4_dsml_style style, ds4_buf *out,
                                  ds4_dsml_mark_fn mark, void *mark_ud, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        if (!calls[i].name || !calls[i].name[0]) {
            if (errlen) snprintf(err, errlen, "tool call %d has no name", i);
            return false;
        }
    }
    render_ctx c = { .out = out, .style = style, .mark = mark, .mark_ud = mark_ud };
    ds4_buf py = {0};
    ds4_buf_puts(out, "\n\n<｜DSML｜tool_calls>\n");
    for (int i = 0; i < n; i++) {
        const char *args = calls[i].arguments ? calls[i].arguments : "{}";
        size_t an = strlen(args);
        if (style == DS4_DSML_OFFICIAL && i) ds4_buf_putc(out, '\n');
        ds4_buf_puts(out, "<｜DSML｜invoke name=\"");
        put_attr_marked(&c, calls[i].name, strlen(calls[i].name));
        ds4_buf_puts(out, "\">\n");
        if (!is_object(args, an)) {
            put_param(&c, "arguments", 9, true, args, an);
            if (style == DS4_DSML_DS4) ds4_buf_putc(out, '\n');
        } else if (style == DS4_DSML_OFFICIAL) {
            /* Python dict semantics (duplicates collapse) come with the reformat */
            ds4_buf_clear(&py);
            ds4_json_reformat(args, an, DS4_JSON_PY, &py);
            ds4_json_object_each(py.data, py.len, render_member, &c);
        } else {
            ds4_json_object_each(args, an, render_member, &c);
        }
        ds4_buf_puts(out, style == DS4_DSML_OFFICIAL ? "\n</｜DSML｜invoke>" : "</｜DSML｜invoke>\n");
    }
    ds4_buf_puts(out, style == DS4_DSML_OFFICIAL ? "\n</｜DSML｜tool_calls>" : "</｜DSML｜tool_calls>");
    ds4_buf_free(&py);
    ds4_buf_free(&c.tmp);
    if (out->oom) {
        if (errlen) snprintf(err, errlen, "out of memory");
        return false;
    }
    return true;
}
