/* route_key.c -- a request's prompt start as comparable sections. */
#include "server/route_key.h"

#include "models/chat_spec.h"

#include <stdint.h>
#include <string.h>

/* Sections of a legacy completions prompt: its text is the rendered
 * prompt, so a shared start is reusable as it stands; whole sections keep
 * prompts that merely begin alike from counting (see the header). */
enum { PROMPT_SECTION = 256 };

/* One section: its length, then its bytes. */
static void section(ds4_buf *b, const ds4_buf *bytes) {
    const uint32_t n = (uint32_t)bytes->len;
    ds4_buf_put(b, &n, sizeof n);
    ds4_buf_put(b, bytes->data, bytes->len);
}

/* a string field and its terminator (NULL as empty), so that fields cannot
 * run into each other */
static void field(ds4_buf *b, const char *s) {
    if (s) ds4_buf_puts(b, s);
    ds4_buf_putc(b, '\0');
}

static void chat_sections(const ds4_request *r, ds4_buf *b, ds4_buf *one) {
    ds4_buf_clear(one);
    for (int t = 0; t < r->n_tools; t++) {
        const ds4_tool_def *d = &r->tools[t];
        field(one, d->name);
        field(one, d->description);
        field(one, d->parameters);
        field(one, d->json);
    }
    section(b, one);
    for (int m = 0; m < r->n_msgs; m++) {
        const ds4_chat_msg *msg = &r->msgs[m];
        ds4_buf_clear(one);
        ds4_buf_putc(one, (char)msg->role);
        field(one, msg->content);
        field(one, msg->reasoning_content);
        for (int c = 0; c < msg->n_tool_calls; c++) {
            field(one, msg->tool_calls[c].id);
            field(one, msg->tool_calls[c].name);
            field(one, msg->tool_calls[c].arguments);
        }
        field(one, msg->tool_call_id);
        section(b, one);
    }
}

static void prompt_sections(const ds4_request *r, ds4_buf *b, ds4_buf *one) {
    for (int p = 0; p < r->n_prompts; p++) {
        const ds4_prompt *pr = &r->prompts[p];
        const char *bytes = pr->text ? pr->text : (const char *)pr->ids;
        const size_t n = pr->text ? pr->text_len : (size_t)pr->n_ids * sizeof(int32_t);
        for (size_t at = 0; at < n; at += PROMPT_SECTION) {
            ds4_buf_clear(one);
            ds4_buf_put(one, bytes + at, n - at < PROMPT_SECTION ? n - at : PROMPT_SECTION);
            section(b, one);
        }
    }
}

void ds4_route_key(const ds4_request *r, ds4_buf *b) {
    ds4_buf one = {0};
    /* what else decides the rendering: raw prompt or chat, profile, thinking */
    const unsigned char choices[3] = {r->api == DS4_API_COMPLETIONS, (unsigned char)ds4_request_chat(r)->profile,
                                      (unsigned char)r->think};
    ds4_buf_put(&one, choices, sizeof choices);
    section(b, &one);
    if (r->api == DS4_API_COMPLETIONS) prompt_sections(r, b, &one);
    else chat_sections(r, b, &one);
    if (one.oom) b->oom = true;
    ds4_buf_free(&one);
}

size_t ds4_route_shared(const char *a, size_t na, const char *b, size_t nb) {
    size_t at = 0, shared = 0;
    for (int k = 0;; k++) {
        uint32_t n;
        if (na - at < sizeof n || nb - at < sizeof n) return shared;
        memcpy(&n, a + at, sizeof n);
        const size_t end = at + sizeof n + n;
        if (end > na || end > nb || memcmp(a + at, b + at, sizeof n + n)) return shared;
        if (k > 0) shared += n; /* the rendering choices weigh nothing */
        at = end;
    }
}
