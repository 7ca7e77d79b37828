#include "server/request.h"

#include "models/chat_spec.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ds4_req_alloc {
    struct ds4_req_alloc *next;
    max_align_t data[];
};

/* ---- helpers ------------------------------------------------------- */

typedef struct {
    ds4_request *r;
    ds4_req_error *e;
} dec;

static void *ralloc(dec *d, size_t n) {
    struct ds4_req_alloc *a = calloc(1, sizeof *a + n + 1);
    if (!a) return NULL;
    a->next = d->r->allocs;
    d->r->allocs = a;
    return a->data;
}

static char *rstrdup(dec *d, const char *s, size_t n) {
    char *p = ralloc(d, n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

static char *rbuf(dec *d, ds4_buf *b) {
    char *s = b->oom ? NULL : rstrdup(d, b->data ? b->data : "", b->len);
    ds4_buf_free(b);
    return s;
}

__attribute__((format(printf, 5, 6)))
static int fail(dec *d, int status, const char *param, const char *code, const char *fmt, ...) {
    if (d->e->status) return d->e->status;
    d->e->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->e->message, sizeof d->e->message, fmt, ap);
    va_end(ap);
    snprintf(d->e->param, sizeof d->e->param, "%s", param ? param : "");
    snprintf(d->e->code, sizeof d->e->code, "%s", code ? code : "");
    return status;
}

static int bad_json(dec *d) {
    return fail(d, 400, NULL, NULL, "invalid JSON request");
}

static int oom(dec *d) {
    return fail(d, 500, NULL, NULL, "out of memory");
}

/* A role the family does not define fails the request, naming it: dropping
 * a misspelled role's message would silently change the conversation. */
static int unknown_role(dec *d, const char *param, int index, const char *role, const char *known) {
    return fail(d, 400, param, "invalid_value", "%s[%d].role: unknown role '%.64s' (expected %s)", param, index, role,
                known);
}

/* Object member by key; the last of duplicates wins. */
static cJSON *get(const cJSON *o, const char *key) {
    cJSON *hit = NULL;
    if (!cJSON_IsObject(o)) return NULL;
    for (cJSON *c = o->child; c; c = c->next)
        if (c->string && !strcmp(c->string, key)) hit = c;
    return hit;
}

static bool present(const cJSON *v) {
    return v && !cJSON_IsNull(v);
}

/* String member: NULL when absent/null; type errors set e. */
static const char *get_str(dec *d, const cJSON *o, const char *key) {
    cJSON *v = get(o, key);
    if (!present(v)) return NULL;
    if (!cJSON_IsString(v)) { bad_json(d); return NULL; }
    return v->valuestring;
}

static bool get_bool(dec *d, const cJSON *o, const char *key, bool def) {
    cJSON *v = get(o, key);
    if (!present(v)) return def;
    if (!cJSON_IsBool(v)) { bad_json(d); return def; }
    return cJSON_IsTrue(v);
}

/* Number member; returns false when absent. */
static bool get_num(dec *d, const cJSON *o, const char *key, double *out) {
    cJSON *v = get(o, key);
    if (!present(v)) return false;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) { bad_json(d); return false; }
    *out = v->valuedouble;
    return true;
}

static void get_max_tokens(dec *d, const cJSON *o, const char *key) {
    double x;
    if (!get_num(d, o, key, &x)) return;
    if (x < 0 || x != floor(x)) { fail(d, 400, key, "invalid_value", "%s must be a non-negative integer", key); return; }
    d->r->max_tokens = x > 1e9 ? 1000000000 : (int)x;
}

/* Number member within [lo, hi]; out of range fails naming the field. */
static bool get_ranged(dec *d, const cJSON *o, const char *key, double lo, double hi, double *out) {
    if (!get_num(d, o, key, out)) return false;
    if (*out >= lo && *out <= hi) return true;
    if (isinf(hi)) fail(d, 400, key, "invalid_value", "%s must be >= %g", key, lo);
    else fail(d, 400, key, "invalid_value", "%s must be between %g and %g", key, lo, hi);
    return false;
}

/* The per-request steering extension; whether the file is the server's is
 * the slot's check (ds4_srv_steer). */
static void get_steering(dec *d, const cJSON *o) {
    const cJSON *v = get(o, "dir_steering");
    if (!present(v)) return;
    const char *file = cJSON_IsObject(v) ? get_str(d, v, "file") : NULL;
    if (!file) {
        fail(d, 400, "dir_steering", "invalid_value", "dir_steering must be an object with a \"file\" string "
             "(and optional \"ffn\" and \"attn\" scales)");
        return;
    }
    for (int k = 0; k < 2; k++) {
        const cJSON *scale = get(v, k ? "attn" : "ffn");
        if (present(scale) && !cJSON_IsNumber(scale)) {
            fail(d, 400, "dir_steering", "invalid_value", "dir_steering.%s must be a number", k ? "attn" : "ffn");
            return;
        }
    }
    double x;
    d->r->steer_file = file;
    d->r->steer_ffn = get_ranged(d, v, "ffn", -1e6, 1e6, &x) ? (float)x : 1.0f;
    d->r->steer_attn = get_ranged(d, v, "attn", -1e6, 1e6, &x) ? (float)x : 0.0f;
}

static void get_sampling(dec *d, const cJSON *o, bool min_p, bool top_k) {
    get_steering(d, o);
    ds4_sampler_params *sp = &d->r->sampling;
    double x;
    /* 0 is greedy (server-api.md 2.3); a negative value is a client bug. */
    if (get_ranged(d, o, "temperature", 0, INFINITY, &x)) sp->temperature = (float)x;
    if (get_ranged(d, o, "top_p", 0, 1, &x)) sp->top_p = (float)x;
    if (min_p && get_ranged(d, o, "min_p", 0, 1, &x)) sp->min_p = (float)x;
    if (top_k && get_ranged(d, o, "top_k", 0, INFINITY, &x))
        sp->top_k = x > DS4_SAMPLER_MAX_TOP_K ? DS4_SAMPLER_MAX_TOP_K : (int)x;
    if (get_num(d, o, "seed", &x) && x > 0) {
        sp->seed = x >= 1.8e19 ? UINT64_MAX : (uint64_t)x;
        d->r->seed_set = true;
    }
}

