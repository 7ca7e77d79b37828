#include "quality/eval_run.h"
#include "base/log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json_util.h"
#include "text/tokenizer.h"

double ds4_eval_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool thinking(const ds4_eval_run *r) { return r->o.think != DS4_THINK_NONE; }

/* The question as the model sees it: one user turn, the generation prompt. */
static int render(const ds4_eval_run *r, const ds4_eval_question *q, ds4_buf *text, ds4_token_ids *ids, char *err, size_t errlen) {
    ds4_buf user = {0};
    ds4_eval_prompt(q, &user);
    ds4_chat_msg m = {.role = DS4_ROLE_USER, .content = user.data ? user.data : ""};
    ds4_chat_opts co;
    ds4_chat_opts_default(&co);
    co.profile = ds4_chat_profile_for(r->tok);
    co.think = r->o.think;
    ds4_chat_spans spans = {0};
    co.client_spans = &spans;
    int rc = 0;
    if (user.oom || !ds4_chat_render(&m, 1, &co, text, err, errlen)) rc = -1;
    /* the question text is ours, but it quotes code: never protocol tokens */
    else if (text->oom || spans.oom || ds4_chat_encode(r->tok, text->data, 0, text->len, &spans, ids)) {
        snprintf(err, errlen, "out of memory");
        rc = -1;
    }
    ds4_chat_spans_free(&spans);
    ds4_buf_free(&user);
    return rc;
}

int ds4_eval_prepare(ds4_eval_run *r, ds4_engine *e, const int *ids, int n, const ds4_eval_opts *o, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    r->e = e;
    r->tok = ds4_engine_tokenizer(e);
    r->o = *o;
    if (!r->tok) { snprintf(err, errlen, "this model has no tokenizer"); return -1; }
    r->items = calloc((size_t)(n ? n : 1), sizeof *r->items);
    if (!r->items) { snprintf(err, errlen, "out of memory"); return -1; }
    r->n = n;
    size_t longest = 0;
    for (int i = 0; i < n; i++) {
        ds4_eval_item *it = &r->items[i];
        it->q = ds4_eval_question_by_id(ids[i]);
        ds4_buf text = {0};
        int rc = it->q ? render(r, it->q, &text, &it->prompt, err, errlen) : -1;
        if (!it->q) snprintf(err, errlen, "no question %d", ids[i]);
        ds4_buf_free(&text);
        if (rc) { ds4_eval_run_free(r); return -1; }
        if (it->prompt.n > longest) longest = it->prompt.n;
    }
    static const char close[] = DS4_STR_THINK_CLOSE "\n\n";
    if (ds4_tokenizer_encode(r->tok, close, sizeof close - 1, DS4_TOK_SPECIALS_CHAT, &r->close)) {
        snprintf(err, errlen, "out of memory");
        ds4_eval_run_free(r);
        return -1;
    }
    long need = (long)longest + o->max_tokens;
    int train = ds4_engine_train_ctx(e);
    if (train > 0 && need > train) {
        snprintf(err, errlen, "the run needs %ld context tokens (largest prompt %zu + --tokens %d), more than the model's %d",
                 need, longest, o->max_tokens, train);
        ds4_eval_run_free(r);
        return -1;
    }
    r->ctx = (int)need;
    return 0;
}

void ds4_eval_run_free(ds4_eval_run *r) {
    for (int i = 0; i < r->n; i++) { ds4_token_ids_free(&r->items[i].prompt); free(r->items[i].output); }
    free(r->items);
    ds4_token_ids_free(&r->close);
    memset(r, 0, sizeof *r);
}

static void trace_int(ds4_buf *b, const char *key, long v) {
    char num[32];
    snprintf(num, sizeof num, "%s\"%s\":%ld", b->len ? "," : "", key, v);
    ds4_buf_puts(b, num);
}

void ds4_eval_trace_header(const ds4_eval_run *r, const ds4_sampler_params *sp) {
    if (!r->o.trace) return;
    ds4_buf b = {0};
    char head[256];
    snprintf(head, sizeof head, "\"ds4_eval_trace\":1,\"thinking\":%s,\"tokens\":%d,\"think_soft\":%d,\"think_hard\":%d,"
             "\"ctx\":%d,\"temp\":%g,\"seed\":%llu",
             thinking(r) ? "true" : "false", r->o.max_tokens, r->o.think_soft, r->o.think_hard, r->ctx, sp->temperature,
             (unsigned long long)sp->seed);
    ds4_buf_puts(&b, head);
    const char *model = ds4_engine_model_name(r->e);
    ds4_eval_trace_str(&b, "model", model, model ? strlen(model) : 0);
    ds4_eval_trace_emit(r->o.trace, &b);
    ds4_buf_free(&b);
}

