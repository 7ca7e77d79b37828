/* test_glm_tools.c -- the GLM tool-call parser. Oracles: the call syntax of
 * glm-5.2-model.md 7.2 / 7.6 (as llama.cpp and vLLM read it), json_util's
 * minified form for expected arguments, the renderer (glm_chat.c, itself byte-exact against the
 * official template) for round trips, and the invariant that any chunking
 * of the input gives the same coalesced events. */
#include "check.h"
#include "text/glm_chat.h"
#include "text/glm_tools.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- what the parser reported --------------------------------------------- */

typedef struct {
    ds4_buf log;            /* one line per event, text events coalesced */
    int last;
    ds4_buf reasoning, content, block;
    ds4_buf streamed[8];    /* ARGS concatenation per call */
    char *args[8], *names[8];
    int ncalls, nerrors, nblock_start;
    char *error;
} seen;

static bool text_kind(ds4_dsml_event_kind k) {
    return k == DS4_DSML_EV_REASONING || k == DS4_DSML_EV_CONTENT || k == DS4_DSML_EV_ARGS;
}

static void on_event(void *ud, const ds4_dsml_event *ev) {
    seen *s = ud;
    bool text = text_kind(ev->kind);
    if (text && !ev->len) return;
    if (text && (int)ev->kind == s->last) s->log.len--;
    else {
        char head[200];
        snprintf(head, sizeof head, "%d/%d/%s/%d/%s:", ev->kind, ev->index, ev->name ? ev->name : "",
                 ev->is_string, ev->message ? ev->message : "");
        ds4_buf_puts(&s->log, head);
    }
    if (ev->kind != DS4_DSML_EV_ERROR && ev->text) ds4_buf_put(&s->log, ev->text, ev->len);
    ds4_buf_putc(&s->log, '\n');
    s->last = text ? (int)ev->kind : -1;
    int i = ev->index < 8 ? ev->index : 7;
    switch (ev->kind) {
    case DS4_DSML_EV_REASONING: ds4_buf_put(&s->reasoning, ev->text, ev->len); break;
    case DS4_DSML_EV_CONTENT:   ds4_buf_put(&s->content, ev->text, ev->len); break;
    case DS4_DSML_EV_ARGS:      ds4_buf_put(&s->streamed[i], ev->text, ev->len); break;
    case DS4_DSML_EV_BLOCK_START: s->nblock_start++; break;
    case DS4_DSML_EV_CALL_END:
        s->args[i] = strndup(ev->text, ev->len);
        s->names[i] = strdup(ev->name);
        s->ncalls++;
        break;
    case DS4_DSML_EV_BLOCK_END: ds4_buf_put(&s->block, ev->text, ev->len); break;
    case DS4_DSML_EV_ERROR: s->nerrors++; s->error = strdup(ev->message); break;
    default: break;
    }
}

static void seen_free(seen *s) {
    ds4_buf *b[] = { &s->log, &s->reasoning, &s->content, &s->block };
    for (int i = 0; i < 4; i++) ds4_buf_free(b[i]);
    for (int i = 0; i < 8; i++) { ds4_buf_free(&s->streamed[i]); free(s->args[i]); free(s->names[i]); }
    free(s->error);
}

/* The weather tool's schema: city is a string, days an integer. */
static ds4_glm_arg_type weather_types(void *ud, const char *tool, const char *key) {
    (void)ud;
    static const char schema[] = "{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
                                 "{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                                 "\"note\":{\"type\":[\"string\",\"null\"]}}}}";
    return strcmp(tool, "get_weather") ? DS4_GLM_ARG_UNKNOWN : ds4_glm_schema_arg_type(schema, key);
}

static const ds4_glm_opts OPTS = { .thinking = true, .tools = true, .arg_type = weather_types };

/* chunk: 0 = one piece, > 0 fixed size, < 0 pseudo-random sizes; structure
 * (may be NULL) samples in_structure after every chunk. */
