/* test_dist_route.c -- pipeline parallelism through the engine API
 * (dist.h): a coordinator engine in this process and its workers as child
 * processes (this binary re-run as "worker"), on loopback ports, against a
 * single-process engine on the same model (the oracle: the split must not
 * change a bit). For a 2-way and a 3-way split of the demo model:
 * - pipelined chunked prefill (33-token chunks, 2 in flight, workers
 *   forwarding to the next hop): every position's logits equal;
 * - decode: each greedy step's logits equal;
 * - a batched call of three sessions (all in the route at once): each
 *   session equals the single process's run of it alone;
 * - rewind then continue (workers truncate back) and (2-way split) a rewind
 *   deeper than the workers' slack (a worker restores its ring checkpoint
 *   or, lacking it, the coordinator replays): logits equal;
 * - KV save through the route: the payload equals the single process's
 *   byte for byte; a payload saved by the split loads in a single process
 *   and one saved by the single process loads into the split, and both
 *   continue with equal logits;
 * - a snapshot taken through the route, two more steps, a restore: the next
 *   step equals the single process's;
 * - one engine call longer than the rewind slack (264 tokens) that fails
 *   part-way (it runs past the workers' context): the session is unchanged
 *   (the coordinator's slice restored from a ring checkpoint) and continues
 *   equal to the single process (2-way split);
 * - a batched call (two sessions) whose second sequence fails leaves the
 *   first unchanged too;
 * - kill -9 of the first worker between steps: the next step fails with one
 *   line and leaves the session unchanged (the coordinator's own slice rolled
 *   back), the one after reports the incomplete route; a restarted worker
 *   (at position 0) is caught up by a replay (a batched step of two
 *   sessions: both replayed) and the next step equals the single process
 *   again.
 * - a rewind deeper than the slack to where the engine holds a ring
 *   checkpoint: the worker restores its own checkpoint at that position, so
 *   nothing is replayed (the coordinator's --debug lines, captured, show the
 *   step starting there and no replay) and the logits equal the single
 *   process's (with the worker's checkpoint restore disabled, the same
 *   lines show the replay: checked by hand).
 * - directional steering through a 3-way route, every process holding the
 *   same file: a batched call of a session with the engine's scales, an
 *   unsteered one and one with its own scales, then a batched decode step,
 *   each equal to the single process's run of it alone (run_steered).
 * - a worker's KV state holds its slice's layers only: the slices' bytes
 *   add up to the whole state's, and a slice state refuses another range;
 *   a full checkpoint list thins to its odd entries, keeping every slot.
 * --dist-activation-bits 16 and 8: the route rounds the hidden states at
 * every cut and nowhere else, so its logits (every position of a pipelined
 * prefill, then each decode step) equal, bit for bit, the slices chained in
 * this process with the same transport format applied between them (the
 * codec of dist_proto, whose rounding test_dist_proto holds to the format's
 * bounds), for the 2-way and the 3-way split; their distance from the
 * single process is printed. */
#include "check.h"
#include "backends/backend.h"
#include "dist/dist.h"
#include "dist/dist_proto.h"
#include "engine/engine.h"
#include "models/dsv4/forward_cpu.h"
#include "format/gguf.h"
#include "models/dsv4/kv.h"
#include "models/dsv4/model.h"

#include <math.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Workers hold CTX positions per session; the long-step session holds more,
 * so a step crossing CTX fails at the workers after the coordinator's own
 * slice ran. N_FILL puts it past the rewind slack (256) for a deep rewind. */
enum { CTX = 512, N_PROMPT = 40, REWIND_TO = 30, N_MORE = 6, BIG_CTX = 1024, N_FILL = 430, N_STEP = 264,
       DEEP_REWIND_TO = 100 };
static const char MODEL[] = "models/demo.gguf", SECRET[] = "route-test";

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &len))
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* A worker child: its pid and its stderr, captured in an anonymous file so
 * that the test can wait for its registration line (and show its output
 * when something fails). */
typedef struct {
    pid_t pid;
    FILE *log;
} worker_proc;

/* steer: the worker's --dir-steering-file (NULL: none) */
static worker_proc start_worker_steered(const char *layers, int port, const char *steer) {
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    char *argv[] = {"test_dist_route", "worker", (char *)layers, portstr, (char *)steer, NULL};
    worker_proc w = {-1, tmpfile()};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (w.log) posix_spawn_file_actions_adddup2(&fa, fileno(w.log), 2);
    else posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    if (posix_spawn(&w.pid, "/proc/self/exe", &fa, NULL, argv, environ)) w.pid = -1;
    posix_spawn_file_actions_destroy(&fa);
    return w;
}

static worker_proc start_worker(const char *layers, int port) { return start_worker_steered(layers, port, NULL); }

static void stop_worker(worker_proc *w) {
    if (w->pid > 0) {
        kill(w->pid, SIGKILL);
        waitpid(w->pid, NULL, 0);
    }
    if (w->log) fclose(w->log);
    *w = (worker_proc){-1, NULL};
}

/* What the worker wrote to stderr so far (malloc'ed, never NULL). */
static char *worker_output(const worker_proc *w) {
    const off_t n = w->log ? lseek(fileno(w->log), 0, SEEK_END) : 0;
    char *text = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    if (text && n > 0 && pread(fileno(w->log), text, (size_t)n, 0) != n) text[0] = 0;
    return text ? text : calloc(1, 1);
}

