/* test_tp_split.c -- the tensor-parallel split of the CPU backend
 * (forward_cpu.h ds4_cpu_backend_split): two backends over the same model,
 * rank 0 (experts [0, mid), the first half of the heads, of out_b's rows,
 * of the shared expert's rows and of the vocabulary) and rank 1 (experts
 * [mid, n), the other halves), each on its own thread and KV state,
 * exchanging four times per MoE layer (the gates tp_split.h numbers, each
 * checked) and once per chunk of output rows through memory, give
 * the single process's logits bit for bit (memcmp) on rank 0, for a
 * chunked prefill with every position's logits, for decode steps after it,
 * and for two sequences in one batch; rank 1 writes no logits. After it,
 * both ranks' states continue a prefill in one call that again equals the
 * single process. Models: the converted oracle model and the demo-layout
 * random model (K-quant and IQ2_XXS experts, hash layers) of DeepSeek V4,
 * and of GLM 5.2 (glm_forward.h ds4_glm_forward_split) the converted
 * transformers oracle (f32 and q8_0: a dense first layer, full and shared
 * indexer layers) and the glm-demo model. The single process runs with
 * other chunk sizes than the ranks. The shared expert's schedule also runs
 * alone on widths that do not halve evenly. */
#include "check.h"
#include "backends/backend.h"
#include "format/gguf.h"
#include "models/dsv4/forward_cpu.h"
#include "models/dsv4/kv.h"
#include "models/dsv4/model.h"
#include "models/glm/glm_backend.h"
#include "models/glm/glm_forward.h"
#include "models/glm/glm_kv.h"
#include "models/glm/glm_model.h"
#include "nn/nn_math.h"
#include "nn/tp_split.h"
#include "kernels/kernels_cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CTX = 96, N_PROMPT = 40, N_DECODE = 4 };

/* The link between the two ranks: a queue of frames per direction. send
 * copies its floats into the other rank's queue and returns; recv waits for
 * the head of its own queue, which must carry the gate and size it expects
 * (a rank that sends a later gate before it receives an earlier one, as
 * the shared expert does, leaves two frames queued). */
enum { MAX_QUEUED = 8 };

typedef struct {
    int gate;
    size_t n;
    float *data;
} frame;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    frame q[2][MAX_QUEUED];   /* q[r]: the frames rank r has still to receive */
    int n_q[2];
    int exchanges;            /* rank 0's sends: one per gate */
    bool mismatch;            /* a frame of another gate or size, or a full queue */
} rendezvous;

typedef struct {
    rendezvous *rv;
    int rank;
} rank_ud;

