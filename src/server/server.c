#include "server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "request.h"
#include "sampler.h"
#include "stream.h"
#include "tokenizer.h"
#include "toolmem.h"

#define MAX_CONNECTIONS 1024
#define KEEPALIVE_SECONDS 5.0
/* How often a connection thread whose request is queued checks that its
 * client is still there. */
#define QUEUE_POLL_MS 250
/* Prefill runs in slices so keep-alives and disconnect checks happen at
 * least this often (in tokens), whatever the engine's own chunking. */
#define PREFILL_SLICE 256
#define MAX_LIVE_CALLS 64
/* Echo logprobs keep full-vocabulary rows for this many positions at once. */
#define ECHO_SLICE 16

typedef struct job job;

typedef struct {
    ds4_server_opts o;
    ds4_engine *eng;
    const ds4_tokenizer *tok;
    ds4_session *sess;
    ds4_toolmem *mem;
    ds4_kvdisk *kvd;              /* disk KV cache, or NULL */
    int n_vocab;
    char *script;                 /* scripted output (test only) */
    size_t script_len;
    FILE *trace;
    pthread_mutex_t trace_mu;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, *tail;
    bool stopping;
    int n_conns;

    /* Live tool-call turn (worker only): ids the model produced last. */
    char live_ids[MAX_LIVE_CALLS][40];
    int n_live_ids;
    int live_ids_tokens;          /* session length the binding belongs to */
    /* What clients replay for the last thinking turn when its reasoning is
     * hidden or dropped: the prompt with an empty or no think block, then
     * content and tool block (worker only). */
    ds4_buf visible[2];
    int visible_tokens;
} server;

/* Until the worker takes a job (running), only its connection thread
 * writes to the socket (queued keep-alives); `writing` marks such a write in
 * progress, and the worker waits for it before it starts. */
struct job {
    job *next;
    ds4_http_conn *conn;
    ds4_http_req *hreq;
    ds4_request req;
    ds4_enc *enc;                 /* chat family, made on first use */
    bool keep_alive;              /* set by the worker */
    bool running, writing, done;
};

static volatile sig_atomic_t g_stop;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

__attribute__((format(printf, 2, 3)))
static void trace(server *s, const char *fmt, ...) {
    if (!s->trace) return;
    pthread_mutex_lock(&s->trace_mu);
    time_t t = time(NULL);
    char ts[32];
    struct tm tm;
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    fprintf(s->trace, "[%s] ", ts);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(s->trace, fmt, ap);
    va_end(ap);
    fputc('\n', s->trace);
    fflush(s->trace);
    pthread_mutex_unlock(&s->trace_mu);
}

static void trace_text(server *s, const char *label, const char *text, size_t n) {
    if (!s->trace) return;
    pthread_mutex_lock(&s->trace_mu);
    fprintf(s->trace, "---- %s (%zu bytes)\n", label, n);
    fwrite(text, 1, n, s->trace);
    fprintf(s->trace, "\n---- end %s\n", label);
    fflush(s->trace);
    pthread_mutex_unlock(&s->trace_mu);
}

/* ---- responses and errors ------------------------------------------- */

static void cors_headers(server *s, const ds4_http_req *hr, char *out, size_t n) {
    out[0] = 0;
    if (!s->o.cors) return;
    /* A wildcard does not cover Authorization (Fetch spec): echo the
     * preflight's list instead. */
    snprintf(out, n,
             "Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Methods: GET, POST, OPTIONS\r\n"
             "Access-Control-Allow-Headers: %s\r\nAccess-Control-Max-Age: 86400\r\n",
             hr && hr->acr_headers[0] ? hr->acr_headers
                 : "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, "
                   "anthropic-dangerous-direct-browser-access, OpenAI-Beta");
}

static void send_json_obj(server *s, ds4_http_conn *c, const ds4_http_req *hr, int status, cJSON *o,
                          bool keep_alive, const char *extra) {
    char *body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    char hdr[1024];
    cors_headers(s, hr, hdr, sizeof hdr);
    if (extra) strncat(hdr, extra, sizeof hdr - strlen(hdr) - 1);
    ds4_http_respond(c, status, "application/json", body ? body : "{}", body ? strlen(body) : 2,
                     keep_alive, hdr);
    free(body);
}

static void sse_data(ds4_http_conn *c, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) return;
    ds4_buf b = {0};
    ds4_buf_puts(&b, "data: ");
    ds4_buf_puts(&b, s);
    ds4_buf_puts(&b, "\n\n");
    free(s);
    ds4_http_stream_write(c, b.data, b.len);
    ds4_buf_free(&b);
}

static bool anthropic_path(const char *path) {
    return !strncmp(path, "/v1/messages", 12);
}

/* Sends an error in the shape of the path's API family. */
static void send_error(server *s, ds4_http_conn *c, const ds4_http_req *hr, int status, const char *message,
                       const char *param, const char *code, int n_prompt, bool keep_alive) {
    cJSON *o = cJSON_CreateObject(), *er;
    if (hr && anthropic_path(hr->path)) {
        const char *type = status == 404 ? "not_found_error" : status == 413 ? "request_too_large"
                         : status == 401 ? "authentication_error" : status >= 500 ? "api_error"
                         : "invalid_request_error";
        cJSON_AddStringToObject(o, "type", "error");
        er = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(er, "type", type);
        cJSON_AddStringToObject(er, "message", message);
    } else {
        er = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(er, "message", message);
        cJSON_AddStringToObject(er, "type", status >= 500 ? "server_error" : "invalid_request_error");
        if (param && *param) cJSON_AddStringToObject(er, "param", param); else cJSON_AddNullToObject(er, "param");
        if (code && *code) cJSON_AddStringToObject(er, "code", code); else cJSON_AddNullToObject(er, "code");
    }
    if (n_prompt > 0) {
        cJSON_AddNumberToObject(er, "n_prompt_tokens", n_prompt);
        cJSON_AddNumberToObject(er, "n_ctx", s->o.ctx);
    }
    /* Deterministic failures must not be retried by the SDKs. */
    send_json_obj(s, c, hr, status, o, keep_alive, status < 500 ? "x-should-retry: false\r\n" : NULL);
}

static const char *http_error_text(int status) {
    switch (status) {
    case 413: return "request body too large";
    case 431: return "request header too large";
    case 414: return "request target too long";
    case 408: return "request timed out";
    case 501: return "unsupported transfer encoding";
    case 505: return "unsupported HTTP version";
    case 417: return "unsupported expectation";
    default: return "bad HTTP request";
    }
}

/* ---- models and tokenizer routes ------------------------------------ */

static cJSON *model_obj(server *s, const char *id) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddStringToObject(m, "type", "model");
    cJSON_AddNumberToObject(m, "created", 1767225600);
    cJSON_AddStringToObject(m, "created_at", "2026-01-01T00:00:00Z");
    cJSON_AddStringToObject(m, "owned_by", "ds4");
    cJSON_AddStringToObject(m, "display_name", strstr(id, "pro") ? "DeepSeek V4 Pro" : "DeepSeek V4 Flash");
    cJSON_AddNumberToObject(m, "context_length", s->o.ctx);
    cJSON_AddNumberToObject(m, "max_input_tokens", s->o.ctx);
    int mt = s->o.default_max_tokens < s->o.ctx ? s->o.default_max_tokens : s->o.ctx;
    cJSON_AddNumberToObject(m, "max_tokens", mt);
    cJSON *tp = cJSON_AddObjectToObject(m, "top_provider");
    cJSON_AddNumberToObject(tp, "context_length", s->o.ctx);
    cJSON_AddNumberToObject(tp, "max_completion_tokens", mt);
    cJSON_AddBoolToObject(tp, "is_moderated", false);
    return m;
}

