/* tp.c -- tensor parallelism over one NNG pair connection (see tp.h). */
#include "dist/tp.h"
#include "backends/backend.h"
#include "base/log.h"
#include "dist/dist_net.h"
#include "dist/dist_proto.h"
#include "dist/rdma.h"

#include <nng/nng.h>
#include <nng/protocol/pair0/pair.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* POLL_MS: how often a waiting rank looks at the
 * connection; ANSWER_MS: how long the registration waits for each answer;
 * QUEUE: exchange frames the coordinator's reader holds (two are pending
 * at a time at most: the worker sends a layer's MoE part once it has the
 * coordinator's shared expert activation, which the coordinator may not
 * have taken the worker's yet; plus a late one of a failed step); MAX_DROPS: freed sessions one
 * STEP names at most (a worker keeping one more only holds its memory). */
enum { POLL_MS = 100, ANSWER_MS = 5000, QUEUE = 8, MAX_DROPS = 4096, HEAD_ROWS = 16 };

bool ds4_tp_check_options(ds4_dist_params *p, char *err, size_t errlen) {
    if (!p->tp) return true;
    if (p->transport_auto) {
        char why[300];
        p->transport_rdma = ds4_rdma_probe(p->rdma_device, why, sizeof why);
        p->transport_auto = false;
    }
    if (p->transport_rdma && !ds4_rdma_probe(p->rdma_device, err, errlen)) return false;
    if (p->role == DS4_DIST_NONE) {
        snprintf(err, errlen, "--tensor-parallel needs --role coordinator or --role worker");
        return false;
    }
    return true;
}

/* The worker's experts: the upper half, [mid, n_expert). */
static int expert_mid(const ds4_tp_family *f) { return f->n_expert / 2; }

/* A sequence's state: the union's one pointer, whichever family's. */
static void *seq_state(const ds4_backend_seq *q) { return q->kv; }

/* ================================================================ link */

/* Sealed, counted frames on one pair socket, registered on one connection
 * (pipe id). The pipe notification records every closed connection, so a
 * rank sees the registered one go whatever the order in which NNG reports
 * connections and messages: removed[] holds the last closed ids, and a
 * connection that closed before it was registered is found there. */
enum { REMOVED_KEPT = 8 };
typedef struct {
    nng_socket s;
    atomic_uint registered;     /* the connection the peer was welcomed on; 0: none */
    atomic_bool gone;           /* and it closed */
    atomic_uint removed[REMOVED_KEPT], n_removed;
    uint8_t send_key[DS4_DIST_SEAL_BYTES], recv_key[DS4_DIST_SEAL_BYTES];
    uint64_t sent, received;
    double reply_s;
    /* --transport rdma: the queue pair the exchange frames (TP_PART) go
     * over once both hosts connected it (NULL: the connection carries them) */
    ds4_rdma *rdma;
    uint8_t rdma_gid[16];
    ds4_dist_rdma rdma_mine;    /* this host's queue pair as offered (its gid: rdma_gid) */
    char rdma_err[300];         /* why the last RDMA send failed */
    /* this step's telemetry */
    uint64_t bytes_out, bytes_in;
    double wait_s;
    int gates;
} tp_link;

static void on_removed(nng_pipe pipe, nng_pipe_ev ev, void *arg) {
    (void)ev;
    tp_link *l = arg;
    const unsigned id = nng_pipe_id(pipe);
    atomic_store(&l->removed[atomic_fetch_add(&l->n_removed, 1) % REMOVED_KEPT], id);
    if (atomic_load(&l->registered) == id) atomic_store(&l->gone, true);
}

static void link_register(tp_link *l, unsigned pipe) {
    atomic_store(&l->gone, false);
    atomic_store(&l->registered, pipe);
    for (int i = 0; i < REMOVED_KEPT; i++)
        if (atomic_load(&l->removed[i]) == pipe) atomic_store(&l->gone, true);
}

static int watch_pipes(tp_link *l) { return nng_pipe_notify(l->s, NNG_PIPE_EV_REM_POST, on_removed, l); }

static bool link_gone(tp_link *l) { return atomic_load(&l->gone); }

/* Seals msg (freed) under the send key and sends it. A pair socket's send
 * waits while it has no connection, so it waits POLL_MS at a time (the
 * socket's send timeout) and gives up with NNG_ECLOSED once the registered
 * connection is gone, or NNG_ETIMEDOUT after reply_s. */
static int link_send(tp_link *l, uint8_t *msg, size_t len) {
    msg = ds4_dist_seal(msg, &len, l->send_key, sizeof l->send_key);
    int rv = msg ? NNG_ETIMEDOUT : NNG_ENOMEM;
    const double deadline = ds4_dist_now() + l->reply_s;
    while (rv == NNG_ETIMEDOUT) {
        if (link_gone(l)) { rv = NNG_ECLOSED; break; }
        rv = nng_send(l->s, msg, len, 0);
        if (rv == NNG_ETIMEDOUT && ds4_dist_now() > deadline) break;
    }
    free(msg);
    if (!rv) { l->sent++; l->bytes_out += len; }
    return rv;
}

/* An exchange frame (msg freed) to the peer: over the RDMA queue pair when
 * there is one, else the connection. NNG_ECLOSED when the queue pair
 * failed (rdma_err says why). */
static int link_send_part(tp_link *l, uint8_t *msg, size_t len) {
    if (!l->rdma) return link_send(l, msg, len);
    msg = ds4_dist_seal(msg, &len, l->send_key, sizeof l->send_key);
    int rv = NNG_ENOMEM;
    if (msg) rv = ds4_rdma_send(l->rdma, msg, len, l->reply_s, l->rdma_err, sizeof l->rdma_err) ? NNG_ECLOSED : 0;
    free(msg);
    if (!rv) { l->sent++; l->bytes_out += len; }
    return rv;
}

/* The local IPv4 address of connection pipe (false: not IPv4): the GID
 * rule's address (rdma.h). */
static bool pipe_ipv4(nng_pipe pipe, uint8_t out[4]) {
    nng_sockaddr sa;
    if (nng_pipe_get_addr(pipe, NNG_OPT_LOCADDR, &sa) || sa.s_family != NNG_AF_INET) return false;
    memcpy(out, &sa.s_in.sa_addr, 4);   /* network order: a.b.c.d */
    return true;
}

/* This host's queue pair details (TP_RDMA) to the peer: over the
 * connection when offered, over the queue pair itself once connected (the
 * worker's proof that both ends are ready). */
static bool rdma_announce(tp_link *l, bool over_rdma, char *err, size_t errlen) {
    l->rdma_mine.counter = l->sent;
    size_t len;
    uint8_t *msg = ds4_dist_encode_tp_rdma(&l->rdma_mine, &len);
    const int rv = !msg ? NNG_ENOMEM : over_rdma ? link_send_part(l, msg, len) : link_send(l, msg, len);
    if (rv && over_rdma) snprintf(err, errlen, "cannot send over the RDMA queue pair: %s", l->rdma_err);
    else if (rv) snprintf(err, errlen, "cannot send this host's RDMA queue pair over the connection");
    return rv == 0;
}

/* --transport rdma, after the WELCOME: this host's queue pair for the
 * connection pipe (a previous one closed). max_bytes: the largest exchange
 * frame it takes. */
