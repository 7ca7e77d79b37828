/* HTTP head parser and chunked decoder: behaviour on well-formed, split,
 * oversized and malformed input (expected values follow RFC 9112). */
#include "check.h"
#include "server/http.h"

#include <string.h>

static int parse(const char *s, ds4_http_req *r) {
    return ds4_http_parse_head(s, strlen(s), 65536, 1 << 20, r);
}

static void test_head(void) {
    ds4_http_req r;
    const char *s = "POST /v1/messages?beta=true HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n"
                    "Authorization: Bearer k\r\n\r\n{\"a\":1}";
    int n = parse(s, &r);
    CHECK(n == (int)(strstr(s, "\r\n\r\n") - s) + 4, "head length %d", n);
    CHECK(!strcmp(r.method, "POST") && !strcmp(r.path, "/v1/messages"), "%s %s", r.method, r.path);
    CHECK(r.has_length && r.content_length == 12 && r.keep_alive && r.minor == 1, "fields");

    /* every strict prefix of the head needs more data */
    for (int i = 0; i < n; i++)
        CHECK(ds4_http_parse_head(s, (size_t)i, 65536, 1 << 20, &r) == 0, "prefix %d", i);

    CHECK(parse("GET /v1/models#frag HTTP/1.0\n\n", &r) > 0 && !strcmp(r.path, "/v1/models") &&
          !r.keep_alive, "bare LF, HTTP/1.0 closes");
    CHECK(parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &r) > 0 && r.keep_alive, "1.0 ka");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nConnection: Close\r\n\r\n", &r) > 0 && !r.keep_alive, "close");
    CHECK(parse("GET http://h:8000/v1/models?x HTTP/1.1\r\nHost: h\r\n\r\n", &r) > 0 &&
          !strcmp(r.path, "/v1/models"), "absolute form -> %s", r.path);
    CHECK(parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n", &r) > 0 &&
          r.chunked && r.expect_continue, "chunked + expect");
    CHECK(parse("OPTIONS * HTTP/1.1\r\nHost: h\r\nAccess-Control-Request-Headers: authorization,\r\x01x-api-key\r\n\r\n", &r) == -400,
          "control char in header value");
    CHECK(parse("OPTIONS / HTTP/1.1\r\nHost: h\r\nAccess-Control-Request-Headers: authorization, x-api-key\r\n\r\n", &r) > 0 &&
          !strcmp(r.acr_headers, "authorization, x-api-key"), "acrh %s", r.acr_headers);

    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", &r) == -400, "CL+TE");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", &r) == -400, "CL mismatch");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", &r) > 0, "CL repeat");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", &r) == -400, "CL negative");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 2000000\r\n\r\n", &r) == -413, "CL over max");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n", &r) == -413, "CL overflow");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", &r) == -501, "TE gzip");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", &r) == -400, "chunked not last");
    /* a coding applied before chunked would reach the JSON parser encoded */
    CHECK(parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", &r) == -501,
          "gzip, chunked");
    CHECK(parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity, chunked\r\n\r\n", &r) == -501,
          "identity, chunked");
    CHECK(parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: xchunked\r\n\r\n", &r) == -501, "xchunked");
    CHECK(parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                &r) == -400, "chunked twice");
    CHECK(parse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: CHUNKED\r\n\r\n", &r) > 0 && r.chunked,
          "chunked is case-insensitive");
    /* Host (RFC 9112 3.2) */
    CHECK(parse("GET / HTTP/1.1\r\n\r\n", &r) == -400, "HTTP/1.1 without Host");
    CHECK(parse("GET / HTTP/1.0\r\n\r\n", &r) > 0 && !r.has_host, "HTTP/1.0 without Host");
    CHECK(parse("GET / HTTP/1.1\r\nHost: a\r\nHost: localhost\r\n\r\n", &r) == -400, "two Host lines");
    CHECK(parse("GET / HTTP/1.1\r\nHost:\r\n\r\n", &r) > 0 && r.has_host && !r.host[0], "empty Host is present");
    {
        /* a value too long to keep is refused, never kept as "" */
        static const char *const fields[] = {"Host: ", "x-api-key: ", "Authorization: Bearer ", "Content-Type: "};
        for (size_t f = 0; f < sizeof fields / sizeof *fields; f++) {
            char req[1200];
            int n = snprintf(req, sizeof req, "GET / HTTP/1.1\r\n%s%s", f ? "Host: h\r\n" : "", fields[f]);
            memset(req + n, 'a', 600);
            memcpy(req + n + 600, "\r\n\r\n", 5);
            CHECK(parse(req, &r) == -431, "over-long %s", fields[f]);
        }
        char req[400];
        int n = snprintf(req, sizeof req, "GET / HTTP/1.1\r\nHost: ");
        memset(req + n, 'a', 255);
        memcpy(req + n + 255, "\r\n\r\n", 5);
        CHECK(parse(req, &r) > 0 && strlen(r.host) == 255, "a 255-byte Host is kept whole");
    }
    CHECK(parse("GET / HTTP/2.0\r\n\r\n", &r) == -505, "version");
    CHECK(parse("GET / FTP/1.1\r\n\r\n", &r) == -400, "protocol");
    CHECK(parse("get / HTTP/1.1\r\nHost: h\r\n\r\n", &r) == -400, "lowercase method");
    CHECK(parse("GET  / HTTP/1.1\r\nHost: h\r\n\r\n", &r) == -400, "double space");
    CHECK(parse("GET relative HTTP/1.1\r\nHost: h\r\n\r\n", &r) == -400, "relative target");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nBad Header: x\r\n\r\n", &r) == -400, "space in name");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n folded\r\n\r\n", &r) == -400, "obs-fold");
    CHECK(parse("GET / HTTP/1.1\r\nHost: h\r\nExpect: something\r\n\r\n", &r) == -417, "expect");
    CHECK(parse("\r\n\r\n", &r) == -400, "empty request line");

    char big[3000];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET /", 5);
    memcpy(big + sizeof big - 16, " HTTP/1.1\r\n\r\n", 14);
    CHECK(ds4_http_parse_head(big, sizeof big - 2, 65536, 100, &r) == -414, "long target");
    CHECK(ds4_http_parse_head(big, 1000, 1000, 100, &r) == -431, "head over limit");
}

