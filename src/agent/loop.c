#include "agent/loop.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/dsml.h"
#include "engine/generate.h"
#include "base/json_util.h"
#include "text/tokenizer.h"

#define DEFAULT_SYSTEM_PROMPT                                                                                   \
    "You are ds4-agent, a coding agent working in the directory %s. Use the tools to read, search and change " \
    "files and to run commands; prefer small exact edits with edit_file. When the task is done, answer briefly."

struct ds4_agent {
    ds4_agent_opts o;
    const ds4_tokenizer *tok;
    const ds4_special_ids *sp;
    ds4_session *s;
    ds4_sampler *smp;
    ds4_token_ids pending;       /* tokens not yet in the KV state */
    bool open_message;           /* the last assistant message has no EOS yet */
    char id[DS4_AGENT_ID_HEX + 1];
    uint64_t created;
    ds4_agent_stats st;
};

static bool interrupted(const ds4_agent *a) { return a->o.interrupted && *a->o.interrupted; }

ds4_agent *ds4_agent_new(const ds4_agent_opts *o, char *err, size_t errlen) {
    ds4_agent *a = calloc(1, sizeof *a);
    if (!a) { snprintf(err, errlen, "out of memory"); return NULL; }
    a->o = *o;
    a->tok = ds4_engine_tokenizer(o->engine);
    if (!a->tok) { snprintf(err, errlen, "the model has no tokenizer"); free(a); return NULL; }
    a->sp = ds4_tokenizer_specials(a->tok);
    a->s = ds4_session_new(o->engine, o->ctx, err, errlen);
    a->smp = a->s ? ds4_sampler_new(&o->sampling, ds4_engine_n_vocab(o->engine)) : NULL;
    if (!a->smp) {
        if (a->s) snprintf(err, errlen, "out of memory");
        ds4_agent_free(a);
        return NULL;
    }
    a->st.ctx = o->ctx;
    return a;
}

void ds4_agent_free(ds4_agent *a) {
    if (!a) return;
    ds4_session_free(a->s);
    ds4_sampler_free(a->smp);
    ds4_token_ids_free(&a->pending);
    free(a);
}

void ds4_agent_reset(ds4_agent *a) {
    char err[256];
    ds4_session_rewind(a->s, 0, err, sizeof err);
    a->pending.n = 0;
    a->open_message = false;
    a->id[0] = 0;
    a->created = 0;
    a->st.prefilled = a->st.decoded = 0;
    a->st.restored = a->st.last_prefill_from = a->st.last_prefill_n = 0;
}

void ds4_agent_set_think(ds4_agent *a, ds4_think_mode m) { a->o.think = m; }

/* One message of the transcript as a line: the answer after the reasoning,
 * tool calls as a marker, newlines as spaces, at most `width` bytes cut at a
 * character boundary. */
static void history_line(const ds4_agent *a, const int32_t *t, size_t n, bool assistant, FILE *out) {
    size_t from = 0, to = n;
    bool calls = false;
    for (size_t i = 0; i < n; i++) {
        if (assistant && t[i] == a->sp->think_end) from = i + 1;
        if (t[i] == a->sp->eos && to == n) to = i;
    }
    for (size_t i = from; i < to; i++)
        if (t[i] == a->sp->dsml) { to = i; calls = true; break; }
    size_t len = 0;
    char *text = to > from ? ds4_tokenizer_decode(a->tok, t + from, to - from, false, &len) : NULL;
    const char *role = assistant ? "assistant" : len >= 13 && !memcmp(text, "<tool_result>", 13) ? "tool" : "user";
    /* the block's opening "<" is its own token before the DSML marker */
    if (calls && len && text[len - 1] == '<') len--;
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) len--;
    enum { WIDTH = 160 };
    size_t start = 0;
    while (start < len && (text[start] == '\n' || text[start] == ' ')) start++;
    size_t end = len - start > WIDTH ? start + WIDTH : len;
    while (end < len && end > start && ((unsigned char)text[end] & 0xC0) == 0x80) end--;
    fprintf(out, "%s:", role);
    if (end > start) fputc(' ', out);
    for (size_t i = start; i < end; i++) fputc(text[i] == '\n' || text[i] == '\t' ? ' ' : text[i], out);
    fprintf(out, "%s%s\n", end < len ? " ..." : "", calls ? " [tool calls]" : "");
    free(text);
}

