/* test_rdma.c -- the RDMA transport's parts that run without an RDMA
 * device (dist/rdma.h):
 * - the GID rule on synthetic GID tables: the RoCE v2 entry holding the
 *   link's IPv4 address (not its RoCE v1 twin, not another address, not a
 *   link-local one), --rdma-gid-index taken as given unless its entry is
 *   missing or empty, the first entry on an InfiniBand port, and one line
 *   when nothing fits;
 * - a message assembled from its pieces (ds4_rdma_take): whole in one
 *   piece, across three, an empty one, and one line for a first piece
 *   shorter than the length, a length over the limit, a piece past the end
 *   (the next message then assembles again);
 * - the refusals: --transport rdma on a host without an active device (or
 *   in a build without libibverbs) gives rdma.h's one line, and --transport
 *   auto becomes tcp there (rdma where a device is active). */
#include "check.h"
#include "dist/dist.h"
#include "dist/rdma.h"

#include <string.h>

static ds4_rdma_gid v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d, enum ds4_rdma_gid_type t) {
    return (ds4_rdma_gid){{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d}, t};
}

static ds4_rdma_gid link_local(enum ds4_rdma_gid_type t) {
    return (ds4_rdma_gid){{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55}, t};
}

static void test_pick(void) {
    char err[256];
    const ds4_rdma_gid roce[] = {link_local(DS4_RDMA_GID_ROCE_V1), link_local(DS4_RDMA_GID_ROCE_V2),
                                 v4(10, 77, 0, 1, DS4_RDMA_GID_ROCE_V1), v4(10, 77, 0, 1, DS4_RDMA_GID_ROCE_V2),
                                 v4(10, 77, 0, 2, DS4_RDMA_GID_ROCE_V2), {{0}, DS4_RDMA_GID_ROCE_V2}};
    const int n = sizeof roce / sizeof *roce;
    const uint8_t a1[4] = {10, 77, 0, 1}, a2[4] = {10, 77, 0, 2}, a9[4] = {10, 77, 0, 9};
    CHECK(ds4_rdma_pick_gid(roce, n, true, a1, -1, err, sizeof err) == 3, "10.77.0.1: the RoCE v2 entry");
    CHECK(ds4_rdma_pick_gid(roce, n, true, a2, -1, err, sizeof err) == 4, "10.77.0.2");
    CHECK(ds4_rdma_pick_gid(roce, n, true, a9, -1, err, sizeof err) == -1 &&
              !strcmp(err, "no RoCE v2 GID for 10.77.0.9 on the RDMA port (give --rdma-gid-index)"),
          "an address the port does not hold: %s", err);
    /* only a RoCE v1 entry for the address */
    const ds4_rdma_gid v1_only[] = {v4(10, 77, 0, 1, DS4_RDMA_GID_ROCE_V1)};
    CHECK(ds4_rdma_pick_gid(v1_only, 1, true, a1, -1, err, sizeof err) == -1, "a RoCE v1 entry taken");
    CHECK(ds4_rdma_pick_gid(roce, n, true, NULL, -1, err, sizeof err) == -1 &&
              !strcmp(err, "the link's local address is not IPv4: give --rdma-gid-index"), "no IPv4: %s", err);
    /* --rdma-gid-index */
    CHECK(ds4_rdma_pick_gid(roce, n, true, a9, 1, err, sizeof err) == 1, "a forced index");
    CHECK(ds4_rdma_pick_gid(roce, n, true, a1, 9, err, sizeof err) == -1 &&
              !strcmp(err, "--rdma-gid-index 9: the port's GID table has no entry 9 (6 entries)"), "past the table: %s",
          err);
    CHECK(ds4_rdma_pick_gid(roce, n, true, a1, 5, err, sizeof err) == -1, "an empty entry forced");
    /* InfiniBand: the first entry that is there, whatever the address */
    const ds4_rdma_gid ib[] = {{{0}, DS4_RDMA_GID_IB}, link_local(DS4_RDMA_GID_IB)};
    CHECK(ds4_rdma_pick_gid(ib, 2, false, a1, -1, err, sizeof err) == 1, "InfiniBand");
    CHECK(ds4_rdma_pick_gid(ib, 1, false, NULL, -1, err, sizeof err) == -1 &&
              !strcmp(err, "the InfiniBand port's GID table is empty"), "an empty InfiniBand table: %s", err);
}

