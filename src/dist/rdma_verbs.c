/* rdma_verbs.c -- the RDMA transport over libibverbs (see rdma.h). */
#include "dist/rdma.h"

#include <infiniband/verbs.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ds4_rdma {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *send_cq, *recv_cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    uint8_t *buf;               /* [slots + 1][slot_bytes]: the receive slots, then the send slot */
    size_t slot_bytes, piece;   /* piece: the smaller of the two hosts' slots */
    int slots, gid_index;
    ds4_rdma_message in;        /* the message being received */
    bool complete;              /* and it is whole (ds4_rdma_recv hands it out) */
    uint8_t port;
    enum ibv_mtu mtu;
    uint32_t psn;
};

bool ds4_rdma_built(void) { return true; }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The first active port of ctx, or 0. */
static uint8_t active_port(struct ibv_context *ctx, struct ibv_port_attr *pa) {
    struct ibv_device_attr da;
    if (ibv_query_device(ctx, &da)) return 0;
    for (int p = 1; p <= da.phys_port_cnt; p++)
        if (!ibv_query_port(ctx, (uint8_t)p, pa) && pa->state == IBV_PORT_ACTIVE) return (uint8_t)p;
    return 0;
}

/* The named device (NULL: the first with an active port) opened, with that
 * port; NULL with one line. */
static struct ibv_context *open_device(const char *name, uint8_t *port, struct ibv_port_attr *pa, char *err,
                                       size_t errlen) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        if (list) ibv_free_device_list(list);
        snprintf(err, errlen, "no active RDMA device (this machine has no RDMA device: ibv_get_device_list found none)");
        return NULL;
    }
    struct ibv_context *ctx = NULL;
    bool named = false;
    for (int i = 0; i < n && !ctx; i++) {
        if (name && strcmp(ibv_get_device_name(list[i]), name)) continue;
        named = true;
        struct ibv_context *c = ibv_open_device(list[i]);
        if (!c) continue;
        if ((*port = active_port(c, pa))) ctx = c;
        else ibv_close_device(c);
    }
    ibv_free_device_list(list);
    if (!ctx) {
        if (name && !named) snprintf(err, errlen, "no active RDMA device: there is no device %s (--rdma-device)", name);
        else snprintf(err, errlen, "no active RDMA device (%s has no active port)", name ? name : "no device");
    }
    return ctx;
}

bool ds4_rdma_probe(const char *device, char *err, size_t errlen) {
    uint8_t port;
    struct ibv_port_attr pa;
    struct ibv_context *ctx = open_device(device, &port, &pa, err, errlen);
    if (ctx) ibv_close_device(ctx);
    return ctx != NULL;
}

static bool post_recv(ds4_rdma *r, int slot) {
    struct ibv_sge sge = {(uintptr_t)(r->buf + (size_t)slot * r->slot_bytes), (uint32_t)r->slot_bytes, r->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1}, *bad;
    return ibv_post_recv(r->qp, &wr, &bad) == 0;
}

void ds4_rdma_close(ds4_rdma *r) {
    if (!r) return;
    if (r->qp) ibv_destroy_qp(r->qp);
    if (r->mr) ibv_dereg_mr(r->mr);
    if (r->send_cq) ibv_destroy_cq(r->send_cq);
    if (r->recv_cq) ibv_destroy_cq(r->recv_cq);
    if (r->pd) ibv_dealloc_pd(r->pd);
    if (r->ctx) ibv_close_device(r->ctx);
    free(r->buf);
    ds4_rdma_message_free(&r->in);
    free(r);
}