static int dechunk(const char *in, size_t n, size_t step, ds4_buf *out, uint64_t max) {
    ds4_http_chunked c;
    ds4_http_chunked_init(&c);
    out->len = 0;
    size_t off = 0;
    int rc = 0;
    while (off < n) {
        size_t take = n - off < step ? n - off : step, used = 0;
        rc = ds4_http_chunked_feed(&c, in + off, take, &used, out, max);
        if (rc) return rc;
        if (used != take) return -999;
        off += used;
    }
    return rc;
}

static void test_chunked(void) {
    const char *in = "5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nTrailer: x\r\n\r\n";
    ds4_buf out = {0};
    for (size_t step = 1; step <= strlen(in); step++) {
        int rc = dechunk(in, strlen(in), step, &out, 100);
        CHECK(rc == 1 && out.len == 12 && !memcmp(out.data, "hello, world", 12), "step %zu rc %d", step, rc);
    }
    /* input after the terminator is left unconsumed (pipelining) */
    ds4_http_chunked c;
    ds4_http_chunked_init(&c);
    size_t used = 0;
    const char *pipe = "0\r\n\r\nGET / HTTP/1.1\r\n\r\n";
    out.len = 0;
    CHECK(ds4_http_chunked_feed(&c, pipe, strlen(pipe), &used, &out, 100) == 1 && used == 5, "used %zu", used);
    CHECK(dechunk("A\nabcdefghij\n0\n\n", 17, 3, &out, 100) == 1 && out.len == 10, "bare LF");
    CHECK(dechunk("5\r\nhelloX\r\n0\r\n\r\n", 16, 4, &out, 100) == -400, "missing CRLF after data");
    CHECK(dechunk("zz\r\n", 4, 1, &out, 100) == -400, "bad size");
    CHECK(dechunk("65\r\n", 4, 1, &out, 100) == -413, "chunk over max");
    CHECK(dechunk("ffffffffffffffffff\r\n", 20, 1, &out, 1000) == -413, "size overflow");
    CHECK(dechunk("5\r\nhel", 6, 2, &out, 100) == 0, "incomplete");
    ds4_buf_free(&out);
}

int main(void) {
    test_head();
    test_chunked();
    return check_done("test_http");
}