static const char *const MODEL_IDS[] = {"deepseek-v4-flash", "deepseek-v4-pro"};

static void route_models(server *s, ds4_http_conn *c, const ds4_http_req *hr, bool ka) {
    if (!strcmp(hr->path, "/v1/models")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "object", "list");
        cJSON *d = cJSON_AddArrayToObject(o, "data");
        for (size_t i = 0; i < 2; i++) cJSON_AddItemToArray(d, model_obj(s, MODEL_IDS[i]));
        cJSON_AddBoolToObject(o, "has_more", false);
        cJSON_AddStringToObject(o, "first_id", MODEL_IDS[0]);
        cJSON_AddStringToObject(o, "last_id", MODEL_IDS[1]);
        send_json_obj(s, c, hr, 200, o, ka, NULL);
        return;
    }
    const char *id = hr->path + strlen("/v1/models/");
    for (size_t i = 0; i < 2; i++)
        if (!strcmp(id, MODEL_IDS[i])) { send_json_obj(s, c, hr, 200, model_obj(s, id), ka, NULL); return; }
    char msg[200];
    snprintf(msg, sizeof msg, "The model '%.100s' does not exist or you do not have access to it.", id);
    send_error(s, c, hr, 404, msg, "model", "model_not_found", 0, ka);
}

/* ---- prompt rendering ----------------------------------------------- */

typedef struct {
    server *s;
    char *held[64];   /* copies returned to the renderer, freed after */
    int n_held;
} replay_ctx;

static const char *replay_lookup(void *ud, const char *id) {
    replay_ctx *r = ud;
    if (!id || r->n_held == 64) return NULL;
    char *b = ds4_toolmem_get(r->s->mem, id);
    if (!b && r->s->kvd && ds4_kvdisk_find_tool(r->s->kvd, id)) b = ds4_toolmem_get(r->s->mem, id);
    if (b) r->held[r->n_held++] = b;
    return b;
}

static ds4_think_mode effective_think(server *s, const ds4_request *r) {
    return ds4_chat_effective_think(r->think, s->o.ctx);
}

/* Renders the chat-family request; false with err on failure. */
static bool render_prompt(server *s, const ds4_request *r, bool replay, ds4_buf *out, char *err, size_t errlen) {
    ds4_chat_opts o;
    ds4_chat_opts_default(&o);
    o.profile = DS4_CHAT_DS4;
    o.think = effective_think(s, r);
    o.ctx = s->o.ctx;
    o.tools = r->tools;
    o.n_tools = r->n_tools;
    replay_ctx rc = {.s = s};
    if (replay && !s->o.disable_exact_replay) { o.replay = replay_lookup; o.replay_ud = &rc; }
    bool ok = ds4_chat_render(r->msgs, r->n_msgs, &o, out, err, errlen);
    for (int i = 0; i < rc.n_held; i++) free(rc.held[i]);
    if (ok && out->oom) { snprintf(err, errlen, "out of memory"); ok = false; }
    return ok;
}

static int encode(server *s, const char *text, size_t n, ds4_token_ids *out) {
    return ds4_tokenizer_encode(s->tok, text, n, DS4_TOK_SPECIALS_CHAT, out);
}

static void route_count_tokens(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    ds4_request r;
    ds4_req_error e;
    if (ds4_request_decode(DS4_API_COUNT_TOKENS, body->data ? body->data : "", body->len, &r, &e)) {
        send_error(s, c, hr, e.status, e.message, e.param, e.code, 0, ka);
        return;
    }
    ds4_buf text = {0};
    char err[256];
    ds4_token_ids ids = {0};
    if (!render_prompt(s, &r, false, &text, err, sizeof err) || encode(s, text.data, text.len, &ids)) {
        send_error(s, c, hr, 400, err, NULL, NULL, 0, ka);
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "input_tokens", (double)ids.n);
        send_json_obj(s, c, hr, 200, o, ka, NULL);
    }
    ds4_token_ids_free(&ids);
    ds4_buf_free(&text);
    ds4_request_free(&r);
}

static void route_tokenizer(server *s, ds4_http_conn *c, const ds4_http_req *hr, const ds4_buf *body, bool ka) {
    cJSON *in = cJSON_ParseWithLength(body->data ? body->data : "", body->len);
    cJSON *o = cJSON_CreateObject();
    if (!strcmp(hr->path, "/tokenizer_info")) {
        cJSON_AddStringToObject(o, "eos_token", DS4_TOK_EOS);
        cJSON_AddStringToObject(o, "bos_token", DS4_TOK_BOS);
    } else if (!strcmp(hr->path, "/tokenize")) {
        cJSON *p = cJSON_GetObjectItem(in, "prompt");
        if (!cJSON_IsString(p)) p = cJSON_GetObjectItem(in, "content");
        if (!cJSON_IsString(p)) {
            cJSON_Delete(in); cJSON_Delete(o);
            send_error(s, c, hr, 400, "missing prompt", "prompt", NULL, 0, ka);
            return;
        }
        /* As HF tokenizers do: added tokens are always matched (clients such
         * as lm-eval find BOS/EOS ids by tokenizing their strings), and
         * add_special_tokens only decides whether BOS is prepended. */
        cJSON *asp = cJSON_GetObjectItem(in, "add_special_tokens");
        ds4_token_ids ids = {0};
        if (cJSON_IsTrue(asp))
            ds4_tokenizer_encode(s->tok, DS4_TOK_BOS, strlen(DS4_TOK_BOS), DS4_TOK_SPECIALS_ALL, &ids);
        ds4_tokenizer_encode(s->tok, p->valuestring, strlen(p->valuestring), DS4_TOK_SPECIALS_ALL, &ids);
        cJSON *a = cJSON_AddArrayToObject(o, "tokens");
        for (size_t i = 0; i < ids.n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids.v[i]));
        ds4_token_ids_free(&ids);
    } else {
        cJSON *t = cJSON_GetObjectItem(in, "tokens");
        int n = cJSON_GetArraySize(t);
        int32_t *ids = calloc((size_t)n + 1, sizeof *ids);
        int k = 0;
        for (cJSON *x = cJSON_IsArray(t) ? t->child : NULL; x; x = x->next)
            if (cJSON_IsNumber(x)) ids[k++] = (int32_t)x->valuedouble;
        size_t len = 0;
        char *text = ds4_tokenizer_decode(s->tok, ids, (size_t)k, true, &len);
        cJSON_AddStringToObject(o, "prompt", text ? text : "");
        free(text);
        free(ids);
    }
    cJSON_Delete(in);
    send_json_obj(s, c, hr, 200, o, ka, NULL);
}

/* ---- the worker ----------------------------------------------------- */

typedef struct {
    server *s;
    ds4_http_conn *conn;
    ds4_enc *enc;           /* chat-family keep-alives; NULL for completions */
    ds4_out_fn out;         /* completions keep-alive comments */
    double last_ping;
    bool gone;              /* the client went away */
    bool stopping;          /* the server is shutting down */
} progress_ctx;

static int on_progress(void *ud, int done, int total) {
    (void)done; (void)total;
    progress_ctx *p = ud;
    if (ds4_http_peer_gone(p->conn)) { p->gone = true; return 1; }
    if (g_stop) { p->stopping = true; return 1; }
    if (now_s() - p->last_ping >= KEEPALIVE_SECONDS) {
        p->last_ping = now_s();
        if (p->conn->streaming) ds4_http_stream_write(p->conn, ": prefill\n\n", 11);
        if (p->enc) ds4_enc_keepalive(p->enc);
        if (p->conn->broken) { p->gone = true; return 1; }
    }
    return 0;
}