static void link_send(void *ud, int gate, const float *data, size_t n) {
    rank_ud *u = ud;
    rendezvous *r = u->rv;
    float *copy = malloc((n + 1) * sizeof(float));
    if (copy && n) memcpy(copy, data, n * sizeof(float));
    pthread_mutex_lock(&r->mu);
    const int to = 1 - u->rank;
    if (!copy || r->n_q[to] == MAX_QUEUED) {
        r->mismatch = true;
        free(copy);
    } else {
        r->q[to][r->n_q[to]++] = (frame){gate, n, copy};
    }
    if (u->rank == 0) r->exchanges++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void link_recv(void *ud, int gate, float *data, size_t n) {
    rank_ud *u = ud;
    rendezvous *r = u->rv;
    pthread_mutex_lock(&r->mu);
    while (!r->n_q[u->rank] && !r->mismatch) pthread_cond_wait(&r->cv, &r->mu);
    if (r->n_q[u->rank]) {
        const frame fr = r->q[u->rank][0];
        memmove(r->q[u->rank], r->q[u->rank] + 1, (size_t)--r->n_q[u->rank] * sizeof(frame));
        if (fr.gate != gate || fr.n != n) r->mismatch = true;
        /* (the sending side of a head exchange receives nothing: data NULL) */
        else if (n) memcpy(data, fr.data, n * sizeof(float));
        free(fr.data);
    }
    if (r->mismatch && n) memset(data, 0, n * sizeof(float));
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

typedef struct {
    ds4_backend *be;
    const ds4_backend_seq *seqs;
    int n_seqs, rc;
    char err[256];
} eval_job;

static void *eval_thread(void *arg) {
    eval_job *j = arg;
    j->rc = j->be->eval(j->be, j->seqs, j->n_seqs, j->err, sizeof j->err);
    return NULL;
}

/* Both ranks evaluate their batches at once; 0 when both succeed. */
static int eval_both(ds4_backend *be0, const ds4_backend_seq *s0, ds4_backend *be1, const ds4_backend_seq *s1,
                     int n_seqs) {
    eval_job j[2] = {{be0, s0, n_seqs, 0, ""}, {be1, s1, n_seqs, 0, ""}};
    pthread_t t;
    if (pthread_create(&t, NULL, eval_thread, &j[1])) return -1;
    eval_thread(&j[0]);
    pthread_join(t, NULL);
    if (j[0].rc || j[1].rc) fprintf(stderr, "rank eval: %s / %s\n", j[0].err, j[1].err);
    return j[0].rc || j[1].rc ? -1 : 0;
}

/* What the check needs of a family: its backends, states and split, and
 * how many exchanges one forward call over every layer makes. */
typedef struct {
    void *m;
    int V, layer_exchanges, mid;
    ds4_backend *(*backend)(void *m, int threads, char *err, size_t errlen);
    void *(*state_new)(void *m);
    void (*state_free)(void *kv);
    bool (*split)(ds4_backend *be, const ds4_cpu_split *sp);
    bool glm;
} family;

static ds4_backend_seq seq(const family *fm, void *kv, const int32_t *toks, int n, float *logits, bool all) {
    ds4_backend_seq q = {.toks = toks, .n = n, .logits = logits, .all_logits = all};
    if (fm->glm) q.glm = kv;
    else q.kv = kv;
    return q;
}

static void check_family(const char *path, const family *fm, int threads) {
    char err[512];
    ds4_backend *single = fm->backend(fm->m, threads, err, sizeof err);
    ds4_backend *r0 = fm->backend(fm->m, threads, err, sizeof err);
    ds4_backend *r1 = fm->backend(fm->m, threads, err, sizeof err);
    CHECK(single && r0 && r1, "backends: %s", err);
    rendezvous rv = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    rank_ud u0 = {&rv, 0}, u1 = {&rv, 1};
    if (r0 && r1)
        CHECK(fm->split(r0, &(ds4_cpu_split){0, fm->mid, link_send, link_recv, &u0}) &&
                  fm->split(r1, &(ds4_cpu_split){1, fm->mid, link_send, link_recv, &u1}), "split: out of memory");
    const int V = fm->V, N = N_PROMPT + N_DECODE;
    int32_t toks[2][N_PROMPT + N_DECODE];
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < N; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            toks[s][i] = (int32_t)((r >> 33) % (uint64_t)V);
        }
    float *want = calloc((size_t)2 * N * V, sizeof(float)), *got0 = calloc((size_t)2 * N * V, sizeof(float)),
          *got1 = calloc((size_t)2 * N * V, sizeof(float));
    void *kw[2], *k0[2], *k1[2];
    for (int s = 0; s < 2; s++) {
        kw[s] = fm->state_new(fm->m);
        k0[s] = fm->state_new(fm->m);
        k1[s] = fm->state_new(fm->m);
    }
    bool ok = single && r0 && r1 && want && got0 && got1;
    /* reference: sequence 0 alone, the prompt in one call, then decode; sequence 1 the same */
    for (int s = 0; ok && s < 2; s++) {
        float *w = want + (size_t)s * N * V;
        ds4_backend_seq sq = seq(fm, kw[s], toks[s], N_PROMPT, w, true);
        ok = !single->eval(single, &sq, 1, err, sizeof err);
        for (int i = N_PROMPT; ok && i < N; i++) {
            sq = seq(fm, kw[s], &toks[s][i], 1, w + (size_t)i * V, false);
            ok = !single->eval(single, &sq, 1, err, sizeof err);
        }
    }
    CHECK(ok, "%s: single process: %s", path, err);
    /* the ranks: both sequences in one batch, the prompt in chunks of 16, then decode steps of both */
    for (int p = 0; ok && p < N_PROMPT; p += 16) {
        const int n = N_PROMPT - p < 16 ? N_PROMPT - p : 16;
        ds4_backend_seq s0[2], s1[2];
        for (int s = 0; s < 2; s++) {
            s0[s] = seq(fm, k0[s], &toks[s][p], n, got0 + ((size_t)s * N + p) * V, true);
            s1[s] = seq(fm, k1[s], &toks[s][p], n, NULL, true);
        }
        ok = !eval_both(r0, s0, r1, s1, 2);
    }
    for (int i = N_PROMPT; ok && i < N; i++) {
        ds4_backend_seq s0[2], s1[2];
        for (int s = 0; s < 2; s++) {
            s0[s] = seq(fm, k0[s], &toks[s][i], 1, got0 + ((size_t)s * N + i) * V, false);
            s1[s] = seq(fm, k1[s], &toks[s][i], 1, NULL, false);
        }
        ok = !eval_both(r0, s0, r1, s1, 2);
    }
    CHECK(ok && !rv.mismatch, "%s: split eval failed (or the ranks disagree on a gate or its size)", path);
    if (ok) {
        /* 3 prefill calls and N_DECODE decode calls, each with the
         * layers' exchanges (heads split: the models have an even number
         * of output groups / heads), plus the head's: one per sequence of
         * 16 rows in a prefill call, one for both decode rows */
        CHECK(rv.exchanges == (3 + N_DECODE) * fm->layer_exchanges + 3 * 2 + N_DECODE, "%s: %d exchanges", path,
              rv.exchanges);
        CHECK(!memcmp(want, got0, (size_t)2 * N * V * sizeof(float)), "%s: rank 0's logits differ from one process",
              path);
        float *zeros = calloc((size_t)2 * N * V, sizeof(float));
        CHECK(zeros && !memcmp(zeros, got1, (size_t)2 * N * V * sizeof(float)), "%s: rank 1 wrote logits", path);
        free(zeros);
    }
    /* the ranks' states after all that: one more call of 24 tokens (3
     * chunks of the head) on sequence 0 against the single process */
    float *lg = calloc((size_t)24 * V, sizeof(float)), *lw = calloc((size_t)24 * V, sizeof(float));
    int32_t more[24];
    for (int i = 0; i < 24; i++) more[i] = toks[1][i];
    ds4_backend_seq sw = seq(fm, kw[0], more, 24, lw, true);
    ok = ok && lg && lw && !single->eval(single, &sw, 1, err, sizeof err);
    ds4_backend_seq s0 = seq(fm, k0[0], more, 24, lg, true), s1 = seq(fm, k1[0], more, 24, NULL, true);
    ok = ok && !eval_both(r0, &s0, r1, &s1, 1);
    CHECK(ok, "%s: a further call: %s", path, err);
    if (ok) CHECK(!memcmp(lw, lg, (size_t)24 * V * sizeof(float)), "%s: the further call's logits differ", path);
    free(lw);
    free(lg);
    for (int s = 0; s < 2; s++) { fm->state_free(kw[s]); fm->state_free(k0[s]); fm->state_free(k1[s]); }
    free(want); free(got0); free(got1);
    ds4_backend *all_be[] = {single, r0, r1};
    for (size_t i = 0; i < sizeof all_be / sizeof *all_be; i++)
        if (all_be[i]) all_be[i]->free(all_be[i]);
}

static bool ds4_numerics;
static ds4_backend *ds4_be(void *m, int threads, char *err, size_t errlen) {
    return ds4_cpu_backend_new(m, threads, 64, ds4_numerics, err, errlen);
}
static void *ds4_state(void *m) { return ds4_kv_new(&((ds4_model *)m)->cfg, CTX, 16); }
static void ds4_state_free(void *kv) { ds4_kv_free(kv); }

static void check_model(const char *path, int threads) {
    char err[512];
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "%s: %s", path, err);
    if (!g) return;
    ds4_layer_slice all = DS4_SLICE_ALL;
    ds4_model *m = ds4_model_bind_slice(g, &all, err, sizeof err);
    CHECK(m != NULL, "%s: %s", path, err);
    if (!m) { ds4_gguf_close(g); return; }
    const ds4_config *c = &m->cfg;
    ds4_numerics = ds4_cpu_numerics_supported(c);
    CHECK(ds4_cpu_split_heads(c), "%s: the model's output groups do not split", path);
    const family fm = {m, c->n_vocab, DS4_SPLIT_GATES * c->n_layer, c->n_expert / 2, ds4_be, ds4_state, ds4_state_free,
                       ds4_cpu_backend_split, false};
    check_family(path, &fm, threads);
    ds4_model_free(m);
    ds4_gguf_close(g);
}