/* Waits until the worker has registered with the coordinator (its stderr
 * has the "...: registered" line, printed once the coordinator has recorded
 * the registration and answered it), so the next step finds a complete
 * route at once. The coordinator's wait_seconds (5 s, kept short so that
 * the "incomplete route" check below is quick) then never has to cover a
 * worker's start-up: loading the model and registering takes ~50 ms here,
 * but far longer on a slow or loaded machine. The deadline is only a bound
 * for a worker that never registers. */
enum { REGISTER_DEADLINE_S = 120 };
static bool wait_registered(const worker_proc *w, const char *what) {
    for (int i = 0; i < REGISTER_DEADLINE_S * 100; i++) {
        char *text = worker_output(w);
        const bool done = strstr(text, ": registered") != NULL;
        free(text);
        if (done) return true;
        if (w->pid <= 0 || waitpid(w->pid, NULL, WNOHANG) != 0) break;   /* it exited (or never started) */
        usleep(10000);
    }
    char *text = worker_output(w);
    CHECK(false, "%s: the worker did not register within %d s; its output: %s", what, REGISTER_DEADLINE_S, text);
    free(text);
    return false;
}

static int worker_main(const char *layers, const char *port, const char *steer) {
    ds4_dist_params p = {.role = DS4_DIST_WORKER, .host = "127.0.0.1", .port = atoi(port), .secret = SECRET};
    char err[256];
    if (!ds4_dist_finish_options(&p, true, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    /* as ds4 --role worker: the engine loads the slice, its backend serves */
    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = MODEL;
    ep.layers = layers;
    ep.n_threads = 1;
    ep.quiet = true;
    ep.dist = p;
    ep.steering.file = steer;
    ds4_engine *e = ds4_engine_load(&ep, err, sizeof err);
    if (!e) { fprintf(stderr, "%s\n", err); return 1; }
    const int rc = ds4_engine_serve_worker(e, CTX, &ep.dist);
    ds4_engine_free(e);
    return rc;
}

/* Both engines run one thread and a 40-token local batch. The split pipelines
 * 33-token chunks, 2 in flight, and takes up to 8 chunks (264 tokens, more
 * than the rewind slack) per engine call. wait_seconds bounds a step's wait
 * for a complete route: the "incomplete route" check waits all of it, and
 * every other step starts once wait_registered() has seen its workers
 * register (only a route's ACKs, loopback round trips, still come within
 * it). reply_seconds only bounds a route that never answers (no step here
 * expects that; a killed worker is noticed from its closed connection). */
static ds4_engine *load_steered(const char *layers, int port, int bits, bool debug, const char *steer, char *err,
                                size_t errlen) {
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p = (ds4_engine_params){.model_path = MODEL, .n_threads = 1, .prefill_chunk = 40, .numerics = p.numerics,
                           .quiet = true, .gpu = p.gpu, .steering = p.steering, .power = p.power};
    p.steering.file = steer;
    if (layers) {
        p.layers = layers;
        p.dist = (ds4_dist_params){.role = DS4_DIST_COORDINATOR, .host = "127.0.0.1", .port = port, .secret = SECRET,
                                   .wait_seconds = 5, .reply_seconds = 120, .prefill_chunk = 33, .prefill_window = 2,
                                   .activation_bits = bits, .debug = debug};
        if (!ds4_dist_finish_options(&p.dist, false, err, errlen)) return NULL;
    }
    return ds4_engine_load(&p, err, errlen);
}

static ds4_engine *load(const char *layers, int port, int bits, bool debug, char *err, size_t errlen) {
    return load_steered(layers, port, bits, debug, NULL, err, errlen);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static bool same_logits(const ds4_session *a, const ds4_session *b, int V) {
    const float *x = ds4_session_logits(a), *y = ds4_session_logits(b);
    return x && y && !memcmp(x, y, (size_t)V * sizeof(float));
}

/* One decode step of token t on every session given; true when all succeed. */
static bool decode_all(ds4_session **s, int n, int32_t t) {
    char err[256];
    bool ok = true;
    for (int i = 0; i < n; i++) {
        const int rc = ds4_session_decode(s[i], t, err, sizeof err);
        CHECK(rc == 0, "decode on session %d: %s", i, err);
        ok &= rc == 0;
    }
    return ok;
}

/* A batched call of three sessions (spans of 1, 7 and 45 tokens: the last
 * two chunks long) goes into the route at once, chunks of different
 * sessions in flight together; each session's logits equal the single
 * process's for that session alone. */
static void check_batched(ds4_engine *single, ds4_engine *split, const int32_t *toks, const char *what) {
    enum { N_SESS = 3 };
    static const int lens[N_SESS] = {1, 7, 45};
    char err[256];
    const int V = ds4_engine_n_vocab(single);
    ds4_session *x[N_SESS] = {0}, *y[N_SESS] = {0};
    int32_t more[N_SESS][45];
    ds4_step steps[N_SESS];
    bool ok = true;
    for (int i = 0; i < N_SESS; i++) {
        x[i] = ds4_session_new(split, CTX, err, sizeof err);
        y[i] = ds4_session_new(single, CTX, err, sizeof err);
        ok &= x[i] && y[i];
        for (int k = 0; k < lens[i]; k++) more[i][k] = (k * 17 + 5 * i + 1) % V;
        steps[i] = (ds4_step){x[i], more[i], lens[i]};
        for (int j = 0; ok && j < 2; j++)
            ok &= ds4_session_prefill(j ? y[i] : x[i], toks, 10 + i, NULL, NULL, NULL, err, sizeof err) == 0;
    }
    CHECK(ok, "%s: batched sessions: %s", what, err);
    CHECK(ok && ds4_sessions_step(split, steps, N_SESS, err, sizeof err) == 0, "%s: batched step: %s", what, err);
    for (int i = 0; ok && i < N_SESS; i++) {
        CHECK(ds4_session_prefill(y[i], more[i], lens[i], NULL, NULL, NULL, err, sizeof err) == 0, "single: %s", err);
        CHECK(same_logits(x[i], y[i], V), "%s: batched session %d (%d tokens) differs from the single process", what, i,
              lens[i]);
    }
    for (int i = 0; i < N_SESS; i++) {
        ds4_session_free(x[i]);
        ds4_session_free(y[i]);
    }
}

static void run_split(ds4_engine *single, const char *const *slices, int n_slices) {
    char err[256], what[64];
    snprintf(what, sizeof what, "%d-way split", n_slices);
    const int port = free_port();
    worker_proc workers[4] = {{-1, NULL}, {-1, NULL}, {-1, NULL}, {-1, NULL}};
    for (int i = 1; i < n_slices; i++) workers[i] = start_worker(slices[i], port);
    ds4_engine *split = load(slices[0], port, 32, false, err, sizeof err);
    CHECK(split, "%s: coordinator: %s", what, err);
    for (int i = 1; split && i < n_slices; i++) wait_registered(&workers[i], what);
    const int V = ds4_engine_n_vocab(single);
    ds4_session *a = ds4_session_new(single, CTX, err, sizeof err), *b = split ? ds4_session_new(split, CTX, err, sizeof err) : NULL;
    float *la = malloc((size_t)N_PROMPT * V * sizeof(float)), *lb = malloc((size_t)N_PROMPT * V * sizeof(float));
    void *pa = NULL, *pb = NULL;
    ds4_session *c = NULL, *d = NULL;
    if (!a || !b || !la || !lb) { CHECK(false, "%s: setup: %s", what, err); goto out; }

    int32_t toks[N_PROMPT], more[N_MORE];
    for (int i = 0; i < N_PROMPT; i++) toks[i] = (i * 37 + 11) % V;
    for (int i = 0; i < N_MORE; i++) more[i] = (i * 53 + 7) % V;
    CHECK(ds4_session_prefill(a, toks, N_PROMPT, la, NULL, NULL, err, sizeof err) == 0, "single prefill: %s", err);
    CHECK(ds4_session_prefill(b, toks, N_PROMPT, lb, NULL, NULL, err, sizeof err) == 0, "%s prefill: %s", what, err);
    CHECK(!memcmp(la, lb, (size_t)N_PROMPT * V * sizeof(float)), "%s: pipelined prefill logits differ", what);

    ds4_session *both[2] = {a, b};
    for (int step = 0; step < 3; step++) {
        if (!decode_all(both, 2, argmax(ds4_session_logits(a), V))) goto out;
        CHECK(same_logits(a, b, V), "%s: decode step %d differs", what, step);
    }

    check_batched(single, split, toks, what);

    CHECK(ds4_session_rewind(a, REWIND_TO, err, sizeof err) == 0, "single rewind: %s", err);
    CHECK(ds4_session_rewind(b, REWIND_TO, err, sizeof err) == 0, "%s rewind: %s", what, err);
    CHECK(ds4_session_prefill(a, more, N_MORE, NULL, NULL, NULL, err, sizeof err) == 0, "single continue: %s", err);
    CHECK(ds4_session_prefill(b, more, N_MORE, NULL, NULL, NULL, err, sizeof err) == 0, "%s continue: %s", what, err);
    CHECK(same_logits(a, b, V), "%s: rewind then continue differs", what);

    /* KV through the route: one normal payload, both directions */
    const size_t na = ds4_session_payload_bytes(a), nb = ds4_session_payload_bytes(b);
    CHECK(na == nb, "%s: payload sizes %zu vs %zu", what, nb, na);
    pa = malloc(na);
    pb = malloc(nb);
    c = ds4_session_new(single, CTX, err, sizeof err);
    d = ds4_session_new(split, CTX, err, sizeof err);
    if (na != nb || !pa || !pb || !c || !d) goto out;
    ds4_session_save_payload(a, pa);
    ds4_session_save_payload(b, pb);
    CHECK(!memcmp(pa, pb, na), "%s: the payload saved through the route differs from the single process's", what);
    CHECK(ds4_session_load_payload(c, pb, nb, err, sizeof err) == 0, "split payload into a single process: %s", err);
    CHECK(ds4_session_load_payload(d, pa, na, err, sizeof err) == 0, "single payload into the split: %s", err);
    ds4_session *four[4] = {a, b, c, d};
    if (!decode_all(four, 4, argmax(ds4_session_logits(a), V))) goto out;
    CHECK(same_logits(a, b, V) && same_logits(a, c, V) && same_logits(a, d, V),
          "%s: sessions continued after a payload save/load differ", what);

    if (n_slices == 2) {
        /* a long step failing part-way: the workers hold CTX positions, this session more */
        ds4_session *e = ds4_session_new(split, BIG_CTX, err, sizeof err), *g = ds4_session_new(single, BIG_CTX, err, sizeof err);
        int32_t *lng = malloc((N_FILL + N_STEP) * sizeof(int32_t));
        if (e && g && lng) {
            for (int i = 0; i < N_FILL + N_STEP; i++) lng[i] = (i * 29 + 3) % V;
            ds4_session *eg[2] = {e, g};
            for (int i = 0; i < 2; i++) {
                CHECK(ds4_session_prefill(eg[i], toks, N_PROMPT, NULL, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
                CHECK(ds4_session_prefill(eg[i], lng, N_FILL, NULL, NULL, NULL, err, sizeof err) == 0, "fill: %s", err);
            }
            /* one engine call (N_STEP tokens, more than the slack) crossing CTX */
            CHECK(ds4_session_prefill(e, lng + N_FILL, N_STEP, NULL, NULL, NULL, err, sizeof err) != 0 &&
                  strstr(err, "do not fit"), "%s: a step past the workers' context: %s", what, err);
            CHECK(ds4_session_n_tokens(e) == N_PROMPT + N_FILL, "%s: failed long step left %d tokens", what,
                  ds4_session_n_tokens(e));
            CHECK(ds4_session_prefill(e, more, N_MORE, NULL, NULL, NULL, err, sizeof err) == 0, "continue: %s", err);
            CHECK(ds4_session_prefill(g, more, N_MORE, NULL, NULL, NULL, err, sizeof err) == 0, "continue: %s", err);
            CHECK(same_logits(e, g, V), "%s: continuing after a failed long step differs", what);
            /* a batched call whose second sequence fails puts the first back too */
            const int b_before = ds4_session_n_tokens(b), e_before = ds4_session_n_tokens(e);
            ds4_step steps[2] = {{b, more, 1}, {e, lng + N_FILL, N_STEP - 1}};
            CHECK(ds4_sessions_step(split, steps, 2, err, sizeof err) != 0 && strstr(err, "do not fit"),
                  "%s: batched step past the workers' context: %s", what, err);
            CHECK(ds4_session_n_tokens(b) == b_before && ds4_session_n_tokens(e) == e_before,
                  "%s: failed batched step left %d and %d tokens, had %d and %d", what, ds4_session_n_tokens(b),
                  ds4_session_n_tokens(e), b_before, e_before);
            /* a rewind deeper than the workers' slack: they restore a ring
             * checkpoint, or the coordinator replays the kept prefix */
            for (int i = 0; i < 2; i++) {
                CHECK(ds4_session_rewind(eg[i], DEEP_REWIND_TO, err, sizeof err) == 0, "deep rewind: %s", err);
                CHECK(ds4_session_prefill(eg[i], more, N_MORE, NULL, NULL, NULL, err, sizeof err) == 0, "after: %s", err);
            }
            CHECK(same_logits(e, g, V), "%s: continuing after a deep rewind differs", what);
        } else {
            CHECK(false, "%s: long-step sessions: %s", what, err);
        }
        free(lng);
        ds4_session_free(e);
        ds4_session_free(g);
    }

    /* snapshot, two more steps, restore: the workers are put back to the snapshot */
    ds4_snapshot *sa = ds4_session_snapshot(a), *sb = ds4_session_snapshot(b);
    CHECK(sa && sb, "%s: snapshots", what);
    if (!sa || !sb || !decode_all(both, 2, argmax(ds4_session_logits(a), V)) ||
        !decode_all(both, 2, argmax(ds4_session_logits(a), V))) {
        ds4_snapshot_free(sa);
        ds4_snapshot_free(sb);
        goto out;
    }
    CHECK(ds4_session_restore(a, sa, err, sizeof err) == 0, "single restore: %s", err);
    CHECK(ds4_session_restore(b, sb, err, sizeof err) == 0, "%s restore: %s", what, err);
    ds4_snapshot_free(sa);
    ds4_snapshot_free(sb);
    if (!decode_all(both, 2, (int32_t)(V / 3))) goto out;
    CHECK(same_logits(a, b, V), "%s: a step after restoring a snapshot differs", what);

    /* kill -9 of the first worker: a clean failure, nothing half advanced */
    const int32_t t = argmax(ds4_session_logits(a), V);
    const int before = ds4_session_n_tokens(b);
    stop_worker(&workers[1]);
    CHECK(ds4_session_decode(b, t, err, sizeof err) != 0 && strstr(err, "gone"), "%s: step after kill: %s", what, err);
    CHECK(ds4_session_n_tokens(b) == before, "%s: failed step left %d tokens, had %d", what, ds4_session_n_tokens(b), before);
    CHECK(ds4_session_decode(b, t, err, sizeof err) != 0 && strstr(err, "incomplete route"), "%s: without the worker: %s",
          what, err);
    workers[1] = start_worker(slices[1], port);
    if (!wait_registered(&workers[1], what)) goto out;
    /* the restarted worker holds nothing: a batched step of two sessions finds
     * the mismatch, falls back to one session at a time and replays each */
    ds4_session *singles[2] = {a, c};
    ds4_step batch[2] = {{b, &t, 1}, {d, &t, 1}};
    CHECK(decode_all(singles, 2, t), "%s: single steps", what);
    CHECK(ds4_sessions_step(split, batch, 2, err, sizeof err) == 0, "%s: batched step after restart: %s", what, err);
    CHECK(same_logits(a, b, V) && same_logits(c, d, V), "%s: after restart and replay differs", what);
    if (!decode_all(both, 2, argmax(ds4_session_logits(a), V))) goto out;
    CHECK(same_logits(a, b, V), "%s: the step after the replay differs", what);
out:
    free(pa); free(pb); free(la); free(lb);
    ds4_session_free(a); ds4_session_free(b); ds4_session_free(c); ds4_session_free(d);
    ds4_engine_free(split);
    for (int i = 1; i < n_slices; i++) stop_worker(&workers[i]);
}

/* One slice of the in-process reference for the activation formats. */
typedef struct {
    ds4_model *m;
    ds4_backend *be;
    ds4_kv *kv;
} stage;

static void stage_close(stage *st) {
    if (st->be) st->be->free(st->be);
    ds4_kv_free(st->kv);
    ds4_model_free(st->m);
}

/* The hidden states as the next hop gets them: encoded into a WORK frame
 * in format act (a Q8 row is one HC stream of one token) and decoded. */
static bool through_wire(float *hidden, size_t n, uint8_t act, uint32_t n_embd) {
    const int32_t tok = 0;
    ds4_dist_work w = {0, 0, 0, 0, 1, 0, 0, DS4_DIST_ACK, false, NULL, (uint32_t)n, NULL, 0, NULL, act,
                       act == DS4_DIST_ACT_Q8 ? n_embd : 0, 0, 0};
    size_t len = 0;
    uint8_t *buf = ds4_dist_encode_work(DS4_DIST_WORK, &w, &tok, hidden, NULL, &len);
    ds4_dist_frame f;
    char err[256];
    const bool ok = buf && ds4_dist_decode(buf, len, &f, err, sizeof err);
    if (ok) ds4_dist_work_floats(&f.work, hidden);
    free(buf);
    return ok;
}

/* toks through the stages in order, the format applied at every cut. */
static bool chain(stage *st, int n_stages, const int32_t *toks, int n, float *logits, float *ha, float *hb,
                  uint8_t act) {
    char err[256];
    const float *in = NULL;
    for (int i = 0; i < n_stages; i++) {
        float *out = i % 2 ? hb : ha;
        ds4_backend_seq sq = {.kv = st[i].kv, .toks = toks, .n = n, .logits = logits, .all_logits = true,
                              .hidden_in = in, .hidden_out = i + 1 < n_stages ? out : NULL};
        if (st[i].be->eval(st[i].be, &sq, 1, err, sizeof err)) { CHECK(false, "stage %d: %s", i, err); return false; }
        const ds4_config *c = &st[i].m->cfg;
        if (i + 1 < n_stages && !through_wire(out, (size_t)n * c->n_hc * c->n_embd, act, (uint32_t)c->n_embd)) {
            CHECK(false, "stage %d: the transport codec failed", i);
            return false;
        }
        in = out;
    }
    return true;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void run_bits(ds4_engine *single, const char *const *slices, int n_slices, int bits) {
    enum { N_DECODE = 2 };
    char err[256], what[64];
    snprintf(what, sizeof what, "%d-way split, activation bits %d", n_slices, bits);
    const uint8_t act = bits == 16 ? DS4_DIST_ACT_F16 : DS4_DIST_ACT_Q8;
    const int port = free_port();
    worker_proc workers[4] = {{-1, NULL}, {-1, NULL}, {-1, NULL}, {-1, NULL}};
    for (int i = 1; i < n_slices; i++) workers[i] = start_worker(slices[i], port);
    ds4_engine *split = load(slices[0], port, bits, false, err, sizeof err);
    CHECK(split, "%s: coordinator: %s", what, err);
    for (int i = 1; split && i < n_slices; i++) wait_registered(&workers[i], what);
    ds4_gguf *g = ds4_gguf_open(MODEL, err, sizeof err);
    stage st[4] = {{0}};
    bool open = g != NULL;
    for (int i = 0; open && i < n_slices; i++) {
        ds4_layer_slice sl;
        open = ds4_layer_slice_parse(slices[i], &sl, err, sizeof err) &&
               (st[i].m = ds4_model_bind_slice(g, &sl, err, sizeof err)) &&
               (st[i].be = ds4_cpu_backend_new(st[i].m, 1, N_PROMPT, ds4_cpu_numerics_supported(&st[i].m->cfg), err,
                                               sizeof err)) &&
               (st[i].kv = ds4_kv_new(&st[i].m->cfg, CTX, 16));
    }
    CHECK(open, "%s: reference stages: %s", what, err);
    const int V = ds4_engine_n_vocab(single);
    const size_t hcE = open ? (size_t)st[0].m->cfg.n_hc * st[0].m->cfg.n_embd : 0;
    ds4_session *a = ds4_session_new(single, CTX, err, sizeof err), *b = split ? ds4_session_new(split, CTX, err, sizeof err) : NULL;
    float *la = malloc((size_t)N_PROMPT * V * sizeof(float)), *lb = malloc((size_t)N_PROMPT * V * sizeof(float));
    float *ref = malloc((size_t)N_PROMPT * V * sizeof(float));
    float *ha = malloc((size_t)N_PROMPT * hcE * sizeof(float) + 1), *hb = malloc((size_t)N_PROMPT * hcE * sizeof(float) + 1);
    if (!open || !a || !b || !la || !lb || !ref || !ha || !hb) { CHECK(false, "%s: setup: %s", what, err); goto out; }

    int32_t toks[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) toks[i] = (i * 41 + 5) % V;
    CHECK(ds4_session_prefill(a, toks, N_PROMPT, la, NULL, NULL, err, sizeof err) == 0, "single prefill: %s", err);
    CHECK(ds4_session_prefill(b, toks, N_PROMPT, lb, NULL, NULL, err, sizeof err) == 0, "%s prefill: %s", what, err);
    if (!chain(st, n_slices, toks, N_PROMPT, ref, ha, hb, act)) goto out;
    CHECK(!memcmp(lb, ref, (size_t)N_PROMPT * V * sizeof(float)),
          "%s: pipelined prefill logits differ from the slices chained with the same format", what);
    double worst = max_abs_diff(la, lb, (size_t)N_PROMPT * V), largest = 0;
    for (size_t i = 0; i < (size_t)N_PROMPT * V; i++) largest = fmax(largest, fabs(la[i]));
    ds4_session *both[2] = {a, b};
    for (int step = 0; step < N_DECODE; step++) {
        const int32_t t = argmax(ds4_session_logits(b), V);
        if (!decode_all(both, 2, t) || !chain(st, n_slices, &t, 1, ref, ha, hb, act)) goto out;
        CHECK(!memcmp(ds4_session_logits(b), ref, (size_t)V * sizeof(float)),
              "%s: decode step %d differs from the slices chained with the same format", what, step);
        worst = fmax(worst, max_abs_diff(ds4_session_logits(a), ds4_session_logits(b), (size_t)V));
    }
    printf("test_dist_route: %s: max |logit - single process| %.3g (largest |logit| %.3g)\n", what, worst, largest);
out:
    free(la); free(lb); free(ref); free(ha); free(hb);
    ds4_session_free(a); ds4_session_free(b);
    for (int i = 0; i < n_slices; i++) stage_close(&st[i]);
    ds4_gguf_close(g);
    ds4_engine_free(split);
    for (int i = 1; i < n_slices; i++) stop_worker(&workers[i]);
}

/* Prefill N_PROMPT + N_FILL tokens on both sessions, rewind to
 * DEEP_REWIND_TO (deeper than the slack: the engine restores its checkpoint
 * at N_PROMPT, the end of its first call) and continue; true when the
 * continuation's logits are equal. *mark: where stderr stood before the
 * rewind. */
static bool deep_rewind(ds4_session *e, ds4_session *g, const int32_t *toks, const int32_t *lng, int V, off_t *mark) {
    char err[256];
    ds4_session *eg[2] = {e, g};
    static const int32_t more[N_MORE] = {7, 60, 113, 166, 219, 272};
    for (int i = 0; i < 2; i++) {
        CHECK(ds4_session_prefill(eg[i], toks, N_PROMPT, NULL, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
        CHECK(ds4_session_prefill(eg[i], lng, N_FILL, NULL, NULL, NULL, err, sizeof err) == 0, "fill: %s", err);
    }
    fflush(stderr);
    *mark = lseek(2, 0, SEEK_CUR);
    for (int i = 0; i < 2; i++) {
        CHECK(ds4_session_rewind(eg[i], DEEP_REWIND_TO, err, sizeof err) == 0, "deep rewind: %s", err);
        CHECK(ds4_session_prefill(eg[i], more, N_MORE, NULL, NULL, NULL, err, sizeof err) == 0, "after: %s", err);
    }
    return same_logits(e, g, V);
}

/* What the coordinator's --debug lines in fd's bytes [from, to) say: whether
 * a replay ran, and whether a step started at position N_PROMPT (the
 * restored checkpoint). */
static void log_between(int fd, off_t from, off_t to, bool *replayed, bool *from_ckpt) {
    char *text = calloc(1, (size_t)(to - from) + 1);
    char want[64];
    snprintf(want, sizeof want, "layers 0..2 tokens %d..", N_PROMPT);
    *replayed = *from_ckpt = false;
    if (text && pread(fd, text, (size_t)(to - from), from) == to - from) {
        *replayed = strstr(text, "replaying") != NULL;
        *from_ckpt = strstr(text, want) != NULL;
    }
    free(text);
}

static void run_deep_rewinds(ds4_engine *single) {
    char err[256] = "";
    const int port = free_port();
    const char *slices[] = {"0:2", "3:output"};
    worker_proc worker = start_worker(slices[1], port);
    /* the split's --debug lines go to a file: they say whether a step replayed */
    FILE *log = tmpfile();
    const int saved = dup(2);
    if (!log || saved < 0) { CHECK(false, "capturing stderr"); stop_worker(&worker); return; }
    fflush(stderr);
    dup2(fileno(log), 2);
    ds4_engine *split = load(slices[0], port, 32, true, err, sizeof err);
    if (split && !wait_registered(&worker, "deep rewinds")) { ds4_engine_free(split); split = NULL; }
    const int V = ds4_engine_n_vocab(single);
    ds4_session *e = split ? ds4_session_new(split, CTX, err, sizeof err) : NULL;
    ds4_session *g = ds4_session_new(single, CTX, err, sizeof err);
    int32_t toks[N_PROMPT], lng[N_FILL];
    for (int i = 0; i < N_PROMPT; i++) toks[i] = (i * 37 + 11) % V;
    for (int i = 0; i < N_FILL; i++) lng[i] = (i * 29 + 3) % V;
    off_t mark = 0;
    const bool equal = e && g && deep_rewind(e, g, toks, lng, V, &mark);
    fflush(stderr);
    const off_t end = lseek(2, 0, SEEK_CUR);
    dup2(saved, 2);
    close(saved);
    bool replayed, from_ckpt;
    log_between(fileno(log), mark, end, &replayed, &from_ckpt);
    /* failures checked while stderr went to the file are shown here */
    char *text = calloc(1, (size_t)end + 1);
    for (char *line = text && pread(fileno(log), text, (size_t)end, 0) == end ? strtok(text, "\n") : NULL; line;
         line = strtok(NULL, "\n"))
        if (!strncmp(line, "FAIL", 4)) fprintf(stderr, "%s\n", line);
    free(text);
    CHECK(e && g, "deep-rewind sessions: %s", err);
    CHECK(equal, "deep rewind through the route differs");
    CHECK(from_ckpt && !replayed, "deep rewind: the worker's checkpoint served (a step from %d: %d, replayed %d)",
          N_PROMPT, from_ckpt, replayed);
    fclose(log);
    ds4_session_free(e);
    ds4_session_free(g);
    ds4_engine_free(split);
    stop_worker(&worker);
}

/* ds4_kv_new_layers: a slice's state has its layers' buffers only. */
/* Directional steering through a 3-way route (every process holding the
 * same file, each applying its own layers' rows): a batched call of three
 * sessions, one with the engine's scales, one unsteered (0, 0) and one with
 * its own negative/positive scales, then a decode step of all three; each
 * session's logits equal the single process's run of it alone, with the
 * same file and scales. The steered sessions differ from the unsteered run
 * of the same tokens, so a route that dropped the scales would fail. */
static void run_steered(void) {
    enum { N_SESS = 3, N_TOK = 45 };
    static const float scales[N_SESS][2] = {{NAN, NAN}, {0, 0}, {-0.8f, 0.6f}};   /* ffn, attn; NAN: the engine's */
    const char *const slices[] = {"0:1", "2:3", "4:output"};
    char err[256], path[] = "/tmp/test_dist_route_steer_XXXXXX";
    ds4_engine *plain = load(NULL, 0, 32, false, err, sizeof err);
    const int fd = mkstemp(path);
    if (!plain || fd < 0) { CHECK(false, "steering setup: %s", err); ds4_engine_free(plain); return; }
    const int L = ds4_engine_n_layers(plain), E = ds4_engine_n_embd(plain), V = ds4_engine_n_vocab(plain);
    float *dir = malloc((size_t)L * E * sizeof(float));
    uint32_t x = 2024;
    for (int l = 0; dir && l < L; l++) {
        double norm = 0;
        for (int i = 0; i < E; i++) {
            x = x * 1664525u + 1013904223u;
            dir[(size_t)l * E + i] = (float)((double)(x >> 8) / (1 << 24) - 0.5);
            norm += (double)dir[(size_t)l * E + i] * dir[(size_t)l * E + i];
        }
        for (int i = 0; i < E; i++) dir[(size_t)l * E + i] = (float)(dir[(size_t)l * E + i] / sqrt(norm));
    }
    const bool written = dir && write(fd, dir, (size_t)L * E * sizeof(float)) == (ssize_t)((size_t)L * E * sizeof(float));
    close(fd);
    free(dir);
    const int port = free_port();
    worker_proc workers[3] = {{-1, NULL}, start_worker_steered(slices[1], port, path),
                              start_worker_steered(slices[2], port, path)};
    ds4_engine *single = load_steered(NULL, 0, 32, false, path, err, sizeof err);
    CHECK(single, "steered single engine: %s", err);
    ds4_engine *split = single ? load_steered(slices[0], port, 32, false, path, err, sizeof err) : NULL;
    CHECK(!single || split, "steered coordinator: %s", err);
    for (int i = 1; split && i < 3; i++) wait_registered(&workers[i], "steered route");
    ds4_session *x3[N_SESS] = {0}, *y3[N_SESS] = {0}, *u3[N_SESS] = {0};
    int32_t toks[N_SESS][N_TOK];
    ds4_step steps[N_SESS];
    bool ok = written && split;
    for (int i = 0; ok && i < N_SESS; i++) {
        x3[i] = ds4_session_new(split, CTX, err, sizeof err);
        y3[i] = ds4_session_new(single, CTX, err, sizeof err);
        u3[i] = ds4_session_new(plain, CTX, err, sizeof err);
        ok = x3[i] && y3[i] && u3[i];
        for (int k = 0; ok && !isnan(scales[i][0]) && k < 2; k++)
            ok = ds4_session_set_steering(k ? y3[i] : x3[i], scales[i][0], scales[i][1], err, sizeof err) == 0;
        for (int k = 0; k < N_TOK; k++) toks[i][k] = (k * 29 + 13 * i + 3) % V;
        /* 1, 7 and 45 tokens: a decode row, a short and a two-chunk prefill in one call */
        steps[i] = (ds4_step){x3[i], toks[i], i == 0 ? 1 : i == 1 ? 7 : N_TOK};
    }
    CHECK(ok, "steered sessions: %s", err);
    CHECK(ok && ds4_sessions_step(split, steps, N_SESS, err, sizeof err) == 0, "steered batched step: %s", err);
    for (int i = 0; ok && i < N_SESS; i++) {
        const int n = steps[i].n;
        CHECK(ds4_session_prefill(y3[i], toks[i], n, NULL, NULL, NULL, err, sizeof err) == 0, "single: %s", err);
        CHECK(ds4_session_prefill(u3[i], toks[i], n, NULL, NULL, NULL, err, sizeof err) == 0, "unsteered: %s", err);
        CHECK(same_logits(x3[i], y3[i], V), "steered route: batched session %d differs from the single process", i);
        CHECK(same_logits(x3[i], u3[i], V) == (i == 1), "steered route: session %d %s the unsteered run", i,
              i == 1 ? "differs from" : "equals");
    }
    int32_t next[N_SESS];
    for (int i = 0; ok && i < N_SESS; i++) {
        next[i] = argmax(ds4_session_logits(y3[i]), V);
        steps[i] = (ds4_step){x3[i], &next[i], 1};
        CHECK(ds4_session_decode(y3[i], next[i], err, sizeof err) == 0, "single decode: %s", err);
    }
    CHECK(!ok || ds4_sessions_step(split, steps, N_SESS, err, sizeof err) == 0, "steered batched decode: %s", err);
    for (int i = 0; ok && i < N_SESS; i++)
        CHECK(same_logits(x3[i], y3[i], V), "steered route: decode of session %d differs from the single process", i);
    for (int i = 0; i < N_SESS; i++) {
        ds4_session_free(x3[i]);
        ds4_session_free(y3[i]);
        ds4_session_free(u3[i]);
    }
    ds4_engine_free(split);
    for (int i = 1; i < 3; i++) stop_worker(&workers[i]);
    ds4_engine_free(single);
    ds4_engine_free(plain);
    unlink(path);
}

static void check_slice_state(void) {
    char err[256];
    ds4_gguf *gg = ds4_gguf_open(MODEL, err, sizeof err);
    ds4_model *m = gg ? ds4_model_bind_slice(gg, NULL, err, sizeof err) : NULL;
    CHECK(m, "model: %s", err);
    if (m) {
        const ds4_config *cfg = &m->cfg;
        const int L = cfg->n_layer;
        ds4_kv *whole = ds4_kv_new(cfg, CTX, 256), *a = ds4_kv_new_layers(cfg, CTX, 256, 0, 2),
               *b = ds4_kv_new_layers(cfg, CTX, 256, 3, L - 1);
        CHECK(whole && a && b, "states");
        if (whole && a && b) {
            CHECK(a->bytes + b->bytes == whole->bytes && a->bytes < whole->bytes && b->bytes < whole->bytes,
                  "slice bytes %llu + %llu, whole %llu", (unsigned long long)a->bytes, (unsigned long long)b->bytes,
                  (unsigned long long)whole->bytes);
            CHECK(a->ring_bytes + b->ring_bytes == whole->ring_bytes + sizeof(int64_t), "ring checkpoint bytes");
            CHECK(ds4_kv_bytes_for_layers(cfg, CTX, 256, 3, L - 1) == b->bytes, "accounted as allocated");
            CHECK(!a->L[3].raw && b->L[3].raw && !b->L[2].raw, "buffers of the slice's layers only");
            const size_t n = ds4_kv_layers_bytes(whole, 3, L - 1, 0);
            void *buf = malloc(n + 1);
            ds4_kv_layers_save(whole, 3, L - 1, buf);
            char why[256];
            CHECK(ds4_kv_layers_load(b, 3, L - 1, 0, buf, n, why, sizeof why), "a slice state takes its layers");
            CHECK(!ds4_kv_layers_load(a, 3, L - 1, 0, buf, n, why, sizeof why), "a slice state refuses another range");
            free(buf);
            /* KV_PUT's layer state: values no state holds are refused before
             * any row changes (the worker answers with the line) */
            const size_t nf = ds4_kv_layers_bytes(whole, 3, L - 1, 40) / sizeof(float);
            float *st = malloc(nf * sizeof(float));
            for (size_t i = 0; st && i < nf; i++) st[i] = 0.25f;
            CHECK(st && ds4_kv_layers_load(b, 3, L - 1, 40, st, nf * sizeof(float), why, sizeof why) && b->n_pos == 40,
                  "layer state of 40 positions: %s", why);
            const float bad[] = {NAN, INFINITY, -INFINITY, 3e38f, 65536.0f};
            for (size_t k = 0; st && k < sizeof bad / sizeof bad[0]; k++) {
                st[nf - 1 - k * 7] = bad[k];
                CHECK(!ds4_kv_layers_load(b, 3, L - 1, 40, st, nf * sizeof(float), why, sizeof why) &&
                          strstr(why, "outside the range") && b->n_pos == 40,
                      "layer state holding %g: %s (n_pos %d)", (double)bad[k], why, b->n_pos);
                st[nf - 1 - k * 7] = 0.25f;
            }
            free(st);
        }
        CHECK(!ds4_kv_new_layers(cfg, CTX, 256, 2, L), "a range past the model is refused");
        /* the checkpoint list's thinning (engine and workers): the odd entries
         * stay in order, every slot survives, the freed ones behind them */
        int pos[16], seen[16] = {0};
        char cells[16];
        void *slots[16];
        for (int i = 0; i < 16; i++) { pos[i] = 40 * (i + 1); slots[i] = &cells[i]; }
        const int kept = ds4_kv_ckpt_thin(pos, slots, 16);
        bool odd = kept == 8;
        for (int i = 0; i < 16; i++) seen[(char *)slots[i] - cells]++;
        for (int i = 0; i < 8; i++) odd &= pos[i] == 40 * (2 * i + 2) && slots[i] == &cells[2 * i + 1] && seen[i] == 1 &&
                                           seen[8 + i] == 1;
        CHECK(odd, "thinning keeps the odd checkpoints and every slot");
        ds4_kv_free(whole); ds4_kv_free(a); ds4_kv_free(b);
    }
    ds4_model_free(m);
    ds4_gguf_close(gg);
}

int main(int argc, char **argv) {
    if ((argc == 4 || argc == 5) && !strcmp(argv[1], "worker")) return worker_main(argv[2], argv[3], argv[4]);
    if (access(MODEL, R_OK)) return check_skipped("test_dist_route", "needs models/demo.gguf (make test builds it)");
    signal(SIGPIPE, SIG_IGN);
    char err[256];
    ds4_engine *single = load(NULL, 0, 32, false, err, sizeof err);
    if (!single) { CHECK(false, "single engine: %s", err); return check_done("test_dist_route"); }
    const char *two[] = {"0:2", "3:output"}, *three[] = {"0:1", "2:3", "4:output"};
    run_split(single, two, 2);
    run_split(single, three, 3);
    for (int bits = 16; bits >= 8; bits -= 8) {
        run_bits(single, two, 2, bits);
        run_bits(single, three, 3, bits);
    }
    run_deep_rewinds(single);
    run_steered();
    check_slice_state();
    ds4_engine_free(single);
    return check_done("test_dist_route");
}
