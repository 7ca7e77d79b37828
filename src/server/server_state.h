/* server_state.h -- the state ds4-server's modules share: one slot's live
 * session with its prefix-reuse memory, the job a connection hands to a
 * slot's worker, and the trace log.
 *
 * Contract
 * - A `server` is one slot's view of the process: its own session and
 *   live-turn memory ("slot only": touched only by that slot's worker thread
 *   and the endpoint runners it calls, so no lock), plus pointers to what
 *   every slot shares (engine, tokenizer, tool memory, queue, trace, disk
 *   cache). Shared objects are thread-safe (tokenizer, toolmem), have their
 *   own lock (queue.h, the trace, the disk cache: kvd_mu), or go through the
 *   batcher (the engine, when there are several slots).
 * - A `job` lives on its connection thread's stack from submission until the
 *   worker marks it done; until the worker takes it (running), only the
 *   connection thread writes to its socket.
 * - ds4_srv_stop is set by the signal handler and read by every thread.
 * - ds4_srv_trace()/ds4_srv_trace_text() append to --trace (no-ops without it); ds4_srv_kv_log()
 *   is the disk cache's log sink.
 */
#ifndef DS4_SERVER_STATE_H
#define DS4_SERVER_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "engine/engine.h"
#include "server/http.h"
#include "base/json_util.h"
#include "base/turn_script.h"
#include "kvdisk/kvdisk.h"
#include "server/queue.h"
#include "server/request.h"
#include "server/server.h"
#include "engine/spec.h"
#include "server/stream.h"
#include "text/tokenizer.h"
#include "text/toolmem.h"

#define DS4_SRV_REPLACED_PROMPTS 4

/* Tool calls of one live turn that a continuation may answer by id alone. */

typedef struct server {
    ds4_server_opts o;
    ds4_engine *eng;
    const ds4_tokenizer *tok;
    ds4_session *sess;
    ds4_toolmem *mem;
    ds4_kvdisk *kvd;              /* disk KV cache, or NULL */
    int n_vocab;
    size_t max_token_bytes;       /* the longest token's text: prompt bytes / this <= tokens */
    const ds4_turn_script *script; /* --scripted-output answers (test only), shared by the slots */
    atomic_long *script_turn;     /* generations so far on every slot: which answer comes next */
    FILE *trace;
    pthread_mutex_t *trace_mu;
    pthread_mutex_t *kvd_mu;      /* the disk cache is single-threaded */
    ds4_job_queue *queue;
    struct ds4_batcher *batcher;  /* several slots: the engine's only user; NULL with one */
    ds4_spec *spec;               /* --spec-lookup's drafter (one slot only), or NULL */

    /* this slot */
    int slot;

    /* Live tool-call turn (slot only): ids the model produced last. */
    char (*live_ids)[40];         /* every call id of the live turn */
    int n_live_ids;
    int live_ids_tokens;          /* session length the binding belongs to */
    /* What clients replay for the last thinking turn when its reasoning is
     * hidden or dropped: the prompt with an empty or no think block, then
     * content and tool block (slot only). */
    ds4_buf visible[2];
    int visible_tokens;
    /* how many of the live tokens the last request's prompt filled (the
     * rest were generated): a later request that differs before this point
     * rewrote text the client had sent before (job.c: branch checkpoint) */
    int live_prompt_tokens;
    /* the prompts of the last conversations another one replaced in this
     * slot, newest first: a prompt's prefill saves a checkpoint where it
     * parts from one of them (job.c: branch checkpoint) */
    ds4_token_ids replaced[DS4_SRV_REPLACED_PROMPTS];
    /* the running job is steered: its KV state is not the disk cache's to
     * save or reuse (ds4_srv_kvd; cache files do not record scales) */
    bool steered;
} server;

struct job {
    job *next;
    ds4_http_conn *conn;
    ds4_http_req *hreq;
    const char *route_key;        /* its prompt's start (route_key.h, slot choice: queue.h) */
    size_t route_key_len;
    ds4_request req;
    ds4_enc *enc;                 /* chat family, made on first use */
    bool keep_alive;              /* set by the worker */
    bool running, writing, done;  /* queue.h */
    unsigned long submitted_at;   /* the queue clock when it was queued (queue.h) */
    double queued_at, started_at; /* ds4_srv_now() when it was queued and when a slot took it */
};

extern atomic_int ds4_srv_stop;

double ds4_srv_now(void);
__attribute__((format(printf, 2, 3)))
void ds4_srv_trace(server *s, const char *fmt, ...);
void ds4_srv_trace_text(server *s, const char *label, const char *text, size_t n);
void ds4_srv_kv_log(void *ud, bool warning, const char *line);

/* The engine calls a slot makes, through the batcher when there is one.
 * Every change to the slot's session goes through these (or is followed by
 * ds4_srv_session_changed), which publish its token count for /metrics. */
void ds4_srv_session_changed(server *s);
int ds4_srv_eval(server *s, const int32_t *toks, int n, bool prompt_start, char *err, size_t errlen);
int ds4_srv_rewind(server *s, int n_tokens, char *err, size_t errlen);
int ds4_srv_prefill_rows(server *s, const int32_t *toks, int n, float *rows, char *err, size_t errlen);
/* A job's steering (request.h dir_steering, else the server's scales) on
 * the slot's session: a live state computed with other scales is dropped
 * first (its KV would not match). 0, or 400 with err when the request names
 * a file the server was not started with. */
int ds4_srv_steer(server *s, const ds4_request *r, char *err, size_t errlen);
/* Before another conversation may replace the live session: keeps the prompt
 * it was given (its first live_prompt_tokens tokens) as the newest replaced
 * prompt, dropping the oldest; the same prompt twice in a row is kept once,
 * and out of memory only forgets it. */
void ds4_srv_remember_prompt(server *s);
/* The longest common token prefix of toks[0..n) with a replaced prompt. */
int ds4_srv_branch_point(const server *s, const int32_t *toks, size_t n);
/* The disk cache for the running job: NULL without one or while steered. */
static inline struct ds4_kvdisk *ds4_srv_kvd(const server *s) { return s->steered ? NULL : s->kvd; }
/* The disk cache's lock (no-op without a cache). */
void ds4_srv_kvd_lock(server *s);
void ds4_srv_kvd_unlock(server *s);

#endif