static void parse(const ds4_glm_opts *o, const char *s, int chunk, seen *out) {
    memset(out, 0, sizeof *out);
    out->last = -1;
    ds4_glm_parser *p = ds4_glm_new(o, on_event, out);
    size_t n = strlen(s);
    uint32_t x = (uint32_t)n * 2654435761u + (uint32_t)-chunk;
    for (size_t i = 0; i < n;) {
        size_t k = chunk > 0 ? (size_t)chunk : chunk == 0 ? n : 1 + (x = x * 1103515245u + 12345u) % 11;
        if (k > n - i) k = n - i;
        ds4_glm_feed(p, s + i, k);
        i += k;
    }
    ds4_glm_finish(p);
    ds4_glm_free(p);
}

static void check_chunking(const ds4_glm_opts *o, const char *s) {
    seen whole, piece;
    parse(o, s, 0, &whole);
    const int chunks[] = { 1, 2, 5, -1, -2 };
    for (int c = 0; c < 5; c++) {
        parse(o, s, chunks[c], &piece);
        CHECK(whole.log.len == piece.log.len && !memcmp(whole.log.data, piece.log.data, whole.log.len),
              "chunking %d changes the events of %.60s:\n%s\nvs\n%s", chunks[c], s, whole.log.data, piece.log.data);
        seen_free(&piece);
    }
    seen_free(&whole);
}

/* The parser's arguments are minified JSON in the model's order, so the
 * expected text is the input minified (json_util's COMPACT form). */
static bool same_compact(const char *got, const char *want) {
    ds4_buf w = {0};
    bool eq = ds4_json_reformat(want, strlen(want), DS4_JSON_COMPACT, &w) && got && !strcmp(got, w.data);
    ds4_buf_free(&w);
    return eq;
}

static const char *S(const ds4_buf *b) { return b->data ? b->data : ""; }

/* ---- cases ---------------------------------------------------------------------- */

static void test_turn(void) {
    const char *gen = "<think>Need the weather.</think>Let me check.\n"
                      "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris </2 \"x\"</arg_value>"
                      "<arg_key>days</arg_key><arg_value> 2 </arg_value></tool_call>\n"
                      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>";
    seen s;
    parse(&OPTS, gen, 0, &s);
    CHECK(!s.nerrors, "error: %s", s.error);
    CHECK(!strcmp(S(&s.reasoning), "Need the weather."), "reasoning %s", S(&s.reasoning));
    CHECK(!strcmp(S(&s.content), "Let me check."), "content is right-trimmed before the call: '%s'", S(&s.content));
    CHECK(s.ncalls == 2 && s.nblock_start == 1, "%d calls, %d block starts", s.ncalls, s.nblock_start);
    CHECK(s.ncalls == 2 && !strcmp(s.names[0], "get_weather") && !strcmp(s.names[1], "get_weather"), "names");
    CHECK(s.ncalls == 2 && !strcmp(s.args[0], "{\"city\":\"Paris </2 \\\"x\\\"\",\"days\":2}"), "args 0: %s", s.args[0]);
    CHECK(s.ncalls == 2 && !strcmp(s.args[1], "{\"city\":\"Oslo\"}"), "args 1: %s", s.args[1]);
    for (int i = 0; i < s.ncalls; i++)
        CHECK(!strcmp(S(&s.streamed[i]), s.args[i]), "call %d: streamed %s != final %s", i, S(&s.streamed[i]), s.args[i]);
    const char *from = strstr(gen, "\n<tool_call>");
    CHECK(!strcmp(S(&s.block), from), "exact block, the white space before it included: %s", S(&s.block));
    seen_free(&s);
    check_chunking(&OPTS, gen);
}

/* Values: typed strings stay strings even when they look like JSON;
 * untyped and non-string values become JSON when they parse as JSON, else
 * strings; a zero-argument call is {}. */
