/* rdma.c -- the GID rule of the RDMA transport (see rdma.h); the verbs
 * side is rdma_verbs.c (or rdma_none.c in a build without libibverbs). */
#include "dist/rdma.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool empty(const uint8_t *raw) {
    for (int i = 0; i < 16; i++)
        if (raw[i]) return false;
    return true;
}

int ds4_rdma_pick_gid(const ds4_rdma_gid *gids, int n, bool ethernet, const uint8_t *ipv4, int forced, char *err,
                      size_t errlen) {
    if (forced >= 0) {
        if (forced < n && !empty(gids[forced].raw)) return forced;
        snprintf(err, errlen, "--rdma-gid-index %d: the port's GID table has no entry %d (%d entries)", forced, forced,
                 n);
        return -1;
    }
    if (!ethernet) {
        for (int i = 0; i < n; i++)
            if (!empty(gids[i].raw)) return i;
        snprintf(err, errlen, "the InfiniBand port's GID table is empty");
        return -1;
    }
    if (!ipv4) {
        snprintf(err, errlen, "the link's local address is not IPv4: give --rdma-gid-index");
        return -1;
    }
    /* ::ffff:a.b.c.d, the address the TCP link runs on */
    const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, ipv4[0], ipv4[1], ipv4[2], ipv4[3]};
    for (int i = 0; i < n; i++)
        if (gids[i].type == DS4_RDMA_GID_ROCE_V2 && !memcmp(gids[i].raw, want, 16)) return i;
    snprintf(err, errlen, "no RoCE v2 GID for %u.%u.%u.%u on the RDMA port (give --rdma-gid-index)", ipv4[0], ipv4[1],
             ipv4[2], ipv4[3]);
    return -1;
}

int ds4_rdma_take(ds4_rdma_message *m, const uint8_t *piece, size_t n, char *err, size_t errlen) {
    size_t skip = 0;
    if (!m->started) {
        uint64_t want = 0;
        for (size_t i = 0; i < 8 && i < n; i++) want |= (uint64_t)piece[i] << (8 * i);
        if (n < 8 || want > m->max_bytes) {
            snprintf(err, errlen, "RDMA receive: a message of %llu bytes (at most %zu here)", (unsigned long long)want,
                     m->max_bytes);
            return -1;
        }
        if (want > m->cap) {
            uint8_t *grown = realloc(m->msg, (size_t)want);
            if (!grown) {
                snprintf(err, errlen, "out of memory for an RDMA message of %llu bytes", (unsigned long long)want);
                return -1;
            }
            m->msg = grown;
            m->cap = (size_t)want;
        }
        m->want = (size_t)want;
        m->have = 0;
        m->started = true;
        skip = 8;
    }
    if (n - skip > m->want - m->have) {
        m->started = false;
        snprintf(err, errlen, "RDMA receive: a piece past its message's end");
        return -1;
    }
    if (n > skip) memcpy(m->msg + m->have, piece + skip, n - skip);
    m->have += n - skip;
    if (m->have < m->want) return 0;
    m->started = false;
    return 1;
}

void ds4_rdma_message_free(ds4_rdma_message *m) {
    free(m->msg);
    *m = (ds4_rdma_message){0};
}
