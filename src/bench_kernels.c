/* bench_kernels.c -- memory bandwidth, matvec and matmul throughput.
 *
 * Weight matrices are a few distinct properly quantized rows tiled over
 * ~128 MB: the values do not change the work per byte, and tiling keeps
 * set-up fast (the IQ2_XXS quantizer takes tens of ms per row). 128 MB is
 * several times any last-level cache this runs on, so every pass streams
 * from DRAM like decode does over real weights.
 */
#include "bench_kernels.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels_cpu.h"
#include "quant.h"
#include "threadpool.h"

#define STREAM_FLOATS ((int64_t)1 << 25) /* 128 MiB per array */
#define WEIGHT_BYTES ((size_t)128 << 20)
#define BENCH_N 4096                     /* DS4's hidden size: typical row length */
#define DISTINCT_ROWS 8
#define REPS 10
#define L2_BYTES ((size_t)256 << 10) /* fits the L2 of any x86 core of the last decade */
#define MM_T 32
#define MM_ROWS 2048

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best (shortest) of REPS runs. On a shared machine the process may not get
 * the cores it asked for; the best run's CPU time tells whether it did, and
 * `starved` flags results that are then only lower bounds. */
struct timing {
    double wall;
    bool starved;
};

static struct timing time_best(void (*run)(void *), void *ctx, int threads) {
    struct timing best = {1e30, false};
    for (int r = 0; r < REPS; r++) {
        double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), t0 = clock_s(CLOCK_MONOTONIC);
        run(ctx);
        double dt = clock_s(CLOCK_MONOTONIC) - t0, cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (dt < best.wall) best = (struct timing){dt, cpu < 0.9 * threads * dt};
    }
    return best;
}

/* ---- STREAM-like bandwidth ---- */

enum stream_op { OP_READ, OP_COPY, OP_TRIAD };

struct stream_ctx {
    enum stream_op op;
    float *a, *b, *c;
    int64_t n;
    float sums[64]; /* per thread, so the read loop cannot be optimised away */
};

static void stream_task(void *p, int task, int n_tasks, int thread) {
    struct stream_ctx *s = p;
    int64_t i0 = s->n * task / n_tasks, i1 = s->n * (task + 1) / n_tasks;
    switch (s->op) {
    case OP_READ: {
        /* two independent vector chains keep the adds off the critical path */
        typedef float v4 __attribute__((vector_size(16)));
        v4 acc0 = {0}, acc1 = {0};
        for (int64_t i = i0; i + 8 <= i1; i += 8) {
            v4 p, q;
            memcpy(&p, s->a + i, sizeof(p));
            memcpy(&q, s->a + i + 4, sizeof(q));
            acc0 += p;
            acc1 += q;
        }
        acc0 += acc1;
        s->sums[thread & 63] += acc0[0] + acc0[1] + acc0[2] + acc0[3];
        break;
    }
    case OP_COPY: memcpy(s->c + i0, s->a + i0, (size_t)(i1 - i0) * sizeof(float)); break;
    case OP_TRIAD:
        for (int64_t i = i0; i < i1; i++) s->a[i] = s->b[i] + 3.0f * s->c[i];
        break;
    }
}

struct stream_run {
    ds4_pool *pool;
    struct stream_ctx *s;
};

static void stream_run(void *p) {
    struct stream_run *r = p;
    ds4_pool_run(r->pool, stream_task, r->s, 64);
}

/* bytes moved per element, STREAM's convention (no write-allocate traffic) */
static struct timing stream_gbs(ds4_pool *pool, struct stream_ctx *s, enum stream_op op, double *gbs) {
    static const int bytes_per[] = {4, 8, 12};
    s->op = op;
    struct stream_run r = {pool, s};
    struct timing t = time_best(stream_run, &r, ds4_pool_threads(pool));
    *gbs = (double)bytes_per[op] * (double)s->n / t.wall / 1e9;
    return t;
}

/* ---- matvec / matmul ---- */

