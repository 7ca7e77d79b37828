/* job.h -- running one job on the live session: its response channel
 * (stream opening, family encoder, errors in or out of stream), the client
 * watch (disconnects, shutdown, keep-alives) and the sliced prefill with the
 * disk cache's save points.
 *
 * Contract
 * - ds4_job_error() answers with the status response, or, once the job's SSE
 *   stream is open (a long queue wait opens it early), with the family's
 *   in-stream error; a 5xx or an in-stream error closes the connection.
 * - job_progress is polled between prefill slices and generated tokens:
 *   it stops the work when the client is gone (`gone`) or the server is
 *   stopping (`stopping`), and sends the family's keep-alive events every 5 s.
 * - ds4_job_load_prompt() brings the session to toks[0..reuse) (saving a
 *   session that is mostly replaced first, when the disk cache is on) and
 *   prefills the rest in slices of at most 256 tokens that also end at the
 *   disk cache's save points; 0 ok, 1 cancelled, -1 error (err filled).
 * - job_progress also times the job: the prefill and decode it records
 *   (ds4_job_prefilled, ds4_job_decoded: into /metrics too) and its first generated
 *   token (ds4_job_first_token); ds4_job_trace_timing() writes them to the trace as
 *   one line per answered request, times counted from its arrival in the
 *   queue (a cancelled or failed job gets its trace line saying so instead).
 */
#ifndef DS4_JOB_H
#define DS4_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/generate.h"
#include "server/prefix.h"
#include "engine/sampler.h"
#include "server/server_state.h"

ds4_enc *ds4_job_encoder(server *s, job *j);
/* 200 + SSE headers, once per response; nonzero when the peer is gone. */
int ds4_job_open_stream(server *s, job *j);
void ds4_job_error(server *s, job *j, int status, const char *msg, const char *param, const char *code,
               int n_prompt);
/* What a streamed job gets while it is still queued (queue.h). */
void ds4_job_queued_keepalive(server *s, job *j);

typedef struct {
    server *s;
    ds4_http_conn *conn;
    ds4_enc *enc;           /* chat-family keep-alives; NULL for completions */
    double last_ping;
    bool gone;              /* the client went away */
    bool stopping;          /* the server is shutting down */
    const job *j;
    int prefilled, decoded;             /* tokens */
    double prefill_s, decode_s;         /* seconds spent on them */
    double first_token_at;              /* ds4_srv_now() of the first generated token; 0 before */
} job_progress;

void ds4_job_progress_init(job_progress *p, server *s, job *j, ds4_enc *enc);
/* How a client that is gone left, for the trace: "went away" (closed or
 * reset) or "stopped reading ..." (its writes stalled out, http.h). */
const char *ds4_job_gone_how(const ds4_http_conn *c);
/* true when the work must stop (sets gone or stopping). */
bool ds4_job_cancelled(job_progress *p);
/* ds4_job_cancelled(), and the keep-alives a long prefill owes the client. */
bool ds4_job_progress_check(job_progress *p);

int ds4_job_load_prompt(server *s, const prompt_plan *p, job_progress *pc, char *err, size_t errlen);
void ds4_job_prefilled(job_progress *p, int tokens, double seconds);
void ds4_job_decoded(job_progress *p, int tokens, double seconds);
void ds4_job_first_token(job_progress *p);
void ds4_job_trace_timing(const job_progress *p);
/* One generation's decode through ds4_generate with the slot's drafter (when
 * there is one) in its hooks, the drafter's counts added to /metrics. */
ds4_gen_result ds4_job_generate(server *s, ds4_sampler *smp, int limit, ds4_gen_hooks *hooks, char *err,
                            size_t errlen);
/* A continued save when generation lands on an absolute frontier. */
void ds4_job_disk_frontier(server *s);
/* The request's sampler; a request without a seed gets a random one. */
ds4_sampler *ds4_job_sampler(server *s, const ds4_request *r);

#endif
