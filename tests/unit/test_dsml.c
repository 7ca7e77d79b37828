/* test_dsml.c -- the DSML parser and JSON <-> DSML conversions. Oracles:
 * the sheet's E4/E6 model outputs and renderings (fixtures of test_chat),
 * cJSON for JSON equivalence, and the invariant that any chunking of the
 * input gives the same (coalesced) event sequence. */
#include "check.h"
#include "text/dsml.h"
#include "text/chat.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FIX "tests/fixtures/chat/"
#define DSML "｜DSML｜"

static char *slurp(const char *name) {
    char *s = ds4_read_file(name, NULL);
    if (!s) { fprintf(stderr, "missing fixture %s\n", name); exit(1); }
    return s;
}

/* ---- event log: text events of one kind coalesced, everything else verbatim -- */

typedef struct {
    ds4_buf log;
    int last_kind;
    ds4_buf args[8];          /* ARGS concatenation per call */
    char *call_args[8];       /* CALL_END text per call */
    bool call_valid[8];
    int ncalls, nerrors;
    char *err_text;
    size_t err_len;
    bool utf8_ok;
} evlog;

static bool is_text(ds4_dsml_event_kind k) {
    return k == DS4_DSML_EV_REASONING || k == DS4_DSML_EV_CONTENT || k == DS4_DSML_EV_ARGS;
}

static bool utf8_complete(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return len <= back;
    }
    return true;
}

static void on_event(void *ud, const ds4_dsml_event *ev) {
    evlog *l = ud;
    if (is_text(ev->kind) && ev->len == 0) return;
    if (is_text(ev->kind) && !utf8_complete(ev->text, ev->len)) l->utf8_ok = false;
    if (ev->kind == DS4_DSML_EV_ARGS && ev->index < 8) ds4_buf_put(&l->args[ev->index], ev->text, ev->len);
    if (ev->kind == DS4_DSML_EV_CALL_END && ev->index < 8) {
        free(l->call_args[ev->index]);
        l->call_args[ev->index] = strndup(ev->text, ev->len);
        l->call_valid[ev->index] = ev->args_valid;
        l->ncalls++;
    }
    if (ev->kind == DS4_DSML_EV_ERROR) l->nerrors++;
    if (is_text(ev->kind) && (int)ev->kind == l->last_kind) {
        l->log.len--;                           /* reopen the previous text line */
    } else {
        char head[160];
        snprintf(head, sizeof head, "%d|%d|%s|%d|%d|%s|", ev->kind, ev->index, ev->name ? ev->name : "-",
                 ev->is_string, ev->args_valid, ev->message ? ev->message : "-");
        ds4_buf_puts(&l->log, head);
    }
    /* an ERROR carries the raw text fed *so far*, which depends on the
     * chunking; only its length is logged, checked against the input below */
    if (ev->kind == DS4_DSML_EV_ERROR) { l->err_text = strndup(ev->text, ev->len); l->err_len = ev->len; }
    else if (ev->text) ds4_buf_put(&l->log, ev->text, ev->len);
    ds4_buf_putc(&l->log, '\n');
    l->last_kind = is_text(ev->kind) ? (int)ev->kind : -1;
}

static void evlog_free(evlog *l) {
    ds4_buf_free(&l->log);
    free(l->err_text);
    for (int i = 0; i < 8; i++) { ds4_buf_free(&l->args[i]); free(l->call_args[i]); }
}

/* Feeds s in chunks of `chunk` bytes (0 = one piece, <0 = pseudo-random sizes). */
static void run(const ds4_dsml_opts *o, const char *s, size_t n, int chunk, evlog *l) {
    memset(l, 0, sizeof *l);
    l->last_kind = -1;
    l->utf8_ok = true;
    ds4_dsml_parser *p = ds4_dsml_new(o, on_event, l);
    uint32_t x = (uint32_t)n * 2654435761u + (uint32_t)-chunk;
    for (size_t i = 0; i < n;) {
        size_t k = chunk > 0 ? (size_t)chunk : chunk == 0 ? n : (size_t)(1 + (x = x * 1103515245u + 12345u) % 9);
        if (k > n - i) k = n - i;
        ds4_dsml_feed(p, s + i, k);
        i += k;
    }
    ds4_dsml_finish(p);
    ds4_dsml_free(p);
}