static int conn_out(void *ud, const char *data, size_t len) {
    return ds4_http_stream_write(ud, data, len);
}

static ds4_enc *job_encoder(server *s, job *j) {
    if (!j->enc) {
        ds4_enc_opts eo = {.req = &j->req, .thinking = effective_think(s, &j->req) != DS4_THINK_NONE,
                           .mem = s->mem, .out = j->req.stream ? conn_out : NULL, .ud = j->conn};
        j->enc = ds4_enc_new(&eo);
    }
    return j->enc;
}

/* 200 + SSE headers, once per response. */
static int open_stream(server *s, job *j) {
    if (j->conn->streaming) return 0;
    char hdr[1024];
    cors_headers(s, j->hreq, hdr, sizeof hdr);
    return ds4_http_stream_begin(j->conn, hdr);
}

/* A request that cannot be served: its status response, or, once its SSE
 * stream is open (a long queue wait opens it early), the family's in-stream
 * error. */
static void job_error(server *s, job *j, int status, const char *msg, const char *param, const char *code,
                      int n_prompt) {
    ds4_http_conn *c = j->conn;
    if (status >= 500) j->keep_alive = false;
    if (!c->streaming) {
        send_error(s, c, j->hreq, status, msg, param, code, n_prompt, j->keep_alive);
        return;
    }
    j->keep_alive = false;
    if (j->req.api == DS4_API_COMPLETIONS) {
        cJSON *o = cJSON_CreateObject(), *er = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(er, "message", msg);
        cJSON_AddStringToObject(er, "type", status >= 500 ? "server_error" : "invalid_request_error");
        cJSON_AddNullToObject(er, "param");
        cJSON_AddNullToObject(er, "code");
        sse_data(c, o);
        ds4_http_stream_write(c, "data: [DONE]\n\n", 14);
    } else if (j->enc) {
        ds4_enc_fail(j->enc, msg, code ? code : status >= 500 ? "server_error" : "invalid_request_error");
    }
    ds4_http_stream_end(c);
}

/* ---- disk KV cache ---- */

static void kv_log(void *ud, bool warning, const char *line) {
    trace(ud, "%s", line);
    if (warning) fprintf(stderr, "ds4-server: %s\n", line);
}

/* A continued save when generation lands on an absolute frontier. */
static void disk_frontier(server *s) {
    if (s->kvd && ds4_kvdisk_is_frontier(ds4_kvdisk_options(s->kvd), ds4_session_n_tokens(s->sess)))
        ds4_kvdisk_save(s->kvd, s->sess, DS4_KVC_CONTINUED);
}

/* Prefills toks[from..n) in slices; 0 ok, 1 cancelled, -1 error. Slices also
 * end at disk-cache save points (a first prompt's stable prefix, absolute
 * frontiers), where the state is saved. */
static int prefill(server *s, const int32_t *toks, int from, int n, progress_ctx *pc, char *err, size_t errlen) {
    for (int i = from; i < n;) {
        int len = n - i < PREFILL_SLICE ? n - i : PREFILL_SLICE, reason = 0;
        int stop = s->kvd ? ds4_kvdisk_prefill_stop(s->kvd, toks, n, i, from == 0, &reason) : -1;
        if (stop > i && stop < i + len) len = stop - i;
        int rc = ds4_session_prefill(s->sess, toks + i, len, NULL, NULL, NULL, err, errlen);
        if (rc) return rc;
        i += len;
        if (i == stop) ds4_kvdisk_save(s->kvd, s->sess, reason);
        if (on_progress(pc, i, n)) return 1;
    }
    return 0;
}

/* The live session's text, decoded byte-exactly. */
static char *live_text(server *s, size_t *len) {
    return ds4_tokenizer_decode(s->tok, ds4_session_tokens(s->sess), (size_t)ds4_session_n_tokens(s->sess), false, len);
}

static bool ids_are_live(server *s, const ds4_request *r) {
    if (!s->n_live_ids || s->live_ids_tokens != ds4_session_n_tokens(s->sess)) return false;
    for (int i = 0; i < r->n_live_ids; i++) {
        bool hit = false;
        for (int j = 0; j < s->n_live_ids && !hit; j++) hit = !strcmp(r->live_ids[i], s->live_ids[j]);
        if (!hit) return false;
    }
    return true;
}

/* The continuation tail for trailing tool results of the live turn:
 * EOS, the tool-result user turn(s), the generation prompt. */
static void render_tail(server *s, const ds4_request *r, ds4_buf *out) {
    int first = r->n_msgs;
    while (first > 0 && r->msgs[first - 1].role != DS4_ROLE_ASSISTANT) first--;
    ds4_buf_puts(out, DS4_STR_EOS);
    bool in_results = false;
    for (int i = first; i < r->n_msgs; i++) {
        const ds4_chat_msg *m = &r->msgs[i];
        const char *c = m->content ? m->content : "";
        if (m->role == DS4_ROLE_TOOL) {
            if (!in_results) ds4_buf_puts(out, DS4_STR_USER);
            ds4_chat_tool_result(c, strlen(c), DS4_CHAT_DS4, out);
            in_results = true;
        } else if (m->role == DS4_ROLE_USER) {
            ds4_buf_puts(out, DS4_STR_USER);
            ds4_buf_puts(out, c);
            in_results = false;
        }
    }
    ds4_buf_puts(out, DS4_STR_ASSISTANT);
    ds4_buf_puts(out, effective_think(s, r) == DS4_THINK_NONE ? DS4_STR_THINK_CLOSE : DS4_STR_THINK_OPEN);
}

typedef struct {
    ds4_token_ids toks;     /* the full prompt */
    int reuse;              /* tokens kept from the live session */
    const char *how;
} plan;

/* toks = the live tokens, then the tokens of text[from..n) on their own. */
static int live_plus(server *s, const char *text, size_t from, size_t n, plan *p, const char *how) {
    int live_n = ds4_session_n_tokens(s->sess);
    ds4_token_ids suffix = {0};
    if (encode(s, text + from, n - from, &suffix)) { ds4_token_ids_free(&suffix); return -1; }
    size_t need = (size_t)live_n + suffix.n + 1;
    if (p->toks.cap < need) {
        int32_t *v = realloc(p->toks.v, need * sizeof *v);
        if (!v) { ds4_token_ids_free(&suffix); return -1; }
        p->toks.v = v;
        p->toks.cap = need;
    }
    memcpy(p->toks.v, ds4_session_tokens(s->sess), (size_t)live_n * sizeof *p->toks.v);
    memcpy(p->toks.v + live_n, suffix.v, suffix.n * sizeof *p->toks.v);
    p->toks.n = (size_t)live_n + suffix.n;
    ds4_token_ids_free(&suffix);
    p->reuse = live_n;
    p->how = how;
    return 0;
}

static bool starts_with(const char *text, size_t n, const ds4_buf *key) {
    return key->len && key->len <= n && !memcmp(text, key->data, key->len);
}

