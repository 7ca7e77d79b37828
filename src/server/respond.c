#include "server/respond.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_state.h"

void ds4_cors_headers(const server *s, const ds4_http_req *hr, char *out, size_t n) {
    out[0] = 0;
    if (!s->o.cors) return;
    /* A wildcard does not cover Authorization (Fetch spec): echo the
     * preflight's list instead. */
    snprintf(out, n,
             "Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
             "Access-Control-Allow-Headers: %s\r\nAccess-Control-Max-Age: 86400\r\n",
             hr && hr->acr_headers[0] ? hr->acr_headers
                 : "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, "
                   "anthropic-dangerous-direct-browser-access, OpenAI-Beta");
}

void ds4_send_json(server *s, ds4_http_conn *c, const ds4_http_req *hr, int status, cJSON *o,
                   bool keep_alive, const char *extra_headers) {
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char hdr[1024];
    ds4_cors_headers(s, hr, hdr, sizeof hdr);
    if (extra_headers) strncat(hdr, extra_headers, sizeof hdr - strlen(hdr) - 1);
    ds4_http_respond(c, status, "application/json", body ? body : "{}", body ? strlen(body) : 2,
                     keep_alive, hdr);
    free(body);
}

void ds4_sse_data(ds4_http_conn *c, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return;
    ds4_buf b = {0};
    ds4_buf_puts(&b, "data: ");
    ds4_buf_puts(&b, s);
    ds4_buf_puts(&b, "\n\n");
    free(s);
    ds4_http_stream_write(c, b.data, b.len);
    ds4_buf_free(&b);
}

static bool anthropic_path(const char *path) {
    return !strncmp(path, "/v1/messages", 12);
}

/* The error body in the family of the request's path. */
static cJSON *error_object(const server *s, const ds4_http_req *hr, int status, const char *message,
                           const char *param, const char *code, int n_prompt) {
    cJSON *o = cJSON_CreateObject(), *er;
    if (hr && anthropic_path(hr->path)) {
        const char *type = status == 404 ? "not_found_error" : status == 413 ? "request_too_large"
                         : status == 401 ? "authentication_error" : status >= 500 ? "api_error"
                         : "invalid_request_error";
        cJSON_AddStringToObject(o, "type", "error");
        er = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(er, "type", type);
        cJSON_AddStringToObject(er, "message", message);
    } else {
        er = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(er, "message", message);
        cJSON_AddStringToObject(er, "type", status >= 500 ? "server_error" : "invalid_request_error");
        if (param && *param) cJSON_AddStringToObject(er, "param", param); else cJSON_AddNullToObject(er, "param");
        if (code && *code) cJSON_AddStringToObject(er, "code", code); else cJSON_AddNullToObject(er, "code");
    }
    if (n_prompt > 0) {
        cJSON_AddNumberToObject(er, "n_prompt_tokens", n_prompt);
        cJSON_AddNumberToObject(er, "n_ctx", s->o.ctx);
    }
    return o;
}

void ds4_send_error(server *s, ds4_http_conn *c, const ds4_http_req *hr, int status, const char *message,
                    const char *param, const char *code, int n_prompt, bool keep_alive) {
    ds4_send_json(s, c, hr, status, error_object(s, hr, status, message, param, code, n_prompt), keep_alive,
                  status < 500 ? "x-should-retry: false\r\n" : NULL);
}

void ds4_send_method_not_allowed(server *s, ds4_http_conn *c, const ds4_http_req *hr, const char *allow,
                                 bool keep_alive) {
    char msg[160], hdr[128];
    snprintf(msg, sizeof msg, "method %s is not allowed here; allowed: %s", hr->method, allow);
    snprintf(hdr, sizeof hdr, "Allow: %s\r\nx-should-retry: false\r\n", allow);
    ds4_send_json(s, c, hr, 405, error_object(s, hr, 405, msg, NULL, "method_not_allowed", 0), keep_alive, hdr);
}

const char *ds4_http_error_text(int status) {
    switch (status) {
    case 413: return "request body too large";
    case 431: return "request header too large";
    case 414: return "request target too long";
    case 408: return "request timed out";
    case 501: return "unsupported transfer encoding";
    case 505: return "unsupported HTTP version";
    case 417: return "unsupported expectation";
    default: return "bad HTTP request";
    }
}