static bool rdma_open_link(tp_link *l, const ds4_dist_params *p, nng_pipe pipe, size_t max_bytes, char *err,
                           size_t errlen) {
    ds4_rdma_close(l->rdma);
    uint8_t ip[4];
    const bool v4 = pipe_ipv4(pipe, ip);
    l->rdma = ds4_rdma_open(p->rdma_device, p->rdma_gid_set ? p->rdma_gid_index : -1, v4 ? ip : NULL, max_bytes,
                            &l->rdma_mine, l->rdma_gid, err, errlen);
    return l->rdma != NULL;
}

/* A received message unsealed, decoded and checked against the counter. */
static bool link_open(tp_link *l, const void *buf, size_t blen, ds4_dist_frame *f, char *err, size_t errlen) {
    size_t n;
    if (!ds4_dist_unseal(buf, blen, l->recv_key, sizeof l->recv_key, &n)) {
        snprintf(err, errlen, "a frame fails the link's seal");
        return false;
    }
    if (!ds4_dist_decode(buf, n, f, err, errlen)) return false;
    const uint64_t counter = f->type == DS4_DIST_TP_STEP || f->type == DS4_DIST_TP_STATE || f->type == DS4_DIST_TP_PART
                                 ? f->tp.counter
                             : f->type == DS4_DIST_TP_RDMA ? f->rdma.counter
                                                           : UINT64_MAX;
    if (counter != l->received) {
        snprintf(err, errlen, "frame %llu of type %d where frame %llu was due (out of order or sent again)",
                 (unsigned long long)counter, f->type, (unsigned long long)l->received);
        return false;
    }
    l->received++;
    l->bytes_in += blen;
    return true;
}

/* Who a rank is, as a HELLO says it (the coordinator compares its own). */
static ds4_dist_hello identity(const ds4_tp_family *f, bool numerics, int ctx, const uint8_t *nonce) {
    return (ds4_dist_hello){NULL, nonce, f->name, strlen(f->name), (uint32_t)f->n_layer, (uint32_t)f->n_embd,
                            (uint32_t)f->n_hc, (uint32_t)f->n_vocab, (uint32_t)f->expert_bits, 0,
                            (uint32_t)f->n_layer - 1, true, (uint32_t)ctx, "", 0, numerics, {0}};
}

/* The largest PART: a batch's layer exchange (the family's row_floats per
 * row), or a chunk of the vocabulary's half (HEAD_ROWS: the forward passes'
 * chunk of output rows, or more). */
static size_t part_max(const ds4_tp_family *f, int max_batch) {
    const size_t head = (size_t)HEAD_ROWS * (f->n_vocab - f->n_vocab / 2), floats = (size_t)max_batch * f->row_floats;
    return ds4_dist_tp_part_frame_max(floats > head ? floats : head);
}

/* The largest frame a worker receives: a PART, a STEP of a batch, a STATE
 * of a ctx-token session. */
static size_t frame_max(const ds4_tp_family *f, int max_batch, int ctx) {
    const size_t part = part_max(f, max_batch);
    const size_t step = ds4_dist_tp_step_frame_max((size_t)max_batch, (size_t)max_batch, MAX_DROPS);
    const size_t state = ds4_dist_tp_state_frame_max(f->state_max(f->m, ctx));
    const size_t m = part > step ? part : step;
    return m > state ? m : state;
}

/* ================================================================ coordinator */

typedef struct {
    const void *kv;     /* the family's state */
    uint64_t id;
    int worker_pos;     /* where the worker's copy is; -1: it has none it can use */
} tp_session;

typedef struct {
    void *buf;
    size_t len;         /* the unsealed frame's length */
} queued;

typedef struct {
    ds4_backend base;
    ds4_backend *local;
    ds4_tp_family fam;
    ds4_dist_params p;
    ds4_dist_tls tls;
    char url[256];
    ds4_dist_hello me;
    tp_link link;
    pthread_t reader;
    bool reader_started;

    /* under mu: the reader thread's registrations and the PART queue */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, ready;
    uint64_t generation;        /* welcomes so far */
    uint32_t worker_ctx;
    queued q[QUEUE];
    int q_n;
    bool challenged;            /* a CHALLENGE went out for nonce_w */
    double challenged_at;
    uint8_t nonce_w[DS4_DIST_NONCE_BYTES], nonce_c[DS4_DIST_NONCE_BYTES];
    nng_pipe pipe;              /* the registered worker's connection */

    /* the engine's thread only */
    tp_session *sess;
    int n_sess, cap_sess;
    uint64_t next_id, *drops;
    int n_drops, cap_drops;
    uint64_t generation_known; /* the worker the sessions' worker_pos describe */
    uint64_t step;              /* STEP frames sent */
    bool failed, transport_failed;
    char why[400];
    float *scratch;             /* --tensor-parallel-token-prefill: logits nobody asked for */
} tp_coord;

/* Registration (the reader thread): KNOCK answered with a CHALLENGE, the
 * sealed HELLO with WELCOME or REFUSED. */
static void answer_registration(tp_coord *c, const void *buf, size_t blen, nng_pipe pipe) {
    ds4_dist_frame f;
    char err[300];
    size_t len;
    if (ds4_dist_decode(buf, blen, &f, err, sizeof err) && f.type == DS4_DIST_KNOCK) {
        uint8_t proof[DS4_DIST_SEAL_BYTES];
        memcpy(c->nonce_w, f.challenge.nonce, sizeof c->nonce_w);
        if (!ds4_dist_random(c->nonce_c, sizeof c->nonce_c)) return;
        ds4_dist_handshake_key(c->p.secret, DS4_DIST_COORDINATOR_PROOF, c->nonce_w, c->nonce_c, proof);
        uint8_t *msg = ds4_dist_encode_challenge(c->nonce_c, proof, &len);
        if (msg && !nng_send(c->link.s, msg, len, 0)) {
            c->challenged = true;
            c->challenged_at = ds4_dist_now();
        }
        free(msg);
        return;
    }
    if (!c->challenged || ds4_dist_now() - c->challenged_at > 10) return;
    uint8_t key[DS4_DIST_SEAL_BYTES];
    ds4_dist_handshake_key(c->p.secret, DS4_DIST_HANDSHAKE_KEY, c->nonce_w, c->nonce_c, key);
    size_t n;
    if (!ds4_dist_unseal(buf, blen, key, sizeof key, &n) || !ds4_dist_decode(buf, n, &f, err, sizeof err) ||
        f.type != DS4_DIST_HELLO || !ds4_dist_same(f.hello.challenge, c->nonce_c, sizeof c->nonce_c))
        return;
    c->challenged = false;   /* each challenge is answered once */
    char line[400] = "";
    bool ok = ds4_dist_hello_compatible(&c->me, &f.hello, line, sizeof line);
    if (ok && (f.hello.first != 0 || f.hello.last + 1 != f.hello.n_layer || !f.hello.output)) {
        snprintf(line, sizeof line, "refused: a tensor-parallel worker holds the whole model");
        ok = false;
    }
    if (ok)
        snprintf(line, sizeof line, "welcome: tensor parallel with %s, this worker computes experts %d..%d of every "
                                    "layer",
                 c->url, expert_mid(&c->fam), c->fam.n_expert - 1);
    uint8_t *msg = ds4_dist_encode_text(ok ? DS4_DIST_WELCOME : DS4_DIST_REFUSED, line, &len);
    msg = ds4_dist_seal(msg, &len, key, sizeof key);
    const int rv = msg ? nng_send(c->link.s, msg, len, 0) : NNG_ENOMEM;
    free(msg);
    if (!ok || rv) return;
    ds4_dist_link_key(c->p.secret, c->nonce_c, c->link.send_key);
    ds4_dist_link_key(c->p.secret, c->nonce_w, c->link.recv_key);
    c->link.sent = c->link.received = 0;
    link_register(&c->link, nng_pipe_id(pipe));
    c->worker_ctx = f.hello.ctx;
    c->pipe = pipe;
    for (int i = 0; i < c->q_n; i++) nng_free(c->q[i].buf, c->q[i].len);
    c->q_n = 0;
    c->ready = true;
    c->generation++;
    if (c->p.debug) ds4_log(DS4_LOG_INFO, "ds4: tensor-parallel worker registered (%.*s)\n", (int)f.hello.model_len,
                            f.hello.model);
    pthread_cond_broadcast(&c->cv);
}