static ds4_backend *glm_be(void *m, int threads, char *err, size_t errlen) {
    return ds4_glm_cpu_backend_new(m, threads, 64, err, errlen);
}
static void *glm_state(void *m) { return ds4_glm_kv_new(&((glm_model *)m)->hp, CTX); }
static void glm_state_free(void *kv) { ds4_glm_kv_free(kv); }

static void check_glm(const char *path, int threads) {
    char err[512];
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "%s: %s", path, err);
    if (!g) return;
    glm_model *m = ds4_glm_model_bind(g, err, sizeof err);
    CHECK(m != NULL, "%s: %s", path, err);
    if (!m) { ds4_gguf_close(g); return; }
    const glm_hparams *hp = &m->hp;
    CHECK(ds4_glm_split_heads(m), "%s: the model's heads do not split", path);
    /* per layer: the two attention exchanges, and the shared expert's and the MoE's on MoE layers */
    int per_call = 0;
    for (uint32_t l = 0; l < glm_n_trunk(hp); l++) per_call += 2 + 2 * !glm_block_dense(hp, (int)l);
    const family fm = {m, (int)hp->n_vocab, per_call, (int)hp->n_expert / 2, glm_be, glm_state, glm_state_free,
                       ds4_glm_cpu_backend_split, true};
    check_family(path, &fm, threads);
    ds4_glm_model_free(m);
    ds4_gguf_close(g);
}