void ds4_agent_history(const ds4_agent *a, int n, FILE *out) {
    const int32_t *t = ds4_session_tokens(a->s);
    const size_t total = (size_t)ds4_session_n_tokens(a->s);
    /* a message starts after its role token; the last n such starts */
    size_t first = total;
    int seen = 0;
    for (size_t i = total; i-- > 0 && seen < n;)
        if (t[i] == a->sp->user || t[i] == a->sp->assistant) { first = i; seen++; }
    if (!seen) { fprintf(out, "no messages yet\n"); return; }
    for (size_t i = first; i < total;) {
        size_t j = i + 1;
        while (j < total && t[j] != a->sp->user && t[j] != a->sp->assistant) j++;
        history_line(a, t + i + 1, j - i - 1, t[i] == a->sp->assistant, out);
        i = j;
    }
}
const char *ds4_agent_id(const ds4_agent *a) { return a->id; }
const ds4_session *ds4_agent_session(const ds4_agent *a) { return a->s; }

void ds4_agent_stats_get(const ds4_agent *a, ds4_agent_stats *st) {
    *st = a->st;
    st->n_tokens = ds4_session_n_tokens(a->s);
    st->ctx = ds4_session_ctx(a->s);
}

/* ---- building the pending tokens ---- */

static bool add_token(ds4_agent *a, int32_t id) {
    if (a->pending.n == a->pending.cap) {
        size_t cap = a->pending.cap ? a->pending.cap * 2 : 256;
        int32_t *v = realloc(a->pending.v, cap * sizeof *v);
        if (!v) return false;
        a->pending.v = v;
        a->pending.cap = cap;
    }
    a->pending.v[a->pending.n++] = id;
    return true;
}

static bool add_text(ds4_agent *a, const char *s, size_t n, enum ds4_tok_specials specials) {
    return ds4_tokenizer_encode(a->tok, s, n, specials, &a->pending) == 0;
}

static ds4_think_mode think_mode(const ds4_agent *a) { return ds4_chat_effective_think(a->o.think, ds4_session_ctx(a->s)); }

/* BOS, tools block and system prompt: rendered by chat.c as for a
 * conversation of just the system message. Our own text: chat specials. */
static bool add_prefix(ds4_agent *a) {
    int n_tools;
    ds4_chat_opts co;
    ds4_chat_opts_default(&co);
    co.think = think_mode(a);
    co.tools = ds4_agent_tool_defs(&n_tools);
    co.n_tools = n_tools;
    char sys[1200];
    if (!a->o.system_prompt) snprintf(sys, sizeof sys, DEFAULT_SYSTEM_PROMPT, a->o.tools.root);
    ds4_chat_msg m = {.role = DS4_ROLE_SYSTEM, .content = a->o.system_prompt ? a->o.system_prompt : sys};
    ds4_buf text = {0};
    char err[256];
    bool ok = ds4_chat_render(&m, 1, &co, &text, err, sizeof err) && !text.oom &&
              add_text(a, text.data, text.len, DS4_TOK_SPECIALS_CHAT);
    ds4_buf_free(&text);
    return ok;
}

static bool close_message(ds4_agent *a) {
    if (!a->open_message) return true;
    a->open_message = false;
    return add_token(a, a->sp->eos);
}

static bool add_generation_prompt(ds4_agent *a) {
    return add_token(a, a->sp->assistant) &&
           add_token(a, think_mode(a) != DS4_THINK_NONE ? a->sp->think : a->sp->think_end);
}

/* ---- prefill ---- */