/* Decides what of the live session to keep and tokenizes the rest. */
static int plan_prompt(server *s, const char *text, size_t n, plan *p) {
    int live_n = ds4_session_n_tokens(s->sess);
    const int32_t *live = ds4_session_tokens(s->sess);
    if (encode(s, text, n, &p->toks)) return -1;
    int lcp = 0;
    while (lcp < live_n && (size_t)lcp < p->toks.n && live[lcp] == p->toks.v[lcp]) lcp++;
    if (lcp == live_n && live_n > 0) { p->reuse = live_n; p->how = "exact token prefix"; return 0; }
    if (s->visible_tokens == live_n && live_n > 0) {
        for (int k = 0; k < 2; k++)
            if (starts_with(text, n, &s->visible[k]))
                return live_plus(s, text, s->visible[k].len, n, p, "visible transcript prefix (hidden reasoning)");
    }
    size_t lt_len = 0;
    char *lt = live_n ? live_text(s, &lt_len) : NULL;
    bool text_hit = lt && lt_len <= n && !memcmp(lt, text, lt_len);
    free(lt);
    if (text_hit) return live_plus(s, text, lt_len, n, p, "live text prefix");
    size_t disk = s->kvd ? ds4_kvdisk_restore(s->kvd, s->sess, text, n, lcp) : 0;
    if (disk) {
        s->visible_tokens = -1; /* the live session is another conversation now */
        return live_plus(s, text, disk, n, p, "disk cache");
    }
    p->reuse = lcp;
    p->how = lcp ? "common token prefix" : "cold";
    return 0;
}

/* Remembers the transcript a client will replay for this turn when it does
 * not send the reasoning back (Responses without summaries, chat turns whose
 * reasoning the template drops). */
static void remember_visible(server *s, const ds4_buf *prompt, const ds4_enc *enc) {
    s->visible_tokens = -1;
    size_t open = strlen(DS4_STR_THINK_OPEN), clen, blen;
    /* Only a closed think block makes the live text "<think>R</think>C":
     * an unfinished one has no visible transcript to match. */
    if (!ds4_enc_reasoning_closed(enc) || ds4_enc_stop_matched(enc) || prompt->len < open ||
        memcmp(prompt->data + prompt->len - open, DS4_STR_THINK_OPEN, open)) return;
    const char *content = ds4_enc_content(enc, &clen);
    const char *block = ds4_enc_block(enc, &blen);
    for (int k = 0; k < 2; k++) {
        ds4_buf *v = &s->visible[k];
        ds4_buf_clear(v);
        /* k = 0: empty think block kept (tool context); 1: reasoning dropped */
        ds4_buf_put(v, prompt->data, prompt->len - (k ? open : 0));
        ds4_buf_puts(v, DS4_STR_THINK_CLOSE);
        ds4_buf_put(v, content, clen);
        if (block) ds4_buf_put(v, block, blen);
    }
    s->visible_tokens = ds4_session_n_tokens(s->sess);
}

static int sample_eos(server *s) {
    return ds4_tokenizer_specials(s->tok)->eos;
}

/* Brings the session to toks[0..reuse) then prefills the rest. */
static int load_prompt(server *s, const plan *p, progress_ctx *pc, char *err, size_t errlen) {
    int live_n = ds4_session_n_tokens(s->sess);
    if (p->reuse < live_n && s->kvd && p->reuse < live_n / 2) ds4_kvdisk_save(s->kvd, s->sess, DS4_KVC_EVICT);
    if (p->reuse < live_n && ds4_session_rewind(s->sess, p->reuse, err, errlen)) return -1;
    int rc = prefill(s, p->toks.v, p->reuse, (int)p->toks.n, pc, err, errlen);
    return rc;
}

static ds4_sampler *make_sampler(server *s, const ds4_request *r) {
    ds4_sampler_params sp = r->sampling;
    if (!r->seed_set) sp.seed = ds4_sampler_random_seed();
    return ds4_sampler_new(&sp, s->n_vocab);
}

/* Token text for logprobs: the bytes when they are valid UTF-8, else a
 * lossless "bytes:\xNN" spelling (never silently replaced). */
static char *token_text(server *s, int32_t id) {
    size_t n = 0;
    const char *b = ds4_tokenizer_token_bytes(s->tok, id, &n);
    if (!b) return strdup("");
    if (ds4_utf8_valid(b, n)) return strndup(b, n);
    char *out = malloc(6 + 4 * n + 1);
    size_t o = (size_t)sprintf(out, "bytes:");
    for (size_t i = 0; i < n; i++) o += (size_t)sprintf(out + o, "\\x%02x", (unsigned char)b[i]);
    return out;
}

static cJSON *token_lp(server *s, int32_t id, float lp) {
    cJSON *o = cJSON_CreateObject();
    char *t = token_text(s, id);
    cJSON_AddStringToObject(o, "token", t);
    free(t);
    cJSON_AddNumberToObject(o, "logprob", lp);
    size_t n = 0;
    const char *b = ds4_tokenizer_token_bytes(s->tok, id, &n);
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; b && i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)b[i]));
    return o;
}

/* One chat logprobs entry: raw log-softmax, before temperature/filters. */
static cJSON *chat_lp_entry(server *s, const float *lg, int32_t tok, int k) {
    cJSON *o = token_lp(s, tok, ds4_logprob(lg, s->n_vocab, tok));
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    int ids[20];
    float lps[20];
    int n = k > 0 ? ds4_top_logprobs(lg, s->n_vocab, k > 20 ? 20 : k, ids, lps) : 0;
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(top, token_lp(s, ids[i], lps[i]));
    return o;
}

