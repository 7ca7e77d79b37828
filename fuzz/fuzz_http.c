/* Fuzz target: the HTTP request-head parser and the chunked body decoder.
 * Input = a raw request as it would arrive on a socket; the first byte picks
 * the chunking of the body feed so split points are exercised too. */
#include "server/http.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t step = (size_t)data[0] % 17 + 1;
    const char *buf = (const char *)data + 1;
    size_t len = size - 1;
    ds4_http_req r;
    int hl = ds4_http_parse_head(buf, len, 4096, 1 << 16, &r);
    /* A complete head must be stable under any longer buffer. */
    if (hl > 0) {
        ds4_http_req r2;
        if (ds4_http_parse_head(buf, (size_t)hl, 4096, 1 << 16, &r2) != hl) abort();
        if (strlen(r.path) >= sizeof r.path || r.path[0] == 0) abort();
        if (strchr(r.path, '?')) abort();
        /* HTTP/1.1 without Host never parses; a kept Host is never cut */
        if (r.minor == 1 && !r.has_host) abort();
        if (strnlen(r.host, sizeof r.host) >= sizeof r.host || (!r.has_host && r.host[0])) abort();
    }
    size_t off = hl > 0 ? (size_t)hl : 0;
    ds4_http_chunked c;
    ds4_http_chunked_init(&c);
    ds4_buf out = {0};
    while (off < len) {
        size_t take = len - off < step ? len - off : step, used = 0;
        int rc = ds4_http_chunked_feed(&c, buf + off, take, &used, &out, 1 << 16);
        if (used > take || out.len > (1 << 16)) abort();
        off += used;
        if (rc != 0) break;
    }
    ds4_buf_free(&out);
    return 0;
}