static void get_stop(dec *d, const cJSON *v) {
    if (!present(v)) return;
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 1;
    if (!cJSON_IsArray(v) && !cJSON_IsString(v)) { bad_json(d); return; }
    d->r->stop = ralloc(d, sizeof(char *) * (size_t)(n + 1));
    if (!d->r->stop) { oom(d); return; }
    const cJSON *it = cJSON_IsArray(v) ? v->child : v;
    for (; it; it = cJSON_IsArray(v) ? it->next : NULL) {
        if (!cJSON_IsString(it)) { bad_json(d); return; }
        if (it->valuestring[0]) d->r->stop[d->r->n_stop++] = it->valuestring;
    }
}

/* ---- thinking controls (prompt-format sheet section 8) --------------- */

typedef struct {
    bool thinking;      /* on/off */
    bool explicit_ctl;  /* a thinking/think control was present */
    int effort;         /* 0 none-given, 1 high, 2 max, -1 none */
} think_state;

static void think_effort(dec *d, think_state *t, const cJSON *v, const char *param) {
    if (!present(v)) return;
    if (!cJSON_IsString(v)) { bad_json(d); return; }
    const char *s = v->valuestring;
    if (!strcmp(s, "none")) t->effort = -1;
    else if (!strcmp(s, "max")) t->effort = 2;
    else if (!strcmp(s, "minimal") || !strcmp(s, "low") || !strcmp(s, "medium") ||
             !strcmp(s, "high") || !strcmp(s, "xhigh")) t->effort = 1;
    else fail(d, 400, param, "unsupported_value", "unsupported reasoning effort '%.40s'", s);
}

/* vLLM / SGLang style: chat_template_kwargs.enable_thinking (a template's own switch). */
static void think_kwargs(dec *d, think_state *t, const cJSON *root) {
    const cJSON *kw = get(root, "chat_template_kwargs");
    if (present(kw) && !cJSON_IsObject(kw)) { bad_json(d); return; }
    const cJSON *v = get(kw, "enable_thinking");
    if (!present(v)) return;
    if (!cJSON_IsBool(v)) { bad_json(d); return; }
    t->explicit_ctl = true;
    t->thinking = cJSON_IsTrue(v);
}

static void think_control(dec *d, think_state *t, const cJSON *o, const char *key) {
    cJSON *v = get(o, key);
    if (!v) return;
    t->explicit_ctl = true;
    if (cJSON_IsBool(v)) { t->thinking = cJSON_IsTrue(v); return; }
    if (cJSON_IsObject(v)) {
        cJSON *ty = get(v, "type");
        if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "enabled")) t->thinking = true;
        if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "disabled")) t->thinking = false;
        return;
    }
    if (!cJSON_IsNull(v)) bad_json(d);
}

static void think_resolve(dec *d, think_state *t) {
    const char *m = d->r->model;
    if (!t->explicit_ctl && m) ds4_chat_alias_thinking(m, &t->thinking);
    bool max = t->effort == 2 || (t->effort == 0 && d->r->chat->think_max_default);
    if (!t->thinking || t->effort == -1) d->r->think = DS4_THINK_NONE;
    else d->r->think = max ? DS4_THINK_MAX : DS4_THINK_HIGH;
}

/* ---- content ------------------------------------------------------- */

/* Concatenates string parts and the `text` of object parts, no separator;
 * other parts (images, audio, files) are skipped. */
static const char *content_text(dec *d, const cJSON *v) {
    if (!present(v)) return NULL;
    if (cJSON_IsString(v)) return v->valuestring;
    if (!cJSON_IsArray(v)) { bad_json(d); return NULL; }
    ds4_buf b = {0};
    for (const cJSON *p = v->child; p; p = p->next) {
        if (cJSON_IsString(p)) { ds4_buf_puts(&b, p->valuestring); continue; }
        if (!cJSON_IsObject(p)) { ds4_buf_free(&b); bad_json(d); return NULL; }
        cJSON *t = get(p, "text");
        if (cJSON_IsString(t)) ds4_buf_puts(&b, t->valuestring);
        else if (present(t)) { ds4_buf_free(&b); bad_json(d); return NULL; }
        else {
            cJSON *ty = get(p, "type");
            const char *tys = cJSON_IsString(ty) ? ty->valuestring : "";
            /* Placeholders keep the turn meaningful instead of failing the
             * whole session on an attachment we cannot see. */
            if (!strcmp(tys, "input_image") || !strcmp(tys, "image_url") || !strcmp(tys, "image"))
                ds4_buf_puts(&b, "[image]");
            else if (!strcmp(tys, "input_file") || !strcmp(tys, "file"))
                ds4_buf_puts(&b, "[file]");
        }
    }
    return rbuf(d, &b);
}

static char *json_text(dec *d, const cJSON *v) {
    char *s = cJSON_PrintUnformatted(v);
    if (!s) { oom(d); return NULL; }
    char *r = rstrdup(d, s, strlen(s));
    free(s);
    return r;
}

/* Arguments as JSON text: a string is taken as is, a value re-serialised. */
static const char *args_text(dec *d, const cJSON *v) {
    if (!v || cJSON_IsNull(v)) return "{}";
    if (cJSON_IsString(v)) return v->valuestring;
    return json_text(d, v);
}

/* ---- growable arrays of messages / calls / tools -------------------- */

typedef struct {
    ds4_chat_msg *v; int n, cap;
} msg_vec;

