/* queue.h -- the requests waiting for the inference worker, and the hand-off
 * between a connection thread and the worker that runs its job.
 *
 * Contract
 * - A connection thread calls ds4_queue_submit() with a decoded job; it
 *   returns once the job is done: run by the worker, or dropped because its
 *   client disconnected while it waited (it never runs then), or refused
 *   (false) because the server is stopping.
 * - While a streamed job waits, its connection thread sends queued
 *   keep-alives every 5 s (job.h), so a long queue does not trip client idle
 *   timers; the worker is never held up for more than one such write (it
 *   waits for `writing` to clear before it starts the job).
 * - The worker takes jobs in FIFO order with ds4_queue_take() (NULL once
 *   stopping and empty; *stopping tells it to refuse what is left) and
 *   reports each one with ds4_queue_finish().
 * - This is the only place that knows how waiting requests are ordered: a
 *   scheduler with several slots replaces take/finish, nothing else.
 */
#ifndef DS4_QUEUE_H
#define DS4_QUEUE_H

#include <pthread.h>
#include <stdbool.h>

typedef struct job job;
typedef struct server server;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    bool stopping;
} ds4_job_queue;

void ds4_queue_init(ds4_job_queue *q);
bool ds4_queue_submit(server *s, job *j);
job *ds4_queue_take(server *s, bool *stopping);
void ds4_queue_finish(server *s, job *j);
/* Refuse new jobs and wake the worker. */
void ds4_queue_stop(server *s);

#endif
