#include "server/http.h"

#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Appends and reports allocation failure, which callers map to 413. */
static int buf_append(ds4_buf *b, const void *p, size_t n) {
    ds4_buf_put(b, p, n);
    return b->oom ? -1 : 0;
}

/* ---- request head ---------------------------------------------------- */

static bool is_tchar(unsigned char c) {
    return isalnum(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Finds the blank line ending the head; returns its end offset or 0. */
static size_t head_end(const char *buf, size_t len) {
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != '\n') continue;
        if (i + 1 < len && buf[i + 1] == '\n') return i + 2;
        if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n') return i + 3;
    }
    return 0;
}

/* Case-insensitive search for a comma-separated token in a header value. */
static bool has_token(const char *v, size_t n, const char *tok) {
    size_t tl = strlen(tok);
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
        size_t s = i;
        while (i < n && v[i] != ',') i++;
        size_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
        if (e - s == tl && strncasecmp(v + s, tok, tl) == 0) return true;
    }
    return false;
}

/* Copies a header value the access checks read. One too long to keep is
 * refused (-431), never kept as a prefix or as "": an empty Host would pass
 * as absent, an empty credential as missing. */
static int keep_value(char *dst, size_t cap, const char *v, size_t vl) {
    if (vl >= cap) return -431;
    memcpy(dst, v, vl);
    dst[vl] = 0;
    return 0;
}

static int parse_header(ds4_http_req *r, const char *name, size_t nl, const char *v, size_t vl,
                        uint64_t max_body) {
#define HNAME(s) (nl == sizeof(s) - 1 && strncasecmp(name, s, nl) == 0)
    if (HNAME("content-length")) {
        if (vl == 0) return -400;
        uint64_t x = 0;
        for (size_t i = 0; i < vl; i++) {
            if (v[i] < '0' || v[i] > '9') return -400;
            if (x > (UINT64_MAX - 9) / 10) return -413;
            x = x * 10 + (uint64_t)(v[i] - '0');
        }
        if (r->has_length && r->content_length != x) return -400;
        r->has_length = true;
        r->content_length = x;
        if (x > max_body) return -413;
    } else if (HNAME("transfer-encoding")) {
        /* Only a plain "chunked" is implemented: another coding, also one
         * applied before chunked ("gzip, chunked"), is 501, since the body
         * would reach the JSON parser still encoded. Chunked anywhere but
         * last, also across repeated lines, leaves the body's end
         * undecidable: 400 (RFC 9112 6.3). */
        bool last = vl >= 7 && strncasecmp(v + vl - 7, "chunked", 7) == 0 &&
                    (vl == 7 || v[vl - 8] == ',' || v[vl - 8] == ' ' || v[vl - 8] == '\t');
        if (r->chunked || (has_token(v, vl, "chunked") && !last)) return -400;
        if (vl != 7 || !last) return -501;
        r->chunked = true;
    } else if (HNAME("connection")) {
        if (has_token(v, vl, "close")) r->keep_alive = false;
        else if (has_token(v, vl, "keep-alive")) r->keep_alive = true;
    } else if (HNAME("expect")) {
        if (vl == 12 && strncasecmp(v, "100-continue", 12) == 0) r->expect_continue = true;
        else return -417;
    } else if (HNAME("host")) {
        /* Two Host lines could name two authorities (RFC 9112 3.2: 400). */
        if (r->has_host) return -400;
        r->has_host = true;
        return keep_value(r->host, sizeof r->host, v, vl);
    } else if (HNAME("content-type")) {
        size_t e = 0;
        while (e < vl && v[e] != ';' && v[e] != ' ' && v[e] != '\t') e++;
        if (keep_value(r->content_type, sizeof r->content_type, v, e)) return -431;
        for (char *c = r->content_type; *c; c++) *c = (char)tolower((unsigned char)*c);
    } else if (HNAME("authorization")) {
        if (vl > 7 && strncasecmp(v, "bearer ", 7) == 0) return keep_value(r->bearer, sizeof r->bearer, v + 7, vl - 7);
    } else if (HNAME("x-api-key")) {
        return keep_value(r->api_key, sizeof r->api_key, v, vl);
    } else if (HNAME("access-control-request-headers")) {
        /* Echoed back in CORS preflights: keep only token characters,
         * commas and spaces so nothing can inject a header line. */
        size_t o = 0;
        for (size_t i = 0; i < vl && o + 1 < sizeof r->acr_headers; i++) {
            unsigned char c = (unsigned char)v[i];
            if (is_tchar(c) || c == ',' || c == ' ') r->acr_headers[o++] = (char)c;
        }
        r->acr_headers[o] = 0;
    }
#undef HNAME
    return 0;
}

