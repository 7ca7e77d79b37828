#include "routes.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "prefix.h"
#include "respond.h"
#include "server_state.h"

static const char *const MODEL_IDS[] = {"deepseek-v4-flash", "deepseek-v4-pro"};
#define N_MODEL_IDS (sizeof MODEL_IDS / sizeof MODEL_IDS[0])

static cJSON *model_obj(server *s, const char *id) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddStringToObject(m, "type", "model");
    cJSON_AddNumberToObject(m, "created", 1767225600);
    cJSON_AddStringToObject(m, "created_at", "2026-01-01T00:00:00Z");
    cJSON_AddStringToObject(m, "owned_by", "ds4");
    cJSON_AddStringToObject(m, "display_name", strstr(id, "pro") ? "DeepSeek V4 Pro" : "DeepSeek V4 Flash");
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

static void route_models(server *s, ds4_http_conn *c, const ds4_http_req *hr, bool ka) {
    if (!strcmp(hr->path, "/v1/models")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON *d = cJSON_AddArrayToObject(o, "data");
        for (size_t i = 0; i < N_MODEL_IDS; i++) cJSON_AddItemToArray(d, model_obj(s, MODEL_IDS[i]));
        cJSON_AddBoolToObject(o, "has_more", false);
        cJSON_AddStringToObject(o, "first_id", MODEL_IDS[0]);
        cJSON_AddStringToObject(o, "last_id", MODEL_IDS[N_MODEL_IDS - 1]);
        ds4_send_json(s, c, hr, 200, o, ka, NULL);
        return;
    }
    const char *id = hr->path + strlen("/v1/models/");
    for (size_t i = 0; i < N_MODEL_IDS; i++)
        if (!strcmp(id, MODEL_IDS[i])) { ds4_send_json(s, c, hr, 200, model_obj(s, id), ka, NULL); return; }
    char msg[200];
    snprintf(msg, sizeof msg, "The model '%.100s' does not exist or you do not have access to it.", id);
    ds4_send_error(s, c, hr, 404, msg, "model", "model_not_found", 0, ka);
}

static void route_count_tokens(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    ds4_request r;
    ds4_req_error e;
    if (ds4_request_decode(DS4_API_COUNT_TOKENS, body->data ? body->data : "", body->len, &r, &e)) {
        ds4_send_error(s, c, hr, e.status, e.message, e.param, e.code, 0, ka);
        return;
    }
    ds4_buf text = {0};
    char err[256];
    ds4_token_ids ids = {0};
    if (!srv_render_prompt(s, &r, false, &text, err, sizeof err) || srv_encode(s, text.data, text.len, &ids)) {
        ds4_send_error(s, c, hr, 400, err, NULL, NULL, 0, ka);
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "input_tokens", (double)ids.n);
        ds4_send_json(s, c, hr, 200, o, ka, NULL);
    }
    ds4_token_ids_free(&ids);
    ds4_buf_free(&text);
    ds4_request_free(&r);
}

static void route_tokenizer(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    cJSON *in = cJSON_ParseWithLength(body->data ? body->data : "", body->len);
    cJSON *o = cJSON_CreateObject();
    if (!strcmp(hr->path, "/tokenizer_info")) {
        cJSON_AddStringToObject(o, "eos_token", DS4_TOK_EOS);
        cJSON_AddStringToObject(o, "bos_token", DS4_TOK_BOS);
    } else if (!strcmp(hr->path, "/tokenize")) {
        cJSON *p = cJSON_GetObjectItem(in, "prompt");
        if (!cJSON_IsString(p)) p = cJSON_GetObjectItem(in, "content");
        if (!cJSON_IsString(p)) {
            cJSON_Delete(in); cJSON_Delete(o);
            ds4_send_error(s, c, hr, 400, "missing prompt", "prompt", NULL, 0, ka);
            return;
        }
        /* As HF tokenizers do: added tokens are always matched (clients such
         * as lm-eval find BOS/EOS ids by tokenizing their strings), and
         * add_special_tokens only decides whether BOS is prepended. */
        cJSON *asp = cJSON_GetObjectItem(in, "add_special_tokens");
        ds4_token_ids ids = {0};
        if (cJSON_IsTrue(asp))
            ds4_tokenizer_encode(s->tok, DS4_TOK_BOS, strlen(DS4_TOK_BOS), DS4_TOK_SPECIALS_ALL, &ids);
        ds4_tokenizer_encode(s->tok, p->valuestring, strlen(p->valuestring), DS4_TOK_SPECIALS_ALL, &ids);
        cJSON *a = cJSON_AddArrayToObject(o, "tokens");
        for (size_t i = 0; i < ids.n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids.v[i]));
        ds4_token_ids_free(&ids);
    } else {
        cJSON *t = cJSON_GetObjectItem(in, "tokens");
        int n = cJSON_GetArraySize(t);
        int32_t *ids = calloc((size_t)n + 1, sizeof *ids);
        int k = 0;
        for (cJSON *x = cJSON_IsArray(t) ? t->child : NULL; x; x = x->next)
            if (cJSON_IsNumber(x)) ids[k++] = (int32_t)x->valuedouble;
        size_t len = 0;
        char *text = ds4_tokenizer_decode(s->tok, ids, (size_t)k, true, &len);
        cJSON_AddStringToObject(o, "prompt", text ? text : "");
        free(text);
        free(ids);
    }
    cJSON_Delete(in);
    ds4_send_json(s, c, hr, 200, o, ka, NULL);
}