/* The pieces of a message as ds4_rdma_send cuts them: the length first. */
static size_t first_piece(uint8_t *out, uint64_t len, const char *bytes, size_t n) {
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(len >> (8 * i));
    memcpy(out + 8, bytes, n);
    return 8 + n;
}

static void test_take(void) {
    char err[256];
    ds4_rdma_message m = {.max_bytes = 64};
    uint8_t p[80];
    size_t n = first_piece(p, 5, "hello", 5);
    CHECK(ds4_rdma_take(&m, p, n, err, sizeof err) == 1 && m.want == 5 && !memcmp(m.msg, "hello", 5), "one piece");
    n = first_piece(p, 11, "abc", 3);
    CHECK(ds4_rdma_take(&m, p, n, err, sizeof err) == 0, "the first of three");
    CHECK(ds4_rdma_take(&m, (const uint8_t *)"defg", 4, err, sizeof err) == 0, "the second of three");
    CHECK(ds4_rdma_take(&m, (const uint8_t *)"hijk", 4, err, sizeof err) == 1 && m.want == 11 &&
              !memcmp(m.msg, "abcdefghijk", 11), "three pieces");
    n = first_piece(p, 0, "", 0);
    CHECK(ds4_rdma_take(&m, p, n, err, sizeof err) == 1 && m.want == 0, "an empty message");
    CHECK(ds4_rdma_take(&m, p, 7, err, sizeof err) == -1 && strstr(err, "a message of"), "a short first piece: %s",
          err);
    n = first_piece(p, 65, "x", 1);
    CHECK(ds4_rdma_take(&m, p, n, err, sizeof err) == -1 &&
              !strcmp(err, "RDMA receive: a message of 65 bytes (at most 64 here)"), "over the limit: %s", err);
    n = first_piece(p, 4, "abcdef", 6);
    CHECK(ds4_rdma_take(&m, p, n, err, sizeof err) == -1 && !strcmp(err, "RDMA receive: a piece past its message's end"),
          "past the end: %s", err);
    n = first_piece(p, 2, "ok", 2);
    CHECK(ds4_rdma_take(&m, p, n, err, sizeof err) == 1 && m.want == 2 && !memcmp(m.msg, "ok", 2),
          "the message after a refused one");
    ds4_rdma_message_free(&m);
}

static void test_refusals(void) {
    char err[300], probe[300];
    const bool active = ds4_rdma_probe(NULL, probe, sizeof probe);
    if (!ds4_rdma_built()) CHECK(!active && strstr(probe, "no RDMA transport"), "unbuilt probe: %s", probe);
    else if (!active) CHECK(!strncmp(probe, "no active RDMA device", 21), "probe: %s", probe);
    ds4_dist_params p = {.role = DS4_DIST_WORKER, .host = "127.0.0.1", .port = 1, .tp = true, .transport_set = true,
                         .transport_rdma = true};
    const bool ok = ds4_dist_finish_options(&p, true, err, sizeof err);
    CHECK(ok == active && (active || !strcmp(err, probe)), "--transport rdma: %s", ok ? "accepted" : err);
    p = (ds4_dist_params){.role = DS4_DIST_WORKER, .host = "127.0.0.1", .port = 1, .tp = true, .transport_set = true,
                          .transport_auto = true};
    CHECK(ds4_dist_finish_options(&p, true, err, sizeof err) && p.transport_rdma == active && !p.transport_auto,
          "--transport auto: %s", err);
    /* a named device that is not there */
    p = (ds4_dist_params){.role = DS4_DIST_WORKER, .host = "127.0.0.1", .port = 1, .tp = true, .transport_set = true,
                          .transport_rdma = true, .rdma_device = "ds4-no-such-device"};
    CHECK(!ds4_dist_finish_options(&p, true, err, sizeof err) &&
              (strstr(err, "no active RDMA device") || strstr(err, "no RDMA transport")), "a missing device: %s", err);
}

int main(void) {
    test_pick();
    test_take();
    test_refusals();
    return check_done("test_rdma");
}
