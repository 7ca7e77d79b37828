/* server.c -- ds4-server's process: model and session start-up, the
 * listening sockets, the accept loop and one thread per connection that
 * reads requests and hands them to routes.c. See server.h for the contract. */
#include "server/server.h"
#include "base/mempages.h"
#include "base/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/access.h"
#include "server/batcher.h"
#include "engine/engine_kvdisk.h"
#include "server/listeners.h"
#include "server/respond.h"
#include "server/routes.h"
#include "server/server_state.h"
#include "server/worker.h"

/* The last 1/RESERVE_DIVISOR of the connection slots go only to addresses
 * holding fewer than FEW_CONNECTIONS, so a new client still gets in when a
 * few addresses hold everything else. */
#define RESERVE_DIVISOR 16
#define FEW_CONNECTIONS 4

static void on_signal(int sig) {
    (void)sig;
    atomic_store(&ds4_srv_stop, 1);
}

/* Open connections per client address; their own lock, so accepting never
 * waits on the queue. IPv4 addresses are kept in their v4-mapped form. */
typedef struct {
    unsigned char addr[16];
    int n;
} client_count;

/* Every open connection. One that waits for a request head (a new or
 * kept-alive connection, or a client trickling its head) costs the client
 * nothing to hold, so when the slots are full a new client takes the slot
 * of the one that has waited longest: many addresses holding partial heads
 * cannot lock clients out for the length of a timeout. An evicted entry has
 * given up its slot but stays in the table until its thread has closed the
 * socket, so shutdown() never reaches a descriptor number already reused;
 * hence room for twice the slots. */
typedef struct {
    bool used;
    bool evicted;
    bool waiting;             /* for a request head, or closing after an error */
    int fd;
    unsigned long long since; /* when it began waiting, in g_wait_seq order */
    unsigned char client[16];
} conn_entry;

static pthread_mutex_t g_conns_mu = PTHREAD_MUTEX_INITIALIZER;
static client_count g_clients[DS4_SERVER_MAX_CONNECTIONS];
static conn_entry g_conns[2 * DS4_SERVER_MAX_CONNECTIONS];
static int g_n_clients, g_n_conns;
static unsigned long long g_wait_seq;

