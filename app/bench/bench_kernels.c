/* bench_kernels.c -- memory bandwidth, matvec and matmul throughput.
 *
 * The bandwidth table is measured the way STREAM does: every thread reads
 * its share of one array with the widest vector loads the kernels
 * themselves use (ds4_read_sum), and copies and triads its share of three
 * arrays; the memory is several times the last-level cache (sysconf's L3
 * size, 4x, at least 512 MiB), and the best of REPS runs counts. Copy and
 * triad check the read loop: one the compiler or the CPU handled badly (a
 * read loop that ran at a fifth of copy on an AVX2 EPYC once made Q8_0 read
 * "413%" of bandwidth) shows as a read below them.
 * A kernel's percentage is of the same read loop over its weight bytes, run
 * after each of its matvec runs (best of REPS too): a weight stream cannot
 * go faster than plain memory traffic, and a VM's bandwidth can move within
 * minutes (a 2-core Zen 4 VM gave two threads 36 and 64 GB/s in turn), so
 * one denominator measured before the kernels let a kernel timed in a
 * faster spell show 120-130%, or one timed in a slower spell too little.
 *
 * The array is anonymous memory in 2 MiB pages (MADV_HUGEPAGE), and the
 * weights reuse it. Read speed depends on the page size behind it: on the
 * VM this was written on, a read from 4 KiB pages ran at 5-11 GB/s at 1
 * thread depending on which physical pages it got, from 2 MiB pages 12.5-13,
 * and the engine maps its weights in 2 MiB pages where the kernel allows
 * (mempages.h), so a 4 KiB-page denominator would be below what decode
 * itself reads. The table says what share of the array the kernel gave in
 * huge pages (smaps' AnonHugePages) and how long its first touch took, which
 * can be seconds when the kernel must compact memory to find 2 MiB pages.
 *
 * Weight matrices are a few distinct properly quantized rows tiled over as
 * many bytes as the read array: the values do not change the work per byte,
 * and tiling keeps set-up fast (the IQ2_XXS quantizer takes tens of ms per
 * row). Being far beyond the LLC, every pass streams from DRAM like decode
 * does over real weights.
 */
#include "bench_kernels.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kernels/kernels_cpu.h"
#include "base/mempages.h"
#include "kernels/quant.h"
#include "base/threadpool.h"

#define MIN_BIG_BYTES ((size_t)512 << 20)
#define MAX_BIG_BYTES ((size_t)2 << 30)
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

/* With b (not NULL), b runs after every run of `run` (run, b, run, b, ...),
 * so both see the same spells of a machine whose speed moves; b's best wall
 * time goes to *b_wall. */
static struct timing time_best_with(void (*run)(void *), void *ctx, int threads, void (*b)(void *), void *b_ctx,
                                    double *b_wall) {
    struct timing best = {1e30, false};
    for (int r = 0; r < REPS; r++) {
        double c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), t0 = clock_s(CLOCK_MONOTONIC);
        run(ctx);
        double dt = clock_s(CLOCK_MONOTONIC) - t0, cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (dt < best.wall) best = (struct timing){dt, cpu < 0.9 * threads * dt};
        if (!b) continue;
        t0 = clock_s(CLOCK_MONOTONIC);
        b(b_ctx);
        dt = clock_s(CLOCK_MONOTONIC) - t0;
        if (r == 0 || dt < *b_wall) *b_wall = dt;
    }
    return best;
}

static struct timing time_best(void (*run)(void *), void *ctx, int threads) {
    return time_best_with(run, ctx, threads, NULL, NULL, NULL);
}

/* ---- STREAM-like bandwidth ---- */

enum stream_op { OP_READ, OP_COPY, OP_TRIAD };

struct stream_ctx {
    enum stream_op op;
    float *a, *b, *c;
    int64_t n;          /* elements per array; the read pass reads all 3n of a */
    uint32_t sums[64]; /* per thread, so the read loop cannot be optimised away */
};

