/* dist.c -- coordinator backend and worker loop over NNG (see dist.h). */
#include "dist/dist.h"
#include "backends/backend.h"
#include "dist/dist_net.h"
#include "dist/dist_proto.h"
#include "dist/tp.h"
#include "models/dsv4/kv.h"
#include "models/dsv4/model.h"
#include "base/log.h"
#include "nn/steering.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/supplemental/util/platform.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* POLL_MS: how often a waiting coordinator looks at its workers'
 * connections; SEND_QUEUE: frames a push socket holds while the next hop is
 * busy (more than any prefill window, so a send never blocks a stage);
 * FIRST_ANSWER_MS: how long a starting worker waits for the coordinator
 * before it says that no answer came (and keeps trying). */
enum { MAX_WORKERS = DS4_DIST_MAX_HOPS - 1, MAX_SESSIONS = 16, REWIND_SLACK = 256, POLL_MS = 100, SEND_QUEUE = 64,
       CHUNKS_PER_CALL = 8, MAX_PENDING = 32, CHALLENGE_TTL_S = 10, MAX_CKPT = 16,
       MAX_ROUTES_KEPT = 64, FIRST_ANSWER_MS = 5000, URL_MAX = 200 };

/* The largest message a registration (control) socket takes: KNOCK,
 * CHALLENGE, HELLO and the answers are a few hundred bytes. NNG refuses a
 * longer one by its length prefix, before buffering anything of it. */
#define CONTROL_MAX ((size_t)64 << 10)

bool ds4_dist_finish_options(ds4_dist_params *p, bool worker_ok, char *err, size_t errlen) {
    if (p->role == DS4_DIST_WORKER && !worker_ok) {
        snprintf(err, errlen, "workers run as ./ds4 --role worker; this binary can only be the coordinator");
        return false;
    }
    if (!p->secret) p->secret = getenv("DS4_DIST_SECRET");
    if (!p->secret) p->secret = "";
    if (p->role == DS4_DIST_NONE && p->host) { snprintf(err, errlen, "--listen/--coordinator need --role"); return false; }
    if (p->role != DS4_DIST_NONE && !p->host) {
        snprintf(err, errlen, "--role %s needs %s HOST PORT", p->role == DS4_DIST_WORKER ? "worker" : "coordinator",
                 p->role == DS4_DIST_WORKER ? "--coordinator" : "--listen");
        return false;
    }
    if (p->role == DS4_DIST_WORKER && p->activation_bits > 0) {
        snprintf(err, errlen, "--dist-activation-bits goes to the coordinator: it chooses the format for the whole route");
        return false;
    }
    if (p->activation_bits <= 0) p->activation_bits = 32;
    if (!p->tls_cert != !p->tls_key || !p->tls_cert != !p->tls_ca) {
        snprintf(err, errlen, "TLS needs all of --dist-tls-cert, --dist-tls-key and --dist-tls-ca");
        return false;
    }
    if (!p->tp && (p->tp_token_prefill || p->transport_set)) {
        snprintf(err, errlen, "%s goes with --tensor-parallel",
                 p->tp_token_prefill ? "--tensor-parallel-token-prefill" : "--transport");
        return false;
    }
    if (!p->transport_rdma && !p->transport_auto && (p->rdma_device || p->rdma_gid_set)) {
        snprintf(err, errlen, "%s goes with --transport rdma", p->rdma_device ? "--rdma-device" : "--rdma-gid-index");
        return false;
    }
    if (!ds4_tp_check_options(p, err, errlen)) return false;
    if (p->wait_seconds <= 0) p->wait_seconds = 30;
    if (p->reply_seconds <= 0) p->reply_seconds = 120;
    if (p->prefill_window <= 0) p->prefill_window = 2;
    return true;
}


/* Who this process is, as a HELLO says it. */
static ds4_dist_hello identity(const ds4_model *m, bool numerics, int ctx, const char *url, const uint8_t *nonce,
                               const ds4_dist_params *p) {
    const ds4_layer_slice *sl = &m->slice;
    ds4_dist_hello h = {NULL, nonce, m->name, strlen(m->name), (uint32_t)m->cfg.n_layer,
                        (uint32_t)m->cfg.n_embd, (uint32_t)m->cfg.n_hc, (uint32_t)m->cfg.n_vocab,
                        (uint32_t)ds4_model_expert_bits(m), (uint32_t)sl->first, (uint32_t)sl->last, sl->output,
                        (uint32_t)ctx, url, url ? strlen(url) : 0, numerics, {0}};
    if (p->steer_dir) memcpy(h.steering, p->steer_sha1, sizeof h.steering);
    return h;
}



static uint32_t elapsed_us(double since) {
    const double us = (ds4_dist_now() - since) * 1e6;
    return us > 4e9 ? 4000000000u : (uint32_t)us;
}


/* A push socket dialed to url; sends queue instead of blocking while the
 * peer is busy. The dial does not wait for the connection (a peer that
 * accepts TCP but never answers, e.g. a stopped process, would block it
 * for good): frames queue until it is up, and whoever waits for the answer
 * bounds the wait. When closed is given, the closed connection's socket id
 * is stored there (the watch is set before the dial, so no closing can be
 * missed). */
static int open_push(nng_socket *s, const char *url, const ds4_dist_tls *t, double timeout_s, atomic_int *closed) {
    int rv = nng_push0_open(s);
    if (rv) return rv;
    nng_socket_set_ms(*s, NNG_OPT_SENDTIMEO, (nng_duration)(timeout_s * 1000));
    nng_socket_set_int(*s, NNG_OPT_SENDBUF, SEND_QUEUE);
    if (closed) rv = nng_pipe_notify(*s, NNG_PIPE_EV_REM_POST, ds4_dist_on_pipe_removed, closed);
    if (!rv) rv = ds4_dist_dial(*s, url, t);
    if (rv) nng_close(*s);
    return rv;
}

/* The address of this host on the way to host:port, as a URL host part
 * ("10.0.0.2", "[fe80::1]"): a worker's data socket listens there, so the
 * coordinator and the other workers reach it over the network they share.
 * A connected UDP socket only asks the routing table; nothing is sent. */
static bool local_address_towards(const char *host, int port, char *out, size_t outlen, char *err, size_t errlen) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV}, *res = NULL;
    const int gai = getaddrinfo(host, service, &hints, &res);
    if (gai) { snprintf(err, errlen, "cannot resolve %s: %s", host, gai_strerror(gai)); return false; }
    bool ok = false;
    for (const struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
        const int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
        struct sockaddr_storage local;
        socklen_t len = sizeof local;
        char ip[INET6_ADDRSTRLEN];
        if (fd >= 0 && !connect(fd, ai->ai_addr, ai->ai_addrlen) && !getsockname(fd, (struct sockaddr *)&local, &len)) {
            const bool v6 = local.ss_family == AF_INET6;
            const void *a = v6 ? (const void *)&((struct sockaddr_in6 *)&local)->sin6_addr
                               : (const void *)&((struct sockaddr_in *)&local)->sin_addr;
            if (inet_ntop(local.ss_family, a, ip, sizeof ip))
                ok = snprintf(out, outlen, v6 ? "[%s]" : "%s", ip) < (int)outlen;
        }
        if (fd >= 0) close(fd);
    }
    freeaddrinfo(res);
    if (!ok) snprintf(err, errlen, "no local address routes to %s", host);
    return ok;
}

/* Seals under the receiver's link key (dist_proto.h), sends and frees msg
 * (NULL: out of memory). */
static int send_frame(nng_socket s, const uint8_t *key, uint8_t *msg, size_t len) {
    msg = ds4_dist_seal(msg, &len, key, DS4_DIST_SEAL_BYTES);
    int rv = msg ? nng_send(s, msg, len, 0) : NNG_ENOMEM;
    free(msg);
    return rv;
}

/* The ring checkpoints of one session at the positions the engine takes
 * its own (engine.c): at the end of an engine call once `every` positions
 * passed since the last one, at most MAX_CKPT, thinned to every other one
 * (and `every` doubled) when full. A deep rewind makes the engine restore
 * one of its checkpoints and compute on from there; workers holding a
 * checkpoint at that very position restore theirs instead of being
 * replayed from position 0. The coordinator keeps the positions only (it
 * decides which WORK frame carries the checkpoint flag, at the end of an
 * engine call); workers keep the rings too, in slots allocated with the
 * first one. */
typedef struct {
    int pos[MAX_CKPT], n;
    void *slot[MAX_CKPT];   /* worker: one ring checkpoint each */
    void *block;
} ckpt_list;

static void ckpt_drop_after(ckpt_list *k, int pos) {
    while (k->n && k->pos[k->n - 1] > pos) k->n--;
}

/* Appends pos, first thinning a full list as the engine does; true when it
 * thinned. */

/* The sealed frames a slice's data port legitimately takes: WORK of up to
 * max_tokens tokens (their hidden states in f32, the widest format) and
 * KV_PUT of a whole ctx-token session of the slice's layers. */
static size_t slice_frame_max(const ds4_config *cfg, int first, int last, int ctx, size_t max_tokens) {
    const size_t hcE = (size_t)cfg->n_hc * cfg->n_embd;
    const size_t work = ds4_dist_work_frame_max(max_tokens, max_tokens * hcE);
    const size_t kv = ds4_dist_work_frame_max((size_t)ctx,
                                              ds4_kv_bytes_for_layers(cfg, ctx, REWIND_SLACK, first, last) / sizeof(float));
    return work > kv ? work : kv;
}

static bool ckpt_push(ckpt_list *k, int pos) {
    const bool thin = k->n == MAX_CKPT;
    if (thin) k->n = ds4_kv_ckpt_thin(k->pos, k->slot, MAX_CKPT);
    k->pos[k->n++] = pos;
    return thin;
}

/* ================================================================ coordinator */

/* A registration, written by the control thread under mu. */
typedef struct {
    bool live;
    int first, last;
    bool output;
    char url[160];
    uint8_t nonce[DS4_DIST_NONCE_BYTES];   /* the worker's registration nonce Nr */
    int ctx;
} worker_reg;

/* A challenge sent and not yet answered (control thread only): each is
 * taken by the first HELLO that names it, so a recorded HELLO replayed
 * later finds none, and it lapses after CHALLENGE_TTL_S. */
