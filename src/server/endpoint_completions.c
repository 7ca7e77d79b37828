#include "server/endpoints.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/generate.h"
#include "server/job.h"
#include "server/logprobs.h"
#include "server/metrics.h"
#include "server/prefix.h"
#include "server/respond.h"

/* Echo logprobs keep full-vocabulary rows for this many positions at once. */
#define ECHO_SLICE 16

static cJSON *cmpl_chunk(const char *id, long long created, const ds4_request *r, int index,
                         const char *text, size_t n, const char *finish) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)created);
    cJSON_AddStringToObject(o, "model", r->model);
    cJSON *ch = cJSON_AddArrayToObject(o, "choices");
    if (index >= 0) {
        cJSON *c = cJSON_CreateObject();
        char *t = strndup(text, n);
        cJSON_AddStringToObject(c, "text", t ? t : "");
        free(t);
        cJSON_AddNumberToObject(c, "index", index);
        cJSON_AddNullToObject(c, "logprobs");
        if (finish) cJSON_AddStringToObject(c, "finish_reason", finish); else cJSON_AddNullToObject(c, "finish_reason");
        cJSON_AddItemToArray(ch, c);
    }
    return o;
}

/* Tokenizes (and validates) one prompt; false after answering the error. */
static bool tokenize_prompt(server *s, job *j, const ds4_prompt *pr, ds4_token_ids *out) {
    char err[512];
    if (pr->ids) {
        for (int k = 0; k < pr->n_ids; k++) {
            if (pr->ids[k] >= s->n_vocab) {
                snprintf(err, sizeof err, "prompt token id %d is outside the vocabulary (%d)", pr->ids[k], s->n_vocab);
                ds4_job_error(s, j, 400, err, "prompt", "invalid_value", 0);
                return false;
            }
        }
        out->v = malloc(sizeof(int32_t) * (size_t)(pr->n_ids ? pr->n_ids : 1));
        if (!out->v) { ds4_job_error(s, j, 500, "out of memory", NULL, NULL, 0); return false; }
        memcpy(out->v, pr->ids, sizeof(int32_t) * (size_t)pr->n_ids);
        out->n = out->cap = (size_t)pr->n_ids;
    } else if (s->o.completions_chat) {
        ds4_chat_msg m[2] = {{.role = DS4_ROLE_SYSTEM, .content = "You are a helpful assistant"},
                             {.role = DS4_ROLE_USER, .content = pr->text}};
        ds4_chat_opts o;
        ds4_chat_opts_default(&o);
        o.profile = ds4_srv_chat(s)->profile;
        o.think = ds4_srv_effective_think(s, &j->req);
        o.ctx = s->o.ctx;
        srv_prompt prompt = {0};
        o.client_spans = &prompt.client;
        bool ok = ds4_chat_render(m, 2, &o, &prompt.text, err, sizeof err) && !prompt.client.oom &&
                  !ds4_srv_encode(s, &prompt, 0, out);
        ds4_srv_prompt_free(&prompt);
        if (!ok) { ds4_job_error(s, j, 500, "out of memory", NULL, NULL, 0); return false; }
    } else if (ds4_tokenizer_encode(s->tok, pr->text, pr->text_len, DS4_TOK_SPECIALS_CHAT, out)) {
        /* A raw prompt is the whole model input: its protocol strings are
         * the client's to use (lm-eval, prompt engineering). */
        ds4_job_error(s, j, 500, "out of memory", NULL, NULL, 0);
        return false;
    }
    if (out->n == 0 || (int)out->n >= s->o.ctx) {
        if (out->n == 0) snprintf(err, sizeof err, "prompt is empty");
        else snprintf(err, sizeof err, "This model's maximum context length is %d tokens. However, your request has %zu prompt tokens (the request exceeds the available context size).", s->o.ctx, out->n);
        ds4_job_error(s, j, 400, err, "prompt", out->n ? "context_length_exceeded" : NULL, (int)out->n);
        return false;
    }
    return true;
}

