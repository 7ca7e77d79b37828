#include "server/stream.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/dsml.h"
#include "models/chat_spec.h"

/* ---- stop strings -------------------------------------------------- */

void ds4_stopper_init(ds4_stopper *s, const char *const *stop, int n_stop) {
    memset(s, 0, sizeof *s);
    s->stop = stop;
    s->n_stop = n_stop;
    s->matched = -1;
    for (int i = 0; i < n_stop; i++)
        if (strlen(stop[i]) > s->maxlen) s->maxlen = strlen(stop[i]);
}

size_t ds4_stopper_push(ds4_stopper *s, const char *p, size_t n, const char **span) {
    size_t start = s->released;
    *span = NULL;
    if (s->matched >= 0) return 0;
    ds4_buf_put(&s->text, p, n);
    if (s->text.oom) return 0;
    if (!s->n_stop) {
        s->released = s->text.len;
    } else {
        /* Only a match that ends in the new bytes can be new. */
        size_t from = s->text.len - n >= s->maxlen ? s->text.len - n - s->maxlen + 1 : 0;
        size_t best = SIZE_MAX;
        for (int i = 0; i < s->n_stop; i++) {
            const char *hit = memmem(s->text.data + from, s->text.len - from, s->stop[i], strlen(s->stop[i]));
            if (hit && (size_t)(hit - s->text.data) < best) {
                best = (size_t)(hit - s->text.data);
                s->matched = i;
            }
        }
        if (s->matched >= 0) s->released = best > start ? best : start;
        else if (s->text.len >= s->maxlen) {
            size_t keep = s->text.len - (s->maxlen - 1);
            if (keep > s->released) s->released = keep;
        }
    }
    *span = s->text.data + start;
    return s->released - start;
}

size_t ds4_stopper_flush(ds4_stopper *s, const char **span) {
    size_t start = s->released;
    *span = s->text.data ? s->text.data + start : "";
    if (s->matched >= 0) return 0;
    s->released = s->text.len;
    return s->released - start;
}

void ds4_stopper_free(ds4_stopper *s) {
    ds4_buf_free(&s->text);
}

/* ---- encoder state ------------------------------------------------- */

typedef struct {
    char id[40];        /* call id returned to the client */
    char item_id[40];   /* Responses fc_ item id */
    char *name;
    ds4_buf args;
    bool valid;
    int meta;           /* index into req->tool_meta, -1 unknown */
} call_t;

enum { OPEN_NONE, OPEN_THINKING, OPEN_TEXT, OPEN_TOOL };

typedef struct family_ops family_ops;
/* NULL for an API that is not chat-shaped. */
static const family_ops *family_of(ds4_api api);

struct ds4_enc {
    ds4_enc_opts o;
    const ds4_request *r;
    const family_ops *ops;      /* the request's API family */
    bool stream, broken, began;
    const ds4_tool_parser_ops *parser;  /* the request's chat format's (chat_spec.h) */
    void *p;
    ds4_stopper st;
    ds4_buf reasoning, content, body;
    call_t *calls;
    int n_calls;
    char *block;
    size_t block_len;
    char *error;            /* DSML error message */
    char *error_raw;        /* raw text at the error */
    bool reasoning_closed;
    char id[64];
    long long created;
    /* Anthropic */
    int ablock, open;
    bool any_visible;
    /* Responses */
    int seq, out_index, open_index;
    char rs_id[40], msg_id[40];
    cJSON *items;           /* completed output items */
    /* chat logprobs: entries of content tokens not yet attached to a chunk
     * (stream) or all of them (non-stream); NULL when not requested */
    cJSON *lp_pending, *lp_all;
};

static void write_raw(ds4_enc *e, const char *s, size_t n) {
    if (!e->stream || e->broken) return;
    if (e->o.out(e->o.ud, s, n) != 0) e->broken = true;
}

/* Writes `event: name` (if any) and `data: <json>`; takes ownership of obj. */
static void send_json(ds4_enc *e, const char *event, cJSON *obj) {
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    if (!s) { e->broken = true; return; }
    ds4_buf b = {0};
    if (event) { ds4_buf_puts(&b, "event: "); ds4_buf_puts(&b, event); ds4_buf_putc(&b, '\n'); }
    ds4_buf_puts(&b, "data: ");
    ds4_buf_puts(&b, s);
    ds4_buf_puts(&b, "\n\n");
    free(s);
    if (!b.oom) write_raw(e, b.data, b.len);
    ds4_buf_free(&b);
}

static void add_strn(cJSON *o, const char *k, const char *s, size_t n) {
    char *t = malloc(n + 1);
    if (!t) return;
    memcpy(t, s, n);
    t[n] = 0;
    cJSON_AddStringToObject(o, k, t);
    free(t);
}

static const ds4_tool_meta *call_meta(const ds4_enc *e, const call_t *c) {
    return c->meta >= 0 ? &e->r->tool_meta[c->meta] : NULL;
}

/* ---- OpenAI chat ---------------------------------------------------- */

static cJSON *chat_chunk(ds4_enc *e, cJSON *delta, const char *finish) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", e->id);
    cJSON_AddStringToObject(o, "object", "chat.completion.chunk");
    cJSON_AddNumberToObject(o, "created", (double)e->created);
    cJSON_AddStringToObject(o, "model", e->r->model);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices");
    if (delta) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", 0);
        cJSON_AddItemToObject(c, "delta", delta);
        if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
        else cJSON_AddNullToObject(c, "finish_reason");
        cJSON_AddItemToArray(ch, c);
    }
    return o;
}

