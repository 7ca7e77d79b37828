/* batcher.c -- gathers the slot threads' engine work into batched steps. */
#include "server/batcher.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long pending work waits for busy slots that have not submitted yet,
 * counted from when they could have (the end of the last step, or the
 * work's arrival if later): GRACE_NS, or 1/GRACE_STEP_SHARE of the last step
 * when that is longer. Counted from arrival instead, the work submitted
 * during a step would start the next step alone the moment it ends, before
 * the slots of the ending step have turned their tokens into text, and the
 * slots would split into two groups stepping in turn, each step half full.
 * A slot that misses a step waits a whole step for the next one, so on a
 * busy machine, where a thread may need milliseconds to be scheduled again,
 * waiting a small share of a long step keeps the rows together; a slot busy
 * with something else (a stalled client, a disk save) holds the others back
 * by that share at most. */
#define GRACE_NS 2000000L
#define GRACE_STEP_SHARE 8
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
    long last_step_ns;          /* how long the last step's engine call took */
    struct timespec last_step_end;  /* CLOCK_REALTIME, as the condition waits use */
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

static bool later(struct timespec a, struct timespec b) {
    return a.tv_sec > b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

/* When pending work that arrived at `arrived` stops waiting for the others. */
static struct timespec deadline_of(const ds4_batcher *b, struct timespec arrived) {
    struct timespec t = later(b->last_step_end, arrived) ? b->last_step_end : arrived;
    const long share = b->last_step_ns / GRACE_STEP_SHARE;
    t.tv_nsec += share > GRACE_NS ? share : GRACE_NS;
    t.tv_sec += t.tv_nsec / 1000000000L;
    t.tv_nsec %= 1000000000L;
    return t;
}

static bool past(struct timespec t) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return !later(t, now);
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

/* What one step takes, gathered under b->mu. */
typedef struct {
    long step_no;
    int k, rows, decode_rows, max_rows;
    int prefill_budget;         /* prompt rows still allowed in this step */
    long decode_waited;         /* steps started after a decode's arrival without it */
    long prefill_waited;        /* the same for a prompt's first slice */
} step_plan;

/* Puts x's next tokens into the step when they fit: a decode token always,
 * prompt tokens as far as the step's prefill budget allows. */
static void take(ds4_batcher *b, step_plan *p, submission *x) {
    const int left = x->n - x->done;
    const long waited = p->step_no - x->steps_at_arrival;
    int n = 1;
    if (left > 1) {
        n = left < p->prefill_budget ? left : p->prefill_budget;
        if (n > p->max_rows - p->rows) n = p->max_rows - p->rows;
        if (n <= 0) return;
        p->prefill_budget -= n;
        if (x->prompt_start && x->done == 0 && waited > p->prefill_waited) p->prefill_waited = waited;
    } else if (x->n == 1) {
        p->decode_rows++;
        if (waited > p->decode_waited) p->decode_waited = waited;
    }
    x->taken = n;
    b->steps[p->k] = (ds4_step){x->s, x->toks + x->done, n};
    b->in_step[p->k++] = x;
    p->rows += n;
}

/* Runs one step over the pending work (b->mu held on entry and exit; released
 * while the engine runs, so new work can queue meanwhile). Every pending
 * decode token goes in, then prompt slices up to PREFILL_ROWS rows in all:
 * prompts' first slices first (a new request starts at the next step even
 * while long prompts are being sliced, and a burst of short prompts shares
 * one pass over the weights), then the later slices of long prompts, each
 * group oldest first. */
static void run_step(ds4_batcher *b) {
    step_plan p = {.step_no = b->n_steps++, .max_rows = ds4_engine_max_batch(b->e), .prefill_budget = PREFILL_ROWS};
    for (int pass = 0; pass < 2; pass++)
        for (submission *x = b->head; x && p.rows < p.max_rows; x = x->next) {
            const bool first_pass = x->n - x->done <= 1 || x->prompt_start;
            if (first_pass == (pass == 0)) take(b, &p, x);
        }
    const int k = p.k;
    b->stepping = true;
    pthread_mutex_unlock(&b->mu);

    char err[256];
    pthread_mutex_lock(&b->engine_mu);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = ds4_sessions_step(b->e, b->steps, k, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
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
                 "prefill waited %ld steps%s", p.step_no, p.decode_rows, p.rows - p.decode_rows,
                 p.decode_waited, p.prefill_waited, rc ? ", refused" : "");
        b->log(b->log_ud, false, line);
    }

    pthread_mutex_lock(&b->mu);
    b->last_step_ns = (t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec);
    clock_gettime(CLOCK_REALTIME, &b->last_step_end);
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
        const struct timespec deadline = b->head ? deadline_of(b, b->head->arrived) : me.arrived;
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