static ds4_chat_msg *push_msg(dec *d, msg_vec *m, ds4_chat_role role) {
    if (m->n == m->cap) {
        int cap = m->cap ? m->cap * 2 : 16;
        ds4_chat_msg *nv = ralloc(d, sizeof *nv * (size_t)cap);
        if (!nv) { oom(d); return NULL; }
        if (m->n) memcpy(nv, m->v, sizeof *nv * (size_t)m->n);
        m->v = nv;
        m->cap = cap;
    }
    ds4_chat_msg *x = &m->v[m->n++];
    memset(x, 0, sizeof *x);
    x->role = role;
    return x;
}

/* Room for element n of an arena array whose capacity is implicitly the
 * smallest power of two >= n: growth is geometric without a capacity field,
 * and since the arena keeps the old copies until the request is freed, all
 * copies together stay under twice the final array. */
static void *grow_pow2(dec *d, void *v, size_t n, size_t elem) {
    if (n & (n - 1)) return v;
    void *nv = ralloc(d, elem * (n ? 2 * n : 1));
    if (!nv) { oom(d); return NULL; }
    if (n) memcpy(nv, v, elem * n);
    return nv;
}

static bool push_call(dec *d, ds4_chat_msg *m, const char *id, const char *name, const char *args) {
    ds4_tool_call *nv = grow_pow2(d, (void *)m->tool_calls, (size_t)m->n_tool_calls, sizeof *nv);
    if (!nv) return false;
    nv[m->n_tool_calls] = (ds4_tool_call){.id = id, .name = name, .arguments = args};
    m->tool_calls = nv;
    m->n_tool_calls++;
    return true;
}

static void push_live(dec *d, const char *id) {
    ds4_request *r = d->r;
    const char **nv = grow_pow2(d, (void *)r->live_ids, (size_t)r->n_live_ids, sizeof *nv);
    if (!nv) return;
    nv[r->n_live_ids++] = id;
    r->live_ids = nv;
}

/* True when some assistant call in msgs[0..n) has this id. */
static bool call_replayed(const msg_vec *m, const char *id) {
    for (int i = 0; i < m->n; i++)
        for (int j = 0; j < m->v[i].n_tool_calls; j++)
            if (m->v[i].tool_calls[j].id && !strcmp(m->v[i].tool_calls[j].id, id)) return true;
    return false;
}

static void push_tool(dec *d, const char *name, const char *json, const char *ns,
                      const char *short_name, ds4_tool_kind kind) {
    ds4_request *r = d->r;
    ds4_tool_def *t = grow_pow2(d, r->tools, (size_t)r->n_tools, sizeof *t);
    ds4_tool_meta *m = grow_pow2(d, r->tool_meta, (size_t)r->n_tools, sizeof *m);
    if (!t || !m) return;
    r->tools = t;
    r->tool_meta = m;
    r->tools[r->n_tools] = (ds4_tool_def){.name = name, .json = json};
    r->tool_meta[r->n_tools] = (ds4_tool_meta){.name = name, .ns = ns,
                                               .short_name = short_name ? short_name : name,
                                               .kind = kind};
    r->n_tools++;
}

/* ---- OpenAI chat ---------------------------------------------------- */

static void decode_chat_tools(dec *d, const cJSON *tools) {
    if (!present(tools)) return;
    if (!cJSON_IsArray(tools)) { bad_json(d); return; }
    for (const cJSON *t = tools->child; t && !d->e->status; t = t->next) {
        if (!cJSON_IsObject(t)) { bad_json(d); return; }
        const cJSON *fn = get(t, "function");
        if (!cJSON_IsObject(fn)) fn = t; /* flat form */
        const char *name = get_str(d, fn, "name");
        if (!name) { if (!d->e->status) fail(d, 400, "tools", NULL, "tool without a name"); return; }
        push_tool(d, name, json_text(d, fn), NULL, NULL, DS4_TOOL_FUNCTION);
    }
}

static bool tool_choice_none(const cJSON *tc) {
    if (cJSON_IsString(tc)) return !strcmp(tc->valuestring, "none");
    cJSON *ty = get(tc, "type");
    return cJSON_IsString(ty) && !strcmp(ty->valuestring, "none");
}

static void decode_chat(dec *d, const cJSON *root) {
    ds4_request *r = d->r;
    const cJSON *msgs = get(root, "messages");
    if (!present(msgs)) { fail(d, 400, "messages", NULL, "missing messages"); return; }
    if (!cJSON_IsArray(msgs)) { bad_json(d); return; }
    msg_vec mv = {0};
    int index = 0;
    for (const cJSON *m = msgs->child; m && !d->e->status; m = m->next, index++) {
        if (!cJSON_IsObject(m)) { bad_json(d); return; }
        const char *role = get_str(d, m, "role");
        ds4_chat_role rl;
        if (!role || !strcmp(role, "user")) rl = DS4_ROLE_USER;
        else if (!strcmp(role, "system")) rl = DS4_ROLE_SYSTEM;
        else if (!strcmp(role, "developer")) rl = DS4_ROLE_DEVELOPER;
        else if (!strcmp(role, "assistant")) rl = DS4_ROLE_ASSISTANT;
        else if (!strcmp(role, "tool") || !strcmp(role, "function")) rl = DS4_ROLE_TOOL;
        /* the official encoding defines it; nothing is rendered for it */
        else if (!strcmp(role, "latest_reminder")) continue;
        else { unknown_role(d, "messages", index, role, "system, developer, user, assistant or tool"); return; }
        ds4_chat_msg *x = push_msg(d, &mv, rl);
        if (!x) return;
        x->content = content_text(d, get(m, "content"));
        if (rl == DS4_ROLE_TOOL) {
            x->tool_call_id = get_str(d, m, "tool_call_id");
        } else if (rl == DS4_ROLE_ASSISTANT) {
            x->reasoning_content = get_str(d, m, "reasoning_content");
            const cJSON *tc = get(m, "tool_calls");
            if (present(tc) && !cJSON_IsArray(tc)) { bad_json(d); return; }
            for (const cJSON *c = present(tc) ? tc->child : NULL; c && !d->e->status; c = c->next) {
                const cJSON *fn = get(c, "function");
                const cJSON *nm = get(fn, "name"), *ar = get(fn, "arguments");
                if (!cJSON_IsString(nm) || !present(ar)) continue; /* dropped, as ds4 */
                const char *id = get_str(d, c, "id");
                push_call(d, x, id, nm->valuestring, args_text(d, ar));
            }
        }
    }
    r->msgs = mv.v;
    r->n_msgs = mv.n;
    if (!tool_choice_none(get(root, "tool_choice"))) decode_chat_tools(d, get(root, "tools"));
    get_max_tokens(d, root, "max_tokens");
    get_max_tokens(d, root, "max_completion_tokens");
    get_sampling(d, root, true, true);
    get_stop(d, get(root, "stop"));
    if (get_bool(d, root, "logprobs", false)) {
        double k = 0;
        get_num(d, root, "top_logprobs", &k);
        if (k < 0 || k > 20) fail(d, 400, "top_logprobs", "invalid_value", "top_logprobs must be between 0 and 20");
        r->logprobs = (int)k;
    }
}

