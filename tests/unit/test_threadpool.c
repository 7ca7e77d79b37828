/* test_threadpool.c -- every task of every run executes exactly once, on a
 * valid thread index, with 1..4 threads, across many back-to-back runs (the
 * spin path), runs separated by sleeps (the condition-variable path) and a
 * run with more tasks than one published batch holds. */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"

#include "base/threadpool.h"

#define MAX_TASKS 1000

struct counts {
    atomic_int hits[MAX_TASKS];
    atomic_int bad_thread;
    atomic_int bad_ntasks;
    int n_threads;
    int expect_tasks;
    long long per_thread[8];
};

static void count_task(void *ctx, int task, int n_tasks, int thread) {
    struct counts *c = ctx;
    atomic_fetch_add(&c->hits[task], 1);
    if (thread < 0 || thread >= c->n_threads) atomic_fetch_add(&c->bad_thread, 1);
    if (n_tasks != c->expect_tasks) atomic_fetch_add(&c->bad_ntasks, 1);
    c->per_thread[thread] += task; /* safe: one thread owns its slot */
}

enum { BIG = 70001 };
struct big {
    atomic_int hits[BIG];
    atomic_int bad_ntasks;
};

static void big_task(void *ctx, int task, int n_tasks, int thread) {
    struct big *b = ctx;
    atomic_fetch_add(&b->hits[task], 1);
    if (n_tasks != BIG) atomic_fetch_add(&b->bad_ntasks, 1);
}

static int run_and_check(ds4_pool *pool, struct counts *c, int n_tasks) {
    memset(c->hits, 0, sizeof(c->hits));
    memset(c->per_thread, 0, sizeof(c->per_thread));
    c->expect_tasks = n_tasks;
    ds4_pool_run(pool, count_task, c, n_tasks);
    int ok = 1;
    for (int t = 0; t < n_tasks; t++) ok &= atomic_load(&c->hits[t]) == 1;
    for (int t = n_tasks; t < MAX_TASKS; t++) ok &= atomic_load(&c->hits[t]) == 0;
    long long s = 0;
    for (int i = 0; i < 8; i++) s += c->per_thread[i];
    ok &= s == (long long)n_tasks * (n_tasks - 1) / 2;
    return ok;
}

int main(void) {
    static struct counts c;
    int task_counts[] = {1, 2, 3, 4, 5, 7, 64, 999, MAX_TASKS};
    int n_cases = (int)(sizeof(task_counts) / sizeof(task_counts[0]));

    for (int nt = 1; nt <= 4; nt++) {
        ds4_pool *pool = ds4_pool_new(nt);
        CHECK(pool != NULL, "pool of %d", nt);
        if (!pool) continue;
        CHECK(ds4_pool_threads(pool) == nt, "threads %d", ds4_pool_threads(pool));
        c.n_threads = nt;
        atomic_store(&c.bad_thread, 0);
        atomic_store(&c.bad_ntasks, 0);
        int bad_runs = 0;
        for (int rep = 0; rep < 300; rep++)
            bad_runs += !run_and_check(pool, &c, task_counts[rep % n_cases]);
        CHECK(bad_runs == 0, "%d threads: %d back-to-back runs lost or repeated tasks", nt, bad_runs);
        for (int rep = 0; rep < 5; rep++) {
            usleep(20000); /* long enough for workers to go to sleep */
            bad_runs += !run_and_check(pool, &c, task_counts[rep % n_cases]);
        }
        CHECK(bad_runs == 0, "%d threads: runs after sleeping lost or repeated tasks", nt);
        CHECK(atomic_load(&c.bad_thread) == 0, "%d threads: thread index out of range", nt);
        CHECK(atomic_load(&c.bad_ntasks) == 0, "%d threads: wrong n_tasks passed", nt);
        ds4_pool_run(pool, count_task, &c, 0); /* no tasks: returns at once */
        ds4_pool_free(pool);
    }

    /* more than 65535 tasks: each index once, n_tasks passed unchanged */
    {
        static struct big big;
        ds4_pool *pool = ds4_pool_new(3);
        ds4_pool_run(pool, big_task, &big, BIG);
        int bad = 0;
        for (int t = 0; t < BIG; t++) bad += atomic_load(&big.hits[t]) != 1;
        CHECK(bad == 0 && atomic_load(&big.bad_ntasks) == 0, "big run: %d tasks not run exactly once", bad);
        ds4_pool_free(pool);
    }

    /* NULL pool runs inline on thread 0 */
    c.n_threads = 1;
    CHECK(run_and_check(NULL, &c, 17), "NULL pool");
    CHECK(ds4_pool_threads(NULL) == 1, "NULL pool has one thread");

    /* default size: physical cores, at most the CPUs we may run on */
    cpu_set_t set;
    CHECK(sched_getaffinity(0, sizeof set, &set) == 0, "affinity");
    int cores = ds4_physical_cores();
    CHECK(cores >= 1 && cores <= CPU_COUNT(&set), "physical cores %d, CPUs %d", cores, CPU_COUNT(&set));
    ds4_pool *def = ds4_pool_new(0);
    CHECK(def && ds4_pool_threads(def) == cores, "default pool");
    if (def && ds4_pool_threads(def) <= 8) {
        c.n_threads = ds4_pool_threads(def);
        CHECK(run_and_check(def, &c, 100), "default pool run");
    }
    ds4_pool_free(def);
    ds4_pool_free(NULL);
    return check_done("test_threadpool");
}
