/* Fuzz target: the RDMA transport's message assembly (dist/rdma.h
 * ds4_rdma_take), fed what a peer could send: the input is a sequence of
 * pieces, each a 2-byte little-endian length and that many bytes (the last
 * one cut by the input's end). Invariants (abort() on violation): a
 * complete message is at most max_bytes, holds exactly the bytes its
 * pieces carried after its length field, and the state after any result
 * is one the next piece can start from (have <= want). */
#include "dist/rdma.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_BYTES = 4096 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds4_rdma_message m = {.max_bytes = MAX_BYTES};
    static uint8_t expect[MAX_BYTES];
    size_t expect_n = 0, at = 0;
    char err[256];
    while (at < size) {
        size_t n = data[at];
        if (at + 1 < size) n |= (size_t)data[at + 1] << 8;
        at += 2;
        if (n > size - (at < size ? at : size)) n = at < size ? size - at : 0;
        const uint8_t *piece = data + (at < size ? at : size);
        at += n;
        /* what the message should hold: the bytes after the length field */
        const bool first = !m.started;
        const size_t skip = first ? 8 : 0;
        if (first) expect_n = 0;
        if (n > skip && expect_n + (n - skip) <= MAX_BYTES) memcpy(expect + expect_n, piece + skip, n - skip);
        if (n > skip) expect_n += n - skip;
        const int got = ds4_rdma_take(&m, piece, n, err, sizeof err);
        if (got == 1 && (m.want > MAX_BYTES || m.want != expect_n || m.have != m.want ||
                         (m.want && memcmp(m.msg, expect, m.want))))
            abort();
        if (got >= 0 && m.have > m.want) abort();
        if (got < 0 && (m.started || !err[0])) abort();
    }
    ds4_rdma_message_free(&m);
    return 0;
}
