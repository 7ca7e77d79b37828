/* Request decoders: thinking resolution (prompt-format sheet section 8),
 * sampling defaults vs explicit knobs, message/item/block mapping per family,
 * error statuses and params (server-api.md 8). */
#include "check.h"
#include "server/request.h"

#include <stdio.h>
#include <string.h>

static int dec(ds4_api api, const char *body, ds4_request *r, ds4_req_error *e) {
    return ds4_request_decode(api, body, strlen(body), r, e);
}

static ds4_think_mode think_of(ds4_api api, const char *body) {
    ds4_request r;
    ds4_req_error e;
    if (dec(api, body, &r, &e)) return (ds4_think_mode)-1;
    ds4_think_mode m = r.think;
    ds4_request_free(&r);
    return m;
}

static void test_thinking(void) {
    const ds4_api C = DS4_API_CHAT;
    CHECK(think_of(C, "{\"messages\":[]}") == DS4_THINK_HIGH, "default thinking");
    CHECK(think_of(C, "{\"model\":\"deepseek-chat\",\"messages\":[]}") == DS4_THINK_NONE, "chat alias");
    CHECK(think_of(C, "{\"model\":\"deepseek-chat\",\"reasoning_effort\":\"max\",\"messages\":[]}") == DS4_THINK_NONE,
          "effort alone never overrides the alias");
    CHECK(think_of(C, "{\"model\":\"deepseek-chat\",\"think\":true,\"messages\":[]}") == DS4_THINK_HIGH, "explicit beats alias");
    CHECK(think_of(C, "{\"thinking\":{\"type\":\"disabled\"},\"reasoning_effort\":\"max\",\"messages\":[]}") == DS4_THINK_NONE,
          "disabled beats max");
    CHECK(think_of(C, "{\"thinking\":{\"type\":\"enabled\"},\"reasoning_effort\":\"none\",\"messages\":[]}") == DS4_THINK_NONE,
          "effort none disables");
    CHECK(think_of(C, "{\"reasoning_effort\":\"xhigh\",\"messages\":[]}") == DS4_THINK_HIGH, "xhigh is high");
    CHECK(think_of(C, "{\"reasoning_effort\":\"max\",\"messages\":[]}") == DS4_THINK_MAX, "max");
    CHECK(think_of(C, "{\"reasoning_effort\":null,\"messages\":[]}") == DS4_THINK_HIGH, "null effort");
    CHECK(think_of(C, "{\"reasoning_effort\":\"huge\",\"messages\":[]}") == (ds4_think_mode)-1, "unknown effort -> error");
    CHECK(think_of(DS4_API_MESSAGES, "{\"thinking\":{\"type\":\"adaptive\"},\"messages\":[]}") == DS4_THINK_HIGH, "adaptive");
    CHECK(think_of(DS4_API_MESSAGES, "{\"output_config\":{\"effort\":\"max\"},\"messages\":[]}") == DS4_THINK_MAX, "output_config");
    CHECK(think_of(DS4_API_RESPONSES, "{\"model\":\"deepseek-chat\",\"reasoning\":{\"effort\":\"high\"},\"input\":\"x\"}") == DS4_THINK_HIGH,
          "responses effort counts as explicit");
    CHECK(think_of(DS4_API_RESPONSES, "{\"model\":\"deepseek-chat\",\"input\":\"x\"}") == DS4_THINK_NONE, "responses alias");
}