/* Chat completions, Responses, Messages. */
static void run_chat(server *s, job *j) {
    ds4_request *r = &j->req;
    ds4_http_conn *c = j->conn;
    const ds4_http_req *hr = j->hreq;
    char err[512];
    ds4_buf text = {0};
    plan p = {0};
    ds4_sampler *smp = NULL;
    j->keep_alive = hr->keep_alive;
    ds4_enc *enc = job_encoder(s, j);
    if (!enc) { job_error(s, j, 500, "out of memory", NULL, NULL, 0); goto out; }

    bool tail = r->n_live_ids > 0;
    if (tail && !ids_are_live(s, r)) {
        const char *fam = r->api == DS4_API_MESSAGES ? "Anthropic" : "Responses";
        snprintf(err, sizeof err, "%s continuation state is not available for %s %s; retry by replaying the full %s history",
                 fam, r->api == DS4_API_MESSAGES ? "tool_use_id" : "call_id", r->live_ids[0],
                 r->api == DS4_API_MESSAGES ? "messages" : "input");
        job_error(s, j, 400, err, r->api == DS4_API_MESSAGES ? "messages" : "input", NULL, 0);
        goto out;
    }
    if (tail) {
        size_t lt_len = 0;
        char *lt = live_text(s, &lt_len);
        ds4_buf_put(&text, lt, lt_len);
        free(lt);
        render_tail(s, r, &text);
        if (live_plus(s, text.data, lt_len, text.len, &p, "live tool-call continuation")) {
            job_error(s, j, 500, "tokenization failed", NULL, NULL, 0);
            goto out;
        }
    } else {
        if (!render_prompt(s, r, true, &text, err, sizeof err)) {
            job_error(s, j, 400, err, NULL, NULL, 0);
            goto out;
        }
        if (plan_prompt(s, text.data, text.len, &p)) {
            job_error(s, j, 500, "tokenization failed", NULL, NULL, 0);
            goto out;
        }
    }
    s->n_live_ids = 0; /* any other request replaces the bindings */
    s->visible_tokens = -1;
    int P = (int)p.toks.n;
    trace_text(s, "rendered prompt", text.data ? text.data : "", text.len);
    trace(s, "cache: %s, prompt %d tokens, reused %d, prefill %d", p.how, P, p.reuse, P - p.reuse);

    bool stream = r->stream, thinking = effective_think(s, r) != DS4_THINK_NONE;
    ds4_usage u = {.prompt_tokens = P, .cached_tokens = p.reuse < P ? p.reuse : P};

    if (P >= s->o.ctx) {
        if (r->api == DS4_API_RESPONSES && stream) {
            /* Responses reports an overflow in-stream. */
            if (open_stream(s, j)) goto out;
            ds4_enc_begin(enc, &u);
            snprintf(err, sizeof err, "Your input exceeds the context window of this model. This model's maximum context length is %d tokens; the request has %d prompt tokens.", s->o.ctx, P);
            job_error(s, j, 400, err, "input", "context_length_exceeded", P);
        } else if (r->api == DS4_API_MESSAGES) {
            snprintf(err, sizeof err, "prompt is too long: %d tokens > %d maximum", P, s->o.ctx - 1);
            job_error(s, j, 400, err, NULL, NULL, P);
        } else {
            snprintf(err, sizeof err, "This model's maximum context length is %d tokens. However, your request has %d prompt tokens (the request exceeds the available context size).", s->o.ctx, P);
            job_error(s, j, 400, err, r->api == DS4_API_CHAT ? "messages" : "input", "context_length_exceeded", P);
        }
        goto out;
    }

    if (stream) {
        if (open_stream(s, j)) goto out;
        ds4_enc_begin(enc, &u);
    }
    progress_ctx pc = {.s = s, .conn = c, .enc = enc, .last_ping = now_s()};
    int rc = load_prompt(s, &p, &pc, err, sizeof err);
    if (rc == 1 && pc.gone) { trace(s, "client went away during prefill"); j->keep_alive = false; goto out; }
    if (rc == 1) snprintf(err, sizeof err, "server shutting down");
    if (rc) {
        trace(s, "prefill failed: %s", err);
        job_error(s, j, pc.stopping ? 503 : 500, err, NULL, NULL, 0);
        goto out;
    }

    int budget = s->o.ctx - P;
    int limit = r->max_tokens >= 0 ? r->max_tokens : s->o.default_max_tokens;
    if (limit > budget) limit = budget;
    smp = make_sampler(s, r);
    ds4_detok dt;
    ds4_detok_init(&dt);
    char piece[DS4_DETOK_OUT_MAX];
    ds4_token_ids script = {0};
    if (s->script) encode(s, s->script, s->script_len, &script);
    ds4_buf gen = {0};
    ds4_cause cause = DS4_CAUSE_EOS;
    bool stopped = false;
    const int eos = sample_eos(s);
    for (int i = 0; !stopped; i++) {
        if (i >= limit) { cause = DS4_CAUSE_LENGTH; break; }
        if (ds4_http_peer_gone(c)) { pc.gone = true; break; }
        if (g_stop) { pc.stopping = true; break; }
        int tok;
        const float *lg = ds4_session_logits(s->sess);
        if (s->script) tok = (size_t)i < script.n ? script.v[i] : eos;
        else tok = ds4_sampler_sample(smp, lg, ds4_enc_in_structure(enc));
        if (tok == eos) break;
        if (ds4_enc_wants_logprobs(enc) && ds4_enc_in_content(enc))
            ds4_enc_logprob(enc, chat_lp_entry(s, lg, tok, r->logprobs));
        bool reasoning = ds4_enc_in_reasoning(enc);
        u.completion_tokens++;
        if (reasoning) u.reasoning_tokens++;
        size_t k = ds4_detok_push(&dt, s->tok, tok, piece);
        ds4_buf_put(&gen, piece, k);
        stopped = ds4_enc_feed(enc, piece, k);
        if (ds4_session_n_tokens(s->sess) < s->o.ctx &&
            ds4_session_decode(s->sess, tok, err, sizeof err)) {
            trace(s, "decode failed: %s", err);
            break;
        }
        disk_frontier(s);
    }
    size_t k = ds4_detok_flush(&dt, piece);
    if (k) { ds4_buf_put(&gen, piece, k); ds4_enc_feed(enc, piece, k); }
    ds4_token_ids_free(&script);
    trace_text(s, "generated", gen.data ? gen.data : "", gen.len);
    ds4_buf_free(&gen);
    if (pc.gone || ds4_enc_broken(enc)) {
        trace(s, "client went away during generation after %d tokens", u.completion_tokens);
        j->keep_alive = false;
        goto out;
    }
    if (pc.stopping) {
        job_error(s, j, 503, "server shutting down", NULL, NULL, 0);
        goto out;
    }
    ds4_enc_finish(enc, cause, &u);
    if (ds4_enc_error(enc)) trace(s, "tool parser: %s", ds4_enc_error(enc));
    size_t blen;
    const char *block = ds4_enc_block(enc, &blen);
    const char *ids[MAX_LIVE_CALLS];
    int nids = ds4_enc_call_ids(enc, ids, MAX_LIVE_CALLS);
    if (block && nids) {
        ds4_toolmem_put(s->mem, ids, nids, block, blen);
        for (int i = 0; i < nids; i++) snprintf(s->live_ids[i], sizeof s->live_ids[i], "%s", ids[i]);
        s->n_live_ids = nids;
        s->live_ids_tokens = ds4_session_n_tokens(s->sess);
        trace(s, "tool calls: %d, exact DSML block remembered (%zu bytes), first id %s", nids, blen, ids[0]);
    }
    if (thinking) remember_visible(s, &text, enc);
    trace(s, "usage: prompt %d cached %d completion %d reasoning %d", u.prompt_tokens, u.cached_tokens,
          u.completion_tokens, u.reasoning_tokens);
    if (stream) {
        ds4_http_stream_end(c);
    } else {
        size_t n;
        const char *b = ds4_enc_body(enc, &n);
        char hdr[1024];
        cors_headers(s, hr, hdr, sizeof hdr);
        ds4_http_respond(c, 200, "application/json", b, n, j->keep_alive, hdr);
    }
out:
    ds4_sampler_free(smp);
    ds4_token_ids_free(&p.toks);
    ds4_buf_free(&text);
}

/* ---- legacy completions ------------------------------------------- */

typedef struct {
    cJSON *tokens, *token_logprobs, *top_logprobs, *text_offset;
} lp_arrays;

static void lp_init(lp_arrays *a) {
    a->tokens = cJSON_CreateArray();
    a->token_logprobs = cJSON_CreateArray();
    a->top_logprobs = cJSON_CreateArray();
    a->text_offset = cJSON_CreateArray();
}

/* {token_text: logprob} of the k most likely tokens plus the actual one;
 * on a text collision the higher logprob (listed first) is kept. */
static cJSON *lp_top(server *s, const float *logits, int32_t id, int k) {
    int ids[21];
    float lps[21];
    int kk = ds4_top_logprobs(logits, s->n_vocab, k < 1 ? 1 : k > 20 ? 20 : k, ids, lps);
    ids[kk] = id;
    lps[kk] = ds4_logprob(logits, s->n_vocab, id);
    cJSON *top = cJSON_CreateObject();
    for (int i = 0; i <= kk; i++) {
        char *tt = token_text(s, ids[i]);
        if (!cJSON_GetObjectItemCaseSensitive(top, tt)) cJSON_AddNumberToObject(top, tt, lps[i]);
        free(tt);
    }
    return top;
}

/* Adds one position: logits == NULL for the first prompt token (no context). */
static void lp_add(server *s, lp_arrays *a, const float *logits, int32_t id, int k, size_t offset) {
    char *t = token_text(s, id);
    cJSON_AddItemToArray(a->tokens, cJSON_CreateString(t));
    free(t);
    cJSON_AddItemToArray(a->text_offset, cJSON_CreateNumber((double)offset));
    cJSON_AddItemToArray(a->token_logprobs, logits ? cJSON_CreateNumber(ds4_logprob(logits, s->n_vocab, id))
                                                   : cJSON_CreateNull());
    cJSON_AddItemToArray(a->top_logprobs, logits ? lp_top(s, logits, id, k) : cJSON_CreateNull());
}

