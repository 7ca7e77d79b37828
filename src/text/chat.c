/* chat.c -- see chat.h. Literal texts are from deepseek-v4-prompt-format.md
 * (4.6, 5.2, 6.2); the two profiles share them where the bytes agree. */
#include "text/chat.h"
#include "text/chat_internal.h"

#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 4.6, original revision: the only Think Max text ds4 and the original
 * V4-Flash encoder know. */
static const char THINK_MAX_PREAMBLE[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

#define TOOLS_INTRO(WHOSE) \
    "## Tools\n\nYou have access to a set of tools to help answer the " WHOSE \
    ". You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n" \
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n" \
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n" \
    "...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n" \
    "</｜DSML｜tool_calls>\n\n"
#define TOOLS_OTHER_TYPES \
    "For all other types (numbers, booleans, arrays, objects), pass the value in JSON format " \
    "and set `string=\"false\"`.\n\n" \
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning " \
    "inside <think>...</think> BEFORE any tool calls or final response.\n\n" \
    "Otherwise, output directly after </think> with tool calls or final response.\n\n" \
    "### Available Tool Schemas\n\n"
#define TOOLS_MUST \
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls."

static const char OFFICIAL_TOOLS_HEAD[] =
    TOOLS_INTRO("user's question")
    "String parameters should be specified as is and set `string=\"true\"`. " TOOLS_OTHER_TYPES;
static const char OFFICIAL_TOOLS_TAIL[] = TOOLS_MUST "\n";

static const char DS4_TOOLS_HEAD[] =
    TOOLS_INTRO("user question")
    "String parameters should be specified as raw text and set `string=\"true\"`. Preserve "
    "characters such as `>`, `&`, and `&&` exactly; never replace normal string characters with "
    "XML or HTML entity escapes. Only if a string value itself contains the exact closing "
    "parameter tag `</｜DSML｜parameter>`, write that tag as `&lt;/｜DSML｜parameter>` inside the "
    "value. " TOOLS_OTHER_TYPES;
static const char DS4_TOOLS_TAIL[] = TOOLS_MUST " Use the exact parameter names from the schemas.";

static const char *nz(const char *s) { return s ? s : ""; }

void ds4_chat_spans_add(ds4_chat_spans *sp, size_t start, size_t end) {
    if (!sp || end <= start) return;
    if (sp->n == sp->cap) {
        size_t cap = sp->cap ? 2 * sp->cap : 16;
        ds4_chat_span *v = realloc(sp->v, cap * sizeof *v);
        if (!v) { sp->oom = true; return; }
        sp->v = v;
        sp->cap = cap;
    }
    sp->v[sp->n++] = (ds4_chat_span){start, end};
}

void ds4_chat_put_text(const ds4_chat_opts *o, ds4_buf *out, const char *s, size_t n) {
    size_t start = out->len;
    ds4_buf_put(out, s, n);
    ds4_chat_spans_add(o->client_spans, start, out->len);
}

static void put_client(const ds4_chat_opts *o, ds4_buf *out, const char *text) {
    ds4_chat_put_text(o, out, nz(text), strlen(nz(text)));
}

static void put_client_result(const ds4_chat_opts *o, ds4_buf *out, const char *content) {
    size_t start = out->len;
    ds4_chat_tool_result(nz(content), strlen(nz(content)), o->profile, out);
    ds4_chat_spans_add(o->client_spans, start, out->len);
}

bool ds4_chat_fail(char *err, size_t errlen, const char *msg, int i) {
    if (errlen) snprintf(err, errlen, msg, i);
    return false;
}

void ds4_chat_opts_default(ds4_chat_opts *o) {
    memset(o, 0, sizeof *o);
    o->profile = DS4_CHAT_DS4;
    o->think = DS4_THINK_HIGH;
    o->drop_thinking = true;
    o->add_generation_prompt = true;
}

ds4_chat_profile ds4_chat_profile_for(const ds4_tokenizer *t) {
    return ds4_tokenizer_family(t) == DS4_TOK_FAMILY_GLM ? DS4_CHAT_GLM : DS4_CHAT_DS4;
}

ds4_think_mode ds4_chat_effective_think(ds4_think_mode m, int ctx) {
    return m == DS4_THINK_MAX && ctx > 0 && ctx < DS4_THINK_MAX_MIN_CTX ? DS4_THINK_HIGH : m;
}

void ds4_chat_tool_result(const char *content, size_t n, ds4_chat_profile profile, ds4_buf *out) {
    ds4_buf_puts(out, "<tool_result>");
    if (profile == DS4_CHAT_DS4) ds4_buf_put_replaced(out, content, n, "</tool_result>", "&lt;/tool_result>");
    else ds4_buf_put(out, content, n);
    ds4_buf_puts(out, "</tool_result>");
}

/* ---- tools block ------------------------------------------------------------ */

static void compose_schema(const ds4_tool_def *t, ds4_buf *out) {
    ds4_buf_puts(out, "{\"name\":");
    ds4_json_quote(nz(t->name), strlen(nz(t->name)), DS4_JSON_COMPACT, out);
    if (t->description) {
        ds4_buf_puts(out, ",\"description\":");
        ds4_json_quote(t->description, strlen(t->description), DS4_JSON_COMPACT, out);
    }
    if (t->parameters) {
        ds4_buf_puts(out, ",\"parameters\":");
        ds4_buf_puts(out, t->parameters);
    }
    ds4_buf_putc(out, '}');
}

const char *ds4_chat_tool_json(const ds4_tool_def *t, ds4_buf *tmp) {
    if (t->json) return t->json;
    ds4_buf_clear(tmp);
    compose_schema(t, tmp);
    return nz(tmp->data);
}

bool ds4_chat_tools_block(const ds4_tool_def *tools, int n, ds4_chat_profile profile,
                          ds4_buf *out, char *err, size_t errlen) {
    bool official = profile == DS4_CHAT_OFFICIAL;
    ds4_buf tmp = {0};
    bool ok = true;
    ds4_buf_puts(out, official ? OFFICIAL_TOOLS_HEAD : DS4_TOOLS_HEAD);
    for (int i = 0; i < n && ok; i++) {
        if (i) ds4_buf_putc(out, '\n');
        const char *src = ds4_chat_tool_json(&tools[i], &tmp);
        if (!official) ds4_buf_puts(out, src);
        else if (!ds4_json_reformat(src, strlen(src), DS4_JSON_PY, out))
            ok = ds4_chat_fail(err, errlen, "tool %d: schema is not valid JSON", i);
    }
    ds4_buf_puts(out, official ? OFFICIAL_TOOLS_TAIL : DS4_TOOLS_TAIL);
    ds4_buf_free(&tmp);
    return ok;
}

/* The tools block with its schemas marked as client text: they sit between
 * the head and tail, whose DSML examples are the template's own. */
static bool put_tools_block(const ds4_chat_opts *o, ds4_chat_profile profile, ds4_buf *out, char *err, size_t errlen) {
    size_t head = strlen(profile == DS4_CHAT_OFFICIAL ? OFFICIAL_TOOLS_HEAD : DS4_TOOLS_HEAD);
    size_t tail = strlen(profile == DS4_CHAT_OFFICIAL ? OFFICIAL_TOOLS_TAIL : DS4_TOOLS_TAIL);
    size_t start = out->len;
    if (!ds4_chat_tools_block(o->tools, o->n_tools, profile, out, err, errlen)) return false;
    ds4_chat_spans_add(o->client_spans, start + head, out->len - tail);
    return true;
}

/* ---- shared pieces ------------------------------------------------------------ */

static void put_preamble(ds4_buf *out, ds4_think_mode think) {
    ds4_buf_puts(out, DS4_STR_BOS);
    if (think == DS4_THINK_MAX) ds4_buf_puts(out, THINK_MAX_PREAMBLE);
}

/* DS4 exact replay: every call id known and all mapped to one block. */
const char *ds4_chat_replay_block(const ds4_chat_msg *m, const ds4_chat_opts *o) {
    if (!o->replay || m->n_tool_calls <= 0) return NULL;
    const char *block = NULL;
    for (int i = 0; i < m->n_tool_calls; i++) {
        const char *id = m->tool_calls[i].id;
        const char *b = id ? o->replay(o->replay_ud, id) : NULL;
        if (!b || (block && strcmp(block, b) != 0)) return NULL;
        block = b;
    }
    return block;
}

/* Names and arguments of a client's tool calls are client text too. */
static void mark_client(void *ud, size_t start, size_t end) { ds4_chat_spans_add(ud, start, end); }

static bool put_tool_calls(const ds4_chat_msg *m, const ds4_chat_opts *o, ds4_buf *out,
                           char *err, size_t errlen) {
    if (m->n_tool_calls <= 0) return true;
    const char *exact = o->profile == DS4_CHAT_DS4 ? ds4_chat_replay_block(m, o) : NULL;
    if (exact) { ds4_buf_puts(out, exact); return true; }
    return ds4_dsml_render_calls_marked(m->tool_calls, m->n_tool_calls,
                                        o->profile == DS4_CHAT_DS4 ? DS4_DSML_DS4 : DS4_DSML_OFFICIAL, out,
                                        mark_client, o->client_spans, err, errlen);
}

static bool check_roles(const ds4_chat_msg *msgs, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        if ((unsigned)msgs[i].role > DS4_ROLE_TOOL) return ds4_chat_fail(err, errlen, "message %d: unknown role", i);
    return true;
}

/* ---- DS4 profile (6.1) ------------------------------------------------------------ */

static bool render_ds4(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o, ds4_think_mode think,
                       ds4_buf *out, char *err, size_t errlen) {
    bool tool_context = o->n_tools > 0;
    int last_user = -1;
    for (int i = 0; i < n; i++) {
        ds4_chat_role r = msgs[i].role;
        if (r == DS4_ROLE_TOOL || (r == DS4_ROLE_ASSISTANT && msgs[i].n_tool_calls > 0)) tool_context = true;
        if (r == DS4_ROLE_USER || r == DS4_ROLE_TOOL) last_user = i;
    }
    put_preamble(out, think);
    /* tools first, then all system/developer text hoisted: a changing
     * system-prompt tail then leaves the cached tool block intact */
    size_t sys_start = out->len;
    if (o->n_tools > 0 && !put_tools_block(o, DS4_CHAT_DS4, out, err, errlen)) return false;
    for (int i = 0; i < n; i++) {
        if (msgs[i].role != DS4_ROLE_SYSTEM && msgs[i].role != DS4_ROLE_DEVELOPER) continue;
        if (out->len > sys_start) ds4_buf_puts(out, "\n\n");
        put_client(o, out, msgs[i].content);
    }
    bool pending_assistant = false, pending_tool_result = false;
    for (int i = 0; i < n; i++) {
        const ds4_chat_msg *m = &msgs[i];
        switch (m->role) {
        case DS4_ROLE_USER:
            ds4_buf_puts(out, DS4_STR_USER);
            put_client(o, out, m->content);
            pending_assistant = true;
            pending_tool_result = false;
            break;
        case DS4_ROLE_TOOL:
            if (!pending_tool_result) ds4_buf_puts(out, DS4_STR_USER);
            put_client_result(o, out, m->content);
            pending_assistant = pending_tool_result = true;
            break;
        case DS4_ROLE_ASSISTANT:
            if (pending_assistant) {
                ds4_buf_puts(out, DS4_STR_ASSISTANT);
                if (think != DS4_THINK_NONE && (tool_context || i > last_user)) {
                    ds4_buf_puts(out, DS4_STR_THINK_OPEN);
                    put_client(o, out, m->reasoning_content);
                }
                ds4_buf_puts(out, DS4_STR_THINK_CLOSE);
            }
            put_client(o, out, m->content);
            if (!put_tool_calls(m, o, out, err, errlen)) return false;
            ds4_buf_puts(out, DS4_STR_EOS);
            pending_assistant = pending_tool_result = false;
            break;
        default:
            break;
        }
    }
    if (pending_assistant && o->add_generation_prompt) {
        ds4_buf_puts(out, DS4_STR_ASSISTANT);
        ds4_buf_puts(out, think != DS4_THINK_NONE ? DS4_STR_THINK_OPEN : DS4_STR_THINK_CLOSE);
    }
    return true;
}

/* ---- OFFICIAL profile (4.2-4.5, 5.1, 5.6) ------------------------------------------ */

/* A rendered turn after the official pre-processing: tool messages and user
 * messages merge into user turns made of blocks. m == NULL is the empty
 * system message inserted to carry request-level tools. */
typedef struct {
    ds4_chat_role role;
    const ds4_chat_msg *m;
    int first, nblocks;      /* user turns: blocks[first .. first+nblocks) */
    bool tools;
    bool drop_reasoning;
} turn;

typedef struct { const ds4_chat_msg *m; int order; } block;   /* m->role USER or TOOL */

static int call_position(const ds4_chat_msg *asst, const char *id) {
    if (!asst || !id) return 0;
    for (int k = 0; k < asst->n_tool_calls; k++)
        if (asst->tool_calls[k].id && strcmp(asst->tool_calls[k].id, id) == 0) return k;
    return 0;
}

/* Stable re-sort of a turn's tool results by call order; text blocks keep
 * their slots. Insertion sort over the result slots: turns are small. */
static void sort_results(block *b, int nb, const ds4_chat_msg *asst) {
    int nr = 0;
    for (int k = 0; k < nb; k++)
        if (b[k].m->role == DS4_ROLE_TOOL) {
            b[k].order = call_position(asst, b[k].m->tool_call_id);
            nr++;
        }
    if (nr < 2) return;
    for (int k = 0; k < nb; k++) {
        if (b[k].m->role != DS4_ROLE_TOOL) continue;
        for (int c = k;;) {
            int p = c - 1;
            while (p >= 0 && b[p].m->role != DS4_ROLE_TOOL) p--;
            if (p < 0 || b[p].order <= b[c].order) break;
            block tmp = b[p]; b[p] = b[c]; b[c] = tmp;
            c = p;
        }
    }
}

static bool render_official(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o, ds4_think_mode think,
                            ds4_buf *out, char *err, size_t errlen) {
    turn *t = calloc((size_t)n + 1, sizeof *t);
    block *b = calloc((size_t)n + 1, sizeof *b);
    bool ok = t && b;
    int nt = 0, nb = 0;
    if (ok && o->n_tools > 0 && (n == 0 || msgs[0].role != DS4_ROLE_SYSTEM))
        t[nt++] = (turn){ .role = DS4_ROLE_SYSTEM, .tools = true };
    for (int i = 0; ok && i < n; i++) {
        const ds4_chat_msg *m = &msgs[i];
        if (m->role == DS4_ROLE_DEVELOPER && !(m->content && m->content[0]))
            ok = ds4_chat_fail(err, errlen, "message %d: developer message needs content", i);
        if (m->role != DS4_ROLE_USER && m->role != DS4_ROLE_TOOL) {
            t[nt++] = (turn){ .role = m->role, .m = m, .tools = i == 0 && o->n_tools > 0 && m->role == DS4_ROLE_SYSTEM };
            continue;
        }
        if (nt == 0 || t[nt - 1].role != DS4_ROLE_USER) t[nt++] = (turn){ .role = DS4_ROLE_USER, .first = nb };
        b[nb++] = (block){ .m = m };
        t[nt - 1].nblocks++;
    }
    const ds4_chat_msg *last_calls = NULL;
    for (int k = 0; ok && k < nt; k++) {
        if (t[k].role == DS4_ROLE_ASSISTANT && t[k].m->n_tool_calls > 0) last_calls = t[k].m;
        if (t[k].role == DS4_ROLE_USER) sort_results(b + t[k].first, t[k].nblocks, last_calls);
    }
    /* drop_thinking: off without thinking and whenever tools are in the prompt */
    bool drop = think != DS4_THINK_NONE && o->drop_thinking && o->n_tools == 0;
    int last_user = -1;
    for (int k = 0; k < nt; k++)
        if (t[k].role == DS4_ROLE_USER || t[k].role == DS4_ROLE_DEVELOPER) last_user = k;
    if (drop) {
        int w = 0;
        for (int k = 0; k < nt; k++) {
            if (k < last_user && t[k].role == DS4_ROLE_DEVELOPER) continue;
            t[k].drop_reasoning = k < last_user && t[k].role == DS4_ROLE_ASSISTANT;
            if (k == last_user) last_user = w;
            t[w++] = t[k];
        }
        nt = w;
    }
    if (ok) put_preamble(out, think);
    for (int k = 0; ok && k < nt; k++) {
        const turn *u = &t[k];
        switch (u->role) {
        case DS4_ROLE_SYSTEM:
            put_client(o, out, u->m ? u->m->content : NULL);
            if (u->tools) {
                ds4_buf_puts(out, "\n\n");
                ok = put_tools_block(o, DS4_CHAT_OFFICIAL, out, err, errlen);
            }
            break;
        case DS4_ROLE_DEVELOPER:
            ds4_buf_puts(out, DS4_STR_USER);
            put_client(o, out, u->m->content);
            break;
        case DS4_ROLE_USER:
            ds4_buf_puts(out, DS4_STR_USER);
            for (int j = 0; j < u->nblocks; j++) {
                const ds4_chat_msg *m = b[u->first + j].m;
                if (j) ds4_buf_puts(out, "\n\n");
                if (m->role == DS4_ROLE_TOOL) put_client_result(o, out, m->content);
                else put_client(o, out, m->content);
            }
            break;
        default:   /* assistant */
            if (think != DS4_THINK_NONE && !u->drop_reasoning) {
                put_client(o, out, u->m->reasoning_content);
                ds4_buf_puts(out, DS4_STR_THINK_CLOSE);
            }
            put_client(o, out, u->m->content);
            ok = put_tool_calls(u->m, o, out, err, errlen);
            ds4_buf_puts(out, DS4_STR_EOS);
            break;
        }
        bool last = k == nt - 1;
        bool transition = (u->role == DS4_ROLE_USER || u->role == DS4_ROLE_DEVELOPER) &&
                          (last ? o->add_generation_prompt : t[k + 1].role == DS4_ROLE_ASSISTANT);
        if (ok && transition) {
            ds4_buf_puts(out, DS4_STR_ASSISTANT);
            bool open = think != DS4_THINK_NONE && (!drop || k == last_user);
            ds4_buf_puts(out, open ? DS4_STR_THINK_OPEN : DS4_STR_THINK_CLOSE);
        }
    }
    if (!t || !b) ds4_chat_fail(err, errlen, "out of memory", 0);
    free(t);
    free(b);
    return ok;
}

bool ds4_chat_render(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o,
                     ds4_buf *out, char *err, size_t errlen) {
    if (n < 0 || (n > 0 && !msgs)) return ds4_chat_fail(err, errlen, "bad message list (%d)", n);
    if (!check_roles(msgs, n, err, errlen)) return false;
    if ((unsigned)o->think > DS4_THINK_MAX) return ds4_chat_fail(err, errlen, "unknown thinking mode %d", (int)o->think);
    ds4_think_mode think = ds4_chat_effective_think(o->think, o->ctx);
    bool ok;
    switch (o->profile) {
    case DS4_CHAT_GLM:
    case DS4_CHAT_GLM47:    ok = ds4_glm_chat_render(msgs, n, o, out, err, errlen); break;
    case DS4_CHAT_DS4:      ok = render_ds4(msgs, n, o, think, out, err, errlen); break;
    case DS4_CHAT_OFFICIAL: ok = render_official(msgs, n, o, think, out, err, errlen); break;
    default:                return ds4_chat_fail(err, errlen, "unknown chat profile %d", (int)o->profile);
    }
    if (ok && out->oom) return ds4_chat_fail(err, errlen, "out of memory", 0);
    return ok;
}

void ds4_chat_spans_free(ds4_chat_spans *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

int ds4_chat_encode(const ds4_tokenizer *t, const char *text, size_t from, size_t to,
                    const ds4_chat_spans *client, ds4_token_ids *out) {
    size_t seg = from, span = 0;
    for (size_t i = from; i < to;) {
        size_t len = ds4_tokenizer_chat_special_len(t, text + i, to - i);
        if (!len) { i++; continue; }
        while (client && span < client->n && client->v[span].end <= i) span++;
        if (client && span < client->n && client->v[span].start < i + len) { i += len; continue; }
        /* A template marker: the text before it is plain, exactly as the
         * tokenizer splits at specials itself. */
        if (ds4_tokenizer_encode(t, text + seg, i - seg, DS4_TOK_SPECIALS_NONE, out) ||
            ds4_tokenizer_encode(t, text + i, len, DS4_TOK_SPECIALS_CHAT, out)) return -1;
        i += len;
        seg = i;
    }
    return ds4_tokenizer_encode(t, text + seg, to - seg, DS4_TOK_SPECIALS_NONE, out);
}