/* The chunking invariant, checked on every input the tests use. */
static void check_chunking(const ds4_dsml_opts *o, const char *s, const char *what) {
    evlog whole, piece;
    run(o, s, strlen(s), 0, &whole);
    const int chunks[] = { 1, 2, 3, 7, -1, -2, -3 };
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        run(o, s, strlen(s), chunks[c], &piece);
        bool eq = whole.log.len == piece.log.len && memcmp(whole.log.data, piece.log.data, whole.log.len) == 0;
        CHECK(eq, "%s: chunking %d changes the events", what, chunks[c]);
        if (!eq) fprintf(stderr, "whole:\n%s\npieces:\n%s\n", whole.log.data, piece.log.data);
        /* a truncated sequence at the very end is released as is by finish */
        CHECK(piece.utf8_ok || !utf8_complete(s, strlen(s)), "%s: a text event splits UTF-8 (chunking %d)", what, chunks[c]);
        evlog_free(&piece);
    }
    evlog_free(&whole);
}

static bool json_equal(const char *a, const char *b) {
    cJSON *x = cJSON_Parse(a), *y = cJSON_Parse(b);
    bool eq = x && y && cJSON_Compare(x, y, true);
    cJSON_Delete(x);
    cJSON_Delete(y);
    return eq;
}

static const ds4_dsml_opts DS4_OPTS = { .thinking = false, .tools = true, .decode_entities = true };

/* E4: the model's tool-calling turn (thinking mode), as ds4 receives it
 * (generation stops at the closing tag, before EOS). */
static void test_e4_generated(void) {
    char *gen = slurp(FIX "e4_generated.txt");
    char *eos = strstr(gen, DS4_STR_EOS);
    CHECK(eos != NULL, "fixture ends with EOS");
    if (eos) *eos = 0;
    ds4_dsml_opts o = { .thinking = true, .tools = true, .decode_entities = true };
    ds4_dsml_result r;
    ds4_dsml_parse(&o, gen, strlen(gen), &r);
    CHECK(!r.error, "no error: %s", r.error ? r.error : "");
    CHECK(r.reasoning && !strcmp(r.reasoning, "The user wants to know the weather in Beijing. I should use the get_weather tool."),
          "reasoning");
    CHECK(r.content && !strcmp(r.content, ""), "empty content");
    CHECK(r.n_calls == 1 && !strcmp(r.calls[0].name, "get_weather") &&
          !strcmp(r.calls[0].arguments, "{\"location\":\"Beijing\",\"unit\":\"celsius\"}"), "ds4 arguments text");
    const char *blk = strstr(gen, "\n\n<" DSML "tool_calls>");
    CHECK(r.raw_block && blk && !strcmp(r.raw_block, blk), "raw block is the exact sampled text");
    /* the canonical renderings of the parsed call give back the same bytes */
    ds4_tool_call call = { "x", "get_weather", "{\"location\": \"Beijing\", \"unit\": \"celsius\"}" };
    for (int st = 0; st < 2; st++) {
        ds4_buf out = {0};
        CHECK(ds4_dsml_render_calls(&call, 1, st ? DS4_DSML_DS4 : DS4_DSML_OFFICIAL, &out, NULL, 0), "render");
        CHECK(blk && out.data && !strcmp(out.data, blk), "render style %d equals the sampled block", st);
        ds4_buf_free(&out);
    }
    check_chunking(&o, gen, "e4");
    ds4_dsml_result_free(&r);
    free(gen);
}

/* E6's assistant turn in both renderings: two parallel calls, one without
 * arguments (empty line in the official form, none in ds4's). */
