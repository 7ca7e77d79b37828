/* threadpool.c -- persistent workers claiming tasks from one atomic word.
 *
 * A run is published as a single 64-bit word: generation (32 bits), task
 * count (16) and next unclaimed task (16). Everyone, the caller included,
 * claims tasks by compare-and-swap on that word, and a claim only succeeds
 * while the word still carries the generation the claimer woke up for.
 * Hence the caller waits for *finished tasks*, never for workers to check
 * in: on an oversubscribed machine a descheduled worker simply takes no
 * task, and a worker waking up late can never run a task of a newer run
 * with a stale function.
 *
 * Workers spin on the word for a short while after each run because
 * matvecs during decode arrive back to back and a futex wake costs more than
 * a small matvec; then they sleep on a condition variable so an idle engine
 * burns no CPU. Sleeping uses the Dekker pattern on two seq_cst atomics
 * (`sleepers` and the word), so the caller takes the mutex only when
 * somebody actually sleeps.
 */
#include "base/threadpool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* ~50-100 us of pause instructions: covers the gap between consecutive
 * matvecs of one decode step without holding a core for long when idle. */
#define SPIN_ITERS 4096
#define MAX_BATCH 0xFFFF /* tasks per published word; larger runs go in batches */

struct ds4_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t work; /* gen << 32 | n_tasks << 16 | next */
    uint32_t gen;          /* last published generation; caller only */
    atomic_int sleepers;
    atomic_int done;       /* tasks of the current run that finished */
    _Atomic(ds4_pool_fn) fn;
    _Atomic(void *) ctx;
    atomic_bool stop;
};

static inline uint32_t word_gen(uint64_t w) { return (uint32_t)(w >> 32); }

