#include "queue.h"

#include <time.h>

#include "job.h"
#include "server_state.h"

#define KEEPALIVE_SECONDS 5.0
/* How often a connection thread whose request is queued checks that its
 * client is still there. */
#define QUEUE_POLL_MS 250

void ds4_queue_init(ds4_job_queue *q) {
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->head = q->tail = NULL;
    q->stopping = false;
}

static void unlink_job(ds4_job_queue *q, job *j) {
    job *prev = NULL;
    for (job *p = q->head; p; prev = p, p = p->next) {
        if (p != j) continue;
        if (prev) prev->next = j->next; else q->head = j->next;
        if (q->tail == j) q->tail = prev;
        return;
    }
}

/* Waits (q->mu held) until the worker takes j or its client leaves. */
static void wait_queued(server *s, job *j) {
    ds4_job_queue *q = &s->queue;
    double next_ping = now_s() + KEEPALIVE_SECONDS;
    while (!j->running && !j->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += QUEUE_POLL_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&q->cv, &q->mu, &ts);
        if (j->running || j->done) break;
        j->writing = true;
        pthread_mutex_unlock(&q->mu);
        bool gone = ds4_http_peer_gone(j->conn);
        if (!gone && j->req.stream && now_s() >= next_ping) {
            next_ping = now_s() + KEEPALIVE_SECONDS;
            job_queued_keepalive(s, j);
            gone = j->conn->broken;
        }
        pthread_mutex_lock(&q->mu);
        j->writing = false;
        pthread_cond_broadcast(&q->cv);
        if (gone && !j->running) {
            unlink_job(q, j);
            j->keep_alive = false;
            j->done = true;
            trace(s, "queued request left the queue: client went away");
        }
    }
}

bool ds4_queue_submit(server *s, job *j) {
    ds4_job_queue *q = &s->queue;
    pthread_mutex_lock(&q->mu);
    if (q->stopping) {
        pthread_mutex_unlock(&q->mu);
        return false;
    }
    if (q->tail) q->tail->next = j; else q->head = j;
    q->tail = j;
    pthread_cond_broadcast(&q->cv);
    wait_queued(s, j);
    while (!j->done) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
    return true;
}

job *ds4_queue_take(server *s, bool *stopping) {
    ds4_job_queue *q = &s->queue;
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->stopping) pthread_cond_wait(&q->cv, &q->mu);
    job *j = q->head;
    if (j) {
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        j->running = true;
        while (j->writing) pthread_cond_wait(&q->cv, &q->mu);
    }
    *stopping = q->stopping;
    pthread_mutex_unlock(&q->mu);
    return j;
}

void ds4_queue_finish(server *s, job *j) {
    ds4_job_queue *q = &s->queue;
    pthread_mutex_lock(&q->mu);
    j->done = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void ds4_queue_stop(server *s) {
    ds4_job_queue *q = &s->queue;
    pthread_mutex_lock(&q->mu);
    q->stopping = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
