/* Fuzz target: the request decoders of every API family, then the response
 * encoder of that family. Input: one byte picking the family, the body, and
 * optionally a NUL followed by "generated text" that is streamed through the
 * encoder for the decoded request (tools, stop strings, stream flag all come
 * from the body). A decoded request must be internally consistent; every SSE
 * data line and every body the encoder writes must be valid JSON. */
#include "server/request.h"
#include "server/stream.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int collect(void *ud, const char *s, size_t n) {
    ds4_buf_put(ud, s, n);
    return 0;
}

static void must_parse(const char *s, size_t n) {
    cJSON *j = cJSON_ParseWithLength(s, n);
    if (!j) abort();
    cJSON_Delete(j);
}

static void encode_response(const ds4_request *r, const char *gen, size_t n) {
    ds4_buf out = {0};
    ds4_enc_opts o = {.req = r, .thinking = r->think != DS4_THINK_NONE, .out = collect, .ud = &out};
    ds4_enc *e = ds4_enc_new(&o);
    if (!e) return;
    ds4_usage u = {.prompt_tokens = 10, .cached_tokens = 3};
    ds4_enc_begin(e, &u);
    size_t step = n ? (unsigned char)gen[0] % 7 + 1 : 1;
    for (size_t i = 0; i < n; i += step) {
        u.completion_tokens++;
        if (ds4_enc_feed(e, gen + i, n - i < step ? n - i : step)) break;
    }
    ds4_enc_finish(e, n % 2 ? DS4_CAUSE_LENGTH : DS4_CAUSE_EOS, &u);
    if (r->stream) {
        for (const char *p = out.data, *end; p && (end = strstr(p, "\n\n")); p = end + 2) {
            const char *d = strstr(p, "data: ");
            if (!d || d > end) continue;
            d += 6;
            if (strncmp(d, "[DONE]", 6)) must_parse(d, (size_t)(end - d));
        }
    } else {
        size_t len;
        const char *b = ds4_enc_body(e, &len);
        must_parse(b, len);
    }
    ds4_enc_free(e);
    ds4_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ds4_api api = (ds4_api)(data[0] % 5);
    const char *body = (const char *)data + 1;
    const char *nul = memchr(body, 0, size - 1);
    size_t blen = nul ? (size_t)(nul - body) : size - 1;
    ds4_request r;
    ds4_req_error e;
    int st = ds4_request_decode(api, body, blen, &r, &e);
    if (st) {
        if (st < 400 || st > 599 || !e.message[0]) abort();
        return 0;
    }
    size_t sum = strlen(r.model);
    for (int i = 0; i < r.n_msgs; i++) {
        const ds4_chat_msg *m = &r.msgs[i];
        if (m->content) sum += strlen(m->content);
        if (m->reasoning_content) sum += strlen(m->reasoning_content);
        for (int j = 0; j < m->n_tool_calls; j++)
            sum += strlen(m->tool_calls[j].name) + strlen(m->tool_calls[j].arguments);
    }
    for (int i = 0; i < r.n_tools; i++) sum += strlen(r.tools[i].json) + strlen(r.tool_meta[i].name);
    for (int i = 0; i < r.n_stop; i++) if (!r.stop[i][0]) abort();
    for (int i = 0; i < r.n_prompts; i++)
        if (!r.prompts[i].text == !r.prompts[i].ids && r.prompts[i].n_ids) abort();
    if (r.sampling.top_k < 0 || r.sampling.top_k > DS4_SAMPLER_MAX_TOP_K) abort();
    /* The server renders every decoded chat request: that must not fail on
     * anything the decoder accepted except a tool call without a name. */
    if (api != DS4_API_COMPLETIONS) {
        ds4_chat_opts o;
        ds4_chat_opts_default(&o);
        o.tools = r.tools;
        o.n_tools = r.n_tools;
        o.think = r.think;
        ds4_buf out = {0};
        char err[200];
        ds4_chat_render(r.msgs, r.n_msgs, &o, &out, err, sizeof err);
        ds4_buf_free(&out);
    }
    (void)sum;
    if (nul && api != DS4_API_COMPLETIONS && api != DS4_API_COUNT_TOKENS)
        encode_response(&r, nul + 1, size - 1 - blen - 1);
    ds4_request_free(&r);
    return 0;
}
