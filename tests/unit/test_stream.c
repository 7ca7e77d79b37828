/* Response encoders with scripted generations (the model's text is fed in
 * small chunks, as tokens would arrive): event order and shapes per family
 * (server-api.md 4.4, 6.5, 7.4), tool-call deltas that concatenate to the
 * expected JSON, stop strings across chunk boundaries, non-stream bodies. */
#include "check.h"
#include "server/stream.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static int collect(void *ud, const char *s, size_t n) {
    ds4_buf_put(ud, s, n);
    return 0;
}

#define DSML_OPEN "<\xef\xbd\x9c" "DSML\xef\xbd\x9c"
#define DSML_CLOSE "</\xef\xbd\x9c" "DSML\xef\xbd\x9c"
static const char GEN_TOOL[] =
    "Let me look.</think>I'll read it."
    "\n\n" DSML_OPEN "tool_calls>\n"
    DSML_OPEN "invoke name=\"read_file\">\n"
    DSML_OPEN "parameter name=\"path\" string=\"true\">src/a &amp; b.c" DSML_CLOSE "parameter>\n"
    DSML_OPEN "parameter name=\"limit\" string=\"false\">200" DSML_CLOSE "parameter>\n"
    DSML_CLOSE "invoke>\n"
    DSML_OPEN "invoke name=\"now\">\n"
    DSML_CLOSE "invoke>\n"
    DSML_CLOSE "tool_calls>";

static ds4_tool_meta META[2] = {
    {.name = "read_file", .short_name = "read_file"}, {.name = "now", .short_name = "now"}};
static ds4_tool_def DEFS[2];

static void make_req(ds4_request *r, ds4_api api, bool stream) {
    memset(r, 0, sizeof *r);
    r->api = api;
    r->model = "m-echo";
    r->stream = stream;
    r->include_usage = true;
    r->expose_reasoning = true;
    r->tools = DEFS;
    r->tool_meta = META;
    r->n_tools = 2;
}

/* Feeds text in 3-byte chunks; returns what feed() reported at the end. */
static bool run(ds4_enc *e, const char *text, ds4_cause cause) {
    ds4_usage u = {.prompt_tokens = 100, .cached_tokens = 60, .completion_tokens = 30, .reasoning_tokens = 4};
    ds4_enc_begin(e, &u);
    ds4_enc_keepalive(e);
    bool stop = false;
    size_t n = strlen(text);
    for (size_t i = 0; i < n && !stop; i += 3) stop = ds4_enc_feed(e, text + i, n - i < 3 ? n - i : 3);
    ds4_enc_finish(e, cause, &u);
    return stop;
}

/* Splits an SSE stream into events: names[i] (or "") and parsed data. */
typedef struct { char name[64]; cJSON *data; bool done; } sse_ev;

static int parse_sse(const char *s, sse_ev *ev, int max) {
    int n = 0;
    while (*s && n < max) {
        const char *end = strstr(s, "\n\n");
        if (!end) break;
        sse_ev *x = &ev[n];
        memset(x, 0, sizeof *x);
        bool comment = true;
        for (const char *l = s; l < end;) {
            const char *le = memchr(l, '\n', (size_t)(end - l));
            if (!le) le = end;
            if (!strncmp(l, "event: ", 7)) { snprintf(x->name, sizeof x->name, "%.*s", (int)(le - l - 7), l + 7); comment = false; }
            else if (!strncmp(l, "data: ", 6)) {
                comment = false;
                if (!strncmp(l + 6, "[DONE]", 6)) x->done = true;
                else x->data = cJSON_ParseWithLength(l + 6, (size_t)(le - l - 6));
            }
            l = le + 1;
        }
        s = end + 2;
        if (!comment) n++;
    }
    return n;
}

static void free_sse(sse_ev *ev, int n) {
    for (int i = 0; i < n; i++) cJSON_Delete(ev[i].data);
}