static void test_e6_parallel(void) {
    static const char *fix[] = { FIX "e6_official_tail.txt", FIX "e6_ds4_tail.txt" };
    for (int f = 0; f < 2; f++) {
        char *tail = slurp(fix[f]);
        const char *start = strstr(tail, "</think>") + strlen("</think>");
        char *end = strstr(tail, DS4_STR_EOS);
        *end = 0;
        ds4_dsml_result r;
        ds4_dsml_parse(&DS4_OPTS, start, strlen(start), &r);
        CHECK(!r.error && r.n_calls == 2, "e6 %d: %d calls (%s)", f, r.n_calls, r.error ? r.error : "");
        CHECK(r.content && !strcmp(r.content, "Checking."), "e6 content");
        if (r.n_calls == 2) {
            CHECK(!strcmp(r.calls[0].name, "get_weather") && !strcmp(r.calls[1].name, "now"), "names");
            CHECK(json_equal(r.calls[0].arguments, "{\"location\":\"Paris\",\"days\":2,\"opts\":{\"units\":[\"C\",\"F\"],\"x\":null}}"),
                  "args %s", r.calls[0].arguments);
            CHECK(!strcmp(r.calls[0].arguments, "{\"location\":\"Paris\",\"days\":2,\"opts\":{\"units\":[\"C\",\"F\"],\"x\":null}}"),
                  "minified args %s", r.calls[0].arguments);
            CHECK(!strcmp(r.calls[1].arguments, "{}"), "zero-argument call");
        }
        check_chunking(&DS4_OPTS, start, fix[f]);
        ds4_dsml_result_free(&r);
        free(tail);
    }
}

static const char *BLOCK_A =
    "Let me look.  \n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"read_file\">\n"
    "<" DSML "parameter name=\"path\" string=\"true\">src/a&amp;b.c</" DSML "parameter>\n"
    "<" DSML "parameter name=\"range\" string=\"false\">[ 1, 200 ]</" DSML "parameter>\n"
    "<" DSML "parameter name=\"body\" string=\"true\">line 1\n\"q\" <x> \\ 中文 &lt;/" DSML "parameter></" DSML "parameter>\n"
    "</" DSML "invoke>\n<" DSML "invoke name=\"a&amp;b\">\n</" DSML "invoke>\n</" DSML "tool_calls>";

static void test_events_and_args(void) {
    evlog l;
    run(&DS4_OPTS, BLOCK_A, strlen(BLOCK_A), 1, &l);
    CHECK(l.nerrors == 0 && l.ncalls == 2, "two calls, no error");
    const char *want0 = "{\"path\":\"src/a&b.c\",\"range\":[1,200],\"body\":\"line 1\\n\\\"q\\\" <x> \\\\ 中文 </" DSML "parameter>\"}";
    CHECK(l.call_args[0] && !strcmp(l.call_args[0], want0), "call 0 args: %s", l.call_args[0]);
    CHECK(l.args[0].data && !strcmp(l.args[0].data, want0), "ARGS deltas concatenate to the arguments");
    CHECK(l.call_args[1] && !strcmp(l.call_args[1], "{}"), "call 1 args");
    CHECK(strstr(l.log.data, "|0|read_file|") && strstr(l.log.data, "|1|a&b|"), "names decoded");
    CHECK(strstr(l.log.data, "Let me look.\n") != NULL, "content right-trimmed before the block");
    ds4_dsml_result r;
    ds4_dsml_parse(&DS4_OPTS, BLOCK_A, strlen(BLOCK_A), &r);
    CHECK(r.raw_block && !strncmp(r.raw_block, "\n\n<" DSML "tool_calls>", 21) && !strcmp(r.content, "Let me look."),
          "raw block starts at the two newlines");
    ds4_dsml_result_free(&r);
    evlog_free(&l);
    check_chunking(&DS4_OPTS, BLOCK_A, "block A");
    /* without entity decoding (official parser semantics) bytes stay */
    ds4_dsml_opts raw = { .tools = true };
    run(&raw, BLOCK_A, strlen(BLOCK_A), 0, &l);
    CHECK(l.call_args[0] && strstr(l.call_args[0], "src/a&amp;b.c") && strstr(l.call_args[0], "&lt;/"), "no decoding");
    evlog_free(&l);
    check_chunking(&raw, BLOCK_A, "block A raw");
}

