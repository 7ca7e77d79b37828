/* rdma_none.c -- the RDMA transport of a build without libibverbs (see
 * rdma.h): every open and probe says so in one line. */
#include "dist/rdma.h"

#include <stdio.h>

static const char NOT_BUILT[] = "--transport rdma: this build has no RDMA transport (it was built without "
                                "libibverbs); use --transport tcp";

bool ds4_rdma_built(void) { return false; }

bool ds4_rdma_probe(const char *device, char *err, size_t errlen) {
    (void)device;
    snprintf(err, errlen, "%s", NOT_BUILT);
    return false;
}

ds4_rdma *ds4_rdma_open(const char *device, int gid_index, const uint8_t *ipv4, size_t max_bytes,
                        ds4_dist_rdma *mine, uint8_t gid_out[16], char *err, size_t errlen) {
    (void)device, (void)gid_index, (void)ipv4, (void)max_bytes, (void)mine, (void)gid_out;
    snprintf(err, errlen, "%s", NOT_BUILT);
    return NULL;
}

bool ds4_rdma_connect(ds4_rdma *r, const ds4_dist_rdma *peer, char *err, size_t errlen) {
    (void)r, (void)peer;
    snprintf(err, errlen, "%s", NOT_BUILT);
    return false;
}

int ds4_rdma_send(ds4_rdma *r, const void *buf, size_t len, double timeout_s, char *err, size_t errlen) {
    (void)r, (void)buf, (void)len, (void)timeout_s;
    snprintf(err, errlen, "%s", NOT_BUILT);
    return -1;
}

int ds4_rdma_recv(ds4_rdma *r, const void **buf, size_t *len, int timeout_ms, char *err, size_t errlen) {
    (void)r, (void)buf, (void)len, (void)timeout_ms;
    snprintf(err, errlen, "%s", NOT_BUILT);
    return -1;
}

void ds4_rdma_describe(const ds4_rdma *r, char *out, size_t outlen) {
    (void)r;
    snprintf(out, outlen, "no RDMA");
}
void ds4_rdma_close(ds4_rdma *r) { (void)r; }
