#include "server/prefix.h"

#include "models/chat_spec.h"

#include <stdlib.h>
#include <string.h>

ds4_think_mode ds4_srv_effective_think(const server *s, const ds4_request *r) {
    return ds4_srv_chat(s)->effective_think(r->think, s->o.ctx);
}

const ds4_chat_spec *ds4_srv_chat(const server *s) {
    return ds4_chat_spec_for(s->tok);
}

typedef struct {
    server *s;
    char **held;      /* copies handed to the renderer, freed after it */
    int n_held, cap_held;
} replay_ctx;

static const char *replay_lookup(void *ud, const char *id) {
    replay_ctx *r = ud;
    if (!id) return NULL;
    if (r->n_held == r->cap_held) {
        /* a turn may carry any number of tool calls */
        int cap = r->cap_held ? 2 * r->cap_held : 16;
        char **held = realloc(r->held, (size_t)cap * sizeof *held);
        if (!held) return NULL;
        r->held = held;
        r->cap_held = cap;
    }
    char *b = ds4_toolmem_get(r->s->mem, id);
    if (!b && r->s->kvd) {
        ds4_srv_kvd_lock(r->s);
        if (ds4_kvdisk_find_tool(r->s->kvd, id)) b = ds4_toolmem_get(r->s->mem, id);
        ds4_srv_kvd_unlock(r->s);
    }
    if (b) r->held[r->n_held++] = b;
    return b;
}

void ds4_srv_prompt_free(srv_prompt *p) {
    ds4_buf_free(&p->text);
    ds4_chat_spans_free(&p->client);
}

bool ds4_srv_render_prompt(server *s, const ds4_request *r, bool replay, srv_prompt *out, char *err, size_t errlen) {
    ds4_chat_opts o;
    ds4_chat_opts_default(&o);
    o.profile = ds4_srv_chat(s)->profile;
    o.think = ds4_srv_effective_think(s, r);
    o.ctx = s->o.ctx;
    o.tools = r->tools;
    o.n_tools = r->n_tools;
    o.client_spans = &out->client;
    replay_ctx rc = {.s = s};
    if (replay && !s->o.disable_exact_replay) { o.replay = replay_lookup; o.replay_ud = &rc; }
    bool ok = ds4_chat_render(r->msgs, r->n_msgs, &o, &out->text, err, errlen);
    for (int i = 0; i < rc.n_held; i++) free(rc.held[i]);
    free(rc.held);
    if (ok && (out->text.oom || out->client.oom)) { snprintf(err, errlen, "out of memory"); ok = false; }
    return ok;
}

int ds4_srv_encode(server *s, const srv_prompt *prompt, size_t from, ds4_token_ids *out) {
    return ds4_chat_encode(s->tok, prompt->text.data ? prompt->text.data : "", from, prompt->text.len,
                           &prompt->client, out);
}

/* The live session's text, decoded byte-exactly. */
static char *live_text(server *s, size_t *len) {
    return ds4_tokenizer_decode(s->tok, ds4_session_tokens(s->sess), (size_t)ds4_session_n_tokens(s->sess), false, len);
}

bool ds4_srv_live_ids_match(server *s, const ds4_request *r) {
    if (!s->n_live_ids || s->live_ids_tokens != ds4_session_n_tokens(s->sess)) return false;
    for (int i = 0; i < r->n_live_ids; i++) {
        bool hit = false;
        for (int j = 0; j < s->n_live_ids && !hit; j++) hit = !strcmp(r->live_ids[i], s->live_ids[j]);
        if (!hit) return false;
    }
    return true;
}

/* The continuation tail for trailing tool results of the live turn, as the
 * format writes what follows an assistant turn (chat_spec.h render_tail). */
static void render_tail(server *s, const ds4_request *r, srv_prompt *prompt) {
    int first = r->n_msgs;
    while (first > 0 && r->msgs[first - 1].role != DS4_ROLE_ASSISTANT) first--;
    ds4_chat_opts o;
    ds4_chat_opts_default(&o);
    o.profile = ds4_srv_chat(s)->profile;
    o.think = ds4_srv_effective_think(s, r);
    o.client_spans = &prompt->client;
    ds4_srv_chat(s)->render_tail(r->msgs + first, r->n_msgs - first, &o, &prompt->text);
}