/* Other tag families, optional string attribute, invalid JSON value. */
static void test_tolerance(void) {
    static const struct { const char *in; const char *args; bool valid; } cases[] = {
        { "<DSML｜tool_calls><DSML｜invoke name=\"f\"><DSML｜parameter name=\"k\">v</DSML｜parameter></DSML｜invoke></DSML｜tool_calls>",
          "{\"k\":\"v\"}", true },
        { "x<tool_calls>\n<invoke name=\"f\">\n<parameter name=\"n\" string=\"false\">3</parameter>\n</invoke>\n</tool_calls>",
          "{\"n\":3}", true },
        { "<" DSML "tool_calls><" DSML "invoke  name = \"f\" extra=\"1\"><" DSML "parameter string=\"false\" name=\"o\">{\"a\": [1, \"x y\"]}</" DSML "parameter></" DSML "invoke></" DSML "tool_calls>",
          "{\"o\":{\"a\":[1,\"x y\"]}}", true },
        { "<" DSML "tool_calls><" DSML "invoke name=\"f\"><" DSML "parameter name=\"o\" string=\"false\">not json</" DSML "parameter></" DSML "invoke></" DSML "tool_calls>",
          "{}", false },
        { "<" DSML "tool_calls><" DSML "invoke name=\"f\"><" DSML "parameter name=\"o\" string=\"false\"></" DSML "parameter></" DSML "invoke></" DSML "tool_calls>",
          "{}", false },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ds4_dsml_result r;
        ds4_dsml_parse(&DS4_OPTS, cases[c].in, strlen(cases[c].in), &r);
        CHECK(!r.error && r.n_calls == 1, "case %zu: %s", c, r.error ? r.error : "no call");
        if (r.n_calls == 1)
            CHECK(!strcmp(r.calls[0].arguments, cases[c].args) && r.calls[0].args_valid == cases[c].valid,
                  "case %zu: %s", c, r.calls[0].arguments);
        ds4_dsml_result_free(&r);
        check_chunking(&DS4_OPTS, cases[c].in, "tolerance");
    }
}