/* ---- legacy completions -------------------------------------------- */

static bool token_array(dec *d, const cJSON *a, ds4_prompt *p) {
    int n = cJSON_GetArraySize(a);
    int32_t *ids = ralloc(d, sizeof *ids * (size_t)(n ? n : 1));
    if (!ids) { oom(d); return false; }
    int i = 0;
    for (const cJSON *t = a->child; t; t = t->next) {
        if (!cJSON_IsNumber(t) || t->valuedouble < 0 || t->valuedouble > INT32_MAX ||
            t->valuedouble != floor(t->valuedouble)) {
            fail(d, 400, "prompt", "invalid_value", "prompt token ids must be non-negative integers");
            return false;
        }
        ids[i++] = (int32_t)t->valuedouble;
    }
    p->ids = ids;
    p->n_ids = n;
    return true;
}

static void decode_completions(dec *d, const cJSON *root) {
    ds4_request *r = d->r;
    const cJSON *pr = get(root, "prompt");
    if (!present(pr)) { fail(d, 400, "prompt", NULL, "missing prompt"); return; }
    int n = 1;
    bool list = false;
    if (cJSON_IsArray(pr)) {
        const cJSON *f = pr->child;
        list = f && (cJSON_IsString(f) || cJSON_IsArray(f));
        n = list ? cJSON_GetArraySize(pr) : 1;
    } else if (!cJSON_IsString(pr)) {
        bad_json(d);
        return;
    }
    r->prompts = ralloc(d, sizeof *r->prompts * (size_t)n);
    if (!r->prompts) { oom(d); return; }
    r->n_prompts = n;
    if (cJSON_IsString(pr)) {
        r->prompts[0].text = pr->valuestring;
        r->prompts[0].text_len = strlen(pr->valuestring);
    } else if (!list) {
        if (!token_array(d, pr, &r->prompts[0])) return;
    } else {
        int i = 0;
        for (const cJSON *p = pr->child; p; p = p->next, i++) {
            if (cJSON_IsString(p)) {
                r->prompts[i].text = p->valuestring;
                r->prompts[i].text_len = strlen(p->valuestring);
            } else if (cJSON_IsArray(p)) {
                if (!token_array(d, p, &r->prompts[i])) return;
            } else {
                bad_json(d);
                return;
            }
        }
    }
    get_max_tokens(d, root, "max_tokens");
    get_sampling(d, root, true, true);
    get_stop(d, get(root, "stop"));
    r->echo = get_bool(d, root, "echo", false);
    const cJSON *lpv = get(root, "logprobs");
    if (cJSON_IsBool(lpv)) {
        r->logprobs = cJSON_IsTrue(lpv) ? 0 : -1;
    } else if (present(lpv)) {
        double lp = 0;
        get_num(d, root, "logprobs", &lp);
        if (lp < 0 || lp > 20) fail(d, 400, "logprobs", "invalid_value", "logprobs must be between 0 and 20");
        r->logprobs = (int)lp;
    }
}

/* ---- OpenAI Responses ---------------------------------------------- */

typedef struct {
    msg_vec mv;
    const char *pending_reasoning;
    ds4_chat_msg *cur_asst;   /* the assistant turn calls attach to */
} resp_state;

static ds4_chat_msg *resp_assistant(dec *d, resp_state *s) {
    if (!s->cur_asst) {
        s->cur_asst = push_msg(d, &s->mv, DS4_ROLE_ASSISTANT);
        if (s->cur_asst) s->cur_asst->content = "";
    }
    if (s->cur_asst && s->pending_reasoning) {
        s->cur_asst->reasoning_content = s->pending_reasoning;
        s->pending_reasoning = NULL;
    }
    return s->cur_asst;
}

/* A user-side item: pending reasoning becomes its own empty assistant turn. */
static void resp_flush(dec *d, resp_state *s) {
    if (s->pending_reasoning) { s->cur_asst = NULL; resp_assistant(d, s); }
    s->cur_asst = NULL;
}

static const char *resp_output_text(dec *d, const cJSON *o) {
    if (!present(o)) return "";
    return content_text(d, o);
}

