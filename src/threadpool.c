/* threadpool.c -- persistent workers woken by a generation counter.
 *
 * A run publishes (fn, ctx, n_tasks), bumps `gen`, and everyone (the caller
 * included) claims tasks from an atomic counter, so uneven tasks balance
 * themselves. Workers spin on `gen` for a short while after each run because
 * matvecs during decode arrive back to back and a futex wake costs more than
 * a small matvec; after the spin they sleep on a condition variable so an
 * idle engine does not burn CPU. The sleep uses the Dekker pattern on two
 * seq_cst atomics (`sleepers` and `gen`) so the caller only takes the mutex
 * when somebody actually sleeps.
 */
#include "threadpool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

/* ~50-100 us of pause instructions: covers the gap between consecutive
 * matvecs of one decode step without holding a core for long when idle. */
#define SPIN_ITERS 4096

struct ds4_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;
    atomic_int sleepers;
    atomic_int next_task;
    atomic_int pending; /* workers that have not finished the current run */
    atomic_bool stop;
    ds4_pool_fn fn;
    void *ctx;
    int n_tasks;
};

struct worker_arg {
    ds4_pool *pool;
    int index;
};

static void do_tasks(ds4_pool *p, int thread) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, p->n_tasks, thread);
    }
}

static unsigned wait_new_gen(ds4_pool *p, unsigned seen) {
    for (int i = 0; i < SPIN_ITERS; i++) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen) return g;
        _mm_pause();
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->sleepers, 1);
    unsigned g;
    while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleepers, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *arg) {
    struct worker_arg wa = *(struct worker_arg *)arg;
    free(arg);
    ds4_pool *p = wa.pool;
    unsigned seen = 0;
    for (;;) {
        seen = wait_new_gen(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        do_tasks(p, wa.index);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

static void publish(ds4_pool *p) {
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

ds4_pool *ds4_pool_new(int n_threads) {
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    ds4_pool *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) { ds4_pool_free(p); return NULL; }
    }
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
    publish(p);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int ds4_pool_threads(const ds4_pool *p) { return p ? p->n_threads : 1; }

void ds4_pool_run(ds4_pool *p, ds4_pool_fn fn, void *ctx, int n_tasks) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t, n_tasks, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
    publish(p);
    do_tasks(p, 0);
    /* On an oversubscribed machine a worker may be descheduled mid-task;
     * yielding after a while lets it finish instead of spinning against it. */
    for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
        if (i < SPIN_ITERS) _mm_pause();
        else sched_yield();
    }
}