static void test_chat(void) {
    ds4_request r;
    ds4_req_error e;
    const char *body =
        "{\"model\":\"x\",\"model\":\"last-wins\",\"temperature\":0,\"top_k\":5000,\"seed\":7,\"stop\":\"END\","
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"max_completion_tokens\":12,"
        "\"metadata\":{\"u\":1},\"store\":false,"
        "\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},"
        "{\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\",\"image_url\":{}},\"b\"]},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"why\",\"tool_calls\":["
        "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"q\\\":1}\"}},"
        "{\"id\":\"call_2\",\"function\":{\"name\":\"g\",\"arguments\":{\"k\":[1,2]}}},"
        "{\"id\":\"call_3\",\"function\":{\"name\":\"dropped\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"r\"},{\"role\":\"latest_reminder\",\"content\":\"x\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]}";
    CHECK(dec(DS4_API_CHAT, body, &r, &e) == 0, "decode: %s", e.message);
    CHECK(!strcmp(r.model, "last-wins"), "duplicate keys: last wins (%s)", r.model);
    CHECK(r.sampling.temperature == 0 && r.sampling.top_p == 1 && r.sampling.min_p == 0.05f, "explicit temp, default others");
    CHECK(r.sampling.top_k == 1024 && r.seed_set && r.sampling.seed == 7, "top_k cap, seed");
    CHECK(r.n_stop == 1 && !strcmp(r.stop[0], "END") && r.stream && r.include_usage && r.max_tokens == 12, "misc");
    CHECK(r.n_msgs == 4, "latest_reminder (DeepSeek's own role) skipped: %d", r.n_msgs);
    CHECK(r.msgs[0].role == DS4_ROLE_DEVELOPER && r.msgs[1].role == DS4_ROLE_USER, "roles");
    CHECK(!strcmp(r.msgs[1].content, "a[image]b"), "parts: '%s'", r.msgs[1].content);
    CHECK(r.msgs[2].content == NULL && !strcmp(r.msgs[2].reasoning_content, "why"), "assistant");
    CHECK(r.msgs[2].n_tool_calls == 2 && !strcmp(r.msgs[2].tool_calls[0].arguments, "{\"q\":1}") &&
          !strcmp(r.msgs[2].tool_calls[1].arguments, "{\"k\":[1,2]}"), "tool calls, object arguments serialised");
    CHECK(!strcmp(r.msgs[3].tool_call_id, "call_1"), "tool result id");
    CHECK(r.n_tools == 1 && !strcmp(r.tools[0].name, "f") && strstr(r.tools[0].json, "\"parameters\""), "tools");
    ds4_request_free(&r);

    CHECK(dec(DS4_API_CHAT, "{\"messages\":[],\"tools\":[{\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"}", &r, &e) == 0 &&
          r.n_tools == 0, "tool_choice none removes tools");
    ds4_request_free(&r);

    CHECK(dec(DS4_API_CHAT, "{}", &r, &e) == 400 && !strcmp(e.message, "missing messages") && !strcmp(e.param, "messages"), "missing");
    CHECK(dec(DS4_API_CHAT, "{\"messages\":{}}", &r, &e) == 400 && !strcmp(e.message, "invalid JSON request"), "wrong type");
    CHECK(dec(DS4_API_CHAT, "{\"messages\":[],\"temperature\":\"hot\"}", &r, &e) == 400, "wrong knob type");
    CHECK(dec(DS4_API_CHAT, "{\"messages\":[],\"max_tokens\":-1}", &r, &e) == 400 && !strcmp(e.param, "max_tokens"), "negative max");
    CHECK(dec(DS4_API_CHAT, "{\"messages\":[],\"n\":2}", &r, &e) == 400 && !strcmp(e.param, "n"), "n>1");
    CHECK(dec(DS4_API_CHAT, "{\"messages\":[", &r, &e) == 400, "truncated");
    CHECK(dec(DS4_API_CHAT, "[1]", &r, &e) == 400, "not an object");
    CHECK(dec(DS4_API_CHAT, "{\"messages\":[],\"x\":\"\xff\"}", &r, &e) == 400 && strstr(e.message, "UTF-8"), "invalid UTF-8");
    CHECK(dec(DS4_API_CHAT, "{\"messages\":[{\"content\":\"\\ud83d\\ude00\"}]}", &r, &e) == 0 &&
          !strcmp(r.msgs[0].content, "\xf0\x9f\x98\x80"), "surrogate pair");
    ds4_request_free(&r);
    CHECK(dec(DS4_API_CHAT, "{\"messages\":[{\"content\":\"a\\ud83d|\\ude00\\\\ud800\"}]}", &r, &e) == 0 &&
          !strcmp(r.msgs[0].content, "a\xef\xbf\xbd|\xef\xbf\xbd\\ud800"), "lone surrogates -> U+FFFD, escaped backslash untouched: %s",
          r.msgs[0].content);
    ds4_request_free(&r);
}

