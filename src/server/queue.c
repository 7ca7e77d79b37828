#include "server/queue.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/job.h"
#include "server/route_key.h"
#include "server/server_state.h"

#define KEEPALIVE_SECONDS 5.0
/* How often a connection thread whose request is queued checks that its
 * client is still there. */
#define QUEUE_POLL_MS 250

/* Bytes of a slot's last route key kept for matching: enough to tell
 * conversations apart, bounded whatever the prompts weigh. */
#define KEY_KEPT (64 * 1024)

bool ds4_queue_init(ds4_job_queue *q, int n_slots) {
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->head = q->tail = NULL;
    q->stopping = false;
    q->n_slots = n_slots;
    q->clock = 0;
    q->slots = calloc((size_t)n_slots, sizeof *q->slots);
    return q->slots != NULL;
}

/* What the slot's session starts with that j's prompt starts with too. */
static size_t shared(const ds4_queue_slot *sl, const job *j) {
    return ds4_route_shared(sl->key, sl->key_len, j->route_key, j->route_key_len);
}

static bool holds_id(const ds4_queue_slot *sl, const char *id) {
    for (int i = 0; i < sl->n_live_ids; i++)
        if (!strcmp(sl->live_ids[i], id)) return true;
    return false;
}

/* The idle slot that should run j (q->mu held), or -1 (none yet). */
static int best_slot(const ds4_job_queue *q, const job *j) {
    if (j->req.n_live_ids) {
        for (int k = 0; k < q->n_slots; k++)
            if (holds_id(&q->slots[k], j->req.live_ids[0])) return q->slots[k].idle ? k : -1;
        /* A slot publishes its ids when its job finishes, which can be after
         * the client has read the answer and sent this continuation: a slot
         * still busy with a job taken before this one was queued may be about
         * to name them, so wait for those (never for later jobs: bounded). */
        for (int k = 0; k < q->n_slots; k++)
            if (!q->slots[k].idle && q->slots[k].last_used <= j->submitted_at) return -1;
    }
    int best = -1;
    size_t best_len = 0;
    for (int k = 0; k < q->n_slots; k++) {
        const ds4_queue_slot *sl = &q->slots[k];
        if (!sl->idle) continue;
        size_t len = shared(sl, j);
        if (best < 0 || len > best_len || (len == best_len && sl->last_used < q->slots[best].last_used)) {
            best = k;
            best_len = len;
        }
    }
    for (int k = 0; best >= 0 && k < q->n_slots; k++) {
        const ds4_queue_slot *sl = &q->slots[k];
        if (!sl->answered) continue;
        /* at least half its prompt: a continuation, not just a shared tool list */
        const size_t len = shared(sl, j);
        if (len > best_len && 2 * len >= sl->key_weight) return -1;
    }
    return best;
}

/* Slot k remembers the start of the prompt it now serves. */
static void slot_took(ds4_job_queue *q, int k, const job *j) {
    ds4_queue_slot *sl = &q->slots[k];
    size_t keep = j->route_key_len < KEY_KEPT ? j->route_key_len : KEY_KEPT;
    char *copy = keep ? malloc(keep) : NULL;
    free(sl->key);
    sl->key = copy;
    sl->key_len = copy ? keep : 0;   /* out of memory only costs the match */
    if (copy) memcpy(copy, j->route_key, keep);
    sl->key_weight = ds4_route_shared(sl->key, sl->key_len, sl->key, sl->key_len);
    sl->last_used = ++q->clock;
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
    ds4_job_queue *q = s->queue;
    double next_ping = ds4_srv_now() + KEEPALIVE_SECONDS;
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
        if (!gone && j->req.stream && ds4_srv_now() >= next_ping) {
            next_ping = ds4_srv_now() + KEEPALIVE_SECONDS;
            ds4_job_queued_keepalive(s, j);
            gone = j->conn->broken;
        }
        pthread_mutex_lock(&q->mu);
        j->writing = false;
        /* Wake the others only when they have something to see: a worker
         * that took j meanwhile waits for this write to end, and a job
         * leaving the queue may change its head. Waking them every time
         * made each waiting connection thread wake all the others, which
         * woke it again: with 8 requests queued that storm took about half
         * of two cores from the running slots. */
        bool wake = j->running;
        if (gone && !j->running) {
            unlink_job(q, j);
            j->keep_alive = false;
            j->done = true;
            wake = true;
            ds4_srv_trace(s, "queued request left the queue: client went away");
        }
        if (wake) pthread_cond_broadcast(&q->cv);
    }
}