typedef struct {
    bool live;
    double expires;
    uint8_t nonce_w[DS4_DIST_NONCE_BYTES], nonce_c[DS4_DIST_NONCE_BYTES];
} challenge;

/* One hop of the formed route, owned by the eval thread: the coordinator
 * keeps a push connection to every worker (ROUTE and KV frames, and the
 * first hop's WORK); a closed connection is how a dead worker shows. */
typedef struct {
    int first, last;
    bool output;
    char url[160];
    uint8_t nonce[DS4_DIST_NONCE_BYTES];
    uint8_t key[DS4_DIST_SEAL_BYTES];   /* its link key: every frame to it is sealed so */
    nng_socket data;
    bool open;
    atomic_int closed_socket;     /* id of a socket whose connection went away (pipe callback) */
} hop;

/* What the route has seen of one session: its tokens and the rolling hash
 * after each prefix, so a rewind knows the hash at any earlier position and
 * a replay has the tokens; and the positions of the workers' checkpoints. */
typedef struct {
    const struct ds4_kv *kv;
    uint64_t id;
    int32_t *toks;
    uint64_t *hashes;       /* [cap + 1]: hashes[i] after i tokens */
    int n, cap;
    ckpt_list ckpts;        /* positions only */
    int ckpt_every;
    ds4_steering steer;     /* the scales of the latest span (a replay recomputes with them) */
} session_rec;

typedef struct {
    ds4_backend base;
    ds4_backend *local;
    const ds4_model *m;
    ds4_dist_params p;
    ds4_dist_hello me;
    ds4_dist_tls tls;
    nng_socket control, results;
    char home[URL_MAX];
    uint8_t home_nonce[DS4_DIST_NONCE_BYTES];        /* Nh, drawn at start */
    uint8_t results_key[DS4_DIST_SEAL_BYTES];        /* the link key results are sealed with */
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t changed;
    worker_reg regs[MAX_WORKERS];   /* under mu */
    char refused[320];              /* under mu: the latest refusal, which an incomplete route names */
    challenge pending[MAX_PENDING]; /* control thread */
    uint64_t gen;                   /* under mu: bumped when the registrations change; the route id */
    uint64_t route_id;              /* the gen the hops were formed for; 0: none */
    hop hops[MAX_WORKERS];
    int n_hops;
    uint32_t seq;
    uint64_t next_session;
    session_rec **sessions;         /* one allocation each: a call holds pointers across session_of() */
    int n_sessions;
    float *hidden;
    size_t hidden_cap;
    int chunk;
    uint8_t act;                    /* enum ds4_dist_act of --dist-activation-bits */
} coord;

/* A registration: refused when incompatible or overlapping a live worker
 * other than one for the same slice (that one is a restart and is replaced). */
static uint8_t *handle_hello(coord *c, const ds4_dist_hello *h, size_t *len) {
    char why[256];
    if (!ds4_dist_hello_compatible(&c->me, h, why, sizeof why)) {
        /* the worker prints it; the coordinator's incomplete route says it too */
        pthread_mutex_lock(&c->mu);
        snprintf(c->refused, sizeof c->refused, "; a worker for layers %u..%u was %s", h->first, h->last, why);
        pthread_mutex_unlock(&c->mu);
        return ds4_dist_encode_text(DS4_DIST_REFUSED, why, len);
    }
    if ((int)h->first <= c->m->slice.last) {
        snprintf(why, sizeof why, "refused: layers %u..%u overlap the coordinator's 0..%d", h->first, h->last,
                 c->m->slice.last);
        return ds4_dist_encode_text(DS4_DIST_REFUSED, why, len);
    }
    if (h->data_url_len == 0 || h->data_url_len >= sizeof c->regs[0].url) {
        snprintf(why, sizeof why, "refused: no usable data address");
        return ds4_dist_encode_text(DS4_DIST_REFUSED, why, len);
    }
    pthread_mutex_lock(&c->mu);
    worker_reg *slot = NULL;
    for (int i = 0; i < MAX_WORKERS; i++) {
        worker_reg *w = &c->regs[i];
        if (!w->live) { if (!slot) slot = w; continue; }
        if (w->first == (int)h->first && w->last == (int)h->last && w->output == h->output) {
            /* the same process (its nonce); a restarted one is a new registration */
            if (strlen(w->url) == h->data_url_len && !memcmp(w->url, h->data_url, h->data_url_len) &&
                ds4_dist_same(w->nonce, h->nonce, DS4_DIST_NONCE_BYTES)) {
                pthread_mutex_unlock(&c->mu);   /* a heartbeat of a registered worker */
                return ds4_dist_encode_text(DS4_DIST_WELCOME, "registered", len);
            }
            slot = w;
            break;
        }
        if ((int)h->first <= w->last && (int)h->last >= w->first) {
            snprintf(why, sizeof why, "refused: layers %u..%u overlap a registered worker's %d..%d", h->first,
                     h->last, w->first, w->last);
            pthread_mutex_unlock(&c->mu);
            return ds4_dist_encode_text(DS4_DIST_REFUSED, why, len);
        }
    }
    if (!slot) {
        pthread_mutex_unlock(&c->mu);
        return ds4_dist_encode_text(DS4_DIST_REFUSED, "refused: too many workers", len);
    }
    *slot = (worker_reg){true, (int)h->first, (int)h->last, h->output, "", {0}, (int)h->ctx};
    memcpy(slot->url, h->data_url, h->data_url_len);
    memcpy(slot->nonce, h->nonce, DS4_DIST_NONCE_BYTES);
    c->gen++;
    if (c->p.debug)
        ds4_log(DS4_LOG_DEBUG, "ds4 coordinator: worker registered: layers %d..%d%s at %s\n", slot->first, slot->last,
                slot->output ? " + output" : "", slot->url);
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->mu);
    return ds4_dist_encode_text(DS4_DIST_WELCOME, "registered", len);
}

/* KNOCK: a fresh challenge (taking a lapsed slot, else the oldest) and the
 * coordinator's proof over both nonces. */
static uint8_t *answer_knock(coord *c, const uint8_t *nonce_w, size_t *len) {
    challenge *ch = &c->pending[0];
    for (int i = 0; i < MAX_PENDING && ch->live; i++)
        if (!c->pending[i].live || c->pending[i].expires < ch->expires) ch = &c->pending[i];
    if (!ds4_dist_random(ch->nonce_c, DS4_DIST_NONCE_BYTES))
        return ds4_dist_encode_text(DS4_DIST_REFUSED, "refused: the coordinator cannot draw a random nonce", len);
    memcpy(ch->nonce_w, nonce_w, DS4_DIST_NONCE_BYTES);
    ch->live = true;
    ch->expires = ds4_dist_now() + CHALLENGE_TTL_S;
    uint8_t proof[DS4_DIST_SEAL_BYTES];
    ds4_dist_handshake_key(c->p.secret, DS4_DIST_COORDINATOR_PROOF, ch->nonce_w, ch->nonce_c, proof);
    return ds4_dist_encode_challenge(ch->nonce_c, proof, len);
}

/* A sealed HELLO: its challenge is taken (used once), the seal checked with
 * the handshake key, and the answer sealed with the same key. */
static uint8_t *answer_hello(coord *c, const uint8_t *buf, size_t n, const ds4_dist_hello *h, size_t *len) {
    challenge *ch = NULL;
    const double now = ds4_dist_now();
    for (int i = 0; i < MAX_PENDING && !ch; i++)
        if (c->pending[i].live && c->pending[i].expires >= now &&
            ds4_dist_same(c->pending[i].nonce_c, h->challenge, DS4_DIST_NONCE_BYTES))
            ch = &c->pending[i];
    if (!ch)
        return ds4_dist_encode_text(DS4_DIST_REFUSED, "refused: a HELLO for an unknown, used or lapsed challenge "
                                                      "(replayed?)", len);
    ch->live = false;
    uint8_t key[DS4_DIST_SEAL_BYTES];
    ds4_dist_handshake_key(c->p.secret, DS4_DIST_HANDSHAKE_KEY, ch->nonce_w, ch->nonce_c, key);
    size_t frame_len;
    uint8_t *reply = ds4_dist_unseal(buf, n, key, sizeof key, &frame_len)
                         ? handle_hello(c, h, len)
                         : ds4_dist_encode_text(DS4_DIST_REFUSED, "refused: wrong --dist-secret (the HELLO's seal "
                                                                  "does not check)", len);
    return ds4_dist_seal(reply, len, key, sizeof key);
}

static void *control_loop(void *arg) {
    coord *c = arg;
    while (!atomic_load(&c->stop)) {
        void *buf;
        size_t len;
        if (nng_recv(c->control, &buf, &len, NNG_FLAG_ALLOC)) continue;   /* timeout: look at stop */
        ds4_dist_frame f;
        char err[256];
        size_t rlen = 0;
        uint8_t *reply;
        /* a HELLO is sealed under a key its challenge names: decoded before the seal is checked */
        if (ds4_dist_decode(buf, len, &f, err, sizeof err) && f.type == DS4_DIST_KNOCK) {
            reply = answer_knock(c, f.challenge.nonce, &rlen);
        } else if (len >= DS4_DIST_SEAL_BYTES &&
                   ds4_dist_decode(buf, len - DS4_DIST_SEAL_BYTES, &f, err, sizeof err) && f.type == DS4_DIST_HELLO) {
            reply = answer_hello(c, buf, len, &f.hello, &rlen);
        } else {
            char why[300];
            snprintf(why, sizeof why, "refused: %s", f.type ? "expected a KNOCK or a sealed HELLO" : err);
            reply = ds4_dist_encode_text(DS4_DIST_REFUSED, why, &rlen);
        }
        nng_free(buf, len);
        if (reply) nng_send(c->control, reply, rlen, 0);
        free(reply);
    }
    return NULL;
}

/* The registrations covering the layers after the coordinator's, in layer
 * order; 0 with a line in err while some layers have no live worker.
 * Caller holds mu. */