/* The reader thread: the only receiver on the socket, so a registration is
 * answered whenever it comes, and exchange frames queue for the step. */
static void *reader_loop(void *arg) {
    tp_coord *c = arg;
    for (;;) {
        nng_msg *msg = NULL;
        const int rv = nng_recvmsg(c->link.s, &msg, 0);
        pthread_mutex_lock(&c->mu);
        if (c->stop) { pthread_mutex_unlock(&c->mu); if (msg) nng_msg_free(msg); break; }
        if (rv) {
            pthread_mutex_unlock(&c->mu);
            if (rv != NNG_ETIMEDOUT) break;
            continue;
        }
        if (c->ready && link_gone(&c->link)) {
            c->ready = false;
            pthread_cond_broadcast(&c->cv);
        }
        const void *body = nng_msg_body(msg);
        const size_t blen = nng_msg_len(msg);
        ds4_dist_frame f;
        char err[300];
        ds4_dist_frame knock;
        const bool registering = ds4_dist_decode(body, blen, &knock, err, sizeof err) && knock.type == DS4_DIST_KNOCK;
        if (c->ready && registering) {
            /* the worker gave up waiting for an answer and starts again */
            c->ready = false;
            pthread_cond_broadcast(&c->cv);
        }
        if (c->ready && nng_pipe_id(nng_msg_get_pipe(msg)) == nng_pipe_id(c->pipe)) {
            const bool opened = link_open(&c->link, body, blen, &f, err, sizeof err);
            /* its queue pair (TP_RDMA) waits for await_worker like an exchange frame */
            const bool wanted = f.type == DS4_DIST_TP_PART || (f.type == DS4_DIST_TP_RDMA && c->p.transport_rdma);
            if (!opened || !wanted) {
                ds4_log(DS4_LOG_WARN, "ds4: tensor-parallel worker: %s; closing its connection\n",
                        !opened                          ? err
                        : f.type == DS4_DIST_TP_RDMA     ? "it uses --transport rdma, this coordinator tcp"
                                                         : "an unexpected frame");
                nng_pipe_close(c->pipe);
                c->ready = false;
                pthread_cond_broadcast(&c->cv);
            } else if (c->q_n < QUEUE) {
                void *copy = nng_alloc(blen);
                if (copy) {
                    memcpy(copy, body, blen);
                    c->q[c->q_n++] = (queued){copy, blen - DS4_DIST_SEAL_BYTES};
                    pthread_cond_broadcast(&c->cv);
                }
            }
        } else {
            answer_registration(c, body, blen, nng_msg_get_pipe(msg));
        }
        pthread_mutex_unlock(&c->mu);
        nng_msg_free(msg);
    }
    return NULL;
}

static void fail(tp_coord *c, bool transport, const char *fmt, const char *what) {
    if (c->failed) return;
    c->failed = true;
    c->transport_failed = transport;
    snprintf(c->why, sizeof c->why, fmt, what);
}

/* The worker's exchange frame f of this step checked against the gate and
 * its size, its floats into recv; else the step fails. */
static void take_part(tp_coord *c, const ds4_dist_frame *f, int layer, float *recv, size_t n_recv) {
    char err[300];
    if (f->tp.status != DS4_DIST_OK) {
        snprintf(err, sizeof err, "%.*s", (int)f->tp.text_len, f->tp.text);
        fail(c, false, "tensor-parallel worker: %s", err);
    } else if (f->tp.layer != (uint32_t)layer || f->tp.n_floats != n_recv) {
        snprintf(err, sizeof err, "layer %u with %u floats where layer %d with %zu was due", f->tp.layer,
                 f->tp.n_floats, layer, n_recv);
        fail(c, true, "tensor-parallel worker out of step: %s", err);
    } else {
        ds4_dist_floats(f->tp.floats, n_recv, recv);
    }
}

/* The worker's frame of this exchange over the RDMA queue pair (the engine
 * thread alone reads it; the reader thread still watches the connection). */
static void coord_receive_rdma(tp_coord *c, uint64_t this_step, int layer, float *recv, size_t n_recv,
                               double deadline) {
    while (!c->failed) {
        pthread_mutex_lock(&c->mu);
        const bool lost = !c->ready || c->generation != c->generation_known || link_gone(&c->link);
        pthread_mutex_unlock(&c->mu);
        if (lost) {
            fail(c, true, "%s", "the tensor-parallel worker's connection closed");
            break;
        }
        const void *buf;
        size_t len;
        char err[300];
        const int got = ds4_rdma_recv(c->link.rdma, &buf, &len, POLL_MS, err, sizeof err);
        if (got == 0) {
            if (ds4_dist_now() > deadline)
                fail(c, true, "%s", "the tensor-parallel worker did not answer within --dist-reply-timeout");
            continue;
        }
        ds4_dist_frame f;
        pthread_mutex_lock(&c->mu);   /* the counter is the reader thread's too */
        const bool ok = got == 1 && link_open(&c->link, buf, len, &f, err, sizeof err);
        pthread_mutex_unlock(&c->mu);
        if (!ok || f.type != DS4_DIST_TP_PART) {
            fail(c, true, "tensor-parallel worker: %s", ok ? "a frame other than an exchange over RDMA" : err);
            break;
        }
        if (f.tp.step != this_step) continue;   /* a failed step's */
        take_part(c, &f, layer, recv, n_recv);
        break;
    }
}

/* One gate of the family's split (tp_split.h) is a send and a recv on each
 * side: this rank's part out now, the worker's in when the forward pass
 * needs it. After a failure, zeros: the step is undone. */
static void coord_send(void *ud, int layer, const float *send, size_t n_send) {
    tp_coord *c = ud;
    if (c->failed) return;
    size_t len;
    uint8_t *msg = ds4_dist_encode_tp_part(c->link.sent, c->step - 1, (uint32_t)layer, DS4_DIST_OK, send, n_send, NULL,
                                           &len);   /* (send_step counted this step) */
    int rv = link_send_part(&c->link, msg, len);
    if (rv == NNG_ECLOSED && c->link.rdma) fail(c, true, "tensor-parallel worker: %s", c->link.rdma_err);
    else if (rv == NNG_ECLOSED) fail(c, true, "%s", "the tensor-parallel worker's connection closed");
    else if (rv) fail(c, true, "tensor-parallel worker: cannot send: %s", nng_strerror(rv));
}