static const char *str(const cJSON *o, const char *path) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, ".")) {
        if (*tok >= '0' && *tok <= '9') cur = cJSON_GetArrayItem(cur, atoi(tok));
        else cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
    }
    return cJSON_IsString(cur) ? cur->valuestring : NULL;
}

static bool json_eq(const char *a, const char *b) {
    cJSON *x = cJSON_Parse(a), *y = cJSON_Parse(b);
    bool eq = x && y && cJSON_Compare(x, y, true);
    cJSON_Delete(x);
    cJSON_Delete(y);
    return eq;
}

/* A streaming encoder (thinking prompt) writing into out. */
static ds4_enc *stream_enc(ds4_request *r, ds4_api api, ds4_buf *out) {
    make_req(r, api, true);
    ds4_enc_opts o = {.req = r, .thinking = true, .out = collect, .ud = out};
    return ds4_enc_new(&o);
}

/* Keep-alives before begin (a request waiting in the server's queue) send
 * the opening events that need no usage, and begin then adds only what is
 * missing: one role chunk (Chat), one created (Responses), pings then
 * message_start (Messages). */
static void test_keepalive_before_begin(void) {
    const ds4_api apis[3] = {DS4_API_CHAT, DS4_API_RESPONSES, DS4_API_MESSAGES};
    for (int k = 0; k < 3; k++) {
        ds4_request r;
        ds4_buf out = {0};
        ds4_enc *e = stream_enc(&r, apis[k], &out);
        ds4_enc_keepalive(e);
        ds4_enc_keepalive(e);
        size_t before = out.len;
        run(e, "a</think>b", DS4_CAUSE_EOS);
        static sse_ev ev[64];
        int n = parse_sse(out.data, ev, 64), roles = 0, created = 0, first_start = -1, pings_before = 0;
        for (int i = 0; i < n; i++) {
            if (ev[i].done || !ev[i].data) continue;
            if (apis[k] == DS4_API_CHAT && str(ev[i].data, "choices.0.delta.role")) roles++;
            if (!strcmp(ev[i].name, "response.created")) created++;
            if (!strcmp(ev[i].name, "message_start") && first_start < 0) first_start = i;
            if (!strcmp(ev[i].name, "ping") && first_start < 0) pings_before++;
        }
        if (apis[k] == DS4_API_CHAT) {
            CHECK(roles == 1 && memmem(out.data, before, "\"role\":\"assistant\"", 18), "chat: one role chunk, sent by the keep-alive");
        } else if (apis[k] == DS4_API_RESPONSES) {
            CHECK(created == 1 && !strcmp(ev[0].name, "response.created") && !strcmp(ev[1].name, "response.in_progress") &&
                  !strcmp(ev[2].name, "response.in_progress"), "responses: created, in_progress, in_progress first");
            for (int i = 0; i < n; i++)
                CHECK(cJSON_GetObjectItem(ev[i].data, "sequence_number")->valueint == i, "sequence %d", i);
        } else {
            CHECK(pings_before == 2 && first_start == 2 && !strcmp(ev[n - 1].name, "message_stop"),
                  "messages: two pings, then message_start (%d, %d)", pings_before, first_start);
        }
        free_sse(ev, n);
        ds4_buf_free(&out);
        ds4_enc_free(e);
    }
}

static const char *ARGS0 = "{\"path\":\"src/a & b.c\",\"limit\":200}";