static int route(coord *c, worker_reg **out, char *err, size_t errlen) {
    int n = 0, next = c->m->slice.last + 1;
    const int L = c->m->cfg.n_layer;
    while (next < L) {
        worker_reg *w = NULL;
        for (int i = 0; i < MAX_WORKERS && !w; i++)
            if (c->regs[i].live && c->regs[i].first == next) w = &c->regs[i];
        if (!w) {
            snprintf(err, errlen, "incomplete route: no worker holds layer %d (of 0..%d)%s", next, L - 1, c->refused);
            return 0;
        }
        out[n++] = w;
        next = w->last + 1;
    }
    if (!out[n - 1]->output) {
        snprintf(err, errlen, "incomplete route: the last worker (layers %d..%d) does not own the output head",
                 out[n - 1]->first, out[n - 1]->last);
        return 0;
    }
    return n;
}


static bool hop_gone(hop *h) { return atomic_load(&h->closed_socket) == nng_socket_id(h->data); }

static void close_hop(hop *h) {
    if (h->open) nng_close(h->data);
    h->open = false;
}

/* The route is dropped: workers whose connection closed leave the
 * registrations (all of the route's when none did: one stopped answering),
 * and the next call forms a route anew once every layer is covered again. */
static void drop_route(coord *c) {
    bool any_gone = false;
    for (int i = 0; i < c->n_hops; i++) any_gone |= c->hops[i].open && hop_gone(&c->hops[i]);
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_hops; i++) {
        if (any_gone && !(c->hops[i].open && hop_gone(&c->hops[i]))) continue;
        for (int r = 0; r < MAX_WORKERS; r++)
            if (c->regs[r].live && !strcmp(c->regs[r].url, c->hops[i].url)) c->regs[r].live = false;
    }
    c->gen++;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_hops; i++) close_hop(&c->hops[i]);
    c->n_hops = 0;
    c->route_id = 0;
}

/* A worker said it is not on the route (WRONG_ROUTE): the registrations
 * stay, the hops are closed and the next form_route() makes the route anew,
 * under a fresh id (a worker refuses an id it took before). */
static void unform_route(coord *c) {
    if (c->p.debug) ds4_log(DS4_LOG_DEBUG, "ds4 coordinator: a worker is not on route %llu: forming the route again\n",
                            (unsigned long long)c->route_id);
    pthread_mutex_lock(&c->mu);
    c->gen++;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_hops; i++) close_hop(&c->hops[i]);
    c->n_hops = 0;
    c->route_id = 0;
}

/* The next RESULT of the current route with a request id at or after seq;
 * stale ones (an earlier route, an abandoned request) are skipped. -2 with
 * a line when a hop's connection closed or nothing came for timeout_s. */
static int await_result(coord *c, uint32_t seq, double timeout_s, void **buf, size_t *blen, ds4_dist_frame *f,
                        char *err, size_t errlen) {
    const double deadline = ds4_dist_now() + timeout_s;
    for (;;) {
        const int rv = nng_recv(c->results, buf, blen, NNG_FLAG_ALLOC);
        if (rv == NNG_ETIMEDOUT) {
            for (int i = 0; i < c->n_hops; i++)
                if (hop_gone(&c->hops[i])) {
                    snprintf(err, errlen, "worker layers %d..%d at %s is gone (connection closed): route dropped",
                             c->hops[i].first, c->hops[i].last, c->hops[i].url);
                    return -2;
                }
            if (ds4_dist_now() < deadline) continue;
            snprintf(err, errlen, "no answer from the route within %.0f s: route dropped", timeout_s);
            return -2;
        }
        if (rv) { snprintf(err, errlen, "pipeline results: %s: route dropped", nng_strerror(rv)); return -2; }
        char why[256];
        size_t frame_len;
        if (!ds4_dist_unseal(*buf, *blen, c->results_key, sizeof c->results_key, &frame_len)) {
            ds4_log(DS4_LOG_WARN, "ds4 coordinator: dropped a result frame that fails the seal (not from this "
                                  "coordinator's route, or not with this --dist-secret)\n");
        } else if (ds4_dist_decode(*buf, frame_len, f, why, sizeof why) && f->type == DS4_DIST_RESULT &&
            f->result.route == c->route_id && (int32_t)(f->result.seq - seq) >= 0)
            return 0;
        nng_free(*buf, *blen);
    }
}

/* A result's status as a return code: 0 OK, -3 hash mismatch (replay
 * recovers), -4 a worker not on this route (forming it again recovers), -1
 * a worker's error (the route stays). */
static int result_status(const ds4_dist_result *r, char *err, size_t errlen) {
    if (r->status == DS4_DIST_OK) return 0;
    snprintf(err, errlen, "%.*s", (int)r->text_len, r->text);
    return r->status == DS4_DIST_HASH_MISMATCH ? -3 : r->status == DS4_DIST_WRONG_ROUTE ? -4 : -1;
}

/* Makes the hops follow the registrations: connects to every worker of the
 * route and sends each its ROUTE frame (next hop, result address), then waits
 * for every worker's ACK. Waits up to wait_seconds for a complete route. */
static int form_route(coord *c, bool wait, char *err, size_t errlen) {
    worker_reg *regs[MAX_WORKERS];
    pthread_mutex_lock(&c->mu);
    const double deadline = ds4_dist_now() + (wait ? c->p.wait_seconds : 0);
    int n;
    while (!(n = route(c, regs, err, errlen)) && ds4_dist_now() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += POLL_MS * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&c->changed, &c->mu, &ts);
    }
    const uint64_t gen = c->gen;
    if (n && gen == c->route_id) { pthread_mutex_unlock(&c->mu); return 0; }
    hop want[MAX_WORKERS];
    for (int i = 0; i < n; i++) {
        want[i] = (hop){regs[i]->first, regs[i]->last, regs[i]->output, "", {0}, {0}, NNG_SOCKET_INITIALIZER, false, 0};
        memcpy(want[i].url, regs[i]->url, sizeof want[i].url);
        memcpy(want[i].nonce, regs[i]->nonce, sizeof want[i].nonce);
        ds4_dist_link_key(c->p.secret, want[i].nonce, want[i].key);
    }
    /* the results port takes what this route can send home: every
     * position's logits of a chunk, or a hop's layer state of a whole
     * session (KV_GET) */
    size_t floats = (size_t)c->chunk * c->m->cfg.n_vocab;
    for (int i = 0; i < n; i++) {
        const size_t state = ds4_kv_bytes_for_layers(&c->m->cfg, regs[i]->ctx, REWIND_SLACK, regs[i]->first,
                                                     regs[i]->last) / sizeof(float);
        if (state > floats) floats = state;
    }
    pthread_mutex_unlock(&c->mu);
    if (n) ds4_dist_recv_limit(c->results, ds4_dist_result_frame_max(floats));
    for (int i = 0; i < c->n_hops; i++) close_hop(&c->hops[i]);
    c->n_hops = 0;
    c->route_id = 0;
    if (!n) return -1;
    for (int i = 0; i < n; i++) {
        hop *h = &c->hops[i];
        /* the previous socket of this slot is closed: its callbacks are done */
        *h = want[i];
        atomic_store(&h->closed_socket, 0);
        const int rv = open_push(&h->data, h->url, &c->tls, c->p.reply_seconds, &h->closed_socket);
        h->open = rv == 0;
        c->n_hops = i + 1;
        if (rv) {
            snprintf(err, errlen, "cannot reach the worker for layers %d..%d at %s: %s", h->first, h->last, h->url,
                     nng_strerror(rv));
            drop_route(c);
            return -2;
        }
    }
    c->route_id = gen;
    for (int i = 0; i < n; i++) {
        static const uint8_t none[DS4_DIST_NONCE_BYTES];
        const char *next = i + 1 < n ? c->hops[i + 1].url : "";
        ds4_dist_route r = {gen, (uint32_t)c->chunk, next, strlen(next), i + 1 < n ? c->hops[i + 1].nonce : none,
                            c->home, strlen(c->home), c->home_nonce};
        size_t len = 0;
        uint8_t *msg = ds4_dist_encode_route(&r, &len);
        int rv = send_frame(c->hops[i].data, c->hops[i].key, msg, len);
        if (rv) {
            snprintf(err, errlen, "route to layers %d..%d: %s", c->hops[i].first, c->hops[i].last, nng_strerror(rv));
            drop_route(c);
            return -2;
        }
    }
    for (int acks = 0; acks < n; acks++) {
        void *buf;
        size_t blen;
        ds4_dist_frame f;
        /* a worker that cannot reach the result port never answers: bounded like the wait for workers */
        int rc = await_result(c, 0, c->p.wait_seconds, &buf, &blen, &f, err, errlen);
        if (!rc) rc = result_status(&f.result, err, errlen);
        if (!rc) nng_free(buf, blen);
        if (rc) { drop_route(c); return -2; }
    }
    if (c->p.debug) {
        char line[2048] = "";
        ds4_log_append(line, sizeof line, "ds4 coordinator: route %llu formed: layers 0..%d here",
                       (unsigned long long)gen, c->m->slice.last);
        for (int i = 0; i < n; i++)
            ds4_log_append(line, sizeof line, " -> layers %d..%d%s at %s", c->hops[i].first, c->hops[i].last,
                           c->hops[i].output ? " + output" : "", c->hops[i].url);
        ds4_log(DS4_LOG_DEBUG, "%s -> results at %s, activations %d-bit\n", line, c->home, c->p.activation_bits);
    }
    return 0;
}

static void session_rec_free(session_rec *r) {
    if (!r) return;
    free(r->toks);
    free(r->hashes);
    free(r);
}

static session_rec *session_of(coord *c, const struct ds4_kv *kv) {
    for (int i = 0; i < c->n_sessions; i++)
        if (c->sessions[i]->kv == kv) return c->sessions[i];
    session_rec **grown = realloc(c->sessions, (size_t)(c->n_sessions + 1) * sizeof *grown);
    if (!grown) return NULL;
    c->sessions = grown;
    session_rec *r = malloc(sizeof *r);
    if (!r) return NULL;
    *r = (session_rec){.kv = kv, .id = ++c->next_session, .toks = malloc((size_t)kv->ctx * sizeof(int32_t)),
                       .hashes = malloc((size_t)(kv->ctx + 1) * sizeof(uint64_t)), .cap = kv->ctx,
                       .ckpt_every = c->local->max_batch};
    if (!r->toks || !r->hashes) { session_rec_free(r); return NULL; }
    r->hashes[0] = DS4_DIST_HASH_EMPTY;
    c->sessions[c->n_sessions++] = r;
    return r;
}