/* ------------------------------------------------------------ one item */

typedef struct {
    ds4_eval_run *r;
    const ds4_eval_view *v;
    int item;
    const ds4_token_ids *script;    /* NULL: the sampler decides */
    bool in_think, line_end;
    int think_tokens;
    int closing;                    /* next index into r->close; -1 = not closing */
    ds4_buf out;
    bool stopped;
} gen_state;

static bool hook_cancelled(void *ud) {
    gen_state *g = ud;
    if (g->v && g->v->poll && g->v->poll(g->v->ud)) g->stopped = true;
    return g->stopped;
}

static int hook_forced(void *ud, int step) {
    gen_state *g = ud;
    if (g->script) return (size_t)step < g->script->n ? g->script->v[step] : ds4_tokenizer_specials(g->r->tok)->eos;
    const ds4_token_ids *c = &g->r->close;
    if (g->closing < 0 && g->in_think &&
        (g->think_tokens >= g->r->o.think_hard || (g->think_tokens >= g->r->o.think_soft && g->line_end)))
        g->closing = 0;
    if (g->closing >= 0 && (size_t)g->closing < c->n) return c->v[g->closing++];
    return -1;
}

static void hook_token(void *ud, int32_t tok, const float *logits) {
    (void)logits;
    gen_state *g = ud;
    if (g->in_think) g->think_tokens++;
    if (!g->r->o.trace) return;
    /* the record stays valid UTF-8: the token's text with U+FFFD for a
     * partial character, its exact bytes in hex */
    size_t len = 0, nb = 0;
    char *text = ds4_tokenizer_decode(g->r->tok, &tok, 1, true, &len);
    const char *bytes = ds4_tokenizer_token_bytes(g->r->tok, tok, &nb);
    ds4_buf b = {0}, hex = {0};
    for (size_t i = 0; bytes && i < nb; i++) {
        char h[3];
        snprintf(h, sizeof h, "%02x", (unsigned char)bytes[i]);
        ds4_buf_put(&hex, h, 2);
    }
    trace_int(&b, "q", g->r->items[g->item].q->id);
    trace_int(&b, "tok", tok);
    ds4_eval_trace_str(&b, "text", text, text ? len : 0);
    ds4_eval_trace_str(&b, "bytes", hex.data, hex.len);
    ds4_eval_trace_emit(g->r->o.trace, &b);
    ds4_buf_free(&b);
    ds4_buf_free(&hex);
    free(text);
}

static bool hook_text(void *ud, const char *text, size_t len) {
    gen_state *g = ud;
    size_t before = g->out.len;
    ds4_buf_put(&g->out, text, len);
    if (g->in_think && g->out.data) {
        /* the close may straddle two pieces */
        size_t from = before >= 8 ? before - 8 : 0;
        if (memmem(g->out.data + from, g->out.len - from, DS4_STR_THINK_CLOSE, 8)) g->in_think = false;
    }
    if (len) g->line_end = text[len - 1] == '\n';
    if (g->v && g->v->text) g->v->text(g->v->ud, text, len);
    return false;
}

typedef struct { const ds4_eval_view *v; } prefill_poll;

static int on_prefill(void *ud, int done, int total) {
    (void)done; (void)total;
    const ds4_eval_view *v = ((prefill_poll *)ud)->v;
    return v && v->poll && v->poll(v->ud) ? 1 : 0;
}

static const char *end_name(ds4_gen_end e) {
    static const char *names[] = {"eos", "length", "ctx_full", "stopped", "cancelled", "error"};
    return (unsigned)e < sizeof names / sizeof names[0] ? names[e] : "?";
}

