#include "server/endpoints.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "server/job.h"
#include "server/logprobs.h"
#include "server/metrics.h"
#include "server/prefix.h"
#include "server/respond.h"

/* The shared generation loop's view of a chat-family job. */
typedef struct {
    server *s;
    ds4_enc *enc;
    job_progress *pc;
    ds4_usage *u;
    const ds4_request *r;
    ds4_buf generated;          /* for the trace */
    ds4_token_ids script;       /* --scripted-output tokens (test only) */
    int eos;                    /* ends a script */
} chat_gen;

static bool chat_cancelled(void *ud) {
    return ds4_job_cancelled(((chat_gen *)ud)->pc);
}

static int chat_forced(void *ud, int step) {
    chat_gen *g = ud;
    if (!g->s->script) return -1;
    return (size_t)step < g->script.n ? g->script.v[step] : g->eos;
}

/* DSML structure is sampled greedy (server-api.md 2.3). */
static bool chat_greedy(void *ud) {
    return ds4_enc_in_structure(((chat_gen *)ud)->enc);
}

static void chat_token(void *ud, int32_t tok, const float *logits) {
    chat_gen *g = ud;
    if (ds4_tokenizer_is_stop(g->s->tok, tok)) return;
    if (ds4_enc_wants_logprobs(g->enc) && ds4_enc_in_content(g->enc))
        ds4_enc_logprob(g->enc, ds4_chat_logprob_entry(g->s, logits, tok, g->r->logprobs));
    g->u->completion_tokens++;
    ds4_job_first_token(g->pc);
    if (ds4_enc_in_reasoning(g->enc)) g->u->reasoning_tokens++;
}

static bool chat_text(void *ud, const char *text, size_t len) {
    chat_gen *g = ud;
    ds4_buf_put(&g->generated, text, len);
    return ds4_enc_feed(g->enc, text, len);
}

static int chat_decode(void *ud, int32_t tok, char *err, size_t errlen) {
    return ds4_srv_eval(((chat_gen *)ud)->s, &tok, 1, false, err, errlen);
}

static void chat_after_decode(void *ud) {
    ds4_job_disk_frontier(((chat_gen *)ud)->s);
}

/* The family's context-overflow answer. */
static void reject_overflow(server *s, job *j, ds4_enc *enc, ds4_usage *u, int n_prompt) {
    const ds4_request *r = &j->req;
    char err[512];
    if (r->api == DS4_API_RESPONSES && r->stream) {
        /* Responses reports an overflow in-stream. */
        if (ds4_job_open_stream(s, j)) return;
        ds4_enc_begin(enc, u);
        snprintf(err, sizeof err, "Your input exceeds the context window of this model. This model's maximum context length is %d tokens; the request has %d prompt tokens.", s->o.ctx, n_prompt);
        ds4_job_error(s, j, 400, err, "input", "context_length_exceeded", n_prompt);
    } else if (r->api == DS4_API_MESSAGES) {
        snprintf(err, sizeof err, "prompt is too long: %d tokens > %d maximum", n_prompt, s->o.ctx - 1);
        ds4_job_error(s, j, 400, err, NULL, NULL, n_prompt);
    } else {
        snprintf(err, sizeof err, "This model's maximum context length is %d tokens. However, your request has %d prompt tokens (the request exceeds the available context size).", s->o.ctx, n_prompt);
        ds4_job_error(s, j, 400, err, r->api == DS4_API_CHAT ? "messages" : "input", "context_length_exceeded", n_prompt);
    }
}

/* Remembers the tool-call turn just produced: the replay map gets the exact
 * block, and the live bindings let a continuation answer by id alone. */
static void remember_tool_calls(server *s, ds4_enc *enc) {
    size_t blen;
    const char *block = ds4_enc_block(enc, &blen);
    int nids = ds4_enc_call_ids(enc, NULL, 0);
    if (!block || !nids) return;
    const char **ids = malloc((size_t)nids * sizeof *ids);
    char (*live)[40] = ids ? malloc((size_t)nids * sizeof *live) : NULL;
    if (!live) {
        ds4_srv_trace(s, "out of memory remembering %d tool calls; their continuation needs the full history", nids);
        free(ids);
        return;
    }
    ds4_enc_call_ids(enc, ids, nids);
    ds4_toolmem_put(s->mem, ids, nids, block, blen);
    for (int i = 0; i < nids; i++) snprintf(live[i], sizeof live[i], "%s", ids[i]);
    free(s->live_ids);
    s->live_ids = live;
    s->n_live_ids = nids;
    s->live_ids_tokens = ds4_session_n_tokens(s->sess);
    ds4_srv_trace(s, "tool calls: %d, exact DSML block remembered (%zu bytes), first id %s", nids, blen, ids[0]);
    free(ids);
}

