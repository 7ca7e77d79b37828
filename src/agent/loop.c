#include "agent/loop.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "models/chat_spec.h"
#include "text/dsml.h"
#include "engine/generate.h"
#include "base/json_util.h"
#include "text/tokenizer.h"

#define DEFAULT_SYSTEM_PROMPT                                                                                   \
    "You are ds4-agent, a coding agent working in the directory %s. Use the tools to read, search and change " \
    "files and to run commands; prefer small exact edits with edit_file. When the task is done, answer briefly."

/* A message the session does not hold yet (a user prompt, a tool result). */
typedef struct {
    ds4_chat_role role;
    char *content;
} pending_msg;

struct ds4_agent {
    ds4_agent_opts o;
    const ds4_tokenizer *tok;
    const ds4_special_ids *sp;
    const ds4_chat_spec *spec;   /* the model family's chat format: the agent never names a family */
    ds4_session *s;
    ds4_sampler *smp;
    ds4_token_ids pending;       /* tokens not yet in the KV state */
    pending_msg *msgs;           /* messages not yet rendered into the session */
    int n_msgs, cap_msgs;
    char id[DS4_AGENT_ID_HEX + 1];
    uint64_t created;
    int compacted_n;             /* the session's size after the last automatic compaction; 0: none */
    ds4_agent_stats st;
};

static void drop_msgs(ds4_agent *a, int keep);

static bool interrupted(const ds4_agent *a) { return a->o.interrupted && *a->o.interrupted; }

ds4_agent *ds4_agent_new(const ds4_agent_opts *o, char *err, size_t errlen) {
    ds4_agent *a = calloc(1, sizeof *a);
    if (!a) { snprintf(err, errlen, "out of memory"); return NULL; }
    a->o = *o;
    a->tok = ds4_engine_tokenizer(o->engine);
    if (!a->tok) { snprintf(err, errlen, "the model has no tokenizer"); free(a); return NULL; }
    a->sp = ds4_tokenizer_specials(a->tok);
    a->spec = ds4_engine_chat(o->engine);
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
    for (int i = 0; i < a->n_msgs; i++) free(a->msgs[i].content);
    free(a->msgs);
    free(a);
}

void ds4_agent_reset(ds4_agent *a) {
    char err[256];
    ds4_session_rewind(a->s, 0, err, sizeof err);
    a->pending.n = 0;
    drop_msgs(a, 0);
    a->id[0] = 0;
    a->created = 0;
    a->compacted_n = 0;
    a->st.prefilled = a->st.decoded = 0;
    a->st.restored = a->st.last_prefill_from = a->st.last_prefill_n = 0;
}

void ds4_agent_set_think(ds4_agent *a, ds4_think_mode m) { a->o.think = m; }

/* The answer part of an assistant message as the family's parser reads it
 * (reasoning already cut off): its text, and whether it called tools. */
typedef struct {
    ds4_buf text;
    bool calls;
} answer_scan;

static void on_answer_event(void *ud, const ds4_dsml_event *ev) {
    answer_scan *s = ud;
    if (ev->kind == DS4_DSML_EV_CONTENT) ds4_buf_put(&s->text, ev->text, ev->len);
    else if (ev->kind == DS4_DSML_EV_BLOCK_START || ev->kind == DS4_DSML_EV_CALL_START) s->calls = true;
}

/* True when a user-side message is a tool result: the family's own result
 * turn (a role token of its own), or a result written inline into a user
 * turn (its opening tag, as the family writes it, begins the text). */
static bool is_tool_message(const ds4_agent *a, int32_t role, const char *text, size_t len) {
    if (role >= 0 && role == a->sp->observation) return true;
    ds4_buf probe = {0};
    a->spec->inline_tool_result("\x01", 1, &probe);
    const char *mark = probe.data ? memchr(probe.data, 1, probe.len) : NULL;
    size_t open = mark ? (size_t)(mark - probe.data) : 0;
    bool tool = open && len >= open && !memcmp(text, probe.data, open);
    ds4_buf_free(&probe);
    return tool;
}

/* One message of the transcript as a line: the answer after the reasoning,
 * tool calls as a marker, newlines as spaces, at most `width` bytes cut at a
 * character boundary. */