/* The shared generation loop's view of one completions choice. */
typedef struct {
    server *s;
    job_progress *pc;
    const ds4_request *r;
    const char *id;
    long long created;
    int index;
    ds4_stopper st;
    ds4_buf *text;
    cmpl_logprobs *lp;          /* NULL when not requested */
    int n_sampled;              /* EOS included */
} cmpl_gen;

static bool cmpl_cancelled(void *ud) {
    return ds4_job_cancelled(((cmpl_gen *)ud)->pc);
}

static void cmpl_token(void *ud, int32_t tok, const float *logits) {
    cmpl_gen *g = ud;
    g->n_sampled++;
    ds4_job_first_token(g->pc);
    if (g->lp) ds4_cmpl_logprobs_add(g->s, g->lp, logits, tok, g->r->logprobs, g->text->len);
}

static void cmpl_release(cmpl_gen *g, const char *span, size_t n) {
    if (!n) return;
    ds4_buf_put(g->text, span, n);
    if (g->r->stream) ds4_sse_data(g->pc->conn, cmpl_chunk(g->id, g->created, g->r, g->index, span, n, NULL));
}

static bool cmpl_text(void *ud, const char *text, size_t len) {
    cmpl_gen *g = ud;
    const char *span;
    size_t n = ds4_stopper_push(&g->st, text, len, &span);
    cmpl_release(g, span, n);
    return g->st.matched >= 0;
}

static int cmpl_decode(void *ud, int32_t tok, char *err, size_t errlen) {
    return ds4_srv_eval(((cmpl_gen *)ud)->s, &tok, 1, false, err, errlen);
}

static void cmpl_after_decode(void *ud) {
    ds4_job_disk_frontier(((cmpl_gen *)ud)->s);
}

/* Echo logprobs: prefill from scratch keeping every position's logits
 * (never fabricate cached values); 0 ok, 1 cancelled, -1 error. */
static int prefill_echo(server *s, const ds4_token_ids *pt, float *rows, cmpl_logprobs *lpa, int top_k,
                        job_progress *pc, char *err, size_t errlen) {
    int n = (int)pt->n;
    if (ds4_session_n_tokens(s->sess) && ds4_srv_rewind(s, 0, err, errlen)) return -1;
    s->live_prompt_tokens = n; /* the echoed prompt replaces the live one (job.c: branch checkpoints) */
    for (int k = 0; k < n; k += ECHO_SLICE) {
        int len = n - k < ECHO_SLICE ? n - k : ECHO_SLICE;
        const double t0 = ds4_srv_now();
        int rc = ds4_srv_prefill_rows(s, pt->v + k, len, rows, err, errlen);
        if (rc) return rc;
        ds4_job_prefilled(pc, len, ds4_srv_now() - t0);
        /* row q predicts token k+q+1: fill position k+q+1's entry */
        for (int q = 0; q < len && k + q + 1 < n; q++)
            ds4_cmpl_logprobs_set(s, lpa, k + q + 1, rows + (size_t)q * s->n_vocab, pt->v[k + q + 1], top_k);
        if (ds4_job_progress_check(pc)) return 1;
    }
    return 0;
}