/* Fills position i (entered with null values) once its logits are known. */
static void lp_set(server *s, lp_arrays *a, int i, const float *logits, int32_t id, int k) {
    cJSON_ReplaceItemInArray(a->token_logprobs, i, cJSON_CreateNumber(ds4_logprob(logits, s->n_vocab, id)));
    cJSON_ReplaceItemInArray(a->top_logprobs, i, lp_top(s, logits, id, k));
}

static cJSON *lp_object(lp_arrays *a) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "tokens", a->tokens);
    cJSON_AddItemToObject(o, "token_logprobs", a->token_logprobs);
    cJSON_AddItemToObject(o, "top_logprobs", a->top_logprobs);
    cJSON_AddItemToObject(o, "text_offset", a->text_offset);
    return o;
}

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

static void run_completions(server *s, job *j) {
    ds4_request *r = &j->req;
    ds4_http_conn *c = j->conn;
    const ds4_http_req *hr = j->hreq;
    j->keep_alive = hr->keep_alive;
    char err[512], id[40] = "cmpl-";
    ds4_random_hex(id + 5, 12);
    long long created = (long long)time(NULL);
    bool logprobs = r->logprobs >= 0;
    ds4_usage total = {0};
    cJSON *choices = cJSON_CreateArray();
    ds4_token_ids *prompts = calloc((size_t)r->n_prompts, sizeof *prompts);
    int eos = sample_eos(s);

    /* Tokenize (and validate) every prompt before answering anything. */
    for (int i = 0; i < r->n_prompts; i++) {
        const ds4_prompt *pr = &r->prompts[i];
        if (pr->ids) {
            for (int k = 0; k < pr->n_ids; k++) {
                if (pr->ids[k] >= s->n_vocab) {
                    snprintf(err, sizeof err, "prompt token id %d is outside the vocabulary (%d)", pr->ids[k], s->n_vocab);
                    job_error(s, j, 400, err, "prompt", "invalid_value", 0);
                    goto out;
                }
            }
            prompts[i].v = malloc(sizeof(int32_t) * (size_t)(pr->n_ids ? pr->n_ids : 1));
            memcpy(prompts[i].v, pr->ids, sizeof(int32_t) * (size_t)pr->n_ids);
            prompts[i].n = prompts[i].cap = (size_t)pr->n_ids;
        } else if (s->o.completions_chat) {
            ds4_chat_msg m[2] = {{.role = DS4_ROLE_SYSTEM, .content = "You are a helpful assistant"},
                                 {.role = DS4_ROLE_USER, .content = pr->text}};
            ds4_chat_opts o;
            ds4_chat_opts_default(&o);
            o.think = effective_think(s, r);
            o.ctx = s->o.ctx;
            ds4_buf t = {0};
            ds4_chat_render(m, 2, &o, &t, err, sizeof err);
            encode(s, t.data ? t.data : "", t.len, &prompts[i]);
            ds4_buf_free(&t);
        } else {
            encode(s, pr->text, pr->text_len, &prompts[i]);
        }
        if (prompts[i].n == 0 || (int)prompts[i].n >= s->o.ctx) {
            if (prompts[i].n == 0) snprintf(err, sizeof err, "prompt is empty");
            else snprintf(err, sizeof err, "This model's maximum context length is %d tokens. However, your request has %zu prompt tokens (the request exceeds the available context size).", s->o.ctx, prompts[i].n);
            job_error(s, j, 400, err, "prompt", prompts[i].n ? "context_length_exceeded" : NULL, (int)prompts[i].n);
            goto out;
        }
    }
    s->n_live_ids = 0;
    s->visible_tokens = -1;
    if (r->stream && open_stream(s, j)) goto out;
    progress_ctx pc = {.s = s, .conn = c, .last_ping = now_s()};
    float *row = malloc(sizeof(float) * (size_t)s->n_vocab * ECHO_SLICE);
    for (int i = 0; i < r->n_prompts && !pc.gone; i++) {
        ds4_token_ids *pt = &prompts[i];
        int P = (int)pt->n;
        bool echo_lp = logprobs && r->echo;
        /* Echo logprobs need fresh logits at every prompt position, so the
         * cache is not used for them (never fabricate cached values). */
        plan p = {.toks = *pt, .reuse = 0};
        if (!echo_lp) {
            int live_n = ds4_session_n_tokens(s->sess);
            const int32_t *live = ds4_session_tokens(s->sess);
            while (p.reuse < live_n && p.reuse < P && live[p.reuse] == pt->v[p.reuse]) p.reuse++;
        }
        ds4_buf text = {0};
        lp_arrays lpa;
        if (logprobs) lp_init(&lpa);
        if (r->echo) {
            size_t n = 0;
            char *pt_text = ds4_tokenizer_decode(s->tok, pt->v, pt->n, false, &n);
            if (echo_lp) {
                size_t off = 0;
                for (int k = 0; k < P; k++) {
                    size_t tl = 0;
                    ds4_tokenizer_token_bytes(s->tok, pt->v[k], &tl);
                    lp_add(s, &lpa, NULL, pt->v[k], r->logprobs, off);
                    off += tl;
                }
            }
            ds4_buf_put(&text, pt_text, n);
            if (r->stream && n) sse_data(c, cmpl_chunk(id, created, r, i, pt_text, n, NULL));
            free(pt_text);
        }
        int rc;
        if (echo_lp) {
            if (ds4_session_n_tokens(s->sess) && ds4_session_rewind(s->sess, 0, err, sizeof err)) { rc = -1; goto fail; }
            rc = 0;
            for (int k = 0; k < P && !rc; k += ECHO_SLICE) {
                int len = P - k < ECHO_SLICE ? P - k : ECHO_SLICE;
                rc = ds4_session_prefill(s->sess, pt->v + k, len, row, NULL, NULL, err, sizeof err);
                /* row q predicts token k+q+1: fill position k+q+1's entry */
                for (int q = 0; q < len && !rc && k + q + 1 < P; q++)
                    lp_set(s, &lpa, k + q + 1, row + (size_t)q * s->n_vocab, pt->v[k + q + 1], r->logprobs);
                if (!rc && on_progress(&pc, k + len, P)) rc = 1;
            }
        } else {
            rc = load_prompt(s, &p, &pc, err, sizeof err);
        }
    fail:
        if (rc) {
            ds4_buf_free(&text);
            if (logprobs) cJSON_Delete(lp_object(&lpa));
            if (rc == 1 && pc.gone) { j->keep_alive = false; goto out_row; }
            job_error(s, j, rc == 1 ? 503 : 500, rc == 1 ? "server shutting down" : err, NULL, NULL, 0);
            goto out_row;
        }
        int limit = r->max_tokens >= 0 ? r->max_tokens : s->o.default_max_tokens;
        if (limit > s->o.ctx - P) limit = s->o.ctx - P;
        ds4_sampler *smp = make_sampler(s, r);
        ds4_stopper st;
        ds4_stopper_init(&st, r->stop, r->n_stop);
        ds4_detok dt;
        ds4_detok_init(&dt);
        char piece[DS4_DETOK_OUT_MAX];
        const char *finish = "stop";
        int G = 0;
        for (int g = 0;; g++) {
            if (g >= limit) { finish = "length"; break; }
            if (ds4_http_peer_gone(c)) { pc.gone = true; break; }
            if (g_stop) { pc.stopping = true; break; }
            const float *lg = ds4_session_logits(s->sess);
            int tok = ds4_sampler_sample(smp, lg, false);
            G++;
            if (logprobs) lp_add(s, &lpa, lg, tok, r->logprobs, text.len);
            if (tok == eos) break;
            size_t k = ds4_detok_push(&dt, s->tok, tok, piece);
            const char *span;
            size_t rel = ds4_stopper_push(&st, piece, k, &span);
            ds4_buf_put(&text, span, rel);
            if (r->stream && rel) sse_data(c, cmpl_chunk(id, created, r, i, span, rel, NULL));
            if (st.matched >= 0) break;
            if (ds4_session_n_tokens(s->sess) < s->o.ctx && ds4_session_decode(s->sess, tok, err, sizeof err)) break;
            disk_frontier(s);
        }
        size_t k = ds4_detok_flush(&dt, piece);
        const char *span;
        size_t rel = k ? ds4_stopper_push(&st, piece, k, &span) : 0;
        if (rel) ds4_buf_put(&text, span, rel);
        if (r->stream && rel) sse_data(c, cmpl_chunk(id, created, r, i, span, rel, NULL));
        rel = ds4_stopper_flush(&st, &span);
        if (rel) ds4_buf_put(&text, span, rel);
        if (r->stream && rel) sse_data(c, cmpl_chunk(id, created, r, i, span, rel, NULL));
        ds4_stopper_free(&st);
        ds4_sampler_free(smp);
        if (pc.stopping) {
            ds4_buf_free(&text);
            if (logprobs) cJSON_Delete(lp_object(&lpa));
            job_error(s, j, 503, "server shutting down", NULL, NULL, 0);
            goto out_row;
        }
        total.prompt_tokens += P;
        total.cached_tokens += p.reuse;
        total.completion_tokens += G;
        trace(s, "completion %d: prompt %d reused %d generated %d", i, P, p.reuse, G);
        if (r->stream) {
            cJSON *ch = cmpl_chunk(id, created, r, i, "", 0, finish);
            if (logprobs) cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(ch, "choices"), 0), "logprobs", lp_object(&lpa));
            sse_data(c, ch);
        } else {
            cJSON *ch = cJSON_CreateObject();
            cJSON_AddNumberToObject(ch, "index", i);
            cJSON_AddStringToObject(ch, "text", text.data ? text.data : "");
            if (logprobs) cJSON_AddItemToObject(ch, "logprobs", lp_object(&lpa));
            else cJSON_AddNullToObject(ch, "logprobs");
            cJSON_AddStringToObject(ch, "finish_reason", finish);
            cJSON_AddItemToArray(choices, ch);
        }
        ds4_buf_free(&text);
    }
    if (pc.gone) { j->keep_alive = false; goto out_row; }
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
            sse_data(c, o);
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
        send_json_obj(s, c, hr, 200, o, j->keep_alive, NULL);
    }