static void client_key(const struct sockaddr_storage *ss, unsigned char key[16]) {
    memset(key, 0, 16);
    if (ss->ss_family == AF_INET6) {
        memcpy(key, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
    } else {
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    }
}

static client_count *find_client(const unsigned char key[16]) {
    for (int i = 0; i < g_n_clients; i++)
        if (!memcmp(g_clients[i].addr, key, 16)) return &g_clients[i];
    return NULL;
}

/* Gives back an entry's slot (g_conns_mu held). */
static void drop_slot(const conn_entry *e) {
    client_count *c = find_client(e->client);
    if (c && --c->n == 0) *c = g_clients[--g_n_clients];
    g_n_conns--;
}

/* Frees the slot of the connection that has waited longest for a request
 * head, waking its thread (g_conns_mu held); false when none waits. */
static bool evict_oldest_waiting(void) {
    conn_entry *old = NULL;
    for (size_t i = 0; i < sizeof g_conns / sizeof *g_conns; i++) {
        conn_entry *e = &g_conns[i];
        if (e->used && !e->evicted && e->waiting && (!old || e->since < old->since)) old = e;
    }
    if (!old) return false;
    old->evicted = true;
    shutdown(old->fd, SHUT_RDWR);
    drop_slot(old);
    return true;
}

/* Takes a connection slot for the address: its g_conns index, or -1 when
 * refused. When every slot is taken, an address holding few connections
 * takes a waiting connection's slot (busier addresses are refused, so they
 * cannot churn each other's clients out). */
static int admit(int fd, const unsigned char key[16], int max_total, int per_client_max) {
    pthread_mutex_lock(&g_conns_mu);
    client_count *c = find_client(key);
    int held = c ? c->n : 0;
    bool ok = g_n_conns < max_total && held < per_client_max &&
              (g_n_conns < max_total - max_total / RESERVE_DIVISOR || held < FEW_CONNECTIONS);
    if (!ok && held < per_client_max && held < FEW_CONNECTIONS && evict_oldest_waiting()) {
        ok = true;
        c = find_client(key); /* the eviction may have moved the entry */
    }
    size_t idx = 0;
    while (ok && idx < sizeof g_conns / sizeof *g_conns && g_conns[idx].used) idx++;
    if (idx == sizeof g_conns / sizeof *g_conns) ok = false;
    if (ok) {
        if (!c) {
            c = &g_clients[g_n_clients++];
            memcpy(c->addr, key, 16);
            c->n = 0;
        }
        c->n++;
        g_n_conns++;
        g_conns[idx] = (conn_entry){.used = true, .waiting = true, .fd = fd, .since = g_wait_seq++};
        memcpy(g_conns[idx].client, key, 16);
    }
    pthread_mutex_unlock(&g_conns_mu);
    return ok ? (int)idx : -1;
}

/* Before the connection's socket is closed. */
static void release(int idx) {
    pthread_mutex_lock(&g_conns_mu);
    conn_entry *e = &g_conns[idx];
    if (!e->evicted) drop_slot(e);
    e->used = false;
    pthread_mutex_unlock(&g_conns_mu);
}

/* Marks the connection waiting (evictable) or busy with a request; false
 * once it has been evicted. */
static bool set_waiting(int idx, bool waiting) {
    pthread_mutex_lock(&g_conns_mu);
    conn_entry *e = &g_conns[idx];
    if (waiting && !e->waiting) e->since = g_wait_seq++;
    e->waiting = waiting;
    bool alive = !e->evicted;
    pthread_mutex_unlock(&g_conns_mu);
    return alive;
}

typedef struct {
    server *s;
    int fd;
    int idx; /* in g_conns */
} conn_arg;

static void *conn_main(void *ud) {
    conn_arg a = *(conn_arg *)ud;
    free(ud);
    server *s = a.s;
    ds4_http_conn c = {.fd = a.fd, .lim = s->o.limits};
    ds4_http_req hr;
    ds4_buf body = {0};
    for (;;) {
        memset(&hr, 0, sizeof hr);
        if (!set_waiting(a.idx, true)) break;
        int rc = ds4_http_read_head(&c, &hr);
        if (!rc && !set_waiting(a.idx, false)) break;
        if (!rc) rc = ds4_http_read_body(&c, &hr, &body);
        if (rc == 1) break;
        if (rc < 0) {
            int status = -rc;
            if (status != 408 || c.in.len) {
                ds4_http_req *h = hr.path[0] ? &hr : NULL;
                ds4_send_error(s, &c, h, status, ds4_http_error_text(status), NULL, NULL, 0, false);
            }
            /* Lingering close: closing with unread input makes the kernel send
             * a reset that can destroy the error response in flight. The
             * connection is only closing: a new client may take its slot. */
            set_waiting(a.idx, true);
            shutdown(a.fd, SHUT_WR);
            char sink[65536];
            struct pollfd pf = {.fd = a.fd, .events = POLLIN};
            for (int i = 0; i < 64 && poll(&pf, 1, 1000) > 0 && recv(a.fd, sink, sizeof sink, 0) > 0; i++) {}
            break;
        }
        if (!ds4_srv_route_request(s, &c, &hr, &body)) break;
    }
    ds4_buf_free(&body);
    ds4_buf_free(&c.in);
    release(a.idx);
    close(a.fd);
    return NULL;
}

/* IPv4 or IPv6 literal; "localhost" = 127.0.0.1. */
static int listen_on(const char *host, int port, char *err, size_t errlen) {
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        len = sizeof *v4;
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        len = sizeof *v6;
    } else {
        snprintf(err, errlen, "invalid --host '%s' (an IPv4 or IPv6 address)", host);
        return -1;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, len) || listen(fd, 512)) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static void accept_one(server *s, int listen_fd, const pthread_attr_t *attr) {
    struct sockaddr_storage peer;
    socklen_t plen = sizeof peer;
    int fd = accept4(listen_fd, (struct sockaddr *)&peer, &plen, SOCK_CLOEXEC);
    if (fd < 0) {
        /* Out of descriptors or memory: the pending connection keeps the
         * listener readable, so wait a little instead of spinning. */
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) usleep(50000);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* Bounded, so a client that stops reading fills it within a few hundred
     * tokens and its slot's writes stall out (http.h) instead of queueing
     * megabytes. 64 KiB still covers a token stream on a long-distance link. */
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &s->o.limits.send_buffer_bytes, sizeof s->o.limits.send_buffer_bytes);
    unsigned char key[16];
    client_key(&peer, key);
    int idx = admit(fd, key, s->o.max_connections, s->o.max_client_connections);
    conn_arg *a = idx >= 0 ? malloc(sizeof *a) : NULL;
    pthread_t th;
    if (a) { a->s = s; a->fd = fd; a->idx = idx; }
    if (!a || pthread_create(&th, attr, conn_main, a)) {
        static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL);
        if (idx >= 0) release(idx);
        close(fd);
        free(a);
    }
}