static void chat_delta_text(ds4_enc *e, const char *key, const char *s, size_t n) {
    cJSON *d = cJSON_CreateObject();
    add_strn(d, key, s, n);
    cJSON *o = chat_chunk(e, d, NULL);
    if (e->lp_pending && !strcmp(key, "content")) {
        /* the tokens whose text this delta releases */
        cJSON *lp = cJSON_CreateObject();
        cJSON_AddItemToObject(lp, "content", e->lp_pending);
        e->lp_pending = cJSON_CreateArray();
        cJSON_AddItemToObject(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "logprobs", lp);
    }
    send_json(e, NULL, o);
}

static cJSON *chat_call_json(const call_t *c, int index, bool header, const char *args, size_t n) {
    cJSON *tc = cJSON_CreateObject();
    cJSON_AddNumberToObject(tc, "index", index);
    if (header) {
        cJSON_AddStringToObject(tc, "id", c->id);
        cJSON_AddStringToObject(tc, "type", "function");
    }
    cJSON *fn = cJSON_AddObjectToObject(tc, "function");
    if (header) cJSON_AddStringToObject(fn, "name", c->name);
    add_strn(fn, "arguments", args, n);
    return tc;
}

static void chat_delta_call(ds4_enc *e, int index, bool header, const char *args, size_t n) {
    cJSON *d = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls");
    cJSON_AddItemToArray(arr, chat_call_json(&e->calls[index], index, header, args, n));
    send_json(e, NULL, chat_chunk(e, d, NULL));
}

/* ---- Anthropic ------------------------------------------------------ */

static void anth_event(ds4_enc *e, const char *type, cJSON *o) {
    cJSON *x = cJSON_CreateObject();
    cJSON_AddStringToObject(x, "type", type);
    for (cJSON *c = o ? o->child : NULL, *n; c; c = n) {
        n = c->next;
        cJSON_AddItemToObject(x, c->string, cJSON_DetachItemViaPointer(o, c));
    }
    cJSON_Delete(o);
    send_json(e, type, x);
}