static void history_line(const ds4_agent *a, int32_t role, const int32_t *t, size_t n, FILE *out) {
    const bool assistant = role == a->sp->assistant;
    size_t from = 0, to = n;
    for (size_t i = 0; i < n; i++) {
        if (assistant && t[i] == a->sp->think_end) from = i + 1;
        if (t[i] == a->sp->eos && to == n) to = i;
    }
    size_t len = 0;
    char *text = to > from ? ds4_tokenizer_decode(a->tok, t + from, to - from, false, &len) : NULL;
    answer_scan scan = {0};
    if (assistant && text) {
        ds4_tool_parser_opts po = {.thinking = false, .tools = true};
        void *p = a->spec->parser->create(&po, on_answer_event, &scan);
        if (p) {
            a->spec->parser->feed(p, text, len);
            a->spec->parser->finish(p);
            a->spec->parser->free(p);
        }
        free(text);
        text = scan.text.data;
        len = scan.text.len;
        scan.text = (ds4_buf){0};
    }
    const char *name = assistant ? "assistant" : is_tool_message(a, role, text ? text : "", len) ? "tool" : "user";
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) len--;
    enum { WIDTH = 160 };
    size_t start = 0;
    while (start < len && (text[start] == '\n' || text[start] == ' ')) start++;
    size_t end = len - start > WIDTH ? start + WIDTH : len;
    while (end < len && end > start && ((unsigned char)text[end] & 0xC0) == 0x80) end--;
    fprintf(out, "%s:", name);
    if (end > start) fputc(' ', out);
    for (size_t i = start; i < end; i++) fputc(text[i] == '\n' || text[i] == '\t' ? ' ' : text[i], out);
    fprintf(out, "%s%s\n", end < len ? " ..." : "", scan.calls ? " [tool calls]" : "");
    free(text);
}

/* A token that opens a message: the user, assistant or (for a family
 * that has one) tool-result role. */
static bool is_role(const ds4_agent *a, int32_t t) {
    return t == a->sp->user || t == a->sp->assistant || (a->sp->observation >= 0 && t == a->sp->observation);
}