/* The shared expert's schedule alone, on widths that do not halve evenly
 * (F = 7, E = 5, 3 rows) and f32 weights: both ranks' joined output must
 * be the single product's, bit for bit. */
enum { SH_E = 5, SH_F = 7, SH_T = 3 };

typedef struct {
    const ds4_cpu_split *sp;
    const ds4_tensor *gate, *up, *down;
    const float *x;
    float out[SH_T * SH_E];
} shared_rank;

static void f32_rows(void *ctx, const ds4_tensor *W, int64_t row0, int64_t rows, const float *X, size_t x_stride,
                     int T, float *Y) {
    (void)ctx;
    static _Thread_local float act[64 * SH_T];
    ds4_linear(NULL, act, W, 0, row0, rows, X, (int64_t)x_stride, T, Y);
}

static void *shared_rank_run(void *arg) {
    shared_rank *r = arg;
    const ds4_split_product pr = {f32_rows, NULL, NULL};
    float act[SH_T * SH_F], up[SH_T * SH_F], recv[SH_T * SH_F], whole[SH_T * SH_F], mine[SH_T * SH_E];
    float moe_recv[SH_T * SH_E];
    ds4_split_shared_begin(r->sp, 0, &pr, r->gate, r->up, 1.5f, r->x, SH_E, SH_T, act, up);
    ds4_split_shared_end(r->sp, 0, &pr, r->down, SH_T, act, recv, whole, mine);
    const size_t own = (size_t)SH_T * ds4_split_len(r->sp, SH_E);
    ds4_split_exchange(r->sp, ds4_split_gate(0, DS4_SPLIT_MOE), mine, own, moe_recv, (size_t)SH_T * SH_E - own);
    ds4_split_join(r->sp, SH_T, SH_E, mine, moe_recv, r->out);
    return NULL;
}

