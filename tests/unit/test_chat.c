/* test_chat.c -- the prompt renderer against the worked examples E1-E7 of
 * deepseek-v4-prompt-format.md (fixtures extracted by
 * tests/oracles/chat_examples.py; the sheet produced them by running the
 * official encoder and ds4's renderer), plus the sheet's rules for the cases
 * the examples do not cover. */
#include "check.h"
#include "text/chat.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define FIX "tests/fixtures/chat/"

static char *slurp(const char *name) {
    char path[256];
    snprintf(path, sizeof path, FIX "%s", name);
    char *s = ds4_read_file(path, NULL);
    if (!s) { fprintf(stderr, "missing fixture %s\n", path); exit(1); }
    return s;
}

/* ---- an OpenAI chat request as the server would hand it over ---------------- */

typedef struct {
    cJSON *root;
    ds4_chat_msg msgs[16];
    ds4_tool_call calls[16];
    ds4_tool_def tools[8];
    char *tool_json[8];
    int n, ntools;
    ds4_think_mode think;
} request;

typedef struct { const char *key; const char *v; size_t vn; } member_query;

static bool find_member(void *ud, const ds4_json_member *m) {
    member_query *q = ud;
    if (m->key_len == strlen(q->key) && memcmp(m->key, q->key, m->key_len) == 0) {
        q->v = m->value;
        q->vn = m->value_len;
    }
    return true;
}

static bool member_span(const char *s, size_t n, const char *key, const char **v, size_t *vn) {
    member_query q = { key, NULL, 0 };
    ds4_json_object_each(s, n, find_member, &q);
    *v = q.v;
    *vn = q.vn;
    return q.v != NULL;
}

typedef struct { request *r; const char *member; } tool_ctx;

/* Schema lines keep the client's raw bytes: the `function` value (OpenAI)
 * or the whole tool (Anthropic, member == NULL). */
static bool add_tool(void *ud, const char *v, size_t n) {
    tool_ctx *c = ud;
    const char *s = v;
    size_t sn = n;
    if (c->member && !member_span(v, n, c->member, &s, &sn)) return false;
    char *copy = malloc(sn + 1);
    memcpy(copy, s, sn);
    copy[sn] = 0;
    c->r->tool_json[c->r->ntools] = copy;
    c->r->tools[c->r->ntools++] = (ds4_tool_def){ .json = copy };
    return true;
}

static const char *str_or_null(cJSON *o, const char *k) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void load_request(request *r, const char *name, const char *tool_member) {
    memset(r, 0, sizeof *r);
    char *text = slurp(name);
    r->root = cJSON_Parse(text);
    r->think = DS4_THINK_HIGH;
    const char *model = str_or_null(r->root, "model");
    if (model && strcmp(model, "deepseek-chat") == 0) r->think = DS4_THINK_NONE;
    const char *effort = str_or_null(r->root, "reasoning_effort");
    if (effort && strcmp(effort, "max") == 0) r->think = DS4_THINK_MAX;
    const char *tools;
    size_t tn;
    if (member_span(text, strlen(text), "\"tools\"", &tools, &tn)) {
        tool_ctx c = { r, tool_member };
        ds4_json_array_each(tools, tn, add_tool, &c);
    }
    int ncalls = 0;
    cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(r->root, "messages")) {
        ds4_chat_msg *msg = &r->msgs[r->n++];
        const char *role = str_or_null(m, "role");
        msg->role = !strcmp(role, "system") ? DS4_ROLE_SYSTEM : !strcmp(role, "user") ? DS4_ROLE_USER
                  : !strcmp(role, "assistant") ? DS4_ROLE_ASSISTANT : !strcmp(role, "tool") ? DS4_ROLE_TOOL
                  : DS4_ROLE_DEVELOPER;
        msg->content = str_or_null(m, "content");
        msg->reasoning_content = str_or_null(m, "reasoning_content");
        msg->tool_call_id = str_or_null(m, "tool_call_id");
        cJSON *tc;
        msg->tool_calls = &r->calls[ncalls];
        cJSON_ArrayForEach(tc, cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
            r->calls[ncalls++] = (ds4_tool_call){ str_or_null(tc, "id"), str_or_null(fn, "name"),
                                                  str_or_null(fn, "arguments") };
            msg->n_tool_calls++;
        }
    }
    free(text);
}