static void test_values(void) {
    const char *gen =
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>42</arg_value>"
        "<arg_key>days</arg_key><arg_value>two</arg_value><arg_key>note</arg_key><arg_value>null</arg_value>"
        "<arg_key>extra</arg_key><arg_value>{\"a\": [1, true, \"</x>\"]}</arg_value></tool_call>"
        "<tool_call>other<arg_key>q</arg_key><arg_value>plain text</arg_value>"
        "<arg_key>n</arg_key><arg_value>-1.5e3</arg_value></tool_call><tool_call>now</tool_call>";
    ds4_glm_opts o = OPTS;
    o.thinking = false;
    seen s;
    parse(&o, gen, 0, &s);
    CHECK(!s.nerrors && s.ncalls == 3, "%d calls, error %s", s.ncalls, s.error);
    if (s.ncalls == 3) {
        CHECK(!strcmp(s.args[0], "{\"city\":\"42\",\"days\":\"two\",\"note\":\"null\",\"extra\":{\"a\":[1,true,\"</x>\"]}}"),
              "typed values: %s", s.args[0]);
        CHECK(!strcmp(s.args[1], "{\"q\":\"plain text\",\"n\":-1.5e3}"), "untyped values: %s", s.args[1]);
        CHECK(!strcmp(s.args[2], "{}") && !strcmp(s.names[2], "now"), "zero-argument call: %s", s.args[2]);
    }
    for (int i = 0; i < s.ncalls; i++) CHECK(!strcmp(S(&s.streamed[i]), s.args[i]), "call %d streamed", i);
    seen_free(&s);
    check_chunking(&o, gen);
}

/* A "</" that is not the closing tag, and a prefix of one, stay value
 * bytes; "</tool_call>" is never taken from inside a value. */
static void test_lookahead(void) {
    const char *gen = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>a</arg_valu</tool_call>b"
                      "</arg_value></tool_call>";
    ds4_glm_opts o = OPTS;
    o.thinking = false;
    seen s;
    parse(&o, gen, 0, &s);
    CHECK(s.ncalls == 1 && !strcmp(s.args[0], "{\"city\":\"a</arg_valu</tool_call>b\"}"), "lookahead: %s",
          s.ncalls ? s.args[0] : "no call");
    seen_free(&s);
    check_chunking(&o, gen);
}

static void test_no_tools(void) {
    ds4_glm_opts o = { .thinking = true, .tools = false };
    const char *gen = "<think>a</think>b<tool_call>f</tool_call>  ";
    seen s;
    parse(&o, gen, 0, &s);
    CHECK(!s.ncalls && !strcmp(S(&s.content), "b<tool_call>f</tool_call>  "), "content %s", S(&s.content));
    seen_free(&s);
    check_chunking(&o, gen);
    o.tools = true;
    parse(&o, "<think>x<tool_call>f</tool_call>", 0, &s);
    CHECK(!s.ncalls && !strcmp(S(&s.reasoning), "x<tool_call>f</tool_call>"), "reasoning is not scanned");
    seen_free(&s);
}

static void test_errors(void) {
    static const struct { const char *gen, *msg; } cases[] = {
        { "<tool_call></tool_call>", "without a name" },
        { "<tool_call> \n<arg_key>k</arg_key>", "without a name" },
        { "<tool_call>f</tool_call>then text", "text after the tool calls" },
        { "<tool_call>f<arg_key>k</arg_key>v", "expected <arg_value>" },
        { "<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value>x", "expected <arg_key> or </tool_call>" },
        { "<tool_call>f<oops>", "after the tool name" },
        { "<tool_call>f<arg_key>k</arg_key><arg_value>v", "unterminated" },
        { "<tool_call>f", "unterminated" },
        { "<tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value></tool_", "unterminated" },
    };
    ds4_glm_opts o = OPTS;
    o.thinking = false;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        seen s;
        parse(&o, cases[i].gen, 0, &s);
        CHECK(s.nerrors == 1 && s.error && strstr(s.error, cases[i].msg), "%s: error %s, want %s", cases[i].gen,
              s.error ? s.error : "none", cases[i].msg);
        CHECK(!s.block.len, "%s: no block after an error", cases[i].gen);
        seen_free(&s);
        check_chunking(&o, cases[i].gen);
    }
    char *long_name = malloc(6000);
    memcpy(long_name, "<tool_call>", 11);
    memset(long_name + 11, 'a', 5000);
    long_name[5011] = 0;
    seen s;
    parse(&o, long_name, 7, &s);
    CHECK(s.nerrors == 1 && strstr(s.error, "too long"), "long name: %s", s.error ? s.error : "none");
    seen_free(&s);
    free(long_name);
}