typedef struct {
    server *s;
    const pthread_attr_t *attr;
} accept_ctx;

static void accept_ready(int listen_fd, void *ud) {
    const accept_ctx *a = ud;
    accept_one(a->s, listen_fd, a->attr);
}

void ds4_server_opts_default(ds4_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->ctx = 32768;
    o->default_max_tokens = 393216;
    o->model_path = "ds4flash.gguf";
    o->tool_memory_max_ids = 100000;
    o->max_connections = DS4_SERVER_MAX_CONNECTIONS;
    o->max_client_connections = 256;
    o->numerics = -1;
    o->batched_sessions = 1;
    o->test_linger_gate = getenv("DS4_TEST_SLOT_LINGER_GATE");
    o->test_prefill_gate = getenv("DS4_TEST_PREFILL_GATE");
    ds4_kvdisk_opts_default(&o->kvdisk);
    ds4_http_limits_default(&o->limits);
    ds4_gpu_opts_default(&o->gpu);
    ds4_runtime_opts_default(&o->runtime);
    ds4_spec_params_default(&o->spec);
}

/* The slots' views of the server (server_state.h), each with its session;
 * 0 or 1 after one line on stderr. */
static int make_slots(server *s, server **slots_out) {
    char err[512];
    const int n = s->o.batched_sessions;
    const uint64_t need = (uint64_t)n * ds4_engine_kv_bytes(s->eng, s->o.ctx), avail = ds4_memory_available();
    if (avail && need > avail) {
        ds4_log(DS4_LOG_ERROR, "ds4-server: %d sessions of %d tokens need %.2f GiB of KV state, only %.2f GiB of memory is "
                               "available (lower --batched-session or --ctx)\n",
                n, s->o.ctx, (double)need / (1 << 30), (double)avail / (1 << 30));
        return 1;
    }
    server *slots = calloc((size_t)n, sizeof *slots);
    if (!slots) { ds4_log(DS4_LOG_ERROR, "ds4-server: out of memory for %d slots\n", n); return 1; }
    *slots_out = slots;
    for (int k = 0; k < n; k++) {
        slots[k] = *s;
        slots[k].slot = k;
        slots[k].sess = ds4_session_new(s->eng, s->o.ctx, err, sizeof err);
        if (!slots[k].sess) { ds4_log(DS4_LOG_ERROR, "ds4-server: %s\n", err); return 1; }
    }
    return 0;
}

