/* access.h -- who may use the server: the API key, the Host header of a
 * loopback-bound server, and the media type of POST bodies.
 *
 * Contract
 * - ds4_access_check() returns 0 when the request may proceed, else the status
 *   to answer (with *message and *code): 403 for a Host header that names
 *   neither a loopback name nor the bound address while the server is
 *   bound to loopback (DNS rebinding: a page whose name resolves to
 *   127.0.0.1 still sends its own name); 401 when an API key is configured
 *   and the request carries neither "Authorization: Bearer KEY" nor
 *   "x-api-key: KEY" (every route but /health and OPTIONS preflights); 415
 *   for a POST whose Content-Type is not application/json (a browser
 *   cannot send that cross-site without a CORS preflight).
 * - A request without a Host header passes the Host check: only HTTP/1.0
 *   clients may omit it (the parser refuses HTTP/1.1 without one), and
 *   browsers never do. An empty Host names nothing and gets the 403.
 * - Keys are compared in time independent of where they differ.
 */
#ifndef DS4_ACCESS_H
#define DS4_ACCESS_H

#include <stdbool.h>

#include "server/http.h"
#include "server/server.h"

/* "localhost", 127.0.0.0/8 or ::1. */
bool ds4_access_is_loopback(const char *host);
int ds4_access_check(const ds4_server_opts *o, const ds4_http_req *hr, const char **message, const char **code);

#endif