/* Appends n tokens to what the route has seen of the session at position pos. */
static void session_append(session_rec *r, int pos, const int32_t *toks, int n) {
    memmove(r->toks + pos, toks, (size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) r->hashes[pos + i + 1] = ds4_dist_hash_tokens(r->hashes[pos + i], toks + i, 1);
    r->n = pos + n;
}

static void print_telemetry(const ds4_dist_result *r, double round_trip, size_t bytes) {
    char line[4096] = "";
    ds4_log_append(line, sizeof line, "ds4 coordinator: request %u:", r->seq);
    for (uint32_t i = 0; i < r->n_hops; i++) {
        const ds4_dist_hop h = ds4_dist_hop_at(r->hops, i);
        ds4_log_append(line, sizeof line, "%s layers %u..%u tokens %u..%u eval %.2f ms wait %.2f ms send %.2f ms in %u B",
                       i ? " |" : "", h.first, h.last, h.pos, h.pos + h.n - 1, h.eval_us / 1e3, h.wait_us / 1e3,
                       h.send_us / 1e3, h.bytes_in);
    }
    ds4_log(DS4_LOG_DEBUG, "%s | result %zu B, round trip %.2f ms\n", line, bytes, round_trip * 1e3);
}

/* One sequence's span through the route (pipeline()). */
typedef struct {
    struct ds4_kv *kv;
    uint64_t session;
    const int32_t *toks;
    int n;
    uint64_t hash;          /* the prefix hash at kv->n_pos */
    float *logits;          /* NULL: ACKs only (a replay); else the last token's or (all) every position's */
    const ds4_steering *steer;  /* the sequence's (backend.h); NULL: unsteered */
    bool all;
    bool checkpoint;        /* the span's last chunk asks the workers for a ring checkpoint */
} span;

/* Where the chunk walk stands: span index and offset in it. */
typedef struct { int s, off; } chunk_at;

static int chunk_len(const coord *c, const span *sp, chunk_at at) {
    return sp[at.s].n - at.off < c->chunk ? sp[at.s].n - at.off : c->chunk;
}

static void chunk_next(const coord *c, const span *sp, chunk_at *at) {
    at->off += chunk_len(c, sp, *at);
    if (at->off == sp[at->s].n) { at->s++; at->off = 0; }
}

/* Runs the spans through the route, in order, one chunk at a time: the
 * local slice on the span's kv, the chunk's hidden states pushed to the
 * first worker, which forwards to the next, up to the final owner of the
 * output head, which answers to the coordinator. Up to the prefill window's
 * chunks are in flight, whichever spans they belong to, so the local slice
 * computes the next chunk (of this session or the next) while the workers
 * compute the ones before: a batch's sessions overlap along the route as a
 * long prefill's chunks do. Every stage still evaluates each chunk alone,
 * so the logits are the single process's. 0, or -1/-2/-3 (result_status,
 * -2: the route failed) with the local kvs advanced by the chunks they ran. */
static int pipeline(coord *c, const span *sp, int n_spans, char *err, size_t errlen) {
    const size_t hcE = (size_t)c->m->cfg.n_hc * c->m->cfg.n_embd, V = (size_t)c->m->cfg.n_vocab;
    int chunks = 0;
    for (int i = 0; i < n_spans; i++) chunks += (sp[i].n + c->chunk - 1) / c->chunk;
    const uint32_t seq0 = c->seq + 1;
    c->seq += (uint32_t)chunks;
    double sent_at[DS4_DIST_MAX_WINDOW];
    uint64_t expect[DS4_DIST_MAX_WINDOW], hash = n_spans ? sp[0].hash : 0;
    chunk_at to_send = {0, 0}, to_get = {0, 0};
    int sent = 0, done = 0;
    while (done < chunks) {
        if (sent < chunks && sent - done < c->p.prefill_window) {
            const span *x = &sp[to_send.s];
            const int off = to_send.off, m = chunk_len(c, sp, to_send);
            const bool last = off + m == x->n;
            if (off == 0) hash = x->hash;
            const double t0 = ds4_dist_now();
            ds4_backend_seq local = {.kv = x->kv, .toks = x->toks + off, .n = m, .hidden_out = c->hidden,
                                     .steer = x->steer};
            const int pos = x->kv->n_pos;
            if (c->local->eval(c->local, &local, 1, err, errlen)) return -1;
            const uint32_t eval_us = elapsed_us(t0);
            const uint64_t after = ds4_dist_hash_tokens(hash, x->toks + off, m);
            const uint8_t mode = !x->logits ? DS4_DIST_ACK : x->all ? DS4_DIST_ALL : last ? DS4_DIST_LAST : DS4_DIST_ACK;
            ds4_dist_work wk = {.route = c->route_id, .seq = seq0 + (uint32_t)sent, .session = x->session,
                                .pos = (uint32_t)pos, .n = (uint32_t)m, .hash_before = hash, .hash_after = after,
                                .logits = mode, .checkpoint = x->checkpoint && last,
                                .steer_attn = ds4_steering_scale(x->steer, DS4_STEER_ATTN),
                                .steer_ffn = ds4_steering_scale(x->steer, DS4_STEER_FFN),
                                /* a Q8 row is one HC stream of one token */
                                .act = c->act, .row = c->act == DS4_DIST_ACT_Q8 ? (uint32_t)c->m->cfg.n_embd : 0,
                                .n_floats = (uint32_t)((size_t)m * hcE), .n_hops = 1};
            ds4_dist_hop me = {0, (uint32_t)c->m->slice.last, (uint32_t)pos, (uint32_t)m, eval_us, 0, 0, 0};
            const double t1 = ds4_dist_now();
            size_t len;
            uint8_t *msg = ds4_dist_encode_work(DS4_DIST_WORK, &wk, x->toks + off, c->hidden, &me, &len);
            if (msg) ds4_dist_set_send_us(msg, len, elapsed_us(t1));
            const int rv = send_frame(c->hops[0].data, c->hops[0].key, msg, len);
            if (rv) {
                snprintf(err, errlen, "sending to layers %d..%d: %s%s", c->hops[0].first, c->hops[0].last,
                         nng_strerror(rv), rv == NNG_ENOMEM ? "" : ": route dropped");
                return rv == NNG_ENOMEM ? -1 : -2;
            }
            sent_at[sent % DS4_DIST_MAX_WINDOW] = t0;
            expect[sent % DS4_DIST_MAX_WINDOW] = after;
            hash = after;
            chunk_next(c, sp, &to_send);
            sent++;
            continue;
        }
        void *buf;
        size_t blen;
        ds4_dist_frame f;
        int rc = await_result(c, seq0 + (uint32_t)done, c->p.reply_seconds, &buf, &blen, &f, err, errlen);
        if (rc) return rc;
        const ds4_dist_result *r = &f.result;
        const span *x = &sp[to_get.s];
        const int off = to_get.off, m = chunk_len(c, sp, to_get);
        const size_t want = !x->logits ? 0 : x->all ? (size_t)m * V : off + m == x->n ? V : 0;
        if (!(rc = result_status(r, err, errlen))) {
            if (r->seq != seq0 + (uint32_t)done) {
                snprintf(err, errlen, "the route answered request %u before %u: route dropped", r->seq,
                         seq0 + (uint32_t)done);
                rc = -2;
            } else if (r->n_floats != want || r->hash_after != expect[done % DS4_DIST_MAX_WINDOW] || r->session != x->session) {
                snprintf(err, errlen, "the route returned %u floats for session %llu (hash %016llx), expected %zu",
                         r->n_floats, (unsigned long long)r->session, (unsigned long long)r->hash_after, want);
                rc = -1;
            } else if (want) {
                ds4_dist_floats(r->floats, want, x->all ? x->logits + (size_t)off * V : x->logits);
            }
        }
        if (!rc && c->p.debug) print_telemetry(r, ds4_dist_now() - sent_at[done % DS4_DIST_MAX_WINDOW], blen);
        nng_free(buf, blen);
        if (rc) return rc;
        chunk_next(c, sp, &to_get);
        done++;
    }
    return 0;
}

/* Recomputes the local slice over the session's first n tokens (on a
 * scratch state: the session's own stays where it is) and runs them through
 * the route, so workers that lost or diverged from the session hold it
 * again: position 0 makes a worker start the session over. */
static int replay(coord *c, session_rec *r, int n, char *err, size_t errlen) {
    if (n == 0) return 0;
    if (c->p.debug) ds4_log(DS4_LOG_DEBUG, "ds4 coordinator: replaying %d tokens of session %llu through the route\n", n,
                            (unsigned long long)r->id);
    ds4_kv *scratch = ds4_kv_new_layers(&c->m->cfg, r->cap, REWIND_SLACK, 0, c->m->slice.last);
    if (!scratch) { snprintf(err, errlen, "out of memory for a %d-token replay", n); return -1; }
    const span whole = {.kv = scratch, .session = r->id, .toks = r->toks, .n = n, .hash = DS4_DIST_HASH_EMPTY,
                        .steer = ds4_steering_active(&r->steer) ? &r->steer : NULL};
    const int rc = pipeline(c, &whole, 1, err, errlen);
    ds4_kv_free(scratch);
    r->ckpts.n = 0;   /* position 0 started the workers' sessions over, checkpoints gone */
    return rc;
}

/* A sequence's span from position pos, flagged for a checkpoint where the
 * engine's rule takes one after it (ckpt_list). */
static span span_of(session_rec *r, const ds4_backend_seq *sq, int pos) {
    ckpt_drop_after(&r->ckpts, pos);
    const int last = r->ckpts.n ? r->ckpts.pos[r->ckpts.n - 1] : 0;
    return (span){sq->kv, r->id, sq->toks, sq->n, r->hashes[pos], sq->logits, sq->steer, sq->all_logits,
                  pos + sq->n - last >= r->ckpt_every};
}

/* A span went through: the route saw its tokens, the workers took its checkpoint. */
static void span_done(session_rec *r, const span *x, int pos) {
    session_append(r, pos, x->toks, x->n);
    r->steer = x->steer ? *x->steer : (ds4_steering){0};
    if (x->checkpoint && ckpt_push(&r->ckpts, pos + x->n)) r->ckpt_every *= 2;
}

/* Runs one sequence through the route; a worker that reports a hash
 * mismatch (restarted, or left behind by a failed call or a rewind deeper
 * than its slack and checkpoints) is caught up by a replay of the session's
 * tokens, and one that is not on the route gets the route formed again,
 * before the one retry. On failure the local state is back at u. */
static int route_step(coord *c, session_rec *r, const ds4_backend_seq *sq, const ds4_kv_undo *u, char *err, size_t errlen) {
    int rc = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        rc = form_route(c, true, err, errlen);
        const span x = span_of(r, sq, u->pos);
        if (!rc) rc = pipeline(c, &x, 1, err, errlen);
        if (!rc) span_done(r, &x, u->pos);
        if (rc) ds4_kv_undo_apply(u, sq->kv);
        if ((rc != -3 && rc != -4) || attempt) break;
        if (rc == -4) unform_route(c);
        else if ((rc = replay(c, r, u->pos, err, errlen))) break;
    }
    if (rc == -2) drop_route(c);
    return rc ? -1 : 0;
}

