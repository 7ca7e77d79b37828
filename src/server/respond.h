/* respond.h -- complete responses and errors in each API family's shape.
 *
 * Contract
 * - ds4_send_error() answers in the family of the request's path: Anthropic
 *   ({"type":"error","error":{type,message}}) for /v1/messages*, OpenAI
 *   ({"error":{message,type,param,code}}) otherwise; 4xx carry
 *   x-should-retry: false (deterministic failures must not be retried).
 *   n_prompt > 0 adds the prompt and context sizes to the error object.
 * - Every response carries the CORS headers when --cors is on.
 * - ds4_send_json() and ds4_sse_data() take ownership of the cJSON object.
 */
#ifndef DS4_RESPOND_H
#define DS4_RESPOND_H

#include <stdbool.h>
#include <stddef.h>

#include "server/http.h"

struct cJSON;
typedef struct server server;

void ds4_cors_headers(const server *s, const ds4_http_req *hr, char *out, size_t n);
void ds4_send_json(server *s, ds4_http_conn *c, const ds4_http_req *hr, int status, struct cJSON *o,
                   bool keep_alive, const char *extra_headers);
void ds4_send_error(server *s, ds4_http_conn *c, const ds4_http_req *hr, int status, const char *message,
                    const char *param, const char *code, int n_prompt, bool keep_alive);
/* 405 with `Allow: allow` (RFC 9110 15.5.6), in the path's family. */
void ds4_send_method_not_allowed(server *s, ds4_http_conn *c, const ds4_http_req *hr, const char *allow,
                                 bool keep_alive);
/* One SSE `data:` event. */
void ds4_sse_data(ds4_http_conn *c, struct cJSON *o);
/* The message for an HTTP-layer rejection (the -STATUS of ds4_http_read_head or _body). */
const char *ds4_http_error_text(int status);

#endif