static void test_chat_stream(void) {
    ds4_request r;
    ds4_buf out = {0};
    ds4_enc *e = stream_enc(&r, DS4_API_CHAT, &out);
    CHECK(run(e, GEN_TOOL, DS4_CAUSE_EOS), "tool block end stops generation");
    static sse_ev ev[400];
    int n = parse_sse(out.data, ev, 400);
    CHECK(n > 5, "events %d", n);
    CHECK(!strcmp(str(ev[0].data, "choices.0.delta.role"), "assistant"), "role chunk first");
    ds4_buf reasoning = {0}, content = {0}, args[2] = {{0}, {0}};
    const char *ids[2] = {NULL, NULL};
    const char *finish = NULL;
    bool usage = false;
    for (int i = 0; i < n; i++) {
        if (ev[i].done) { CHECK(i == n - 1, "[DONE] last"); continue; }
        cJSON *d = ev[i].data;
        CHECK(d != NULL, "event %d is JSON", i);
        if (!d) continue;
        CHECK(!strcmp(str(d, "id"), str(ev[0].data, "id")), "same id");
        CHECK(cJSON_IsArray(cJSON_GetObjectItem(d, "choices")), "choices present in %d", i);
        CHECK(!cJSON_GetObjectItem(d, "error"), "no error key");
        if (cJSON_GetObjectItem(d, "usage")) {
            usage = true;
            CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(d, "choices")) == 0, "usage chunk has no choices");
            CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(d, "usage"), "prompt_tokens_details"), "cached_tokens")->valueint == 60, "cached");
            continue;
        }
        const char *s;
        if ((s = str(d, "choices.0.delta.reasoning_content"))) ds4_buf_puts(&reasoning, s);
        if ((s = str(d, "choices.0.delta.content"))) ds4_buf_puts(&content, s);
        if ((s = str(d, "choices.0.finish_reason"))) finish = s;
        cJSON *tc = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(d, "choices"), 0), "delta"), "tool_calls");
        if (tc) {
            cJSON *t = cJSON_GetArrayItem(tc, 0);
            int idx = cJSON_GetObjectItem(t, "index")->valueint;
            CHECK(idx == 0 || idx == 1, "index %d", idx);
            CHECK(cJSON_IsObject(cJSON_GetObjectItem(t, "function")), "function object in every tool delta");
            const char *id = str(t, "id");
            if (id) {
                CHECK(ids[idx] == NULL, "id only in the first delta of a call");
                ids[idx] = id;
                CHECK(!strncmp(id, "call_", 5) && strlen(id) == 37, "id %s", id);
                CHECK(str(t, "function.name") && !strcmp(str(t, "function.arguments"), ""), "header delta");
            } else {
                CHECK(ids[idx] != NULL && !str(t, "function.name"), "continuation has no id/name");
            }
            ds4_buf_puts(&args[idx], str(t, "function.arguments"));
            /* no strict prefix of the arguments may already be complete JSON */
            if (!strstr(args[idx].data, "}")) CHECK(!json_eq(args[idx].data, args[idx].data) || args[idx].len == 0, "prefix not JSON");
        }
    }
    CHECK(reasoning.data && !strcmp(reasoning.data, "Let me look."), "reasoning '%s'", reasoning.data);
    CHECK(content.data && !strcmp(content.data, "I'll read it."), "content '%s' (no whitespace before DSML)", content.data);
    CHECK(args[0].data && json_eq(args[0].data, ARGS0), "args0 %s", args[0].data);
    CHECK(args[1].data && !strcmp(args[1].data, "{}"), "args1 %s", args[1].data);
    CHECK(finish && !strcmp(finish, "tool_calls"), "finish %s", finish);
    CHECK(usage, "usage chunk");
    CHECK(ids[0] && ids[1] && strcmp(ids[0], ids[1]), "distinct ids");
    const char *cids[4];
    CHECK(ds4_enc_call_ids(e, cids, 4) == 2 && !strcmp(cids[0], ids[0]), "call ids kept");
    size_t bl;
    const char *blk = ds4_enc_block(e, &bl);
    CHECK(blk && bl == strlen(strstr(GEN_TOOL, "\n\n" DSML_OPEN)) && !memcmp(blk, "\n\n" DSML_OPEN, 2 + strlen(DSML_OPEN)),
          "exact block for replay");
    free_sse(ev, n);
    ds4_buf_free(&reasoning); ds4_buf_free(&content); ds4_buf_free(&args[0]); ds4_buf_free(&args[1]);
    ds4_buf_free(&out);
    ds4_enc_free(e);
}

