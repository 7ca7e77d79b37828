/* dist.c -- coordinator backend and worker loop over NNG (see dist.h). */
#include "dist.h"
#include "backend.h"
#include "dist_proto.h"
#include "forward_cpu.h"
#include "gguf.h"
#include "kv.h"
#include "model.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_WORKERS = 16, MAX_SESSIONS = 16, REWIND_SLACK = 256 };

const char ds4_dist_usage[] =
    "      --role coordinator|worker  pipeline parallelism over hosts (README \"Distributed inference\")\n"
    "      --listen HOST PORT    coordinator: where workers register\n"
    "      --coordinator HOST PORT  worker: the coordinator to register with\n"
    "      --dist-secret S       shared secret checked at registration (else $DS4_DIST_SECRET)\n"
    "      --dist-wait SECONDS   coordinator: wait this long for a complete route (default 30)\n"
    "      --debug               route formation and per-hop telemetry on stderr\n";

static bool parse_port(const char *s, int *out) {
    char *end;
    long v = s ? strtol(s, &end, 10) : -1;
    if (!s || *end || v < 1 || v > 65535) return false;
    *out = (int)v;
    return true;
}

int ds4_dist_parse_option(ds4_dist_params *p, int argc, char **argv, int *i, char *err, size_t errlen) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--debug")) { p->debug = true; return 1; }
    const bool listen = !strcmp(a, "--listen"), coord = !strcmp(a, "--coordinator");
    if (listen || coord) {
        const char *port = *i + 2 < argc ? argv[*i + 2] : NULL;
        if (!v || !parse_port(port, &p->port)) { snprintf(err, errlen, "%s needs HOST PORT (port 1..65535)", a); return -1; }
        p->host = v;
        *i += 2;
        return 1;
    }
    if (strcmp(a, "--role") && strcmp(a, "--dist-secret") && strcmp(a, "--dist-wait")) return 0;
    if (!v) { snprintf(err, errlen, "%s needs a value", a); return -1; }
    ++*i;
    if (!strcmp(a, "--dist-secret")) { p->secret = v; return 1; }
    if (!strcmp(a, "--dist-wait")) {
        char *end;
        p->wait_seconds = strtod(v, &end);
        if (*end || !(p->wait_seconds > 0 && p->wait_seconds < 1e6)) { snprintf(err, errlen, "--dist-wait: bad value '%s'", v); return -1; }
        return 1;
    }
    if (!strcmp(v, "coordinator")) p->role = DS4_DIST_COORDINATOR;
    else if (!strcmp(v, "worker")) p->role = DS4_DIST_WORKER;
    else { snprintf(err, errlen, "--role takes coordinator or worker, not '%s'", v); return -1; }
    return 1;
}

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
    if (p->wait_seconds <= 0) p->wait_seconds = 30;
    if (p->reply_seconds <= 0) p->reply_seconds = 120;
    return true;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Who this process is, as a HELLO says it. */
static ds4_dist_hello identity(const ds4_model *m, const ds4_dist_params *p, bool numerics, int ctx, const char *url) {
    const ds4_layer_slice *sl = &m->slice;
    return (ds4_dist_hello){p->secret, strlen(p->secret), m->name, strlen(m->name), (uint32_t)m->cfg.n_layer,
                            (uint32_t)m->cfg.n_embd, (uint32_t)m->cfg.n_hc, (uint32_t)m->cfg.n_vocab,
                            (uint32_t)ds4_model_expert_bits(m), (uint32_t)sl->first, (uint32_t)sl->last, sl->output,
                            (uint32_t)ctx, url, url ? strlen(url) : 0, numerics};
}