/* A batch's sequences all go into the route at once (pipeline(): stages
 * overlap across sessions). When a worker lacks a session (hash mismatch),
 * everything is put back and the sequences go one at a time, each with its
 * replay. When one fails, the ones before it are put back too, so the call
 * changes nothing (backend.h); the workers truncate back at the next step. */
static int coord_eval(ds4_backend *be, const ds4_backend_seq *seqs, int n_seqs, char *err, size_t errlen) {
    coord *c = (coord *)be;
    ds4_kv_undo *undos = calloc((size_t)n_seqs, sizeof *undos);
    session_rec **recs = calloc((size_t)n_seqs, sizeof *recs);
    span *spans = calloc((size_t)n_seqs, sizeof *spans);
    int saved = 0, rc = 0;
    if (!undos || !recs || !spans) { snprintf(err, errlen, "out of memory for %d sequences", n_seqs); rc = -1; }
    for (; !rc && saved < n_seqs; saved++) {
        const ds4_backend_seq *sq = &seqs[saved];
        session_rec *r = recs[saved] = session_of(c, sq->kv);
        if (!r || !ds4_kv_undo_save(&undos[saved], sq->kv, sq->n)) {
            snprintf(err, errlen, "out of memory for the session's token history or rollback checkpoint");
            rc = -1;
        } else if (sq->kv->n_pos > r->n) {
            snprintf(err, errlen, "the session holds %d tokens the route never saw (restored without the backend)",
                     sq->kv->n_pos);
            rc = -1;
        } else {
            r->n = sq->kv->n_pos;   /* the engine rewound: what the route saw past it no longer counts */
        }
    }
    bool one_by_one = n_seqs == 1;
    if (!rc && !one_by_one) {
        rc = form_route(c, true, err, errlen);
        for (int q = 0; q < n_seqs; q++) spans[q] = span_of(recs[q], &seqs[q], undos[q].pos);
        if (!rc) rc = pipeline(c, spans, n_seqs, err, errlen);
        for (int q = 0; q < n_seqs; q++) {
            if (!rc) span_done(recs[q], &spans[q], undos[q].pos);
            else ds4_kv_undo_apply(&undos[q], seqs[q].kv);
        }
        if (rc == -2) drop_route(c);
        if (rc == -4) unform_route(c);
        one_by_one = rc == -3 || rc == -4;
        if (one_by_one) rc = 0;
    }
    int done = 0;
    for (; one_by_one && !rc && done < n_seqs; done++) rc = route_step(c, recs[done], &seqs[done], &undos[done], err, errlen);
    for (int q = 0; rc && q < done - 1; q++) {
        ds4_kv_undo_apply(&undos[q], seqs[q].kv);
        recs[q]->n = undos[q].pos;
        ckpt_drop_after(&recs[q]->ckpts, undos[q].pos);
    }
    for (int q = 0; undos && q < saved; q++) ds4_kv_undo_free(&undos[q]);
    free(undos);
    free(recs);
    free(spans);
    return rc ? -1 : 0;
}

/* One KV_GET or KV_PUT to hop h, its RESULT into *f (caller frees buf). */
static int kv_exchange(coord *c, int h, enum ds4_dist_type type, const ds4_dist_work *wk, const int32_t *toks,
                       const float *floats, void **buf, size_t *blen, ds4_dist_frame *f, char *err, size_t errlen) {
    size_t len = 0;
    uint8_t *msg = ds4_dist_encode_work(type, wk, toks, floats, NULL, &len);
    const int rv = send_frame(c->hops[h].data, c->hops[h].key, msg, len);
    if (rv) {
        snprintf(err, errlen, "layer state to layers %d..%d: %s", c->hops[h].first, c->hops[h].last, nng_strerror(rv));
        return rv == NNG_ENOMEM ? -1 : -2;
    }
    int rc = await_result(c, wk->seq, c->p.reply_seconds, buf, blen, f, err, errlen);
    if (!rc && (rc = result_status(&f->result, err, errlen))) nng_free(*buf, *blen);
    return rc;
}

/* Save through the route: every worker's layer state of the session, at
 * the session's position, into the host state's layers (replaying first
 * when a worker no longer holds it). */
static int coord_gather(ds4_backend *be, struct ds4_kv *kv, char *err, size_t errlen) {
    coord *c = (coord *)be;
    const int n = kv->n_pos;
    if (n == 0) return 0;
    session_rec *r = session_of(c, kv);
    if (!r) { snprintf(err, errlen, "out of memory for the session's token history"); return -1; }
    if (r->n != n) { snprintf(err, errlen, "the route never saw this session's %d tokens", n); return -1; }
    int rc = 0;
    float *state = NULL;
    for (int attempt = 0; attempt < 2; attempt++) {
        rc = form_route(c, true, err, errlen);
        for (int h = 0; !rc && h < c->n_hops; h++) {
            const hop *hp = &c->hops[h];
            ds4_dist_work wk = {.route = c->route_id, .seq = ++c->seq, .session = r->id, .pos = (uint32_t)n,
                                .hash_before = r->hashes[n], .hash_after = r->hashes[n]};
            void *buf;
            size_t blen;
            ds4_dist_frame f;
            if ((rc = kv_exchange(c, h, DS4_DIST_KV_GET, &wk, NULL, NULL, &buf, &blen, &f, err, errlen))) break;
            const size_t bytes = ds4_kv_layers_bytes(kv, hp->first, hp->last, n);
            float *grown = (size_t)f.result.n_floats * sizeof(float) == bytes ? realloc(state, bytes + 1) : NULL;
            if (grown) {
                state = grown;
                ds4_dist_floats(f.result.floats, f.result.n_floats, state);
            }
            char why[256] = "a different size, or out of memory";
            if (!grown || !ds4_kv_layers_load(kv, hp->first, hp->last, n, state, bytes, why, sizeof why)) {
                snprintf(err, errlen, "layers %d..%d sent %u floats of state, expected %zu: %s", hp->first, hp->last,
                         f.result.n_floats, bytes / sizeof(float), why);
                rc = -1;
            }
            nng_free(buf, blen);
        }
        if ((rc != -3 && rc != -4) || attempt) break;
        if (rc == -4) unform_route(c);
        else if ((rc = replay(c, r, n, err, errlen))) break;
    }
    free(state);
    if (rc == -2) drop_route(c);
    return rc ? -1 : 0;
}

/* Load through the route: the session's history is now toks, and each
 * worker of the current route gets its layers' part of the host state.
 * Without a complete route, or when a worker fails to take it, the next step
 * finds the mismatch and replays instead, so the load itself never fails. */
static int coord_scatter(ds4_backend *be, struct ds4_kv *kv, const int32_t *toks, char *err, size_t errlen) {
    coord *c = (coord *)be;
    session_rec *r = session_of(c, kv);
    if (!r) { snprintf(err, errlen, "out of memory for the session's token history"); return -1; }
    const int n = kv->n_pos;
    session_append(r, 0, toks, n);
    r->ckpts.n = 0;   /* the engine dropped its checkpoints; the workers' sessions are replaced */
    if (n == 0) return 0;
    char why[256];
    int rc = form_route(c, false, why, sizeof why);
    float *state = NULL;
    for (int h = 0; !rc && h < c->n_hops; h++) {
        const hop *hp = &c->hops[h];
        const size_t bytes = ds4_kv_layers_bytes(kv, hp->first, hp->last, n);
        float *grown = realloc(state, bytes + 1);
        if (!grown) { snprintf(why, sizeof why, "out of memory for %zu bytes of layer state", bytes); rc = -1; break; }
        state = grown;
        ds4_kv_layers_save(kv, hp->first, hp->last, state);
        /* layer state travels in f32 whatever --dist-activation-bits says: the KV state is not rounded */
        ds4_dist_work wk = {.route = c->route_id, .seq = ++c->seq, .session = r->id, .n = (uint32_t)n,
                            .hash_before = DS4_DIST_HASH_EMPTY, .hash_after = r->hashes[n],
                            .n_floats = (uint32_t)(bytes / sizeof(float))};
        void *buf;
        size_t blen;
        ds4_dist_frame f;
        if (!(rc = kv_exchange(c, h, DS4_DIST_KV_PUT, &wk, toks, state, &buf, &blen, &f, why, sizeof why)))
            nng_free(buf, blen);
    }
    free(state);
    if (rc == -2) drop_route(c);
    if (rc && c->p.debug) ds4_log(DS4_LOG_DEBUG, "ds4 coordinator: loaded state not sent to the workers (%s): the next step replays\n", why);
    return 0;
}

static void coord_kv_release(ds4_backend *be, struct ds4_kv *kv) {
    coord *c = (coord *)be;
    for (int i = 0; i < c->n_sessions; i++)
        if (c->sessions[i]->kv == kv) {
            session_rec_free(c->sessions[i]);
            c->sessions[i] = c->sessions[--c->n_sessions];
            return;
        }
}

static void coord_free(ds4_backend *be) {
    coord *c = (coord *)be;
    if (c->thread_started) {
        atomic_store(&c->stop, true);
        pthread_join(c->thread, NULL);
    }
    nng_close(c->control);
    nng_close(c->results);
    for (int i = 0; i < c->n_hops; i++) close_hop(&c->hops[i]);
    for (int i = 0; i < c->n_sessions; i++) session_rec_free(c->sessions[i]);
    free(c->sessions);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->changed);
    free(c->hidden);
    ds4_dist_tls_free(&c->tls);
    c->local->free(c->local);
    free(c);
}

