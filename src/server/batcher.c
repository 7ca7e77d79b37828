/* batcher.c -- gathers the slot threads' engine work into batched steps. */
#include "batcher.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long pending work waits for busy slots that have not submitted yet. */
#define GRACE_NS 2000000L
/* Most prompt tokens one step prefills, so decoders wait one chunk at most. */
#define PREFILL_ROWS 256

typedef struct submission {
    struct submission *next;
    ds4_session *s;
    const int32_t *toks;
    int n, done;                /* tokens appended so far */
    int taken;                  /* tokens in the running step */
    bool prompt_start;          /* the first slice of a prompt (its wait is logged) */
    long steps_at_arrival;      /* b->n_steps when it was submitted */
    struct timespec arrived;
    bool finished;
    int rc;
    char err[256];
} submission;

struct ds4_batcher {
    ds4_engine *e;
    pthread_mutex_t mu;         /* the fields below */
    pthread_mutex_t engine_mu;  /* the engine itself */
    pthread_cond_t cv;
    submission *head, *tail;
    int n_pending, n_busy;
    bool stepping;
    long n_steps;               /* steps started so far */
    void (*log)(void *ud, bool warning, const char *line);
    void *log_ud;
    ds4_step *steps;            /* [max_batch] */
    submission **in_step;       /* [max_batch] */
};

ds4_batcher *ds4_batcher_new(ds4_engine *e, void (*log)(void *ud, bool warning, const char *line), void *log_ud) {
    ds4_batcher *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    const int rows = ds4_engine_max_batch(e);
    b->e = e;
    b->log = log;
    b->log_ud = log_ud;
    b->steps = calloc((size_t)rows, sizeof *b->steps);
    b->in_step = calloc((size_t)rows, sizeof *b->in_step);
    if (!b->steps || !b->in_step) { ds4_batcher_free(b); return NULL; }
    pthread_mutex_init(&b->mu, NULL);
    pthread_mutex_init(&b->engine_mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    return b;
}

void ds4_batcher_free(ds4_batcher *b) {
    if (!b) return;
    free(b->steps);
    free(b->in_step);
    free(b);
}

void ds4_batcher_busy(ds4_batcher *b, bool busy) {
    pthread_mutex_lock(&b->mu);
    b->n_busy += busy ? 1 : -1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void ds4_batcher_lock(ds4_batcher *b) { pthread_mutex_lock(&b->engine_mu); }
void ds4_batcher_unlock(ds4_batcher *b) { pthread_mutex_unlock(&b->engine_mu); }

static struct timespec deadline_of(struct timespec t) {
    t.tv_nsec += GRACE_NS;
    t.tv_sec += t.tv_nsec / 1000000000L;
    t.tv_nsec %= 1000000000L;
    return t;
}

static bool past(struct timespec t) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return now.tv_sec > t.tv_sec || (now.tv_sec == t.tv_sec && now.tv_nsec >= t.tv_nsec);
}

static void unlink_sub(ds4_batcher *b, submission *x) {
    submission *prev = NULL;
    for (submission *p = b->head; p; prev = p, p = p->next) {
        if (p != x) continue;
        if (prev) prev->next = x->next; else b->head = x->next;
        if (b->tail == x) b->tail = prev;
        return;
    }
}

/* The prefill submission the next step takes: a prompt's first slice when
 * one waits (so a new request starts at the next step even while long
 * prompts are being sliced), else the oldest; NULL when none. */
static submission *next_prefill(const ds4_batcher *b) {
    submission *oldest = NULL;
    for (submission *x = b->head; x; x = x->next) {
        if (x->n - x->done <= 1) continue;
        if (x->prompt_start && x->done == 0) return x;
        if (!oldest) oldest = x;
    }
    return oldest;
}

/* Runs one step over the pending work (b->mu held on entry and exit; released
 * while the engine runs, so new work can queue meanwhile). */
static void run_step(ds4_batcher *b) {
    const int max_rows = ds4_engine_max_batch(b->e);
    int k = 0, rows = 0, decode_rows = 0;
    long decode_waited = 0;     /* steps started after a decode's arrival without it */
    long prefill_waited = 0;    /* the same for a prompt's first slice */
    const submission *prefill = next_prefill(b);
    const long step_no = b->n_steps++;
    for (submission *x = b->head; x && rows < max_rows; x = x->next) {
        const int left = x->n - x->done;
        int take = 1;
        if (left > 1) {
            /* one prompt per step, in bounded slices */
            if (x != prefill) continue;
            take = left < PREFILL_ROWS ? left : PREFILL_ROWS;
            if (take > max_rows - rows) take = max_rows - rows;
            if (x->prompt_start && x->done == 0) prefill_waited = step_no - x->steps_at_arrival;
        }
        x->taken = take;
        if (x->n == 1) {
            decode_rows++;
            if (step_no - x->steps_at_arrival > decode_waited) decode_waited = step_no - x->steps_at_arrival;
        }
        b->steps[k] = (ds4_step){x->s, x->toks + x->done, take};
        b->in_step[k++] = x;
        rows += take;
    }
    b->stepping = true;
    pthread_mutex_unlock(&b->mu);

    char err[256];
    pthread_mutex_lock(&b->engine_mu);
    int rc = ds4_sessions_step(b->e, b->steps, k, err, sizeof err);
    for (int i = 0; i < k; i++) {
        b->in_step[i]->rc = 0;
        /* a refused step changed nothing: find out whose work it was */
        if (rc) b->in_step[i]->rc = ds4_sessions_step(b->e, &b->steps[i], 1, b->in_step[i]->err,
                                                      sizeof b->in_step[i]->err);
    }
    pthread_mutex_unlock(&b->engine_mu);
    if (b->log) {
        char line[192];
        snprintf(line, sizeof line, "batch step %ld: decode rows %d, prefill rows %d, decode waited %ld steps, "
                 "prefill waited %ld steps%s", step_no, decode_rows, rows - decode_rows, decode_waited,
                 prefill_waited, rc ? ", refused" : "");
        b->log(b->log_ud, false, line);
    }

    pthread_mutex_lock(&b->mu);
    for (int i = 0; i < k; i++) {
        submission *x = b->in_step[i];
        if (x->rc == 0) x->done += x->taken;
        if (x->rc || x->done == x->n) {
            unlink_sub(b, x);
            b->n_pending--;
            x->finished = true;
        }
    }
    b->stepping = false;
    pthread_cond_broadcast(&b->cv);
}

int ds4_batcher_eval(ds4_batcher *b, ds4_session *s, const int32_t *toks, int n, bool prompt_start,
                     char *err, size_t errlen) {
    submission me = {.s = s, .toks = toks, .n = n, .prompt_start = prompt_start};
    if (n <= 0) return 0;
    clock_gettime(CLOCK_REALTIME, &me.arrived);
    pthread_mutex_lock(&b->mu);
    if (b->tail) b->tail->next = &me; else b->head = &me;
    b->tail = &me;
    me.steps_at_arrival = b->n_steps;
    b->n_pending++;
    pthread_cond_broadcast(&b->cv);
    while (!me.finished) {
        const struct timespec deadline = b->head ? deadline_of(b->head->arrived) : me.arrived;
        if (!b->stepping && b->head && (b->n_pending >= b->n_busy || past(deadline))) {
            run_step(b);
            continue;
        }
        if (b->stepping || !b->head) pthread_cond_wait(&b->cv, &b->mu);
        else pthread_cond_timedwait(&b->cv, &b->mu, &deadline);
    }
    pthread_mutex_unlock(&b->mu);
    if (me.rc) snprintf(err, errlen, "%s", me.err);
    return me.rc;
}