static void decode_responses_tools(dec *d, const cJSON *tools) {
    if (!present(tools)) return;
    if (!cJSON_IsArray(tools)) { bad_json(d); return; }
    for (const cJSON *t = tools->child; t && !d->e->status; t = t->next) {
        if (!cJSON_IsObject(t)) { bad_json(d); return; }
        const char *type = get_str(d, t, "type");
        type = type ? type : "function";
        if (!strcmp(type, "namespace")) {
            const char *ns = get_str(d, t, "name");
            const cJSON *inner = get(t, "tools");
            if (!ns || !cJSON_IsArray(inner)) { bad_json(d); return; }
            for (const cJSON *f = inner->child; f && !d->e->status; f = f->next) {
                const char *nm = get_str(d, f, "name");
                if (!nm) { bad_json(d); return; }
                size_t l = strlen(ns) + strlen(nm);
                char *full = ralloc(d, l + 1);
                if (!full) { oom(d); return; }
                snprintf(full, l + 1, "%s%s", ns, nm);
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "name", full);
                cJSON *desc = get(f, "description"), *par = get(f, "parameters");
                if (desc) cJSON_AddItemToObject(o, "description", cJSON_Duplicate(desc, 1));
                if (par) cJSON_AddItemToObject(o, "parameters", cJSON_Duplicate(par, 1));
                push_tool(d, full, json_text(d, o), ns, nm, DS4_TOOL_FUNCTION);
                cJSON_Delete(o);
            }
        } else if (!strcmp(type, "tool_search")) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", "tool_search");
            cJSON *desc = get(t, "description"), *par = get(t, "parameters");
            if (desc) cJSON_AddItemToObject(o, "description", cJSON_Duplicate(desc, 1));
            if (par) cJSON_AddItemToObject(o, "parameters", cJSON_Duplicate(par, 1));
            push_tool(d, "tool_search", json_text(d, o), NULL, NULL, DS4_TOOL_SEARCH);
            cJSON_Delete(o);
        } else if (!strcmp(type, "function") || !strcmp(type, "custom")) {
            const char *nm = get_str(d, t, "name");
            if (!nm) { fail(d, 400, "tools", NULL, "tool without a name"); return; }
            push_tool(d, nm, json_text(d, t), NULL, NULL,
                      !strcmp(type, "custom") ? DS4_TOOL_CUSTOM : DS4_TOOL_FUNCTION);
        }
        /* hosted tools (web_search, ...) cannot run here: dropped */
    }
}

static void decode_responses(dec *d, const cJSON *root) {
    ds4_request *r = d->r;
    if (present(get(root, "previous_response_id")))
        { fail(d, 400, "previous_response_id", "unsupported_parameter", "previous_response_id is not supported; replay full input instead"); return; }
    if (present(get(root, "conversation")))
        { fail(d, 400, "conversation", "unsupported_parameter", "conversation is not supported; replay full input instead"); return; }
    const cJSON *input = get(root, "input");
    if (!present(input)) { fail(d, 400, "input", NULL, "missing input"); return; }
    resp_state s = {0};
    const char *instr = get_str(d, root, "instructions");
    if (instr) { ds4_chat_msg *m = push_msg(d, &s.mv, DS4_ROLE_SYSTEM); if (m) m->content = instr; }
    if (cJSON_IsString(input)) {
        ds4_chat_msg *m = push_msg(d, &s.mv, DS4_ROLE_USER);
        if (m) m->content = input->valuestring;
    } else if (!cJSON_IsArray(input)) {
        bad_json(d);
        return;
    }
    int index = 0;
    for (const cJSON *it = cJSON_IsArray(input) ? input->child : NULL; it && !d->e->status; it = it->next, index++) {
        if (!cJSON_IsObject(it)) { bad_json(d); return; }
        const char *type = get_str(d, it, "type");
        type = type ? type : "message";
        const char *status = get_str(d, it, "status");
        if (!strcmp(type, "message")) {
            const char *role = get_str(d, it, "role");
            role = role ? role : "user";
            if (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") && strcmp(role, "developer")) {
                unknown_role(d, "input", index, role, "user, assistant, system or developer");
                return;
            }
            const char *text = content_text(d, get(it, "content"));
            if (!strcmp(role, "assistant")) {
                s.cur_asst = NULL;
                ds4_chat_msg *m = resp_assistant(d, &s);
                if (m) m->content = text ? text : "";
            } else {
                resp_flush(d, &s);
                ds4_chat_role rl = !strcmp(role, "system") ? DS4_ROLE_SYSTEM
                                 : !strcmp(role, "developer") ? DS4_ROLE_DEVELOPER : DS4_ROLE_USER;
                ds4_chat_msg *m = push_msg(d, &s.mv, rl);
                if (m) m->content = text;
            }
        } else if (!strcmp(type, "reasoning")) {
            if (status && strcmp(status, "completed")) continue; /* partial reasoning is dropped */
            ds4_buf b = {0};
            const char *arrs[2] = {"summary", "content"};
            for (int k = 0; k < 2; k++) {
                const cJSON *a = get(it, arrs[k]);
                for (const cJSON *p = cJSON_IsArray(a) ? a->child : NULL; p; p = p->next) {
                    cJSON *t = get(p, "text");
                    if (!cJSON_IsString(t)) continue;
                    if (b.len) ds4_buf_putc(&b, '\n');
                    ds4_buf_puts(&b, t->valuestring);
                }
            }
            s.pending_reasoning = rbuf(d, &b);
        } else if (!strcmp(type, "function_call") || !strcmp(type, "custom_tool_call") ||
                   !strcmp(type, "local_shell_call") || !strcmp(type, "web_search_call") ||
                   !strcmp(type, "tool_search_call") || !strcmp(type, "image_generation_call")) {
            const char *id = get_str(d, it, "call_id");
            if (!id) id = get_str(d, it, "id");
            const char *name = get_str(d, it, "name");
            const char *ns = get_str(d, it, "namespace");
            const char *args;
            if (!strcmp(type, "function_call")) {
                args = args_text(d, get(it, "arguments"));
            } else if (!strcmp(type, "custom_tool_call")) {
                const char *in = get_str(d, it, "input");
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "input", in ? in : "");
                args = json_text(d, o);
                cJSON_Delete(o);
            } else {
                const cJSON *a = get(it, "action");
                if (!a) a = get(it, "arguments");
                if (!a) a = get(it, "input");
                args = args_text(d, a);
                name = !strcmp(type, "local_shell_call") ? "local_shell"
                     : !strcmp(type, "tool_search_call") ? "tool_search" : type;
            }
            if (!name) { fail(d, 400, "input", NULL, "%s item without a name", type); return; }
            if (ns) {
                size_t l = strlen(ns) + strlen(name);
                char *full = ralloc(d, l + 1);
                if (!full) { oom(d); return; }
                snprintf(full, l + 1, "%s%s", ns, name);
                name = full;
            }
            ds4_chat_msg *m = resp_assistant(d, &s);
            if (m) push_call(d, m, id, name, args);
        } else if (strstr(type, "_output")) {
            const char *id = get_str(d, it, "call_id");
            resp_flush(d, &s);
            const cJSON *o = get(it, "output");
            if (!o) o = get(it, "result");
            const char *text;
            if (!strcmp(type, "tool_search_output")) {
                const cJSON *tl = get(it, "tools");
                decode_responses_tools(d, tl);
                text = present(tl) ? json_text(d, tl) : "";
            } else {
                text = cJSON_IsString(o) || cJSON_IsArray(o) ? resp_output_text(d, o)
                     : present(o) ? json_text(d, o) : "";
            }
            ds4_chat_msg *m = push_msg(d, &s.mv, DS4_ROLE_TOOL);
            if (!m) return;
            m->content = text;
            m->tool_call_id = id;
            if (id && !call_replayed(&s.mv, id)) push_live(d, id);
            if (!id) push_live(d, "");
        } else if (!strcmp(type, "compaction") || !strcmp(type, "context_compaction") ||
                   !strcmp(type, "item_reference")) {
            continue;
        } else {
            fail(d, 400, "input", "unsupported_value", "unsupported input item type '%.40s'", type);
            return;
        }
    }
    if (s.pending_reasoning) { s.cur_asst = NULL; resp_assistant(d, &s); }
    r->msgs = s.mv.v;
    r->n_msgs = s.mv.n;

    const cJSON *tc = get(root, "tool_choice");
    bool none = false;
    if (cJSON_IsString(tc)) {
        if (!strcmp(tc->valuestring, "required"))
            { fail(d, 400, "tool_choice", "unsupported_value", "tool_choice=required not supported"); return; }
        none = !strcmp(tc->valuestring, "none");
    } else if (present(tc)) {
        fail(d, 400, "tool_choice", "unsupported_value", "forced tool_choice not supported");
        return;
    }
    if (!none) decode_responses_tools(d, get(root, "tools"));
    get_max_tokens(d, root, "max_tokens");
    get_max_tokens(d, root, "max_output_tokens");
    get_sampling(d, root, false, false);
    const cJSON *rs = get(root, "reasoning");
    if (present(rs) && !cJSON_IsObject(rs)) bad_json(d);
    const char *sum = get_str(d, rs, "summary");
    r->expose_reasoning = sum && (!strcmp(sum, "auto") || !strcmp(sum, "concise") || !strcmp(sum, "detailed"));
}