ds4_backend *ds4_dist_coordinator_new(ds4_backend *local, const ds4_model *m, const ds4_dist_params *p,
                                      bool numerics, char *err, size_t errlen) {
    if (m->slice.first != 0 || m->slice.output) {
        snprintf(err, errlen, "--role coordinator needs --layers 0:K with K before the last layer (the workers hold the rest)");
        local->free(local);
        return NULL;
    }
    const int chunk = p->prefill_chunk > 0 ? p->prefill_chunk : local->max_batch;
    if (chunk > local->max_batch) {
        snprintf(err, errlen, "--dist-prefill-chunk %d exceeds the local batch of %d tokens (--prefill-chunk)", chunk,
                 local->max_batch);
        local->free(local);
        return NULL;
    }
    uint64_t first_route = 0;
    coord *c = calloc(1, sizeof *c);
    const bool drawn = ds4_dist_random((uint8_t *)&first_route, sizeof first_route) &&
                       (!c || ds4_dist_random(c->home_nonce, sizeof c->home_nonce));
    const size_t hidden = (size_t)chunk * m->cfg.n_hc * m->cfg.n_embd;
    float *h = malloc(hidden * sizeof(float));
    if (!c || !h || !drawn) {
        snprintf(err, errlen, drawn ? "out of memory for the coordinator" : "cannot draw a random route id or nonce");
        free(c); free(h);
        local->free(local);
        return NULL;
    }
    /* several chunks per call keep the pipeline full past its fill and drain */
    c->base = (ds4_backend){.name = "dist", .max_batch = chunk * CHUNKS_PER_CALL, .eval = coord_eval,
                           .free = coord_free, .kv_release = coord_kv_release, .kv_gather = coord_gather,
                           .kv_scatter = coord_scatter};
    c->local = local;
    c->m = m;
    c->p = *p;
    c->chunk = chunk;
    c->hidden = h;
    c->act = p->activation_bits == 16 ? DS4_DIST_ACT_F16 : p->activation_bits == 8 ? DS4_DIST_ACT_Q8 : DS4_DIST_ACT_F32;
    c->me = identity(m, numerics, 0, NULL, NULL, p);
    ds4_dist_link_key(p->secret, c->home_nonce, c->results_key);
    atomic_init(&c->stop, false);
    /* route ids start at random (top bit set: never 0, "no route"), so a
     * restarted coordinator's never repeat its predecessor's: a worker
     * refuses a ROUTE frame of an id it has taken before (a replay) */
    c->gen = first_route | 1ull << 63;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->changed, NULL);
    char url[200], rurl[200];
    if (!ds4_dist_tls_load(p, &c->tls, err, errlen)) {
        coord_free(&c->base);
        return NULL;
    }
    snprintf(url, sizeof url, "%s://%s:%d", ds4_dist_scheme(&c->tls), p->host, p->port);
    int rv = nng_rep0_open(&c->control);
    if (!rv) nng_socket_set_ms(c->control, NNG_OPT_RECVTIMEO, 200);
    if (!rv) ds4_dist_recv_limit(c->control, CONTROL_MAX);
    if (!rv) rv = ds4_dist_listen(c->control, url, &c->tls, NULL);
    /* results come back on their own port: the final hop's answers and the
     * workers' errors, whichever hop they come from */
    snprintf(rurl, sizeof rurl, "%s://%s:0", ds4_dist_scheme(&c->tls), p->host);
    nng_listener rl;
    int port = 0;
    int rv2 = rv ? rv : nng_pull0_open(&c->results);
    if (!rv2) nng_socket_set_ms(c->results, NNG_OPT_RECVTIMEO, POLL_MS);
    /* until a route forms (form_route raises it), nothing larger than an error line comes home */
    if (!rv2) ds4_dist_recv_limit(c->results, ds4_dist_result_frame_max(0));
    if (!rv2) rv2 = ds4_dist_listen(c->results, rurl, &c->tls, &rl);
    if (!rv2) rv2 = nng_listener_get_int(rl, NNG_OPT_TCP_BOUND_PORT, &port);
    if (rv || rv2) {
        snprintf(err, errlen, "cannot listen on %s: %s", rv ? url : rurl, nng_strerror(rv ? rv : rv2));
        coord_free(&c->base);
        return NULL;
    }
    snprintf(c->home, sizeof c->home, "%s://%s:%d", ds4_dist_scheme(&c->tls), p->host, port);
    if (pthread_create(&c->thread, NULL, control_loop, c)) {
        snprintf(err, errlen, "cannot start the registration thread");
        coord_free(&c->base);
        return NULL;
    }
    c->thread_started = true;
    if (p->debug) ds4_log(DS4_LOG_DEBUG, "ds4 coordinator: coordinator layers 0..%d listening on %s\n", m->slice.last, url);
    return &c->base;
}

/* ================================================================ worker */

typedef struct {
    uint64_t id;
    ds4_kv *kv;
    uint64_t *hashes;       /* [ctx + 1]: the rolling hash after each prefix */
    uint64_t last_use;
    ckpt_list ckpts;
} worker_session;

typedef struct {
    const ds4_model *m;     /* the slice, and its backend: the caller's (the engine's) */
    ds4_backend *be;
    const float *steer_dir; /* the whole steering file (dist.h); NULL: none */
    int ctx;
    worker_session sessions[MAX_SESSIONS];
    uint64_t clock;
    float *in, *out;
    size_t in_cap, out_cap;
    /* the route: where WORK goes next (none for the output owner) and home,
     * where results and errors go */
    uint64_t route;
    uint32_t last_seq;      /* the route's latest request seen: request ids only grow along a route */
    uint64_t routes_taken[MAX_ROUTES_KEPT];   /* ids of the latest ROUTE frames served (a ring) */
    int n_routes_taken;
    const char *secret;
    /* link keys (dist_proto.h): this worker's own, which every frame to it
     * carries, and those of the next hop and of home, which frames it sends
     * there carry */
    uint8_t key[DS4_DIST_SEAL_BYTES], next_key[DS4_DIST_SEAL_BYTES], home_key[DS4_DIST_SEAL_BYTES];
    ds4_dist_tls tls;
    nng_socket data, next, home;
    bool next_open, home_open;
    char next_url[160], home_url[URL_MAX];
} worker;

static bool grow(float **p, size_t *cap, size_t n) {
    if (n <= *cap) return true;
    float *q = malloc(n * sizeof(float));
    if (!q) return false;
    free(*p);
    *p = q;
    *cap = n;
    return true;
}

static void session_drop(worker_session *s) {
    ds4_kv_free(s->kv);
    free(s->hashes);
    free(s->ckpts.block);
    *s = (worker_session){0};
}

/* The session's state, created (or started over) when empty is set; NULL
 * with a line in why when it is not here or memory ran out. */
static worker_session *session_find(worker *w, uint64_t id, bool empty, char *why, size_t whylen) {
    worker_session *s = NULL, *victim = &w->sessions[0];
    for (int i = 0; i < MAX_SESSIONS; i++) {
        if (w->sessions[i].kv && w->sessions[i].id == id) s = &w->sessions[i];
        if (!w->sessions[i].kv || (victim->kv && w->sessions[i].last_use < victim->last_use)) victim = &w->sessions[i];
    }
    if (s) {
        if (empty) {
            ds4_kv_reset(s->kv);
            s->ckpts.n = 0;
        }
    } else if (empty) {
        session_drop(victim);
        *victim = (worker_session){.id = id,
                                   .kv = ds4_kv_new_layers(&w->m->cfg, w->ctx, REWIND_SLACK, w->m->slice.first,
                                                           w->m->slice.last),
                                   .hashes = malloc((size_t)(w->ctx + 1) * sizeof(uint64_t))};
        if (!victim->kv || !victim->hashes) {
            session_drop(victim);
            snprintf(why, whylen, "out of memory for a %d-token session", w->ctx);
            return NULL;
        }
        s = victim;
    }
    if (s) {
        s->last_use = ++w->clock;
        if (empty) s->hashes[0] = DS4_DIST_HASH_EMPTY;
    }
    return s;
}

/* Back to a checkpoint taken at exactly pos (exact: the rows before it were
 * not truncated since, or the checkpoint would have been dropped). */
static bool ckpt_restore(worker_session *s, int pos) {
    for (int i = s->ckpts.n - 1; i >= 0; i--)
        if (s->ckpts.pos[i] == pos) {
            ds4_kv_ring_load(s->kv, s->ckpts.slot[i]);
            return true;
        }
    return false;
}

/* A ring checkpoint after a flagged span; without memory for the slots the
 * session just has none (a deep rewind then replays). */
static void ckpt_take(worker_session *s) {
    const size_t ring = ds4_kv_ring_bytes(s->kv);
    /* calloc: a slot's pages are touched only when a checkpoint is taken */
    if (!s->ckpts.block) {
        if (!(s->ckpts.block = calloc(MAX_CKPT, ring))) return;
        for (int i = 0; i < MAX_CKPT; i++) s->ckpts.slot[i] = (char *)s->ckpts.block + (size_t)i * ring;
    }
    ckpt_push(&s->ckpts, s->kv->n_pos);
    ds4_kv_ring_save(s->kv, s->ckpts.slot[s->ckpts.n - 1]);
}

/* The session at position pos with prefix hash `hash`: a state further on
 * whose prefix matches is truncated back (within the rings' slack) or
 * restored from a checkpoint at pos; anything else is a mismatch (*status
 * HASH_MISMATCH) the coordinator resolves by a replay. NULL with a line in
 * why. */
static worker_session *session_at(worker *w, uint64_t id, uint32_t pos, uint64_t hash, uint8_t *status, char *why,
                                  size_t whylen) {
    worker_session *s = session_find(w, id, pos == 0, why, whylen);
    *status = DS4_DIST_ERROR;
    if (s && (int)pos <= s->kv->n_pos && s->hashes[pos] == hash &&
        (ds4_kv_truncate(s->kv, (int)pos) || ckpt_restore(s, (int)pos))) {
        ckpt_drop_after(&s->ckpts, (int)pos);
        return s;
    }
    if (!why[0]) {
        *status = DS4_DIST_HASH_MISMATCH;
        snprintf(why, whylen, "hash mismatch: this worker holds %d tokens of session %llu, asked for position %u "
                              "(replay needed)", s ? s->kv->n_pos : 0, (unsigned long long)id, pos);
    }
    return NULL;
}