ds4_rdma *ds4_rdma_open(const char *device, int gid_index, const uint8_t *ipv4, size_t max_bytes,
                        ds4_dist_rdma *mine, uint8_t gid_out[16], char *err, size_t errlen) {
    ds4_rdma *r = calloc(1, sizeof *r);
    if (!r) { snprintf(err, errlen, "out of memory"); return NULL; }
    const int slots = DS4_RDMA_SLOTS;
    const size_t slot_bytes = DS4_RDMA_SLOT_BYTES;
    r->slots = slots;
    r->slot_bytes = slot_bytes;
    r->in.max_bytes = max_bytes;
    struct ibv_port_attr pa;
    if (!(r->ctx = open_device(device, &r->port, &pa, err, errlen))) { ds4_rdma_close(r); return NULL; }
    r->mtu = pa.active_mtu;
    /* the port's GID table, for the rule in rdma.c */
    const int n = pa.gid_tbl_len;
    ds4_rdma_gid *gids = calloc((size_t)(n > 0 ? n : 1), sizeof *gids);
    if (!gids) { snprintf(err, errlen, "out of memory"); ds4_rdma_close(r); return NULL; }
    for (int i = 0; i < n; i++) {
        struct ibv_gid_entry e;
        if (ibv_query_gid_ex(r->ctx, r->port, (uint32_t)i, &e, 0)) continue;   /* an empty entry stays zeros */
        memcpy(gids[i].raw, e.gid.raw, 16);
        gids[i].type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? DS4_RDMA_GID_ROCE_V2
                       : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? DS4_RDMA_GID_ROCE_V1
                                                            : DS4_RDMA_GID_IB;
    }
    r->gid_index = ds4_rdma_pick_gid(gids, n, pa.link_layer == IBV_LINK_LAYER_ETHERNET, ipv4, gid_index, err, errlen);
    if (r->gid_index >= 0) memcpy(gid_out, gids[r->gid_index].raw, 16);
    free(gids);
    if (r->gid_index < 0) { ds4_rdma_close(r); return NULL; }
    const size_t bytes = (size_t)(slots + 1) * slot_bytes;
    r->buf = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    r->pd = r->buf ? ibv_alloc_pd(r->ctx) : NULL;
    r->send_cq = r->pd ? ibv_create_cq(r->ctx, 4, NULL, NULL, 0) : NULL;
    r->recv_cq = r->send_cq ? ibv_create_cq(r->ctx, slots, NULL, NULL, 0) : NULL;
    /* local write only: the peer sends into posted slots, it never writes or reads this memory */
    r->mr = r->recv_cq ? ibv_reg_mr(r->pd, r->buf, bytes, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (r->mr) {
        struct ibv_qp_init_attr qa = {.send_cq = r->send_cq, .recv_cq = r->recv_cq, .qp_type = IBV_QPT_RC,
                                      .cap = {.max_send_wr = 2, .max_recv_wr = (uint32_t)slots, .max_send_sge = 1,
                                              .max_recv_sge = 1}};
        r->qp = ibv_create_qp(r->pd, &qa);
    }
    if (!r->qp) {
        snprintf(err, errlen, "cannot set up an RDMA queue pair on %s port %u: %s", ibv_get_device_name(r->ctx->device),
                 r->port, strerror(errno));
        ds4_rdma_close(r);
        return NULL;
    }
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = r->port, .qp_access_flags = 0};
    bool ok = !ibv_modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    for (int s = 0; ok && s < slots; s++) ok = post_recv(r, s);
    uint8_t rnd[4];
    ok = ok && ds4_dist_random(rnd, sizeof rnd);
    if (!ok) {
        snprintf(err, errlen, "cannot prepare the RDMA queue pair: %s", strerror(errno));
        ds4_rdma_close(r);
        return NULL;
    }
    r->psn = ((uint32_t)rnd[0] | (uint32_t)rnd[1] << 8 | (uint32_t)rnd[2] << 16) & 0xffffff;
    *mine = (ds4_dist_rdma){0, r->qp->qp_num, r->psn, pa.lid, gid_out, (uint8_t)r->mtu, (uint32_t)slots,
                            (uint32_t)slot_bytes};
    return r;
}

bool ds4_rdma_connect(ds4_rdma *r, const ds4_dist_rdma *peer, char *err, size_t errlen) {
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                            .path_mtu = peer->mtu < r->mtu ? (enum ibv_mtu)peer->mtu : r->mtu,
                            .dest_qp_num = peer->qpn,
                            .rq_psn = peer->psn,
                            .max_dest_rd_atomic = 1,
                            .min_rnr_timer = 12,
                            .ah_attr = {.is_global = 1, .dlid = peer->lid, .port_num = r->port,
                                        .grh = {.sgid_index = (uint8_t)r->gid_index, .hop_limit = 64}}};
    memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
    int rc = ibv_modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (!rc) {
        /* rnr_retry 7: a send waits (retries without end) while the peer
         * has not reposted a slot yet */
        a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
                                 .sq_psn = r->psn, .max_rd_atomic = 1};
        rc = ibv_modify_qp(r->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    }
    if (rc) {
        snprintf(err, errlen, "cannot connect the RDMA queue pair to the peer's (qpn %u): %s", peer->qpn, strerror(rc));
        return false;
    }
    r->piece = peer->slot_bytes < r->slot_bytes ? peer->slot_bytes : r->slot_bytes;
    return true;
}

/* One piece (a receive completion) into the message being assembled, its
 * slot posted again; -1 with err. */