static void free_request(request *r) {
    for (int i = 0; i < r->ntools; i++) free(r->tool_json[i]);
    cJSON_Delete(r->root);
}

static char *render_n(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o) {
    ds4_buf out = {0};
    char err[200] = "";
    bool ok = ds4_chat_render(msgs, n, o, &out, err, sizeof err);
    CHECK(ok, "render failed: %s", err);
    return ds4_buf_take(&out);
}

static char *render_req(const request *r, ds4_chat_profile profile, int ctx) {
    ds4_chat_opts o;
    ds4_chat_opts_default(&o);
    o.profile = profile;
    o.think = r->think;
    o.ctx = ctx;
    o.tools = r->tools;
    o.n_tools = r->ntools;
    return render_n(r->msgs, r->n, &o);
}

static void check_eq(const char *what, const char *got, const char *want) {
    bool eq = got && strcmp(got, want) == 0;
    CHECK(eq, "%s differs", what);
    if (!eq && got) {
        size_t i = 0;
        while (got[i] && got[i] == want[i]) i++;
        fprintf(stderr, "  first difference at byte %zu\n  got:  %.80s\n  want: %.80s\n", i, got + i, want + i);
    }
}

static bool ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && memcmp(s + a - b, tail, b) == 0;
}

static bool starts_with(const char *s, const char *head) { return strncmp(s, head, strlen(head)) == 0; }

