#include "server/routes.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/access.h"
#include "models/chat_spec.h"
#include "server/metrics.h"
#include "server/prefix.h"
#include "server/respond.h"
#include "server/server_state.h"

/* The ids /v1/models lists for the served model, and their display names. */
static const ds4_model_id *served_models(const server *s, size_t *n) {
    *n = (size_t)ds4_srv_chat(s)->n_models;
    return ds4_srv_chat(s)->models;
}

static cJSON *model_obj(server *s, const ds4_model_id *mid) {
    const char *id = mid->id;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddStringToObject(m, "type", "model");
    cJSON_AddNumberToObject(m, "created", 1767225600);
    cJSON_AddStringToObject(m, "created_at", "2026-01-01T00:00:00Z");
    cJSON_AddStringToObject(m, "owned_by", "ds4");
    cJSON_AddStringToObject(m, "display_name", mid->display);
    cJSON_AddNumberToObject(m, "context_length", s->o.ctx);
    cJSON_AddNumberToObject(m, "max_input_tokens", s->o.ctx);
    int mt = s->o.default_max_tokens < s->o.ctx ? s->o.default_max_tokens : s->o.ctx;
    cJSON_AddNumberToObject(m, "max_tokens", mt);
    cJSON *tp = cJSON_AddObjectToObject(m, "top_provider");
    cJSON_AddNumberToObject(tp, "context_length", s->o.ctx);
    cJSON_AddNumberToObject(tp, "max_completion_tokens", mt);
    cJSON_AddBoolToObject(tp, "is_moderated", false);
    return m;
}

static void route_models(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    size_t n;
    const ds4_model_id *ids = served_models(s, &n);
    if (!strcmp(hr->path, "/v1/models")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON *d = cJSON_AddArrayToObject(o, "data");
        for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(d, model_obj(s, &ids[i]));
        cJSON_AddBoolToObject(o, "has_more", false);
        cJSON_AddStringToObject(o, "first_id", ids[0].id);
        cJSON_AddStringToObject(o, "last_id", ids[n - 1].id);
        ds4_send_json(s, c, hr, 200, o, ka, NULL);
        return;
    }
    const char *id = hr->path + strlen("/v1/models/");
    for (size_t i = 0; i < n; i++)
        if (!strcmp(id, ids[i].id)) { ds4_send_json(s, c, hr, 200, model_obj(s, &ids[i]), ka, NULL); return; }
    char msg[200];
    snprintf(msg, sizeof msg, "The model '%.100s' does not exist or you do not have access to it.", id);
    ds4_send_error(s, c, hr, 404, msg, "model", "model_not_found", 0, ka);
}

/* Request bodies parsed (and, for count_tokens, tokenized) at once on
 * connection threads: that work costs memory and CPU in proportion to the
 * body, and nothing else bounds how many clients send a large one. */
#define MAX_PARALLEL_PARSES 4

static pthread_mutex_t g_parse_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_parse_cv = PTHREAD_COND_INITIALIZER;
static int g_parsing;

static void parse_slot_take(void) {
    pthread_mutex_lock(&g_parse_mu);
    while (g_parsing >= MAX_PARALLEL_PARSES) pthread_cond_wait(&g_parse_cv, &g_parse_mu);
    g_parsing++;
    pthread_mutex_unlock(&g_parse_mu);
}

static void parse_slot_give(void) {
    pthread_mutex_lock(&g_parse_mu);
    g_parsing--;
    pthread_cond_signal(&g_parse_cv);
    pthread_mutex_unlock(&g_parse_mu);
}

/* A request whose client text alone needs more tokens than the context
 * (no token is longer than max_token_bytes) is refused before it is
 * rendered, queued or tokenized: a generation request, and a count_tokens
 * one, whose tokenizing would otherwise cost CPU and memory in proportion to
 * the body for a prompt no request could run. */
