/* route_key: what two requests' prompts share from the start, as the queue
 * uses it to pick a slot (issue 11: the slot with the longest reusable
 * prefix, otherwise the least recently used one). Requests are decoded by
 * the server's own decoder, so the keys are those the queue compares.
 * - the same conversation with its JSON members reordered and other
 *   sampling shares its whole key;
 * - a next turn shares all of the earlier request;
 * - unrelated requests share nothing, also when their first messages start
 *   alike (only whole messages count);
 * - the same tool list shares exactly the tools' bytes;
 * - another thinking mode shares nothing (it renders differently);
 * - a completions prompt and its extension share its whole 256-byte sections
 *   (the last, shorter one differs from the extension's);
 * - a key cut short (as a slot keeps it) shares only its whole sections. */
#include "check.h"
#include "server/route_key.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the request's key as a malloc'ed buffer (*n bytes) */
static char *key_of(ds4_api api, const char *body, size_t *n) {
    ds4_request r;
    ds4_req_error e;
    if (ds4_request_decode(api, body, strlen(body), &r, &e)) {
        fprintf(stderr, "decode: %s\n", e.message);
        *n = 0;
        return NULL;
    }
    ds4_buf b = {0};
    ds4_route_key(&r, &b);
    ds4_request_free(&r);
    *n = b.len;
    return ds4_buf_take(&b);
}

static size_t shared(ds4_api api, const char *a, const char *b) {
    size_t na, nb;
    char *ka = key_of(api, a, &na), *kb = key_of(api, b, &nb);
    size_t s = ka && kb ? ds4_route_shared(ka, na, kb, nb) : (size_t)-1;
    free(ka);
    free(kb);
    return s;
}

static size_t weight(ds4_api api, const char *a) { return shared(api, a, a); }

#define TOOL "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather of a city\"," \
             "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}"

static void test_chat(void) {
    const ds4_api C = DS4_API_CHAT;
    const char *first = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Name three colours.\"}],"
                        "\"max_tokens\":5}";
    const char *reordered = "{\"temperature\":0.5,\"messages\":[{\"content\":\"Name three colours.\",\"role\":\"user\"}],"
                            "\"model\":\"other\"}";
    const char *next = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Name three colours.\"},"
                       "{\"role\":\"assistant\",\"content\":\"Red, green, blue.\"},"
                       "{\"role\":\"user\",\"content\":\"Three more?\"}],\"max_tokens\":5}";
    const char *unrelated = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Write about the sea.\"}]}";
    const char *alike = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Name three animals.\"}]}";
    const size_t w = weight(C, first);
    CHECK(w >= strlen("Name three colours."), "a message weighs at least its text (%zu)", w);
    CHECK(shared(C, first, reordered) == w, "member order and sampling do not matter: %zu of %zu",
          shared(C, first, reordered), w);
    CHECK(shared(C, first, next) == w, "a next turn shares the whole earlier request: %zu of %zu",
          shared(C, first, next), w);
    CHECK(shared(C, next, first) == w, "and the earlier request the start of the next: %zu", shared(C, next, first));
    CHECK(shared(C, first, unrelated) == 0, "unrelated requests share nothing: %zu", shared(C, first, unrelated));
    CHECK(shared(C, first, alike) == 0, "messages that only start alike share nothing: %zu", shared(C, first, alike));

    const char *tools_a = "{\"tools\":[" TOOL "],\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Oslo?\"}]}";
    const char *tools_b = "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Rome?\"}],\"tools\":[" TOOL "]}";
    const char *no_tools = "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Oslo?\"}]}";
    const size_t tools = shared(C, tools_a, tools_b);
    CHECK(tools > strlen("get_weather") && tools < weight(C, tools_a),
          "the same tools are shared, the messages after them not: %zu of %zu", tools, weight(C, tools_a));
    CHECK(shared(C, tools_a, no_tools) == 0, "other tools: nothing shared (%zu)", shared(C, tools_a, no_tools));

    const char *think_off = "{\"thinking\":{\"type\":\"disabled\"},\"messages\":[{\"role\":\"user\",\"content\":"
                            "\"Name three colours.\"}]}";
    CHECK(shared(C, first, think_off) == 0, "another thinking mode renders differently: %zu",
          shared(C, first, think_off));
}

static void test_completions(void) {
    const ds4_api P = DS4_API_COMPLETIONS;
    char text[700 + 1], body_a[800], body_b[1000];
    for (int i = 0; i < 700; i++) text[i] = (char)('a' + i % 26);
    text[700] = '\0';
    snprintf(body_a, sizeof body_a, "{\"prompt\":\"%s\"}", text);
    snprintf(body_b, sizeof body_b, "{\"max_tokens\":3,\"prompt\":\"%s and then some more text\"}", text);
    CHECK(weight(P, body_a) == 700, "a 700-byte prompt weighs 700: %zu", weight(P, body_a));
    CHECK(shared(P, body_a, body_b) == 512, "its extension shares its two whole 256-byte sections: %zu",
          shared(P, body_a, body_b));
    text[10] = 'Z';
    snprintf(body_b, sizeof body_b, "{\"prompt\":\"%s\"}", text);
    CHECK(shared(P, body_a, body_b) == 0, "a change in the first section shares nothing: %zu", shared(P, body_a, body_b));
}

static void test_cut_key(void) {
    size_t n;
    char *k = key_of(DS4_API_CHAT,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"one\"},{\"role\":\"assistant\",\"content\":"
                     "\"two\"},{\"role\":\"user\",\"content\":\"three\"}]}",
                     &n);
    CHECK(k != NULL, "key");
    if (!k) return;
    const size_t whole = ds4_route_shared(k, n, k, n);
    CHECK(ds4_route_shared(k, n - 1, k, n) < whole && ds4_route_shared(k, n - 1, k, n - 1) < whole,
          "a key cut inside its last section loses that section");
    CHECK(ds4_route_shared(k, 0, k, n) == 0 && ds4_route_shared(k, 3, k, n) == 0, "empty and cut length fields");
    free(k);
}

int main(void) {
    test_chat();
    test_completions();
    test_cut_key();
    return check_done("test_route_key");
}