/* claims and runs tasks of generation g until none is left */
static void run_tasks(ds4_pool *p, uint32_t g, int thread) {
    uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
    for (;;) {
        unsigned n = (unsigned)(w >> 16) & 0xFFFF, t = (unsigned)w & 0xFFFF;
        if (word_gen(w) != g || t >= n) return;
        if (atomic_compare_exchange_weak_explicit(&p->work, &w, w + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            /* the run cannot finish before this task does, so fn/ctx are its own */
            ds4_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
            fn(atomic_load_explicit(&p->ctx, memory_order_relaxed), (int)t, (int)n, thread);
            atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
            w = atomic_load_explicit(&p->work, memory_order_acquire);
        }
    }
}

static uint32_t wait_new_gen(ds4_pool *p, uint32_t seen) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        uint32_t g = word_gen(atomic_load_explicit(&p->work, memory_order_acquire));
        if (g != seen) return g;
        _mm_pause();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    uint32_t g;
    while ((g = word_gen(atomic_load(&p->work))) == seen) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

struct worker_arg {
    ds4_pool *pool;
    int index;
};

/* --cpu-affinity: written once before any pool, read by ds4_pool_new */
static int affinity_cpus[DS4_POOL_MAX_CPUS];
static int affinity_n;

bool ds4_pool_set_affinity(const int *cpus, int n, char *err, size_t errlen) {
    cpu_set_t allowed;
    if (n < 0 || n > DS4_POOL_MAX_CPUS || n > CPU_SETSIZE) {
        snprintf(err, errlen, "%d CPUs: at most %d", n, DS4_POOL_MAX_CPUS);
        return false;
    }
    if (n > 0 && sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        snprintf(err, errlen, "cannot read this process's CPU affinity mask");
        return false;
    }
    for (int i = 0; i < n; i++) {
        if (cpus[i] < 0 || cpus[i] >= CPU_SETSIZE || !CPU_ISSET(cpus[i], &allowed)) {
            snprintf(err, errlen, "CPU %d is not one this process may run on (%d CPUs allowed)", cpus[i],
                     CPU_COUNT(&allowed));
            return false;
        }
        for (int j = 0; j < i; j++)
            if (cpus[j] == cpus[i]) {
                snprintf(err, errlen, "CPU %d is listed twice", cpus[i]);
                return false;
            }
    }
    for (int i = 0; i < n; i++) affinity_cpus[i] = cpus[i];
    affinity_n = n;
    return true;
}

/* pins the calling thread as thread i of a pool under --cpu-affinity. The
 * CPUs were checked against this process's mask when set; one taken away
 * since (cgroups, taskset) makes this fail, and the thread runs where the
 * mask lets it. */
static void pin_thread(int i) {
    if (affinity_n == 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(affinity_cpus[i % affinity_n], &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *worker_main(void *arg) {
    struct worker_arg wa = *(struct worker_arg *)arg;
    free(arg);
    ds4_pool *p = wa.pool;
    pin_thread(wa.index);
    uint32_t seen = 0;
    for (;;) {
        seen = wait_new_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        run_tasks(p, seen, wa.index);
    }
    return NULL;
}

static void publish(ds4_pool *p, unsigned n_tasks) {
    p->gen++;
    atomic_store(&p->work, (uint64_t)p->gen << 32 | (uint64_t)n_tasks << 16);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* topology/<name> of one CPU as an integer, -1 if unreadable */
static long cpu_topology(int cpu, const char *name) {
    char path[128];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, name);
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

int ds4_physical_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (int)n : 1;
    }
    /* distinct (package, core) pairs among the CPUs we may run on; SMT
     * siblings share one core's load ports and bandwidth, so a second
     * thread per core only adds synchronisation to a streaming matvec */
    long seen[CPU_SETSIZE][2];
    int n_cores = 0, n_cpus = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        n_cpus++;
        long pkg = cpu_topology(cpu, "physical_package_id"), core = cpu_topology(cpu, "core_id");
        if (pkg < 0 || core < 0) return CPU_COUNT(&set); /* no topology: count CPUs */
        bool dup = false;
        for (int i = 0; i < n_cores && !dup; i++) dup = seen[i][0] == pkg && seen[i][1] == core;
        if (!dup) {
            seen[n_cores][0] = pkg;
            seen[n_cores][1] = core;
            n_cores++;
        }
    }
    return n_cores > 0 ? n_cores : n_cpus > 0 ? n_cpus : 1;
}

ds4_pool *ds4_pool_new(int n_threads) {
    if (n_threads <= 0) n_threads = ds4_physical_cores();
    ds4_pool *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) { p->n_threads = 1; ds4_pool_free(p); return NULL; }
    }
    pin_thread(0);
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (wa) { wa->pool = p; wa->index = i; }
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i; /* the free below joins the ones that started */
            ds4_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void ds4_pool_free(ds4_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, true);
    publish(p, 0);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int ds4_pool_threads(const ds4_pool *p) { return p ? p->n_threads : 1; }

static void run_batch(ds4_pool *p, ds4_pool_fn fn, void *ctx, int n_tasks) {
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    publish(p, (unsigned)n_tasks);
    run_tasks(p, p->gen, 0);
    /* only tasks claimed by other threads are still running; yielding after
     * a while lets a descheduled one finish instead of spinning against it */
    for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++) {
        if (i < SPIN_ITERS) _mm_pause();
        else sched_yield();
    }
}

/* tasks beyond one word's 16-bit count: batches that keep the global index */
struct big_run {
    ds4_pool_fn fn;
    void *ctx;
    int base, total;
};

static void big_task(void *c, int task, int n_tasks, int thread) {
    struct big_run *b = c;
    b->fn(b->ctx, b->base + task, b->total, thread);
}

void ds4_pool_run(ds4_pool *p, ds4_pool_fn fn, void *ctx, int n_tasks) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, n_tasks, 0);
        return;
    }
    if (n_tasks <= MAX_BATCH) {
        run_batch(p, fn, ctx, n_tasks);
        return;
    }
    struct big_run b = {fn, ctx, 0, n_tasks};
    for (; b.base < n_tasks; b.base += MAX_BATCH)
        run_batch(p, big_task, &b, n_tasks - b.base < MAX_BATCH ? n_tasks - b.base : MAX_BATCH);
}

typedef struct { ds4_range_fn fn; void *ctx; int n; } range_ctx;

static void range_task(void *ctx, int task, int n_tasks, int thread) {
    (void)thread;
    const range_ctx *r = ctx;
    r->fn(r->ctx, (int)((int64_t)r->n * task / n_tasks), (int)((int64_t)r->n * (task + 1) / n_tasks));
}

void ds4_pool_run_ranges(ds4_pool *p, int n, ds4_range_fn fn, void *ctx) {
    range_ctx r = {fn, ctx, n};
    const int threads = ds4_pool_threads(p);
    ds4_pool_run(p, range_task, &r, n < threads ? n : threads);
}
