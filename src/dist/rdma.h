/* rdma.h -- tensor parallelism's RDMA transport (--transport rdma, dist/tp.h):
 * one reliable-connected queue pair per registered link, over libibverbs
 * (RoCE v2 or InfiniBand), carrying the sealed exchange frames (TP_PART)
 * with two-sided sends into receive slots the peer posted. Registration,
 * the queue pair's details (TP_RDMA, dist_proto.h) and the step and state
 * frames stay on the TCP connection.
 *
 * Contract
 * - ds4_rdma_built(): whether this build links libibverbs (the Makefile
 *   links it where its header is installed). Without it every open and
 *   probe fails with one line saying so.
 * - ds4_rdma_pick_gid() is the GID rule, a pure function of one port's
 *   table (gids[i]: index i; an all-zero GID is an empty entry): forced >=
 *   0 (--rdma-gid-index) takes that entry if it is not empty; an
 *   InfiniBand port takes its first entry; an Ethernet (RoCE) port takes
 *   the RoCE v2 entry holding the IPv4-mapped address ::ffff:a.b.c.d of
 *   ipv4, the local address of the TCP link. -1 with one line in err when
 *   nothing fits.
 * - ds4_rdma_take() assembles one message from the pieces it arrives in
 *   (ds4_rdma_send's form: the first piece starts with the length, 8 bytes
 *   little-endian, then the bytes follow in order): 1 when m->msg[0 ..
 *   m->want) is complete, 0 while pieces are due, -1 with one line for a
 *   first piece shorter than the length field, a length over m->max_bytes,
 *   a piece past the message's end, or no memory. After 1 or -1 the next
 *   piece starts a new message. The verbs side feeds it every receive.
 * - ds4_rdma_probe(): true when the named device (NULL: any) has an active
 *   port; else one line ("no active RDMA device ...").
 * - ds4_rdma_open() opens the device's first active port (the named
 *   device, or the first device with one), picks the GID, and creates the
 *   queue pair with DS4_RDMA_SLOTS receive slots of DS4_RDMA_SLOT_BYTES
 *   posted and one send slot; *mine is what the peer needs (the counter
 *   left 0; its gid points to gid_out). No memory is registered for remote
 *   access. A message larger than max_bytes is refused on receipt.
 *   ds4_rdma_connect() moves the queue pair to ready-to-send against the
 *   peer's details. NULL / false with one line.
 * - ds4_rdma_send() sends one message of len bytes: its length (8 bytes)
 *   and its bytes, in pieces of at most the smaller of the two hosts'
 *   slots, each waited for (timeout_s for each at most), meanwhile taking
 *   in what the peer sends (so two large messages crossing each other
 *   cannot both wait for slots). ds4_rdma_recv() waits up to timeout_ms
 *   for the rest of a message: 1 (buf, len: the whole message, valid until
 *   the next send or receive), 0 (not complete yet: the next call goes on
 *   where this one stopped), -1 (the queue pair failed, or a message larger
 *   than max_bytes: one line). Every slot goes back to the receive queue as
 *   soon as its piece is copied. A failed send or
 *   receive leaves the queue pair in error: the link is then set up again.
 */
#ifndef DS4_RDMA_H
#define DS4_RDMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dist/dist_proto.h"

enum ds4_rdma_gid_type { DS4_RDMA_GID_IB = 0, DS4_RDMA_GID_ROCE_V1 = 1, DS4_RDMA_GID_ROCE_V2 = 2 };
typedef struct {
    uint8_t raw[16];
    enum ds4_rdma_gid_type type;
} ds4_rdma_gid;

typedef struct {
    uint8_t *msg;
    size_t cap, want, have, max_bytes;
    bool started;
} ds4_rdma_message;
int ds4_rdma_take(ds4_rdma_message *m, const uint8_t *piece, size_t n, char *err, size_t errlen);
void ds4_rdma_message_free(ds4_rdma_message *m);

bool ds4_rdma_built(void);
int ds4_rdma_pick_gid(const ds4_rdma_gid *gids, int n, bool ethernet, const uint8_t *ipv4, int forced, char *err,
                      size_t errlen);

typedef struct ds4_rdma ds4_rdma;
bool ds4_rdma_probe(const char *device, char *err, size_t errlen);
enum { DS4_RDMA_SLOTS = 16, DS4_RDMA_SLOT_BYTES = 1 << 20 };
ds4_rdma *ds4_rdma_open(const char *device, int gid_index, const uint8_t *ipv4, size_t max_bytes,
                        ds4_dist_rdma *mine, uint8_t gid_out[16], char *err, size_t errlen);
bool ds4_rdma_connect(ds4_rdma *r, const ds4_dist_rdma *peer, char *err, size_t errlen);
int ds4_rdma_send(ds4_rdma *r, const void *buf, size_t len, double timeout_s, char *err, size_t errlen);
int ds4_rdma_recv(ds4_rdma *r, const void **buf, size_t *len, int timeout_ms, char *err, size_t errlen);
/* "DEVICE port P, GID index I", for the log */
void ds4_rdma_describe(const ds4_rdma *r, char *out, size_t outlen);
void ds4_rdma_close(ds4_rdma *r);

#endif