void ds4_agent_history(const ds4_agent *a, int n, FILE *out) {
    const int32_t *t = ds4_session_tokens(a->s);
    const size_t total = (size_t)ds4_session_n_tokens(a->s);
    /* a message starts after its role token; the last n such starts */
    size_t first = total;
    int seen = 0;
    for (size_t i = total; i-- > 0 && seen < n;)
        if (is_role(a, t[i])) { first = i; seen++; }
    if (!seen) { fprintf(out, "no messages yet\n"); return; }
    for (size_t i = first; i < total;) {
        size_t j = i + 1;
        while (j < total && !is_role(a, t[j])) j++;
        history_line(a, t[i], t + i + 1, j - i - 1, out);
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

static bool add_tokens(ds4_agent *a, const int32_t *ids, size_t n) {
    if (a->pending.n + n > a->pending.cap) {
        size_t cap = a->pending.cap ? a->pending.cap : 256;
        while (cap < a->pending.n + n) cap *= 2;
        int32_t *v = realloc(a->pending.v, cap * sizeof *v);
        if (!v) return false;
        a->pending.v = v;
        a->pending.cap = cap;
    }
    memcpy(a->pending.v + a->pending.n, ids, n * sizeof *ids);
    a->pending.n += n;
    return true;
}

static bool add_text(ds4_agent *a, const char *s, size_t n, enum ds4_tok_specials specials) {
    return ds4_tokenizer_encode(a->tok, s, n, specials, &a->pending) == 0;
}

static ds4_think_mode think_mode(const ds4_agent *a) {
    return a->spec->effective_think(a->o.think, ds4_session_ctx(a->s));
}

static bool push_msg(ds4_agent *a, ds4_chat_role role, const char *text, size_t n) {
    if (a->n_msgs == a->cap_msgs) {
        int cap = a->cap_msgs ? a->cap_msgs * 2 : 8;
        pending_msg *v = realloc(a->msgs, (size_t)cap * sizeof *v);
        if (!v) return false;
        a->msgs = v;
        a->cap_msgs = cap;
    }
    char *c = strndup(text, n);
    if (!c) return false;
    a->msgs[a->n_msgs++] = (pending_msg){role, c};
    return true;
}

static void drop_msgs(ds4_agent *a, int keep) {
    while (a->n_msgs > keep) free(a->msgs[--a->n_msgs].content);
}

/* Appends msgs to a->pending as the session's continuation, in the model
 * family's chat format (chat_spec.h): for an empty session the whole prompt
 * -- tools block, system prompt (built in, or -sys), the messages -- else
 * the family's tail after the live assistant message (whose stop token the
 * session does not hold). gen_prompt: end with the generation prompt for
 * `think`. Client text (prompts, results, the system prompt) is tokenized
 * as text, so it cannot forge protocol tokens. */
static bool render_msgs(ds4_agent *a, const pending_msg *msgs, int n, bool gen_prompt, ds4_think_mode think) {
    ds4_chat_msg *m = calloc((size_t)n + 1, sizeof *m);
    if (!m) return false;
    const bool fresh = ds4_session_n_tokens(a->s) == 0;
    int k = 0;
    char sys[1200];
    if (fresh) {
        if (!a->o.system_prompt) snprintf(sys, sizeof sys, DEFAULT_SYSTEM_PROMPT, a->o.tools.root);
        m[k++] = (ds4_chat_msg){.role = DS4_ROLE_SYSTEM, .content = a->o.system_prompt ? a->o.system_prompt : sys};
    }
    for (int i = 0; i < n; i++) m[k++] = (ds4_chat_msg){.role = msgs[i].role, .content = msgs[i].content};
    int n_tools;
    ds4_chat_opts co;
    ds4_chat_opts_default(&co);
    co.profile = a->spec->profile;
    co.think = think;
    co.add_generation_prompt = gen_prompt;
    co.tools = ds4_agent_tool_defs(&n_tools);
    co.n_tools = n_tools;
    ds4_chat_spans spans = {0};
    co.client_spans = &spans;
    ds4_buf text = {0};
    char err[256];
    bool ok = true;
    if (fresh) ok = ds4_chat_render(m, k, &co, &text, err, sizeof err);
    else a->spec->render_tail(m, k, &co, &text);
    ok = ok && !text.oom && !spans.oom &&
         ds4_chat_encode(a->tok, text.data ? text.data : "", 0, text.len, &spans, &a->pending) == 0;
    ds4_buf_free(&text);
    ds4_chat_spans_free(&spans);
    free(m);
    return ok;
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

static int compact(ds4_agent *a, bool automatic);

/* The session plus `more` tokens would fill more than compact_percent of
 * the context. After an automatic compaction that left the session still
 * that full (a long kept tail), not again until it has grown by an eighth
 * of the context: a summary per step would cost more than it frees. */
static bool over_threshold(const ds4_agent *a, long more) {
    const long ctx = ds4_session_ctx(a->s), n = ds4_session_n_tokens(a->s);
    if (n == 0 || a->o.compact_percent <= 0 || (n + more) * 100 <= ctx * a->o.compact_percent) return false;
    return !a->compacted_n || n + more - a->compacted_n >= ctx / 8;
}

/* Renders the pending messages (gen_prompt as render_msgs) and prefills
 * them; they are forgotten once in the session. When they would take the
 * session past compact_percent of the context, the conversation is first
 * compacted (compact()) and they are rendered again after the new
 * session. 0 done, 1 interrupted, -1 error (printed), -2 they do not fit
 * (nothing printed; the messages stay pending). */
static int prefill_msgs(ds4_agent *a, bool gen_prompt) {
    a->pending.n = 0;
    if (!render_msgs(a, a->msgs, a->n_msgs, gen_prompt, think_mode(a))) {
        ds4_agent_display_note(a->o.display, "out of memory");
        return -1;
    }
    if (over_threshold(a, (long)a->pending.n)) {
        int rc = compact(a, true);
        if (rc > 0) return 1;
        a->pending.n = 0;
        /* compacted or not, the messages go after what the session holds now */
        if (!render_msgs(a, a->msgs, a->n_msgs, gen_prompt, think_mode(a))) return -1;
    }
    if (!pending_fits(a)) { a->pending.n = 0; return -2; }
    int rc = prefill_pending(a);
    if (rc == 0) drop_msgs(a, 0);
    a->pending.n = 0;
    return rc;
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
    ds4_buf answer;              /* the visible answer (a summary is read from it) */
    bool oom;
} gen_state;

static void on_event(void *ud, const ds4_dsml_event *ev) {
    gen_state *g = ud;
    ds4_agent_display *d = g->a->o.display;
    switch (ev->kind) {
    case DS4_DSML_EV_REASONING: ds4_agent_display_reasoning(d, ev->text, ev->len); break;
    case DS4_DSML_EV_CONTENT:
        ds4_agent_display_answer(d, ev->text, ev->len);
        ds4_buf_put(&g->answer, ev->text, ev->len);
        if (g->answer.oom) g->oom = true;
        break;
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
    ds4_buf_free(&g->answer);
}

/* ds4_generate hooks: the family's tool-call parser decides when a message
 * ends and when sampling is protocol-greedy; the script, when there is one,
 * forces every token (EOS after its last). */
typedef struct {
    ds4_agent *a;
    void *p;
    const ds4_token_ids *scripted;
} gen_hooks_state;

static bool hook_cancelled(void *ud) { return interrupted(((gen_hooks_state *)ud)->a); }

static int hook_forced(void *ud, int step) {
    gen_hooks_state *h = ud;
    if (!h->scripted) return -1;
    return (size_t)step < h->scripted->n ? h->scripted->v[step] : h->a->sp->eos;
}

static bool hook_greedy(void *ud) {
    gen_hooks_state *h = ud;
    return h->a->spec->parser->in_structure(h->p);
}

static bool hook_text(void *ud, const char *text, size_t len) {
    gen_hooks_state *h = ud;
    h->a->spec->parser->feed(h->p, text, len);
    return h->a->spec->parser->done(h->p);
}

static void hook_decoded(void *ud) { ((gen_hooks_state *)ud)->a->st.decoded++; }

/* Samples (or takes from the script) one assistant message of at most
 * max_tokens into the session, after a generation prompt for `think`.
 * 0 done, 1 interrupted, -1 error. */
static int generate(ds4_agent *a, gen_state *g, ds4_think_mode think, int max_tokens) {
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
    int n_defs;
    const ds4_tool_def *defs = ds4_agent_tool_defs(&n_defs);
    const ds4_tool_parser_ops *ops = a->spec->parser;
    ds4_tool_parser_opts po = {.thinking = think != DS4_THINK_NONE, .tools = true, .defs = defs, .n_defs = n_defs};
    void *p = ops->create(&po, on_event, g);
    if (!p) { ds4_token_ids_free(&scripted); return -1; }
    gen_hooks_state hs = {a, p, have_script ? &scripted : NULL};
    ds4_gen_hooks hooks = {.cancelled = hook_cancelled, .forced = hook_forced, .greedy = hook_greedy,
                           .on_text = hook_text, .after_decode = hook_decoded, .ud = &hs, .spec = a->o.spec};
    char err[256];
    int from = ds4_session_n_tokens(a->s), rc = 0;
    ds4_gen_result r = ds4_generate(a->s, a->tok, a->smp, max_tokens, &hooks, err, sizeof err);
    if (r.end == DS4_GEN_CANCELLED) rc = 1;
    /* an interrupted block is cut off by the user, not malformed */
    else ops->finish(p);
    ops->free(p);
    ds4_token_ids_free(&scripted);
    ds4_agent_display_end(a->o.display);
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

/* Runs the calls and queues their results as tool messages (one
 * tool-result turn when rendered). */
static int run_tools(ds4_agent *a, gen_state *g) {
    bool oom = false;
    int rc = 0;
    if (g->error) {
        ds4_buf msg = {0};
        ds4_buf_puts(&msg, "error: malformed tool call (");
        ds4_buf_puts(&msg, g->error);
        ds4_buf_puts(&msg, "); nothing was run. Write the call again in the tool-call format the tools block shows.");
        ds4_agent_display_tool_start(a->o.display, "(malformed tool call)", "");
        ds4_agent_display_tool_end(a->o.display, g->error, NULL, 0);
        oom = msg.oom || !push_msg(a, DS4_ROLE_TOOL, msg.data ? msg.data : "", msg.len);
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
        if (took < 0) oom = true;
        else used += took;
        ds4_agent_display_tool_end(a->o.display, r.summary, r.display.data, r.display.len);
        /* tool output is client text: rendered as text, so a file cannot forge turns */
        if (!push_msg(a, DS4_ROLE_TOOL, r.text.data ? r.text.data : "", r.text.len)) oom = true;
        ds4_agent_tool_result_free(&r);
    }
    if (interrupted(a)) rc = 1;
    return oom ? -1 : rc;
}

static void context_full_note(ds4_agent *a, const char *what) {
    ds4_agent_display_note(a->o.display, "context full (%d of %d tokens): %s; start a /new session or a larger --ctx",
                           ds4_session_n_tokens(a->s), ds4_session_ctx(a->s), what);
}

int ds4_agent_turn(ds4_agent *a, const char *user_text) {
    const int msgs_before = a->n_msgs;
    const bool fresh = ds4_session_n_tokens(a->s) == 0;
    if (!push_msg(a, DS4_ROLE_USER, user_text, strlen(user_text))) {
        ds4_agent_display_note(a->o.display, "out of memory");
        return -1;
    }
    int rc = prefill_msgs(a, true);
    if (rc != 0) {
        /* the message was not taken: back to the state before it */
        drop_msgs(a, msgs_before);
        if (rc == -2) context_full_note(a, "the message does not fit");
        if (rc > 0) ds4_agent_display_note(a->o.display, "[interrupted: message not sent]");
        return rc > 0 ? 1 : -1;
    }
    if (fresh && !a->id[0]) {
        a->created = (uint64_t)time(NULL);
        ds4_agent_session_id(user_text, a->created, a->id);
    }
    for (int step = 0;; step++) {
        gen_state g = {.a = a};
        rc = generate(a, &g, think_mode(a), a->o.max_gen_tokens);
        if (rc == 0 && (g.n_calls > 0 || g.error)) {
            /* past the threshold already: compact first, so the results get
             * the room of the new session rather than a note */
            if (over_threshold(a, 0) && compact(a, true) > 0) rc = 1;
            else rc = run_tools(a, &g);
            if (rc == 0 && step + 1 >= a->o.max_steps) {
                ds4_agent_display_note(a->o.display, "[%d tool rounds: stopping here; send a message to go on]", a->o.max_steps);
                rc = 1;
            }
            if (rc == 0) {
                rc = prefill_msgs(a, true);
                if (rc == -2) {
                    /* even the notes do not fit: results left pending would
                     * fail every later turn, so they are dropped and the
                     * message with the calls ends as it is */
                    drop_msgs(a, 0);
                    context_full_note(a, "the tool results were dropped");
                    rc = -1;
                }
                /* otherwise, on failure the results wait for the next message */
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

/* ---- compaction ----
 *
 * When the conversation nearly fills the context, the model summarises it
 * and a new session starts from the summary and the last turns: the tools
 * block and system prompt, one user message holding the summary, then the
 * last messages' tokens as they are (up to a quarter of the context, from a
 * message start; at least the last user or tool turn and the answer after
 * it). The old session is saved first and stays in the store. */

#define COMPACT_REQUEST                                                                                            \
    "The context is nearly full, so the conversation up to here will be replaced by your summary of it. Write " \
    "that summary now, for yourself: the task, what was done (files read and changed, commands run and what "   \
    "they showed), decisions made, and what is left to do. Be concise and specific; do not call tools."
#define SUMMARY_INTRO "Summary of the earlier conversation (compacted from session %.12s):\n\n"

/* Where the kept tail starts: the earliest message start after the first
 * user message whose tail fits in a quarter of the context, else the last
 * message start; 0 when the conversation is a single message. */
static int kept_from(const ds4_agent *a) {
    const int32_t *t = ds4_session_tokens(a->s);
    const int n = ds4_session_n_tokens(a->s), quarter = ds4_session_ctx(a->s) / 4;
    int first = -1, last = 0;
    for (int i = 0; i < n; i++) {
        if (t[i] != a->sp->user && !(a->sp->observation >= 0 && t[i] == a->sp->observation)) continue;
        if (first < 0) { first = i; continue; }
        if (n - i <= quarter) return i;
        last = i;
    }
    return last;
}

/* 0 compacted, 1 interrupted, -1 not compacted (printed). On failure
 * before the new session is built the conversation is as it was. */
static int compact(ds4_agent *a, bool automatic) {
    const int n = ds4_session_n_tokens(a->s), ctx = ds4_session_ctx(a->s);
    ds4_agent_display *d = a->o.display;
    if (n == 0 || !a->id[0]) { ds4_agent_display_note(d, "nothing to compact yet"); return -1; }
    const int keep = kept_from(a);
    if (keep == 0) { ds4_agent_display_note(d, "cannot compact: the conversation is a single message"); return -1; }
    char err[512], old_id[DS4_AGENT_ID_HEX + 1];
    snprintf(old_id, sizeof old_id, "%s", a->id);
    if (a->o.sessions_dir && ds4_agent_save(a, a->o.sessions_dir, err, sizeof err)) {
        ds4_agent_display_note(d, "not compacting: saving the session failed: %s", err);
        return -1;
    }
    ds4_agent_display_note(d, "[context %d of %d tokens%s: summarising the conversation]", n, ctx,
                           automatic ? " (nearly full)" : "");
    /* the summary request after the live message, thinking off: the room
     * left is for the summary */
    pending_msg req = {DS4_ROLE_USER, COMPACT_REQUEST};
    a->pending.n = 0;
    if (!render_msgs(a, &req, 1, true, DS4_THINK_NONE)) { ds4_agent_display_note(d, "out of memory"); return -1; }
    const int room = ctx - n - (int)a->pending.n - 1;
    if (room < 32) {
        a->pending.n = 0;
        ds4_agent_display_note(d, "cannot compact: no room left for a summary (%d tokens free)", ctx - n);
        return -1;
    }
    int rc = prefill_pending(a);
    a->pending.n = 0;
    if (rc != 0) return rc;
    gen_state g = {.a = a};
    int budget = a->o.max_gen_tokens < room ? a->o.max_gen_tokens : room;
    if (budget > ctx / 8 && ctx / 8 >= 32) budget = ctx / 8;
    rc = generate(a, &g, DS4_THINK_NONE, budget);
    ds4_buf summary = {0};
    if (rc == 0) {
        char intro[128];
        snprintf(intro, sizeof intro, SUMMARY_INTRO, old_id);
        ds4_buf_puts(&summary, intro);
        size_t from = 0;
        while (from < g.answer.len && (g.answer.data[from] == '\n' || g.answer.data[from] == ' ')) from++;
        if (from == g.answer.len) rc = -1;
        ds4_buf_put(&summary, g.answer.data + from, g.answer.len - from);
        if (summary.oom) rc = -1;
    }
    gen_free(&g);
    ds4_token_ids kept = {0};
    if (rc == 0) {
        /* the tail's tokens as they are, before the session is cleared */
        kept.v = malloc((size_t)(n - keep) * sizeof *kept.v);
        if (kept.v) {
            memcpy(kept.v, ds4_session_tokens(a->s) + keep, (size_t)(n - keep) * sizeof *kept.v);
            kept.n = kept.cap = (size_t)(n - keep);
        } else {
            rc = -1;
        }
    }
    if (rc != 0) {
        /* back to the conversation as it was: the request and the summary go */
        ds4_session_rewind(a->s, n, err, sizeof err);
        ds4_buf_free(&summary);
        ds4_token_ids_free(&kept);
        if (rc < 0) ds4_agent_display_note(d, "compaction failed: the model wrote no summary");
        return rc;
    }
    ds4_session_rewind(a->s, 0, err, sizeof err);
    pending_msg intro = {DS4_ROLE_USER, summary.data};
    a->pending.n = 0;
    bool ok = render_msgs(a, &intro, 1, false, think_mode(a)) && add_tokens(a, kept.v, kept.n);
    const int summary_tokens = (int)a->pending.n - (int)kept.n;
    rc = ok ? prefill_pending(a) : -1;
    a->pending.n = 0;
    a->st.prefilled = ds4_session_n_tokens(a->s);
    a->st.decoded = 0;
    a->st.restored = 0;
    ds4_token_ids_free(&kept);
    if (rc != 0) {
        ds4_session_rewind(a->s, 0, err, sizeof err);
        a->id[0] = 0;
        a->st.prefilled = 0;
        ds4_agent_display_note(d, "compaction %s: the session is empty now; the old one is saved as %.12s "
                               "(/switch %.12s)", rc > 0 ? "interrupted" : "failed", old_id, old_id);
        ds4_buf_free(&summary);
        return rc > 0 ? 1 : -1;
    }
    a->created = (uint64_t)time(NULL);
    ds4_agent_session_id(summary.data, a->created, a->id);
    a->compacted_n = automatic ? ds4_session_n_tokens(a->s) : 0;
    ds4_buf_free(&summary);
    ds4_agent_display_note(d, "[compacted: %d tokens -> %d (prompt and summary %d + the last %d as they were); "
                           "new session %.12s, the old one is saved as %.12s]",
                           n, ds4_session_n_tokens(a->s), summary_tokens, n - keep, a->id, old_id);
    return 0;
}

int ds4_agent_compact(ds4_agent *a) { return compact(a, false); }

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
    drop_msgs(a, 0);
    a->compacted_n = 0;
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
    if (rc != 0) { a->id[0] = 0; return rc; }
    /* every saved session ends with an assistant message whose stop token
     * the session does not hold: the next step renders the family's tail */
    snprintf(a->id, sizeof a->id, "%s", id);
    a->created = created;
    return 0;
}