out_row:
    free(row);
out:
    for (int i = 0; i < r->n_prompts; i++) ds4_token_ids_free(&prompts[i]);
    free(prompts);
    cJSON_Delete(choices);
}

static void *worker_main(void *ud) {
    server *s = ud;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->head && !s->stopping) pthread_cond_wait(&s->cv, &s->mu);
        job *j = s->head;
        if (j) {
            s->head = j->next;
            if (!s->head) s->tail = NULL;
            j->running = true;
            while (j->writing) pthread_cond_wait(&s->cv, &s->mu);
        }
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (!j) break;
        if (stopping) {
            job_error(s, j, 503, "server shutting down", NULL, NULL, 0);
        } else if (ds4_http_peer_gone(j->conn)) {
            trace(s, "queued request dropped: client went away");
            j->keep_alive = false;
        } else if (j->req.api == DS4_API_COMPLETIONS) {
            run_completions(s, j);
        } else {
            run_chat(s, j);
        }
        pthread_mutex_lock(&s->mu);
        j->done = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---- connections ---------------------------------------------------- */

static void unlink_job(server *s, job *j) {
    job *prev = NULL;
    for (job *q = s->head; q; prev = q, q = q->next) {
        if (q != j) continue;
        if (prev) prev->next = j->next; else s->head = j->next;
        if (s->tail == j) s->tail = prev;
        return;
    }
}

/* Keep-alive for a streamed request still in the queue: the SSE stream
 * opens and gets what prefill would send (server-api.md 1.4); Messages'
 * message_start waits for the token counts, pings go first. */
static void queued_keepalive(server *s, job *j) {
    if (open_stream(s, j)) return;
    ds4_http_stream_write(j->conn, ": queued\n\n", 10);
    if (j->req.api != DS4_API_COMPLETIONS && job_encoder(s, j)) ds4_enc_keepalive(j->enc);
}

/* Waits (s->mu held) until the worker takes j or its client leaves. A
 * streamed request keeps getting keep-alives meanwhile, so a long queue
 * does not trip client idle timers; a client that disconnects takes its job
 * out of the queue, so it never runs. The worker is never held up for more
 * than one write (it waits for `writing` to clear). */
static void wait_queued(server *s, job *j) {
    double next_ping = now_s() + KEEPALIVE_SECONDS;
    while (!j->running && !j->done) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += QUEUE_POLL_MS * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        if (j->running || j->done) break;
        j->writing = true;
        pthread_mutex_unlock(&s->mu);
        bool gone = ds4_http_peer_gone(j->conn);
        if (!gone && j->req.stream && now_s() >= next_ping) {
            next_ping = now_s() + KEEPALIVE_SECONDS;
            queued_keepalive(s, j);
            gone = j->conn->broken;
        }
        pthread_mutex_lock(&s->mu);
        j->writing = false;
        pthread_cond_broadcast(&s->cv);
        if (gone && !j->running) {
            unlink_job(s, j);
            j->keep_alive = false;
            j->done = true;
            trace(s, "queued request left the queue: client went away");
        }
    }
}

typedef struct {
    server *s;
    int fd;
} conn_arg;

static ds4_api route_api(const char *path) {
    if (!strcmp(path, "/v1/chat/completions")) return DS4_API_CHAT;
    if (!strcmp(path, "/v1/completions")) return DS4_API_COMPLETIONS;
    if (!strcmp(path, "/v1/responses")) return DS4_API_RESPONSES;
    if (!strcmp(path, "/v1/messages")) return DS4_API_MESSAGES;
    return (ds4_api)-1;
}

/* Handles one request; returns whether the connection stays open. */
static bool handle(server *s, ds4_http_conn *c, ds4_http_req *hr, ds4_buf *body) {
    bool ka = hr->keep_alive;
    const char *m = hr->method, *path = hr->path;
    if (!strcmp(m, "OPTIONS")) {
        char hdr[1024];
        cors_headers(s, hr, hdr, sizeof hdr);
        ds4_http_respond(c, 204, NULL, NULL, 0, ka, hdr);
        return ka;
    }
    bool get = !strcmp(m, "GET"), post = !strcmp(m, "POST");
    if (get && (!strcmp(path, "/v1/models") || !strncmp(path, "/v1/models/", 11))) { route_models(s, c, hr, ka); return ka; }
    if (get && !strcmp(path, "/health")) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
        send_json_obj(s, c, hr, 200, o, ka, NULL);
        return ka;
    }
    if ((get && !strcmp(path, "/tokenizer_info")) || (post && (!strcmp(path, "/tokenize") || !strcmp(path, "/detokenize")))) {
        route_tokenizer(s, c, hr, body, ka);
        return ka;
    }
    if (post && !strcmp(path, "/v1/messages/count_tokens")) { route_count_tokens(s, c, hr, body, ka); return ka; }
    ds4_api api = route_api(path);
    if (!post || (int)api < 0) {
        send_error(s, c, hr, 404, "unknown endpoint", NULL, NULL, 0, ka);
        return ka;
    }
    job j = {.conn = c, .hreq = hr};
    ds4_req_error e;
    if (ds4_request_decode(api, body->data ? body->data : "", body->len, &j.req, &e)) {
        send_error(s, c, hr, e.status, e.message, e.param, e.code, 0, ka);
        return ka;
    }
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        ds4_request_free(&j.req);
        send_error(s, c, hr, 503, "server shutting down", NULL, NULL, 0, false);
        return false;
    }
    if (s->tail) s->tail->next = &j; else s->head = &j;
    s->tail = &j;
    pthread_cond_broadcast(&s->cv);
    wait_queued(s, &j);
    while (!j.done) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    ds4_enc_free(j.enc);
    ds4_request_free(&j.req);
    return j.keep_alive && !c->broken && !c->http10;
}

