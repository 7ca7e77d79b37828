/* glm_family.c -- GLM 5.2's entries of the family seam (model_family.h,
 * chat_spec.h): the CPU backend over glm_forward in exact f32 math, a state
 * that keeps every position (so a rewind never needs a checkpoint), the GLM
 * payload (which is also its snapshot), and the GLM chat format. The
 * DeepSeek-only engine options are refused by name rather than ignored. */
#include "models/model_family.h"
#include "base/log.h"
#include "dist/tp.h"

#include "models/glm/glm_backend.h"
#include "text/glm_chat.h"
#include "models/glm/glm_kv.h"
#include "models/glm/glm_model.h"
#include "models/glm/glm_payload.h"
#include "text/glm_tools.h"
#include "kernels/kernels_cpu.h"
#include "kernels/quant.h"
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The engine's model is the bound glm_model itself. */
static glm_model *M(const ds4_family_model *fm) { return (glm_model *)fm; }
/* A session's state: its glm_kv, and the backend told when the state
 * changes other than by its evaluations (the tensor-parallel coordinator
 * then sends the worker the whole state) or goes away. */
typedef struct {
    glm_kv *kv;
    ds4_backend *be;
} glm_state;
static glm_kv *KV(const ds4_family_state *st) { return ((const glm_state *)st)->kv; }

/* backend.h names a sequence's state struct ds4_kv; a backend uses it only
 * as the session's key, the pointer the sequences carry (seq.glm). */
static struct ds4_kv *KEY(const ds4_family_state *st) { return (struct ds4_kv *)(void *)KV(st); }

static void changed(const ds4_family_state *st) {
    ds4_backend *be = ((const glm_state *)st)->be;
    char err[8];
    if (be && be->kv_sync) be->kv_sync(be, KEY(st), false, err, sizeof err);
}

/* Whole bits per weight of the routed experts (of the head in an all-dense
 * file): the block formats' bits rounded down, as DS4 reports them. */
static int expert_bits(const glm_model *m) {
    const ds4_tensor *t = &m->output;
    for (uint32_t l = 0; l < glm_n_trunk(&m->hp) && t == &m->output; l++)
        if (m->layers[l].gate_exps.data) t = &m->layers[l].gate_exps;
    return (int)(8 * ds4_type_row_bytes(t->type, 256) / 256);
}

/* ---- tensor parallelism (dist/tp.h): the model and its glm_kv states,
 * moved as GLM payloads (zero tokens and logits: the coordinator's engine
 * keeps those) ---- */

static size_t tp_state_max(const void *m, int ctx) {
    const glm_hparams *hp = &((const glm_model *)m)->hp;
    return (size_t)ds4_glm_kv_bytes_for(hp, ctx) + GLM_PAYLOAD_HEADER_BYTES +
           4 * ((size_t)ctx + hp->n_vocab + glm_n_trunk(hp));
}
static void *tp_state_new(const void *m, int ctx) { return ds4_glm_kv_new(&((const glm_model *)m)->hp, ctx); }
static void tp_state_free(void *st) { ds4_glm_kv_free(st); }
static int tp_state_pos(const void *st) { return ((const glm_kv *)st)->n_pos; }
static int tp_state_ctx(const void *st) { return ((const glm_kv *)st)->ctx; }
static void tp_state_reset(void *st) { ((glm_kv *)st)->n_pos = 0; }
static bool tp_state_truncate(void *st, int n) { return ds4_glm_kv_truncate(st, n); }
static size_t tp_state_bytes(const void *m, const void *st) {
    return ds4_glm_payload_bytes(st, (int)((const glm_model *)m)->hp.n_vocab);
}
static void tp_state_save(const void *m, const void *st, void *dst) {
    const glm_kv *kv = st;
    const int V = (int)((const glm_model *)m)->hp.n_vocab;
    int32_t *toks = calloc((size_t)kv->n_pos + 1, sizeof *toks);
    float *logits = calloc((size_t)V, sizeof *logits);
    /* out of memory: the payload carries no tokens, and the worker's load refuses it */
    if (toks && logits) ds4_glm_payload_write(kv, toks, logits, V, dst);
    else memset(dst, 0, ds4_glm_payload_bytes(kv, V));
    free(toks);
    free(logits);
}
static bool tp_state_load(const void *m, void *st, const void *src, size_t n) {
    glm_kv *kv = st;
    const int V = (int)((const glm_model *)m)->hp.n_vocab;
    int32_t *toks = malloc((size_t)kv->ctx * sizeof *toks + 1);
    float *logits = malloc((size_t)V * sizeof *logits);
    char err[256];
    const bool ok = toks && logits && ds4_glm_payload_load(kv, toks, logits, V, src, n, err, sizeof err);
    free(toks);
    free(logits);
    return ok;
}
/* every position is kept: undoing an evaluation is a truncation */
static void *tp_undo_save(const void *st, int n) {
    (void)n;
    int *pos = malloc(sizeof *pos);
    if (pos) *pos = ((const glm_kv *)st)->n_pos;
    return pos;
}
static void tp_undo_apply(const void *u, void *st) { ds4_glm_kv_truncate(st, *(const int *)u); }
static void tp_undo_free(void *u) { free(u); }