static int fill_weights(uint32_t type, uint8_t *W, int64_t rows, int64_t n) {
    size_t rb = ds4_type_row_bytes(type, (uint64_t)n);
    float *x = malloc(sizeof(float) * (size_t)n), *imp = malloc(sizeof(float) * (size_t)n);
    if (!x || !imp) { free(x); free(imp); return -1; }
    uint32_t seed = 12345u;
    for (int64_t i = 0; i < n; i++) imp[i] = 1.0f;
    for (int r = 0; r < DISTINCT_ROWS && r < rows; r++) {
        for (int64_t i = 0; i < n; i++) {
            seed = seed * 1664525u + 1013904223u;
            x[i] = (float)(int32_t)seed / 2147483648.0f;
        }
        ds4_quantize_row(type, x, W + rb * (size_t)r, n, imp);
    }
    for (int64_t r = DISTINCT_ROWS; r < rows; r++) memcpy(W + rb * (size_t)r, W + rb * (size_t)(r % DISTINCT_ROWS), rb);
    free(x);
    free(imp);
    return 0;
}

struct mm_run {
    ds4_pool *pool;
    uint32_t type;
    const uint8_t *W;
    int64_t rows, T;
    const void *acts;
    float *Y;
};

static void mm_run(void *p) {
    struct mm_run *r = p;
    if (r->T == 1) ds4_matvec(r->pool, r->type, r->W, r->rows, BENCH_N, r->acts, r->Y);
    else ds4_matmul(r->pool, r->type, r->W, r->rows, BENCH_N, r->acts, r->T, r->Y);
}

static void cpu_model(char *buf, size_t len) {
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        char *colon = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && colon) {
            colon += colon[1] == ' ' ? 2 : 1;
            colon[strcspn(colon, "\n")] = 0;
            snprintf(buf, len, "%s", colon);
            break;
        }
    }
    fclose(f);
}