static void test_anthropic_stream(void) {
    ds4_request r;
    ds4_buf out = {0};
    ds4_enc *e = stream_enc(&r, DS4_API_MESSAGES, &out);
    run(e, GEN_TOOL, DS4_CAUSE_EOS);
    static sse_ev ev[400];
    int n = parse_sse(out.data, ev, 400);
    CHECK(n > 5 && !strcmp(ev[0].name, "message_start"), "message_start first");
    CHECK(cJSON_IsNumber(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(ev[0].data, "message"), "usage"), "input_tokens")), "input_tokens present");
    CHECK(!strcmp(ev[n - 1].name, "message_stop"), "message_stop last");
    int next_index = 0, open = -1;
    ds4_buf tool_json[2] = {{0}, {0}};
    const char *types[8] = {0};
    for (int i = 0; i < n; i++) {
        CHECK(ev[i].data && !strcmp(ev[i].name, str(ev[i].data, "type")), "event name == type (%s)", ev[i].name);
        if (!strcmp(ev[i].name, "content_block_start")) {
            int idx = cJSON_GetObjectItem(ev[i].data, "index")->valueint;
            CHECK(idx == next_index && open < 0, "contiguous, one open block");
            if (idx < 8) types[idx] = str(ev[i].data, "content_block.type");
            open = idx;
            next_index++;
        } else if (!strcmp(ev[i].name, "content_block_stop")) {
            CHECK(cJSON_GetObjectItem(ev[i].data, "index")->valueint == open, "stop matches start");
            open = -1;
        } else if (!strcmp(ev[i].name, "content_block_delta")) {
            CHECK(cJSON_GetObjectItem(ev[i].data, "index")->valueint == open, "delta in open block");
            const char *pj = str(ev[i].data, "delta.partial_json");
            if (pj && open >= 2 && open <= 3) ds4_buf_puts(&tool_json[open - 2], pj);
        } else if (!strcmp(ev[i].name, "message_delta")) {
            CHECK(!strcmp(str(ev[i].data, "delta.stop_reason"), "tool_use"), "stop_reason");
            CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(ev[i].data, "usage"), "output_tokens")->valueint == 30, "output_tokens");
        }
    }
    CHECK(types[0] && !strcmp(types[0], "thinking") && !strcmp(types[1], "text") && !strcmp(types[2], "tool_use") &&
          !strcmp(types[3], "tool_use"), "block order thinking,text,tool,tool");
    CHECK(tool_json[0].data && json_eq(tool_json[0].data, ARGS0), "input json %s", tool_json[0].data);
    free_sse(ev, n);
    ds4_buf_free(&tool_json[0]); ds4_buf_free(&tool_json[1]);
    ds4_buf_free(&out);
    ds4_enc_free(e);
}

static void test_responses_stream(void) {
    ds4_request r;
    ds4_buf out = {0};
    ds4_enc *e = stream_enc(&r, DS4_API_RESPONSES, &out);
    run(e, GEN_TOOL, DS4_CAUSE_EOS);
    static sse_ev ev[400];
    int n = parse_sse(out.data, ev, 400);
    CHECK(n > 5 && !strcmp(ev[0].name, "response.created"), "created first");
    CHECK(!strcmp(ev[n - 1].name, "response.completed"), "completed last: %s", ev[n - 1].name);
    bool added[8] = {0};
    for (int i = 0; i < n; i++) {
        CHECK(ev[i].data && !strcmp(ev[i].name, str(ev[i].data, "type")), "name == type");
        CHECK(cJSON_GetObjectItem(ev[i].data, "sequence_number")->valueint == i, "sequence %d", i);
        cJSON *oi = cJSON_GetObjectItem(ev[i].data, "output_index");
        if (!oi) continue;
        if (!strcmp(ev[i].name, "response.output_item.added")) added[oi->valueint & 7] = true;
        else CHECK(added[oi->valueint & 7], "%s before output_item.added", ev[i].name);
    }
    cJSON *resp = cJSON_GetObjectItem(ev[n - 1].data, "response");
    cJSON *outp = cJSON_GetObjectItem(resp, "output");
    CHECK(cJSON_GetArraySize(outp) == 4, "4 output items");
    CHECK(!strcmp(str(outp, "0.type"), "reasoning") && !strcmp(str(outp, "0.summary.0.text"), "Let me look."), "reasoning item");
    CHECK(!strcmp(str(outp, "1.content.0.text"), "I'll read it.") && !strcmp(str(outp, "1.role"), "assistant"), "message item");
    CHECK(!strcmp(str(outp, "2.type"), "function_call") && json_eq(str(outp, "2.arguments"), ARGS0) &&
          !strncmp(str(outp, "2.call_id"), "call_", 5), "function_call item");
    cJSON *usage = cJSON_GetObjectItem(resp, "usage");
    CHECK(cJSON_GetObjectItem(usage, "total_tokens")->valueint == 130, "usage total");
    free_sse(ev, n);
    ds4_buf_free(&out);
    ds4_enc_free(e);
}

