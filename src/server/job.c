#include "server/job.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <unistd.h>

#include "server/metrics.h"
#include "server/respond.h"

#define KEEPALIVE_SECONDS 5.0
/* Prefill runs in slices so keep-alives and disconnect checks happen at
 * least this often (in tokens), whatever the engine's own chunking. */
#define PREFILL_SLICE 256

static int conn_out(void *ud, const char *data, size_t len) {
    return ds4_http_stream_write(ud, data, len);
}

ds4_enc *ds4_job_encoder(server *s, job *j) {
    if (!j->enc) {
        ds4_enc_opts eo = {.req = &j->req, .thinking = ds4_srv_effective_think(s, &j->req) != DS4_THINK_NONE,
                           .mem = s->mem, .out = j->req.stream ? conn_out : NULL, .ud = j->conn};
        j->enc = ds4_enc_new(&eo);
    }
    return j->enc;
}

int ds4_job_open_stream(server *s, job *j) {
    if (j->conn->streaming) return 0;
    char hdr[1024];
    ds4_cors_headers(s, j->hreq, hdr, sizeof hdr);
    return ds4_http_stream_begin(j->conn, hdr);
}

void ds4_job_error(server *s, job *j, int status, const char *msg, const char *param, const char *code,
               int n_prompt) {
    ds4_http_conn *c = j->conn;
    if (status >= 500) j->keep_alive = false;
    if (!c->streaming) {
        ds4_send_error(s, c, j->hreq, status, msg, param, code, n_prompt, j->keep_alive);
        return;
    }
    j->keep_alive = false;
    if (j->req.api == DS4_API_COMPLETIONS) {
        cJSON *o = cJSON_CreateObject(), *er = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(er, "message", msg);
        cJSON_AddStringToObject(er, "type", status >= 500 ? "server_error" : "invalid_request_error");
        cJSON_AddNullToObject(er, "param");
        cJSON_AddNullToObject(er, "code");
        ds4_sse_data(c, o);
        ds4_http_stream_write(c, "data: [DONE]\n\n", 14);
    } else if (j->enc) {
        ds4_enc_fail(j->enc, msg, code ? code : status >= 500 ? "server_error" : "invalid_request_error");
    }
    ds4_http_stream_end(c);
}

/* The SSE stream opens and gets what prefill would send (server-api.md 1.4);
 * Messages' message_start waits for the token counts, pings go first. */
void ds4_job_queued_keepalive(server *s, job *j) {
    if (ds4_job_open_stream(s, j)) return;
    ds4_http_stream_write(j->conn, ": queued\n\n", 10);
    if (j->req.api != DS4_API_COMPLETIONS && ds4_job_encoder(s, j)) ds4_enc_keepalive(j->enc);
}

void ds4_job_progress_init(job_progress *p, server *s, job *j, ds4_enc *enc) {
    *p = (job_progress){.s = s, .conn = j->conn, .enc = enc, .last_ping = ds4_srv_now(), .j = j};
}

void ds4_job_prefilled(job_progress *p, int tokens, double seconds) {
    p->prefilled += tokens;
    p->prefill_s += seconds;
    ds4_metrics_prefill(tokens, seconds);
}

void ds4_job_decoded(job_progress *p, int tokens, double seconds) {
    p->decoded += tokens;
    p->decode_s += seconds;
    ds4_metrics_decode(tokens, seconds);
}

ds4_gen_result ds4_job_generate(server *s, ds4_sampler *smp, int limit, ds4_gen_hooks *hooks, char *err,
                            size_t errlen) {
    ds4_spec_stats before = s->spec ? s->spec->stats : (ds4_spec_stats){0};
    hooks->spec = s->spec;
    ds4_gen_result r = ds4_generate(s->sess, s->tok, smp, limit, hooks, err, errlen);
    if (s->spec) {
        const ds4_spec_stats *now = &s->spec->stats;
        ds4_metrics_spec(now->passes - before.passes, now->proposed - before.proposed,
                         now->accepted - before.accepted, now->draft_tries - before.draft_tries);
        /* the session grew by whole verification passes, not through ds4_srv_eval */
        ds4_srv_session_changed(s);
    }
    return r;
}

void ds4_job_first_token(job_progress *p) {
    if (p->first_token_at == 0) p->first_token_at = ds4_srv_now();
}

static double rate(int tokens, double seconds) { return seconds > 0 ? tokens / seconds : 0.0; }

void ds4_job_trace_timing(const job_progress *p) {
    const job *j = p->j;
    const double end = ds4_srv_now();
    ds4_srv_trace(p->s, "timing: queued %.3f s, prefill %d tokens in %.3f s (%.1f tok/s), first token at %.3f s, "
                "decode %d tokens in %.3f s (%.1f tok/s), total %.3f s",
          j->started_at - j->queued_at, p->prefilled, p->prefill_s, rate(p->prefilled, p->prefill_s),
          p->first_token_at > 0 ? p->first_token_at - j->queued_at : -1.0, p->decoded, p->decode_s,
          rate(p->decoded, p->decode_s), end - j->queued_at);
}