static ds4_tp_family tp_family(const glm_model *m) {
    const glm_hparams *hp = &m->hp;
    /* a layer exchange per row: the heads' outputs, the shared expert's
     * activation, or half its output row and every selected slot's */
    const size_t heads = (size_t)hp->n_head * hp->value_length_mla, ffn = ((size_t)hp->n_expert_used + 1) * hp->n_embd;
    const size_t shared = (size_t)hp->expert_ff * hp->n_expert_shared, wider = heads > ffn ? heads : ffn;
    return (ds4_tp_family){m, "glm-cpu", m->name, (int)glm_n_trunk(hp), (int)hp->n_embd, 1, (int)hp->n_vocab,
                           (int)hp->n_expert, expert_bits(m), true, shared > wider ? shared : wider,
                           ds4_glm_cpu_backend_split, tp_state_max, tp_state_new, tp_state_free, tp_state_pos,
                           tp_state_ctx, tp_state_reset, tp_state_truncate, tp_state_bytes, tp_state_save,
                           tp_state_load, tp_undo_save, tp_undo_apply, tp_undo_free};
}

static ds4_family_model *bind(const ds4_gguf *g, const ds4_engine_params *p, ds4_family_info *info, char *err,
                              size_t errlen) {
    glm_model *m = ds4_glm_model_bind(g, err, errlen);
    if (!m) return NULL;
    *info = (ds4_family_info){m->name, (int)m->hp.n_vocab, (int)glm_n_trunk(&m->hp), (int)m->hp.n_embd, expert_bits(m),
                              m->hp.n_ctx_train, m->file_bytes, !p->dist.tp};
    /* (a tensor-parallel process reads half of the routed experts: the
     * whole file is not paged in at load) */
    return (ds4_family_model *)m;
}

static ds4_backend *backend_new(ds4_family_model *fm, const ds4_engine_params *p, int prefill_chunk, char *err,
                                size_t errlen) {
    ds4_backend *be = ds4_glm_cpu_backend_new(M(fm), p->n_threads, prefill_chunk, err, errlen);
    const ds4_tp_family tp = tp_family(M(fm));
    if (be && p->dist.tp && p->dist.role == DS4_DIST_COORDINATOR)
        be = ds4_tp_coordinator_new(be, &tp, &p->dist, false, err, errlen);
    return be;
}

/* Only --tensor-parallel's worker (ds4_family_refuse: GLM has no pipeline). */
static int serve_worker(ds4_family_model *fm, ds4_backend *be, int ctx, const ds4_dist_params *p) {
    const ds4_tp_family tp = tp_family(M(fm));
    return ds4_tp_worker_serve(&tp, be, false, ctx, p);
}

/* (be may be the tensor-parallel coordinator over the CPU backend: the
 * thread count is the one its power accounting carries) */
static void report(const ds4_family_model *fm, const ds4_backend *be, const ds4_engine_params *p, uint64_t rss) {
    (void)p;
    const glm_model *m = M(fm);
    const glm_hparams *hp = &m->hp;
    ds4_log(DS4_LOG_INFO, "ds4: %s: GLM 5.2, %u layers, %u experts, %.2f GiB file, %.1f MiB resident, %d threads, "
                          "cpu kernels %s, numerics f32\n",
            m->name, glm_n_trunk(hp), hp->n_expert, (double)m->file_bytes / (1 << 30), (double)rss / (1 << 20),
            be->power.threads, ds4_isa_cap_name(ds4_kernels_isa()));
}

static void model_free(ds4_family_model *fm) { ds4_glm_model_free(M(fm)); }

static uint64_t state_bytes(const ds4_family_model *fm, int ctx) { return ds4_glm_kv_bytes_for(&M(fm)->hp, ctx); }