int ds4_bench_kernels(int threads, FILE *out) {
    static const uint32_t types[] = {DS4_TYPE_F32, DS4_TYPE_F16,  DS4_TYPE_BF16, DS4_TYPE_Q8_0,   DS4_TYPE_Q6_K,
                                     DS4_TYPE_Q5_K, DS4_TYPE_Q4_K, DS4_TYPE_Q2_K, DS4_TYPE_IQ2_XXS};
    if (threads < 1) threads = 1;
    ds4_pool *pool = threads > 1 ? ds4_pool_new(threads) : NULL;
    if (threads > 1 && !pool) { fprintf(stderr, "ds4-bench: cannot start %d threads\n", threads); return -1; }
    ds4_pool *pools[2] = {NULL, pool};
    int nth[2] = {1, threads};
    int ncol = threads > 1 ? 2 : 1;

    char model[256];
    cpu_model(model, sizeof(model));
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&now));
    fprintf(out, "ds4-bench --kernels  %s\ncpu: %s, kernels: %s\n\n", date, model,
            ds4_simd_level_name(ds4_kernels_level()));

    /* bandwidth */
    struct stream_ctx s = {.n = STREAM_FLOATS};
    s.a = malloc(sizeof(float) * (size_t)s.n);
    s.b = malloc(sizeof(float) * (size_t)s.n);
    s.c = malloc(sizeof(float) * (size_t)s.n);
    uint8_t *W = malloc(WEIGHT_BYTES);
    float *Y = malloc(sizeof(float) * (size_t)(WEIGHT_BYTES / 64)); /* >= rows of any type at BENCH_N */
    uint8_t *acts = malloc(ds4_act_bytes(DS4_TYPE_F32, BENCH_N) * MM_T);
    float *x = malloc(sizeof(float) * BENCH_N);
    if (!s.a || !s.b || !s.c || !W || !Y || !acts || !x) {
        fprintf(stderr, "ds4-bench: out of memory for the kernel benchmark\n");
        free(s.a); free(s.b); free(s.c); free(W); free(Y); free(acts); free(x);
        ds4_pool_free(pool);
        return -1;
    }
    for (int64_t i = 0; i < s.n; i++) s.a[i] = s.b[i] = s.c[i] = (float)(i & 1023);

    double bw[2] = {0, 0};
    bool any_starved = false;
    fprintf(out, "memory bandwidth (GB/s, %lld MiB arrays, best of %d)\n", (long long)(STREAM_FLOATS * 4 >> 20),
            REPS);
    fprintf(out, "  %-8s %10s %10s %10s\n", "threads", "read", "copy", "triad");
    for (int c = 0; c < ncol; c++) {
        fprintf(out, "  %-8d", nth[c]);
        for (int op = OP_READ; op <= OP_TRIAD; op++) {
            double gbs;
            bool starved = stream_gbs(pools[c], &s, (enum stream_op)op, &gbs).starved;
            any_starved |= starved;
            if (gbs > bw[c]) bw[c] = gbs;
            fprintf(out, " %9.1f%c", gbs, starved ? '*' : ' ');
        }
        fprintf(out, "\n");
    }
    free(s.a); free(s.b); free(s.c);
    fprintf(out, "  (%%bw below: of the best of read/copy/triad at the same thread count)\n\n");

    fprintf(out, "matvec, n=%d, ~%zu MiB of weights, best of %d (GB/s of weight bytes); L2 1t: %zu KiB of\n"
                 "weights, so the kernel's compute ceiling; matmul: %d rows x T=%d tokens\n",
            BENCH_N, WEIGHT_BYTES >> 20, REPS, L2_BYTES >> 10, MM_ROWS, MM_T);
    fprintf(out, "  %-8s %5s  %9s", "type", "bpw", "L2 1t");
    for (int c = 0; c < ncol; c++) fprintf(out, "  %3dt GB/s    %%bw", nth[c]);
    fprintf(out, "  matmul %dt GFLOP/s\n", threads);
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        uint32_t type = types[ti];
        size_t rb = ds4_type_row_bytes(type, BENCH_N), ab = ds4_act_bytes(type, BENCH_N);
        int64_t rows = (int64_t)(WEIGHT_BYTES / rb);
        if (fill_weights(type, W, rows, BENCH_N)) { fprintf(stderr, "ds4-bench: out of memory\n"); break; }
        for (int t = 0; t < MM_T; t++) {
            for (int i = 0; i < BENCH_N; i++) x[i] = (float)((i * 37 + t * 11) % 201 - 100) / 100.0f;
            ds4_quantize_act(type, x, acts + ab * (size_t)t, BENCH_N);
        }
        fprintf(out, "  %-8s %5.2f", ds4_type_name(type), 8.0 * (double)rb / BENCH_N);
        /* compute ceiling: the same kernel on a matrix that stays in L2 */
        struct mm_run rc = {NULL, type, W, (int64_t)(L2_BYTES / rb), 1, acts, Y};
        struct timing tc = time_best(mm_run, &rc, 1);
        any_starved |= tc.starved;
        fprintf(out, "  %8.1f%c", (double)(rb * (size_t)rc.rows) / tc.wall / 1e9, tc.starved ? '*' : ' ');
        for (int c = 0; c < ncol; c++) {
            struct mm_run r = {pools[c], type, W, rows, 1, acts, Y};
            struct timing t = time_best(mm_run, &r, nth[c]);
            double gbs = (double)(rb * (size_t)rows) / t.wall / 1e9;
            any_starved |= t.starved;
            fprintf(out, "  %9.1f%c %4.0f%%", gbs, t.starved ? '*' : ' ', 100.0 * gbs / bw[c]);
        }
        struct mm_run r = {pool, type, W, MM_ROWS, MM_T, acts, Y};
        struct timing t = time_best(mm_run, &r, threads);
        any_starved |= t.starved;
        fprintf(out, "  %16.1f%c\n", 2.0 * MM_ROWS * BENCH_N * MM_T / t.wall / 1e9, t.starved ? '*' : ' ');
        fflush(out);
    }
    if (any_starved)
        fprintf(out, "* the process got under 90%% of the cores it asked for during its best run (busy machine):\n"
                     "  that number is a lower bound.\n");
    free(W); free(Y); free(acts); free(x);
    ds4_pool_free(pool);
    return 0;
}