static int on_progress(void *ud, int done, int total) {
    ds4_agent *a = ud;
    ds4_agent_display_progress(a->o.display, done, total);
    return interrupted(a) ? 1 : 0;
}

static bool pending_fits(const ds4_agent *a) {
    return ds4_session_n_tokens(a->s) + (long)a->pending.n < ds4_session_ctx(a->s);
}

/* Prefills the pending tokens. 0 done, 1 interrupted (session rewound to
 * where it was, pending kept), -1 error. */
static int prefill_pending(ds4_agent *a) {
    int from = ds4_session_n_tokens(a->s), n = (int)a->pending.n;
    if (n == 0) return 0;
    if (!pending_fits(a)) {
        ds4_agent_display_note(a->o.display, "context full: %d + %d tokens do not fit in %d (start with a larger --ctx, "
                               "or /new)", from, n, ds4_session_ctx(a->s));
        return -1;
    }
    char err[256];
    ds4_agent_display_progress_begin(a->o.display);
    int rc = ds4_session_prefill(a->s, a->pending.v, n, NULL, on_progress, a, err, sizeof err);
    int done = ds4_session_n_tokens(a->s) - from;
    ds4_agent_display_progress_end(a->o.display, done, rc == 1);
    if (rc != 0) {
        if (ds4_session_n_tokens(a->s) > from) ds4_session_rewind(a->s, from, err, sizeof err);
        if (rc < 0) ds4_agent_display_note(a->o.display, "prefill failed: %s", err);
        return rc < 0 ? -1 : 1;
    }
    a->st.prefilled += n;
    a->st.last_prefill_from = from;
    a->st.last_prefill_n = n;
    if (a->o.trace) { fprintf(a->o.trace, "prefill from=%d n=%d\n", from, n); fflush(a->o.trace); }
    a->pending.n = 0;
    return 0;
}

/* ---- generation ---- */

typedef struct {
    char *name, *args;
} call;

typedef struct {
    ds4_agent *a;
    call *calls;
    int n_calls, cap;
    char *error;                 /* malformed DSML */
    bool oom;
} gen_state;

static void on_event(void *ud, const ds4_dsml_event *ev) {
    gen_state *g = ud;
    ds4_agent_display *d = g->a->o.display;
    switch (ev->kind) {
    case DS4_DSML_EV_REASONING: ds4_agent_display_reasoning(d, ev->text, ev->len); break;
    case DS4_DSML_EV_CONTENT: ds4_agent_display_answer(d, ev->text, ev->len); break;
    case DS4_DSML_EV_CALL_END:
        if (g->n_calls == g->cap) {
            int cap = g->cap ? g->cap * 2 : 4;
            call *c = realloc(g->calls, (size_t)cap * sizeof *c);
            if (!c) { g->oom = true; return; }
            g->calls = c;
            g->cap = cap;
        }
        g->calls[g->n_calls].name = strdup(ev->name ? ev->name : "");
        g->calls[g->n_calls].args = ev->args_valid ? strndup(ev->text, ev->len) : strdup("{}");
        if (!g->calls[g->n_calls].name || !g->calls[g->n_calls].args) g->oom = true;
        g->n_calls++;
        break;
    case DS4_DSML_EV_ERROR:
        free(g->error);
        g->error = strdup(ev->message ? ev->message : "malformed tool call");
        if (!g->error) g->oom = true;
        break;
    default: break;
    }
}

static void gen_free(gen_state *g) {
    for (int i = 0; i < g->n_calls; i++) { free(g->calls[i].name); free(g->calls[i].args); }
    free(g->calls);
    free(g->error);
}

/* ds4_generate hooks: the DSML parser decides when a message ends and
 * when sampling is protocol-greedy; the script, when there is one, forces
 * every token (EOS after its last). */
typedef struct {
    ds4_agent *a;
    ds4_dsml_parser *p;
    const ds4_token_ids *scripted;
} gen_hooks_state;

static bool hook_cancelled(void *ud) { return interrupted(((gen_hooks_state *)ud)->a); }