/* A result to home; hops (NULL when none ran) with the last one's send time
 * filled in when sent. */
static void send_home(worker *w, const ds4_dist_result *r, const float *floats, const ds4_dist_hop *hops, double t0) {
    if (!w->home_open) return;   /* no route yet: nobody to tell */
    size_t len;
    uint8_t *msg = ds4_dist_encode_result(r, floats, hops, &len);
    if (msg && r->n_hops) ds4_dist_set_send_us(msg, len, elapsed_us(t0));
    if (send_frame(w->home, w->home_key, msg, len))
        ds4_log(DS4_LOG_ERROR, "ds4 worker: cannot answer the coordinator at %s\n", w->home_url);
}

static void send_error(worker *w, const ds4_dist_work *wk, uint8_t status, const char *why) {
    ds4_dist_result r = {.route = wk->route, .seq = wk->seq, .session = wk->session, .status = status,
                         .text = why, .text_len = strlen(why)};
    send_home(w, &r, NULL, NULL, 0);
}

/* One WORK frame: this slice's layers over the span, then the hidden states
 * to the next hop, or (output owner) the logits or an ACK home. */
static void serve_work(worker *w, const ds4_dist_work *wk, size_t bytes_in, uint32_t wait_us) {
    const ds4_config *cfg = &w->m->cfg;
    const size_t hcE = (size_t)cfg->n_hc * cfg->n_embd, V = (size_t)cfg->n_vocab;
    char why[256] = "";
    if (wk->n_hops >= DS4_DIST_MAX_HOPS || wk->pos + wk->n > (uint32_t)w->ctx) {
        snprintf(why, sizeof why, "%u tokens at position %u do not fit this worker (ctx %d, %u hops)", wk->n, wk->pos,
                 w->ctx, wk->n_hops);
        send_error(w, wk, DS4_DIST_ERROR, why);
        return;
    }
    uint8_t status;
    worker_session *s = session_at(w, wk->session, wk->pos, wk->hash_before, &status, why, sizeof why);
    if (!s) { send_error(w, wk, status, why); return; }
    const bool output = w->m->slice.output;
    const size_t want_in = (size_t)wk->n * hcE;
    const size_t n_out = output ? (wk->logits == DS4_DIST_ALL ? (size_t)wk->n * V : V) : (size_t)wk->n * hcE;
    int32_t *toks = malloc((size_t)wk->n * sizeof(int32_t));
    if (wk->n_floats != want_in) {
        snprintf(why, sizeof why, "%u hidden floats for %u tokens, expected %zu", wk->n_floats, wk->n, want_in);
    } else if (!w->steer_dir && (wk->steer_attn != 0 || wk->steer_ffn != 0)) {
        /* registration refuses such a route; never compute unsteered what was asked steered */
        snprintf(why, sizeof why, "steered work, but this worker has no --dir-steering-file");
    } else if (!toks || !grow(&w->in, &w->in_cap, want_in) || !grow(&w->out, &w->out_cap, n_out)) {
        snprintf(why, sizeof why, "out of memory for %u tokens", wk->n);
    } else {
        for (uint32_t i = 0; i < wk->n; i++) toks[i] = ds4_dist_token_at(wk->tokens, i);
        ds4_dist_work_floats(wk, w->in);
        const ds4_steering steer = {w->steer_dir, cfg->n_layer, cfg->n_embd, wk->steer_attn, wk->steer_ffn};
        ds4_backend_seq sq = {.kv = s->kv, .toks = toks, .n = (int)wk->n, .logits = output ? w->out : NULL,
                              .all_logits = wk->logits == DS4_DIST_ALL, .hidden_in = w->in,
                              .hidden_out = output ? NULL : w->out,
                              .steer = ds4_steering_active(&steer) ? &steer : NULL};
        const double t0 = ds4_dist_now();
        if (w->be->eval(w->be, &sq, 1, why, sizeof why) == 0) {
            for (uint32_t i = 0; i < wk->n; i++)
                s->hashes[wk->pos + i + 1] = ds4_dist_hash_tokens(s->hashes[wk->pos + i], toks + i, 1);
            if (wk->checkpoint) ckpt_take(s);
            ds4_dist_hop hops[DS4_DIST_MAX_HOPS];
            for (uint32_t i = 0; i < wk->n_hops; i++) hops[i] = ds4_dist_hop_at(wk->hops, i);
            hops[wk->n_hops] = (ds4_dist_hop){(uint32_t)w->m->slice.first, (uint32_t)w->m->slice.last, wk->pos, wk->n,
                                              elapsed_us(t0), wait_us, 0, (uint32_t)bytes_in};
            const double t1 = ds4_dist_now();
            if (output) {
                const bool ack = wk->logits == DS4_DIST_ACK;
                ds4_dist_result r = {.route = wk->route, .seq = wk->seq, .session = wk->session,
                                     .status = DS4_DIST_OK, .hash_after = s->hashes[wk->pos + wk->n],
                                     .n_floats = ack ? 0 : (uint32_t)n_out, .n_hops = wk->n_hops + 1, .text = ""};
                send_home(w, &r, w->out, hops, t1);
            } else {
                ds4_dist_work fw = *wk;   /* on in the format it came in */
                fw.floats = NULL;
                fw.n_floats = (uint32_t)n_out;
                fw.n_hops = wk->n_hops + 1;
                size_t len;
                uint8_t *msg = ds4_dist_encode_work(DS4_DIST_WORK, &fw, toks, w->out, hops, &len);
                if (msg) ds4_dist_set_send_us(msg, len, elapsed_us(t1));
                const int rv = w->next_open ? send_frame(w->next, w->next_key, msg, len) : (free(msg), NNG_ECLOSED);
                if (rv) snprintf(why, sizeof why, "next hop %s: %s", w->next_url, nng_strerror(rv));
            }
        }
    }
    free(toks);
    if (why[0]) send_error(w, wk, DS4_DIST_ERROR, why);
}

/* KV_GET: this slice's layer state of a session; KV_PUT: a session replaced
 * by the coordinator's tokens and layer state (persistent KV). */
static void serve_kv(worker *w, enum ds4_dist_type type, const ds4_dist_work *wk) {
    const ds4_layer_slice *sl = &w->m->slice;
    char why[256] = "";
    float *state = NULL;
    size_t n_floats = 0;
    int32_t *toks = NULL;
    uint8_t status = DS4_DIST_ERROR;
    if (type == DS4_DIST_KV_GET) {
        worker_session *s = session_at(w, wk->session, wk->pos, wk->hash_before, &status, why, sizeof why);
        if (s) {
            n_floats = ds4_kv_layers_bytes(s->kv, sl->first, sl->last, s->kv->n_pos) / sizeof(float);
            if ((state = malloc(n_floats * sizeof(float) + 1))) ds4_kv_layers_save(s->kv, sl->first, sl->last, state);
            else snprintf(why, sizeof why, "out of memory for %zu floats of layer state", n_floats);
        }
    } else if (wk->n > (uint32_t)w->ctx) {
        snprintf(why, sizeof why, "a %u-token session does not fit this worker's ctx %d", wk->n, w->ctx);
    } else {
        worker_session *s = session_find(w, wk->session, true, why, sizeof why);
        state = malloc((size_t)wk->n_floats * sizeof(float) + 1);
        toks = malloc((size_t)wk->n * sizeof(int32_t) + 1);
        if (s && (!state || !toks)) snprintf(why, sizeof why, "out of memory for a %u-token session", wk->n);
        if (s && !why[0]) {
            ds4_dist_work_floats(wk, state);
            for (uint32_t i = 0; i < wk->n; i++) toks[i] = ds4_dist_token_at(wk->tokens, i);
            for (uint32_t i = 0; i < wk->n; i++) s->hashes[i + 1] = ds4_dist_hash_tokens(s->hashes[i], toks + i, 1);
            if (s->hashes[wk->n] != wk->hash_after) {
                ds4_kv_reset(s->kv);
                snprintf(why, sizeof why, "the %u tokens do not hash to the session's prefix hash", wk->n);
            } else if (!ds4_kv_layers_load(s->kv, sl->first, sl->last, (int)wk->n, state,
                                           (size_t)wk->n_floats * sizeof(float), why, sizeof why)) {
                ds4_kv_reset(s->kv);
            }
        }
    }
    if (why[0]) {
        send_error(w, wk, status, why);
    } else {
        ds4_dist_result r = {.route = wk->route, .seq = wk->seq, .session = wk->session, .status = DS4_DIST_OK,
                             .hash_after = wk->hash_after,
                             .n_floats = (uint32_t)(type == DS4_DIST_KV_GET ? n_floats : 0), .text = ""};
        send_home(w, &r, state, NULL, 0);
    }
    free(state);
    free(toks);
}


/* Whether a ROUTE of this id was served already: ids are never reused (a
 * coordinator's start at random and grow), so that is a recorded frame. */
static bool route_taken(const worker *w, uint64_t id) {
    const int n = w->n_routes_taken < MAX_ROUTES_KEPT ? w->n_routes_taken : MAX_ROUTES_KEPT;
    for (int i = 0; i < n; i++)
        if (w->routes_taken[i] == id) return true;
    return false;
}

/* Re-points a push socket when its address changed. */
static int repoint(nng_socket *s, bool *open, char *cur, size_t cap, const char *url, size_t len, const ds4_dist_tls *t,
                   double timeout_s) {
    if (*open && strlen(cur) == len && !memcmp(cur, url, len)) return 0;
    if (*open) nng_close(*s);
    *open = false;
    if (len == 0) { cur[0] = 0; return 0; }
    if (len >= cap) return NNG_EINVAL;
    memcpy(cur, url, len);
    cur[len] = 0;
    const int rv = open_push(s, cur, t, timeout_s, NULL);
    *open = rv == 0;
    return rv;
}