static bool refuse_oversized(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_request *r, bool ka) {
    int max_ids;
    size_t at_least = ds4_request_text_bytes(r, &max_ids) / s->max_token_bytes;
    if ((size_t)max_ids > at_least) at_least = (size_t)max_ids;
    if (at_least < (size_t)s->o.ctx) return false;
    ds4_srv_trace(s, "request refused before tokenizing: at least %zu tokens, context %d", at_least, s->o.ctx);
    char msg[300];
    const char *param = r->api == DS4_API_CHAT ? "messages" : r->api == DS4_API_COMPLETIONS ? "prompt" : "input";
    const bool anthropic = r->api == DS4_API_MESSAGES || r->api == DS4_API_COUNT_TOKENS;
    if (anthropic)
        snprintf(msg, sizeof msg, "prompt is too long: at least %zu tokens > %d maximum", at_least, s->o.ctx - 1);
    else
        snprintf(msg, sizeof msg, "This model's maximum context length is %d tokens. However, your request has at "
                 "least %zu prompt tokens (the request exceeds the available context size).", s->o.ctx, at_least);
    ds4_send_error(s, c, hr, 400, msg, anthropic ? NULL : param, anthropic ? NULL : "context_length_exceeded", 0, ka);
    return true;
}

static void route_count_tokens(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    ds4_request r;
    ds4_req_error e;
    parse_slot_take();
    if (ds4_request_decode_for(DS4_API_COUNT_TOKENS, ds4_srv_chat(s), body->data ? body->data : "", body->len, &r, &e)) {
        parse_slot_give();
        ds4_send_error(s, c, hr, e.status, e.message, e.param, e.code, 0, ka);
        return;
    }
    if (refuse_oversized(s, c, hr, &r, ka)) {
        parse_slot_give();
        ds4_request_free(&r);
        return;
    }
    srv_prompt prompt = {0};
    char err[256] = "out of memory";
    ds4_token_ids ids = {0};
    bool ok = ds4_srv_render_prompt(s, &r, false, &prompt, err, sizeof err) && !ds4_srv_encode(s, &prompt, 0, &ids);
    parse_slot_give();
    if (!ok) {
        ds4_send_error(s, c, hr, 400, err, NULL, NULL, 0, ka);
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "input_tokens", (double)ids.n);
        ds4_send_json(s, c, hr, 200, o, ka, NULL);
    }
    ds4_token_ids_free(&ids);
    ds4_srv_prompt_free(&prompt);
    ds4_request_free(&r);
}

static void route_tokenizer_info(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "eos_token", ds4_srv_chat(s)->eos_token);
    cJSON_AddStringToObject(o, "bos_token", ds4_srv_chat(s)->bos_token);
    ds4_send_json(s, c, hr, 200, o, ka, NULL);
}

/* The body of /tokenize or /detokenize as a JSON object; NULL after
 * answering 400. */
static cJSON *tokenizer_body(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    ds4_req_error e;
    cJSON *in = ds4_json_body_parse(body->data ? body->data : "", body->len, &e);
    if (in && cJSON_IsObject(in)) return in;
    cJSON_Delete(in);
    ds4_send_error(s, c, hr, 400, in ? "request body must be a JSON object" : e.message, NULL, NULL, 0, ka);
    return NULL;
}

static void route_tokenize(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    cJSON *in = tokenizer_body(s, c, hr, body, ka);
    if (!in) return;
    cJSON *p = cJSON_GetObjectItem(in, "prompt");
    if (!p) p = cJSON_GetObjectItem(in, "content");
    cJSON *asp = cJSON_GetObjectItem(in, "add_special_tokens");
    if (!cJSON_IsString(p) || (asp && !cJSON_IsBool(asp))) {
        cJSON_Delete(in);
        ds4_send_error(s, c, hr, 400, p && cJSON_IsString(p) ? "add_special_tokens must be a boolean"
                       : "prompt must be a string", p && cJSON_IsString(p) ? "add_special_tokens" : "prompt",
                       NULL, 0, ka);
        return;
    }
    /* As HF tokenizers do: added tokens are always matched (clients such
     * as lm-eval find BOS/EOS ids by tokenizing their strings), and
     * add_special_tokens only decides whether the format's prefix is
     * prepended (chat_spec.h add_special_prefix; none for some formats). */
    ds4_token_ids ids = {0};
    int rc = 0;
    const char *prefix = ds4_srv_chat(s)->add_special_prefix;
    if (cJSON_IsTrue(asp) && prefix)
        rc = ds4_tokenizer_encode(s->tok, prefix, strlen(prefix), DS4_TOK_SPECIALS_ALL, &ids);
    if (!rc) rc = ds4_tokenizer_encode(s->tok, p->valuestring, strlen(p->valuestring), DS4_TOK_SPECIALS_ALL, &ids);
    cJSON_Delete(in);
    if (rc) {
        ds4_token_ids_free(&ids);
        ds4_send_error(s, c, hr, 500, "tokenization failed", NULL, NULL, 0, ka);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *a = cJSON_AddArrayToObject(o, "tokens");
    for (size_t i = 0; i < ids.n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids.v[i]));
    ds4_token_ids_free(&ids);
    ds4_send_json(s, c, hr, 200, o, ka, NULL);
}