static ds4_api route_api(const char *path) {
    if (!strcmp(path, "/v1/chat/completions")) return DS4_API_CHAT;
    if (!strcmp(path, "/v1/completions")) return DS4_API_COMPLETIONS;
    if (!strcmp(path, "/v1/responses")) return DS4_API_RESPONSES;
    if (!strcmp(path, "/v1/messages")) return DS4_API_MESSAGES;
    return (ds4_api)-1;
}

/* Decodes an inference request and waits for the worker to run it. */
static bool route_inference(server *s, ds4_http_conn *c, ds4_http_req *hr, const ds4_buf *body, ds4_api api) {
    bool ka = hr->keep_alive;
    job j = {.conn = c, .hreq = hr, .body = body->data, .body_len = body->len};
    ds4_req_error e;
    if (ds4_request_decode(api, body->data ? body->data : "", body->len, &j.req, &e)) {
        ds4_send_error(s, c, hr, e.status, e.message, e.param, e.code, 0, ka);
        return ka;
    }
    if (!ds4_queue_submit(s, &j)) {
        ds4_request_free(&j.req);
        ds4_send_error(s, c, hr, 503, "server shutting down", NULL, NULL, 0, false);
        return false;
    }
    ds4_enc_free(j.enc);
    ds4_request_free(&j.req);
    return j.keep_alive && !c->broken && !c->http10;
}

static void route_metrics(server *s, ds4_http_conn *c, const ds4_http_req *hr, bool ka) {
    ds4_metrics_gauges g = {.kv_bytes = 0};
    ds4_queue_slots(s, &g.slots, &g.slots_busy, &g.queued);
    g.kv_bytes = (uint64_t)g.slots * ds4_engine_kv_bytes(s->eng, s->o.ctx);
    ds4_buf text = {0};
    ds4_metrics_render(&text, &g);
    char hdr[1024];
    ds4_cors_headers(s, hr, hdr, sizeof hdr);
    ds4_http_respond(c, 200, "text/plain; version=0.0.4", text.data ? text.data : "", text.len, ka, hdr);
    ds4_buf_free(&text);
}

static bool dispatch(server *s, ds4_http_conn *c, ds4_http_req *hr, ds4_buf *body) {
    bool ka = hr->keep_alive;
    const char *m = hr->method, *path = hr->path;
    if (!strcmp(m, "OPTIONS")) {
        char hdr[1024];
        ds4_cors_headers(s, hr, hdr, sizeof hdr);
        ds4_http_respond(c, 204, NULL, NULL, 0, ka, hdr);
        return ka;
    }
    bool get = !strcmp(m, "GET"), post = !strcmp(m, "POST");
    if (get && (!strcmp(path, "/v1/models") || !strncmp(path, "/v1/models/", 11))) { route_models(s, c, hr, ka); return ka; }
    if (get && !strcmp(path, "/metrics")) { route_metrics(s, c, hr, ka); return ka; }
    if (get && !strcmp(path, "/health")) {
        cJSON *o = cJSON_CreateObject();
        int n_slots, busy, queued;
        ds4_queue_slots(s, &n_slots, &busy, &queued);
        cJSON_AddStringToObject(o, "status", "ok");
        cJSON_AddNumberToObject(o, "slots", n_slots);
        cJSON_AddNumberToObject(o, "slots_busy", busy);
        cJSON_AddNumberToObject(o, "slots_free", n_slots - busy);
        cJSON_AddNumberToObject(o, "queued", queued);
        ds4_send_json(s, c, hr, 200, o, ka, NULL);
        return ka;
    }
    if ((get && !strcmp(path, "/tokenizer_info")) || (post && (!strcmp(path, "/tokenize") || !strcmp(path, "/detokenize")))) {
        route_tokenizer(s, c, hr, body, ka);
        return ka;
    }
    if (post && !strcmp(path, "/v1/messages/count_tokens")) { route_count_tokens(s, c, hr, body, ka); return ka; }
    ds4_api api = route_api(path);
    if (!post || (int)api < 0) {
        ds4_send_error(s, c, hr, 404, "unknown endpoint", NULL, NULL, 0, ka);
        return ka;
    }
    return route_inference(s, c, hr, body, api);
}

bool route_request(server *s, ds4_http_conn *c, ds4_http_req *hr, ds4_buf *body) {
    c->status = 0;
    bool ka = dispatch(s, c, hr, body);
    ds4_metrics_request(hr->path, c->status);
    return ka;
}
