/* Fuzz target: the request decoders of every API family. The first byte
 * picks the family; the rest is the body. A decoded request must be
 * internally consistent (counts match arrays, strings NUL-terminated). */
#include "request.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    ds4_api api = (ds4_api)(data[0] % 5);
    ds4_request r;
    ds4_req_error e;
    int st = ds4_request_decode(api, (const char *)data + 1, size - 1, &r, &e);
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
    ds4_request_free(&r);
    return 0;
}