static void stream_task(void *p, int task, int n_tasks, int thread) {
    struct stream_ctx *s = p;
    int64_t i0 = s->n * task / n_tasks, i1 = s->n * (task + 1) / n_tasks;
    switch (s->op) {
    case OP_READ: s->sums[thread & 63] += ds4_read_sum(s->a + i0, i1 - i0); break;
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
    static const int bytes_per[] = {12, 8, 12};
    s->op = op;
    int64_t n = s->n;
    if (op == OP_READ) s->n = 3 * n;
    struct stream_run r = {pool, s};
    struct timing t = time_best(stream_run, &r, ds4_pool_threads(pool));
    s->n = n;
    *gbs = (double)bytes_per[op] * (double)n / t.wall / 1e9;
    return t;
}

/* Several times the last-level cache, so no pass is served from it. */
static size_t big_array_bytes(void) {
    long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t want = llc > 0 ? 4 * (size_t)llc : MIN_BIG_BYTES;
    if (want < MIN_BIG_BYTES) want = MIN_BIG_BYTES;
    if (want > MAX_BIG_BYTES) want = MAX_BIG_BYTES;
    return want & ~(((size_t)2 << 20) - 1);
}

/* The big array, touched once (the page faults and zeroing are paid here,
 * not in the timed passes); NULL when it cannot be mapped. */
static float *huge_array(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* a hint: without THP the array is in 4 KiB pages, which the table says */
    (void)madvise(p, bytes, MADV_HUGEPAGE);
    float *a = p;
    for (size_t i = 0; i < bytes / sizeof(float); i++) a[i] = (float)(i & 1023);
    return a;
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
            ds4_isa_cap_name(ds4_kernels_isa()));

    /* bandwidth: one allocation, first the three STREAM arrays, then the weights */
    size_t big_bytes = big_array_bytes();
    const double touch0 = clock_s(CLOCK_MONOTONIC);
    float *big = huge_array(big_bytes);
    const double touch_s = clock_s(CLOCK_MONOTONIC) - touch0;
    float *Y = malloc(big_bytes / 16); /* one float per row of any type at BENCH_N (>= 64 bytes a row) */
    uint8_t *acts = ds4_kernels_alloc(ds4_act_bytes(DS4_TYPE_F32, BENCH_N) * MM_T);
    float *x = malloc(sizeof(float) * BENCH_N);
    if (!big || !Y || !acts || !x) {
        fprintf(stderr, "ds4-bench: out of memory for the kernel benchmark (%zu MiB)\n", big_bytes >> 20);
        if (big) munmap(big, big_bytes);
        free(Y); free(acts); free(x);
        ds4_pool_free(pool);
        return -1;
    }
    struct stream_ctx s = {.n = (int64_t)(big_bytes / sizeof(float) / 3)};
    s.a = big;
    s.b = big + s.n;
    s.c = big + 2 * s.n;
    ds4_mem_sizes pages;
    char why[160];
    if (ds4_mem_range_sizes(big, big_bytes, &pages, why, sizeof why))
        snprintf(why, sizeof why, "%.0f%% in 2 MiB pages (AnonHugePages)",
                 pages.rss_kb ? 100.0 * (double)pages.anon_huge_kb / (double)pages.rss_kb : 0.0);
    fprintf(out, "array memory: %zu MiB, %s, first touch %.1f s\n", big_bytes >> 20, why, touch_s);

    bool any_starved = false;
    fprintf(out, "memory bandwidth (GB/s, best of %d; read: one %zu MiB array, %s loads; copy/triad:\n"
                 "%zu MiB arrays; STREAM byte counts)\n", REPS, big_bytes >> 20,
            ds4_kernels_level() >= DS4_SIMD_AVX512 ? "64-byte" : ds4_kernels_level() >= DS4_SIMD_AVX2 ? "32-byte" : "scalar",
            big_bytes / 3 >> 20);
    fprintf(out, "  %-8s %10s %10s %10s\n", "threads", "read", "copy", "triad");
    for (int c = 0; c < ncol; c++) {
        fprintf(out, "  %-8d", nth[c]);
        for (int op = OP_READ; op <= OP_TRIAD; op++) {
            double gbs;
            bool starved = stream_gbs(pools[c], &s, (enum stream_op)op, &gbs).starved;
            any_starved |= starved;
            fprintf(out, " %9.1f%c", gbs, starved ? '*' : ' ');
        }
        fprintf(out, "\n");
    }
    fprintf(out, "  (%%bw below: of the read of the weight bytes run after each of that row's matvec runs)\n\n");
    uint8_t *W = (uint8_t *)big;
    const size_t weight_bytes = big_bytes;

    fprintf(out, "matvec, n=%d, ~%zu MiB of weights, best of %d (GB/s of weight bytes); L2 1t: %zu KiB of\n"
                 "weights, so the kernel's compute ceiling; matmul: %d rows x T=%d tokens\n",
            BENCH_N, weight_bytes >> 20, REPS, L2_BYTES >> 10, MM_ROWS, MM_T);
    fprintf(out, "  %-8s %5s  %9s", "type", "bpw", "L2 1t");
    for (int c = 0; c < ncol; c++) fprintf(out, "  %3dt GB/s   read    %%bw", nth[c]);
    fprintf(out, "  matmul %dt GFLOP/s\n", threads);
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        uint32_t type = types[ti];
        size_t rb = ds4_type_row_bytes(type, BENCH_N), ab = ds4_act_bytes(type, BENCH_N);
        int64_t rows = (int64_t)(weight_bytes / rb);
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
            struct stream_ctx weights_read = {.op = OP_READ, .a = big, .n = (int64_t)(weight_bytes / sizeof(float))};
            struct stream_run rr = {pools[c], &weights_read};
            double read_wall;
            struct timing t = time_best_with(mm_run, &r, nth[c], stream_run, &rr, &read_wall);
            double gbs = (double)(rb * (size_t)rows) / t.wall / 1e9, read_gbs = (double)weight_bytes / read_wall / 1e9;
            any_starved |= t.starved;
            fprintf(out, "  %9.1f%c %6.1f %4.0f%%", gbs, t.starved ? '*' : ' ', read_gbs, 100.0 * gbs / read_gbs);
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
    munmap(big, big_bytes);
    free(Y); free(acts); free(x);
    ds4_pool_free(pool);
    return 0;
}