/* ---- Anthropic Messages -------------------------------------------- */

/* In a format with a tool-result turn of its own (chat_spec.h), a user
 * message's tool_result blocks become tool messages ahead of its text
 * (other formats keep them inline in the user turn instead). */
static int tool_result_msgs(dec *d, msg_vec *mv, const cJSON *blocks) {
    int n = 0;
    for (const cJSON *b = blocks->child; b && !d->e->status; b = b->next) {
        const char *ty = cJSON_IsObject(b) ? get_str(d, b, "type") : NULL;
        if (!ty || strcmp(ty, "tool_result")) continue;
        const cJSON *rc = get(b, "content");
        ds4_chat_msg *t = push_msg(d, mv, DS4_ROLE_TOOL);
        if (!t) return -1;
        t->content = cJSON_IsString(rc) || cJSON_IsArray(rc) ? content_text(d, rc) : "";
        t->tool_call_id = get_str(d, b, "tool_use_id");
        n++;
    }
    return d->e->status ? -1 : n;
}

static void decode_messages(dec *d, const cJSON *root) {
    ds4_request *r = d->r;
    msg_vec mv = {0};
    const cJSON *sys = get(root, "system");
    if (cJSON_IsString(sys)) {
        ds4_chat_msg *m = push_msg(d, &mv, DS4_ROLE_SYSTEM);
        if (m) m->content = sys->valuestring;
    } else if (cJSON_IsArray(sys)) {
        ds4_buf b = {0};
        for (const cJSON *p = sys->child; p; p = p->next) {
            const char *t = cJSON_IsString(p) ? p->valuestring : get_str(d, p, "text");
            /* Claude Code's billing header changes every request and would
             * defeat prefix reuse. */
            if (!t || !strncmp(t, "x-anthropic-", 12)) continue;
            if (b.len && b.data[b.len - 1] != '\n') ds4_buf_putc(&b, '\n');
            ds4_buf_puts(&b, t);
        }
        ds4_chat_msg *m = push_msg(d, &mv, DS4_ROLE_SYSTEM);
        if (m) m->content = rbuf(d, &b);
    } else if (present(sys)) {
        bad_json(d);
        return;
    }
    const cJSON *msgs = get(root, "messages");
    if (!present(msgs)) { fail(d, 400, "messages", NULL, "missing messages"); return; }
    if (!cJSON_IsArray(msgs)) { bad_json(d); return; }
    int index = 0;
    for (const cJSON *m = msgs->child; m && !d->e->status; m = m->next, index++) {
        if (!cJSON_IsObject(m)) { bad_json(d); return; }
        const char *role = get_str(d, m, "role");
        bool asst = role && !strcmp(role, "assistant");
        const cJSON *c = get(m, "content");
        /* Claude Code sends its environment block (working directory, date)
         * as a system message after the first user turn when the system
         * prompt is replaced (--system-prompt); it joins the system text. */
        if (role && !strcmp(role, "system")) {
            ds4_chat_msg *x = push_msg(d, &mv, DS4_ROLE_SYSTEM);
            const char *t = content_text(d, c);
            if (x) x->content = t ? t : "";
            continue;
        }
        if (role && !asst && strcmp(role, "user")) {
            unknown_role(d, "messages", index, role, "user, assistant or system");
            return;
        }
        bool result_msgs = r->chat->tool_result_turn && !asst && cJSON_IsArray(c);
        int n_results = result_msgs ? tool_result_msgs(d, &mv, c) : 0;
        if (n_results < 0) return;
        ds4_chat_msg *x = push_msg(d, &mv, asst ? DS4_ROLE_ASSISTANT : DS4_ROLE_USER);
        if (!x) return;
        if (!present(c) || cJSON_IsString(c)) { x->content = present(c) ? c->valuestring : ""; continue; }
        if (!cJSON_IsArray(c)) { bad_json(d); return; }
        ds4_buf text = {0}, reasoning = {0};
        bool has_reasoning = false;
        for (const cJSON *b = c->child; b && !d->e->status; b = b->next) {
            if (cJSON_IsString(b)) { ds4_buf_puts(&text, b->valuestring); continue; }
            const char *ty = get_str(d, b, "type");
            if (!ty) continue;
            if (!strcmp(ty, "text")) {
                const char *t = get_str(d, b, "text");
                if (t) ds4_buf_puts(&text, t);
            } else if (!strcmp(ty, "thinking")) {
                const char *t = get_str(d, b, "thinking");
                if (t) { ds4_buf_puts(&reasoning, t); has_reasoning = true; }
            } else if (!strcmp(ty, "tool_use")) {
                const char *id = get_str(d, b, "id"), *nm = get_str(d, b, "name");
                if (!nm) continue;
                const cJSON *in = get(b, "input");
                push_call(d, x, id, nm, present(in) ? json_text(d, in) : "{}");
            } else if (!strcmp(ty, "tool_result")) {
                const char *id = get_str(d, b, "tool_use_id");
                const cJSON *rc = get(b, "content");
                if (!result_msgs) {
                    const char *t = cJSON_IsString(rc) || cJSON_IsArray(rc) ? content_text(d, rc) : "";
                    r->chat->inline_tool_result(t ? t : "", t ? strlen(t) : 0, &text);
                }
                if (id && !call_replayed(&mv, id)) push_live(d, id);
            }
        }
        /* results alone: the tool messages already stand for the turn */
        if (n_results > 0 && !text.len) {
            mv.n--;
            ds4_buf_free(&text);
            ds4_buf_free(&reasoning);
            continue;
        }
        x->content = rbuf(d, &text);
        if (has_reasoning) x->reasoning_content = rbuf(d, &reasoning);
        else ds4_buf_free(&reasoning);
    }
    r->msgs = mv.v;
    r->n_msgs = mv.n;
    if (!tool_choice_none(get(root, "tool_choice"))) decode_chat_tools(d, get(root, "tools"));
    get_max_tokens(d, root, "max_tokens");
    get_sampling(d, root, false, true);
    const cJSON *ss = get(root, "stop_sequences");
    if (present(ss) && !cJSON_IsArray(ss)) { bad_json(d); return; }
    get_stop(d, ss);
}