static int hook_forced(void *ud, int step) {
    gen_hooks_state *h = ud;
    if (!h->scripted) return -1;
    return (size_t)step < h->scripted->n ? h->scripted->v[step] : h->a->sp->eos;
}

static bool hook_greedy(void *ud) { return ds4_dsml_in_structure(((gen_hooks_state *)ud)->p); }

static bool hook_text(void *ud, const char *text, size_t len) {
    gen_hooks_state *h = ud;
    ds4_dsml_feed(h->p, text, len);
    return ds4_dsml_done(h->p) || ds4_dsml_failed(h->p);
}

static void hook_decoded(void *ud) { ((gen_hooks_state *)ud)->a->st.decoded++; }

/* Samples (or takes from the script) one assistant message into the
 * session. 0 done, 1 interrupted, -1 error. */
static int generate(ds4_agent *a, gen_state *g) {
    ds4_token_ids scripted = {0};
    bool have_script = false;
    if (a->o.script) {
        size_t len = 0;
        const char *entry = ds4_turn_script_next(a->o.script, &len);
        if (!entry) ds4_agent_display_note(a->o.display, "[scripted output exhausted: the model stops]");
        /* what the model writes contains protocol tokens: chat specials on */
        else if (ds4_tokenizer_encode(a->tok, entry, len, DS4_TOK_SPECIALS_CHAT, &scripted)) return -1;
        have_script = true;
    }
    ds4_dsml_opts po = {.thinking = think_mode(a) != DS4_THINK_NONE, .tools = true, .decode_entities = true};
    ds4_dsml_parser *p = ds4_dsml_new(&po, on_event, g);
    if (!p) { ds4_token_ids_free(&scripted); return -1; }
    gen_hooks_state hs = {a, p, have_script ? &scripted : NULL};
    ds4_gen_hooks hooks = {.cancelled = hook_cancelled, .forced = hook_forced, .greedy = hook_greedy,
                           .on_text = hook_text, .after_decode = hook_decoded, .ud = &hs, .spec = a->o.spec};
    char err[256];
    int from = ds4_session_n_tokens(a->s), rc = 0;
    ds4_gen_result r = ds4_generate(a->s, a->tok, a->smp, a->o.max_gen_tokens, &hooks, err, sizeof err);
    if (r.end == DS4_GEN_CANCELLED) rc = 1;
    /* an interrupted block is cut off by the user, not malformed */
    else ds4_dsml_finish(p);
    ds4_dsml_free(p);
    ds4_token_ids_free(&scripted);
    ds4_agent_display_end(a->o.display);
    a->open_message = true;
    if (a->o.trace) { fprintf(a->o.trace, "generate from=%d n=%d\n", from, ds4_session_n_tokens(a->s) - from); fflush(a->o.trace); }
    if (r.end == DS4_GEN_ERROR) { ds4_agent_display_note(a->o.display, "decode failed: %s", err); rc = -1; }
    if (r.end == DS4_GEN_CTX_FULL) {
        /* the last token was shown but is not in the session: no calls from it */
        ds4_agent_display_note(a->o.display, "context full (%d tokens): start a /new session or a larger --ctx",
                               ds4_session_ctx(a->s));
        rc = -1;
    }
    if (g->oom) return -1;
    return rc;
}

/* ---- fitting tool results into the context ----
 *
 * A tool result is client text of any size (64 KiB of NUL bytes is about
 * 65,000 tokens); the context is not. A result that does not fit would
 * stay pending and fail every later turn, so results are cut in tokens,
 * against what is left: the next answer keeps its room (answer_room), and
 * one round's results may take at most half of the rest, so the model can
 * still make its next call. The calls share it in order, each an equal
 * part of what the earlier ones left. */

/* <tool_result></tool_result> around a result, and the turn markers */
#define RESULT_WRAP_TOKENS 16
/* the truncation marker's own tokens (it is about 40) */
#define MARKER_TOKENS 64
/* below this a result is replaced by a short note rather than cut */
#define RESULT_MIN_TOKENS (2 * MARKER_TOKENS)