/* E1-E3: identical bytes in both profiles. */
static void test_e1_e2_e3(void) {
    static const struct { const char *req, *want; } cases[] = {
        { "e1_request.json", "e1_prompt.txt" },
        { "e2_request.json", "e2_prompt.txt" },
        { "e3_request.json", "e3_prompt.txt" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        request r;
        load_request(&r, cases[c].req, "\"function\"");
        char *want = slurp(cases[c].want);
        for (int p = 0; p < 2; p++) {
            char *got = render_req(&r, p ? DS4_CHAT_DS4 : DS4_CHAT_OFFICIAL, DS4_THINK_MAX_MIN_CTX);
            char what[64];
            snprintf(what, sizeof what, "%s (%s)", cases[c].want, p ? "ds4" : "official");
            check_eq(what, got, want);
            free(got);
        }
        free(want);
        free_request(&r);
    }
}

/* E2 complete form: the final assistant turn is after the last user turn,
 * so it keeps its reasoning (official golden output). */
static void test_e2_complete(void) {
    request r;
    load_request(&r, "e2_request.json", "\"function\"");
    r.msgs[r.n++] = (ds4_chat_msg){ .role = DS4_ROLE_ASSISTANT,
        .reasoning_content = "The user asks about the capital of France. It is Paris.",
        .content = "The capital of France is Paris." };
    char *want = slurp("e2_complete.txt");
    for (int p = 0; p < 2; p++) {
        char *got = render_req(&r, p ? DS4_CHAT_DS4 : DS4_CHAT_OFFICIAL, 0);
        check_eq(p ? "e2 complete (ds4)" : "e2 complete (official)", got, want);
        free(got);
    }
    free(want);
    free_request(&r);
}

/* Think Max needs ctx >= 393216 (ds4 rule); below it the prompt is E3
 * without the preamble. ctx <= 0 does not enforce (official encoder). */
static void test_think_max_ctx(void) {
    request r;
    load_request(&r, "e3_request.json", "\"function\"");
    char *e3 = slurp("e3_prompt.txt"), *pre = slurp("preamble_max.txt");
    CHECK(strlen(pre) == 476, "preamble is %zu bytes", strlen(pre));
    ds4_buf no_pre = {0};
    ds4_buf_puts(&no_pre, DS4_STR_BOS);
    ds4_buf_puts(&no_pre, e3 + strlen(DS4_STR_BOS) + strlen(pre));
    CHECK(starts_with(e3 + strlen(DS4_STR_BOS), pre), "E3 carries the 4.6 preamble");
    static const struct { int ctx; bool max; } cases[] = {
        { 0, true }, { 393216, true }, { 1000000, true }, { 393215, false }, { 32768, false }, { 1, false },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int p = 0; p < 2; p++) {
            char *got = render_req(&r, p ? DS4_CHAT_DS4 : DS4_CHAT_OFFICIAL, cases[c].ctx);
            char what[64];
            snprintf(what, sizeof what, "think max ctx=%d profile=%d", cases[c].ctx, p);
            check_eq(what, got, cases[c].max ? e3 : no_pre.data);
            free(got);
        }
    CHECK(ds4_chat_effective_think(DS4_THINK_MAX, 393215) == DS4_THINK_HIGH, "demoted");
    CHECK(ds4_chat_effective_think(DS4_THINK_NONE, 10) == DS4_THINK_NONE, "none stays none");
    ds4_buf_free(&no_pre);
    free(e3);
    free(pre);
    free_request(&r);
}

static void test_e4_official(void) {
    request r;
    load_request(&r, "e4_request.json", "\"function\"");
    char *want = slurp("e4_official.txt");
    char *got = render_req(&r, DS4_CHAT_OFFICIAL, 0);
    check_eq("e4 official", got, want);
    free(got);
    free(want);
    free_request(&r);
}

static void test_e5_ds4(void) {
    request r;
    load_request(&r, "e5_request.json", "\"function\"");
    char *want = slurp("e5_ds4.txt");
    char *got = render_req(&r, DS4_CHAT_DS4, 0);
    check_eq("e5 ds4", got, want);
    /* "from <｜User｜> on, the bytes are identical to the official rendering" */
    char *off = render_req(&r, DS4_CHAT_OFFICIAL, 0);
    const char *a = strstr(got, DS4_STR_USER), *b = strstr(off, DS4_STR_USER);
    CHECK(a && b && strcmp(a, b) == 0, "e5: ds4 and official agree from the first user turn");
    free(off);
    free(got);
    free(want);
    free_request(&r);
}

/* E6: parallel calls, a zero-argument call, results out of call order,
 * user text after the results, "</tool_result>" inside a result. */
static void test_e6(void) {
    request r;
    load_request(&r, "e6_request.json", "\"function\"");
    char *off_tail = slurp("e6_official_tail.txt"), *ds4_tail = slurp("e6_ds4_tail.txt");
    char *off = render_req(&r, DS4_CHAT_OFFICIAL, 0), *ds4 = render_req(&r, DS4_CHAT_DS4, 0);
    CHECK(ends_with(off, off_tail), "e6 official tail");
    CHECK(ends_with(ds4, ds4_tail), "e6 ds4 tail");
    CHECK(starts_with(off, DS4_STR_BOS "\n\n## Tools\n"), "e6 official starts with the empty system + tools");
    CHECK(starts_with(ds4, DS4_STR_BOS "## Tools\n"), "e6 ds4 starts with the tools block");
    /* the heads are exactly the tools blocks */
    ds4_buf blk = {0};
    ds4_chat_tools_block(r.tools, r.ntools, DS4_CHAT_OFFICIAL, &blk, NULL, 0);
    CHECK(strlen(off) == strlen(DS4_STR_BOS) + 2 + blk.len + strlen(off_tail), "e6 official: nothing else");
    ds4_buf_clear(&blk);
    ds4_chat_tools_block(r.tools, r.ntools, DS4_CHAT_DS4, &blk, NULL, 0);
    CHECK(strlen(ds4) == strlen(DS4_STR_BOS) + blk.len + strlen(ds4_tail), "e6 ds4: nothing else");
    ds4_buf_free(&blk);
    free(off); free(ds4); free(off_tail); free(ds4_tail);
    free_request(&r);
}

/* E7: an Anthropic request as ds4-server maps it (raw whole-tool schema,
 * tool_result and text blocks concatenated into one user message). */
static void test_e7(void) {
    request r;
    load_request(&r, "e7_request.json", NULL);
    CHECK(r.ntools == 1, "one tool");
    ds4_buf user = {0};
    const char *res = "{\"temperature\": 22}";
    ds4_chat_tool_result(res, strlen(res), DS4_CHAT_DS4, &user);
    ds4_buf_puts(&user, "Answer briefly.");
    ds4_tool_call call = { "toolu_01", "get_weather", "{\"location\":\"Beijing\",\"unit\":\"celsius\"}" };
    ds4_chat_msg msgs[] = {
        { .role = DS4_ROLE_SYSTEM, .content = "You are a helpful assistant." },
        { .role = DS4_ROLE_USER, .content = "What's the weather in Beijing?" },
        { .role = DS4_ROLE_ASSISTANT, .reasoning_content = "I should use the get_weather tool.",
          .tool_calls = &call, .n_tool_calls = 1 },
        { .role = DS4_ROLE_USER, .content = user.data },
    };
    ds4_chat_opts o;
    ds4_chat_opts_default(&o);
    o.tools = r.tools;
    o.n_tools = r.ntools;
    char *got = render_n(msgs, 4, &o), *tail = slurp("e7_ds4_tail.txt");
    CHECK(ends_with(got, tail), "e7 ds4 tail");
    free(got); free(tail);
    ds4_buf_free(&user);
    free_request(&r);
}

/* The tools blocks equal the sheet's JSON-string forms (5.2, 6.2). */
static void test_tools_templates(void) {
    ds4_tool_def t[2] = {
        { .json = "{\"name\":\"a\",\"parameters\":{\"x\":[1,2.50]}}" },
        { .name = "b", .description = "d\"q", .parameters = "{}" },
    };
    static const struct { ds4_chat_profile p; const char *fix, *lines; } cases[] = {
        { DS4_CHAT_OFFICIAL, "tools_official.txt",
          "{\"name\": \"a\", \"parameters\": {\"x\": [1, 2.5]}}\n{\"name\": \"b\", \"description\": \"d\\\"q\", \"parameters\": {}}" },
        { DS4_CHAT_DS4, "tools_ds4.txt",
          "{\"name\":\"a\",\"parameters\":{\"x\":[1,2.50]}}\n{\"name\":\"b\",\"description\":\"d\\\"q\",\"parameters\":{}}" },
    };
    for (int c = 0; c < 2; c++) {
        char *tpl = slurp(cases[c].fix);
        ds4_buf want = {0};
        ds4_buf_put_replaced(&want, tpl, strlen(tpl), "{TOOL_SCHEMA_LINES}", cases[c].lines);
        ds4_buf got = {0};
        CHECK(ds4_chat_tools_block(t, 2, cases[c].p, &got, NULL, 0), "tools block");
        check_eq(cases[c].fix, got.data, want.data);
        ds4_buf_free(&got); ds4_buf_free(&want); free(tpl);
    }
    ds4_tool_def bad = { .json = "{\"name\":" };
    ds4_buf out = {0};
    char err[100] = "";
    CHECK(!ds4_chat_tools_block(&bad, 1, DS4_CHAT_OFFICIAL, &out, err, sizeof err) && strstr(err, "tool 0"),
          "invalid schema rejected in the official profile: %s", err);
    ds4_buf_free(&out);
}

/* 3.10 + the token-count property: a non-thinking single user message is
 * BOS USER content ASSISTANT </think> -- four specials around the content,
 * nothing else (so content tokens + 4 once tokenised; checked here as text). */
static void test_single_user_structure(void) {
    char *ital = slurp("italian_prompt.txt");
    const char *contents[] = { "Rispondi in italiano con una frase: chi era Ada Lovelace?", "", "a\n\nb", "你好 <think>" };
    for (size_t c = 0; c < sizeof contents / sizeof contents[0]; c++)
        for (int p = 0; p < 2; p++) {
            ds4_chat_msg m = { .role = DS4_ROLE_USER, .content = contents[c] };
            ds4_chat_opts o;
            ds4_chat_opts_default(&o);
            o.profile = p ? DS4_CHAT_DS4 : DS4_CHAT_OFFICIAL;
            o.think = DS4_THINK_NONE;
            char *got = render_n(&m, 1, &o);
            ds4_buf want = {0};
            ds4_buf_puts(&want, DS4_STR_BOS DS4_STR_USER);
            ds4_buf_puts(&want, contents[c]);
            ds4_buf_puts(&want, DS4_STR_ASSISTANT DS4_STR_THINK_CLOSE);
            check_eq("single user structure", got, want.data);
            if (c == 0) check_eq("3.10 italian prompt", got, ital);
            ds4_buf_free(&want);
            free(got);
        }
    free(ital);
}

/* Official drop_thinking rules (4.5) on a three-turn conversation. */
static void test_drop_thinking(void) {
    ds4_chat_msg msgs[] = {
        { .role = DS4_ROLE_USER, .content = "u1" },
        { .role = DS4_ROLE_ASSISTANT, .reasoning_content = "r1", .content = "a1" },
        { .role = DS4_ROLE_USER, .content = "u2" },
        { .role = DS4_ROLE_ASSISTANT, .content = "a2" },
        { .role = DS4_ROLE_USER, .content = "u3" },
    };
    ds4_chat_opts o;
    ds4_chat_opts_default(&o);
    o.profile = DS4_CHAT_OFFICIAL;
    const char *B = DS4_STR_BOS, *U = DS4_STR_USER, *A = DS4_STR_ASSISTANT, *E = DS4_STR_EOS;
    char want[512];
    char *got = render_n(msgs, 5, &o);
    snprintf(want, sizeof want, "%s%su1%s</think>a1%s%su2%s</think>a2%s%su3%s<think>", B, U, A, E, U, A, E, U, A);
    check_eq("official drop_thinking", got, want);
    free(got);
    char *ds4 = (o.profile = DS4_CHAT_DS4, render_n(msgs, 5, &o));
    check_eq("ds4 drops earlier reasoning without tool context", ds4, want);
    free(ds4);
    o.profile = DS4_CHAT_OFFICIAL;
    o.drop_thinking = false;
    got = render_n(msgs, 5, &o);
    snprintf(want, sizeof want, "%s%su1%s<think>r1</think>a1%s%su2%s<think></think>a2%s%su3%s<think>", B, U, A, E, U, A, E, U, A);
    check_eq("official without drop_thinking", got, want);
    free(got);
    /* tools present: drop_thinking is off automatically */
    ds4_tool_def t = { .name = "f" };
    o.drop_thinking = true;
    o.tools = &t;
    o.n_tools = 1;
    got = render_n(msgs, 5, &o);
    CHECK(got && strstr(got, "<think>r1</think>a1") && strstr(got, "<think></think>a2"), "tools keep reasoning");
    free(got);
    /* non-thinking ignores reasoning everywhere */
    o.n_tools = 0;
    o.think = DS4_THINK_NONE;
    got = render_n(msgs, 5, &o);
    snprintf(want, sizeof want, "%s%su1%s</think>a1%s%su2%s</think>a2%s%su3%s</think>", B, U, A, E, U, A, E, U, A);
    check_eq("official non-thinking", got, want);
    free(got);
    o.profile = DS4_CHAT_DS4;
    got = render_n(msgs, 5, &o);
    check_eq("ds4 non-thinking", got, want);
    free(got);
}

/* Where the profiles differ on plain history (6.6): tool context from a
 * tool message keeps reasoning in ds4 only; consecutive user messages;
 * developer messages; results with a different order and separators. */
static void test_profile_differences(void) {
    ds4_tool_call calls[] = { { "c1", "f", "{}" }, { "c2", "g", "{\"k\":[1, 2]}" } };
    ds4_chat_msg msgs[] = {
        { .role = DS4_ROLE_SYSTEM, .content = "S" },
        { .role = DS4_ROLE_USER, .content = "u1" },
        { .role = DS4_ROLE_USER, .content = "u2" },
        { .role = DS4_ROLE_ASSISTANT, .reasoning_content = "r", .tool_calls = calls, .n_tool_calls = 2 },
        { .role = DS4_ROLE_TOOL, .tool_call_id = "c2", .content = "R2" },
        { .role = DS4_ROLE_TOOL, .tool_call_id = "c1", .content = "R1" },
        { .role = DS4_ROLE_DEVELOPER, .content = "D" },
        { .role = DS4_ROLE_USER, .content = "u3" },
    };
    ds4_chat_opts o;
    ds4_chat_opts_default(&o);
    o.profile = DS4_CHAT_OFFICIAL;
    char *off = render_n(msgs, 8, &o);
    const char *want_off =
        DS4_STR_BOS "S" DS4_STR_USER "u1\n\nu2" DS4_STR_ASSISTANT DS4_STR_THINK_CLOSE
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n\n</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"k\" string=\"false\">[1, 2]</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" DS4_STR_EOS
        DS4_STR_USER "<tool_result>R1</tool_result>\n\n<tool_result>R2</tool_result>"
        DS4_STR_USER "u3" DS4_STR_ASSISTANT DS4_STR_THINK_OPEN;
    /* drop_thinking removes the developer turn before the last user turn */
    check_eq("official profile history", off, want_off);
    o.profile = DS4_CHAT_DS4;
    char *ds4 = render_n(msgs, 8, &o);
    const char *want_ds4 =
        DS4_STR_BOS "S\n\nD" DS4_STR_USER "u1" DS4_STR_USER "u2" DS4_STR_ASSISTANT DS4_STR_THINK_OPEN "r" DS4_STR_THINK_CLOSE
        "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"g\">\n<｜DSML｜parameter name=\"k\" string=\"false\">[1,2]</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>" DS4_STR_EOS
        DS4_STR_USER "<tool_result>R2</tool_result><tool_result>R1</tool_result>"
        DS4_STR_USER "u3" DS4_STR_ASSISTANT DS4_STR_THINK_OPEN;
    check_eq("ds4 profile history", ds4, want_ds4);
    free(off);
    free(ds4);
}

/* Official result ordering (4.2): call order, unknown ids at position 0,
 * stable, text blocks keep their slots; ds4 keeps client order. */
static void test_result_order(void) {
    ds4_tool_call calls[] = { { "c1", "f", "{}" }, { "c2", "f", "{}" }, { "c3", "f", "{}" } };
    ds4_chat_msg msgs[] = {
        { .role = DS4_ROLE_USER, .content = "q" },
        { .role = DS4_ROLE_ASSISTANT, .tool_calls = calls, .n_tool_calls = 3 },
        { .role = DS4_ROLE_TOOL, .tool_call_id = "c3", .content = "R3" },
        { .role = DS4_ROLE_TOOL, .tool_call_id = "zz", .content = "X" },
        { .role = DS4_ROLE_TOOL, .tool_call_id = "c1", .content = "R1" },
        { .role = DS4_ROLE_USER, .content = "T" },
        { .role = DS4_ROLE_TOOL, .tool_call_id = "c2", .content = "R2 </tool_result>" },
    };
    ds4_chat_opts o;
    ds4_chat_opts_default(&o);
    o.profile = DS4_CHAT_OFFICIAL;
    char *got = render_n(msgs, 7, &o);
    CHECK(got && ends_with(got, DS4_STR_EOS DS4_STR_USER "<tool_result>X</tool_result>\n\n<tool_result>R1</tool_result>\n\n"
                           "<tool_result>R2 </tool_result></tool_result>\n\nT\n\n<tool_result>R3</tool_result>"
                           DS4_STR_ASSISTANT DS4_STR_THINK_OPEN), "official order: %s", got ? strstr(got, DS4_STR_EOS) : "");
    free(got);
    o.profile = DS4_CHAT_DS4;
    got = render_n(msgs, 7, &o);
    CHECK(got && ends_with(got, DS4_STR_EOS DS4_STR_USER "<tool_result>R3</tool_result><tool_result>X</tool_result>"
                           "<tool_result>R1</tool_result>" DS4_STR_USER "T" DS4_STR_USER
                           "<tool_result>R2 &lt;/tool_result></tool_result>" DS4_STR_ASSISTANT DS4_STR_THINK_OPEN),
          "ds4 order: %s", got ? strstr(got, DS4_STR_EOS) : "");
    free(got);
}

static const char *replay_lookup(void *ud, const char *id) {
    const char **map = ud;   /* id, block, id, block, ..., NULL */
    for (; map[0]; map += 2)
        if (!strcmp(map[0], id)) return map[1];
    return NULL;
}

/* Exact-DSML replay: used only when every id maps to one and the same block. */
static void test_replay(void) {
    static const char block[] = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
        "<｜DSML｜parameter name=\"a\" string=\"false\">{ \"x\" : 1 }</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"g\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    ds4_tool_call calls[] = { { "i1", "f", "{\"a\":{\"x\":1}}" }, { "i2", "g", "{}" } };
    ds4_chat_msg msgs[] = {
        { .role = DS4_ROLE_USER, .content = "q" },
        { .role = DS4_ROLE_ASSISTANT, .tool_calls = calls, .n_tool_calls = 2 },
    };
    const char *both[] = { "i1", block, "i2", block, NULL };
    const char *one[] = { "i1", block, NULL };
    const char *split[] = { "i1", block, "i2", "\n\nother", NULL };
    const char **maps[] = { both, one, split, NULL };
    ds4_buf canon = {0};
    ds4_dsml_render_calls(calls, 2, DS4_DSML_DS4, &canon, NULL, 0);
    for (int k = 0; k < 4; k++) {
        ds4_chat_opts o;
        ds4_chat_opts_default(&o);
        o.replay = maps[k] ? replay_lookup : NULL;
        o.replay_ud = (void *)maps[k];
        char *got = render_n(msgs, 2, &o);
        const char *expect = k == 0 ? block : canon.data;
        CHECK(got && strstr(got, expect) && ends_with(got, DS4_STR_EOS), "replay case %d", k);
        free(got);
    }
    ds4_buf_free(&canon);
}

static void test_generation_prompt_and_errors(void) {
    ds4_chat_msg m[] = { { .role = DS4_ROLE_SYSTEM, .content = "s" }, { .role = DS4_ROLE_USER, .content = "u" } };
    ds4_chat_opts o;
    ds4_chat_opts_default(&o);
    for (int p = 0; p < 2; p++) {
        o.profile = p ? DS4_CHAT_DS4 : DS4_CHAT_OFFICIAL;
        o.add_generation_prompt = false;
        char *got = render_n(m, 2, &o);
        check_eq("no generation prompt", got, DS4_STR_BOS "s" DS4_STR_USER "u");
        free(got);
        o.add_generation_prompt = true;
    }
    ds4_buf out = {0};
    char err[120] = "";
    ds4_chat_msg bad = { .role = (ds4_chat_role)42 };
    CHECK(!ds4_chat_render(&bad, 1, &o, &out, err, sizeof err) && strstr(err, "role"), "bad role: %s", err);
    ds4_tool_call nameless = { "x", NULL, "{}" };
    ds4_chat_msg a = { .role = DS4_ROLE_ASSISTANT, .tool_calls = &nameless, .n_tool_calls = 1 };
    CHECK(!ds4_chat_render(&a, 1, &o, &out, err, sizeof err) && strstr(err, "name"), "nameless call: %s", err);
    o.profile = DS4_CHAT_OFFICIAL;
    ds4_chat_msg dev = { .role = DS4_ROLE_DEVELOPER };
    CHECK(!ds4_chat_render(&dev, 1, &o, &out, err, sizeof err), "empty developer message (official)");
    o.profile = (ds4_chat_profile)7;
    CHECK(!ds4_chat_render(m, 2, &o, &out, err, sizeof err) && strstr(err, "profile"), "bad profile: %s", err);
    ds4_buf_free(&out);
    /* empty conversation: BOS only, no generation prompt */
    ds4_chat_opts_default(&o);
    char *got = render_n(NULL, 0, &o);
    check_eq("empty conversation", got, DS4_STR_BOS);
    free(got);
}

/* Python json.dumps(json.loads(x), ensure_ascii=False) is the oracle of the
 * official schema-line serialisation. */
static void test_json_python_style(void) {
    char *text = slurp("json_py_cases.json");
    cJSON *cases = cJSON_Parse(text), *c;
    int n = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *in = cJSON_GetArrayItem(c, 0)->valuestring, *want = cJSON_GetArrayItem(c, 1)->valuestring;
        ds4_buf out = {0};
        CHECK(ds4_json_reformat(in, strlen(in), DS4_JSON_PY, &out), "reformat %s", in);
        check_eq("python json.dumps", out.data, want);
        ds4_buf_free(&out);
        n++;
    }
    CHECK(n >= 8, "json cases loaded: %d", n);
    cJSON_Delete(cases);
    free(text);
    static const char *invalid[] = { "", "{", "[1,]", "{\"a\" 1}", "01", "1.", "\"\\x\"", "nul", "[1] 2", "\"a\nb\"", "-", "{\"a\":1,}" };
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        ds4_buf out = {0};
        CHECK(!ds4_json_valid(invalid[i], strlen(invalid[i])), "invalid accepted: %s", invalid[i]);
        CHECK(!ds4_json_reformat(invalid[i], strlen(invalid[i]), DS4_JSON_PY, &out), "invalid reformatted: %s", invalid[i]);
        ds4_buf_free(&out);
    }
    ds4_buf out = {0};
    const char *sp = " { \"a\" : [ 1 , \"x y\" ] } ";
    ds4_json_reformat(sp, strlen(sp), DS4_JSON_COMPACT, &out);
    check_eq("minify", out.data, "{\"a\":[1,\"x y\"]}");
    ds4_buf_free(&out);
}

int main(void) {
    test_e1_e2_e3();
    test_e2_complete();
    test_think_max_ctx();
    test_e4_official();
    test_e5_ds4();
    test_e6();
    test_e7();
    test_tools_templates();
    test_single_user_structure();
    test_drop_thinking();
    test_profile_differences();
    test_result_order();
    test_replay();
    test_generation_prompt_and_errors();
    test_json_python_style();
    return check_done("test_chat");
}