int ds4_server_run(const ds4_server_opts *opts) {
    static server S;
    static ds4_job_queue queue;
    static pthread_mutex_t trace_mu = PTHREAD_MUTEX_INITIALIZER, kvd_mu = PTHREAD_MUTEX_INITIALIZER;
    server *s = &S;
    s->o = *opts;
    if (s->o.batched_sessions < 1) s->o.batched_sessions = 1;
    char err[512];
    if (!ds4_access_is_loopback(s->o.host) && !(s->o.api_key && s->o.api_key[0]) && !s->o.no_api_key) {
        ds4_log(DS4_LOG_ERROR, "ds4-server: --host %s is reachable from other machines: set --api-key KEY (or DS4_API_KEY), "
                               "or pass --no-api-key to serve without authentication\n", s->o.host);
        return 2;
    }
    static ds4_spec spec;
    if (ds4_spec_wanted(&s->o.spec)) {
        if (s->o.batched_sessions > 1) {
            /* batched slots advance together through the batcher, one token each per step */
            ds4_log(DS4_LOG_ERROR, "ds4-server: %s drafts for one session: it cannot be combined with "
                                   "--batched-session %d\n",
                    s->o.spec.dspark_path ? "--dspark" : s->o.spec.mtp_path ? "--mtp" : "--spec-lookup",
                    s->o.batched_sessions);
            return 2;
        }
        if (!ds4_spec_init(&spec, &s->o.spec, err, sizeof err)) { ds4_log(DS4_LOG_ERROR, "ds4-server: %s\n", err); return 2; }
        s->spec = &spec;
    }
    if (!ds4_queue_init(&queue, s->o.batched_sessions)) { ds4_log(DS4_LOG_ERROR, "ds4-server: out of memory\n"); return 1; }
    s->queue = &queue;
    s->trace_mu = &trace_mu;
    s->kvd_mu = &kvd_mu;
    /* the trace holds prompts: private to this user, like the disk cache */
    int trace_fd = s->o.trace_path ? open(s->o.trace_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600) : -1;
    if (s->o.trace_path && (trace_fd < 0 || !(s->trace = fdopen(trace_fd, "a")))) {
        if (trace_fd >= 0) close(trace_fd);
        ds4_log(DS4_LOG_ERROR, "ds4-server: cannot open trace file %s: %s\n", s->o.trace_path, strerror(errno));
        return 1;
    }
    static ds4_turn_script script;
    static atomic_long script_turn;
    if (s->o.scripted_output) {
        if (ds4_turn_script_load(s->o.scripted_output, DS4_SERVER_SCRIPT_SEPARATOR, &script, err, sizeof err)) {
            ds4_log(DS4_LOG_ERROR, "ds4-server: %s\n", err);
            return 1;
        }
        s->script = &script;
        s->script_turn = &script_turn;
    }
    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = s->o.model_path;
    ep.n_threads = s->o.threads;
    ep.prefill_chunk = s->o.prefill_chunk;
    ep.numerics = s->o.numerics;
    ep.layers = s->o.layers;
    ep.dist = s->o.dist;
    ep.ssd = s->o.ssd;
    ep.ssd.ctx = s->o.ctx;
    ep.gpu = s->o.gpu;
    ep.gpu_ctx = s->o.ctx;
    ep.mtp_path = ds4_spec_engine_mtp(&s->o.spec);
    ep.dspark_path = ds4_spec_engine_dspark(&s->o.spec);
    ds4_runtime_apply(&s->o.runtime, &ep);
    s->eng = ds4_engine_load(&ep, err, sizeof err);
    if (!s->eng) { ds4_log(DS4_LOG_ERROR, "ds4-server: %s\n", err); return 1; }
    s->tok = ds4_engine_tokenizer(s->eng);
    if (!s->tok) { ds4_log(DS4_LOG_ERROR, "ds4-server: %s has no tokenizer\n", s->o.model_path); ds4_engine_free(s->eng); return 1; }
    s->n_vocab = ds4_engine_n_vocab(s->eng);
    s->max_token_bytes = 1;
    for (int32_t id = 0; id < s->n_vocab; id++) {
        size_t len = 0;
        if (ds4_tokenizer_token_bytes(s->tok, id, &len) && len > s->max_token_bytes) s->max_token_bytes = len;
    }
    s->mem = ds4_toolmem_new(s->o.tool_memory_max_ids, (size_t)512 << 20);
    if (s->o.batched_sessions > 1 && !(s->batcher = ds4_batcher_new(s->eng, s->trace ? ds4_srv_kv_log : NULL, s))) {
        ds4_log(DS4_LOG_ERROR, "ds4-server: out of memory\n");
        return 1;
    }
    if (s->o.kvdisk.dir && !(s->kvd = ds4_engine_kvdisk_open(&s->o.kvdisk, s->eng, s->mem, ds4_srv_kv_log, s, err, sizeof err))) {
        ds4_log(DS4_LOG_ERROR, "ds4-server: %s\n", err);
        return 1;
    }
    server *slots = NULL;
    if (make_slots(s, &slots)) return 1;
    struct pollfd lfds[2] = {{.fd = listen_on(s->o.host, s->o.port, err, sizeof err), .events = POLLIN},
                             {.fd = -1, .events = POLLIN}};
    if (lfds[0].fd < 0) { ds4_log(DS4_LOG_ERROR, "ds4-server: %s\n", err); return 1; }
    /* Clients configured with "localhost" may try ::1 first. */
    if (!strcmp(s->o.host, "127.0.0.1") || !strcmp(s->o.host, "localhost"))
        lfds[1].fd = listen_on("::1", s->o.port, err, sizeof err);

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t *workers = calloc((size_t)s->o.batched_sessions, sizeof *workers);
    int n_workers = 0;
    while (workers && n_workers < s->o.batched_sessions &&
           !pthread_create(&workers[n_workers], NULL, ds4_srv_worker_main, &slots[n_workers]))
        n_workers++;
    if (n_workers < s->o.batched_sessions) {
        ds4_log(DS4_LOG_ERROR, "ds4-server: cannot start %d slot threads\n", s->o.batched_sessions);
        atomic_store(&ds4_srv_stop, 1);
    }
    ds4_log(DS4_LOG_INFO, "ds4-server: listening on http://%s:%d (ctx %d, %d session slot%s)\n", s->o.host, s->o.port,
            s->o.ctx, s->o.batched_sessions, s->o.batched_sessions > 1 ? "s" : "");
    ds4_srv_trace(s, "server start: model %s ctx %d", s->o.model_path, s->o.ctx);

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    int status = 0;
    accept_ctx accept_ctx = {s, &attr};
    while (!atomic_load(&ds4_srv_stop)) {
        if (poll(lfds, 2, 200) <= 0) continue;
        if (!ds4_listeners_dispatch(lfds, 2, accept_ready, &accept_ctx)) {
            ds4_log(DS4_LOG_ERROR, "ds4-server: no listening socket left\n");
            status = 1;
            break;
        }
    }
    for (int i = 0; i < 2; i++)
        if (lfds[i].fd >= 0) close(lfds[i].fd);
    ds4_log(DS4_LOG_INFO, "ds4-server: shutting down\n");
    ds4_queue_stop(s);
    for (int k = 0; k < n_workers; k++) pthread_join(workers[k], NULL);
    free(workers);
    if (s->kvd) {
        for (int k = 0; k < s->o.batched_sessions; k++)
            if (!slots[k].steered) ds4_kvdisk_save(s->kvd, slots[k].sess, DS4_KVC_SHUTDOWN);
        ds4_kvdisk_close(s->kvd);
    }
    /* Connection threads may still be reading; give them a moment. */
    for (int i = 0; i < 50; i++) {
        pthread_mutex_lock(&g_conns_mu);
        int n = g_n_conns;
        pthread_mutex_unlock(&g_conns_mu);
        if (!n) break;
        usleep(20000);
    }
    ds4_srv_trace(s, "server stop");
    return status;
}