/* Malformed or truncated input: one ERROR with the full raw text, no crash. */
static void test_errors(void) {
    static const struct { const char *in; const char *msg; } cases[] = {
        { "<" DSML "tool_calls>\n<" DSML "invoke>\n</" DSML "invoke>\n</" DSML "tool_calls>", "without a name" },
        { "<" DSML "tool_calls>\n<" DSML "invoke name=\"\">\n</" DSML "invoke>\n</" DSML "tool_calls>", "without a name" },
        { "<" DSML "tool_calls>\nhello", "expected an invoke" },
        { "<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\ntext", "expected a parameter" },
        { "<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"a\" string=\"true\">abc", "unterminated" },
        { "<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"a\" string=\"true\">abc</" DSML "param", "unterminated" },
        { "<" DSML "tool_calls>\n<" DSML "invoke name=\"f", "unterminated" },
        { "<" DSML "tool_calls>", "unterminated" },
        { "<" DSML "tool_calls>\n</" DSML "tool_calls>", "without any invoke" },
        { "<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n</" DSML "invoke>\n</" DSML "tool_calls> more", "after the tool_calls" },
        { "<" DSML "tool_calls>\n<" DSML "invokes name=\"f\">", "malformed invoke" },
        { "<" DSML "tool_calls>\n<" DSML "invoke name=\"f\" broken>", "malformed invoke" },
        { "<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter string=\"true\">x</" DSML "parameter>", "parameter tag without a name" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ds4_dsml_result r;
        ds4_dsml_parse(&DS4_OPTS, cases[c].in, strlen(cases[c].in), &r);
        CHECK(r.error && strstr(r.error, cases[c].msg), "case %zu: error '%s', want '%s'", c, r.error ? r.error : "(none)", cases[c].msg);
        ds4_dsml_result_free(&r);
        for (int chunk = 0; chunk < 2; chunk++) {
            evlog l;
            run(&DS4_OPTS, cases[c].in, strlen(cases[c].in), chunk, &l);
            CHECK(l.nerrors == 1 && l.err_text, "case %zu: one ERROR event", c);
            /* the error carries every byte fed so far: all of it in one piece,
             * a prefix reaching the offending byte when fed bytewise */
            size_t n = strlen(cases[c].in);
            CHECK(l.err_text && !memcmp(l.err_text, cases[c].in, l.err_len) && l.err_len > 0 &&
                  (chunk == 1 || l.err_len == n), "case %zu: raw text in the error (%zu of %zu)", c, l.err_len, n);
            evlog_free(&l);
        }
        check_chunking(&DS4_OPTS, cases[c].in, "errors");
    }
    /* a very long tag is cut off instead of being buffered forever */
    ds4_buf big = {0};
    ds4_buf_puts(&big, "<" DSML "tool_calls>\n<" DSML "invoke name=\"");
    for (int i = 0; i < 5000; i++) ds4_buf_putc(&big, 'x');
    ds4_dsml_result r;
    ds4_dsml_parse(&DS4_OPTS, big.data, big.len, &r);
    CHECK(r.error && strstr(r.error, "too long"), "long tag: %s", r.error ? r.error : "(none)");
    ds4_dsml_result_free(&r);
    ds4_buf_free(&big);
}

/* Channels: reasoning is never scanned; no tools means DSML is content;
 * held-back text comes out at finish. */
static void test_channels(void) {
    const char *think_dsml = "<think>plan <" DSML "tool_calls> is not a call</think>ok \n";
    ds4_dsml_opts th = { .thinking = true, .tools = true, .decode_entities = true };
    ds4_dsml_result r;
    ds4_dsml_parse(&th, think_dsml, strlen(think_dsml), &r);
    CHECK(!r.error && r.n_calls == 0 && r.reasoning && !strcmp(r.reasoning, "plan <" DSML "tool_calls> is not a call"),
          "DSML inside reasoning is reasoning");
    CHECK(r.content && !strcmp(r.content, "ok \n"), "trailing white space kept without a block: '%s'", r.content);
    ds4_dsml_result_free(&r);
    check_chunking(&th, think_dsml, "think");
    const char *unfinished = "still thinking </thi";
    ds4_dsml_parse(&th, unfinished, strlen(unfinished), &r);
    CHECK(r.reasoning && !strcmp(r.reasoning, unfinished) && !strcmp(r.content, ""), "unfinished reasoning released at finish");
    ds4_dsml_result_free(&r);
    check_chunking(&th, unfinished, "unfinished think");
    ds4_dsml_opts none = { .tools = false };
    ds4_dsml_parse(&none, BLOCK_A, strlen(BLOCK_A), &r);
    CHECK(!r.error && r.n_calls == 0 && !strcmp(r.content, BLOCK_A) && !r.reasoning, "no tools: everything is content");
    ds4_dsml_result_free(&r);
    const char *partial = "a <" DSML "tool_cal";
    ds4_dsml_parse(&DS4_OPTS, partial, strlen(partial), &r);
    CHECK(!r.error && !strcmp(r.content, partial), "a partial opening tag at the end is content");
    ds4_dsml_result_free(&r);
    check_chunking(&DS4_OPTS, partial, "partial");
    const char *utf = "é中😀 <b>ok</b> \xF0\x9F";   /* ends in a truncated sequence */
    check_chunking(&DS4_OPTS, utf, "utf8");
    check_chunking(&th, utf, "utf8 think");
}

typedef struct { const char *prefix; bool structure; } probe;

/* ds4_dsml_in_structure() along a generated block. */
static void test_in_structure(void) {
    static const probe probes[] = {
        { "Hi", false },
        { "Hi\n\n<" DSML "tool_calls>", true },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "inv", true },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n", true },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"p\" string=\"true\">", false },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"p\" string=\"true\">code <", false },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"p\" string=\"true\">code </", true },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"p\" string=\"true\">x</" DSML "parameter>", true },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"q\" string=\"false\">[1, ", true },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"q\" string=\"false\">[1, \"a b", false },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"q\" string=\"false\">[1, \"a \\\"", false },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"q\" string=\"false\">[1, \"a\"", true },
        { "Hi\n\n<" DSML "tool_calls>\n<" DSML "invoke name=\"f\">\n</" DSML "invoke>\n</" DSML "tool_calls>", false },
    };
    for (size_t c = 0; c < sizeof probes / sizeof probes[0]; c++) {
        for (int bytewise = 0; bytewise < 2; bytewise++) {
            evlog l;
            memset(&l, 0, sizeof l);
            ds4_dsml_parser *p = ds4_dsml_new(&DS4_OPTS, on_event, &l);
            const char *s = probes[c].prefix;
            if (bytewise) for (size_t i = 0; s[i]; i++) ds4_dsml_feed(p, s + i, 1);
            else ds4_dsml_feed(p, s, strlen(s));
            CHECK(ds4_dsml_in_structure(p) == probes[c].structure, "probe %zu (bytewise %d)", c, bytewise);
            if (c == sizeof probes / sizeof probes[0] - 1) CHECK(ds4_dsml_done(p), "done after the block");
            else if (c >= 1) CHECK(ds4_dsml_block_open(p), "block open at probe %zu", c);
            ds4_dsml_free(p);
            evlog_free(&l);
        }
    }
    ds4_dsml_opts th = { .thinking = true, .tools = true };
    ds4_dsml_parser *p = ds4_dsml_new(&th, on_event, NULL);
    CHECK(ds4_dsml_in_reasoning(p) && !ds4_dsml_in_structure(p), "starts in reasoning");
    ds4_dsml_free(p);
}