static void test_completions(void) {
    ds4_request r;
    ds4_req_error e;
    CHECK(dec(DS4_API_COMPLETIONS, "{\"prompt\":[[1,2,3],[4]],\"echo\":true,\"logprobs\":1,\"max_tokens\":0}", &r, &e) == 0, "%s", e.message);
    CHECK(r.n_prompts == 2 && r.prompts[0].n_ids == 3 && r.prompts[1].ids[0] == 4 && r.echo && r.logprobs == 1 && r.max_tokens == 0,
          "token-id prompts");
    ds4_request_free(&r);
    CHECK(dec(DS4_API_COMPLETIONS, "{\"prompt\":[5,6]}", &r, &e) == 0 && r.n_prompts == 1 && r.prompts[0].n_ids == 2, "flat ids");
    ds4_request_free(&r);
    CHECK(dec(DS4_API_COMPLETIONS, "{\"prompt\":[\"a\",\"bc\"]}", &r, &e) == 0 && r.n_prompts == 2 && !strcmp(r.prompts[1].text, "bc"), "strings");
    ds4_request_free(&r);
    CHECK(dec(DS4_API_COMPLETIONS, "{\"prompt\":[1.5]}", &r, &e) == 400 && !strcmp(e.param, "prompt"), "bad id");
    CHECK(dec(DS4_API_COMPLETIONS, "{\"max_tokens\":3}", &r, &e) == 400 && !strcmp(e.message, "missing prompt"), "missing prompt");
}

static void test_responses(void) {
    ds4_request r;
    ds4_req_error e;
    const char *body =
        "{\"instructions\":\"sys\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"hi\"}]},"
        "{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"t1\"},{\"type\":\"summary_text\",\"text\":\"t2\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"call_a\",\"name\":\"shell\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_a\",\"output\":\"ok\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_live\",\"output\":[{\"type\":\"input_text\",\"text\":\"x\"}]}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"shell\",\"parameters\":{}},"
        "{\"type\":\"namespace\",\"name\":\"mcp__fs__\",\"tools\":[{\"name\":\"read\",\"parameters\":{}}]},{\"type\":\"web_search\"}],"
        "\"reasoning\":{\"summary\":\"auto\"},\"max_output_tokens\":9,\"store\":false,\"include\":[]}";
    CHECK(dec(DS4_API_RESPONSES, body, &r, &e) == 0, "%s", e.message);
    CHECK(r.n_msgs == 5 && r.msgs[0].role == DS4_ROLE_SYSTEM && !strcmp(r.msgs[0].content, "sys"), "instructions first");
    CHECK(r.msgs[2].role == DS4_ROLE_ASSISTANT && !strcmp(r.msgs[2].reasoning_content, "t1\nt2") &&
          r.msgs[2].n_tool_calls == 1 && !strcmp(r.msgs[2].tool_calls[0].id, "call_a"), "reasoning attaches to the call turn");
    CHECK(r.n_live_ids == 1 && !strcmp(r.live_ids[0], "call_live"), "only unreplayed outputs need live state");
    CHECK(r.n_tools == 2 && !strcmp(r.tool_meta[1].name, "mcp__fs__read") && !strcmp(r.tool_meta[1].ns, "mcp__fs__") &&
          !strcmp(r.tool_meta[1].short_name, "read"), "namespace flattened, hosted dropped");
    CHECK(r.expose_reasoning && r.max_tokens == 9, "summary opt-in");
    ds4_request_free(&r);
    CHECK(dec(DS4_API_RESPONSES, "{\"input\":\"x\",\"previous_response_id\":\"r\"}", &r, &e) == 400 &&
          !strcmp(e.param, "previous_response_id"), "previous_response_id");
    CHECK(dec(DS4_API_RESPONSES, "{\"input\":\"x\",\"tool_choice\":\"required\"}", &r, &e) == 400, "required");
    CHECK(dec(DS4_API_RESPONSES, "{\"input\":[{\"type\":\"bogus\"}]}", &r, &e) == 400 && !strcmp(e.code, "unsupported_value"), "item");
    CHECK(dec(DS4_API_RESPONSES, "{}", &r, &e) == 400 && !strcmp(e.param, "input"), "missing input");
}