/* toks = the live tokens, then the tokens of the prompt text from `from` on
 * their own. */
static int live_plus(server *s, const srv_prompt *prompt, size_t from, prompt_plan *p, const char *how) {
    int live_n = ds4_session_n_tokens(s->sess);
    ds4_token_ids suffix = {0};
    if (ds4_srv_encode(s, prompt, from, &suffix)) { ds4_token_ids_free(&suffix); return -1; }
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

int ds4_srv_plan_tool_tail(server *s, const ds4_request *r, srv_prompt *prompt, prompt_plan *p) {
    size_t lt_len = 0;
    char *lt = live_text(s, &lt_len);
    ds4_buf_put(&prompt->text, lt, lt_len);
    free(lt);
    render_tail(s, r, prompt);
    if (prompt->text.oom || prompt->client.oom) return -1;
    return live_plus(s, prompt, lt_len, p, "live tool-call continuation");
}

static bool starts_with(const char *text, size_t n, const ds4_buf *key) {
    return key->len && key->len <= n && !memcmp(text, key->data, key->len);
}

int ds4_srv_plan_prompt(server *s, const srv_prompt *prompt, prompt_plan *p) {
    const char *text = prompt->text.data ? prompt->text.data : "";
    size_t n = prompt->text.len;
    int live_n = ds4_session_n_tokens(s->sess);
    const int32_t *live = ds4_session_tokens(s->sess);
    if (ds4_srv_encode(s, prompt, 0, &p->toks)) return -1;
    int lcp = 0;
    while (lcp < live_n && (size_t)lcp < p->toks.n && live[lcp] == p->toks.v[lcp]) lcp++;
    if (lcp == live_n && live_n > 0) { p->reuse = live_n; p->how = "exact token prefix"; return 0; }
    if (s->visible_tokens == live_n && live_n > 0) {
        for (int k = 0; k < 2; k++)
            if (starts_with(text, n, &s->visible[k]))
                return live_plus(s, prompt, s->visible[k].len, p, "visible transcript prefix (hidden reasoning)");
    }
    size_t lt_len = 0;
    char *lt = live_n ? live_text(s, &lt_len) : NULL;
    bool text_hit = lt && lt_len <= n && !memcmp(lt, text, lt_len);
    free(lt);
    if (text_hit) return live_plus(s, prompt, lt_len, p, "live text prefix");
    /* A prompt that cannot fit is rejected by the caller: restoring a disk
     * checkpoint for it would replace the live session for nothing. */
    bool fits = (int)p->toks.n < s->o.ctx;
    /* a restore replaces the live session before ds4_job_load_prompt sees it */
    if (ds4_srv_kvd(s) && fits) ds4_srv_remember_prompt(s);
    ds4_srv_kvd_lock(s);
    size_t disk = ds4_srv_kvd(s) && fits ? ds4_kvdisk_restore(s->kvd, s->sess, text, n, lcp) : 0;
    ds4_srv_kvd_unlock(s);
    ds4_srv_session_changed(s);
    /* a restore that failed part-way leaves the session empty */
    if (!disk && ds4_session_n_tokens(s->sess) != live_n) lcp = 0;
    if (disk) {
        s->visible_tokens = -1; /* the live session is another conversation now */
        return live_plus(s, prompt, disk, p, "disk cache");
    }
    p->reuse = lcp;
    p->how = lcp ? "common token prefix" : "cold";
    return 0;
}

void ds4_srv_remember_visible(server *s, const ds4_buf *prompt, const ds4_enc *enc) {
    s->visible_tokens = -1;
    size_t open = strlen(DS4_STR_THINK_OPEN), clen, blen;
    /* Only a closed think block makes the live text "<think>R</think>C":
     * an unfinished one has no visible transcript to match. */
    if (!ds4_enc_reasoning_closed(enc) || ds4_enc_stop_matched(enc) || prompt->len < open ||
        memcmp(prompt->data + prompt->len - open, DS4_STR_THINK_OPEN, open)) return;
    const char *content = ds4_enc_content(enc, &clen);
    const char *block = ds4_enc_block(enc, &blen);
    ds4_srv_chat(s)->visible_turns(prompt->data, prompt->len, content, clen, block, block ? blen : 0, s->visible);
    s->visible_tokens = ds4_session_n_tokens(s->sess);
}