/* JSON -> DSML -> JSON. OFFICIAL style has no escaping, so it round-trips
 * with a non-decoding parser unless a value contains the closing tag; the
 * DS4 style escapes that tag and round-trips with ds4's decoding parser
 * unless a string already contains an entity (ds4's own asymmetry). */
static void test_round_trip(void) {
    static const char *args[] = {
        "{}",
        "{\"a\":\"x\"}",
        "{\"s\":\"multi\\nline \\\"quoted\\\" <tag> & more \\u00e9\\ud83d\\ude00\",\"n\":-1.5e3,\"t\":true,\"f\":false,\"z\":null}",
        "{\"nested\":{\"list\":[1,{\"k\":\"v w\"},[]],\"empty\":{}},\"arr\":[\"a\",\"b\"]}",
        "{ \"spaced\" : [ 1 , 2 ] , \"k\" : \"  lead and trail  \" }",
        "{\"code\":\"if (a < b && c > d) { return \\\"x\\\"; }\\n\\ttab\"}",
        "{\"k\":\"\",\"e\":\"\\u0001\\u001f\"}",
        "{\"weird key \\\"q\\\" <&>\":1}",
    };
    ds4_dsml_opts off = { .tools = true };
    for (size_t i = 0; i < sizeof args / sizeof args[0]; i++)
        for (int st = 0; st < 2; st++) {
            /* the official format has no escaping: a key with a quote cannot survive */
            if (st == 0 && strstr(args[i], "\\\"q")) continue;
            ds4_tool_call call = { "id", st ? "na<me&\"x\"" : "name", args[i] };
            ds4_buf out = {0};
            CHECK(ds4_dsml_render_calls(&call, 1, st ? DS4_DSML_DS4 : DS4_DSML_OFFICIAL, &out, NULL, 0), "render");
            ds4_dsml_result r;
            ds4_dsml_parse(st ? &DS4_OPTS : &off, out.data, out.len, &r);
            CHECK(!r.error && r.n_calls == 1, "round trip %zu style %d: %s", i, st, r.error ? r.error : "");
            if (r.n_calls == 1) {
                CHECK(json_equal(r.calls[0].arguments, args[i]), "round trip %zu style %d: %s -> %s",
                      i, st, args[i], r.calls[0].arguments);
                CHECK(!strcmp(r.calls[0].name, call.name), "name round trip %zu style %d: %s", i, st, r.calls[0].name);
            }
            check_chunking(st ? &DS4_OPTS : &off, out.data, "round trip");
            ds4_dsml_result_free(&r);
            ds4_buf_free(&out);
        }
    /* the closing parameter tag inside values (ds4 escapes both kinds) */
    const char *tricky = "{\"s\":\"a</" DSML "parameter>b\",\"o\":{\"t\":\"</" DSML "parameter>\"}}";
    ds4_tool_call call = { "id", "f", tricky };
    ds4_buf out = {0};
    ds4_dsml_render_calls(&call, 1, DS4_DSML_DS4, &out, NULL, 0);
    CHECK(strstr(out.data, "a&lt;/" DSML "parameter>b") && strstr(out.data, "\\u003c/" DSML "parameter>"), "escapes");
    ds4_dsml_result r;
    ds4_dsml_parse(&DS4_OPTS, out.data, out.len, &r);
    CHECK(r.n_calls == 1 && json_equal(r.calls[0].arguments, tricky), "closing tag survives: %s",
          r.n_calls ? r.calls[0].arguments : "");
    ds4_dsml_result_free(&r);
    ds4_buf_free(&out);
}