static void route_detokenize(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    cJSON *in = tokenizer_body(s, c, hr, body, ka);
    if (!in) return;
    cJSON *t = cJSON_GetObjectItem(in, "tokens");
    int n = cJSON_IsArray(t) ? cJSON_GetArraySize(t) : -1;
    int32_t *ids = n >= 0 ? malloc(sizeof *ids * (size_t)(n + 1)) : NULL;
    if (n >= 0 && !ids) {
        cJSON_Delete(in);
        ds4_send_error(s, c, hr, 500, "out of memory", NULL, NULL, 0, ka);
        return;
    }
    char msg[160] = "tokens must be an array of token ids";
    int k = 0;
    bool ok = ids != NULL;
    for (cJSON *x = ok ? t->child : NULL; x && ok; x = x->next) {
        /* Checked before the conversion: a double outside int32 is undefined
         * behaviour to convert. */
        double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
        ok = v >= 0 && v < s->n_vocab && v == floor(v);
        if (ok) ids[k++] = (int32_t)v;
        else snprintf(msg, sizeof msg, "tokens[%d] is not a token id in [0, %d)", k, s->n_vocab);
    }
    cJSON_Delete(in);
    if (!ok) {
        free(ids);
        ds4_send_error(s, c, hr, 400, msg, "tokens", NULL, 0, ka);
        return;
    }
    size_t len = 0;
    char *text = ds4_tokenizer_decode(s->tok, ids, (size_t)k, true, &len);
    free(ids);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "prompt", text ? text : "");
    free(text);
    ds4_send_json(s, c, hr, 200, o, ka, NULL);
}

/* Decodes an inference request and waits for the worker to run it. */
static bool route_inference(server *s, ds4_http_conn *c, ds4_http_req *hr, const ds4_buf *body, ds4_api api) {
    bool ka = hr->keep_alive;
    job j = {.conn = c, .hreq = hr};
    ds4_req_error e;
    parse_slot_take();
    int rc = ds4_request_decode_for(api, ds4_srv_chat(s), body->data ? body->data : "", body->len, &j.req, &e);
    parse_slot_give();
    if (rc) {
        ds4_send_error(s, c, hr, e.status, e.message, e.param, e.code, 0, ka);
        return ka;
    }
    if (refuse_oversized(s, c, hr, &j.req, ka)) {
        ds4_request_free(&j.req);
        return ka;
    }
    if (!ds4_queue_submit(s, &j)) {
        ds4_request_free(&j.req);
        ds4_send_error(s, c, hr, 503, "server shutting down", NULL, NULL, 0, false);
        return false;
    }
    ds4_enc_free(j.enc);
    ds4_request_free(&j.req);
    return j.keep_alive && !c->broken && !c->close_after;
}

static void route_metrics(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    ds4_metrics_gauges g = {.kv_bytes = 0};
    ds4_queue_slots(s, &g.slots, &g.slots_busy, &g.queued);
    g.kv_bytes = (uint64_t)g.slots * ds4_engine_kv_bytes(s->eng, s->o.ctx);
    ds4_queue_sessions_held(s, &g.kv_tokens, &g.kv_state_bytes);
    ds4_kvdisk_stats kvd;
    if (s->kvd) {
        ds4_kvdisk_get_stats(s->kvd, &kvd);
        g.kv_disk = &kvd;
    }
    ds4_buf text = {0};
    ds4_metrics_render(&text, &g);
    char hdr[1024];
    ds4_cors_headers(s, hr, hdr, sizeof hdr);
    ds4_http_respond(c, 200, "text/plain; version=0.0.4", text.data ? text.data : "", text.len, ka, hdr);
    ds4_buf_free(&text);
}