bool ds4_queue_submit(server *s, job *j) {
    ds4_job_queue *q = s->queue;
    ds4_buf key = {0};
    ds4_route_key(&j->req, &key);   /* out of memory only costs the match */
    j->route_key = key.oom ? NULL : key.data;
    j->route_key_len = key.oom ? 0 : key.len;
    pthread_mutex_lock(&q->mu);
    if (q->stopping) {
        pthread_mutex_unlock(&q->mu);
        ds4_buf_free(&key);
        return false;
    }
    j->submitted_at = q->clock;
    j->queued_at = ds4_srv_now();
    if (q->tail) q->tail->next = j; else q->head = j;
    q->tail = j;
    pthread_cond_broadcast(&q->cv);
    wait_queued(s, j);
    while (!j->done) pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
    j->route_key = NULL;
    ds4_buf_free(&key);
    return true;
}

job *ds4_queue_take(server *s, bool *stopping) {
    ds4_job_queue *q = s->queue;
    pthread_mutex_lock(&q->mu);
    q->slots[s->slot].idle = true;
    q->slots[s->slot].answered = false;
    pthread_cond_broadcast(&q->cv);
    /* when stopping, any slot refuses what is left */
    while (!q->stopping && !(q->head && best_slot(q, q->head) == s->slot)) pthread_cond_wait(&q->cv, &q->mu);
    q->slots[s->slot].idle = false;
    job *j = q->head;
    if (j) {
        q->head = j->next;
        if (!q->head) q->tail = NULL;
        j->running = true;
        j->started_at = ds4_srv_now();
        slot_took(q, s->slot, j);
        pthread_cond_broadcast(&q->cv);   /* the next job may suit another idle slot */
        while (j->writing) pthread_cond_wait(&q->cv, &q->mu);
    }
    *stopping = q->stopping;
    pthread_mutex_unlock(&q->mu);
    return j;
}

void ds4_queue_answered(server *s) {
    ds4_job_queue *q = s->queue;
    pthread_mutex_lock(&q->mu);
    q->slots[s->slot].answered = true;
    pthread_mutex_unlock(&q->mu);
}

void ds4_queue_finish(server *s, job *j) {
    ds4_job_queue *q = s->queue;
    pthread_mutex_lock(&q->mu);
    ds4_queue_slot *sl = &q->slots[s->slot];
    if (s->n_live_ids > sl->cap_live_ids) {
        void *grown = realloc(sl->live_ids, (size_t)s->n_live_ids * sizeof sl->live_ids[0]);
        if (grown) { sl->live_ids = grown; sl->cap_live_ids = s->n_live_ids; }
    }
    /* out of memory only loses the routing: the continuation then gets the usual 400 */
    sl->n_live_ids = s->n_live_ids <= sl->cap_live_ids ? s->n_live_ids : 0;
    if (sl->n_live_ids) memcpy(sl->live_ids, s->live_ids, (size_t)sl->n_live_ids * sizeof sl->live_ids[0]);
    j->done = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void ds4_queue_slots(server *s, int *n_slots, int *busy, int *queued) {
    ds4_job_queue *q = s->queue;
    pthread_mutex_lock(&q->mu);
    *n_slots = q->n_slots;
    *busy = *queued = 0;
    for (int k = 0; k < q->n_slots; k++) *busy += !q->slots[k].idle;
    for (const job *j = q->head; j; j = j->next) ++*queued;
    pthread_mutex_unlock(&q->mu);
}

void ds4_queue_publish_session(server *s, int n_tokens, size_t state_bytes) {
    ds4_job_queue *q = s->queue;
    pthread_mutex_lock(&q->mu);
    q->slots[s->slot].kv_tokens = n_tokens;
    q->slots[s->slot].kv_state_bytes = state_bytes;
    pthread_mutex_unlock(&q->mu);
}

void ds4_queue_sessions_held(server *s, uint64_t *tokens, uint64_t *state_bytes) {
    ds4_job_queue *q = s->queue;
    *tokens = *state_bytes = 0;
    pthread_mutex_lock(&q->mu);
    for (int k = 0; k < q->n_slots; k++) {
        *tokens += (uint64_t)q->slots[k].kv_tokens;
        *state_bytes += q->slots[k].kv_state_bytes;
    }
    pthread_mutex_unlock(&q->mu);
}

void ds4_queue_stop(server *s) {
    ds4_job_queue *q = s->queue;
    pthread_mutex_lock(&q->mu);
    q->stopping = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
