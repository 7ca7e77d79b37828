/* The rendered prompt and the tokenizer together: a non-thinking prompt of
 * one user message costs exactly (content tokens + 4) tokens -- BOS, User,
 * Assistant and </think> -- and the thinking prompt likewise with <think>.
 * This is the budget rule clients rely on when they count prompt tokens,
 * and it breaks if the template adds stray bytes or the tokenizer stops
 * treating the protocol strings as single added tokens.
 * Also: the official and ds4-server profiles render ordinary tool-less
 * conversations identically (the rendering choice docs/prompt-format.md states). */
#include <string.h>
#include "check.h"
#include "text/chat.h"
#include "text/tokenizer.h"

#define V3_JSON "data/deepseek-v3-tokenizer.json"
#define V4_ADDED "tests/fixtures/tokenizer/v4-added-tokens.json"

static size_t count(const ds4_tokenizer *t, const char *s, size_t n, enum ds4_tok_specials sp,
                    ds4_token_ids *ids) {
    ids->n = 0;
    CHECK(ds4_tokenizer_encode(t, s, n, sp, ids) == 0, "encode failed");
    return ids->n;
}

int main(void) {
    char err[256];
    ds4_tokenizer *t = ds4_tokenizer_from_hf_json(V3_JSON, V4_ADDED, err, sizeof err);
    CHECK(t != NULL, "load: %s", err);
    if (!t) return check_done("prompt_tokens");
    const ds4_special_ids *sp = ds4_tokenizer_specials(t);
    const char *contents[] = {
        "Hello",
        "Explain Redis streams in one paragraph.",
        "  leading and trailing spaces  ",
        "line one\nline two\n\n",
        "你好，世界！今天天气很好。",
        "def f(x):\n    return x ** 2  # square\n",
        "emoji 🚀🔥 and numbers 1234567890",
    };
    ds4_token_ids ids = {0};
    for (size_t i = 0; i < sizeof contents / sizeof *contents; i++) {
        const char *c = contents[i];
        size_t n_content = count(t, c, strlen(c), DS4_TOK_SPECIALS_NONE, &ids);
        for (int think = 0; think < 2; think++) {
            ds4_chat_msg m = { .role = DS4_ROLE_USER, .content = c };
            ds4_chat_opts o;
            ds4_chat_opts_default(&o);
            o.think = think ? DS4_THINK_HIGH : DS4_THINK_NONE;
            ds4_buf text = {0};
            CHECK(ds4_chat_render(&m, 1, &o, &text, err, sizeof err), "render: %s", err);
            size_t n = count(t, text.data, text.len, DS4_TOK_SPECIALS_CHAT, &ids);
            CHECK(n == n_content + 4, "case %zu think=%d: %zu tokens, content %zu", i, think, n, n_content);
            if (n == n_content + 4) {
                CHECK(ids.v[0] == sp->bos && ids.v[1] == sp->user, "case %zu: prefix", i);
                CHECK(ids.v[n - 2] == sp->assistant, "case %zu: assistant", i);
                CHECK(ids.v[n - 1] == (think ? sp->think : sp->think_end), "case %zu: think marker", i);
            }
            ds4_buf_free(&text);
        }
    }
    ds4_token_ids_free(&ids);

    ds4_chat_msg conv[] = {
        { .role = DS4_ROLE_SYSTEM, .content = "Be brief." },
        { .role = DS4_ROLE_USER, .content = "hi" },
        { .role = DS4_ROLE_ASSISTANT, .content = "hello", .reasoning_content = "the user greets" },
        { .role = DS4_ROLE_USER, .content = "and now?" },
        { .role = DS4_ROLE_ASSISTANT, .content = "done" },
        { .role = DS4_ROLE_USER, .content = "thanks" },
    };
    for (int n = 2; n <= 6; n++) {
        for (int think = 0; think < 3; think++) {
            ds4_chat_opts a, b;
            ds4_chat_opts_default(&a);
            ds4_chat_opts_default(&b);
            a.profile = DS4_CHAT_OFFICIAL;
            b.profile = DS4_CHAT_DS4;
            a.think = b.think = think == 0 ? DS4_THINK_NONE : think == 1 ? DS4_THINK_HIGH : DS4_THINK_MAX;
            ds4_buf x = {0}, y = {0};
            CHECK(ds4_chat_render(conv, n, &a, &x, err, sizeof err), "official: %s", err);
            CHECK(ds4_chat_render(conv, n, &b, &y, err, sizeof err), "ds4: %s", err);
            CHECK(x.len == y.len && memcmp(x.data, y.data, x.len) == 0,
                  "profiles differ for %d messages, think %d:\n%s\n---\n%s", n, think, x.data, y.data);
            ds4_buf_free(&x);
            ds4_buf_free(&y);
        }
    }
    ds4_tokenizer_free(t);
    return check_done("prompt_tokens");
}