int ds4_eval_run_item(ds4_eval_run *r, int item, ds4_session *s, ds4_sampler *smp, const ds4_eval_view *v,
                      char *err, size_t errlen) {
    ds4_eval_item *it = &r->items[item];
    const ds4_eval_question *q = it->q;
    it->state = DS4_EVAL_RUNNING;
    if (v && v->start) v->start(v->ud, item);
    double t0 = ds4_eval_clock();
    if (r->o.trace) {
        ds4_buf b = {0}, text = {0};
        ds4_token_ids ids = {0};
        char rerr[128];
        render(r, q, &text, &ids, rerr, sizeof rerr);
        trace_int(&b, "q", q->id);
        ds4_eval_trace_str(&b, "category", ds4_eval_category_name(q->cat), strlen(ds4_eval_category_name(q->cat)));
        ds4_eval_trace_str(&b, "prompt", text.data, text.len);
        trace_int(&b, "prompt_tokens", (long)it->prompt.n);
        ds4_eval_trace_emit(r->o.trace, &b);
        ds4_buf_free(&b);
        ds4_buf_free(&text);
        ds4_token_ids_free(&ids);
    }
    ds4_token_ids script = {0};
    bool have_script = false;
    if (r->o.script) {
        size_t len = 0;
        const char *entry = ds4_turn_script_next(r->o.script, &len);
        /* an exhausted script answers nothing: EOS at once */
        if (entry && ds4_tokenizer_encode(r->tok, entry, len, DS4_TOK_SPECIALS_CHAT, &script)) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        have_script = true;
    }
    int rc = 0;
    prefill_poll pp = {v};
    int pr = ds4_session_rewind(s, 0, err, errlen);
    if (!pr) pr = ds4_session_prefill(s, it->prompt.v, (int)it->prompt.n, NULL, on_prefill, &pp, err, errlen);
    gen_state g = {.r = r, .v = v, .item = item, .script = have_script ? &script : NULL,
                   .in_think = thinking(r), .line_end = false, .closing = -1};
    if (pr < 0) rc = -1;
    else if (pr > 0) g.stopped = true;
    else {
        ds4_gen_hooks h = {.cancelled = hook_cancelled, .forced = hook_forced, .on_token = hook_token,
                           .on_text = hook_text, .ud = &g, .spec = r->o.spec};
        ds4_gen_result res = ds4_generate(s, r->tok, smp, r->o.max_tokens, &h, err, errlen);
        it->gen_tokens = res.n_decoded;
        if (res.end == DS4_GEN_ERROR) rc = -1;
        else if (res.end != DS4_GEN_CANCELLED) {
            ds4_eval_grade(q, g.out.data ? g.out.data : "", g.out.len, thinking(r), &it->v);
            it->state = DS4_EVAL_DONE;
        }
        if (r->o.trace && it->state == DS4_EVAL_DONE) {
            ds4_buf b = {0};
            trace_int(&b, "q", q->id);
            ds4_eval_trace_str(&b, "verdict", it->v.pass ? "PASS" : "FAIL", 4);
            ds4_eval_trace_str(&b, "picked", it->v.picked, strlen(it->v.picked));
            ds4_eval_trace_str(&b, "expected", q->answer, strlen(q->answer));
            trace_int(&b, "prompt_tokens", (long)it->prompt.n);
            trace_int(&b, "gen_tokens", it->gen_tokens);
            ds4_eval_trace_str(&b, "end", end_name(res.end), strlen(end_name(res.end)));
            char secs[48];
            snprintf(secs, sizeof secs, ",\"seconds\":%.3f", ds4_eval_clock() - t0);
            ds4_buf_puts(&b, secs);
            ds4_eval_trace_str(&b, "output", g.out.data, g.out.len);
            ds4_eval_trace_emit(r->o.trace, &b);
            ds4_buf_free(&b);
        }
    }
    if (g.out.oom) { snprintf(err, errlen, "out of memory"); rc = -1; }
    if (it->state == DS4_EVAL_RUNNING) it->state = DS4_EVAL_UNFINISHED;
    it->seconds = ds4_eval_clock() - t0;
    free(it->output);
    it->output_len = g.out.len;
    it->output = ds4_buf_take(&g.out);
    ds4_token_ids_free(&script);
    if (v && v->end) v->end(v->ud, item);
    if (rc) return -1;
    return g.stopped ? 1 : 0;
}

int ds4_eval_run_all(ds4_eval_run *r, ds4_session *s, ds4_sampler *smp, const ds4_eval_view *v, char *err, size_t errlen) {
    for (;;) {
        int pick = v && v->next ? v->next(v->ud) : -1;
        if (pick < 0 || pick >= r->n || r->items[pick].state != DS4_EVAL_PENDING)
            for (pick = 0; pick < r->n && r->items[pick].state != DS4_EVAL_PENDING; pick++) {}
        if (pick == r->n) return 0;
        int rc = ds4_eval_run_item(r, pick, s, smp, v, err, errlen);
        if (rc) return rc;
    }
}

/* -------------------------------------------------------------- report */

static const char *state_name(const ds4_eval_item *it) {
    if (it->state == DS4_EVAL_DONE) return it->v.pass ? "PASS" : "FAIL";
    return it->state == DS4_EVAL_UNFINISHED ? "STOP" : "SKIP";
}