/* ---- entry --------------------------------------------------------- */

bool ds4_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) { i++; continue; }
        int len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!len || i + (size_t)len > n) return false;
        for (int k = 1; k < len; k++)
            if ((p[i + k] & 0xc0) != 0x80) return false;
        if (c == 0xe0 && p[i + 1] < 0xa0) return false;   /* overlong */
        if (c == 0xed && p[i + 1] >= 0xa0) return false;  /* surrogate */
        if (c == 0xf0 && p[i + 1] < 0x90) return false;   /* overlong */
        if (c == 0xf4 && p[i + 1] >= 0x90) return false;  /* > U+10FFFF */
        i += (size_t)len;
    }
    return true;
}

static int hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The \u escapes of the body's strings, checked before cJSON sees them.
 * cJSON decodes an escape with a non-hex digit as U+0000, so "\uzzzz" would
 * cut the text short there: such an escape, or one with fewer than four
 * digits, fails the request (false). JavaScript strings may hold lone UTF-16 surrogates, which
 * JSON.stringify writes as "\udXXX" escapes; cJSON rejects them. They become
 * U+FFFD (same escape length, so the copy is rewritten in place) instead of
 * failing the whole request. *fixed is a malloc'ed copy only when something
 * changed (NULL also when out of memory: cJSON then refuses the surrogate). */
static bool check_unicode_escapes(const char *s, size_t n, char **fixed) {
    char *out = NULL;
    bool in_str = false;
    *fixed = NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '"') { in_str = !in_str; continue; }
        if (!in_str || s[i] != '\\' || i + 1 >= n) continue;
        if (s[i + 1] != 'u') { i++; continue; }
        int u = i + 6 <= n ? hex4(s + i + 2) : -1;
        if (u < 0) { free(out); return false; }
        bool lone = false;
        if (u >= 0xd800 && u <= 0xdbff) {
            int lo = i + 12 <= n && s[i + 6] == '\\' && s[i + 7] == 'u' ? hex4(s + i + 8) : -1;
            if (lo >= 0xdc00 && lo <= 0xdfff) { i += 11; continue; }
            lone = true;
        } else if (u >= 0xdc00 && u <= 0xdfff) {
            lone = true;
        }
        if (lone && !out && (out = malloc(n + 1))) {
            memcpy(out, s, n);
            out[n] = 0;
        }
        if (lone && out) memcpy(out + i + 2, "fffd", 4);
        i += 5;
    }
    *fixed = out;
    return true;
}