static void serve_route(worker *w, const ds4_dist_route *r, double timeout_s) {
    int rv = repoint(&w->home, &w->home_open, w->home_url, sizeof w->home_url, r->home, r->home_len, &w->tls,
                     timeout_s);
    if (!w->home_open) {
        ds4_log(DS4_LOG_ERROR, "ds4 worker: cannot reach the coordinator's results at %.*s: %s\n", (int)r->home_len, r->home,
                nng_strerror(rv ? rv : NNG_EINVAL));
        return;
    }
    if (!rv)
        rv = repoint(&w->next, &w->next_open, w->next_url, sizeof w->next_url, r->next, r->next_len, &w->tls, timeout_s);
    w->route = r->route;
    w->last_seq = 0;
    ds4_dist_link_key(w->secret, r->next_nonce, w->next_key);
    ds4_dist_link_key(w->secret, r->home_nonce, w->home_key);
    /* an authenticated route says how much one frame may carry: this
     * slice's data port takes that much from now on (a chunk is never more
     * than the context) */
    const size_t tokens = r->max_tokens < (uint32_t)w->ctx ? r->max_tokens : (size_t)w->ctx;
    const ds4_layer_slice *sl = &w->m->slice;
    ds4_dist_recv_limit(w->data, slice_frame_max(&w->m->cfg, sl->first, sl->last, w->ctx, tokens));
    char why[300] = "";
    if (rv) snprintf(why, sizeof why, "cannot reach the next hop %.*s: %s", (int)r->next_len, r->next, nng_strerror(rv));
    ds4_dist_result res = {.route = r->route, .status = rv ? DS4_DIST_ERROR : DS4_DIST_OK, .text = why,
                           .text_len = strlen(why)};
    send_home(w, &res, NULL, NULL, 0);
}

int ds4_dist_worker_serve(const ds4_model *m, ds4_backend *be, bool numerics, int ctx, const ds4_dist_params *p) {
    char err[512];
    worker w = {0};
    w.m = m;
    w.be = be;
    w.ctx = ctx;
    w.steer_dir = p->steer_dir;
    w.secret = p->secret;
    nng_socket control = NNG_SOCKET_INITIALIZER;
    w.data = (nng_socket)NNG_SOCKET_INITIALIZER;
    nng_listener listener;
    uint8_t nonce[DS4_DIST_NONCE_BYTES];   /* this process's registration nonce Nr */
    char url[200] = "";
    int rc = 1;
    if (w.m->slice.first == 0) { ds4_log(DS4_LOG_ERROR, "ds4 worker: layer 0 belongs to the coordinator (--layers K:...)\n"); goto done; }
    /* the data socket listens, on a free port, on this host's address on
     * the way to the coordinator: the coordinator and the previous hop push
     * to it */
    char here[INET6_ADDRSTRLEN + 2];
    if (!local_address_towards(p->host, p->port, here, sizeof here, err, sizeof err)) {
        ds4_log(DS4_LOG_ERROR, "ds4 worker: %s\n", err);
        goto done;
    }
    if (!ds4_dist_tls_load(p, &w.tls, err, sizeof err)) { ds4_log(DS4_LOG_ERROR, "ds4 worker: %s\n", err); goto done; }
    if (!ds4_dist_random(nonce, sizeof nonce)) { ds4_log(DS4_LOG_ERROR, "ds4 worker: cannot draw a random nonce\n"); goto done; }
    ds4_dist_link_key(p->secret, nonce, w.key);
    int rv = nng_pull0_open(&w.data);
    snprintf(url, sizeof url, "%s://%s:0", ds4_dist_scheme(&w.tls), here);
    /* until a ROUTE (sealed with this registration's key) raises it, the
     * data port takes nothing larger than a ROUTE */
    if (!rv) ds4_dist_recv_limit(w.data, ds4_dist_route_frame_max(URL_MAX));
    if (!rv) rv = ds4_dist_listen(w.data, url, &w.tls, &listener);
    int port = 0;
    if (!rv) rv = nng_listener_get_int(listener, NNG_OPT_TCP_BOUND_PORT, &port);
    if (rv) { ds4_log(DS4_LOG_ERROR, "ds4 worker: cannot listen on %s: %s\n", url, nng_strerror(rv)); goto done; }
    snprintf(url, sizeof url, "%s://%s:%d", ds4_dist_scheme(&w.tls), here, port);
    char curl[200];
    snprintf(curl, sizeof curl, "%s://%s:%d", ds4_dist_scheme(&w.tls), p->host, p->port);
    rv = nng_req0_open(&control);
    if (!rv) ds4_dist_recv_limit(control, CONTROL_MAX);
    if (!rv) rv = ds4_dist_dial(control, curl, &w.tls);   /* retries until the coordinator is up */
    if (rv) { ds4_log(DS4_LOG_ERROR, "ds4 worker: cannot reach %s: %s\n", curl, nng_strerror(rv)); goto done; }
    const ds4_dist_hello me = identity(w.m, numerics, ctx, url, nonce, p);
    size_t blen;
    void *buf = NULL;
    ds4_dist_frame f;
    /* The HELLO is repeated whenever no work came for a while: a restarted
     * coordinator, or one that dropped the route, learns this worker again
     * without restarting it. */
    nng_socket_set_ms(w.data, NNG_OPT_RECVTIMEO, 1000);
    /* both: a REQ socket's send waits for a connection, which a TLS mismatch never makes */
    nng_socket_set_ms(control, NNG_OPT_SENDTIMEO, FIRST_ANSWER_MS);
    nng_socket_set_ms(control, NNG_OPT_RECVTIMEO, FIRST_ANSWER_MS);
    bool registered = false, waited = false;
    double idle_since = ds4_dist_now();
    for (;;) {
        if (!registered || nng_recv(w.data, &buf, &blen, NNG_FLAG_ALLOC)) {
            char line[300];
            const int hs = ds4_dist_handshake(control, p->secret, me, NULL, NULL, line, sizeof line);
            if (hs == -2 && !registered && !waited) {
                /* NNG keeps dialling and says nothing about why a connection fails */
                ds4_log(DS4_LOG_WARN, "ds4 worker: no answer from %s yet (is it up? with TLS, do both sides trust each "
                                      "other's certificates?); still trying\n", curl);
                waited = true;
            }
            if (hs == -1 && !registered) {
                ds4_log(DS4_LOG_ERROR, "ds4 worker: registration with %s failed: %s\n", curl, line);
                goto done;
            }
            if (hs < 0) continue;   /* the coordinator is away; ask again */
            if (!registered || hs) {   /* a heartbeat prints nothing */
                char msg[1024] = "";
                if (!registered && !hs) {
                    /* what a session costs here: only this slice's layers have state */
                    const ds4_config *cfg = &w.m->cfg;
                    ds4_log_append(msg, sizeof msg,
                                   "; KV state %.2f MiB per %d-token session for these layers (%.2f MiB for all %d), "
                                   "at most %d sessions",
                                   (double)ds4_kv_bytes_for_layers(cfg, ctx, REWIND_SLACK, w.m->slice.first,
                                                                   w.m->slice.last) / (1 << 20),
                                   ctx, (double)ds4_kv_bytes_for(cfg, ctx, REWIND_SLACK) / (1 << 20), cfg->n_layer,
                                   MAX_SESSIONS);
                }
                ds4_log(hs ? DS4_LOG_ERROR : DS4_LOG_INFO, "ds4 worker: layers %d..%d%s: %s: %s%s\n",
                        w.m->slice.first, w.m->slice.last, w.m->slice.output ? " + output" : "", curl, line, msg);
            }
            if (hs) goto done;
            if (!registered) nng_socket_set_ms(control, NNG_OPT_RECVTIMEO, 1000);
            registered = true;
            idle_since = ds4_dist_now();
            continue;
        }
        const uint32_t wait_us = elapsed_us(idle_since);
        size_t frame_len;
        bool work = false;
        if (!ds4_dist_unseal(buf, blen, w.key, sizeof w.key, &frame_len)) {
            ds4_log(DS4_LOG_WARN, "ds4 worker: dropped a frame that fails the seal (not for this registration, or not "
                                  "with this --dist-secret)\n");
        } else if (!ds4_dist_decode(buf, frame_len, &f, err, sizeof err)) {
            ds4_log(DS4_LOG_WARN, "ds4 worker: dropped a frame: %s\n", err);
        } else if ((work = f.type == DS4_DIST_WORK || f.type == DS4_DIST_KV_GET || f.type == DS4_DIST_KV_PUT) &&
                   f.work.route != w.route) {
            /* the coordinator forms its route again when this is its
             * current one; a recorded frame of an older route only gets an
             * answer the coordinator passes over */
            char why[256];
            snprintf(why, sizeof why, "work for route %llu, this worker is on route %llu", (unsigned long long)f.work.route,
                     (unsigned long long)w.route);
            send_error(&w, &f.work, DS4_DIST_WRONG_ROUTE, why);
        } else if (work && (int32_t)(f.work.seq - w.last_seq) <= 0) {
            /* sealed, but a request of this route was already served: a
             * recorded frame sent again, never computed twice */
            ds4_log(DS4_LOG_WARN, "ds4 worker: dropped a replayed frame (request %u; the route is at %u)\n", f.work.seq,
                    w.last_seq);
        } else if (f.type == DS4_DIST_ROUTE && route_taken(&w, f.route.route)) {
            ds4_log(DS4_LOG_WARN, "ds4 worker: dropped a replayed ROUTE frame (route %llu was taken before)\n",
                    (unsigned long long)f.route.route);
        } else if (f.type == DS4_DIST_ROUTE) {
            w.routes_taken[w.n_routes_taken++ % MAX_ROUTES_KEPT] = f.route.route;
            serve_route(&w, &f.route, p->reply_seconds);
        } else if (f.type == DS4_DIST_WORK) {
            w.last_seq = f.work.seq;
            serve_work(&w, &f.work, blen, wait_us);
        } else if (f.type == DS4_DIST_KV_GET || f.type == DS4_DIST_KV_PUT) {
            w.last_seq = f.work.seq;
            serve_kv(&w, f.type, &f.work);
        } else {
            ds4_log(DS4_LOG_WARN, "ds4 worker: dropped a frame of type %d\n", f.type);
        }
        nng_free(buf, blen);
        idle_since = ds4_dist_now();
    }
done:
    nng_close(control);
    nng_close(w.data);
    if (w.next_open) nng_close(w.next);
    if (w.home_open) nng_close(w.home);
    for (int i = 0; i < MAX_SESSIONS; i++) session_drop(&w.sessions[i]);
    free(w.in); free(w.out);
    ds4_dist_tls_free(&w.tls);
    return rc;
}