void ds4_srv_run_completions(server *s, job *j) {
    ds4_request *r = &j->req;
    ds4_http_conn *c = j->conn;
    j->keep_alive = j->hreq->keep_alive;
    char err[512], id[40] = "cmpl-";
    ds4_random_hex(id + 5, 12);
    long long created = (long long)time(NULL);
    bool logprobs = r->logprobs >= 0;
    ds4_usage total = {0};
    cJSON *choices = cJSON_CreateArray();
    ds4_token_ids *prompts = calloc((size_t)r->n_prompts, sizeof *prompts);
    float *rows = NULL;
    if (!prompts) { ds4_job_error(s, j, 500, "out of memory", NULL, NULL, 0); goto out; }
    const int steer = ds4_srv_steer(s, r, err, sizeof err);
    if (steer) { ds4_job_error(s, j, steer, err, steer == 400 ? "dir_steering" : NULL, NULL, 0); goto out; }

    /* Tokenize (and validate) every prompt before answering anything. */
    for (int i = 0; i < r->n_prompts; i++)
        if (!tokenize_prompt(s, j, &r->prompts[i], &prompts[i])) goto out;
    s->n_live_ids = 0;
    s->visible_tokens = -1;
    if (r->stream && ds4_job_open_stream(s, j)) goto out;
    job_progress pc;
    ds4_job_progress_init(&pc, s, j, NULL);
    rows = malloc(sizeof(float) * (size_t)s->n_vocab * ECHO_SLICE);
    if (!rows) { ds4_job_error(s, j, 500, "out of memory", NULL, NULL, 0); goto out; }
    for (int i = 0; i < r->n_prompts && !pc.gone; i++) {
        ds4_token_ids *pt = &prompts[i];
        int n_prompt = (int)pt->n;
        bool echo_lp = logprobs && r->echo;
        prompt_plan p = {.toks = *pt, .reuse = 0};
        if (!echo_lp) {
            int live_n = ds4_session_n_tokens(s->sess);
            const int32_t *live = ds4_session_tokens(s->sess);
            while (p.reuse < live_n && p.reuse < n_prompt && live[p.reuse] == pt->v[p.reuse]) p.reuse++;
        }
        ds4_buf text = {0};
        cmpl_logprobs lpa;
        if (logprobs) ds4_cmpl_logprobs_init(&lpa);
        if (r->echo) {
            size_t n = 0;
            char *pt_text = ds4_tokenizer_decode(s->tok, pt->v, pt->n, false, &n);
            if (echo_lp) {
                size_t off = 0;
                for (int k = 0; k < n_prompt; k++) {
                    size_t tl = 0;
                    ds4_tokenizer_token_bytes(s->tok, pt->v[k], &tl);
                    ds4_cmpl_logprobs_add(s, &lpa, NULL, pt->v[k], r->logprobs, off);
                    off += tl;
                }
            }
            ds4_buf_put(&text, pt_text, n);
            if (r->stream && n) ds4_sse_data(c, cmpl_chunk(id, created, r, i, pt_text, n, NULL));
            free(pt_text);
        }
        int rc = echo_lp ? prefill_echo(s, pt, rows, &lpa, r->logprobs, &pc, err, sizeof err)
                         : ds4_job_load_prompt(s, &p, &pc, err, sizeof err);
        if (rc) {
            ds4_buf_free(&text);
            if (logprobs) cJSON_Delete(ds4_cmpl_logprobs_object(&lpa));
            if (rc == 1 && pc.gone) { j->keep_alive = false; goto out; }
            ds4_job_error(s, j, rc == 1 ? 503 : 500, rc == 1 ? "server shutting down" : err, NULL, NULL, 0);
            goto out;
        }
        int limit = r->max_tokens >= 0 ? r->max_tokens : s->o.default_max_tokens;
        if (limit > s->o.ctx - n_prompt) limit = s->o.ctx - n_prompt;
        ds4_sampler *smp = ds4_job_sampler(s, r);
        cmpl_gen g = {.s = s, .pc = &pc, .r = r, .id = id, .created = created, .index = i, .text = &text,
                      .lp = logprobs ? &lpa : NULL};
        ds4_stopper_init(&g.st, r->stop, r->n_stop);
        ds4_gen_hooks hooks = {.cancelled = cmpl_cancelled, .greedy = NULL, .on_token = cmpl_token,
                               .on_text = cmpl_text, .after_decode = cmpl_after_decode, .decode = cmpl_decode,
                               .ud = &g};
        const double t_decode = ds4_srv_now();
        ds4_gen_result gr = ds4_job_generate(s, smp, limit, &hooks, err, sizeof err);
        ds4_job_decoded(&pc, gr.n_decoded, ds4_srv_now() - t_decode);
        const char *span;
        size_t rel = ds4_stopper_flush(&g.st, &span);
        cmpl_release(&g, span, rel);
        ds4_stopper_free(&g.st);
        ds4_sampler_free(smp);
        const char *finish = gr.end == DS4_GEN_LENGTH || gr.end == DS4_GEN_CTX_FULL ? "length" : "stop";
        if (pc.stopping || gr.end == DS4_GEN_ERROR) {
            /* A truncated answer must not look like a finished one. */
            if (gr.end == DS4_GEN_ERROR) ds4_srv_trace(s, "decode failed: %s", err);
            ds4_buf_free(&text);
            if (logprobs) cJSON_Delete(ds4_cmpl_logprobs_object(&lpa));
            ds4_job_error(s, j, pc.stopping ? 503 : 500, pc.stopping ? "server shutting down" : err, NULL, NULL, 0);
            goto out;
        }
        total.prompt_tokens += n_prompt;
        total.cached_tokens += p.reuse;
        total.completion_tokens += g.n_sampled;
        ds4_srv_trace(s, "completion %d: prompt %d reused %d generated %d", i, n_prompt, p.reuse, g.n_sampled);
        ds4_metrics_tokens(n_prompt, p.reuse, g.n_sampled);
        if (r->stream) {
            cJSON *ch = cmpl_chunk(id, created, r, i, "", 0, finish);
            if (logprobs) cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(ch, "choices"), 0), "logprobs", ds4_cmpl_logprobs_object(&lpa));
            ds4_sse_data(c, ch);
        } else {
            cJSON *ch = cJSON_CreateObject();
            cJSON_AddNumberToObject(ch, "index", i);
            cJSON_AddStringToObject(ch, "text", text.data ? text.data : "");
            if (logprobs) cJSON_AddItemToObject(ch, "logprobs", ds4_cmpl_logprobs_object(&lpa));
            else cJSON_AddNullToObject(ch, "logprobs");
            cJSON_AddStringToObject(ch, "finish_reason", finish);
            cJSON_AddItemToArray(choices, ch);
        }
        ds4_buf_free(&text);
    }
    if (pc.gone) { j->keep_alive = false; goto out; }
    ds4_queue_answered(s);
    ds4_job_trace_timing(&pc);
    cJSON *usage = cJSON_CreateObject();
    cJSON_AddNumberToObject(usage, "prompt_tokens", total.prompt_tokens);
    cJSON_AddNumberToObject(usage, "completion_tokens", total.completion_tokens);
    cJSON_AddNumberToObject(usage, "total_tokens", total.prompt_tokens + total.completion_tokens);
    cJSON *det = cJSON_AddObjectToObject(usage, "prompt_tokens_details");
    cJSON_AddNumberToObject(det, "cached_tokens", total.cached_tokens);
    cJSON_AddNumberToObject(det, "cache_write_tokens", total.prompt_tokens - total.cached_tokens);
    if (r->stream) {
        if (r->include_usage) {
            cJSON *o = cmpl_chunk(id, created, r, -1, NULL, 0, NULL);
            cJSON_AddItemToObject(o, "usage", usage);
            ds4_sse_data(c, o);
        } else {
            cJSON_Delete(usage);
        }
        ds4_http_stream_write(c, "data: [DONE]\n\n", 14);
        ds4_http_stream_end(c);
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "object", "text_completion");
        cJSON_AddNumberToObject(o, "created", (double)created);
        cJSON_AddStringToObject(o, "model", r->model);
        cJSON_AddItemToObject(o, "choices", choices);
        choices = NULL;
        cJSON_AddItemToObject(o, "usage", usage);
        ds4_send_json(s, c, j->hreq, 200, o, j->keep_alive, NULL);
    }
out:
    free(rows);
    if (prompts)
        for (int i = 0; i < r->n_prompts; i++) ds4_token_ids_free(&prompts[i]);
    free(prompts);
    cJSON_Delete(choices);
}