static void *conn_main(void *ud) {
    conn_arg a = *(conn_arg *)ud;
    free(ud);
    server *s = a.s;
    ds4_http_conn c = {.fd = a.fd, .lim = s->o.limits};
    ds4_http_req hr;
    ds4_buf body = {0};
    for (;;) {
        memset(&hr, 0, sizeof hr);
        int rc = ds4_http_read_request(&c, &hr, &body);
        if (rc == 1) break;
        if (rc < 0) {
            int status = -rc;
            if (status != 408 || c.in.len) {
                ds4_http_req *h = hr.path[0] ? &hr : NULL;
                send_error(s, &c, h, status, http_error_text(status), NULL, NULL, 0, false);
            }
            /* Lingering close: closing with unread input makes the kernel send
             * a reset that can destroy the error response in flight. */
            shutdown(a.fd, SHUT_WR);
            char sink[65536];
            struct pollfd pf = {.fd = a.fd, .events = POLLIN};
            for (int i = 0; i < 64 && poll(&pf, 1, 1000) > 0 && recv(a.fd, sink, sizeof sink, 0) > 0; i++) {}
            break;
        }
        if (!handle(s, &c, &hr, &body)) break;
    }
    ds4_buf_free(&body);
    ds4_buf_free(&c.in);
    close(a.fd);
    pthread_mutex_lock(&s->mu);
    s->n_conns--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* IPv4 or IPv6 literal; "localhost" = 127.0.0.1. */
static int listen_on(const char *host, int port, char *err, size_t errlen) {
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        len = sizeof *v4;
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        len = sizeof *v6;
    } else {
        snprintf(err, errlen, "invalid --host '%s' (an IPv4 or IPv6 address)", host);
        return -1;
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, len) || listen(fd, 512)) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

void ds4_server_opts_default(ds4_server_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->ctx = 32768;
    o->default_max_tokens = 393216;
    o->model_path = "ds4flash.gguf";
    o->tool_memory_max_ids = 100000;
    ds4_kvdisk_opts_default(&o->kvdisk);
    ds4_http_limits_default(&o->limits);
    ds4_gpu_opts_default(&o->gpu);
}

int ds4_server_run(const ds4_server_opts *opts) {
    static server S;
    server *s = &S;
    s->o = *opts;
    char err[512];
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->trace_mu, NULL);
    if (s->o.trace_path && !(s->trace = fopen(s->o.trace_path, "a"))) {
        fprintf(stderr, "ds4-server: cannot open trace file %s: %s\n", s->o.trace_path, strerror(errno));
        return 1;
    }
    if (s->o.scripted_output && !(s->script = ds4_read_file(s->o.scripted_output, &s->script_len))) {
        fprintf(stderr, "ds4-server: cannot read %s\n", s->o.scripted_output);
        return 1;
    }
    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = s->o.model_path;
    ep.n_threads = s->o.threads;
    ep.gpu = s->o.gpu;
    ep.gpu_ctx = s->o.ctx;
    s->eng = ds4_engine_load(&ep, err, sizeof err);
    if (!s->eng) { fprintf(stderr, "ds4-server: %s\n", err); return 1; }
    s->tok = ds4_engine_tokenizer(s->eng);
    if (!s->tok) { fprintf(stderr, "ds4-server: %s has no tokenizer\n", s->o.model_path); ds4_engine_free(s->eng); return 1; }
    s->n_vocab = ds4_engine_n_vocab(s->eng);
    s->sess = ds4_session_new(s->eng, s->o.ctx, err, sizeof err);
    if (!s->sess) { fprintf(stderr, "ds4-server: %s\n", err); ds4_engine_free(s->eng); return 1; }
    s->mem = ds4_toolmem_new(s->o.tool_memory_max_ids, (size_t)512 << 20);
    if (s->o.kvdisk.dir && !(s->kvd = ds4_kvdisk_open(&s->o.kvdisk, s->eng, s->mem, kv_log, s, err, sizeof err))) {
        fprintf(stderr, "ds4-server: %s\n", err);
        return 1;
    }
    struct pollfd lfds[2] = {{.fd = listen_on(s->o.host, s->o.port, err, sizeof err), .events = POLLIN},
                             {.fd = -1, .events = POLLIN}};
    if (lfds[0].fd < 0) { fprintf(stderr, "ds4-server: %s\n", err); return 1; }
    /* Clients configured with "localhost" may try ::1 first. */
    if (!strcmp(s->o.host, "127.0.0.1") || !strcmp(s->o.host, "localhost"))
        lfds[1].fd = listen_on("::1", s->o.port, err, sizeof err);

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t worker;
    pthread_create(&worker, NULL, worker_main, s);
    fprintf(stderr, "ds4-server: listening on http://%s:%d (ctx %d)\n", s->o.host, s->o.port, s->o.ctx);
    trace(s, "server start: model %s ctx %d", s->o.model_path, s->o.ctx);

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    while (!g_stop) {
        if (poll(lfds, 2, 200) <= 0) continue;
        int fd = accept4(lfds[lfds[0].revents & POLLIN ? 0 : 1].fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pthread_mutex_lock(&s->mu);
        bool full = s->n_conns >= MAX_CONNECTIONS;
        if (!full) s->n_conns++;
        pthread_mutex_unlock(&s->mu);
        conn_arg *a = full ? NULL : malloc(sizeof *a);
        pthread_t th;
        if (a) { a->s = s; a->fd = fd; }
        if (!a || pthread_create(&th, &attr, conn_main, a)) {
            static const char busy[] = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
            send(fd, busy, sizeof busy - 1, MSG_NOSIGNAL);
            close(fd);
            free(a);
            if (!full) { pthread_mutex_lock(&s->mu); s->n_conns--; pthread_mutex_unlock(&s->mu); }
        }
    }
    for (int i = 0; i < 2; i++)
        if (lfds[i].fd >= 0) close(lfds[i].fd);
    fprintf(stderr, "ds4-server: shutting down\n");
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(worker, NULL);
    if (s->kvd) {
        ds4_kvdisk_save(s->kvd, s->sess, DS4_KVC_SHUTDOWN);
        ds4_kvdisk_close(s->kvd);
    }
    /* Connection threads may still be reading; give them a moment. */
    for (int i = 0; i < 50; i++) {
        pthread_mutex_lock(&s->mu);
        int n = s->n_conns;
        pthread_mutex_unlock(&s->mu);
        if (!n) break;
        usleep(20000);
    }
    trace(s, "server stop");
    return 0;
}