static void test_bodies(void) {
    ds4_request r;
    make_req(&r, DS4_API_CHAT, false);
    ds4_enc_opts o = {.req = &r, .thinking = true};
    ds4_enc *e = ds4_enc_new(&o);
    run(e, GEN_TOOL, DS4_CAUSE_EOS);
    size_t n;
    cJSON *b = cJSON_Parse(ds4_enc_body(e, &n));
    CHECK(b && !strcmp(str(b, "object"), "chat.completion") && !strcmp(str(b, "model"), "m-echo"), "chat body");
    CHECK(!strcmp(str(b, "choices.0.finish_reason"), "tool_calls") &&
          json_eq(str(b, "choices.0.message.tool_calls.0.function.arguments"), ARGS0) &&
          !strcmp(str(b, "choices.0.message.reasoning_content"), "Let me look."), "chat body fields");
    cJSON_Delete(b);
    ds4_enc_free(e);

    make_req(&r, DS4_API_MESSAGES, false);
    e = ds4_enc_new(&o);
    run(e, "abc</think>", DS4_CAUSE_LENGTH);
    b = cJSON_Parse(ds4_enc_body(e, &n));
    CHECK(b && !strcmp(str(b, "stop_reason"), "max_tokens") && !strcmp(str(b, "content.0.type"), "thinking") &&
          !strcmp(str(b, "content.1.type"), "text") && !strcmp(str(b, "content.1.text"), ""), "anthropic empty text block");
    cJSON_Delete(b);
    ds4_enc_free(e);

    /* an unterminated block is not a tool call: raw text as content */
    make_req(&r, DS4_API_CHAT, false);
    o.thinking = false;
    e = ds4_enc_new(&o);
    run(e, "x\n\n" DSML_OPEN "tool_calls>\n" DSML_OPEN "invoke name=\"a\">", DS4_CAUSE_LENGTH);
    b = cJSON_Parse(ds4_enc_body(e, &n));
    CHECK(b && !cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"), 0), "message"), "tool_calls") &&
          !strcmp(str(b, "choices.0.finish_reason"), "length") && !strncmp(str(b, "choices.0.message.content"), "x\n\n", 3),
          "unterminated -> content");
    cJSON_Delete(b);
    ds4_enc_free(e);

    /* stop string across chunks; Anthropic reports which one matched */
    make_req(&r, DS4_API_MESSAGES, false);
    const char *stops[] = {"STOP", "zz"};
    r.stop = stops;
    r.n_stop = 2;
    r.n_tools = 0;
    e = ds4_enc_new(&o);
    CHECK(run(e, "hello ST", DS4_CAUSE_EOS) == false, "no match yet");
    ds4_enc_free(e);
    e = ds4_enc_new(&o);
    CHECK(run(e, "hello STOP and more", DS4_CAUSE_EOS), "matched");
    b = cJSON_Parse(ds4_enc_body(e, &n));
    CHECK(b && !strcmp(str(b, "content.0.text"), "hello ") && !strcmp(str(b, "stop_reason"), "stop_sequence") &&
          !strcmp(str(b, "stop_sequence"), "STOP"), "stop sequence body");
    cJSON_Delete(b);
    ds4_enc_free(e);
}