/* What the model's next answer needs: its whole budget, or a quarter of
 * the context when that is smaller. */
static int answer_room(const ds4_agent *a) {
    int quarter = ds4_session_ctx(a->s) / 4;
    return a->o.max_gen_tokens < quarter ? a->o.max_gen_tokens : quarter;
}

static long results_budget(const ds4_agent *a, int n_results) {
    long free_tokens = (long)ds4_session_ctx(a->s) - ds4_session_n_tokens(a->s) - (long)a->pending.n - answer_room(a) -
                       (long)RESULT_WRAP_TOKENS * (n_results + 1);
    return free_tokens > 0 ? free_tokens / 2 : 0;
}

/* Drops the bytes of an incomplete UTF-8 character at the end of s[0..n). */
static size_t utf8_head(const char *s, size_t n) {
    size_t i = n, back = 0;
    while (i > 0 && back < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) { i--; back++; }
    if (i == 0) return n;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    return back + 1 < want && lead >= 0xC0 ? i - 1 : n;
}

/* Skips the continuation bytes at the start of s[0..n). */
static size_t utf8_tail_skip(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && i < 3 && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
    return i;
}

/* Cuts text to at most max_tokens tokens (specials off, as it will be
 * encoded): the head (two thirds) and the tail (one third, where a
 * command's errors and exit status are) are kept at token boundaries, and
 * a marker between them says how much was cut. Returns the tokens the text
 * takes now, or -1 when out of memory. */
static long cap_tokens(const ds4_agent *a, ds4_buf *text, long max_tokens) {
    ds4_token_ids ids = {0};
    if (ds4_tokenizer_encode(a->tok, text->data ? text->data : "", text->len, DS4_TOK_SPECIALS_NONE, &ids)) return -1;
    long total = (long)ids.n, result = total;
    size_t total_bytes = text->len;
    /* the re-encoded text can take a few tokens more at the two seams: cut
     * more until it fits */
    for (long keep = max_tokens - MARKER_TOKENS; result > max_tokens && keep > 0;) {
        size_t head_n = (size_t)keep * 2 / 3, tail_n = (size_t)keep - head_n, hl, tl;
        char *head = ds4_tokenizer_decode(a->tok, ids.v, head_n, false, &hl);
        char *tail = ds4_tokenizer_decode(a->tok, ids.v + ids.n - tail_n, tail_n, false, &tl);
        if (!head || !tail) { free(head); free(tail); result = -1; break; }
        hl = utf8_head(head, hl);
        size_t skip = utf8_tail_skip(tail, tl);
        ds4_buf out = {0};
        ds4_buf_put(&out, head, hl);
        char marker[320];
        snprintf(marker, sizeof marker,
                 "\n[... output truncated to fit the context: %ld of its %ld tokens (%zu of %zu bytes) cut here; "
                 "to see them, read a line range or filter the output (grep, head, tail) ...]\n",
                 total - (long)(head_n + tail_n), total, total_bytes - hl - (tl - skip), total_bytes);
        ds4_buf_puts(&out, marker);
        ds4_buf_put(&out, tail + skip, tl - skip);
        free(head);
        free(tail);
        ds4_token_ids again = {0};
        if (out.oom || ds4_tokenizer_encode(a->tok, out.data, out.len, DS4_TOK_SPECIALS_NONE, &again)) {
            ds4_buf_free(&out);
            result = -1;
            break;
        }
        result = (long)again.n;
        ds4_token_ids_free(&again);
        keep -= result - max_tokens > 8 ? result - max_tokens : 8;
        ds4_buf_free(text);
        *text = out;
    }
    ds4_token_ids_free(&ids);
    return result;
}

/* Fits one result into share tokens: cut, or -- when the context is too
 * full for a useful part -- replaced by a note. Returns its tokens. */