/* Rendering details: duplicates, fallbacks, several calls, names required. */
static void test_render_rules(void) {
    ds4_tool_call calls[] = {
        { "1", "f", "{\"k\":1,\"j\":[1,2],\"k\":2}" },
        { "2", "g", "not json" },
        { "3", "h", NULL },
        { "4", "i", "[1,2]" },
    };
    ds4_buf out = {0};
    CHECK(ds4_dsml_render_calls(calls, 4, DS4_DSML_OFFICIAL, &out, NULL, 0), "official");
    const char *want_off =
        "\n\n<" DSML "tool_calls>\n"
        "<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"k\" string=\"false\">2</" DSML "parameter>\n"
        "<" DSML "parameter name=\"j\" string=\"false\">[1, 2]</" DSML "parameter>\n</" DSML "invoke>\n"
        "<" DSML "invoke name=\"g\">\n<" DSML "parameter name=\"arguments\" string=\"true\">not json</" DSML "parameter>\n</" DSML "invoke>\n"
        "<" DSML "invoke name=\"h\">\n\n</" DSML "invoke>\n"
        "<" DSML "invoke name=\"i\">\n<" DSML "parameter name=\"arguments\" string=\"true\">[1,2]</" DSML "parameter>\n</" DSML "invoke>\n"
        "</" DSML "tool_calls>";
    CHECK(!strcmp(out.data, want_off), "official layout:\n%s", out.data);
    ds4_buf_clear(&out);
    CHECK(ds4_dsml_render_calls(calls, 4, DS4_DSML_DS4, &out, NULL, 0), "ds4");
    const char *want_ds4 =
        "\n\n<" DSML "tool_calls>\n"
        "<" DSML "invoke name=\"f\">\n<" DSML "parameter name=\"k\" string=\"false\">1</" DSML "parameter>\n"
        "<" DSML "parameter name=\"j\" string=\"false\">[1,2]</" DSML "parameter>\n"
        "<" DSML "parameter name=\"k\" string=\"false\">2</" DSML "parameter>\n</" DSML "invoke>\n"
        "<" DSML "invoke name=\"g\">\n<" DSML "parameter name=\"arguments\" string=\"true\">not json</" DSML "parameter>\n</" DSML "invoke>\n"
        "<" DSML "invoke name=\"h\">\n</" DSML "invoke>\n"
        "<" DSML "invoke name=\"i\">\n<" DSML "parameter name=\"arguments\" string=\"true\">[1,2]</" DSML "parameter>\n</" DSML "invoke>\n"
        "</" DSML "tool_calls>";
    CHECK(!strcmp(out.data, want_ds4), "ds4 layout:\n%s", out.data);
    ds4_tool_call nameless = { "x", "", "{}" };
    char err[80] = "";
    CHECK(!ds4_dsml_render_calls(&nameless, 1, DS4_DSML_DS4, &out, err, sizeof err) && strstr(err, "name"), "%s", err);
    ds4_buf_free(&out);
}

int main(void) {
    test_e4_generated();
    test_e6_parallel();
    test_events_and_args();
    test_tolerance();
    test_errors();
    test_channels();
    test_in_structure();
    test_round_trip();
    test_render_rules();
    return check_done("test_dsml");
}