static int take_piece(ds4_rdma *r, const struct ibv_wc *wc, char *err, size_t errlen) {
    if (wc->status != IBV_WC_SUCCESS) {
        snprintf(err, errlen, "RDMA receive failed: %s", ibv_wc_status_str(wc->status));
        return -1;
    }
    const int slot = (int)wc->wr_id;
    const int got = ds4_rdma_take(&r->in, r->buf + (size_t)slot * r->slot_bytes, wc->byte_len, err, errlen);
    if (got < 0) return -1;
    if (!post_recv(r, slot)) {
        snprintf(err, errlen, "RDMA receive: cannot post a slot again: %s", strerror(errno));
        return -1;
    }
    r->complete = got == 1;
    return 0;
}

/* Takes the receive completions there are now, up to the end of a message
 * (the next one waits for ds4_rdma_recv): a host that sends also drains
 * what the other sends at the same time, so two large messages crossing
 * each other cannot both wait for slots. -1 with err. */
static int pump(ds4_rdma *r, char *err, size_t errlen) {
    struct ibv_wc wc;
    while (!r->complete) {
        const int n = ibv_poll_cq(r->recv_cq, 1, &wc);
        if (n < 0) { snprintf(err, errlen, "RDMA receive: polling the completion queue failed"); return -1; }
        if (n == 0) return 0;
        if (take_piece(r, &wc, err, errlen)) return -1;
    }
    return 0;
}

/* One send completion within timeout_s, receiving meanwhile: 1, 0 (none),
 * -1 (a failed one: err). */
static int wait_send(ds4_rdma *r, double timeout_s, char *err, size_t errlen) {
    const double deadline = now() + timeout_s;
    struct ibv_wc wc;
    for (unsigned spin = 0;; spin++) {
        const int n = ibv_poll_cq(r->send_cq, 1, &wc);
        if (n < 0) { snprintf(err, errlen, "RDMA send: polling the completion queue failed"); return -1; }
        if (n == 1) {
            if (wc.status == IBV_WC_SUCCESS) return 1;
            snprintf(err, errlen, "RDMA send failed: %s", ibv_wc_status_str(wc.status));
            return -1;
        }
        if (pump(r, err, errlen)) return -1;
        /* the clock is read every 256 empty polls: polling is the latency */
        if ((spin & 255) == 255 && now() > deadline) return 0;
    }
}

/* One piece from the send slot, waited for. */
static int send_piece(ds4_rdma *r, size_t len, double timeout_s, char *err, size_t errlen) {
    uint8_t *slot = r->buf + (size_t)r->slots * r->slot_bytes;
    struct ibv_sge sge = {(uintptr_t)slot, (uint32_t)len, r->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = (uint64_t)r->slots, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    if (ibv_post_send(r->qp, &wr, &bad)) {
        snprintf(err, errlen, "RDMA send: cannot post it: %s", strerror(errno));
        return -1;
    }
    const int got = wait_send(r, timeout_s, err, errlen);
    if (got == 0) snprintf(err, errlen, "RDMA send: no completion within %.0f s", timeout_s);
    return got == 1 ? 0 : -1;
}

int ds4_rdma_send(ds4_rdma *r, const void *buf, size_t len, double timeout_s, char *err, size_t errlen) {
    uint8_t *slot = r->buf + (size_t)r->slots * r->slot_bytes;
    const uint8_t *p = buf;
    /* the first piece starts with the message's length (8 bytes, little-endian) */
    for (int i = 0; i < 8; i++) slot[i] = (uint8_t)((uint64_t)len >> (8 * i));
    size_t at = 8, done = 0;
    do {
        const size_t n = len - done < r->piece - at ? len - done : r->piece - at;
        memcpy(slot + at, p + done, n);
        done += n;
        if (send_piece(r, at + n, timeout_s, err, errlen)) return -1;
        at = 0;
    } while (done < len);
    return 0;
}

int ds4_rdma_recv(ds4_rdma *r, const void **buf, size_t *len, int timeout_ms, char *err, size_t errlen) {
    const double deadline = now() + timeout_ms * 1e-3;
    for (unsigned spin = 0; !r->complete; spin++) {
        if (pump(r, err, errlen)) return -1;
        if (!r->complete && (spin & 255) == 255 && now() > deadline) return 0;
    }
    r->complete = false;
    *buf = r->in.msg;
    *len = r->in.want;
    return 1;
}

void ds4_rdma_describe(const ds4_rdma *r, char *out, size_t outlen) {
    snprintf(out, outlen, "%s port %u, GID index %d", ibv_get_device_name(r->ctx->device), r->port, r->gid_index);
}