static void route_health(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    cJSON *o = cJSON_CreateObject();
    int n_slots, busy, queued;
    ds4_queue_slots(s, &n_slots, &busy, &queued);
    cJSON_AddStringToObject(o, "status", "ok");
    cJSON_AddNumberToObject(o, "slots", n_slots);
    cJSON_AddNumberToObject(o, "slots_busy", busy);
    cJSON_AddNumberToObject(o, "slots_free", n_slots - busy);
    cJSON_AddNumberToObject(o, "queued", queued);
    ds4_send_json(s, c, hr, 200, o, ka, NULL);
}

/* Every path the server answers, with its one method: a GET route answers
 * HEAD too (the same head, no body: http.h), so a client may probe an
 * endpoint the way HTTP allows. A route without a handler is an inference
 * API, decoded and queued. */
typedef void route_fn(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka);
static const struct route {
    const char *path;
    bool prefix; /* path + anything (a model id) */
    bool post;   /* POST, else GET and HEAD */
    route_fn *fn;
    ds4_api api; /* for fn == NULL */
} ROUTES[] = {
    {"/v1/models", false, false, route_models, 0},
    {"/v1/models/", true, false, route_models, 0},
    {"/metrics", false, false, route_metrics, 0},
    {"/health", false, false, route_health, 0},
    {"/tokenizer_info", false, false, route_tokenizer_info, 0},
    {"/tokenize", false, true, route_tokenize, 0},
    {"/detokenize", false, true, route_detokenize, 0},
    {"/v1/messages/count_tokens", false, true, route_count_tokens, 0},
    {"/v1/chat/completions", false, true, NULL, DS4_API_CHAT},
    {"/v1/completions", false, true, NULL, DS4_API_COMPLETIONS},
    {"/v1/responses", false, true, NULL, DS4_API_RESPONSES},
    {"/v1/messages", false, true, NULL, DS4_API_MESSAGES},
};

static const struct route *find_route(const char *path) {
    for (size_t i = 0; i < sizeof ROUTES / sizeof *ROUTES; i++) {
        const struct route *r = &ROUTES[i];
        if (r->prefix ? !strncmp(path, r->path, strlen(r->path)) : !strcmp(path, r->path)) return r;
    }
    return NULL;
}

static bool dispatch(server *s, ds4_http_conn *c, ds4_http_req *hr, ds4_buf *body) {
    bool ka = hr->keep_alive;
    const char *m = hr->method, *denied, *code;
    int status = ds4_access_check(&s->o, hr, &denied, &code);
    if (status) {
        ds4_send_error(s, c, hr, status, denied, NULL, code, 0, ka);
        return ka;
    }
    if (!strcmp(m, "OPTIONS")) {
        char hdr[1024];
        ds4_cors_headers(s, hr, hdr, sizeof hdr);
        ds4_http_respond(c, 204, NULL, NULL, 0, ka, hdr);
        return ka;
    }
    const struct route *r = find_route(hr->path);
    if (!r) {
        ds4_send_error(s, c, hr, 404, "unknown endpoint", NULL, NULL, 0, ka);
        return ka;
    }
    bool allowed = r->post ? !strcmp(m, "POST") : !strcmp(m, "GET") || !strcmp(m, "HEAD");
    if (!allowed) {
        ds4_send_method_not_allowed(s, c, hr, r->post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS", ka);
        return ka;
    }
    if (!r->fn) return route_inference(s, c, hr, body, r->api);
    r->fn(s, c, hr, body, ka);
    return ka;
}

bool ds4_srv_route_request(server *s, ds4_http_conn *c, ds4_http_req *hr, ds4_buf *body) {
    c->status = 0;
    bool ka = dispatch(s, c, hr, body);
    ds4_metrics_request(hr->path, c->status);
    return ka;
}
