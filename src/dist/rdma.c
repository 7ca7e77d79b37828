/* rdma.c -- the GID rule of the RDMA transport (see rdma.h); the verbs
 * side is rdma_verbs.c (or rdma_none.c in a build without libibverbs). */
#include "dist/rdma.h"

#include <stdio.h>
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