int ds4_http_parse_head(const char *buf, size_t len, size_t max_head, uint64_t max_body,
                        ds4_http_req *r) {
    size_t end = head_end(buf, len < max_head ? len : max_head);
    if (!end) return len >= max_head ? -431 : 0;
    memset(r, 0, sizeof *r);

    /* Request line: METHOD SP target SP HTTP/1.x */
    const char *p = buf, *lim = buf + end;
    const char *eol = memchr(p, '\n', (size_t)(lim - p));
    const char *le = eol > p && eol[-1] == '\r' ? eol - 1 : eol;
    size_t i = 0;
    while (p < le && *p >= 'A' && *p <= 'Z' && i + 1 < sizeof r->method) r->method[i++] = *p++;
    if (i == 0 || p >= le || *p != ' ') return -400;
    p++;
    const char *t = p;
    while (p < le && *p != ' ') {
        if ((unsigned char)*p <= 0x20 || *p == 0x7f) return -400;
        p++;
    }
    size_t tl = (size_t)(p - t);
    if (tl == 0 || p >= le) return -400;
    if (!(t[0] == '/' || (tl == 1 && t[0] == '*'))) {
        /* absolute-form: keep only the path part of http://host/path */
        const char *s = memmem(t, tl, "://", 3);
        if (!s) return -400;
        s = memchr(s + 3, '/', (size_t)(t + tl - (s + 3)));
        if (!s) { t = "/"; tl = 1; }
        else { tl -= (size_t)(s - t); t = s; }
    }
    size_t pl = 0;
    while (pl < tl && t[pl] != '?' && t[pl] != '#') pl++;
    if (pl >= sizeof r->path) return -414;
    memcpy(r->path, t, pl);
    r->path[pl] = 0;
    p++;
    if (le - p != 8 || memcmp(p, "HTTP/1.", 7) != 0) {
        if (le - p >= 5 && memcmp(p, "HTTP/", 5) == 0) return -505;
        return -400;
    }
    if (p[7] != '0' && p[7] != '1') return -505;
    r->minor = p[7] - '0';
    r->keep_alive = r->minor == 1;

    for (p = eol + 1; p < lim; p = eol + 1) {
        eol = memchr(p, '\n', (size_t)(lim - p));
        le = eol > p && eol[-1] == '\r' ? eol - 1 : eol;
        if (le == p) break; /* blank line */
        if (*p == ' ' || *p == '\t') return -400; /* obsolete line folding */
        const char *colon = p;
        while (colon < le && is_tchar((unsigned char)*colon)) colon++;
        if (colon == p || colon >= le || *colon != ':') return -400;
        const char *v = colon + 1, *ve = le;
        while (v < ve && (*v == ' ' || *v == '\t')) v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        for (const char *q = v; q < ve; q++)
            if ((unsigned char)*q < 0x20 && *q != '\t') return -400;
        int rc = parse_header(r, p, (size_t)(colon - p), v, (size_t)(ve - v), max_body);
        if (rc) return rc;
    }
    if (r->chunked && r->has_length) return -400;
    /* RFC 9112 3.2: an HTTP/1.1 request without Host is a 400; only
     * HTTP/1.0 clients may omit it (access.h). */
    if (r->minor == 1 && !r->has_host) return -400;
    return (int)end;
}

/* ---- chunked request bodies ----------------------------------------- */

enum { CK_SIZE, CK_EXT, CK_SIZE_LF, CK_DATA, CK_DATA_CR, CK_DATA_LF, CK_TRAILER, CK_TRAILER_LINE, CK_DONE };

