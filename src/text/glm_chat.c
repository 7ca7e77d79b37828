/* glm_chat.c -- see glm_chat.h. The literal texts are the GLM-4.7 template's
 * (glm-5.2-model.md 7.2); tests/fixtures/glm_chat holds the template itself. */
#include "text/glm_chat.h"
#include "text/chat_internal.h"

#include <stdio.h>
#include <string.h>

static const char TOOLS_HEAD[] =
    DS4_TOK_GLM_SYSTEM "\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n";
static const char TOOLS_TAIL[] =
    "</tools>\n\nFor each function call, output the function name and arguments within the following "
    "XML format:\n<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}"
    "</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>";

/* ---- Python str.strip() over UTF-8 ------------------------------------------ */

/* Python's str.isspace(): the White_Space-like set CPython uses. */
static bool py_space(unsigned cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Code point of the (valid) UTF-8 sequence at s of length l. */
static unsigned cp_at(const unsigned char *s, size_t l) {
    if (l == 1) return s[0];
    unsigned cp = s[0] & (0x7F >> l);
    for (size_t k = 1; k < l; k++) cp = cp << 6 | (s[k] & 0x3F);
    return cp;
}

static size_t seq_len(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

typedef struct { const char *s; size_t n; } span;

static span py_strip(span t) {
    const unsigned char *u = (const unsigned char *)t.s;
    size_t a = 0, b = t.n;
    while (a < b) {
        size_t l = seq_len(u[a]);
        if (a + l > b || !py_space(cp_at(u + a, l))) break;
        a += l;
    }
    while (b > a) {
        size_t k = b - 1;
        while (k > a && (u[k] & 0xC0) == 0x80) k--;
        if (k + seq_len(u[k]) != b || !py_space(cp_at(u + k, b - k))) break;
        b = k;
    }
    return (span){ t.s + a, b - a };
}

static span strip_char(span t, char c, bool left) {
    if (left) while (t.n && t.s[0] == c) { t.s++; t.n--; }
    else while (t.n && t.s[t.n - 1] == c) t.n--;
    return t;
}

/* What follows the last occurrence of lit in t (all of t when absent):
 * Python's t.split(lit)[-1]. */
static span after_last(span t, const char *lit) {
    size_t l = strlen(lit);
    const char *p = t.s, *q, *end = t.s + t.n;
    while ((q = memmem(p, (size_t)(end - p), lit, l))) p = q + l;
    return (span){ p, (size_t)(end - p) };
}

static span whole(const char *s) { return (span){ s ? s : "", s ? strlen(s) : 0 }; }

/* ---- tool calls ----------------------------------------------------------------- */

typedef struct { ds4_buf *out; ds4_chat_spans *spans; ds4_buf tmp; } calls_ctx;

static void put_marked(calls_ctx *c, const char *s, size_t n) {
    size_t start = c->out->len;
    ds4_buf_put(c->out, s, n);
    ds4_chat_spans_add(c->spans, start, c->out->len);
}

static bool put_arg(void *ud, const ds4_json_member *m) {
    calls_ctx *c = ud;
    ds4_buf_clear(&c->tmp);
    ds4_json_unquote(m->key, m->key_len, &c->tmp);
    ds4_buf_puts(c->out, "<arg_key>");
    put_marked(c, c->tmp.data ? c->tmp.data : "", c->tmp.len);
    ds4_buf_puts(c->out, "</arg_key><arg_value>");
    if (m->value[0] == '"') {
        ds4_buf_clear(&c->tmp);
        ds4_json_unquote(m->value, m->value_len, &c->tmp);
        put_marked(c, c->tmp.data ? c->tmp.data : "", c->tmp.len);
    } else {
        put_marked(c, m->value, m->value_len);   /* already Python style */
    }
    ds4_buf_puts(c->out, "</arg_value>");
    return true;
}

bool ds4_glm_render_calls(const ds4_tool_call *calls, int n, ds4_buf *out, ds4_chat_spans *spans,
                          char *err, size_t errlen) {
    calls_ctx c = { .out = out, .spans = spans };
    ds4_buf py = {0};
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        const char *args = calls[i].arguments ? calls[i].arguments : "{}";
        ds4_buf_clear(&py);
        /* Python dict semantics (a repeated key keeps its first position and
         * last value) come with the reformat, as json.loads gives the template */
        if (!calls[i].name || !calls[i].name[0])
            ok = ds4_chat_fail(err, errlen, "tool call %d has no name", i);
        else if (!ds4_json_reformat(args, strlen(args), DS4_JSON_PY, &py) || py.data[0] != '{')
            ok = ds4_chat_fail(err, errlen, "tool call %d: arguments are not a JSON object", i);
        if (!ok) break;
        ds4_buf_puts(out, "<tool_call>");
        put_marked(&c, calls[i].name, strlen(calls[i].name));
        ds4_json_object_each(py.data, py.len, put_arg, &c);
        ds4_buf_puts(out, "</tool_call>");
    }
    ds4_buf_free(&py);
    ds4_buf_free(&c.tmp);
    return ok;
}

/* ---- turns ----------------------------------------------------------------------- */

/* A turn without kept reasoning: 4.7 closes an unopened block, 5.2 writes
 * an empty one (glm-5.2-model.md 7.4). */
static const char *empty_think(bool v52) { return v52 ? "<think></think>" : "</think>"; }

static void put_turn(const char *tag, const ds4_chat_msg *m, const ds4_chat_opts *o, ds4_buf *out) {
    ds4_buf_puts(out, tag);
    ds4_chat_put_text(o, out, whole(m->content).s, whole(m->content).n);
}

static void put_result(const ds4_chat_msg *m, bool first_of_run, const ds4_chat_opts *o, ds4_buf *out) {
    if (first_of_run) ds4_buf_puts(out, DS4_TOK_GLM_OBSERVATION);
    ds4_buf_puts(out, "<tool_response>");
    ds4_chat_put_text(o, out, whole(m->content).s, whole(m->content).n);
    ds4_buf_puts(out, "</tool_response>");
}

static void put_generation_prompt(const ds4_chat_opts *o, ds4_buf *out) {
    ds4_buf_puts(out, DS4_TOK_GLM_ASSISTANT);
    ds4_buf_puts(out, o->think != DS4_THINK_NONE ? "<think>" : empty_think(o->profile == DS4_CHAT_GLM));
}

static bool put_tools(const ds4_chat_opts *o, ds4_buf *out, char *err, size_t errlen) {
    ds4_buf tmp = {0};
    bool ok = true;
    ds4_buf_puts(out, TOOLS_HEAD);
    for (int i = 0; i < o->n_tools && ok; i++) {
        const char *src = ds4_chat_tool_json(&o->tools[i], &tmp);
        size_t start = out->len;
        ds4_buf_puts(out, "{\"type\": \"function\", \"function\": ");
        ok = ds4_json_reformat(src, strlen(src), DS4_JSON_PY, out);
        ds4_buf_puts(out, "}");
        ds4_chat_spans_add(o->client_spans, start, out->len);
        ds4_buf_putc(out, '\n');
        if (!ok) ds4_chat_fail(err, errlen, "tool %d: schema is not valid JSON", i);
    }
    ds4_buf_puts(out, TOOLS_TAIL);
    ds4_buf_free(&tmp);
    return ok;
}

static bool put_assistant(const ds4_chat_msg *m, bool keep_reasoning, bool v52, const ds4_chat_opts *o,
                          ds4_buf *out, char *err, size_t errlen) {
    span content = whole(m->content), reasoning = whole(m->reasoning_content);
    const char *close = m->reasoning_content ? NULL : memmem(content.s, content.n, "</think>", 8);
    if (close) {
        /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        span before = strip_char((span){ content.s, (size_t)(close - content.s) }, '\n', false);
        before = after_last(before, "<think>");
        reasoning = strip_char(before, '\n', true);
        /* content.split('</think>')[-1].lstrip('\n') */
        content = strip_char(after_last(content, "</think>"), '\n', true);
    }
    ds4_buf_puts(out, DS4_TOK_GLM_ASSISTANT);
    if (keep_reasoning && reasoning.n) {
        span r = py_strip(reasoning);
        ds4_buf_puts(out, "<think>");
        ds4_chat_put_text(o, out, r.s, r.n);
        ds4_buf_puts(out, "</think>");
    } else {
        ds4_buf_puts(out, empty_think(v52));
    }
    span c = py_strip(content);
    ds4_chat_put_text(o, out, c.s, c.n);
    if (m->n_tool_calls <= 0) return true;
    const char *exact = ds4_chat_replay_block(m, o);
    if (exact) { ds4_buf_puts(out, exact); return true; }
    return ds4_glm_render_calls(m->tool_calls, m->n_tool_calls, out, o->client_spans, err, errlen);
}

bool ds4_glm_chat_render(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o,
                         ds4_buf *out, char *err, size_t errlen) {
    bool v52 = o->profile == DS4_CHAT_GLM, thinking = o->think != DS4_THINK_NONE;
    int last_user = -1;
    for (int i = 0; i < n; i++)
        if (msgs[i].role == DS4_ROLE_USER) last_user = i;
    ds4_buf_puts(out, DS4_TOK_GLM_GMASK DS4_TOK_GLM_SOP);
    if (v52 && thinking)
        ds4_buf_puts(out, o->think == DS4_THINK_MAX ? DS4_TOK_GLM_SYSTEM "Reasoning Effort: Max"
                                                   : DS4_TOK_GLM_SYSTEM "Reasoning Effort: High");
    if (o->n_tools > 0 && !put_tools(o, out, err, errlen)) return false;
    for (int i = 0; i < n; i++) {
        const ds4_chat_msg *m = &msgs[i];
        switch (m->role) {
        case DS4_ROLE_USER:
            put_turn(DS4_TOK_GLM_USER, m, o, out);
            break;
        case DS4_ROLE_SYSTEM:
        case DS4_ROLE_DEVELOPER:
            put_turn(DS4_TOK_GLM_SYSTEM, m, o, out);
            break;
        case DS4_ROLE_TOOL:
            put_result(m, i == 0 || msgs[i - 1].role != DS4_ROLE_TOOL, o, out);
            break;
        case DS4_ROLE_ASSISTANT:
            if (!put_assistant(m, !o->drop_thinking || i > last_user, v52, o, out, err, errlen)) return false;
            break;
        }
    }
    if (o->add_generation_prompt) put_generation_prompt(o, out);
    return true;
}

void ds4_glm_chat_render_tail(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o, ds4_buf *out) {
    for (int i = 0; i < n; i++) {
        if (msgs[i].role == DS4_ROLE_TOOL) put_result(&msgs[i], i == 0 || msgs[i - 1].role != DS4_ROLE_TOOL, o, out);
        else if (msgs[i].role == DS4_ROLE_USER) put_turn(DS4_TOK_GLM_USER, &msgs[i], o, out);
    }
    put_generation_prompt(o, out);
}

void ds4_glm_chat_visible_turn(const char *prompt, size_t prompt_len, const char *content, size_t content_len,
                               const char *calls, size_t calls_len, ds4_chat_profile profile, ds4_buf *out) {
    size_t open = strlen("<think>");
    ds4_buf_put(out, prompt, prompt_len >= open ? prompt_len - open : prompt_len);
    ds4_buf_puts(out, empty_think(profile == DS4_CHAT_GLM));
    span c = py_strip((span){ content, content_len });
    ds4_buf_put(out, c.s, c.n);
    ds4_buf_put(out, calls, calls_len);
}
