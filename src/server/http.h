/* http.h -- the HTTP/1.1 layer of ds4-server: a small request-head parser,
 * a chunked request-body decoder, and blocking socket I/O with timeouts.
 *
 * Why hand-rolled: the server needs a tiny, auditable subset of HTTP/1.1
 * (one request at a time per connection, Content-Length or chunked bodies,
 * keep-alive, SSE over chunked responses). A pure parser over a byte buffer is
 * easy to fuzz (fuzz/fuzz_http.c) and keeps the binary free of a large
 * dependency whose limits and timeouts we would have to configure anyway.
 *
 * Contract
 * - ds4_http_parse_head() is pure: it looks at buf[0..len) and returns the
 *   byte length of a complete request head (request line + headers + blank
 *   line) with *req filled, 0 if more bytes are needed, or -STATUS for a
 *   request that must be rejected (400 malformed, 414 target too long,
 *   431 head over max_head or a Host / credential / Content-Type value over
 *   its field, 413 declared body over max_body, 501 a transfer coding other
 *   than a plain "chunked", 505 version). Line ends may be CRLF or bare LF.
 *   An HTTP/1.1 request needs exactly one Host line (RFC 9112 3.2: 400);
 *   only HTTP/1.0 may omit it.
 *   The query string and fragment are stripped from the path; routing never
 *   sees them.
 * - Content-Length and Transfer-Encoding together are rejected (400): with
 *   both present two parsers could disagree on where the body ends.
 * - ds4_http_chunked_feed() decodes a chunked body incrementally: it consumes
 *   input, appends payload to out (bounded by max_body: -413), and reports
 *   1 when the terminating chunk and trailers have been read, 0 for more,
 *   -400 for malformed framing.
 * - Connection I/O: once a request's first byte has arrived, its head must
 *   be complete within head_timeout_ms (a head is at most max_head bytes,
 *   so it needs far less time than a large body), head and body within
 *   request_timeout_ms in total, and no read may wait longer than
 *   read_timeout_ms (a client trickling a byte at a time cannot hold a
 *   connection); writes use poll() with a stall timeout
 *   so a client that stops reading cannot block the inference worker. All
 *   writes use MSG_NOSIGNAL. The server caps each connection's send buffer
 *   (send_buffer_bytes): the kernel would otherwise grow a loopback buffer
 *   to megabytes, so a client that never reads would be noticed only after
 *   tens of thousands of tokens had been generated for nobody.
 * - A response keeps the connection open when asked to, for HTTP/1.0 too
 *   (Content-Length delimits it); only an HTTP/1.0 stream, which ends when
 *   the connection closes, sets `close_after`.
 */
#ifndef DS4_HTTP_H
#define DS4_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "base/json_util.h"

#define DS4_HTTP_PATH_MAX 1024
#define DS4_HTTP_ACRH_MAX 512
#define DS4_HTTP_CRED_MAX 512

typedef struct {
    char method[16];
    char path[DS4_HTTP_PATH_MAX];   /* no query string, no fragment */
    int minor;                      /* HTTP/1.<minor> */
    bool has_length;
    uint64_t content_length;
    bool chunked;
    bool expect_continue;
    bool keep_alive;
    char acr_headers[DS4_HTTP_ACRH_MAX]; /* Access-Control-Request-Headers, sanitised */
    /* For the access checks (routes.c); "" when absent. A value longer
     * than its field fails the parse with 431, so "" never stands for a
     * value that was there. */
    bool has_host;
    char host[256];
    char content_type[128];         /* media type only: lowercased, no parameters */
    char bearer[DS4_HTTP_CRED_MAX]; /* Authorization: Bearer <token> */
    char api_key[DS4_HTTP_CRED_MAX];/* x-api-key */
} ds4_http_req;

int ds4_http_parse_head(const char *buf, size_t len, size_t max_head, uint64_t max_body,
                        ds4_http_req *req);

typedef struct {
    int state;
    uint64_t remaining;   /* bytes left in the current chunk */
    int size_digits;
} ds4_http_chunked;

void ds4_http_chunked_init(ds4_http_chunked *c);
int ds4_http_chunked_feed(ds4_http_chunked *c, const char *in, size_t n, size_t *consumed,
                          ds4_buf *out, uint64_t max_body);

typedef struct {
    size_t max_head;      /* default 64 KiB */
    uint64_t max_body;    /* default 64 MiB */
    int read_timeout_ms;  /* per read while a request is arriving, default 10 s */
    int request_timeout_ms; /* whole head + body from its first byte, default 30 s */
    int head_timeout_ms;  /* the head from its first byte, default 10 s (capped by request_timeout_ms) */
    int idle_timeout_ms;  /* keep-alive wait for the next request, default 60 s */
    int write_stall_ms;   /* a write that makes no progress this long fails, default 2 s */
    int send_buffer_bytes; /* SO_SNDBUF of each accepted connection, default 64 KiB */
} ds4_http_limits;

void ds4_http_limits_default(ds4_http_limits *l);

typedef struct {
    int fd;
    ds4_buf in;           /* bytes read but not yet consumed (pipelined requests) */
    ds4_http_limits lim;
    bool http10;          /* the current request is HTTP/1.0: no chunked framing */
    bool head_only;       /* the current request is HEAD: its response is the head alone */
    bool streaming;       /* an SSE response is open */
    bool close_after;     /* the response is delimited by closing the connection */
    bool broken;          /* a write failed; the peer is gone */
    bool stalled;         /* ... because the peer stopped reading (write_stall_ms passed) */
    int status;           /* of the last response head sent (metrics) */
    double body_deadline_ms; /* the current request's, set by read_head */
} ds4_http_conn;

/* Reading the next request is two calls, so the server can tell a
 * connection still waiting for a head (cheap to drop when slots run out:
 * server.h) from one whose request is under way. read_head waits for the
 * next request's head; read_body then reads its body (for 100-continue it
 * first sends the interim response). Each returns 0 when done (*req,
 * *body filled); 1 when the client closed (or idled out between
 * requests); -STATUS when the request must be answered with that error and
 * the connection closed afterwards (-408 for a timeout mid-request,
 * answered best-effort). */
int ds4_http_read_head(ds4_http_conn *c, ds4_http_req *req);
int ds4_http_read_body(ds4_http_conn *c, const ds4_http_req *req, ds4_buf *body);

/* A complete response with Content-Length. extra_headers is "" or lines
 * each ending in CRLF. To a HEAD request only the head goes out, with the
 * Content-Length the body would have had (RFC 9110 9.3.2): a body there
 * would be read as the start of the next response on a kept-alive
 * connection. Returns 0 or -1 (peer gone). */
int ds4_http_respond(ds4_http_conn *c, int status, const char *content_type,
                     const char *body, size_t len, bool keep_alive, const char *extra_headers);

/* Streaming response: 200 + text/event-stream with chunked framing, or for
 * an HTTP/1.0 client delimited by closing the connection. */
int ds4_http_stream_begin(ds4_http_conn *c, const char *extra_headers);
int ds4_http_stream_write(ds4_http_conn *c, const char *data, size_t len);
int ds4_http_stream_end(ds4_http_conn *c);

/* True when the peer has closed or reset its side (EOF readable, HUP or
 * error). A half-closed client is treated as gone: nobody can tell it apart
 * from one that vanished, and generating for nobody wastes the worker. */
bool ds4_http_peer_gone(ds4_http_conn *c);

const char *ds4_http_reason(int status);

#endif