void ds4_http_chunked_init(ds4_http_chunked *c) {
    memset(c, 0, sizeof *c);
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

int ds4_http_chunked_feed(ds4_http_chunked *c, const char *in, size_t n, size_t *consumed,
                          ds4_buf *out, uint64_t max_body) {
    size_t i = 0;
    int rc = 0;
    while (i < n && c->state != CK_DONE) {
        char ch = in[i];
        switch (c->state) {
        case CK_SIZE: {
            int h = hexval(ch);
            if (h >= 0) {
                if (++c->size_digits > 15) { rc = -413; goto out; }
                c->remaining = c->remaining * 16 + (uint64_t)h;
            } else if (c->size_digits == 0) {
                rc = -400; goto out;
            } else if (ch == ';' || ch == ' ' || ch == '\t') {
                c->state = CK_EXT;
            } else if (ch == '\r') {
                c->state = CK_SIZE_LF;
            } else if (ch == '\n') {
                c->state = c->remaining ? CK_DATA : CK_TRAILER;
            } else {
                rc = -400; goto out;
            }
            if (c->remaining + out->len > max_body) { rc = -413; goto out; }
            i++;
            break;
        }
        case CK_EXT:
            if (ch == '\n') c->state = c->remaining ? CK_DATA : CK_TRAILER;
            else if (ch == '\r') c->state = CK_SIZE_LF;
            i++;
            break;
        case CK_SIZE_LF:
            if (ch != '\n') { rc = -400; goto out; }
            c->state = c->remaining ? CK_DATA : CK_TRAILER;
            i++;
            break;
        case CK_DATA: {
            size_t take = n - i;
            if (take > c->remaining) take = (size_t)c->remaining;
            if (buf_append(out, in + i, take)) { rc = -413; goto out; }
            i += take;
            c->remaining -= take;
            if (!c->remaining) c->state = CK_DATA_CR;
            break;
        }
        case CK_DATA_CR:
            if (ch == '\r') c->state = CK_DATA_LF;
            else if (ch == '\n') { c->state = CK_SIZE; c->size_digits = 0; }
            else { rc = -400; goto out; }
            i++;
            break;
        case CK_DATA_LF:
            if (ch != '\n') { rc = -400; goto out; }
            c->state = CK_SIZE;
            c->size_digits = 0;
            i++;
            break;
        case CK_TRAILER: /* at the start of a trailer line */
            if (ch == '\n') c->state = CK_DONE;
            else if (ch != '\r') c->state = CK_TRAILER_LINE;
            i++;
            break;
        case CK_TRAILER_LINE:
            if (ch == '\n') c->state = CK_TRAILER;
            i++;
            break;
        }
    }
    rc = c->state == CK_DONE;
out:
    *consumed = i;
    return rc;
}

/* ---- connection I/O -------------------------------------------------- */

void ds4_http_limits_default(ds4_http_limits *l) {
    l->max_head = 64 * 1024;
    l->max_body = 64ull * 1024 * 1024;
    l->read_timeout_ms = 10000;
    l->request_timeout_ms = 30000;
    l->head_timeout_ms = 10000;
    l->idle_timeout_ms = 60000;
    l->write_stall_ms = 2000;
    l->send_buffer_bytes = 64 * 1024;
}

const char *ds4_http_reason(int s) {
    switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

static int write_all(ds4_http_conn *c, const char *p, size_t n) {
    if (c->broken) return -1;
    while (n) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) { p += w; n -= (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pf = {.fd = c->fd, .events = POLLOUT};
            int pr = poll(&pf, 1, c->lim.write_stall_ms);
            if (pr > 0 && !(pf.revents & (POLLERR | POLLHUP))) continue;
            if (pr < 0 && errno == EINTR) continue;
            c->stalled = pr == 0;
        }
        c->broken = true;
        return -1;
    }
    return 0;
}

/* Waits for readable data; returns bytes read, 0 on EOF, -1 error, -2 timeout. */
static ssize_t read_some(ds4_http_conn *c, int timeout_ms) {
    char tmp[65536];
    for (;;) {
        struct pollfd pf = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&pf, 1, timeout_ms);
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) return -2;
        if (pr < 0) return -1;
        ssize_t r = recv(c->fd, tmp, sizeof tmp, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r > 0 && buf_append(&c->in, tmp, (size_t)r)) return -1;
        return r;
    }
}

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* A read while a request is arriving: the per-read timeout, cut to what is
 * left of the request's total deadline (-2 once it has passed). */
static ssize_t read_request_bytes(ds4_http_conn *c, double deadline_ms) {
    double left = deadline_ms - mono_ms();
    if (left <= 0) return -2;
    return read_some(c, left < c->lim.read_timeout_ms ? (int)left + 1 : c->lim.read_timeout_ms);
}

static void consume_in(ds4_http_conn *c, size_t n) {
    memmove(c->in.data, c->in.data + n, c->in.len - n);
    c->in.len -= n;
    if (c->in.data) c->in.data[c->in.len] = 0;
}

int ds4_http_read_head(ds4_http_conn *c, ds4_http_req *req) {
    c->close_after = false;
    c->head_only = false;
    /* The deadlines start with the request's first byte, not the idle wait. */
    double first = c->in.len ? mono_ms() : 0;
    int head_ms = c->lim.head_timeout_ms < c->lim.request_timeout_ms ? c->lim.head_timeout_ms
                                                                     : c->lim.request_timeout_ms;
    int hl;
    for (;;) {
        hl = c->in.len ? ds4_http_parse_head(c->in.data, c->in.len, c->lim.max_head,
                                             c->lim.max_body, req) : 0;
        if (hl) break;
        ssize_t r = c->in.len ? read_request_bytes(c, first + head_ms) : read_some(c, c->lim.idle_timeout_ms);
        if (r == 0 || (r < 0 && c->in.len == 0)) return 1;
        if (r < 0) return r == -2 ? -408 : 1;
        if (!first) first = mono_ms();
    }
    if (hl < 0) return hl;
    consume_in(c, (size_t)hl);
    c->body_deadline_ms = first + c->lim.request_timeout_ms;
    c->http10 = req->minor == 0;
    c->head_only = !strcmp(req->method, "HEAD");
    return 0;
}