static void test_messages(void) {
    ds4_request r;
    ds4_req_error e;
    const char *body =
        "{\"system\":[{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: 1\"},{\"type\":\"text\",\"text\":\"A\"},"
        "{\"type\":\"text\",\"text\":\"B\"}],\"max_tokens\":5,\"stop_sequences\":[\"S\",\"\"],\"top_k\":3,"
        "\"messages\":[{\"content\":\"q\",\"role\":\"user\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"th\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"t\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"Read\",\"input\":{\"p\":1}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"a</tool_result>b\"}]},"
        "{\"type\":\"text\",\"text\":\"go\"},{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_9\",\"content\":\"z\"}]}]}";
    CHECK(dec(DS4_API_MESSAGES, body, &r, &e) == 0, "%s", e.message);
    CHECK(r.n_msgs == 4 && !strcmp(r.msgs[0].content, "A\nB"), "system joined, billing header dropped: '%s'", r.msgs[0].content);
    CHECK(!strcmp(r.msgs[2].reasoning_content, "th") && !strcmp(r.msgs[2].content, "t") &&
          !strcmp(r.msgs[2].tool_calls[0].arguments, "{\"p\":1}"), "assistant blocks");
    CHECK(!strcmp(r.msgs[3].content, "<tool_result>a&lt;/tool_result>b</tool_result>go<tool_result>z</tool_result>"),
          "tool results inline: %s", r.msgs[3].content);
    CHECK(r.n_live_ids == 1 && !strcmp(r.live_ids[0], "toolu_9"), "unreplayed tool_use id needs live state");
    CHECK(r.n_stop == 1 && r.sampling.top_k == 3 && r.max_tokens == 5 && r.sampling.min_p == 0.05f, "knobs");
    ds4_request_free(&r);
    CHECK(dec(DS4_API_MESSAGES, "{\"messages\":[],\"stop_sequences\":\"S\"}", &r, &e) == 400, "stop_sequences must be an array");
}