static ds4_family_state *state_new(ds4_family_model *fm, ds4_backend *be, int ctx, int prefill_chunk) {
    (void)prefill_chunk;
    glm_state *st = malloc(sizeof *st);
    if (st) *st = (glm_state){ds4_glm_kv_new(&M(fm)->hp, ctx), be};
    if (st && !st->kv) { free(st); st = NULL; }
    return (ds4_family_state *)st;
}

static void state_free(ds4_family_state *st) {
    if (!st) return;
    ds4_backend *be = ((glm_state *)st)->be;
    if (be && be->kv_release) be->kv_release(be, KEY(st));
    ds4_glm_kv_free(KV(st));
    free(st);
}
static int n_pos(const ds4_family_state *st) { return KV(st)->n_pos; }
static void seq_bind(ds4_family_state *st, ds4_backend_seq *q) { q->glm = KV(st); }
static void stepped(ds4_family_state *st) { (void)st; }

/* Every position is kept, so the truncation never fails (glm_kv.h). */
static int rewind_to(ds4_family_state *st, int keep, char *err, size_t errlen) {
    (void)err, (void)errlen;
    ds4_glm_kv_truncate(KV(st), keep);
    return keep;
}

static void reset(ds4_family_state *st) { KV(st)->n_pos = 0; }

static size_t payload_bytes(const ds4_family_state *st, int n_vocab) { return ds4_glm_payload_bytes(KV(st), n_vocab); }

static void payload_save(const ds4_family_state *st, const int32_t *toks, const float *logits, int n_vocab,
                         void *dst) {
    ds4_glm_payload_write(KV(st), toks, logits, n_vocab, dst);
}

static bool snapshot_save(const ds4_family_state *st, const int32_t *toks, const float *logits, int n_vocab,
                          void *dst) {
    payload_save(st, toks, logits, n_vocab, dst);
    return true;
}

static bool payload_save_to(const ds4_family_state *st, const int32_t *toks, const float *logits, int n_vocab,
                            const ds4_sink *sink) {
    return ds4_glm_payload_write_to(KV(st), toks, logits, n_vocab, sink);
}

/* A load (whether it succeeds or leaves the state empty) is a change no
 * evaluation made: the backend hears of it. */
static int payload_load(ds4_family_state *st, int32_t *toks, float *logits, int n_vocab, const void *src, size_t n,
                        char *err, size_t errlen) {
    const bool ok = ds4_glm_payload_load(KV(st), toks, logits, n_vocab, src, n, err, errlen);
    changed(st);
    return ok ? 0 : -1;
}

/* The snapshot is a payload: it carries the tokens and logits itself. */
static int snapshot_load(ds4_family_state *st, int32_t *toks, float *logits, int n_vocab, const void *src, size_t n,
                         const int32_t *snap_toks, int n_toks, const float *snap_logits, char *err, size_t errlen) {
    (void)snap_toks, (void)n_toks, (void)snap_logits;
    return payload_load(st, toks, logits, n_vocab, src, n, err, errlen);
}

static int payload_load_from(ds4_family_state *st, int32_t *toks, float *logits, int n_vocab, const ds4_source *src,
                             size_t n, char *err, size_t errlen) {
    const bool ok = ds4_glm_payload_load_from(KV(st), toks, logits, n_vocab, src, n, err, errlen);
    changed(st);
    return ok ? 0 : -1;
}

/* ---- chat ---- */

static ds4_think_mode effective_think(ds4_think_mode m, int ctx) {
    (void)ctx;   /* the Think Max context rule is DeepSeek's; GLM's effort line is text */
    return m;
}

/* An assistant message's tool_result blocks (GLM gives a user message's
 * their own turn) stay inline, written as the DeepSeek profile does. */
static void inline_tool_result(const char *content, size_t n, ds4_buf *out) {
    ds4_chat_tool_result(content, n, DS4_CHAT_DS4, out);
}

/* One form: GLM renders a turn without reasoning as <think></think>. */
static void visible_turns(const char *prompt, size_t prompt_len, const char *content, size_t content_len,
                          const char *calls, size_t calls_len, ds4_buf out[2]) {
    ds4_buf_clear(&out[0]);
    ds4_buf_clear(&out[1]);
    ds4_glm_chat_visible_turn(prompt, prompt_len, content, content_len, calls, calls_len, DS4_CHAT_GLM, &out[0]);
}

/* The parser keeps the options: arg_type reads the request's tools. */
typedef struct {
    ds4_glm_parser *p;
    const ds4_tool_def *defs;
    int n_defs;
} glm_parser;