const char *ds4_job_gone_how(const ds4_http_conn *c) {
    return c->stalled ? "stopped reading (a write stalled) and was dropped" : "went away";
}

bool ds4_job_cancelled(job_progress *p) {
    if (ds4_http_peer_gone(p->conn)) { p->gone = true; return true; }
    if (atomic_load(&ds4_srv_stop)) { p->stopping = true; return true; }
    return false;
}

bool ds4_job_progress_check(job_progress *p) {
    if (ds4_job_cancelled(p)) return true;
    if (ds4_srv_now() - p->last_ping >= KEEPALIVE_SECONDS) {
        p->last_ping = ds4_srv_now();
        if (p->conn->streaming) ds4_http_stream_write(p->conn, ": prefill\n\n", 11);
        if (p->enc) ds4_enc_keepalive(p->enc);
        if (p->conn->broken) { p->gone = true; return true; }
    }
    return false;
}

/* Prefills toks[from..n) in slices, stopping to save a checkpoint at the
 * disk cache's save points and at `branch`; 0 ok, 1 cancelled, -1 error. */
static int prefill(server *s, const int32_t *toks, int from, int n, int branch, job_progress *pc, char *err,
                   size_t errlen) {
    const double t0 = ds4_srv_now();
    int rc = 0, i = from;
    /* test only: a prefill held as long as the test's gate file exists,
     * with the progress checks (keep-alives) a long one makes */
    while (i < n && s->o.test_prefill_gate && !access(s->o.test_prefill_gate, F_OK) && rc == 0) {
        usleep(10000);
        if (ds4_job_progress_check(pc)) rc = 1;
    }
    while (i < n && rc == 0) {
        int len = n - i < PREFILL_SLICE ? n - i : PREFILL_SLICE, reason = 0;
        ds4_srv_kvd_lock(s);
        int stop = ds4_srv_kvd(s) ? ds4_kvdisk_prefill_stop(s->kvd, toks, n, i, from == 0, &reason) : -1;
        ds4_srv_kvd_unlock(s);
        if (branch > i && (stop <= i || branch < stop)) { stop = branch; reason = DS4_KVC_CONTINUED; }
        if (stop > i && stop < i + len) len = stop - i;
        rc = ds4_srv_eval(s, toks + i, len, i == from, err, errlen);
        if (rc) break;
        i += len;
        if (i == stop) {
            ds4_srv_kvd_lock(s);
            ds4_kvdisk_save(s->kvd, s->sess, reason);
            ds4_srv_kvd_unlock(s);
        }
        if (ds4_job_progress_check(pc)) rc = 1;
    }
    ds4_job_prefilled(pc, i - from, ds4_srv_now() - t0);
    return rc;
}

/* Branch checkpoints: where a prompt parts from one this server saw before
 * (the live session's, or a replaced conversation's), the common prefix is
 * the stable part of a client's prompt and the text after it a block the
 * client rewrites (a reminder, a date or status line). Saved on disk, that
 * prefix serves the next version of the block even after another
 * conversation took the live session, where the files of the whole older
 * prompts are no prefix of it. */
int ds4_job_load_prompt(server *s, const prompt_plan *p, job_progress *pc, char *err, size_t errlen) {
    int live_n = ds4_session_n_tokens(s->sess);
    const int sent = s->live_prompt_tokens < live_n ? s->live_prompt_tokens : live_n;
    const bool kvd = ds4_srv_kvd(s) != NULL;
    if (p->reuse < live_n && kvd && p->reuse < live_n / 2) {
        ds4_srv_remember_prompt(s);
        ds4_srv_kvd_lock(s);
        ds4_kvdisk_save(s->kvd, s->sess, DS4_KVC_EVICT);
        ds4_srv_kvd_unlock(s);
    }
    s->live_prompt_tokens = 0;
    if (p->reuse < live_n && ds4_srv_rewind(s, p->reuse, err, errlen)) return -1;
    if (p->reuse < sent && kvd) {
        ds4_srv_kvd_lock(s);
        ds4_kvdisk_save(s->kvd, s->sess, DS4_KVC_CONTINUED);
        ds4_srv_kvd_unlock(s);
    }
    const int branch = kvd ? ds4_srv_branch_point(s, p->toks.v, p->toks.n) : 0;
    int rc = prefill(s, p->toks.v, p->reuse, (int)p->toks.n, branch, pc, err, errlen);
    if (rc == 0) s->live_prompt_tokens = (int)p->toks.n;
    return rc;
}

void ds4_job_disk_frontier(server *s) {
    if (ds4_srv_kvd(s) && ds4_kvdisk_is_frontier(ds4_kvdisk_options(s->kvd), ds4_session_n_tokens(s->sess))) {
        ds4_srv_kvd_lock(s);
        ds4_kvdisk_save(s->kvd, s->sess, DS4_KVC_CONTINUED);
        ds4_srv_kvd_unlock(s);
    }
}

ds4_sampler *ds4_job_sampler(server *s, const ds4_request *r) {
    ds4_sampler_params sp = r->sampling;
    if (!r->seed_set) sp.seed = ds4_sampler_random_seed();
    return ds4_sampler_new(&sp, s->n_vocab);
}