static long fit_result(const ds4_agent *a, ds4_agent_tool_result *r, long share) {
    if (share < RESULT_MIN_TOKENS) {
        size_t bytes = r->text.len;
        ds4_buf_free(&r->text);
        char note[300];
        snprintf(note, sizeof note, "error: the output (%zu bytes) was dropped: the context is nearly full (%d of %d "
                 "tokens used). Answer with what you have; the user can start a new session with /new.",
                 bytes, ds4_session_n_tokens(a->s), ds4_session_ctx(a->s));
        ds4_buf_puts(&r->text, note);
        r->ok = false;
        snprintf(r->summary, sizeof r->summary, "output dropped: the context is nearly full");
        return MARKER_TOKENS;
    }
    size_t before = r->text.len;
    long used = cap_tokens(a, &r->text, share);
    if (used >= 0 && r->text.len != before) {
        size_t n = strlen(r->summary);
        snprintf(r->summary + n, sizeof r->summary - n, " (cut to %ld tokens to fit the context)", used);
    }
    return used;
}

/* Runs the calls and appends their results as one tool-result turn. */
static int run_tools(ds4_agent *a, gen_state *g) {
    ds4_buf results = {0};
    int rc = 0;
    if (g->error) {
        ds4_buf msg = {0};
        ds4_buf_puts(&msg, "error: malformed tool call (");
        ds4_buf_puts(&msg, g->error);
        ds4_buf_puts(&msg, "); nothing was run. Write the call again in the DSML tool_calls format.");
        ds4_agent_display_tool_start(a->o.display, "(malformed tool call)", "");
        ds4_agent_display_tool_end(a->o.display, g->error, NULL, 0);
        ds4_chat_tool_result(msg.data ? msg.data : "", msg.len, DS4_CHAT_DS4, &results);
        ds4_buf_free(&msg);
    }
    long budget = results_budget(a, g->n_calls), used = 0;
    for (int i = 0; !g->error && i < g->n_calls; i++) {
        ds4_agent_tool_result r;
        ds4_agent_display_tool_start(a->o.display, g->calls[i].name, g->calls[i].args);
        if (interrupted(a)) {
            memset(&r, 0, sizeof r);
            ds4_buf_puts(&r.text, "error: not run, the user interrupted");
            snprintf(r.summary, sizeof r.summary, "skipped (interrupted)");
        } else {
            ds4_agent_tool_run(&a->o.tools, g->calls[i].name, g->calls[i].args, &r);
        }
        long took = fit_result(a, &r, (budget - used) / (g->n_calls - i));
        if (took < 0) results.oom = true;
        else used += took;
        ds4_agent_display_tool_end(a->o.display, r.summary, r.display.data, r.display.len);
        ds4_chat_tool_result(r.text.data ? r.text.data : "", r.text.len, DS4_CHAT_DS4, &results);
        ds4_agent_tool_result_free(&r);
    }
    if (interrupted(a)) rc = 1;
    /* tool output is client text: no specials, so a file cannot forge turns */
    if (results.oom || !close_message(a) || !add_token(a, a->sp->user) ||
        !add_text(a, results.data ? results.data : "", results.len, DS4_TOK_SPECIALS_NONE))
        rc = -1;
    ds4_buf_free(&results);
    return rc;
}