/* Values are strings or JSON by the tool's schema (glm-5.2-model.md 7.6). */
static ds4_glm_arg_type arg_type(void *ud, const char *tool, const char *key) {
    const glm_parser *g = ud;
    for (int i = 0; i < g->n_defs; i++) {
        const ds4_tool_def *d = &g->defs[i];
        if (!d->name || strcmp(d->name, tool)) continue;
        if (d->json || !d->parameters) return ds4_glm_schema_arg_type(d->json, key);
        /* a definition given by its fields (chat.h): the schema is `parameters` */
        ds4_buf obj = {0};
        ds4_buf_puts(&obj, "{\"parameters\":");
        ds4_buf_puts(&obj, d->parameters);
        ds4_buf_puts(&obj, "}");
        ds4_glm_arg_type t = obj.oom ? DS4_GLM_ARG_UNKNOWN : ds4_glm_schema_arg_type(obj.data, key);
        ds4_buf_free(&obj);
        return t;
    }
    return DS4_GLM_ARG_UNKNOWN;
}

static void *parser_create(const ds4_tool_parser_opts *o, ds4_dsml_event_fn fn, void *ud) {
    glm_parser *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->defs = o->defs;
    g->n_defs = o->n_defs;
    ds4_glm_opts go = {.thinking = o->thinking, .tools = o->tools, .arg_type = arg_type, .arg_type_ud = g};
    g->p = ds4_glm_new(&go, fn, ud);
    if (!g->p) { free(g); return NULL; }
    return g;
}
static const ds4_glm_parser *P(const void *p) { return ((const glm_parser *)p)->p; }
static ds4_glm_parser *PW(void *p) { return ((glm_parser *)p)->p; }
static void parser_free(void *p) {
    if (!p) return;
    ds4_glm_free(PW(p));
    free(p);
}
static void parser_feed(void *p, const char *s, size_t n) { ds4_glm_feed(PW(p), s, n); }
static void parser_finish(void *p) { ds4_glm_finish(PW(p)); }
/* no closing block tag: the turn ends at a stop token */
static bool parser_done(const void *p) { return ds4_glm_failed(P(p)); }
static bool parser_in_reasoning(const void *p) { return ds4_glm_in_reasoning(P(p)); }
static bool parser_in_calls(const void *p) { return ds4_glm_block_open(P(p)); }
static bool parser_in_structure(const void *p) { return ds4_glm_in_structure(P(p)); }

static const ds4_tool_parser_ops PARSER = {parser_create, parser_free, parser_feed, parser_finish, parser_done,
                                           parser_in_reasoning, parser_in_calls, parser_in_structure};

static const ds4_model_id MODELS[] = {{"glm-5.2", "GLM 5.2"}};

const ds4_chat_spec ds4_chat_spec_glm = {
    .profile = DS4_CHAT_GLM,
    .models = MODELS,
    .n_models = sizeof MODELS / sizeof *MODELS,
    .bos_token = DS4_TOK_GLM_GMASK,
    .eos_token = DS4_TOK_GLM_ENDOFTEXT,
    /* the tokenizer adds nothing: the template writes [gMASK]<sop> itself */
    .add_special_prefix = NULL,
    /* GLM-5.2 thinks at Max unless told "high" (glm-5.2-model.md 7.4) */
    .think_max_default = true,
    /* <|observation|> */
    .tool_result_turn = true,
    .effective_think = effective_think,
    .inline_tool_result = inline_tool_result,
    /* the result and user turns after the stop token, which the session does not hold */
    .render_tail = ds4_glm_chat_render_tail,
    .visible_turns = visible_turns,
    .parser = &PARSER,
};

const ds4_family ds4_family_glm = {
    .arch = GLM_ARCH,
    .features = DS4_FEAT_TP,
    .refusal = "works with DeepSeek V4 models only, this is a GLM 5.2 (glm-dsa) model",
    .chat = &ds4_chat_spec_glm,
    .bind = bind,
    .backend_new = backend_new,
    .report = report,
    .model_free = model_free,
    .can_eval = NULL,
    .serve_worker = serve_worker,
    .ssd_stats = NULL,
    .state_bytes = state_bytes,
    .state_new = state_new,
    .state_free = state_free,
    .n_pos = n_pos,
    .seq_bind = seq_bind,
    .stepped = stepped,
    .rewind = rewind_to,
    .reset = reset,
    .snapshot_bytes = payload_bytes,
    .snapshot_save = snapshot_save,
    .snapshot_load = snapshot_load,
    .payload_bytes = payload_bytes,
    .payload_save = payload_save,
    .payload_save_to = payload_save_to,
    .payload_load = payload_load,
    .payload_load_from = payload_load_from,
};
