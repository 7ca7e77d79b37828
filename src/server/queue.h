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
 * - Slot workers take jobs in FIFO order with ds4_queue_take() (NULL once
 *   stopping and empty; *stopping tells it to refuse what is left) and
 *   report each one with ds4_queue_finish(). A job answering a live
 *   tool-call turn by id goes to the slot that produced those ids (waiting
 *   for it when it is busy: no other slot could serve it); while no slot
 *   holds them yet it also waits for the slots busy with jobs taken before
 *   it was queued, since ids are published only when a job finishes, after
 *   its client may already have read them. Any other head job goes to the
 *   idle slot whose previous request's prompt shares the most with its
 *   prompt, in whole rendered sections (route_key.h: tool list, messages;
 *   a conversation's next turn contains the previous request, and that
 *   slot holds its KV); when none shares anything (an unrelated request:
 *   only its template's first tokens would match), or on a tie, to the
 *   least recently used idle slot, so an unrelated request never evicts a
 *   conversation while a slot that is older or unused is free. A busy slot
 *   whose job has already answered its client (ds4_queue_answered: only
 *   bookkeeping is left) counts as about to be idle: when its prompt shares
 *   more than every idle slot's, and at least half of that slot's own
 *   prompt (a continuation, not just the same tool list), the job waits for
 *   it, because a client that has read an answer sends the next turn at
 *   once, often before that worker is back in take(). The wait is bounded
 *   (the job is over) and never for a slot still generating.
 *   That choice affects only speed: every slot's prefix planner finds what
 *   its session can reuse.
 * - This is the only place that knows how waiting requests are ordered.
 */
#ifndef DS4_QUEUE_H
#define DS4_QUEUE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct job job;
typedef struct server server;

typedef struct {
    bool idle;                  /* waiting in ds4_queue_take */
    bool answered;              /* busy, but its job's answer is complete */
    char *key;                  /* the start of its last request's route key (route_key.h) */
    size_t key_len, key_weight; /* and that kept key's own weight (ds4_route_shared of itself) */
    unsigned long last_used;
    char (*live_ids)[40];       /* copy of the slot's live tool-call ids at its last finish */
    int n_live_ids, cap_live_ids;
    int kv_tokens;              /* tokens its session holds, as its worker last published, */
    size_t kv_state_bytes;      /* and the bytes of state they fill (its payload size) */
} ds4_queue_slot;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    bool stopping;
    int n_slots;
    ds4_queue_slot *slots;
    unsigned long clock;
} ds4_job_queue;

/* false: out of memory */
bool ds4_queue_init(ds4_job_queue *q, int n_slots);
bool ds4_queue_submit(server *s, job *j);
job *ds4_queue_take(server *s, bool *stopping);
/* The running job's answer is complete and about to be written; from here
 * on its slot's session changes only by that worker's bookkeeping. */
void ds4_queue_answered(server *s);
void ds4_queue_finish(server *s, job *j);
/* Slots, how many of them are running a job, and jobs waiting (/health, /metrics). */
void ds4_queue_slots(server *s, int *n_slots, int *busy, int *queued);
/* The calling worker's session now holds n_tokens filling state_bytes
 * (after every change to it: evaluation, rewind, disk restore), for /metrics. */
void ds4_queue_publish_session(server *s, int n_tokens, size_t state_bytes);
/* The slots' published token counts and state bytes, summed. */
void ds4_queue_sessions_held(server *s, uint64_t *tokens, uint64_t *state_bytes);
/* Refuse new jobs and wake the worker. */
void ds4_queue_stop(server *s);

#endif