int ds4_agent_turn(ds4_agent *a, const char *user_text) {
    size_t pending_before = a->pending.n;
    bool open_before = a->open_message;
    bool fresh = ds4_session_n_tokens(a->s) == 0 && a->pending.n == 0;
    if (fresh && !add_prefix(a)) { ds4_agent_display_note(a->o.display, "cannot render the system prompt"); return -1; }
    if (!close_message(a) || !add_token(a, a->sp->user) || !add_text(a, user_text, strlen(user_text), DS4_TOK_SPECIALS_NONE) ||
        !add_generation_prompt(a)) {
        ds4_agent_display_note(a->o.display, "out of memory");
        return -1;
    }
    int rc = prefill_pending(a);
    if (rc != 0) {
        /* the message was not taken: back to the state before it */
        a->pending.n = pending_before;
        a->open_message = open_before;
        if (rc > 0) ds4_agent_display_note(a->o.display, "[interrupted: message not sent]");
        return rc;
    }
    if (fresh && !a->id[0]) {
        a->created = (uint64_t)time(NULL);
        ds4_agent_session_id(user_text, a->created, a->id);
    }
    for (int step = 0;; step++) {
        gen_state g = {.a = a};
        rc = generate(a, &g);
        if (rc == 0 && (g.n_calls > 0 || g.error)) {
            size_t mark = a->pending.n;
            rc = run_tools(a, &g);
            if (rc == 0 && step + 1 >= a->o.max_steps) {
                ds4_agent_display_note(a->o.display, "[%d tool rounds: stopping here; send a message to go on]", a->o.max_steps);
                rc = 1;
            }
            if (rc == 0) {
                if (!add_generation_prompt(a)) rc = -1;
                else if (!pending_fits(a)) {
                    /* even the notes do not fit: results left pending would
                     * fail every later turn, so they are dropped and the
                     * message with the calls ends as it is */
                    a->pending.n = mark;
                    a->open_message = true;
                    ds4_agent_display_note(a->o.display, "context full (%d of %d tokens): the tool results were dropped; "
                                           "start a /new session or a larger --ctx", ds4_session_n_tokens(a->s),
                                           ds4_session_ctx(a->s));
                    rc = -1;
                }
                else if ((rc = prefill_pending(a)) != 0) a->pending.n -= 2;   /* the results wait for the next message */
            }
            gen_free(&g);
            if (rc == 0) continue;
        } else {
            gen_free(&g);
        }
        if (rc > 0) ds4_agent_display_note(a->o.display, "[interrupted]");
        return rc;
    }
}

/* ---- sessions ---- */

int ds4_agent_save(ds4_agent *a, const char *dir, char *err, size_t errlen) {
    if (!a->id[0]) { snprintf(err, errlen, "nothing to save yet"); return -1; }
    return ds4_agent_store_save(dir, a->id, a->created, a->o.engine, a->s, err, errlen);
}

int ds4_agent_switch(ds4_agent *a, const char *dir, const char *id, char *err, size_t errlen) {
    char *text = NULL;
    size_t text_len = 0;
    uint64_t created = 0;
    bool stripped = false;
    /* the payload loader leaves the session unchanged on error */
    if (ds4_agent_store_load(dir, id, a->o.engine, a->s, &text, &text_len, &created, &stripped, err, errlen)) return -1;
    a->pending.n = 0;
    a->st.prefilled = a->st.decoded = 0;
    a->st.last_prefill_from = a->st.last_prefill_n = 0;
    a->st.restored = stripped ? 0 : ds4_session_n_tokens(a->s);
    int rc = 0;
    if (stripped) {
        char e2[256];
        ds4_session_rewind(a->s, 0, e2, sizeof e2);
        /* the saved text is the rendered conversation: its markers are protocol */
        if (!add_text(a, text, text_len, DS4_TOK_SPECIALS_CHAT)) { snprintf(err, errlen, "out of memory"); rc = -1; }
        else rc = prefill_pending(a);
        if (rc != 0) { a->pending.n = 0; ds4_session_rewind(a->s, 0, e2, sizeof e2); }
        if (rc < 0) snprintf(err, errlen, "re-prefilling the saved text failed");
        if (rc > 0) snprintf(err, errlen, "interrupted: the session is empty now");
    }
    free(text);
    if (rc != 0) { a->id[0] = 0; a->open_message = false; return rc; }
    int n = ds4_session_n_tokens(a->s);
    /* every message ends after generation, and EOS is only ever prefilled */
    a->open_message = n > 0 && ds4_session_tokens(a->s)[n - 1] != a->sp->eos;
    snprintf(a->id, sizeof a->id, "%s", id);
    a->created = created;
    return 0;
}