/* At most 24 bytes of an answer, cut at a character boundary: one cell. */
static void cell(char *dst, const char *s) {
    size_t n = strlen(s);
    if (n > 24) {
        n = 24;
        while (n && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    }
    memcpy(dst, s, n);
    dst[n] = 0;
}

int ds4_eval_report(FILE *f, const ds4_eval_item *items, int n, double wall_s) {
    int pass[DS4_EVAL_N_CATEGORIES] = {0}, done[DS4_EVAL_N_CATEGORIES] = {0}, sel[DS4_EVAL_N_CATEGORIES] = {0};
    fprintf(f, "%-5s %-5s %7s %7s  %-6s %-24s %s\n", "id", "cat", "prompt", "gen", "result", "answer", "expected");
    for (int i = 0; i < n; i++) {
        const ds4_eval_item *it = &items[i];
        ds4_eval_category c = it->q->cat;
        sel[c]++;
        if (it->state == DS4_EVAL_DONE) { done[c]++; pass[c] += it->v.pass; }
        char id[16], answer[32];
        snprintf(id, sizeof id, "q%d", it->q->id);
        cell(answer, it->v.picked[0] ? it->v.picked : "-");
        fprintf(f, "%-5s %-5s %7zu %7d  %-6s %-24s %s\n", id, ds4_eval_category_name(c), it->prompt.n, it->gen_tokens,
                state_name(it), answer, it->q->answer);
    }
    int tp = 0, td = 0, ts = 0;
    fprintf(f, "\n%-8s %6s %6s %8s %7s\n", "category", "passed", "graded", "selected", "score");
    for (int c = 0; c < DS4_EVAL_N_CATEGORIES; c++) {
        if (!sel[c]) continue;
        fprintf(f, "%-8s %6d %6d %8d %6.1f%%\n", ds4_eval_category_name((ds4_eval_category)c), pass[c], done[c], sel[c],
                done[c] ? 100.0 * pass[c] / done[c] : 0.0);
        tp += pass[c]; td += done[c]; ts += sel[c];
    }
    fprintf(f, "%-8s %6d %6d %8d %6.1f%%\n", "overall", tp, td, ts, td ? 100.0 * tp / td : 0.0);
    if (wall_s >= 0) fprintf(f, "wall time %.1f s\n", wall_s);
    return tp;
}

int ds4_eval_regrade(FILE *f, const char *path) {
    size_t len;
    char *text = ds4_read_file(path, &len);
    if (!text) { ds4_log(DS4_LOG_ERROR, "ds4-eval: cannot read %s\n", path); return -1; }
    ds4_eval_trace t;
    char err[256];
    int rc = ds4_eval_trace_read(text, len, &t, err, sizeof err);
    free(text);
    if (rc) { ds4_log(DS4_LOG_ERROR, "ds4-eval: %s: %s\n", path, err); return -1; }
    ds4_eval_item *items = calloc((size_t)(t.n ? t.n : 1), sizeof *items);
    if (!items) { ds4_eval_trace_free(&t); ds4_log(DS4_LOG_ERROR, "ds4-eval: out of memory\n"); return -1; }
    int n = 0, changed = 0, old_pass = 0;
    for (int i = 0; i < t.n; i++) {
        const ds4_eval_trace_case *c = &t.cases[i];
        const ds4_eval_question *q = ds4_eval_question_by_id(c->q);
        if (!q) { fprintf(f, "q%d: not in the embedded question set, skipped\n", c->q); continue; }
        ds4_eval_item *it = &items[n++];
        it->q = q;
        it->state = DS4_EVAL_DONE;
        it->gen_tokens = c->gen_tokens;
        /* the report prints the prompt size from the id vector's length */
        it->prompt.n = (size_t)c->prompt_tokens;
        ds4_eval_grade(q, c->output, c->output_len, t.thinking, &it->v);
        old_pass += c->pass;
        if (it->v.pass != c->pass || strcmp(it->v.picked, c->picked)) {
            changed++;
            fprintf(f, "changed q%d %s: %s \"%s\" -> %s \"%s\" (expected %s)\n", q->id, ds4_eval_category_name(q->cat),
                    c->pass ? "PASS" : "FAIL", c->picked, it->v.pass ? "PASS" : "FAIL", it->v.picked, q->answer);
        }
    }
    int new_pass = 0;
    for (int i = 0; i < n; i++) new_pass += items[i].v.pass;
    fprintf(f, "regrade: %d cases, %d changed; passed %d -> %d\n\n", n, changed, old_pass, new_pass);
    ds4_eval_report(f, items, n, -1);
    free(items);
    ds4_eval_trace_free(&t);
    return 0;
}