static void test_structure(void) {
    ds4_glm_opts o = OPTS;
    seen s = {0};
    s.last = -1;
    ds4_glm_parser *p = ds4_glm_new(&o, on_event, &s);
    static const struct { const char *feed; bool structure, reasoning; } steps[] = {
        { "<think>hm", false, true }, { "</think>ok", false, false }, { "<tool_call>get_", true, false },
        { "weather<arg_key>ci", true, false }, { "ty</arg_key><arg_value>Pa", false, false },
        { "ris</", true, false }, { "arg_value><arg_key>days</arg_key><arg_value>", true, false },
        { "[\"a", false, false }, { "\"", true, false }, { "]</arg_value></tool_call>", true, false },
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        ds4_glm_feed(p, steps[i].feed, strlen(steps[i].feed));
        CHECK(ds4_glm_in_structure(p) == steps[i].structure, "after '%s': structure %d", steps[i].feed, !steps[i].structure);
        CHECK(ds4_glm_in_reasoning(p) == steps[i].reasoning, "after '%s': reasoning", steps[i].feed);
    }
    CHECK(ds4_glm_block_open(p) && !ds4_glm_failed(p), "block open after a call");
    ds4_glm_finish(p);
    CHECK(s.ncalls == 1 && !strcmp(s.args[0], "{\"city\":\"Paris\",\"days\":[\"a\"]}"), "args %s", s.ncalls ? s.args[0] : "");
    ds4_glm_free(p);
    seen_free(&s);
}

/* Rendered calls (the template's form) parse back to the same arguments. */
static void test_round_trip(void) {
    ds4_tool_call calls[] = {
        { "a", "get_weather", "{\"city\": \"Zürich <b> & \\\"q\\\"\", \"days\": 3, \"note\": \"x\"}" },
        { "b", "other", "{\"obj\": {\"k\": [1, 2.5, null]}, \"s\": \"text\", \"t\": true}" },
        { "c", "now", "{}" },
    };
    ds4_buf out = {0};
    char err[200];
    CHECK(ds4_glm_render_calls(calls, 3, &out, NULL, err, sizeof err), "%s", err);
    ds4_glm_opts o = OPTS;
    o.thinking = false;
    seen s;
    parse(&o, out.data, 0, &s);
    CHECK(!s.nerrors && s.ncalls == 3, "%d calls (%s)", s.ncalls, s.error);
    for (int i = 0; i < 3 && i < s.ncalls; i++)
        CHECK(!strcmp(s.names[i], calls[i].name) && same_compact(s.args[i], calls[i].arguments), "call %d: %s", i, s.args[i]);
    CHECK(!strcmp(S(&s.block), out.data), "block is the rendered text");
    seen_free(&s);
    ds4_buf_free(&out);
}

static void test_schema_types(void) {
    const char *oai = "{\"name\":\"f\",\"parameters\":{\"properties\":{\"s\":{\"type\":\"string\"},\"i\":{\"type\":\"integer\"},"
                      "\"u\":{\"type\":[\"number\",\"string\"]},\"v\":{\"type\":[\"number\"]},\"w\":{}}}}";
    const char *anth = "{\"name\":\"f\",\"input_schema\":{\"properties\":{\"s\":{\"type\":\"string\"}}}}";
    CHECK(ds4_glm_schema_arg_type(oai, "s") == DS4_GLM_ARG_STRING, "string");
    CHECK(ds4_glm_schema_arg_type(oai, "i") == DS4_GLM_ARG_OTHER, "integer");
    CHECK(ds4_glm_schema_arg_type(oai, "u") == DS4_GLM_ARG_STRING, "type list with string");
    CHECK(ds4_glm_schema_arg_type(oai, "v") == DS4_GLM_ARG_OTHER, "type list without string");
    CHECK(ds4_glm_schema_arg_type(oai, "w") == DS4_GLM_ARG_UNKNOWN, "no type");
    CHECK(ds4_glm_schema_arg_type(oai, "missing") == DS4_GLM_ARG_UNKNOWN, "unknown key");
    CHECK(ds4_glm_schema_arg_type(anth, "s") == DS4_GLM_ARG_STRING, "anthropic input_schema");
    CHECK(ds4_glm_schema_arg_type("{bad", "s") == DS4_GLM_ARG_UNKNOWN, "invalid schema");
    CHECK(ds4_glm_schema_arg_type(NULL, "s") == DS4_GLM_ARG_UNKNOWN, "no schema");
}

int main(void) {
    test_turn();
    test_values();
    test_lookahead();
    test_no_tools();
    test_errors();
    test_structure();
    test_round_trip();
    test_schema_types();
    return check_done("test_glm_tools");
}