/* One request, one reply: the reply is decoded into *f over *buf (caller nng_free()s). */
static bool exchange(nng_socket s, uint8_t *msg, size_t len, void **buf, size_t *blen, ds4_dist_frame *f, char *err,
                     size_t errlen) {
    int rv = msg ? nng_send(s, msg, len, 0) : NNG_ENOMEM;
    free(msg);
    if (rv == 0) rv = nng_recv(s, buf, blen, NNG_FLAG_ALLOC);
    if (rv) { snprintf(err, errlen, "%s", msg ? nng_strerror(rv) : "out of memory"); return false; }
    if (!ds4_dist_decode(*buf, *blen, f, err, errlen)) { nng_free(*buf, *blen); *buf = NULL; return false; }
    return true;
}

/* ================================================================ coordinator */

typedef struct {
    bool live;
    int first, last;
    bool output;
    char url[160];
    nng_socket data;
    bool dialed;
} worker_slot;

typedef struct {
    const struct ds4_kv *kv;
    int n_pos;
    uint64_t hash;
} session_hash;

typedef struct {
    ds4_backend base;
    ds4_backend *local;
    const ds4_model *m;
    ds4_dist_params p;
    ds4_dist_hello me;
    nng_socket control;
    pthread_t thread;
    bool thread_started, stop;
    pthread_mutex_t mu;
    pthread_cond_t changed;
    worker_slot workers[MAX_WORKERS];
    session_hash sessions[MAX_SESSIONS];
    float *hidden[2];
    size_t hidden_cap;
} coord;

/* A registration: refused when incompatible or overlapping a live worker
 * other than one for the same slice (that one is a restart and is replaced). */