/* Strict bodies: one JSON value, no NUL character, ranges named. */
static void test_body_strictness(void) {
    ds4_request r;
    ds4_req_error e;
    const ds4_api C = DS4_API_CHAT;
    CHECK(dec(C, "{\"messages\":[]} x", &r, &e) == 400 && strstr(e.message, "after the JSON"), "trailing bytes");
    CHECK(dec(C, "{\"messages\":[]}{}", &r, &e) == 400, "two JSON values");
    CHECK(dec(C, "{\"messages\":[]}\r\n \t", &r, &e) == 0, "trailing whitespace is fine");
    ds4_request_free(&r);
    CHECK(dec(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", &r, &e) == 400 &&
          strstr(e.message, "NUL"), "escaped NUL refused");
    const char raw_nul[] = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\0b\"}]}";
    CHECK(ds4_request_decode(C, raw_nul, sizeof raw_nul - 1, &r, &e) == 400, "raw NUL refused");
    CHECK(dec(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\\\u0000b\"}]}", &r, &e) == 0 &&
          !strcmp(r.msgs[0].content, "a\\u0000b"), "escaped backslash + u0000 is text");
    ds4_request_free(&r);
    /* cJSON would read a non-hex \u escape as U+0000 and cut the text */
    static const char *const bad_escapes[] = {"\\uzzzz", "\\u12", "\\u00g1", "\\ud83d\\uzzzz"};
    for (size_t i = 0; i < sizeof bad_escapes / sizeof *bad_escapes; i++) {
        char body[200];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"a%sb\"}]}", bad_escapes[i]);
        CHECK(dec(C, body, &r, &e) == 400 && strstr(e.message, "\\u escape"), "%s refused: %s", bad_escapes[i], e.message);
    }
    CHECK(dec(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"\\u00e9\\\\uzzzz\"}]}", &r, &e) == 0 &&
          !strcmp(r.msgs[0].content, "\xc3\xa9\\uzzzz"), "valid escape, escaped backslash + uzzzz is text");
    ds4_request_free(&r);
    /* a role the family does not define is named, never dropped */
    CHECK(dec(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"wizard\",\"content\":\"b\"}]}",
              &r, &e) == 400 && !strcmp(e.param, "messages") && strstr(e.message, "messages[1]") &&
          strstr(e.message, "'wizard'"), "chat: unknown role: %s", e.message);
    CHECK(dec(DS4_API_MESSAGES, "{\"max_tokens\":1,\"messages\":[{\"role\":\"wizard\",\"content\":\"b\"}]}",
              &r, &e) == 400 && strstr(e.message, "'wizard'"), "messages: unknown role: %s", e.message);
    /* Claude Code's environment block (with --system-prompt): a system
     * message after the user turn, text blocks with cache_control */
    CHECK(dec(DS4_API_MESSAGES, "{\"max_tokens\":1,\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":\"u\"},"
              "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"# Env\",\"cache_control\":{\"type\":\"ephemeral\"}}]}]}",
              &r, &e) == 0 && r.n_msgs == 3 && r.msgs[2].role == DS4_ROLE_SYSTEM && !strcmp(r.msgs[2].content, "# Env"),
          "messages: a system message is system text: %s", e.message);
    ds4_request_free(&r);
    CHECK(dec(DS4_API_RESPONSES, "{\"input\":[{\"type\":\"message\",\"role\":\"tool\",\"content\":\"b\"}]}",
              &r, &e) == 400 && !strcmp(e.param, "input") && strstr(e.message, "input[0]") && strstr(e.message, "'tool'"),
          "responses: unknown role: %s", e.message);
    const char *bad[][2] = {{"temperature", "-0.5"}, {"top_p", "1.01"}, {"top_p", "-1"}, {"min_p", "2"}, {"top_k", "-1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[200];
        snprintf(body, sizeof body, "{\"messages\":[],\"%s\":%s}", bad[i][0], bad[i][1]);
        CHECK(dec(C, body, &r, &e) == 400 && !strcmp(e.param, bad[i][0]) && strstr(e.message, bad[i][0]),
              "%s=%s: 400 naming the field (%s)", bad[i][0], bad[i][1], e.message);
    }
    CHECK(dec(C, "{\"messages\":[],\"temperature\":0,\"top_p\":1,\"min_p\":0,\"top_k\":0}", &r, &e) == 0 &&
          r.sampling.temperature == 0, "boundary values accepted");
    ds4_request_free(&r);
}

/* The lower bound used to refuse oversized prompts before tokenizing. */
static void test_text_bytes(void) {
    ds4_request r;
    ds4_req_error e;
    int ids;
    CHECK(dec(DS4_API_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"abc\"},"
              "{\"role\":\"user\",\"content\":\"hello\"}],\"tools\":[{\"type\":\"function\","
              "\"function\":{\"name\":\"f\"}}]}", &r, &e) == 0, "decode");
    CHECK(ds4_request_text_bytes(&r, &ids) == 3 + 5 + strlen(r.tools[0].json) && ids == 0, "chat text bytes");
    ds4_request_free(&r);
    CHECK(dec(DS4_API_COMPLETIONS, "{\"prompt\":[\"ab\",\"abcdef\"]}", &r, &e) == 0, "decode");
    CHECK(ds4_request_text_bytes(&r, &ids) == 6, "completions: the longest prompt");
    ds4_request_free(&r);
    CHECK(dec(DS4_API_COMPLETIONS, "{\"prompt\":[[1,2,3],[4]]}", &r, &e) == 0, "decode");
    CHECK(ds4_request_text_bytes(&r, &ids) == 0 && ids == 3, "token-id prompts count ids");
    ds4_request_free(&r);
}

/* Many tool calls in one message: all kept, in order (arrays grow geometrically). */
static void test_many_tool_calls(void) {
    ds4_buf b = {0};
    ds4_buf_puts(&b, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[");
    for (int i = 0; i < 5000; i++) {
        char one[120];
        snprintf(one, sizeof one, "%s{\"id\":\"c%d\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}",
                 i ? "," : "", i);
        ds4_buf_puts(&b, one);
    }
    ds4_buf_puts(&b, "]}]}");
    ds4_request r;
    ds4_req_error e;
    CHECK(ds4_request_decode(DS4_API_CHAT, b.data, b.len, &r, &e) == 0, "decode: %s", e.message);
    CHECK(r.n_msgs == 1 && r.msgs[0].n_tool_calls == 5000 && !strcmp(r.msgs[0].tool_calls[4999].id, "c4999") &&
          !strcmp(r.msgs[0].tool_calls[1234].id, "c1234"), "5000 calls kept in order");
    ds4_request_free(&r);
    ds4_buf_free(&b);
}

int main(void) {
    test_thinking();
    test_chat();
    test_completions();
    test_responses();
    test_messages();
    test_body_strictness();
    test_text_bytes();
    test_many_tool_calls();
    return check_done("test_request");
}
