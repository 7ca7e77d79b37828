/* test_tp_split.c -- the tensor-parallel split of the CPU backend
 * (forward_cpu.h ds4_cpu_backend_split): two backends over the same model,
 * rank 0 (shared expert, experts [0, mid), the first half of the heads, of
 * out_b's rows and of the vocabulary) and rank 1 (experts [mid, n), the
 * other halves), each on its own thread and KV state, exchanging three
 * times per layer and once per chunk of output rows through memory, give
 * the single process's logits bit for bit (memcmp) on rank 0, for a
 * chunked prefill with every position's logits, for decode steps after it,
 * and for two sequences in one batch; rank 1 writes no logits. After it,
 * both ranks' states continue a prefill in one call that again equals the
 * single process. Models: the converted oracle model and the demo-layout
 * random model (K-quant and IQ2_XXS experts, hash layers). The single
 * process runs with other chunk sizes than the ranks. */
#include "check.h"
#include "backends/backend.h"
#include "format/gguf.h"
#include "models/dsv4/forward_cpu.h"
#include "models/dsv4/kv.h"
#include "models/dsv4/model.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CTX = 96, N_PROMPT = 40, N_DECODE = 4 };

/* One exchange: each rank posts its send buffer, waits for the other's and
 * copies it; a generation count keeps consecutive exchanges apart. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const float *buf[2];
    size_t n[2];
    int posted, taken;
    unsigned gen;
    int exchanges;
    bool size_mismatch;
} rendezvous;

typedef struct {
    rendezvous *rv;
    int rank;
} rank_ud;

static void exchange(void *ud, int layer, const float *send, size_t n_send, float *recv, size_t n_recv) {
    (void)layer;
    rank_ud *u = ud;
    rendezvous *r = u->rv;
    pthread_mutex_lock(&r->mu);
    while (r->posted == 2) pthread_cond_wait(&r->cv, &r->mu);   /* the previous exchange is being read */
    const unsigned gen = r->gen;
    r->buf[u->rank] = send;
    r->n[u->rank] = n_send;
    r->posted++;
    pthread_cond_broadcast(&r->cv);
    while (r->posted < 2 && r->gen == gen) pthread_cond_wait(&r->cv, &r->mu);
    if (r->n[1 - u->rank] != n_recv) r->size_mismatch = true;
    else memcpy(recv, r->buf[1 - u->rank], n_recv * sizeof(float));
    if (++r->taken == 2) {
        r->posted = r->taken = 0;
        r->gen++;
        r->exchanges++;
        pthread_cond_broadcast(&r->cv);
    } else {
        /* the other rank still reads our buffer: wait until it did */
        while (r->gen == gen) pthread_cond_wait(&r->cv, &r->mu);
    }
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
    const bool nm = ds4_cpu_numerics_supported(c);
    ds4_backend *single = ds4_cpu_backend_new(m, threads, 64, nm, err, sizeof err);
    ds4_backend *r0 = ds4_cpu_backend_new(m, threads, 64, nm, err, sizeof err);
    ds4_backend *r1 = ds4_cpu_backend_new(m, threads, 64, nm, err, sizeof err);
    CHECK(single && r0 && r1, "backends: %s", err);
    rendezvous rv = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, {0}, 0, 0, 0, 0, false};
    rank_ud u0 = {&rv, 0}, u1 = {&rv, 1};
    const int mid = c->n_expert / 2;
    if (r0 && r1)
        CHECK(ds4_cpu_backend_split(r0, &(ds4_cpu_split){0, mid, exchange, &u0}) &&
                  ds4_cpu_backend_split(r1, &(ds4_cpu_split){1, mid, exchange, &u1}), "split: out of memory");
    const int V = c->n_vocab, N = N_PROMPT + N_DECODE;
    int32_t toks[2][N_PROMPT + N_DECODE];
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < N; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            toks[s][i] = (int32_t)((r >> 33) % (uint64_t)V);
        }
    float *want = calloc((size_t)2 * N * V, sizeof(float)), *got0 = calloc((size_t)2 * N * V, sizeof(float)),
          *got1 = calloc((size_t)2 * N * V, sizeof(float));
    ds4_kv *kw[2], *k0[2], *k1[2];
    for (int s = 0; s < 2; s++) {
        kw[s] = ds4_kv_new(c, CTX, 16);
        k0[s] = ds4_kv_new(c, CTX, 16);
        k1[s] = ds4_kv_new(c, CTX, 16);
    }
    bool ok = single && r0 && r1 && want && got0 && got1;
    /* reference: sequence 0 alone, the prompt in one call, then decode; sequence 1 the same */
    for (int s = 0; ok && s < 2; s++) {
        float *w = want + (size_t)s * N * V;
        ds4_backend_seq sq = {.kv = kw[s], .toks = toks[s], .n = N_PROMPT, .logits = w, .all_logits = true};
        ok = !single->eval(single, &sq, 1, err, sizeof err);
        for (int i = N_PROMPT; ok && i < N; i++) {
            sq = (ds4_backend_seq){.kv = kw[s], .toks = &toks[s][i], .n = 1, .logits = w + (size_t)i * V};
            ok = !single->eval(single, &sq, 1, err, sizeof err);
        }
    }
    CHECK(ok, "%s: single process: %s", path, err);
    /* the ranks: both sequences in one batch, the prompt in chunks of 16, then decode steps of both */
    for (int p = 0; ok && p < N_PROMPT; p += 16) {
        const int n = N_PROMPT - p < 16 ? N_PROMPT - p : 16;
        ds4_backend_seq s0[2], s1[2];
        for (int s = 0; s < 2; s++) {
            s0[s] = (ds4_backend_seq){.kv = k0[s], .toks = &toks[s][p], .n = n,
                                      .logits = got0 + ((size_t)s * N + p) * V, .all_logits = true};
            s1[s] = (ds4_backend_seq){.kv = k1[s], .toks = &toks[s][p], .n = n, .all_logits = true};
        }
        ok = !eval_both(r0, s0, r1, s1, 2);
    }
    for (int i = N_PROMPT; ok && i < N; i++) {
        ds4_backend_seq s0[2], s1[2];
        for (int s = 0; s < 2; s++) {
            s0[s] = (ds4_backend_seq){.kv = k0[s], .toks = &toks[s][i], .n = 1, .logits = got0 + ((size_t)s * N + i) * V};
            s1[s] = (ds4_backend_seq){.kv = k1[s], .toks = &toks[s][i], .n = 1};
        }
        ok = !eval_both(r0, s0, r1, s1, 2);
    }
    CHECK(ok && !rv.size_mismatch, "%s: split eval failed (or the ranks disagree on the slot count)", path);
    if (ok) {
        /* 3 prefill calls and N_DECODE decode calls, each with three
         * exchanges per layer (heads split: the models have 2 output groups) */
        /* plus the head's: one per sequence of 16 rows in a prefill call,
         * one for both decode rows */
        CHECK(ds4_cpu_split_heads(c) && rv.exchanges == (3 + N_DECODE) * 3 * c->n_layer + 3 * 2 + N_DECODE,
              "%s: %d exchanges", path, rv.exchanges);
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
    ds4_backend_seq sw = {.kv = kw[0], .toks = more, .n = 24, .logits = lw, .all_logits = true};
    ok = ok && lg && lw && !single->eval(single, &sw, 1, err, sizeof err);
    ds4_backend_seq s0 = {.kv = k0[0], .toks = more, .n = 24, .logits = lg, .all_logits = true};
    ds4_backend_seq s1 = {.kv = k1[0], .toks = more, .n = 24, .all_logits = true};
    ok = ok && !eval_both(r0, &s0, r1, &s1, 1);
    CHECK(ok, "%s: a further call: %s", path, err);
    if (ok) CHECK(!memcmp(lw, lg, (size_t)24 * V * sizeof(float)), "%s: the further call's logits differ", path);
    free(lw);
    free(lg);
    for (int s = 0; s < 2; s++) { ds4_kv_free(kw[s]); ds4_kv_free(k0[s]); ds4_kv_free(k1[s]); }
    free(want); free(got0); free(got1);
    ds4_backend *all_be[] = {single, r0, r1};
    for (size_t i = 0; i < sizeof all_be / sizeof *all_be; i++)
        if (all_be[i]) all_be[i]->free(all_be[i]);
    ds4_model_free(m);
    ds4_gguf_close(g);
}

int main(void) {
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char path[512];
    snprintf(path, sizeof path, "%s/ds4tiny/A-f32.gguf", build);
    int ran = 0;
    if (access(path, R_OK) == 0) { check_model(path, 1); check_model(path, 2); ran++; }
    if (access("models/demo.gguf", R_OK) == 0) { check_model("models/demo.gguf", 2); ran++; }
    if (!ran) return check_skipped("test_tp_split", "no oracle or demo model (make test data)");
    return check_done("test_tp_split");
}