static void test_stopper(void) {
    const char *stops[] = {"abc", "bcd"};
    ds4_stopper s;
    ds4_stopper_init(&s, stops, 2);
    ds4_buf got = {0};
    const char *span;
    const char *in = "xxab" "xbcd" "yy";
    size_t k;
    for (int i = 0; i < 10; i += 2) {
        k = ds4_stopper_push(&s, in + i, 2, &span);
        ds4_buf_put(&got, span, k);
    }
    k = ds4_stopper_flush(&s, &span);
    ds4_buf_put(&got, span, k);
    CHECK(s.matched == 1 && got.len == 5 && !memcmp(got.data, "xxabx", 5), "matched %d got %.*s", s.matched, (int)got.len, got.data);
    ds4_stopper_free(&s);
    ds4_buf_free(&got);

    ds4_stopper_init(&s, stops, 2);
    k = ds4_stopper_push(&s, "hello ab", 8, &span);
    CHECK(k == 6, "holds back len-1 = 2 bytes, released %zu", k);
    k = ds4_stopper_flush(&s, &span);
    CHECK(k == 2 && !memcmp(span, "ab", 2), "flush releases the tail");
    ds4_stopper_free(&s);
}

/* A call to a tool declared {"type":"custom"} comes back as a
 * custom_tool_call whose input is the single string parameter. */
static void test_custom_tool(void) {
    static const char gen[] = "\n\n" DSML_OPEN "tool_calls>\n" DSML_OPEN "invoke name=\"apply_patch\">\n"
        DSML_OPEN "parameter name=\"input\" string=\"true\">*** Begin Patch\n+x" DSML_CLOSE "parameter>\n"
        DSML_CLOSE "invoke>\n" DSML_CLOSE "tool_calls>";
    ds4_tool_meta meta = {.name = "apply_patch", .short_name = "apply_patch", .kind = DS4_TOOL_CUSTOM};
    ds4_tool_def def = {.name = "apply_patch"};
    for (int stream = 0; stream < 2; stream++) {
        ds4_request r;
        make_req(&r, DS4_API_RESPONSES, stream);
        r.tools = &def;
        r.tool_meta = &meta;
        r.n_tools = 1;
        ds4_buf out = {0};
        ds4_enc_opts o = {.req = &r, .out = stream ? collect : NULL, .ud = &out};
        ds4_enc *e = ds4_enc_new(&o);
        run(e, gen, DS4_CAUSE_EOS);
        const cJSON *resp;
        cJSON *body = NULL;
        static sse_ev ev[100];
        int n = 0;
        if (stream) {
            n = parse_sse(out.data, ev, 100);
            resp = cJSON_GetObjectItem(ev[n - 1].data, "response");
            bool done = false;
            for (int i = 0; i < n; i++)
                if (!strcmp(ev[i].name, "response.custom_tool_call_input.done"))
                    done = !strcmp(str(ev[i].data, "input"), "*** Begin Patch\n+x");
            CHECK(done, "custom_tool_call_input.done event");
        } else {
            size_t len;
            body = cJSON_Parse(ds4_enc_body(e, &len));
            resp = body;
        }
        const cJSON *outp = cJSON_GetObjectItem(resp, "output");
        CHECK(str(outp, "0.type") && !strcmp(str(outp, "0.type"), "custom_tool_call") &&
              !strcmp(str(outp, "0.input"), "*** Begin Patch\n+x") && !strcmp(str(outp, "0.name"), "apply_patch"),
              "custom_tool_call item (stream %d)", stream);
        cJSON_Delete(body);
        free_sse(ev, n);
        ds4_buf_free(&out);
        ds4_enc_free(e);
    }
}

int main(void) {
    for (int i = 0; i < 2; i++) DEFS[i].name = META[i].name;
    test_stopper();
    test_chat_stream();
    test_anthropic_stream();
    test_responses_stream();
    test_bodies();
    test_custom_tool();
    test_keepalive_before_begin();
    return check_done("test_stream");
}
