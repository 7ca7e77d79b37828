/* routes.h -- request routing on a connection thread: the cheap endpoints
 * (models, health with the slots, Prometheus metrics, tokenizer, token
 * counting) are answered here; inference requests are decoded and handed to
 * a slot's worker through the queue.
 *
 * Contract
 * - ds4_srv_route_request() answers exactly one request and returns whether the
 *   connection stays open (keep-alive, not broken, not HTTP/1.0 after a
 *   streamed answer).
 * - Unknown paths get 404 in the family's error shape, a known path asked
 *   with another method 405 with an Allow header; HEAD is answered wherever
 *   GET is, with the same head and no body. Request decoding errors get the
 *   status request.h chose.
 * - Every request is counted in metrics.h by path and the status sent.
 */
#ifndef DS4_ROUTES_H
#define DS4_ROUTES_H

#include <stdbool.h>

#include "server/http.h"
#include "base/json_util.h"

typedef struct server server;

bool ds4_srv_route_request(server *s, ds4_http_conn *c, ds4_http_req *hr, ds4_buf *body);

#endif