static void anth_close(ds4_enc *e) {
    if (e->open == OPEN_NONE) return;
    if (e->open == OPEN_THINKING) {
        cJSON *o = cJSON_CreateObject(), *d = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", e->ablock);
        cJSON_AddStringToObject(d, "type", "signature_delta");
        cJSON_AddStringToObject(d, "signature", e->id);
        cJSON_AddItemToObject(o, "delta", d);
        anth_event(e, "content_block_delta", o);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", e->ablock);
    anth_event(e, "content_block_stop", o);
    e->ablock++;
    e->open = OPEN_NONE;
}

static void anth_open(ds4_enc *e, int kind, const call_t *c) {
    if (e->open == kind && kind != OPEN_TOOL) return;
    anth_close(e);
    cJSON *o = cJSON_CreateObject(), *b = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", e->ablock);
    if (kind == OPEN_THINKING) {
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", "");
        cJSON_AddStringToObject(b, "signature", "");
    } else if (kind == OPEN_TEXT) {
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", "");
    } else {
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddStringToObject(b, "id", c->id);
        cJSON_AddStringToObject(b, "name", c->name);
        cJSON_AddObjectToObject(b, "input");
    }
    cJSON_AddItemToObject(o, "content_block", b);
    anth_event(e, "content_block_start", o);
    e->open = kind;
    if (kind != OPEN_THINKING) e->any_visible = true;
}

static void anth_delta(ds4_enc *e, const char *dtype, const char *key, const char *s, size_t n) {
    cJSON *o = cJSON_CreateObject(), *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", e->ablock);
    cJSON_AddStringToObject(d, "type", dtype);
    add_strn(d, key, s, n);
    cJSON_AddItemToObject(o, "delta", d);
    anth_event(e, "content_block_delta", o);
}

static cJSON *anth_usage(const ds4_usage *u, bool full) {
    cJSON *o = cJSON_CreateObject();
    if (full) cJSON_AddNumberToObject(o, "input_tokens", u->prompt_tokens - u->cached_tokens);
    cJSON_AddNumberToObject(o, "output_tokens", u->completion_tokens);
    if (full) {
        cJSON_AddNumberToObject(o, "cache_read_input_tokens", u->cached_tokens);
        cJSON_AddNumberToObject(o, "cache_creation_input_tokens", 0);
    }
    return o;
}

/* ---- Responses ------------------------------------------------------ */

static cJSON *resp_new(ds4_enc *e, const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", e->seq++);
    return o;
}

static void resp_send(ds4_enc *e, cJSON *o) {
    char type[64];
    snprintf(type, sizeof type, "%s", cJSON_GetObjectItem(o, "type")->valuestring);
    send_json(e, type, o);
}

static cJSON *resp_usage(const ds4_usage *u) {
    cJSON *o = cJSON_CreateObject(), *d;
    cJSON_AddNumberToObject(o, "input_tokens", u->prompt_tokens);
    d = cJSON_AddObjectToObject(o, "input_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
    cJSON_AddNumberToObject(d, "cache_write_tokens", u->prompt_tokens - u->cached_tokens);
    cJSON_AddNumberToObject(o, "output_tokens", u->completion_tokens);
    d = cJSON_AddObjectToObject(o, "output_tokens_details");
    cJSON_AddNumberToObject(d, "reasoning_tokens", u->reasoning_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", u->prompt_tokens + u->completion_tokens);
    return o;
}

/* status: in_progress / completed / incomplete / failed */
static cJSON *resp_object(ds4_enc *e, const char *status, const ds4_usage *u,
                          const char *err_code, const char *err_msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", e->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)e->created);
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddStringToObject(o, "model", e->r->model);
    if (err_code) {
        cJSON *er = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(er, "code", err_code);
        cJSON_AddStringToObject(er, "message", err_msg);
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (!strcmp(status, "incomplete")) {
        cJSON *d = cJSON_AddObjectToObject(o, "incomplete_details");
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
    } else {
        cJSON_AddNullToObject(o, "incomplete_details");
    }
    cJSON_AddItemToObject(o, "output", u && e->items ? cJSON_Duplicate(e->items, 1) : cJSON_CreateArray());
    cJSON_AddBoolToObject(o, "parallel_tool_calls", true);
    cJSON_AddStringToObject(o, "tool_choice", "auto");
    cJSON_AddNullToObject(o, "previous_response_id");
    cJSON_AddBoolToObject(o, "store", false);
    if (u) cJSON_AddItemToObject(o, "usage", resp_usage(u));
    else cJSON_AddNullToObject(o, "usage");
    return o;
}

static void resp_wrap(ds4_enc *e, const char *type, cJSON *resp) {
    cJSON *o = resp_new(e, type);
    cJSON_AddItemToObject(o, "response", resp);
    resp_send(e, o);
}

/* The reasoning summary's or the message's text part. */
static cJSON *resp_part(bool reasoning, const char *s, size_t n) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", reasoning ? "summary_text" : "output_text");
    add_strn(p, "text", s, n);
    if (!reasoning) cJSON_AddArrayToObject(p, "annotations");
    return p;
}

/* The reasoning item (its text in "summary") or the message item (in
 * "content", with the assistant role). */
static cJSON *resp_output_item(ds4_enc *e, bool reasoning, const char *status, bool with_text) {
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", reasoning ? e->rs_id : e->msg_id);
    cJSON_AddStringToObject(it, "type", reasoning ? "reasoning" : "message");
    cJSON_AddStringToObject(it, "status", status);
    if (!reasoning) cJSON_AddStringToObject(it, "role", "assistant");
    cJSON *parts = cJSON_AddArrayToObject(it, reasoning ? "summary" : "content");
    const ds4_buf *text = reasoning ? &e->reasoning : &e->content;
    if (with_text) cJSON_AddItemToArray(parts, resp_part(reasoning, text->data ? text->data : "", text->len));
    return it;
}

/* A custom (freeform) tool's input: the single string parameter the model
 * wrote (the mirror of how a replayed custom_tool_call is rendered), else
 * the arguments text. */
static char *custom_input(const call_t *c) {
    cJSON *a = cJSON_ParseWithLength(c->args.data ? c->args.data : "", c->args.len);
    char *r = NULL;
    if (cJSON_IsObject(a) && a->child && !a->child->next && cJSON_IsString(a->child))
        r = strdup(a->child->valuestring);
    cJSON_Delete(a);
    return r ? r : strdup(c->args.data ? c->args.data : "");
}

static bool is_custom(const ds4_enc *e, const call_t *c) {
    const ds4_tool_meta *m = call_meta(e, c);
    return m && m->kind == DS4_TOOL_CUSTOM;
}

static cJSON *resp_call_item(ds4_enc *e, const call_t *c, const char *status, bool with_args) {
    const ds4_tool_meta *m = call_meta(e, c);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "id", c->item_id);
    bool search = m && m->kind == DS4_TOOL_SEARCH, custom = is_custom(e, c);
    cJSON_AddStringToObject(it, "type", search ? "tool_search_call" : custom ? "custom_tool_call" : "function_call");
    cJSON_AddStringToObject(it, "status", status);
    if (search) {
        cJSON_AddStringToObject(it, "call_id", c->id);
        cJSON_AddStringToObject(it, "execution", "client");
        cJSON *a = with_args ? cJSON_ParseWithLength(c->args.data, c->args.len) : NULL;
        cJSON_AddItemToObject(it, "arguments", a ? a : cJSON_CreateObject());
        return it;
    }
    cJSON_AddStringToObject(it, "name", m ? m->short_name : c->name);
    if (m && m->ns) cJSON_AddStringToObject(it, "namespace", m->ns);
    cJSON_AddStringToObject(it, "call_id", c->id);
    if (custom) {
        char *in = with_args ? custom_input(c) : NULL;
        cJSON_AddStringToObject(it, "input", in ? in : "");
        free(in);
    } else {
        cJSON_AddStringToObject(it, "arguments", with_args && c->args.data ? c->args.data : "");
    }
    return it;
}

/* response.output_item.added / .done */
static void resp_item_event(ds4_enc *e, const char *type, int index, cJSON *item) {
    cJSON *o = resp_new(e, type);
    cJSON_AddNumberToObject(o, "output_index", index);
    cJSON_AddItemToObject(o, "item", item);
    resp_send(e, o);
}

/* An event of the open item's only text part: the reasoning summary or the
 * message's output text. */
static cJSON *resp_part_event(ds4_enc *e, bool reasoning, const char *type) {
    cJSON *o = resp_new(e, type);
    cJSON_AddStringToObject(o, "item_id", reasoning ? e->rs_id : e->msg_id);
    cJSON_AddNumberToObject(o, "output_index", e->open_index);
    cJSON_AddNumberToObject(o, reasoning ? "summary_index" : "content_index", 0);
    return o;
}

/* Closes the open reasoning or message item (stream and body alike). */
static void resp_close(ds4_enc *e, const char *status) {
    if (e->open == OPEN_NONE) return;
    bool r = e->open == OPEN_THINKING;
    const ds4_buf *text = r ? &e->reasoning : &e->content;
    const char *t = text->data ? text->data : "";
    cJSON *o = resp_part_event(e, r, r ? "response.reasoning_summary_text.done" : "response.output_text.done");
    cJSON_AddStringToObject(o, "text", t);
    if (!r) cJSON_AddArrayToObject(o, "logprobs");
    resp_send(e, o);
    o = resp_part_event(e, r, r ? "response.reasoning_summary_part.done" : "response.content_part.done");
    cJSON_AddItemToObject(o, "part", resp_part(r, t, text->len));
    resp_send(e, o);
    cJSON *item = resp_output_item(e, r, r ? (e->reasoning_closed ? "completed" : "incomplete") : status, true);
    cJSON_AddItemToArray(e->items, cJSON_Duplicate(item, 1));
    resp_item_event(e, "response.output_item.done", e->open_index, item);
    e->open = OPEN_NONE;
}

static void resp_open(ds4_enc *e, int kind) {
    if (e->open == kind) return;
    resp_close(e, "completed");
    bool r = kind == OPEN_THINKING;
    e->open = kind;
    e->open_index = e->out_index++;
    resp_item_event(e, "response.output_item.added", e->open_index,
                    resp_output_item(e, r, "in_progress", false));
    cJSON *o = resp_part_event(e, r, r ? "response.reasoning_summary_part.added" : "response.content_part.added");
    cJSON_AddItemToObject(o, "part", resp_part(r, "", 0));
    resp_send(e, o);
}

static void resp_delta(ds4_enc *e, bool reasoning, const char *s, size_t n) {
    cJSON *o = resp_part_event(e, reasoning, reasoning ? "response.reasoning_summary_text.delta" : "response.output_text.delta");
    add_strn(o, "delta", s, n);
    if (!reasoning) cJSON_AddArrayToObject(o, "logprobs");
    resp_send(e, o);
}

/* An event of the function/custom call item being streamed. */
static cJSON *resp_call_event(ds4_enc *e, const call_t *c, const char *type) {
    cJSON *o = resp_new(e, type);
    cJSON_AddStringToObject(o, "item_id", c->item_id);
    cJSON_AddNumberToObject(o, "output_index", e->out_index);
    return o;
}

/* ---- DSML events ---------------------------------------------------- */

static int find_meta(const ds4_request *r, const char *name) {
    for (int i = 0; i < r->n_tools; i++)
        if (!strcmp(r->tool_meta[i].name, name)) return i;
    return -1;
}

/* ---- per-family stream events -------------------------------------
 * What each API family sends while generating, one table per family
 * (FAMILIES, at the end); on_event() keeps the family-independent record
 * (reasoning, content, calls) and calls the table only when streaming. */

struct family_ops {
    const char *id_prefix;          /* response id */
    const char *call_id_prefix;     /* tool-call ids */
    void (*reasoning)(ds4_enc *e, const char *s, size_t n);
    void (*content)(ds4_enc *e, const char *s, size_t n);
    void (*call_start)(ds4_enc *e, int index, const call_t *c);
    void (*call_args)(ds4_enc *e, int index, const call_t *c, const char *s, size_t n);
    void (*call_end)(ds4_enc *e, const call_t *c);
    /* opening events, once the token counts are known (u may be NULL for a
     * keep-alive before them) */
    void (*begin)(ds4_enc *e, const ds4_usage *u);
    void (*keepalive)(ds4_enc *e);
    /* f: 0 EOS, 1 stop string, 2 tool calls, 3 length */
    void (*finish)(ds4_enc *e, int f, const ds4_usage *u);
    void (*fail)(ds4_enc *e, const char *message, const char *code);
};

static void chat_reasoning(ds4_enc *e, const char *s, size_t n) {
    chat_delta_text(e, "reasoning_content", s, n);
}

static void chat_content(ds4_enc *e, const char *s, size_t n) {
    chat_delta_text(e, "content", s, n);
}

static void chat_call_start(ds4_enc *e, int index, const call_t *c) {
    (void)c;
    chat_delta_call(e, index, true, "", 0);
}

static void chat_call_args(ds4_enc *e, int index, const call_t *c, const char *s, size_t n) {
    (void)c;
    chat_delta_call(e, index, false, s, n);
}

static void chat_call_end(ds4_enc *e, const call_t *c) {
    (void)e; (void)c;   /* arguments are complete with their last delta */
}

static void anth_reasoning(ds4_enc *e, const char *s, size_t n) {
    anth_open(e, OPEN_THINKING, NULL);
    anth_delta(e, "thinking_delta", "thinking", s, n);
}

static void anth_content(ds4_enc *e, const char *s, size_t n) {
    anth_open(e, OPEN_TEXT, NULL);
    anth_delta(e, "text_delta", "text", s, n);
}

static void anth_call_start(ds4_enc *e, int index, const call_t *c) {
    (void)index;
    anth_open(e, OPEN_TOOL, c);
}

static void anth_call_args(ds4_enc *e, int index, const call_t *c, const char *s, size_t n) {
    (void)index; (void)c;
    anth_delta(e, "input_json_delta", "partial_json", s, n);
}

static void anth_call_end(ds4_enc *e, const call_t *c) {
    (void)c;
    anth_close(e);
}

static void resp_reasoning(ds4_enc *e, const char *s, size_t n) {
    if (!e->r->expose_reasoning) return;
    resp_open(e, OPEN_THINKING);
    resp_delta(e, true, s, n);
}

static void resp_content(ds4_enc *e, const char *s, size_t n) {
    resp_open(e, OPEN_TEXT);
    resp_delta(e, false, s, n);
}

static void resp_call_start(ds4_enc *e, int index, const call_t *c) {
    (void)index;
    resp_close(e, "completed");
    resp_item_event(e, "response.output_item.added", e->out_index, resp_call_item(e, c, "in_progress", false));
}

static void resp_call_args(ds4_enc *e, int index, const call_t *c, const char *s, size_t n) {
    (void)index;
    if (is_custom(e, c)) return;   /* custom input is only known at the end */
    cJSON *o = resp_call_event(e, c, "response.function_call_arguments.delta");
    add_strn(o, "delta", s, n);
    resp_send(e, o);
}

static void resp_call_end(ds4_enc *e, const call_t *c) {
    if (is_custom(e, c)) {
        char *in = custom_input(c);
        const char *kinds[2] = {"response.custom_tool_call_input.delta", "response.custom_tool_call_input.done"};
        for (int k = 0; k < 2; k++) {
            cJSON *o = resp_call_event(e, c, kinds[k]);
            cJSON_AddStringToObject(o, k ? "input" : "delta", in ? in : "");
            resp_send(e, o);
        }
        free(in);
    } else {
        cJSON *o = resp_call_event(e, c, "response.function_call_arguments.done");
        cJSON_AddStringToObject(o, "name", c->name);
        cJSON_AddStringToObject(o, "arguments", c->args.data ? c->args.data : "");
        resp_send(e, o);
    }
    cJSON *item = resp_call_item(e, c, "completed", true);
    cJSON_AddItemToArray(e->items, cJSON_Duplicate(item, 1));
    resp_item_event(e, "response.output_item.done", e->out_index++, item);
}

static void on_event(void *ud, const ds4_dsml_event *ev) {
    ds4_enc *e = ud;
    const family_ops *f = e->ops;
    switch (ev->kind) {
    case DS4_DSML_EV_REASONING:
        ds4_buf_put(&e->reasoning, ev->text, ev->len);
        if (e->stream) f->reasoning(e, ev->text, ev->len);
        break;
    case DS4_DSML_EV_REASONING_END:
        e->reasoning_closed = true;
        break;
    case DS4_DSML_EV_CONTENT:
        ds4_buf_put(&e->content, ev->text, ev->len);
        if (e->stream) f->content(e, ev->text, ev->len);
        break;
    case DS4_DSML_EV_CALL_START: {
        call_t *nc = realloc(e->calls, sizeof *nc * (size_t)(e->n_calls + 1));
        if (!nc) { e->broken = true; break; }
        e->calls = nc;
        call_t *c = &e->calls[e->n_calls];
        memset(c, 0, sizeof *c);
        c->name = strdup(ev->name ? ev->name : "");
        c->meta = find_meta(e->r, c->name);
        const char *taken[64];
        int nt = 0;
        for (int i = 0; i < e->n_calls && nt < 64; i++) taken[nt++] = e->calls[i].id;
        ds4_toolmem_new_id(e->o.mem, f->call_id_prefix, taken, nt, c->id);
        char hex[25];
        ds4_random_hex(hex, 12);
        snprintf(c->item_id, sizeof c->item_id, "fc_%s", hex);
        int idx = e->n_calls++;
        if (e->stream) f->call_start(e, idx, c);
        break;
    }
    case DS4_DSML_EV_ARGS: {
        if (!e->n_calls) break;
        call_t *c = &e->calls[e->n_calls - 1];
        ds4_buf_put(&c->args, ev->text, ev->len);
        if (e->stream) f->call_args(e, e->n_calls - 1, c, ev->text, ev->len);
        break;
    }
    case DS4_DSML_EV_CALL_END: {
        if (!e->n_calls) break;
        call_t *c = &e->calls[e->n_calls - 1];
        ds4_buf_clear(&c->args);
        ds4_buf_put(&c->args, ev->text, ev->len);
        c->valid = ev->args_valid;
        if (e->stream) f->call_end(e, c);
        break;
    }
    case DS4_DSML_EV_BLOCK_END:
        free(e->block);
        e->block = malloc(ev->len + 1);
        if (e->block) { memcpy(e->block, ev->text, ev->len); e->block[ev->len] = 0; e->block_len = ev->len; }
        break;
    case DS4_DSML_EV_ERROR:
        if (!e->error) {
            e->error = strdup(ev->message ? ev->message : "malformed tool call");
            e->error_raw = malloc(ev->len + 1);
            if (e->error_raw) { memcpy(e->error_raw, ev->text, ev->len); e->error_raw[ev->len] = 0; }
        }
        break;
    default:
        break;
    }
}

/* ---- the tool-call parser of the request's chat format ------------- */

static void parser_feed(ds4_enc *e, const char *s, size_t n) { e->parser->feed(e->p, s, n); }
static void parser_finish(ds4_enc *e) { e->parser->finish(e->p); }
static bool parser_done(const ds4_enc *e) { return e->parser->done(e->p); }
static bool parser_in_reasoning(const ds4_enc *e) { return e->parser->in_reasoning(e->p); }
static bool parser_in_calls(const ds4_enc *e) { return e->parser->in_calls(e->p); }

/* ---- lifecycle ------------------------------------------------------ */

ds4_enc *ds4_enc_new(const ds4_enc_opts *o) {
    ds4_enc *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->o = *o;
    e->r = o->req;
    e->ops = family_of(o->req->api);
    if (!e->ops) { free(e); return NULL; }
    e->stream = o->req->stream && o->out;
    ds4_tool_parser_opts po = {.thinking = o->thinking, .tools = o->req->n_tools > 0, .defs = o->req->tools,
                               .n_defs = o->req->n_tools};
    e->parser = ds4_request_chat(o->req)->parser;
    e->p = e->parser->create(&po, on_event, e);
    if (!e->p) { free(e); return NULL; }
    ds4_stopper_init(&e->st, o->req->stop, o->req->n_stop);
    char hex[25];
    ds4_random_hex(hex, 12);
    snprintf(e->id, sizeof e->id, "%s%s", e->ops->id_prefix, hex);
    ds4_random_hex(hex, 12);
    snprintf(e->rs_id, sizeof e->rs_id, "rs_%s", hex);
    ds4_random_hex(hex, 12);
    snprintf(e->msg_id, sizeof e->msg_id, "msg_%s", hex);
    e->created = (long long)time(NULL);
    e->items = cJSON_CreateArray();
    if (e->r->api == DS4_API_CHAT && e->r->logprobs >= 0) {
        if (e->stream) e->lp_pending = cJSON_CreateArray();
        else e->lp_all = cJSON_CreateArray();
    }
    return e;
}

void ds4_enc_free(ds4_enc *e) {
    if (!e) return;
    e->parser->free(e->p);
    ds4_stopper_free(&e->st);
    for (int i = 0; i < e->n_calls; i++) { free(e->calls[i].name); ds4_buf_free(&e->calls[i].args); }
    free(e->calls);
    ds4_buf_free(&e->reasoning);
    ds4_buf_free(&e->content);
    ds4_buf_free(&e->body);
    free(e->block);
    free(e->error);
    free(e->error_raw);
    cJSON_Delete(e->items);
    cJSON_Delete(e->lp_pending);
    cJSON_Delete(e->lp_all);
    free(e);
}

/* Chat's role chunk and Responses' created + in_progress need no token
 * counts; Messages' message_start carries them. */
static void chat_begin(ds4_enc *e, const ds4_usage *u) {
    (void)u;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddStringToObject(d, "content", "");
    send_json(e, NULL, chat_chunk(e, d, NULL));
}

static void anth_begin(ds4_enc *e, const ds4_usage *u) {
    cJSON *o = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(o, "message");
    cJSON_AddStringToObject(m, "id", e->id);
    cJSON_AddStringToObject(m, "type", "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "model", e->r->model);
    cJSON_AddArrayToObject(m, "content");
    cJSON_AddNullToObject(m, "stop_reason");
    cJSON_AddNullToObject(m, "stop_sequence");
    cJSON_AddItemToObject(m, "usage", anth_usage(u, true));
    anth_event(e, "message_start", o);
}

static void resp_begin(ds4_enc *e, const ds4_usage *u) {
    (void)u;
    resp_wrap(e, "response.created", resp_object(e, "in_progress", NULL, NULL, NULL));
    resp_wrap(e, "response.in_progress", resp_object(e, "in_progress", NULL, NULL, NULL));
}

void ds4_enc_begin(ds4_enc *e, const ds4_usage *u) {
    if (!e->stream || e->began) return;
    e->began = true;
    e->ops->begin(e, u);
}

/* The family no-op events reset clients that only count parsed events
 * (Codex, Claude Code). Chat's and Responses' opening events need no token
 * counts, so a keep-alive before begin sends them. */
static void chat_keepalive(ds4_enc *e) {
    ds4_enc_begin(e, NULL);
}

static void anth_keepalive(ds4_enc *e) {
    anth_event(e, "ping", NULL);
}

static void resp_keepalive(ds4_enc *e) {
    if (!e->began) ds4_enc_begin(e, NULL);
    else resp_wrap(e, "response.in_progress", resp_object(e, "in_progress", NULL, NULL, NULL));
}

void ds4_enc_keepalive(ds4_enc *e) {
    if (e->stream) e->ops->keepalive(e);
}

bool ds4_enc_feed(ds4_enc *e, const char *s, size_t n) {
    const char *span;
    size_t k = ds4_stopper_push(&e->st, s, n, &span);
    if (k) parser_feed(e, span, k);
    return e->st.matched >= 0 || parser_done(e);
}

bool ds4_enc_in_structure(const ds4_enc *e) {
    return e->parser->in_structure(e->p);
}

bool ds4_enc_in_reasoning(const ds4_enc *e) {
    return parser_in_reasoning(e);
}

bool ds4_enc_wants_logprobs(const ds4_enc *e) {
    return e->lp_pending || e->lp_all;
}

bool ds4_enc_in_content(const ds4_enc *e) {
    return !parser_in_reasoning(e) && !parser_in_calls(e);
}

void ds4_enc_logprob(ds4_enc *e, cJSON *entry) {
    cJSON *a = e->lp_pending ? e->lp_pending : e->lp_all;
    if (a) cJSON_AddItemToArray(a, entry);
    else cJSON_Delete(entry);
}

bool ds4_enc_broken(const ds4_enc *e) {
    return e->broken;
}

const char *ds4_enc_block(const ds4_enc *e, size_t *len) {
    *len = e->block_len;
    return e->error ? NULL : e->block;
}

int ds4_enc_call_ids(const ds4_enc *e, const char **ids, int max) {
    for (int i = 0; i < e->n_calls && i < max; i++) ids[i] = e->calls[i].id;
    return e->n_calls;
}

const char *ds4_enc_error(const ds4_enc *e) {
    return e->error;
}

const char *ds4_enc_content(const ds4_enc *e, size_t *len) {
    *len = e->content.len;
    return e->content.data ? e->content.data : "";
}

bool ds4_enc_reasoning_closed(const ds4_enc *e) {
    return e->reasoning_closed;
}

bool ds4_enc_stop_matched(const ds4_enc *e) {
    return e->st.matched >= 0;
}

const char *ds4_enc_body(const ds4_enc *e, size_t *len) {
    *len = e->body.len;
    return e->body.data;
}

static void set_body(ds4_enc *e, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    ds4_buf_clear(&e->body);
    if (s) ds4_buf_puts(&e->body, s);
    free(s);
}

static const char *chat_finish(int f) {
    return f == 2 ? "tool_calls" : f == 3 ? "length" : "stop";
}

static cJSON *chat_usage(const ds4_usage *u) {
    cJSON *o = cJSON_CreateObject(), *d;
    cJSON_AddNumberToObject(o, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(o, "total_tokens", u->prompt_tokens + u->completion_tokens);
    d = cJSON_AddObjectToObject(o, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", u->cached_tokens);
    cJSON_AddNumberToObject(d, "cache_write_tokens", u->prompt_tokens - u->cached_tokens);
    return o;
}

static void finish_chat(ds4_enc *e, int f, const ds4_usage *u) {
    if (e->stream) {
        send_json(e, NULL, chat_chunk(e, cJSON_CreateObject(), chat_finish(f)));
        if (e->r->include_usage) {
            cJSON *o = chat_chunk(e, NULL, NULL);
            cJSON_AddItemToObject(o, "usage", chat_usage(u));
            send_json(e, NULL, o);
        }
        write_raw(e, "data: [DONE]\n\n", 14);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", e->id);
    cJSON_AddStringToObject(o, "object", "chat.completion");
    cJSON_AddNumberToObject(o, "created", (double)e->created);
    cJSON_AddStringToObject(o, "model", e->r->model);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    cJSON *m = cJSON_AddObjectToObject(c, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", e->content.data ? e->content.data : "");
    if (e->reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", e->reasoning.data);
    if (e->n_calls) {
        cJSON *tc = cJSON_AddArrayToObject(m, "tool_calls");
        for (int i = 0; i < e->n_calls; i++) {
            cJSON *t = chat_call_json(&e->calls[i], i, true, e->calls[i].args.data ? e->calls[i].args.data : "{}", e->calls[i].args.len);
            cJSON_DeleteItemFromObject(t, "index");
            cJSON_AddItemToArray(tc, t);
        }
    }
    if (e->lp_all) {
        cJSON *lp = cJSON_AddObjectToObject(c, "logprobs");
        cJSON_AddItemToObject(lp, "content", e->lp_all);
        e->lp_all = NULL;
    } else {
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", chat_finish(f));
    cJSON_AddItemToObject(o, "usage", chat_usage(u));
    set_body(e, o);
}

static void finish_messages(ds4_enc *e, int f, const ds4_usage *u) {
    const char *reason = f == 2 ? "tool_use" : f == 3 ? "max_tokens" : f == 1 ? "stop_sequence" : "end_turn";
    const char *seq = f == 1 ? e->r->stop[e->st.matched] : NULL;
    if (e->stream) {
        anth_close(e);
        if (!e->any_visible) { anth_open(e, OPEN_TEXT, NULL); anth_close(e); }
        cJSON *o = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(o, "delta");
        cJSON_AddStringToObject(d, "stop_reason", reason);
        if (seq) cJSON_AddStringToObject(d, "stop_sequence", seq); else cJSON_AddNullToObject(d, "stop_sequence");
        cJSON_AddItemToObject(o, "usage", anth_usage(u, true));
        anth_event(e, "message_delta", o);
        anth_event(e, "message_stop", NULL);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", e->id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", e->r->model);
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    bool visible = false;
    if (e->reasoning.len) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", e->reasoning.data);
        cJSON_AddStringToObject(b, "signature", e->id);
        cJSON_AddItemToArray(content, b);
    }
    if (e->content.len) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", e->content.data);
        cJSON_AddItemToArray(content, b);
        visible = true;
    }
    for (int i = 0; i < e->n_calls; i++) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddStringToObject(b, "id", e->calls[i].id);
        cJSON_AddStringToObject(b, "name", e->calls[i].name);
        cJSON *in = e->calls[i].valid ? cJSON_ParseWithLength(e->calls[i].args.data, e->calls[i].args.len) : NULL;
        cJSON_AddItemToObject(b, "input", cJSON_IsObject(in) ? in : (cJSON_Delete(in), cJSON_CreateObject()));
        cJSON_AddItemToArray(content, b);
        visible = true;
    }
    if (!visible) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", "");
        cJSON_AddItemToArray(content, b);
    }
    cJSON_AddStringToObject(o, "stop_reason", reason);
    if (seq) cJSON_AddStringToObject(o, "stop_sequence", seq); else cJSON_AddNullToObject(o, "stop_sequence");
    cJSON_AddItemToObject(o, "usage", anth_usage(u, true));
    set_body(e, o);
}

static void finish_responses(ds4_enc *e, int f, const ds4_usage *u) {
    const char *item_status = f == 3 ? "incomplete" : "completed";
    if (!e->stream) {
        /* Build the same items the stream would have produced. */
        if (e->r->expose_reasoning && e->reasoning.len)
            cJSON_AddItemToArray(e->items, resp_output_item(e, true, e->reasoning_closed ? "completed" : "incomplete", true));
        if (e->content.len) cJSON_AddItemToArray(e->items, resp_output_item(e, false, item_status, true));
    } else {
        resp_close(e, item_status);
    }
    for (int i = 0; i < e->n_calls && !e->stream; i++)
        cJSON_AddItemToArray(e->items, resp_call_item(e, &e->calls[i], "completed", true));
    cJSON *resp = resp_object(e, f == 3 ? "incomplete" : "completed", u, NULL, NULL);
    if (e->stream) resp_wrap(e, f == 3 ? "response.incomplete" : "response.completed", resp);
    else set_body(e, resp);
}

void ds4_enc_finish(ds4_enc *e, ds4_cause cause, const ds4_usage *u) {
    const char *span;
    size_t k = ds4_stopper_flush(&e->st, &span);
    if (k) parser_feed(e, span, k);
    parser_finish(e);
    /* finish codes: 0 EOS, 1 stop string, 2 tool calls, 3 length */
    int f = cause == DS4_CAUSE_LENGTH ? 3 : 0;
    if (e->st.matched >= 0) f = 1;
    if (e->error) {
        if (e->stream) {
            char msg[300];
            snprintf(msg, sizeof msg, "malformed tool call: %s", e->error);
            ds4_enc_fail(e, msg, "server_error");
            return;
        }
        /* Nothing is half-sent yet: the raw text becomes plain content. */
        ds4_buf_clear(&e->reasoning);
        ds4_buf_clear(&e->content);
        if (e->error_raw) ds4_buf_puts(&e->content, e->error_raw);
        for (int i = 0; i < e->n_calls; i++) { free(e->calls[i].name); ds4_buf_free(&e->calls[i].args); }
        e->n_calls = 0;
    } else if (e->n_calls) {
        f = 2;
    }
    e->ops->finish(e, f, u);
}

static void chat_fail(ds4_enc *e, const char *message, const char *code) {
    cJSON *o = cJSON_CreateObject(), *er = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(er, "message", message);
    cJSON_AddStringToObject(er, "type", "server_error");
    cJSON_AddNullToObject(er, "param");
    if (code && strcmp(code, "server_error")) cJSON_AddStringToObject(er, "code", code);
    else cJSON_AddNullToObject(er, "code");
    send_json(e, NULL, o);
    write_raw(e, "data: [DONE]\n\n", 14);
}

static void anth_fail(ds4_enc *e, const char *message, const char *code) {
    (void)code;
    cJSON *o = cJSON_CreateObject(), *er = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(er, "type", "api_error");
    cJSON_AddStringToObject(er, "message", message);
    anth_event(e, "error", o);
}

static void resp_fail(ds4_enc *e, const char *message, const char *code) {
    resp_wrap(e, "response.failed", resp_object(e, "failed", NULL, code ? code : "server_error", message));
}

void ds4_enc_fail(ds4_enc *e, const char *message, const char *code) {
    if (e->stream) e->ops->fail(e, message, code);
}

static const family_ops FAMILIES[] = {
    [DS4_API_CHAT] = {"chatcmpl-", "call_", chat_reasoning, chat_content, chat_call_start, chat_call_args,
                      chat_call_end, chat_begin, chat_keepalive, finish_chat, chat_fail},
    [DS4_API_MESSAGES] = {"msg_", "toolu_", anth_reasoning, anth_content, anth_call_start, anth_call_args,
                          anth_call_end, anth_begin, anth_keepalive, finish_messages, anth_fail},
    [DS4_API_RESPONSES] = {"resp_", "call_", resp_reasoning, resp_content, resp_call_start, resp_call_args,
                           resp_call_end, resp_begin, resp_keepalive, finish_responses, resp_fail},
};

static const family_ops *family_of(ds4_api api) {
    return (size_t)api < sizeof FAMILIES / sizeof FAMILIES[0] && FAMILIES[api].id_prefix ? &FAMILIES[api] : NULL;
}