static void coord_recv(void *ud, int layer, float *recv, size_t n_recv) {
    tp_coord *c = ud;
    if (c->failed) { if (n_recv) memset(recv, 0, n_recv * sizeof(float)); return; }
    const uint64_t this_step = c->step - 1;
    const double t0 = ds4_dist_now(), deadline = t0 + c->p.reply_seconds;
    if (c->link.rdma) coord_receive_rdma(c, this_step, layer, recv, n_recv, deadline);
    pthread_mutex_lock(&c->mu);
    while (!c->failed && !c->link.rdma) {
        if (!c->ready || c->generation != c->generation_known || link_gone(&c->link)) {
            fail(c, true, "%s", "the tensor-parallel worker's connection closed");
            break;
        }
        if (c->q_n == 0) {
            if (ds4_dist_now() > deadline) {
                fail(c, true, "%s", "the tensor-parallel worker did not answer within --dist-reply-timeout");
                break;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += POLL_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
            continue;
        }
        queued q = c->q[0];
        memmove(c->q, c->q + 1, (size_t)(--c->q_n) * sizeof *c->q);
        ds4_dist_frame f;
        char err[300];
        const bool ok = ds4_dist_decode(q.buf, q.len, &f, err, sizeof err);
        if (ok && f.tp.step != this_step) { nng_free(q.buf, q.len + DS4_DIST_SEAL_BYTES); continue; }   /* a failed step's */
        if (!ok) fail(c, true, "tensor-parallel worker: %s", err);
        else take_part(c, &f, layer, recv, n_recv);
        nng_free(q.buf, q.len + DS4_DIST_SEAL_BYTES);
        break;
    }
    pthread_mutex_unlock(&c->mu);
    c->link.wait_s += ds4_dist_now() - t0;
    c->link.gates++;
    if (c->failed && n_recv) memset(recv, 0, n_recv * sizeof(float));
}

static tp_session *session_of(tp_coord *c, const void *kv) {
    for (int i = 0; i < c->n_sess; i++)
        if (c->sess[i].kv == kv) return &c->sess[i];
    if (c->n_sess == c->cap_sess) {
        const int cap = c->cap_sess ? 2 * c->cap_sess : 8;
        tp_session *s = realloc(c->sess, (size_t)cap * sizeof *s);
        if (!s) return NULL;
        c->sess = s;
        c->cap_sess = cap;
    }
    c->sess[c->n_sess] = (tp_session){kv, ++c->next_id, -1};
    return &c->sess[c->n_sess++];
}

/* --transport rdma, a new worker: this host's queue pair opened, the
 * worker's (which it sends after its WELCOME) taken from the queue, this
 * one connected to it and offered to the worker, and the worker's first
 * message over the queue pair (sent once it connected) received; from now
 * on the exchanges go over RDMA. */
static bool coord_rdma(tp_coord *c, char *err, size_t errlen) {
    pthread_mutex_lock(&c->mu);
    const nng_pipe pipe = c->pipe;
    pthread_mutex_unlock(&c->mu);
    char why[300];
    if (!rdma_open_link(&c->link, &c->p, pipe, part_max(&c->fam, c->local->max_batch), why, sizeof why)) {
        snprintf(err, errlen, "tensor-parallel worker: RDMA: %s", why);
        return false;
    }
    const double deadline = ds4_dist_now() + ANSWER_MS / 1000.0;
    pthread_mutex_lock(&c->mu);
    while (c->q_n == 0 && c->ready && ds4_dist_now() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    queued q = {NULL, 0};
    if (c->q_n) {
        q = c->q[0];
        memmove(c->q, c->q + 1, (size_t)(--c->q_n) * sizeof *c->q);
    }
    pthread_mutex_unlock(&c->mu);
    ds4_dist_frame f;
    bool ok = q.buf && ds4_dist_decode(q.buf, q.len, &f, why, sizeof why) && f.type == DS4_DIST_TP_RDMA;
    if (!ok)
        snprintf(err, errlen, "the tensor-parallel worker sent no RDMA queue pair (is it started with --transport rdma?)");
    /* connected before this host's details go out: the worker's answer
     * over the queue pair finds it ready */
    else if (!(ok = ds4_rdma_connect(c->link.rdma, &f.rdma, why, sizeof why) &&
                    rdma_announce(&c->link, false, why, sizeof why)))
        snprintf(err, errlen, "tensor-parallel worker: RDMA: %s", why);
    const uint32_t worker_qpn = ok ? f.rdma.qpn : 0;
    if (q.buf) nng_free(q.buf, q.len + DS4_DIST_SEAL_BYTES);
    /* the worker, connected, sends its details again over the queue pair:
     * the exchanges go over RDMA only once both ends are known ready */
    int got = 0;
    for (double end = ds4_dist_now() + ANSWER_MS / 1000.0; ok && !got && ds4_dist_now() < end;) {
        const void *buf;
        size_t len;
        if ((got = ds4_rdma_recv(c->link.rdma, &buf, &len, POLL_MS, why, sizeof why)) != 1) continue;
        pthread_mutex_lock(&c->mu);   /* the counter is the reader thread's too */
        const bool opened = link_open(&c->link, buf, len, &f, why, sizeof why);
        pthread_mutex_unlock(&c->mu);
        if (!opened || f.type != DS4_DIST_TP_RDMA || f.rdma.qpn != worker_qpn) {
            if (opened) snprintf(why, sizeof why, "another frame than its queue pair's");
            got = -1;
        }
    }
    if (ok && got != 1) {
        snprintf(err, errlen, "tensor-parallel worker: RDMA: %s", got < 0 ? why : "no message over the queue pair");
        ok = false;
    }
    if (!ok) {
        ds4_rdma_close(c->link.rdma);
        c->link.rdma = NULL;
        return false;
    }
    ds4_rdma_describe(c->link.rdma, why, sizeof why);
    ds4_log(DS4_LOG_INFO, "ds4: tensor-parallel exchanges over RDMA (%s)\n", why);
    return true;
}

/* Waits for a welcomed worker; a new one holds no session. */
static bool await_worker(tp_coord *c, char *err, size_t errlen) {
    const double deadline = ds4_dist_now() + c->p.wait_seconds;
    pthread_mutex_lock(&c->mu);
    while (!(c->ready && !link_gone(&c->link)) && ds4_dist_now() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    const bool ok = c->ready && !link_gone(&c->link);
    const uint64_t gen = c->generation;
    pthread_mutex_unlock(&c->mu);
    if (!ok) {
        snprintf(err, errlen, "%s at %s (waited %.0f s, --dist-wait)",
                 gen ? "the tensor-parallel worker's connection closed and no worker registered again"
                     : "no tensor-parallel worker registered",
                 c->url, c->p.wait_seconds);
        return false;
    }
    if (gen != c->generation_known) {
        for (int i = 0; i < c->n_sess; i++) c->sess[i].worker_pos = -1;
        c->n_drops = 0;
        c->generation_known = gen;
        c->step = 0;
        if (c->p.transport_rdma && !coord_rdma(c, err, errlen)) {
            /* this worker is dropped: it registers again */
            pthread_mutex_lock(&c->mu);
            if (c->ready) nng_pipe_close(c->pipe);
            c->ready = false;
            pthread_mutex_unlock(&c->mu);
            return false;
        }
    }
    return true;
}

/* Sends msg (freed; NULL: out of memory) to the worker, or says why not. */
static int send_or_say(tp_coord *c, uint8_t *msg, size_t len, const char *what, char *err, size_t errlen) {
    const int rv = msg ? link_send(&c->link, msg, len) : NNG_ENOMEM;
    if (!rv) return 0;
    if (rv == NNG_ECLOSED) snprintf(err, errlen, "the tensor-parallel worker's connection closed (sending %s)", what);
    else snprintf(err, errlen, "cannot send %s to the tensor-parallel worker: %s", what, nng_strerror(rv));
    c->transport_failed = true;
    return -1;
}

/* The worker's copy of each sequence's session brought to where the
 * coordinator's is (STATE frames for those it cannot reach by truncation),
 * then the STEP itself. */
static int send_step(tp_coord *c, const ds4_backend_seq *seqs, int n_seqs, char *err, size_t errlen) {
    int total = 0;
    for (int q = 0; q < n_seqs; q++) total += seqs[q].n;
    ds4_dist_tp_seq *recs = calloc((size_t)(n_seqs > 0 ? n_seqs : 1), sizeof *recs);
    int32_t *toks = malloc((size_t)(total ? total : 1) * sizeof *toks);
    int rc = recs && toks ? 0 : -1;
    if (rc) snprintf(err, errlen, "out of memory for a step of %d rows", total);
    for (int q = 0, at = 0; !rc && q < n_seqs; q++) {
        const ds4_tp_family *fm = &c->fam;
        const void *kv = seq_state(&seqs[q]);
        const int ctx = fm->state_ctx(kv), pos = fm->state_pos(kv);
        tp_session *s = session_of(c, kv);
        if (!s) { snprintf(err, errlen, "out of memory"); rc = -1; break; }
        if ((uint32_t)ctx > c->worker_ctx) {
            snprintf(err, errlen, "a session of %d tokens does not fit the tensor-parallel worker's --ctx %u", ctx,
                     c->worker_ctx);
            rc = -1;
            break;
        }
        if (pos > 0 && (s->worker_pos < 0 || s->worker_pos < pos)) {
            const size_t n = fm->state_bytes(fm->m, kv);
            void *state = malloc(n ? n : 1);
            size_t len = 0;
            uint8_t *msg = NULL;
            if (state) {
                fm->state_save(fm->m, kv, state);
                msg = ds4_dist_encode_tp_state(c->link.sent, s->id, (uint32_t)ctx, state, n, &len);
            }
            free(state);
            if ((rc = send_or_say(c, msg, len, "a session's state", err, errlen))) break;
        }
        recs[q] = (ds4_dist_tp_seq){s->id, (uint32_t)ctx, (uint32_t)pos, (uint32_t)seqs[q].n,
                                    seqs[q].all_logits};
        memcpy(toks + at, seqs[q].toks, (size_t)seqs[q].n * sizeof *toks);
        at += seqs[q].n;
    }
    if (!rc) {
        size_t len;
        uint8_t *msg = ds4_dist_encode_tp_step(c->link.sent, c->drops, (uint32_t)c->n_drops, recs, (uint32_t)n_seqs,
                                               toks, &len);
        if (!(rc = send_or_say(c, msg, len, "the step", err, errlen))) {
            c->n_drops = 0;
            c->step++;
        }
    }
    free(recs);
    free(toks);
    return rc;
}

/* Where each sequence's state was before a call (the family's undo);
 * NULL with err when out of memory. */
static void **undo_all(const ds4_tp_family *fm, const ds4_backend_seq *seqs, int n_seqs, char *err, size_t errlen) {
    void **undo = calloc((size_t)(n_seqs ? n_seqs : 1), sizeof *undo);
    int saved = 0;
    while (undo && saved < n_seqs && (undo[saved] = fm->undo_save(seq_state(&seqs[saved]), seqs[saved].n))) saved++;
    if (undo && saved == n_seqs) return undo;
    for (int q = 0; undo && q < saved; q++) fm->undo_free(undo[q]);
    free(undo);
    snprintf(err, errlen, "out of memory for %d sequences", n_seqs);
    return NULL;
}

static void undo_drop(const ds4_tp_family *fm, void **undo, int n) {
    for (int q = 0; q < n; q++) fm->undo_free(undo[q]);
    free(undo);
}

/* One batch on both ranks. */
static int step(tp_coord *c, const ds4_backend_seq *seqs, int n_seqs, char *err, size_t errlen) {
    for (int q = 0; q < n_seqs; q++)
        if (seqs[q].steer || seqs[q].probe) {
            snprintf(err, errlen, "steering and activation probes are not available with --tensor-parallel");
            return -1;
        }
    if (!await_worker(c, err, errlen)) return -1;
    void **undo = undo_all(&c->fam, seqs, n_seqs, err, errlen);
    if (!undo) return -1;
    c->failed = c->transport_failed = false;
    c->link.bytes_out = c->link.bytes_in = 0;
    c->link.wait_s = 0;
    c->link.gates = 0;
    const double t0 = ds4_dist_now();
    int rc = send_step(c, seqs, n_seqs, err, errlen);
    if (!rc) {
        rc = c->local->eval(c->local, seqs, n_seqs, err, errlen);
        if (rc && !c->failed && c->link.gates == 0) {
            /* the worker waits at its first exchange: tell it why none comes */
            size_t len;
            char line[300];
            snprintf(line, sizeof line, "the coordinator failed the step: %s", err);
            uint8_t *msg = ds4_dist_encode_tp_part(c->link.sent, c->step - 1, 0, DS4_DIST_ERROR, NULL, 0, line, &len);
            link_send_part(&c->link, msg, len);
        }
        if (!rc && c->failed) {
            snprintf(err, errlen, "%s", c->why);
            rc = -1;
        }
    }
    if (rc) {
        for (int q = 0; q < n_seqs; q++) c->fam.undo_apply(undo[q], seq_state(&seqs[q]));
        if (c->transport_failed) {
            /* the worker's copies are unknown now: a worker registering
             * again gets every state; this one's connection is dropped */
            pthread_mutex_lock(&c->mu);
            if (c->ready) nng_pipe_close(c->pipe);
            c->ready = false;
            pthread_mutex_unlock(&c->mu);
        }
        /* the worker undid its step too (or will be replaced) */
    } else {
        for (int q = 0; q < n_seqs; q++) {
            tp_session *s = session_of(c, seq_state(&seqs[q]));
            if (s) s->worker_pos = c->fam.state_pos(seq_state(&seqs[q]));
        }
    }
    if (c->p.debug) {
        int rows = 0;
        for (int q = 0; q < n_seqs; q++) rows += seqs[q].n;
        ds4_log(DS4_LOG_INFO, "ds4: tp step %llu: %d rows, %d exchanges, sent %llu bytes, received %llu bytes, "
                              "waited %.3f ms at exchanges, step %.3f ms%s\n",
                (unsigned long long)c->step, rows, c->link.gates, (unsigned long long)c->link.bytes_out,
                (unsigned long long)c->link.bytes_in, c->link.wait_s * 1e3, (ds4_dist_now() - t0) * 1e3,
                rc ? " (failed)" : "");
    }
    undo_drop(&c->fam, undo, n_seqs);
    return rc;
}

static int coord_eval(ds4_backend *be, const ds4_backend_seq *seqs, int n_seqs, char *err, size_t errlen) {
    tp_coord *c = (tp_coord *)be;
    if (!c->p.tp_token_prefill) return step(c, seqs, n_seqs, err, errlen);
    /* one token per step, as decode runs; sequences one after another */
    void **undo = undo_all(&c->fam, seqs, n_seqs, err, errlen);
    if (!undo) return -1;
    int rc = 0;
    const int V = c->fam.n_vocab;
    for (int q = 0; !rc && q < n_seqs; q++) {
        const ds4_backend_seq *sq = &seqs[q];
        for (int i = 0; !rc && i < sq->n; i++) {
            ds4_backend_seq one = *sq;
            one.toks = sq->toks + i;
            one.n = 1;
            one.all_logits = false;
            one.logits = sq->all_logits ? sq->logits + (size_t)i * V : i == sq->n - 1 ? sq->logits : c->scratch;
            rc = step(c, &one, 1, err, errlen);
        }
    }
    /* a failed call leaves every state where it found it; the worker's
     * copies of the sequences that advanced are sent again */
    for (int q = 0; rc && q < n_seqs; q++) {
        c->fam.undo_apply(undo[q], seq_state(&seqs[q]));
        tp_session *s = session_of(c, seq_state(&seqs[q]));
        if (s) s->worker_pos = -1;
    }
    undo_drop(&c->fam, undo, n_seqs);
    return rc;
}

static int coord_kv_sync(ds4_backend *be, struct ds4_kv *kv, bool to_host, char *err, size_t errlen) {
    (void)err; (void)errlen;
    tp_coord *c = (tp_coord *)be;
    if (!to_host) {
        tp_session *s = session_of(c, kv);
        if (s) s->worker_pos = -1;
    }
    return 0;
}

static int coord_scatter(ds4_backend *be, struct ds4_kv *kv, const int32_t *toks, char *err, size_t errlen) {
    (void)toks;
    return coord_kv_sync(be, kv, false, err, errlen);
}

static void coord_release(ds4_backend *be, struct ds4_kv *kv) {
    tp_coord *c = (tp_coord *)be;
    for (int i = 0; i < c->n_sess; i++) {
        if (c->sess[i].kv != kv) continue;
        if (c->n_drops == c->cap_drops) {
            const int cap = c->cap_drops ? 2 * c->cap_drops : 8;
            uint64_t *d = realloc(c->drops, (size_t)cap * sizeof *d);
            if (d) { c->drops = d; c->cap_drops = cap; }
        }
        /* a worker that keeps a session it was not told about only holds memory */
        if (c->n_drops < c->cap_drops && c->n_drops < MAX_DROPS) c->drops[c->n_drops++] = c->sess[i].id;
        c->sess[i] = c->sess[--c->n_sess];
        return;
    }
}

static void coord_free(ds4_backend *be) {
    tp_coord *c = (tp_coord *)be;
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_mutex_unlock(&c->mu);
    nng_close(c->link.s);
    if (c->reader_started) pthread_join(c->reader, NULL);
    for (int i = 0; i < c->q_n; i++) nng_free(c->q[i].buf, c->q[i].len + DS4_DIST_SEAL_BYTES);
    if (c->local) c->local->free(c->local);
    ds4_rdma_close(c->link.rdma);
    ds4_dist_tls_free(&c->tls);
    free(c->sess);
    free(c->drops);
    free(c->scratch);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

ds4_backend *ds4_tp_coordinator_new(ds4_backend *local, const ds4_tp_family *fam, const ds4_dist_params *p,
                                    bool numerics, char *err, size_t errlen) {
    if (strcmp(local->name, fam->backend)) {
        snprintf(err, errlen, "--tensor-parallel runs on the CPU backend only");
        local->free(local);
        return NULL;
    }
    if (!fam->whole || fam->n_expert < 2) {
        snprintf(err, errlen, "--tensor-parallel needs the whole model with at least two routed experts");
        local->free(local);
        return NULL;
    }
    tp_coord *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, errlen, "out of memory"); local->free(local); return NULL; }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->local = local;
    c->fam = *fam;
    c->p = *p;
    c->base.name = "tp";
    c->base.max_batch = local->max_batch;
    c->base.eval = coord_eval;
    c->base.free = coord_free;
    c->base.kv_sync = coord_kv_sync;
    c->base.kv_scatter = coord_scatter;
    c->base.kv_release = coord_release;
    c->base.power = local->power;
    c->me = identity(fam, numerics, 0, NULL);
    c->link.reply_s = p->reply_seconds;
    c->link.s = (nng_socket)NNG_SOCKET_INITIALIZER;
    c->scratch = malloc((size_t)fam->n_vocab * sizeof(float));
    int rv = c->scratch ? 0 : NNG_ENOMEM;
    if (!ds4_dist_tls_load(p, &c->tls, err, errlen)) { coord_free(&c->base); return NULL; }
    snprintf(c->url, sizeof c->url, "%s://%s:%d", ds4_dist_scheme(&c->tls), p->host, p->port);
    if (!rv) rv = nng_pair0_open(&c->link.s);
    if (!rv) rv = watch_pipes(&c->link);
    if (!rv) nng_socket_set_ms(c->link.s, NNG_OPT_RECVTIMEO, POLL_MS);
    if (!rv) nng_socket_set_ms(c->link.s, NNG_OPT_SENDTIMEO, POLL_MS);
    /* the worker sends registrations and PART frames: its expert outputs
     * for a whole batch at most */
    const size_t part = part_max(fam, local->max_batch);
    if (!rv) ds4_dist_recv_limit(c->link.s, part > ((size_t)64 << 10) ? part : (size_t)64 << 10);
    if (!rv) rv = ds4_dist_listen(c->link.s, c->url, &c->tls, NULL);
    if (rv) {
        snprintf(err, errlen, "cannot listen on %s: %s", c->url, nng_strerror(rv));
        coord_free(&c->base);
        return NULL;
    }
    if (!fam->split(local, &(ds4_cpu_split){0, expert_mid(fam), coord_send, coord_recv, c})) {
        snprintf(err, errlen, "out of memory for the tensor-parallel split");
        coord_free(&c->base);
        return NULL;
    }
    if (pthread_create(&c->reader, NULL, reader_loop, c)) {
        snprintf(err, errlen, "cannot start a thread");
        coord_free(&c->base);
        return NULL;
    }
    c->reader_started = true;
    return &c->base;
}

/* ================================================================ worker */

typedef struct {
    uint64_t id;
    void *kv;           /* the family's state */
} worker_session;

typedef struct {
    const ds4_tp_family *fam;
    ds4_backend *be;
    const ds4_dist_params *p;
    tp_link link;
    worker_session *sess;
    int n_sess, cap_sess;
    uint64_t step;              /* STEP frames received */
    bool failed, transport_failed;
    char why[300];
} tp_worker;

static void drop_sessions(tp_worker *w) {
    for (int i = 0; i < w->n_sess; i++) w->fam->state_free(w->sess[i].kv);
    w->n_sess = 0;
}

static worker_session *find_session(tp_worker *w, uint64_t id) {
    for (int i = 0; i < w->n_sess; i++)
        if (w->sess[i].id == id) return &w->sess[i];
    return NULL;
}

static void drop_session(tp_worker *w, uint64_t id) {
    worker_session *s = find_session(w, id);
    if (!s) return;
    w->fam->state_free(s->kv);
    *s = w->sess[--w->n_sess];
}

/* A session of the given context, new or replaced by a fresh one. */
static worker_session *fresh_session(tp_worker *w, uint64_t id, uint32_t ctx) {
    worker_session *s = find_session(w, id);
    const ds4_tp_family *fm = w->fam;
    if (s && fm->state_ctx(s->kv) == (int)ctx) return s;
    void *kv = fm->state_new(fm->m, (int)ctx);
    if (!kv) return NULL;
    if (s) { fm->state_free(s->kv); s->kv = kv; return s; }
    if (w->n_sess == w->cap_sess) {
        const int cap = w->cap_sess ? 2 * w->cap_sess : 8;
        worker_session *n = realloc(w->sess, (size_t)cap * sizeof *n);
        if (!n) { fm->state_free(kv); return NULL; }
        w->sess = n;
        w->cap_sess = cap;
    }
    w->sess[w->n_sess] = (worker_session){id, kv};
    return &w->sess[w->n_sess++];
}

static void worker_fail(tp_worker *w, bool transport, const char *why) {
    if (w->failed) return;
    w->failed = true;
    w->transport_failed = transport;
    snprintf(w->why, sizeof w->why, "%s", why);
}

/* The next frame from the coordinator in an exchange: over the RDMA queue
 * pair when there is one, else the connection; 1 (f, whose bytes live in
 * *buf when it is not NULL: nng_free them), 0 (none within POLL_MS), -1
 * (err). */
static int worker_receive(tp_worker *w, ds4_dist_frame *f, void **buf, size_t *blen, char *err, size_t errlen) {
    *buf = NULL;
    if (w->link.rdma) {
        const void *msg;
        size_t len;
        const int got = ds4_rdma_recv(w->link.rdma, &msg, &len, POLL_MS, err, errlen);
        return got == 1 ? link_open(&w->link, msg, len, f, err, errlen) ? 1 : -1 : got;
    }
    const int rv = nng_recv(w->link.s, buf, blen, NNG_FLAG_ALLOC);
    if (rv == NNG_ETIMEDOUT) return 0;
    if (rv) {
        *buf = NULL;
        snprintf(err, errlen, "%s", nng_strerror(rv));
        return -1;
    }
    return link_open(&w->link, *buf, *blen, f, err, errlen) ? 1 : -1;
}

/* The worker's side of one gate: its send, then its recv. */
static void worker_send(void *ud, int layer, const float *send, size_t n_send) {
    tp_worker *w = ud;
    if (w->failed) return;
    size_t len;
    uint8_t *msg = ds4_dist_encode_tp_part(w->link.sent, w->step - 1, (uint32_t)layer, DS4_DIST_OK, send, n_send, NULL,
                                           &len);
    if (link_send_part(&w->link, msg, len))
        worker_fail(w, true, w->link.rdma ? w->link.rdma_err : "cannot send to the coordinator");
}

static void worker_recv(void *ud, int layer, float *recv, size_t n_recv) {
    tp_worker *w = ud;
    if (w->failed) { if (n_recv) memset(recv, 0, n_recv * sizeof(float)); return; }
    const double deadline = ds4_dist_now() + w->p->reply_seconds;
    while (!w->failed) {
        void *buf;
        size_t blen = 0;
        ds4_dist_frame f;
        char err[300];
        const int got = worker_receive(w, &f, &buf, &blen, err, sizeof err);
        if (got == 0) {
            if (link_gone(&w->link)) worker_fail(w, true, "the coordinator's connection closed");
            else if (ds4_dist_now() > deadline) worker_fail(w, true, "the coordinator did not answer in time");
            continue;
        }
        if (got < 0) {
            worker_fail(w, true, err);
        } else if (f.type != DS4_DIST_TP_PART) {
            worker_fail(w, true, "the coordinator sent a step while one was running");
        } else if (f.tp.step != w->step - 1) {
            if (buf) nng_free(buf, blen);   /* a failed step's */
            continue;
        } else if (f.tp.status != DS4_DIST_OK) {
            snprintf(err, sizeof err, "%.*s", (int)f.tp.text_len, f.tp.text);
            worker_fail(w, false, err);
        } else if (f.tp.layer != (uint32_t)layer || f.tp.n_floats != n_recv) {
            worker_fail(w, true, "the coordinator is out of step");
        } else {
            ds4_dist_floats(f.tp.floats, n_recv, recv);
        }
        if (buf) nng_free(buf, blen);
        break;
    }
    if (w->failed && n_recv) memset(recv, 0, n_recv * sizeof(float));
}

/* Tells the coordinator, at its first exchange, why this step does not run. */
static void refuse_step(tp_worker *w, const char *why) {
    size_t len;
    uint8_t *msg = ds4_dist_encode_tp_part(w->link.sent, w->step - 1, 0, DS4_DIST_ERROR, NULL, 0, why, &len);
    link_send_part(&w->link, msg, len);
}

static void serve_state(tp_worker *w, const ds4_dist_tp *t) {
    worker_session *s = fresh_session(w, t->session, t->ctx);
    if (!s || !w->fam->state_load(w->fam->m, s->kv, t->bytes, t->n_bytes)) {
        /* the STEP that follows finds the session missing and says so */
        if (s) drop_session(w, t->session);
        ds4_log(DS4_LOG_WARN, "ds4 worker: a session's state (%u bytes, ctx %u) does not fit here\n", t->n_bytes, t->ctx);
    }
}

/* false: the connection is to be dropped */
static bool serve_step(tp_worker *w, const ds4_dist_tp *t) {
    w->step++;
    for (uint32_t i = 0; i < t->n_drop; i++) drop_session(w, ds4_dist_u64_at(t->drop, i));
    ds4_backend_seq *seqs = calloc(t->n_seqs ? t->n_seqs : 1, sizeof *seqs);
    int32_t *toks = malloc((size_t)(t->n_tokens ? t->n_tokens : 1) * sizeof *toks);
    const ds4_tp_family *fm = w->fam;
    void **undo = calloc(t->n_seqs ? t->n_seqs : 1, sizeof *undo);
    char why[300] = "";
    if (!seqs || !toks || !undo)
        snprintf(why, sizeof why, "worker: out of memory for a step of %u rows", t->n_tokens);
    for (uint32_t i = 0; i < t->n_tokens && !why[0]; i++) toks[i] = ds4_dist_token_at(t->tokens, i);
    uint32_t saved = 0;
    for (uint32_t q = 0, at = 0; q < t->n_seqs && !why[0]; q++) {
        const ds4_dist_tp_seq r = ds4_dist_tp_seq_at(t->seqs, q);
        worker_session *s = r.pos == 0 ? fresh_session(w, r.session, r.ctx) : find_session(w, r.session);
        if (!s) {
            snprintf(why, sizeof why, "worker: session %llu %s", (unsigned long long)r.session,
                     r.pos ? "is not held here" : "cannot be allocated");
            break;
        }
        void *kv = s->kv;
        if (r.pos == 0) fm->state_reset(kv);
        else if (fm->state_pos(kv) > (int)r.pos && !fm->state_truncate(kv, (int)r.pos)) fm->state_reset(kv);
        if (fm->state_pos(kv) != (int)r.pos) {
            snprintf(why, sizeof why, "worker: session %llu is at position %d, the step starts at %u",
                     (unsigned long long)r.session, fm->state_pos(kv), r.pos);
            break;
        }
        if (!(undo[q] = fm->undo_save(kv, (int)r.n))) { snprintf(why, sizeof why, "worker: out of memory"); break; }
        saved = q + 1;
        /* no logits: rank 1 of the split sends its half of them instead
         * (the state goes in the union's one pointer, whichever family's) */
        seqs[q] = (ds4_backend_seq){.kv = kv, .toks = toks + at, .n = (int)r.n, .all_logits = r.all_logits};
        at += r.n;
    }
    w->failed = w->transport_failed = false;
    if (!why[0]) {
        char err[256];
        if (w->be->eval(w->be, seqs, (int)t->n_seqs, err, sizeof err)) snprintf(why, sizeof why, "worker: %s", err);
    }
    if (why[0] && !w->failed) refuse_step(w, why);
    const bool undone = why[0] || w->failed;
    if (undone) {
        for (uint32_t q = 0; q < saved; q++) fm->undo_apply(undo[q], seq_state(&seqs[q]));
        ds4_log(DS4_LOG_WARN, "ds4 worker: step %llu failed: %s\n", (unsigned long long)w->step, why[0] ? why : w->why);
    }
    undo_drop(fm, undo, (int)saved);
    free(seqs);
    free(toks);
    return !w->transport_failed;
}

/* Serves one registration until its connection is lost. */
static void serve_link(tp_worker *w) {
    for (;;) {
        void *buf;
        size_t blen;
        const int rv = nng_recv(w->link.s, &buf, &blen, NNG_FLAG_ALLOC);
        if (rv == NNG_ETIMEDOUT) {
            if (link_gone(&w->link)) return;
            continue;
        }
        if (rv) return;
        ds4_dist_frame f;
        char err[300];
        bool keep = true;
        if (!link_open(&w->link, buf, blen, &f, err, sizeof err)) {
            ds4_log(DS4_LOG_WARN, "ds4 worker: %s; registering again\n", err);
            keep = false;
        } else if (f.type == DS4_DIST_TP_STATE) {
            serve_state(w, &f.tp);
        } else if (f.type == DS4_DIST_TP_STEP) {
            keep = serve_step(w, &f.tp);
        } else if (f.type == DS4_DIST_TP_RDMA) {
            /* the coordinator's queue pair: the exchanges go over RDMA from now on */
            if (!w->link.rdma) {
                ds4_log(DS4_LOG_WARN, "ds4 worker: the coordinator uses --transport rdma, this worker tcp\n");
                keep = false;
            } else if (!ds4_rdma_connect(w->link.rdma, &f.rdma, err, sizeof err) ||
                       !rdma_announce(&w->link, true, err, sizeof err)) {
                ds4_log(DS4_LOG_WARN, "ds4 worker: RDMA: %s; registering again\n", err);
                keep = false;
            } else {
                ds4_rdma_describe(w->link.rdma, err, sizeof err);
                ds4_log(DS4_LOG_INFO, "ds4 worker: exchanges over RDMA (%s)\n", err);
            }
        }
        /* a PART here belongs to a step that failed: nothing waits for it */
        nng_free(buf, blen);
        if (!keep) return;
    }
}

int ds4_tp_worker_serve(const ds4_tp_family *fam, ds4_backend *be, bool numerics, int ctx, const ds4_dist_params *p) {
    char err[512], line[400];
    tp_worker w = {0};
    w.fam = fam;
    w.be = be;
    w.p = p;
    w.link.s = (nng_socket)NNG_SOCKET_INITIALIZER;
    ds4_dist_tls tls;
    int rc = 1;
    if (strcmp(be->name, fam->backend) || !fam->whole) {
        ds4_log(DS4_LOG_ERROR, "ds4 worker: a tensor-parallel worker runs the whole model on the CPU backend\n");
        return 1;
    }
    if (!ds4_dist_tls_load(p, &tls, err, sizeof err)) { ds4_log(DS4_LOG_ERROR, "ds4 worker: %s\n", err); return 1; }
    char curl[256];
    snprintf(curl, sizeof curl, "%s://%s:%d", ds4_dist_scheme(&tls), p->host, p->port);
    int rv = nng_pair0_open(&w.link.s);
    if (!rv) rv = watch_pipes(&w.link);
    if (!rv) ds4_dist_recv_limit(w.link.s, frame_max(fam, be->max_batch, ctx));
    if (!rv) rv = ds4_dist_dial(w.link.s, curl, &tls);
    if (rv) { ds4_log(DS4_LOG_ERROR, "ds4 worker: cannot reach %s: %s\n", curl, nng_strerror(rv)); goto done; }
    if (!fam->split(be, &(ds4_cpu_split){1, expert_mid(fam), worker_send, worker_recv, &w})) {
        ds4_log(DS4_LOG_ERROR, "ds4 worker: out of memory for the tensor-parallel split\n");
        goto done;
    }
    uint8_t nonce[DS4_DIST_NONCE_BYTES];
    if (!ds4_dist_random(nonce, sizeof nonce)) { ds4_log(DS4_LOG_ERROR, "ds4 worker: cannot draw a random nonce\n"); goto done; }
    const ds4_dist_hello me = identity(fam, numerics, ctx, nonce);
    bool registered = false, waited = false;
    for (;;) {
        /* whatever a lost connection left behind is not for the next one */
        void *stale;
        size_t slen;
        while (!nng_recv(w.link.s, &stale, &slen, NNG_FLAG_ALLOC | NNG_FLAG_NONBLOCK)) nng_free(stale, slen);
        nng_socket_set_ms(w.link.s, NNG_OPT_SENDTIMEO, ANSWER_MS);
        nng_socket_set_ms(w.link.s, NNG_OPT_RECVTIMEO, ANSWER_MS);
        uint8_t nonces[2][DS4_DIST_NONCE_BYTES];
        uint32_t pipe = 0;
        const int hs = ds4_dist_handshake(w.link.s, p->secret, me, nonces, &pipe, line, sizeof line);
        if (hs == -2 || (hs == -1 && registered)) {
            if (!waited && !registered)
                ds4_log(DS4_LOG_WARN, "ds4 worker: no answer from %s yet (is it up?); still trying\n", curl);
            waited = true;
            continue;
        }
        if (hs) {
            ds4_log(DS4_LOG_ERROR, "ds4 worker: tensor parallel with %s: %s\n", curl, line);
            goto done;
        }
        ds4_log(DS4_LOG_INFO, "ds4 worker: %s: %s\n", curl, line);
        registered = true;
        ds4_dist_link_key(p->secret, nonces[0], w.link.send_key);
        ds4_dist_link_key(p->secret, nonces[1], w.link.recv_key);
        w.link.sent = w.link.received = 0;
        link_register(&w.link, pipe);   /* the WELCOME's connection */
        w.step = 0;
        nng_socket_set_ms(w.link.s, NNG_OPT_RECVTIMEO, POLL_MS);
        nng_socket_set_ms(w.link.s, NNG_OPT_SENDTIMEO, POLL_MS);
        w.link.reply_s = p->reply_seconds;
        if (p->transport_rdma &&
            !(rdma_open_link(&w.link, p, (nng_pipe){pipe}, part_max(fam, be->max_batch), err, sizeof err) &&
              rdma_announce(&w.link, false, err, sizeof err))) {
            ds4_log(DS4_LOG_ERROR, "ds4 worker: RDMA: %s\n", err);
            goto done;
        }
        serve_link(&w);
        ds4_rdma_close(w.link.rdma);
        w.link.rdma = NULL;
        drop_sessions(&w);
        ds4_log(DS4_LOG_WARN, "ds4 worker: lost the coordinator at %s; registering again\n", curl);
    }
done:
    ds4_rdma_close(w.link.rdma);
    nng_close(w.link.s);
    drop_sessions(&w);
    free(w.sess);
    ds4_dist_tls_free(&tls);
    return rc;
}
