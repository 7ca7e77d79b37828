/* threadpool.h -- one small persistent pool of worker threads.
 *
 * Contract
 * - ds4_pool_run(pool, fn, ctx, n_tasks) calls fn(ctx, task, n_tasks, thread)
 *   for every task in [0, n_tasks) across the pool's threads (the caller's
 *   thread participates) and returns when all are done. No allocation per
 *   call; workers spin briefly, then sleep on a condition variable.
 * - A NULL pool or a pool of 1 thread runs everything inline.
 * - Not reentrant: fn must not call ds4_pool_run on the same pool.
 * - ds4_pool_run_ranges(pool, n, fn, ctx) calls fn(ctx, first, end) over
 *   [0, n) cut into one contiguous range per thread (one inline range for a
 *   NULL pool): for row-wise work between matrix products, where each item
 *   is computed as it would be inline, so results do not depend on the
 *   thread count.
 * - ds4_pool_set_affinity(cpus, n) (--cpu-affinity) pins every pool made
 *   after it: thread i to CPU cpus[i % n], where thread 0 is the thread
 *   that calls ds4_pool_new (it runs tasks too) and is pinned there; threads
 *   it starts later inherit that one CPU. Set once, before any pool.
 */
#ifndef DS4_THREADPOOL_H
#define DS4_THREADPOOL_H

#include <stdbool.h>
#include <stddef.h>

typedef void (*ds4_pool_fn)(void *ctx, int task, int n_tasks, int thread);
typedef struct ds4_pool ds4_pool;

/* Physical cores this process may run on (its affinity mask; SMT siblings
 * count once); the CPU count when the topology is not readable. */
int ds4_physical_cores(void);
ds4_pool *ds4_pool_new(int n_threads);   /* n_threads <= 0: ds4_physical_cores() */
/* n CPUs (n <= DS4_POOL_MAX_CPUS, each listed once) that this process may
 * run on (its affinity mask), else false with one line in err and nothing
 * changed; n = 0 turns pinning off. */
#define DS4_POOL_MAX_CPUS 1024
bool ds4_pool_set_affinity(const int *cpus, int n, char *err, size_t errlen);
void ds4_pool_free(ds4_pool *p);
int ds4_pool_threads(const ds4_pool *p);
void ds4_pool_run(ds4_pool *p, ds4_pool_fn fn, void *ctx, int n_tasks);
typedef void (*ds4_range_fn)(void *ctx, int first, int end);
void ds4_pool_run_ranges(ds4_pool *p, int n, ds4_range_fn fn, void *ctx);

#endif