void ds4_srv_run_chat(server *s, job *j) {
    ds4_request *r = &j->req;
    ds4_http_conn *c = j->conn;
    char err[512];
    srv_prompt prompt = {0};
    prompt_plan p = {0};
    ds4_sampler *smp = NULL;
    j->keep_alive = j->hreq->keep_alive;
    ds4_enc *enc = ds4_job_encoder(s, j);
    if (!enc) { ds4_job_error(s, j, 500, "out of memory", NULL, NULL, 0); goto out; }
    const int steer = ds4_srv_steer(s, r, err, sizeof err);
    if (steer) { ds4_job_error(s, j, steer, err, steer == 400 ? "dir_steering" : NULL, NULL, 0); goto out; }

    bool tail = r->n_live_ids > 0;
    if (tail && !ds4_srv_live_ids_match(s, r)) {
        const char *fam = r->api == DS4_API_MESSAGES ? "Anthropic" : "Responses";
        snprintf(err, sizeof err, "%s continuation state is not available for %s %s; retry by replaying the full %s history",
                 fam, r->api == DS4_API_MESSAGES ? "tool_use_id" : "call_id", r->live_ids[0],
                 r->api == DS4_API_MESSAGES ? "messages" : "input");
        ds4_job_error(s, j, 400, err, r->api == DS4_API_MESSAGES ? "messages" : "input", NULL, 0);
        goto out;
    }
    if (tail) {
        if (ds4_srv_plan_tool_tail(s, r, &prompt, &p)) {
            ds4_job_error(s, j, 500, "tokenization failed", NULL, NULL, 0);
            goto out;
        }
    } else {
        if (!ds4_srv_render_prompt(s, r, true, &prompt, err, sizeof err)) {
            ds4_job_error(s, j, 400, err, NULL, NULL, 0);
            goto out;
        }
        /* Tokenizing is the costly step before the context check: skip it
         * for a prompt that cannot fit or a client that has left. */
        size_t at_least = prompt.text.len / s->max_token_bytes;
        if (at_least >= (size_t)s->o.ctx) {
            ds4_usage u = {.prompt_tokens = (int)at_least};
            reject_overflow(s, j, enc, &u, (int)at_least);
            goto out;
        }
        if (ds4_http_peer_gone(c)) {
            ds4_srv_trace(s, "client went away before tokenization");
            j->keep_alive = false;
            goto out;
        }
        if (ds4_srv_plan_prompt(s, &prompt, &p)) {
            ds4_job_error(s, j, 500, "tokenization failed", NULL, NULL, 0);
            goto out;
        }
    }
    s->n_live_ids = 0; /* any other request replaces the bindings */
    s->visible_tokens = -1;
    int n_prompt = (int)p.toks.n;
    ds4_srv_trace_text(s, "rendered prompt", prompt.text.data ? prompt.text.data : "", prompt.text.len);
    ds4_srv_trace(s, "cache: %s, prompt %d tokens, reused %d, prefill %d", p.how, n_prompt, p.reuse, n_prompt - p.reuse);
    ds4_metrics_prefix(p.how);

    bool thinking = ds4_srv_effective_think(s, r) != DS4_THINK_NONE;
    ds4_usage u = {.prompt_tokens = n_prompt, .cached_tokens = p.reuse < n_prompt ? p.reuse : n_prompt};
    if (n_prompt >= s->o.ctx) { reject_overflow(s, j, enc, &u, n_prompt); goto out; }

    if (r->stream) {
        if (ds4_job_open_stream(s, j)) goto out;
        ds4_enc_begin(enc, &u);
    }
    job_progress pc;
    ds4_job_progress_init(&pc, s, j, enc);
    int rc = ds4_job_load_prompt(s, &p, &pc, err, sizeof err);
    if (rc == 1 && pc.gone) { ds4_srv_trace(s, "client %s during prefill", ds4_job_gone_how(c)); j->keep_alive = false; goto out; }
    if (rc == 1) snprintf(err, sizeof err, "server shutting down");
    if (rc) {
        ds4_srv_trace(s, "prefill failed: %s", err);
        ds4_job_error(s, j, pc.stopping ? 503 : 500, err, NULL, NULL, 0);
        goto out;
    }

    int limit = r->max_tokens >= 0 ? r->max_tokens : s->o.default_max_tokens;
    if (limit > s->o.ctx - n_prompt) limit = s->o.ctx - n_prompt;
    smp = ds4_job_sampler(s, r);
    chat_gen g = {.s = s, .enc = enc, .pc = &pc, .u = &u, .r = r, .eos = ds4_tokenizer_specials(s->tok)->eos};
    if (s->script) {
        /* The k-th generation answers with the k-th entry; the script stands
         * for model output, so its protocol strings are tokens. */
        const long k = atomic_fetch_add(s->script_turn, 1);
        size_t len = 0;
        const char *answer = ds4_turn_script_at(s->script, k, &len);
        ds4_srv_trace(s, "scripted answer %ld of %d", k < s->script->n ? k + 1 : s->script->n, s->script->n);
        if (answer) ds4_tokenizer_encode(s->tok, answer, len, DS4_TOK_SPECIALS_CHAT, &g.script);
    }
    ds4_gen_hooks hooks = {.cancelled = chat_cancelled, .forced = chat_forced, .greedy = chat_greedy,
                           .on_token = chat_token, .on_text = chat_text, .after_decode = chat_after_decode,
                           .decode = chat_decode, .ud = &g};
    const double t_decode = ds4_srv_now();
    ds4_gen_result gr = ds4_job_generate(s, smp, limit, &hooks, err, sizeof err);
    ds4_job_decoded(&pc, gr.n_decoded, ds4_srv_now() - t_decode);
    if (gr.end == DS4_GEN_ERROR) ds4_srv_trace(s, "decode failed: %s", err);
    ds4_token_ids_free(&g.script);
    ds4_srv_trace_text(s, "generated", g.generated.data ? g.generated.data : "", g.generated.len);
    ds4_buf_free(&g.generated);
    if (pc.gone || ds4_enc_broken(enc)) {
        ds4_srv_trace(s, "client %s during generation after %d tokens", ds4_job_gone_how(c), u.completion_tokens);
        j->keep_alive = false;
        goto out;
    }
    if (pc.stopping) {
        ds4_job_error(s, j, 503, "server shutting down", NULL, NULL, 0);
        goto out;
    }
    if (gr.end == DS4_GEN_ERROR) {
        /* A truncated answer must not look like a finished one. */
        ds4_job_error(s, j, 500, err, NULL, NULL, 0);
        goto out;
    }
    bool hit_length = gr.end == DS4_GEN_LENGTH || gr.end == DS4_GEN_CTX_FULL;
    ds4_queue_answered(s);
    ds4_enc_finish(enc, hit_length ? DS4_CAUSE_LENGTH : DS4_CAUSE_EOS, &u);
    if (ds4_enc_error(enc)) ds4_srv_trace(s, "tool parser: %s", ds4_enc_error(enc));
    remember_tool_calls(s, enc);
    if (thinking) ds4_srv_remember_visible(s, &prompt.text, enc);
    ds4_srv_trace(s, "usage: prompt %d cached %d completion %d reasoning %d", u.prompt_tokens, u.cached_tokens,
          u.completion_tokens, u.reasoning_tokens);
    ds4_job_trace_timing(&pc);
    ds4_metrics_tokens(u.prompt_tokens, u.cached_tokens, u.completion_tokens);
    if (r->stream) {
        ds4_http_stream_end(c);
    } else {
        size_t n;
        const char *b = ds4_enc_body(enc, &n);
        char hdr[1024];
        ds4_cors_headers(s, j->hreq, hdr, sizeof hdr);
        ds4_http_respond(c, 200, "application/json", b, n, j->keep_alive, hdr);
    }
out:
    ds4_sampler_free(smp);
    ds4_token_ids_free(&p.toks);
    ds4_srv_prompt_free(&prompt);
}