const ds4_chat_spec *ds4_request_chat(const ds4_request *r) {
    return r->chat ? r->chat : ds4_chat_spec_for(NULL);
}

void ds4_request_free(ds4_request *r) {
    for (struct ds4_req_alloc *a = r->allocs, *n; a; a = n) {
        n = a->next;
        free(a);
    }
    cJSON_Delete(r->json);
    memset(r, 0, sizeof *r);
}

/* A NUL character, raw or escaped as \u0000: C strings downstream would
 * silently end the text there. Backslash pairs are skipped so an escaped
 * backslash followed by "u0000" is ordinary text. */
static bool has_nul_char(const char *s, size_t n) {
    if (memchr(s, 0, n)) return true;
    for (size_t i = 0; i + 1 < n; i++) {
        if (s[i] != '\\') continue;
        if (s[i + 1] == 'u' && i + 5 < n && !memcmp(s + i + 2, "0000", 4)) return true;
        i++;
    }
    return false;
}

cJSON *ds4_json_body_parse(const char *body, size_t len, ds4_req_error *e) {
    memset(e, 0, sizeof *e);
    ds4_request scratch = {0};
    dec d = {&scratch, e};
    if (!ds4_utf8_valid(body, len)) {
        fail(&d, 400, NULL, NULL, "request body is not valid UTF-8");
        return NULL;
    }
    if (has_nul_char(body, len)) {
        fail(&d, 400, NULL, NULL, "NUL characters (\\u0000) are not supported in request text");
        return NULL;
    }
    char *fixed;
    if (!check_unicode_escapes(body, len, &fixed)) {
        fail(&d, 400, NULL, NULL, "invalid \\u escape in a JSON string: \\u takes four hex digits");
        return NULL;
    }
    const char *text = fixed ? fixed : body, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    size_t used = root && end ? (size_t)(end - text) : len;
    free(fixed);
    while (used < len && strchr(" \t\r\n", body[used])) used++;
    if (!root || used < len) {
        cJSON_Delete(root);
        fail(&d, 400, NULL, NULL, root ? "unexpected bytes after the JSON body" : "invalid JSON request");
        return NULL;
    }
    return root;
}

int ds4_request_decode(ds4_api api, const char *body, size_t len, ds4_request *r, ds4_req_error *e) {
    return ds4_request_decode_for(api, ds4_chat_spec_for(NULL), body, len, r, e);
}

int ds4_request_decode_for(ds4_api api, const ds4_chat_spec *chat, const char *body, size_t len,
                           ds4_request *r, ds4_req_error *e) {
    memset(r, 0, sizeof *r);
    dec d = {r, e};
    r->api = api;
    r->chat = chat;
    r->max_tokens = -1;
    r->logprobs = -1;
    ds4_sampler_params_default(&r->sampling);
    cJSON *root = ds4_json_body_parse(body, len, e);
    if (!root) return e->status;
    r->json = root;
    if (!cJSON_IsObject(root)) {
        bad_json(&d);
        ds4_request_free(r);
        return e->status;
    }
    const cJSON *model = get(root, "model");
    if (present(model) && !cJSON_IsString(model)) bad_json(&d);
    r->model = cJSON_IsString(model) ? model->valuestring : chat->models[0].id;
    r->stream = get_bool(&d, root, "stream", false);
    const cJSON *so = get(root, "stream_options");
    if (present(so) && !cJSON_IsObject(so)) bad_json(&d);
    r->include_usage = get_bool(&d, so, "include_usage", false);
    double n;
    if (get_num(&d, root, "n", &n) && n != 1)
        fail(&d, 400, "n", "unsupported_value", "only n=1 is supported");

    think_state t = {.thinking = true};
    switch (api) {
    case DS4_API_CHAT:
    case DS4_API_COMPLETIONS:
        think_control(&d, &t, root, "thinking");
        think_control(&d, &t, root, "think");
        think_kwargs(&d, &t, root);
        think_effort(&d, &t, get(root, "reasoning_effort"), "reasoning_effort");
        if (!e->status) (api == DS4_API_CHAT ? decode_chat : decode_completions)(&d, root);
        break;
    case DS4_API_RESPONSES: {
        const cJSON *rs = get(root, "reasoning");
        const cJSON *ef = get(rs, "effort");
        think_effort(&d, &t, ef, "reasoning.effort");
        t.explicit_ctl = present(ef);
        if (!e->status) decode_responses(&d, root);
        break;
    }
    case DS4_API_MESSAGES:
    case DS4_API_COUNT_TOKENS:
        think_control(&d, &t, root, "thinking");
        think_effort(&d, &t, get(get(root, "output_config"), "effort"), "output_config.effort");
        think_effort(&d, &t, get(root, "reasoning_effort"), "reasoning_effort");
        if (!e->status) decode_messages(&d, root);
        break;
    }
    think_resolve(&d, &t);
    if (e->status) ds4_request_free(r);
    return e->status;
}

size_t ds4_request_text_bytes(const ds4_request *r, int *max_ids) {
    size_t sum = 0, longest = 0;
    *max_ids = 0;
    for (int i = 0; i < r->n_msgs; i++) {
        const ds4_chat_msg *m = &r->msgs[i];
        /* Not reasoning (earlier turns may drop it) nor tool-call arguments
         * (DSML renders string values unescaped, shorter than their JSON). */
        sum += m->content ? strlen(m->content) : 0;
    }
    for (int i = 0; i < r->n_tools; i++) sum += r->tools[i].json ? strlen(r->tools[i].json) : 0;
    for (int i = 0; i < r->n_prompts; i++) {
        if (r->prompts[i].text_len > longest) longest = r->prompts[i].text_len;
        if (r->prompts[i].n_ids > *max_ids) *max_ids = r->prompts[i].n_ids;
    }
    return sum > longest ? sum : longest;
}
