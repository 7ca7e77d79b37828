/* test_threadpool.c -- every task of every run executes exactly once, on a
 * valid thread index, with 1..4 threads, across many back-to-back runs (the
 * spin path), runs separated by sleeps (the condition-variable path) and a
 * run with more tasks than one published batch holds. Then --cpu-affinity:
 * each thread of a pool runs pinned to its CPU of the list, in order
 * (thread 0 the creating thread, wrapping round a short list), and a list
 * with a CPU this process may not use, or one twice, is refused and
 * changes nothing. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
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

/* --cpu-affinity: every thread's mask, seen from inside one task per
 * thread (a barrier in the tasks makes each thread take exactly one) */
enum { PIN_THREADS = 3 };
struct pins {
    atomic_int arrived;
    cpu_set_t mask[PIN_THREADS];
    atomic_int bad_thread;
};

static void pin_task(void *ctx, int task, int n_tasks, int thread) {
    struct pins *p = ctx;
    if (thread < 0 || thread >= PIN_THREADS) { atomic_fetch_add(&p->bad_thread, 1); return; }
    pthread_getaffinity_np(pthread_self(), sizeof p->mask[thread], &p->mask[thread]);
    atomic_fetch_add(&p->arrived, 1);
    while (atomic_load(&p->arrived) < n_tasks) sched_yield();
}

/* pool threads' masks against cpus[i % n]; 0 when every thread matches */
static int pinned_mismatches(const int *cpus, int n) {
    static struct pins p;
    memset(&p, 0, sizeof p);
    ds4_pool *pool = ds4_pool_new(PIN_THREADS);
    if (!pool) return -1;
    ds4_pool_run(pool, pin_task, &p, PIN_THREADS);
    ds4_pool_free(pool);
    int bad = atomic_load(&p.bad_thread);
    for (int i = 0; i < PIN_THREADS; i++) {
        cpu_set_t want;
        CPU_ZERO(&want);
        CPU_SET(cpus[i % n], &want);
        bad += !CPU_EQUAL(&want, &p.mask[i]);
    }
    return bad;
}

static void test_affinity(void) {
    cpu_set_t all;
    CHECK(sched_getaffinity(0, sizeof all, &all) == 0, "affinity");
    /* the allowed CPUs, highest first: the order of the list is what counts */
    int cpus[DS4_POOL_MAX_CPUS], n = 0, not_allowed = -1;
    for (int cpu = DS4_POOL_MAX_CPUS - 1; cpu >= 0; cpu--) {
        if (CPU_ISSET(cpu, &all)) cpus[n++] = cpu;
        else if (not_allowed < 0) not_allowed = cpu;
    }
    char err[160];
    CHECK(ds4_pool_set_affinity(cpus, n, err, sizeof err), "the allowed CPUs: %s", err);
    CHECK(pinned_mismatches(cpus, n) == 0, "threads not pinned to their CPUs in list order");
    const int one[1] = {cpus[0]};
    CHECK(ds4_pool_set_affinity(one, 1, err, sizeof err), "one CPU: %s", err);
    CHECK(pinned_mismatches(one, 1) == 0, "a one-CPU list: every thread on it");
    if (not_allowed >= 0) {
        const int bad_list[2] = {cpus[0], not_allowed};
        CHECK(!ds4_pool_set_affinity(bad_list, 2, err, sizeof err) && strstr(err, "may run on"),
              "CPU %d, outside the mask, refused: '%s'", not_allowed, err);
    }
    const int twice[2] = {cpus[0], cpus[0]}, negative[1] = {-1};
    CHECK(!ds4_pool_set_affinity(twice, 2, err, sizeof err) && strstr(err, "twice"), "a CPU twice refused: '%s'", err);
    CHECK(!ds4_pool_set_affinity(negative, 1, err, sizeof err), "CPU -1 refused");
    CHECK(pinned_mismatches(one, 1) == 0, "a refused list changed the pinning");
    CHECK(ds4_pool_set_affinity(NULL, 0, err, sizeof err), "pinning off");
    sched_setaffinity(0, sizeof all, &all); /* thread 0 was pinned: give the test its CPUs back */
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
    test_affinity();
    return check_done("test_threadpool");
}