int ds4_http_read_body(ds4_http_conn *c, const ds4_http_req *req, ds4_buf *body) {
    ds4_buf_clear(body);
    double deadline = c->body_deadline_ms;
    if (req->expect_continue && (req->chunked || req->content_length > 0) && c->in.len == 0) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (write_all(c, cont, sizeof cont - 1)) return 1;
    }
    if (req->chunked) {
        ds4_http_chunked ck;
        ds4_http_chunked_init(&ck);
        for (;;) {
            size_t used = 0;
            int rc = c->in.len ? ds4_http_chunked_feed(&ck, c->in.data, c->in.len, &used, body,
                                                       c->lim.max_body) : 0;
            consume_in(c, used);
            if (rc < 0) return rc;
            if (rc == 1) break;
            ssize_t r = read_request_bytes(c, deadline);
            if (r == 0 || r == -1) return 1;
            if (r == -2) return -408;
        }
    } else if (req->content_length) {
        while (c->in.len < req->content_length) {
            ssize_t r = read_request_bytes(c, deadline);
            if (r == 0 || r == -1) return 1;
            if (r == -2) return -408;
        }
        if (buf_append(body, c->in.data, (size_t)req->content_length)) return -413;
        consume_in(c, (size_t)req->content_length);
    }
    return 0;
}

static int send_head(ds4_http_conn *c, int status, const char *ctype, long long clen,
                     bool keep_alive, const char *extra) {
    c->status = status;
    char h[1024];
    int n = snprintf(h, sizeof h, "HTTP/1.1 %d %s\r\n", status, ds4_http_reason(status));
    if (ctype) n += snprintf(h + n, sizeof h - (size_t)n, "Content-Type: %s\r\n", ctype);
    /* clen -1: chunked stream; -2: stream delimited by close (HTTP/1.0) */
    if (clen >= 0) n += snprintf(h + n, sizeof h - (size_t)n, "Content-Length: %lld\r\n", clen);
    else n += snprintf(h + n, sizeof h - (size_t)n, "%sCache-Control: no-cache\r\nX-Accel-Buffering: no\r\n",
                       clen == -1 ? "Transfer-Encoding: chunked\r\n" : "");
    n += snprintf(h + n, sizeof h - (size_t)n, "Connection: %s\r\n",
                  keep_alive ? "keep-alive" : "close");
    if (write_all(c, h, (size_t)n)) return -1;
    if (extra && *extra && write_all(c, extra, strlen(extra))) return -1;
    return write_all(c, "\r\n", 2);
}

int ds4_http_respond(ds4_http_conn *c, int status, const char *ctype, const char *body,
                     size_t len, bool keep_alive, const char *extra) {
    c->streaming = false;
    if (send_head(c, status, ctype, (long long)len, keep_alive, extra)) return -1;
    return len && !c->head_only ? write_all(c, body, len) : 0;
}

int ds4_http_stream_begin(ds4_http_conn *c, const char *extra) {
    c->streaming = true;
    c->close_after = c->http10;
    return send_head(c, 200, "text/event-stream", c->http10 ? -2 : -1, !c->http10, extra);
}

int ds4_http_stream_write(ds4_http_conn *c, const char *data, size_t len) {
    if (!len) return c->broken ? -1 : 0;
    if (c->http10) return write_all(c, data, len);
    char hdr[32];
    int hn = snprintf(hdr, sizeof hdr, "%zx\r\n", len);
    if (write_all(c, hdr, (size_t)hn) || write_all(c, data, len) || write_all(c, "\r\n", 2))
        return -1;
    return 0;
}

int ds4_http_stream_end(ds4_http_conn *c) {
    c->streaming = false;
    return c->http10 ? 0 : write_all(c, "0\r\n\r\n", 5);
}

bool ds4_http_peer_gone(ds4_http_conn *c) {
    if (c->broken) return true;
    struct pollfd pf = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0) return false;
    if (pf.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
    if (pf.revents & POLLIN) {
        char b;
        ssize_t r = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0) return true;
    }
    return false;
}