static void check_shared_odd(void) {
    float wg[SH_F * SH_E], wu[SH_F * SH_E], wd[SH_E * SH_F], x[SH_T * SH_E];
    uint64_t s = 12345;
    float *all[] = {wg, wu, wd, x};
    const int n[] = {SH_F * SH_E, SH_F * SH_E, SH_E * SH_F, SH_T * SH_E};
    for (int a = 0; a < 4; a++)
        for (int i = 0; i < n[a]; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            all[a][i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (float)(1 << 22);
        }
    const ds4_tensor gate = {wg, DS4_TYPE_F32, {SH_E, SH_F, 1}, SH_E * sizeof(float)};
    const ds4_tensor up = {wu, DS4_TYPE_F32, {SH_E, SH_F, 1}, SH_E * sizeof(float)};
    const ds4_tensor down = {wd, DS4_TYPE_F32, {SH_F, SH_E, 1}, SH_F * sizeof(float)};
    /* the single process: whole products */
    float g[SH_T * SH_F], u[SH_T * SH_F], want[SH_T * SH_E];
    f32_rows(NULL, &gate, 0, SH_F, x, SH_E, SH_T, g);
    f32_rows(NULL, &up, 0, SH_F, x, SH_E, SH_T, u);
    ds4_swiglu(NULL, g, u, SH_T, SH_F, 1.5f);
    f32_rows(NULL, &down, 0, SH_E, g, SH_F, SH_T, want);
    rendezvous rv = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    rank_ud u0 = {&rv, 0}, u1 = {&rv, 1};
    const ds4_cpu_split s0 = {0, 0, link_send, link_recv, &u0}, s1 = {1, 0, link_send, link_recv, &u1};
    shared_rank r0 = {&s0, &gate, &up, &down, x, {0}}, r1 = {&s1, &gate, &up, &down, x, {0}};
    pthread_t t;
    CHECK(!pthread_create(&t, NULL, shared_rank_run, &r1), "thread");
    shared_rank_run(&r0);
    pthread_join(t, NULL);
    CHECK(!rv.mismatch && rv.exchanges == 2, "shared split: %d exchanges%s", rv.exchanges,
          rv.mismatch ? ", a gate or size mismatch" : "");
    CHECK(!memcmp(r0.out, want, sizeof want) && !memcmp(r1.out, want, sizeof want),
          "shared split on odd widths differs from the whole product");
}

int main(void) {
    check_shared_odd();
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char path[512];
    snprintf(path, sizeof path, "%s/ds4tiny/A-f32.gguf", build);
    int ran = 0;
    if (access(path, R_OK) == 0) { check_model(path, 1); check_model(path, 2); ran++; }
    if (access("models/demo.gguf", R_OK) == 0) { check_model("models/demo.gguf", 2); ran++; }
    const char *glm[] = {"glmtiny/A-f32.gguf", "glmtiny/A-q8_0.gguf", "glmchat/glm-demo.gguf"};
    for (size_t i = 0; i < sizeof glm / sizeof *glm; i++) {
        snprintf(path, sizeof path, "%s/%s", build, glm[i]);
        if (access(path, R_OK) == 0) { check_glm(path, i ? 2 : 1); ran++; }
    }
    if (!ran) return check_skipped("test_tp_split", "no oracle or demo model (make test data)");
    return check_done("test_tp_split");
}