static uint8_t *handle_hello(coord *c, const ds4_dist_hello *h, size_t *len) {
    char why[256];
    if (!ds4_dist_hello_compatible(&c->me, h, why, sizeof why))
        return ds4_dist_encode_text(DS4_DIST_REFUSED, why, len);
    if ((int)h->first <= c->m->slice.last) {
        snprintf(why, sizeof why, "refused: layers %u..%u overlap the coordinator's 0..%d", h->first, h->last,
                 c->m->slice.last);
        return ds4_dist_encode_text(DS4_DIST_REFUSED, why, len);
    }
    if (h->data_url_len == 0 || h->data_url_len >= sizeof c->workers[0].url) {
        snprintf(why, sizeof why, "refused: no usable data address");
        return ds4_dist_encode_text(DS4_DIST_REFUSED, why, len);
    }
    pthread_mutex_lock(&c->mu);
    worker_slot *slot = NULL;
    for (int i = 0; i < MAX_WORKERS; i++) {
        worker_slot *w = &c->workers[i];
        if (!w->live) { if (!slot) slot = w; continue; }
        if (w->first == (int)h->first && w->last == (int)h->last && w->output == h->output) {
            if (strlen(w->url) == h->data_url_len && !memcmp(w->url, h->data_url, h->data_url_len)) {
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
    if (slot->dialed) nng_close(slot->data);
    *slot = (worker_slot){true, (int)h->first, (int)h->last, h->output, "", NNG_SOCKET_INITIALIZER, false};
    memcpy(slot->url, h->data_url, h->data_url_len);
    if (c->p.debug)
        fprintf(stderr, "ds4 coordinator: worker registered: layers %d..%d%s at %s\n", slot->first, slot->last,
                slot->output ? " + output" : "", slot->url);
    pthread_cond_broadcast(&c->changed);
    pthread_mutex_unlock(&c->mu);
    return ds4_dist_encode_text(DS4_DIST_WELCOME, "registered", len);
}

static void *control_loop(void *arg) {
    coord *c = arg;
    while (!c->stop) {
        void *buf;
        size_t len;
        if (nng_recv(c->control, &buf, &len, NNG_FLAG_ALLOC)) continue;   /* timeout: look at stop */
        ds4_dist_frame f;
        char err[256];
        size_t rlen = 0;
        const bool hello = ds4_dist_decode(buf, len, &f, err, sizeof err) && f.type == DS4_DIST_HELLO;
        char why[300];
        snprintf(why, sizeof why, "refused: %s", hello ? "" : f.type ? "expected a HELLO frame" : err);
        uint8_t *reply = hello ? handle_hello(c, &f.hello, &rlen) : ds4_dist_encode_text(DS4_DIST_REFUSED, why, &rlen);
        nng_free(buf, len);
        if (reply) nng_send(c->control, reply, rlen, 0);
        free(reply);
    }
    return NULL;
}

/* The route after the coordinator's slice, in layer order; 0 with a line in
 * err while some layers have no live worker. Caller holds mu. */
static int route(coord *c, worker_slot **hops, char *err, size_t errlen) {
    int n = 0, next = c->m->slice.last + 1;
    const int L = c->m->cfg.n_layer;
    while (next < L) {
        worker_slot *w = NULL;
        for (int i = 0; i < MAX_WORKERS && !w; i++)
            if (c->workers[i].live && c->workers[i].first == next) w = &c->workers[i];
        if (!w) { snprintf(err, errlen, "incomplete route: no worker holds layer %d (of 0..%d)", next, L - 1); return 0; }
        hops[n++] = w;
        next = w->last + 1;
    }
    if (!hops[n - 1]->output) {
        snprintf(err, errlen, "incomplete route: the last worker (layers %d..%d) does not own the output head",
                 hops[n - 1]->first, hops[n - 1]->last);
        return 0;
    }
    return n;
}

static session_hash *session_of(coord *c, const struct ds4_kv *kv) {
    session_hash *free_slot = NULL;
    for (int i = 0; i < MAX_SESSIONS; i++) {
        if (c->sessions[i].kv == kv) return &c->sessions[i];
        if (!c->sessions[i].kv && !free_slot) free_slot = &c->sessions[i];
    }
    if (!free_slot) free_slot = &c->sessions[0];   /* forgetting one only costs that session a replay */
    *free_slot = (session_hash){kv, 0, DS4_DIST_HASH_EMPTY};
    return free_slot;
}

static bool grow_hidden(coord *c, size_t floats) {
    if (floats <= c->hidden_cap) return true;
    float *a = malloc(floats * sizeof(float)), *b = malloc(floats * sizeof(float));
    if (!a || !b) { free(a); free(b); return false; }
    free(c->hidden[0]); free(c->hidden[1]);
    c->hidden[0] = a; c->hidden[1] = b;
    c->hidden_cap = floats;
    return true;
}

/* One sequence through the remote hops; the local slice already left its
 * hidden states in c->hidden[0]. */
static int remote_hops(coord *c, worker_slot **hops, int n_hops, const ds4_backend_seq *sq, int pos,
                       uint64_t hash_before, uint64_t hash_after, char *err, size_t errlen) {
    const size_t hcE = (size_t)c->m->cfg.n_hc * c->m->cfg.n_embd, V = (size_t)c->m->cfg.n_vocab;
    const float *in = c->hidden[0];
    for (int h = 0; h < n_hops; h++) {
        worker_slot *w = hops[h];
        const bool last = h == n_hops - 1;
        if (!w->dialed) {
            int rv = nng_req0_open(&w->data);
            if (!rv) {
                nng_socket_set_ms(w->data, NNG_OPT_RECVTIMEO, (nng_duration)(c->p.reply_seconds * 1000));
                nng_socket_set_ms(w->data, NNG_OPT_SENDTIMEO, (nng_duration)(c->p.reply_seconds * 1000));
                rv = nng_dial(w->data, w->url, NULL, 0);
                if (rv) nng_close(w->data);
            }
            if (rv) { snprintf(err, errlen, "cannot reach the worker at %s: %s", w->url, nng_strerror(rv)); return -2; }
            w->dialed = true;
        }
        ds4_dist_work wk = {(uint64_t)(uintptr_t)sq->kv, (uint32_t)pos, (uint32_t)sq->n, hash_before, hash_after,
                            sq->all_logits, NULL, (uint32_t)((size_t)sq->n * hcE), NULL};
        size_t len;
        const double t0 = now_seconds();
        uint8_t *msg = ds4_dist_encode_work(&wk, sq->toks, in, &len);
        void *buf = NULL;
        size_t blen = 0;
        ds4_dist_frame f;
        char why[256];
        if (!exchange(w->data, msg, len, &buf, &blen, &f, why, sizeof why)) {
            snprintf(err, errlen, "worker layers %d..%d at %s is gone (%s): route dropped", w->first, w->last, w->url, why);
            return -2;
        }
        const ds4_dist_result *r = &f.result;
        const size_t want = last ? (sq->all_logits ? (size_t)sq->n * V : V) : (size_t)sq->n * hcE;
        int rc = 0;
        if (f.type != DS4_DIST_RESULT || r->session != wk.session) {
            snprintf(err, errlen, "worker layers %d..%d answered out of turn", w->first, w->last);
            rc = -2;
        } else if (r->status != DS4_DIST_OK) {
            snprintf(err, errlen, "worker layers %d..%d: %.*s", w->first, w->last, (int)r->text_len, r->text);
            rc = -1;
        } else if (r->n_floats != want || r->hash_after != hash_after) {
            snprintf(err, errlen, "worker layers %d..%d returned %u floats (hash %016llx), expected %zu (hash %016llx)",
                     w->first, w->last, r->n_floats, (unsigned long long)r->hash_after, want,
                     (unsigned long long)hash_after);
            rc = -1;
        } else {
            float *dst = last ? sq->logits : c->hidden[(h + 1) % 2];
            for (size_t i = 0; i < want; i++) dst[i] = ds4_dist_float_at(r->floats, i);
            in = dst;
        }
        if (c->p.debug)
            fprintf(stderr, "ds4 coordinator: hop layers %d..%d: tokens %d..%d, %zu bytes out, %zu back, %.2f ms\n", w->first,
                    w->last, pos, pos + sq->n - 1, len, blen, (now_seconds() - t0) * 1e3);
        nng_free(buf, blen);
        if (rc) return rc;
    }
    return 0;
}

static int coord_eval(ds4_backend *be, const ds4_backend_seq *seqs, int n_seqs, char *err, size_t errlen) {
    coord *c = (coord *)be;
    const size_t hcE = (size_t)c->m->cfg.n_hc * c->m->cfg.n_embd;
    worker_slot *hops[MAX_WORKERS];
    pthread_mutex_lock(&c->mu);
    const double deadline = now_seconds() + c->p.wait_seconds;
    int n_hops;
    while (!(n_hops = route(c, hops, err, errlen)) && now_seconds() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&c->changed, &c->mu, &ts);
    }
    pthread_mutex_unlock(&c->mu);
    if (!n_hops) return -1;
    /* one sequence at a time: the route carries one span per request */
    for (int q = 0; q < n_seqs; q++) {
        ds4_backend_seq sq = seqs[q];
        if (!grow_hidden(c, (size_t)sq.n * hcE)) { snprintf(err, errlen, "out of memory for hidden states"); return -1; }
        session_hash *sh = session_of(c, sq.kv);
        const int pos = sq.kv->n_pos;
        /* a session rewound (other than to the start) or restored since its
         * last call has a prefix this backend did not see: its hash is
         * unknown and the workers refuse it */
        const uint64_t before = pos == 0 ? DS4_DIST_HASH_EMPTY : sh->n_pos == pos ? sh->hash : 0;
        const uint64_t after = ds4_dist_hash_tokens(before, sq.toks, sq.n);
        ds4_backend_seq local = sq;
        local.hidden_out = c->hidden[0];
        local.logits = NULL;
        if (c->local->eval(c->local, &local, 1, err, errlen)) return -1;
        pthread_mutex_lock(&c->mu);
        int rc = remote_hops(c, hops, n_hops, &sq, pos, before, after, err, errlen);
        if (rc == -2)
            for (int h = 0; h < n_hops; h++) {
                /* drop the route: a replacement must register before the next call */
                if (hops[h]->dialed) nng_close(hops[h]->data);
                hops[h]->live = hops[h]->dialed = false;
            }
        pthread_mutex_unlock(&c->mu);
        if (rc) { sq.kv->n_pos = pos; sh->n_pos = -1; return -1; }
        sh->n_pos = pos + sq.n;
        sh->hash = after;
    }
    return 0;
}

static void coord_kv_release(ds4_backend *be, struct ds4_kv *kv) {
    coord *c = (coord *)be;
    for (int i = 0; i < MAX_SESSIONS; i++)
        if (c->sessions[i].kv == kv) c->sessions[i].kv = NULL;
}

static void coord_free(ds4_backend *be) {
    coord *c = (coord *)be;
    if (c->thread_started) {
        c->stop = true;
        pthread_join(c->thread, NULL);
    }
    nng_close(c->control);
    for (int i = 0; i < MAX_WORKERS; i++)
        if (c->workers[i].dialed) nng_close(c->workers[i].data);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->changed);
    free(c->hidden[0]); free(c->hidden[1]);
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
    coord *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, errlen, "out of memory for the coordinator"); local->free(local); return NULL; }
    c->base = (ds4_backend){"dist", local->max_batch, 0, coord_eval, coord_free, NULL, coord_kv_release};
    c->local = local;
    c->m = m;
    c->p = *p;
    c->me = identity(m, &c->p, numerics, 0, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->changed, NULL);
    char url[200];
    snprintf(url, sizeof url, "tcp://%s:%d", p->host, p->port);
    int rv = nng_rep0_open(&c->control);
    if (!rv) nng_socket_set_ms(c->control, NNG_OPT_RECVTIMEO, 200);
    if (!rv) rv = nng_listen(c->control, url, NULL, 0);
    if (rv) {
        snprintf(err, errlen, "cannot listen on %s: %s", url, nng_strerror(rv));
        coord_free(&c->base);
        return NULL;
    }
    if (pthread_create(&c->thread, NULL, control_loop, c)) {
        snprintf(err, errlen, "cannot start the registration thread");
        coord_free(&c->base);
        return NULL;
    }
    c->thread_started = true;
    if (p->debug) fprintf(stderr, "ds4 coordinator: coordinator layers 0..%d listening on %s\n", m->slice.last, url);
    return &c->base;
}

/* ================================================================ worker */

typedef struct {
    uint64_t id;
    ds4_kv *kv;
    uint64_t hash;
    uint64_t last_use;
} worker_session;

typedef struct {
    ds4_model *m;
    ds4_backend *be;
    int ctx;
    worker_session sessions[MAX_SESSIONS];
    uint64_t clock;
    float *in, *out;
    size_t in_cap, out_cap;
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

/* One WORK frame -> the RESULT to send back. */
static uint8_t *serve_work(worker *w, const ds4_dist_work *wk, size_t *len) {
    const ds4_config *cfg = &w->m->cfg;
    const size_t hcE = (size_t)cfg->n_hc * cfg->n_embd, V = (size_t)cfg->n_vocab;
    ds4_dist_result r = {wk->session, DS4_DIST_ERROR, 0, 0, NULL, NULL, 0};
    char why[256] = "";
    worker_session *s = NULL, *victim = &w->sessions[0];
    for (int i = 0; i < MAX_SESSIONS; i++) {
        if (w->sessions[i].kv && w->sessions[i].id == wk->session) s = &w->sessions[i];
        if (!w->sessions[i].kv || (victim->kv && w->sessions[i].last_use < victim->last_use)) victim = &w->sessions[i];
    }
    if (!s && wk->pos == 0) {
        ds4_kv_free(victim->kv);
        *victim = (worker_session){wk->session, ds4_kv_new(cfg, w->ctx, REWIND_SLACK), DS4_DIST_HASH_EMPTY, 0};
        if (!victim->kv) snprintf(why, sizeof why, "out of memory for a %d-token session", w->ctx);
        else s = victim;
    }
    if (s && wk->pos == 0 && s->kv->n_pos > 0) {   /* the session starts over */
        ds4_kv_free(s->kv);
        s->kv = ds4_kv_new(cfg, w->ctx, REWIND_SLACK);
        s->hash = DS4_DIST_HASH_EMPTY;
        if (!s->kv) { snprintf(why, sizeof why, "out of memory for a %d-token session", w->ctx); s->id = 0; s = NULL; }
    }
    const size_t want_in = w->m->slice.first > 0 ? (size_t)wk->n * hcE : 0;
    if (!why[0] && (!s || s->kv->n_pos != (int)wk->pos || s->hash != wk->hash_before)) {
        r.status = DS4_DIST_HASH_MISMATCH;
        snprintf(why, sizeof why, "hash mismatch: this worker holds position %d of the session, asked for %u (replay needed)",
                 s ? s->kv->n_pos : 0, wk->pos);
    } else if (!why[0] && wk->n_floats != want_in) {
        snprintf(why, sizeof why, "%u hidden floats for %u tokens, expected %zu", wk->n_floats, wk->n, want_in);
    }
    float *out = NULL;
    if (!why[0]) {
        const size_t n_out = w->m->slice.output ? (wk->all_logits ? (size_t)wk->n * V : V) : (size_t)wk->n * hcE;
        int32_t *toks = malloc((size_t)wk->n * sizeof(int32_t));
        if (!toks || !grow(&w->in, &w->in_cap, want_in + 1) || !grow(&w->out, &w->out_cap, n_out)) {
            snprintf(why, sizeof why, "out of memory for %u tokens", wk->n);
        } else {
            for (uint32_t i = 0; i < wk->n; i++) toks[i] = ds4_dist_token_at(wk->tokens, i);
            for (size_t i = 0; i < want_in; i++) w->in[i] = ds4_dist_float_at(wk->floats, i);
            ds4_backend_seq sq = {.kv = s->kv, .toks = toks, .n = (int)wk->n,
                                  .logits = w->m->slice.output ? w->out : NULL, .all_logits = wk->all_logits,
                                  .hidden_in = want_in ? w->in : NULL, .hidden_out = w->m->slice.output ? NULL : w->out};
            if (w->be->eval(w->be, &sq, 1, why, sizeof why) == 0) {
                s->hash = ds4_dist_hash_tokens(s->hash, toks, (int)wk->n);
                s->last_use = ++w->clock;
                r.status = DS4_DIST_OK;
                r.hash_after = s->hash;
                r.n_floats = (uint32_t)n_out;
                out = w->out;
                why[0] = 0;
            }
        }
        free(toks);
    }
    r.text = why;
    r.text_len = strlen(why);
    return ds4_dist_encode_result(&r, out, len);
}

int ds4_dist_worker_main(const char *model_path, const char *layers, int ctx, int n_threads, int numerics,
                         const ds4_dist_params *p) {
    char err[512];
    worker w = {0};
    w.ctx = ctx;
    ds4_layer_slice slice;
    ds4_gguf *g = ds4_gguf_open(model_path, err, sizeof err);
    if (g && layers && !ds4_layer_slice_parse(layers, &slice, err, sizeof err)) { ds4_gguf_close(g); g = NULL; }
    if (g) w.m = ds4_model_bind_slice(g, layers ? &slice : NULL, err, sizeof err);
    const bool sim = w.m && (numerics < 0 ? ds4_cpu_numerics_supported(&w.m->cfg) : numerics > 0);
    if (w.m) w.be = ds4_cpu_backend_new(w.m, n_threads, 4096, sim, err, sizeof err);
    nng_socket data = NNG_SOCKET_INITIALIZER, control = NNG_SOCKET_INITIALIZER;
    nng_listener listener;
    char url[200] = "";
    int rc = 1;
    if (!w.be) { fprintf(stderr, "ds4 worker: %s\n", err); goto done; }
    if (w.m->slice.first == 0) { fprintf(stderr, "ds4 worker: layer 0 belongs to the coordinator (--layers K:...)\n"); goto done; }
    /* the data socket listens on the address family the coordinator is reached by, on a free port */
    int rv = nng_rep0_open(&data);
    snprintf(url, sizeof url, "tcp://%s:0", p->host);
    if (!rv) rv = nng_listener_create(&listener, data, url);
    if (!rv) rv = nng_listener_start(listener, 0);
    int port = 0;
    if (!rv) rv = nng_listener_get_int(listener, NNG_OPT_TCP_BOUND_PORT, &port);
    if (rv) { fprintf(stderr, "ds4 worker: cannot listen on %s: %s\n", url, nng_strerror(rv)); goto done; }
    snprintf(url, sizeof url, "tcp://%s:%d", p->host, port);
    char curl[200];
    snprintf(curl, sizeof curl, "tcp://%s:%d", p->host, p->port);
    rv = nng_req0_open(&control);
    if (!rv) rv = nng_dial(control, curl, NULL, NNG_FLAG_NONBLOCK);   /* retries until the coordinator is up */
    if (rv) { fprintf(stderr, "ds4 worker: cannot reach %s: %s\n", curl, nng_strerror(rv)); goto done; }
    ds4_dist_hello me = identity(w.m, p, sim, ctx, url);
    size_t len, blen;
    void *buf = NULL;
    ds4_dist_frame f;
    /* The HELLO is repeated whenever no work came for a while: a restarted
     * coordinator learns the route again without restarting its workers. */
    nng_socket_set_ms(data, NNG_OPT_RECVTIMEO, 1000);
    bool registered = false;
    for (;;) {
        if (!registered || nng_recv(data, &buf, &blen, NNG_FLAG_ALLOC)) {
            uint8_t *hello = ds4_dist_encode_hello(&me, &len);
            if (!exchange(control, hello, len, &buf, &blen, &f, err, sizeof err)) {
                if (!registered) { fprintf(stderr, "ds4 worker: registration with %s failed: %s\n", curl, err); goto done; }
                continue;   /* the coordinator is away; ask again after the next quiet second */
            }
            const bool welcome = f.type == DS4_DIST_WELCOME;
            if (!registered || !welcome)
                fprintf(stderr, "ds4 worker: layers %d..%d%s: %s: %.*s\n", w.m->slice.first, w.m->slice.last,
                        w.m->slice.output ? " + output" : "", curl, (int)f.result.text_len, f.result.text);
            nng_free(buf, blen);
            if (!welcome) goto done;
            if (!registered) nng_socket_set_ms(control, NNG_OPT_RECVTIMEO, 1000);
            registered = true;
            continue;
        }
        uint8_t *reply;
        if (ds4_dist_decode(buf, blen, &f, err, sizeof err) && f.type == DS4_DIST_WORK) {
            reply = serve_work(&w, &f.work, &len);
        } else {
            ds4_dist_result r = {0, DS4_DIST_ERROR, 0, 0, NULL, err, strlen(err)};
            reply = ds4_dist_encode_result(&r, NULL, &len);
        }
        nng_free(buf, blen);
        if (reply) nng_send(data, reply, len, 0);
        free(reply);
    }
done:
    nng_close(control);
    nng_close(data);
    for (int i = 0; i < MAX_SESSIONS; i++) ds4_kv_free(w.sessions[i].kv);
    free(w.in); free(w.out);
    if (w.be) w.be->free(w.be);
    ds4_model_free(w.m);
    ds4_gguf_close(g);
    return rc;
}
