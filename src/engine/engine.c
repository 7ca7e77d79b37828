/* engine.c -- the public engine API over a model family (model_family.h:
 * its binding and session state), the backend and the token list. Nothing
 * here depends on which family the file is. */
#include "engine/engine.h"
#include "backends/backend.h"
#include "base/numparse.h"
#include "base/log.h"
#include "base/mempages.h"
#include "base/sha1.h"
#include "format/gguf.h"
#include "kernels/quant.h"
#include "models/model_family.h"
#include "nn/steering.h"
#include "text/tokenizer.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct ds4_engine {
    ds4_gguf *g;
    const ds4_family *fam;
    ds4_family_model *m;
    ds4_family_info info;
    ds4_backend *be;
    ds4_tokenizer *tok;
    int prefill_chunk;
    ds4_backend_seq *seqs;  /* [max_batch]: one backend call's sequences */
    float *steer_dir;       /* --dir-steering-file's directions (NULL: none) */
    unsigned char steer_sha1[20];   /* of steer_dir: every pipeline slice must hold the same (dist.h) */
    ds4_steering steering;  /* what new sessions are steered with */
    bool host_layers;       /* every layer runs on the CPU backend here: activation probes apply */
    int test_fail_decode_after;     /* DS4_TEST_FAIL_DECODE_AFTER, -1: unset */
};

struct ds4_session {
    ds4_engine *e;
    ds4_family_state *st;
    int ctx;
    int32_t *toks;      /* [ctx]; n_pos of them are live */
    float *logits;      /* [n_vocab], valid when n_pos > 0 */
    ds4_steering steering;  /* the engine's, or this session's own scales */
    ds4_act_probe *probe;   /* --dump-activations (NULL: none) */
};

/* kv holds the family's snapshot form. */
struct ds4_snapshot {
    int ctx, n_toks;
    int32_t *toks;
    float *logits;
    void *kv;
    size_t kv_bytes;
};

void ds4_engine_params_default(ds4_engine_params *p) {
    memset(p, 0, sizeof *p);
    p->numerics = -1;
    p->steering.ffn = p->steering.attn = NAN;
    p->power = 100;
    ds4_gpu_opts_default(&p->gpu);
}

bool ds4_engine_ssd_stats(const ds4_engine *e, ds4_ssd_stats *out) {
    return e->fam->ssd_stats && e->fam->ssd_stats(e->m, out);
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Pages a whole CPU model's weights into its mapping when its files fit in
 * the memory available. Otherwise every first read of a weight page is a
 * page fault in the first prompt (measured: 121k faults, 0.4 s of kernel time
 * on the 8.85 GiB Flash-shaped model); paging in here costs the same reads
 * once, at load (llama.cpp maps with MAP_POPULATE for the same reason). A
 * model larger than that memory, a layer slice (it reads only its layers) and
 * --ssd-streaming (which makes its own ranges resident) stay lazy. Then the
 * weights are moved to 2 MiB pages where the page cache holds them in 4 KiB
 * ones (only those parts, where the kernel can list them): decode streams
 * them about twice as fast (docs/performance.md); the probe keeps a system
 * without large folios to one small re-read per start. */
#define LARGE_PAGE_PROBE_BYTES ((uint64_t)64 << 20)

static void page_in_weights(const ds4_engine *e, const ds4_engine_params *p) {
    const uint64_t bytes = ds4_gguf_file_bytes(e->g), avail = ds4_memory_available();
    /* a slice of a bigger file maps the other processes' layers too: paging
     * the mapping in would read them */
    const bool automatic = p->gpu.backend == DS4_BACKEND_CPU && e->info.binds_file && avail && bytes <= avail;
    /* --warm-weights asks for the read even then; --ssd-streaming keeps its own resident set */
    if (p->ssd.enabled || p->lazy_weights || !(automatic || p->warm_weights)) return;
    char why[256];
    const double t0 = seconds_now();
    if (!ds4_gguf_populate(e->g, why, sizeof why)) {
        if (!p->quiet) ds4_log(DS4_LOG_WARN, "ds4: weights stay lazily mapped: %s\n", why);
        return;
    }
    const double t1 = seconds_now();
    ds4_gguf_pages pages;
    const bool large = ds4_gguf_prefer_large_pages(e->g, LARGE_PAGE_PROBE_BYTES, &pages);
    if (p->quiet) return;
    char line[512] = "";
    ds4_log_append(line, sizeof line, "ds4: weights paged in: %.2f GiB in %.2f s; in 2 MiB pages: %.0f%%",
                   (double)bytes / (1 << 30), t1 - t0, 100.0 * pages.before);
    if (pages.reread)
        ds4_log_append(line, sizeof line, " -> %.0f%% after re-reading %.0f MiB of the page cache (%.2f s)",
                       100.0 * pages.after, (double)pages.reread_bytes / (1 << 20), seconds_now() - t1);
    if (!large) ds4_log_append(line, sizeof line, " (kept: %s)", pages.note);
    ds4_log(DS4_LOG_INFO, "%s\n", line);
}

static bool load_tokenizer(ds4_engine *e, char *err, size_t errlen) {
    if (!ds4_gguf_find_kv(e->g, "tokenizer.ggml.tokens")) return true;
    e->tok = ds4_tokenizer_from_gguf(e->g, err, errlen);
    return e->tok != NULL;
}

/* What every family reads from the parameters the same way. */
static bool common_params(ds4_engine *e, const ds4_engine_params *p, char *err, size_t errlen) {
    e->prefill_chunk = p->prefill_chunk > 0 ? p->prefill_chunk : 4096;
    const ds4_ssd_params *ssd = &p->ssd;
    if (!ssd->enabled && (ssd->cold || ssd->stats || ssd->lru || ssd->no_predict || ssd->trace_path ||
                          ssd->cache_bytes || ssd->cache_slots || ssd->preload_experts)) {
        /* a silently ignored sub-option would make a measurement lie */
        snprintf(err, errlen, "the --ssd-streaming-* options need --ssd-streaming");
        return false;
    }
    /* 0: a parameter block filled without ds4_engine_params_default */
    if (p->power < 0 || p->power > 100) {
        snprintf(err, errlen, "--power takes 1..100 (got %d)", p->power);
        return false;
    }
    /* No real input makes a healthy engine fail one decode step, so the
     * end-to-end tests of the decode-error answers need this switch. */
    const char *fail_after = getenv("DS4_TEST_FAIL_DECODE_AFTER");
    e->test_fail_decode_after = fail_after && *fail_after ? atoi(fail_after) : -1;
    return true;
}

/* GPU placement flags without --cuda change nothing: say so once per process
 * (a command line copied from a CUDA setup would otherwise look obeyed). */
static void warn_unused_gpu_flags(const ds4_engine_params *p) {
    static atomic_flag warned = ATOMIC_FLAG_INIT;
    if (p->gpu.backend == DS4_BACKEND_CPU && p->gpu.placement_given && !p->quiet && !atomic_flag_test_and_set(&warned))
        ds4_log(DS4_LOG_WARN, "ds4: warning: --gpu-vram/--gpu-devices have no effect without --cuda (running on the CPU)\n");
}

/* --dir-steering-*: read after binding, when the layer count and width are
 * known. Every backend applies it (the CPU forward passes, the CUDA
 * kernels, a pipeline slice the rows of its own layers, dist.h). */
static bool load_steering(ds4_engine *e, const ds4_engine_params *p, char *err, size_t errlen) {
    const ds4_steering_params *sp = &p->steering;
    e->host_layers = p->gpu.backend == DS4_BACKEND_CPU && p->dist.role == DS4_DIST_NONE;
    if (!sp->file) {
        /* NAN (not given) and 0 (a zeroed parameter block) both mean no steering */
        if ((isnan(sp->ffn) || sp->ffn == 0) && (isnan(sp->attn) || sp->attn == 0)) return true;
        snprintf(err, errlen, "--dir-steering-ffn and --dir-steering-attn need --dir-steering-file");
        return false;
    }
    if (p->dist.tp) {
        /* the worker's half of a layer is not told the scales */
        snprintf(err, errlen, "directional steering does not run with --tensor-parallel");
        return false;
    }
    const float ffn = isnan(sp->ffn) ? 1.0f : sp->ffn, attn = isnan(sp->attn) ? 0.0f : sp->attn;
    if (!isfinite(ffn) || !isfinite(attn)) {
        snprintf(err, errlen, "steering scales must be finite");
        return false;
    }
    e->steer_dir = ds4_steering_read(sp->file, e->info.n_layers, e->info.n_embd, err, errlen);
    if (!e->steer_dir) return false;
    ds4_sha1 h;
    ds4_sha1_init(&h);
    ds4_sha1_update(&h, e->steer_dir, (size_t)e->info.n_layers * (size_t)e->info.n_embd * sizeof(float));
    ds4_sha1_final(&h, e->steer_sha1);
    e->steering = (ds4_steering){e->steer_dir, e->info.n_layers, e->info.n_embd, attn, ffn};
    return true;
}

/* --mtp / --dspark: the family's draft model from a support file, beside the backend. */
static bool load_draft(ds4_engine *e, const ds4_engine_params *p, char *err, size_t errlen) {
    const bool dspark = p->dspark_path != NULL;
    const char *opt = dspark ? "--dspark" : "--mtp", *path = dspark ? p->dspark_path : p->mtp_path;
    if (dspark && p->mtp_path) {
        snprintf(err, errlen, "--dspark replaces --mtp: give one of them");
        return false;
    }
    if (!e->fam->draft_load) {
        snprintf(err, errlen, "%s: this model's family has no draft model", opt);
        return false;
    }
    if (!e->fam->draft_load(e->m, e->be, path, dspark, err, errlen)) return false;
    if (!p->quiet)
        ds4_log(DS4_LOG_INFO, "ds4: %s drafter: %s (%s)\n", dspark ? "DSpark" : "MTP", e->fam->draft_name(e->m), path);
    return true;
}

/* A pipeline process's own steering, for its HELLO and its layers. */
static void steer_route(const ds4_engine *e, ds4_dist_params *d) {
    d->steer_dir = e->steer_dir;
    memcpy(d->steer_sha1, e->steer_sha1, sizeof d->steer_sha1);
}

ds4_engine *ds4_engine_load(const ds4_engine_params *p, char *err, size_t errlen) {
    warn_unused_gpu_flags(p);
    ds4_engine *e = calloc(1, sizeof *e);
    if (!e) { snprintf(err, errlen, "out of memory loading %s", p->model_path); return NULL; }
    e->g = ds4_gguf_open(p->model_path, err, errlen);
    if (!e->g) goto fail;
    e->fam = ds4_family_detect(e->g);
    if (!ds4_family_refuse(e->fam, p, err, errlen)) goto fail;
    e->m = e->fam->bind(e->g, p, &e->info, err, errlen);
    if (!e->m || !load_tokenizer(e, err, errlen) || !common_params(e, p, err, errlen) ||
        !load_steering(e, p, err, errlen))
        goto fail;
    ds4_engine_params bp = *p;
    steer_route(e, &bp.dist);
    e->be = e->fam->backend_new(e->m, &bp, e->prefill_chunk, err, errlen);
    if (!e->be) goto fail;
    e->be->power.percent = p->power ? p->power : 100;
    if ((p->mtp_path || p->dspark_path) && !load_draft(e, p, err, errlen)) goto fail;
    page_in_weights(e, p);
    e->seqs = malloc((size_t)e->be->max_batch * sizeof(ds4_backend_seq));
    if (!e->seqs) { snprintf(err, errlen, "out of memory for the engine"); goto fail; }
    if (!p->quiet) e->fam->report(e->m, e->be, p, ds4_process_rss_bytes());
    return e;
fail:
    ds4_engine_free(e);
    return NULL;
}

void ds4_engine_free(ds4_engine *e) {
    if (!e) return;
    if (e->be) e->be->free(e->be);
    free(e->seqs);
    free(e->steer_dir);
    ds4_tokenizer_free(e->tok);
    if (e->m) e->fam->model_free(e->m);
    ds4_gguf_close(e->g);
    free(e);
}

int ds4_engine_serve_worker(ds4_engine *e, int ctx, const ds4_dist_params *p) {
    if (!e->fam->serve_worker) {
        /* unreachable through ds4_engine_load, which refuses --role for such a family */
        ds4_log(DS4_LOG_ERROR, "ds4 worker: this model's family has no pipeline worker\n");
        return 1;
    }
    ds4_dist_params q = *p;
    steer_route(e, &q);
    return e->fam->serve_worker(e->m, e->be, ctx, &q);
}

const struct ds4_tokenizer *ds4_engine_tokenizer(const ds4_engine *e) { return e->tok; }
const struct ds4_gguf *ds4_engine_gguf(const ds4_engine *e) { return e->g; }

bool ds4_engine_observe_matmuls(ds4_engine *e, ds4_matmul_observer fn, void *ud, char *err, size_t errlen) {
    if (!e->fam->observe_matmuls) {
        snprintf(err, errlen, "matrix inputs cannot be collected for this model family");
        return false;
    }
    return e->fam->observe_matmuls(e->m, e->be, fn, ud, err, errlen);
}
const ds4_chat_spec *ds4_engine_chat(const ds4_engine *e) { return e->fam->chat; }
int ds4_engine_n_vocab(const ds4_engine *e) { return e->info.n_vocab; }
int ds4_engine_n_layers(const ds4_engine *e) { return e->info.n_layers; }
int ds4_engine_n_embd(const ds4_engine *e) { return e->info.n_embd; }

static void inspect_value(const ds4_gguf_kv *kv, FILE *out) {
    switch (kv->type) {
    case DS4_GGUF_STRING:
        /* one line per key: control bytes are shown as '.', long strings cut */
        fputc('"', out);
        for (uint64_t i = 0; i < kv->str.len && i < 72; i++)
            fputc((unsigned char)kv->str.ptr[i] < 0x20 ? '.' : kv->str.ptr[i], out);
        fprintf(out, "%s\"", kv->str.len > 72 ? "..." : "");
        break;
    case DS4_GGUF_ARRAY: fprintf(out, "[%llu values]", (unsigned long long)kv->arr_n); break;
    case DS4_GGUF_F32: case DS4_GGUF_F64: fprintf(out, "%g", kv->v.f); break;
    case DS4_GGUF_BOOL: fprintf(out, "%s", kv->v.b ? "true" : "false"); break;
    case DS4_GGUF_I8: case DS4_GGUF_I16: case DS4_GGUF_I32: case DS4_GGUF_I64:
        fprintf(out, "%lld", (long long)kv->v.i);
        break;
    default: fprintf(out, "%llu", (unsigned long long)kv->v.u); break;
    }
}

void ds4_engine_inspect(const ds4_engine *e, int ctx, FILE *out) {
    const ds4_family_info *in = &e->info;
    fprintf(out, "model: %s (%s), %d layers, width %d, vocabulary %d, routed experts %d-bit, trained context %llu\n",
            in->name, e->fam->arch, in->n_layers, in->n_embd, in->n_vocab, in->expert_bits,
            (unsigned long long)in->train_ctx);
    fprintf(out, "\nmetadata (%zu keys):\n", ds4_gguf_n_kv(e->g));
    for (size_t i = 0; i < ds4_gguf_n_kv(e->g); i++) {
        const ds4_gguf_kv *kv = ds4_gguf_kv_at(e->g, i);
        fprintf(out, "  %.*s = ", (int)kv->key.len, kv->key.ptr);
        inspect_value(kv, out);
        fputc('\n', out);
    }
    /* the tensor mix: counts and bytes per storage type, in type-id order */
    enum { TYPES = 64 };
    uint64_t count[TYPES] = {0}, bytes[TYPES] = {0}, total = 0, other = 0, other_bytes = 0;
    const size_t nt = ds4_gguf_n_tensors(e->g);
    for (size_t i = 0; i < nt; i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(e->g, i);
        total += t->n_bytes;
        if (t->type < TYPES) { count[t->type]++; bytes[t->type] += t->n_bytes; }
        else { other++; other_bytes += t->n_bytes; }
    }
    fprintf(out, "\ntensors: %zu, %.3f GiB\n", nt, (double)total / (1 << 30));
    for (int t = 0; t < TYPES; t++)
        if (count[t]) {
            const char *name = ds4_type_name((uint32_t)t);
            fprintf(out, "  %-8s %6llu tensors %10.3f MiB %5.1f%%\n", name ? name : "?", (unsigned long long)count[t],
                    (double)bytes[t] / (1 << 20), total ? 100.0 * (double)bytes[t] / (double)total : 0.0);
        }
    if (other) fprintf(out, "  other    %6llu tensors %10.3f MiB\n", (unsigned long long)other, (double)other_bytes / (1 << 20));
    fprintf(out, "\nmemory plan:\n  weights (file)   %.3f GiB in %d file(s)\n  resident now     %.3f GiB\n"
            "  one session      %.1f MiB for %d tokens (KV state, checkpoints, token list, logits)\n"
            "  backend          %s, batches of up to %d rows\n",
            (double)in->file_bytes / (1 << 30), ds4_gguf_n_shards(e->g), (double)ds4_process_rss_bytes() / (1 << 30),
            (double)ds4_engine_kv_bytes(e, ctx) / (1 << 20), ctx, e->be->name, e->be->max_batch);
}
int ds4_engine_train_ctx(const ds4_engine *e) {
    return e->info.train_ctx > (1u << 30) ? 1 << 30 : (int)e->info.train_ctx;
}
int ds4_engine_expert_bits(const ds4_engine *e) { return e->info.expert_bits; }
const char *ds4_engine_model_name(const ds4_engine *e) { return e->info.name; }
uint64_t ds4_engine_model_bytes(const ds4_engine *e) { return e->info.file_bytes; }
uint64_t ds4_engine_kv_bytes(const ds4_engine *e, int ctx) {
    const uint64_t glue = (uint64_t)ctx * sizeof(int32_t) + (uint64_t)e->info.n_vocab * sizeof(float);
    return e->fam->state_bytes(e->m, ctx) + glue;
}

/* ---- sessions ---- */

ds4_session *ds4_session_new(ds4_engine *e, int ctx, char *err, size_t errlen) {
    if (ctx <= 0) { snprintf(err, errlen, "context size must be positive (got %d)", ctx); return NULL; }
    ds4_session *s = calloc(1, sizeof *s);
    bool ok = s != NULL;
    if (ok) {
        s->e = e;
        s->ctx = ctx;
        s->steering = e->steering;
        s->toks = malloc((size_t)ctx * sizeof(int32_t));
        s->logits = malloc((size_t)e->info.n_vocab * sizeof(float));
        s->st = e->fam->state_new(e->m, e->be, ctx, e->prefill_chunk);
        ok = s->toks && s->logits && s->st;
    }
    if (!ok) {
        snprintf(err, errlen, "out of memory for a %d-token session (%.1f MiB of state)", ctx,
                 (double)ds4_engine_kv_bytes(e, ctx) / (1 << 20));
        ds4_session_free(s);
        return NULL;
    }
    return s;
}

static int n_pos(const ds4_session *s) { return s->e->fam->n_pos(s->st); }

void ds4_session_free(ds4_session *s) {
    if (!s) return;
    if (s->st) s->e->fam->state_free(s->st);
    free(s->toks);
    free(s->logits);
    free(s);
}

int ds4_session_ctx(const ds4_session *s) { return s->ctx; }
int ds4_session_n_tokens(const ds4_session *s) { return n_pos(s); }
int ds4_session_n_vocab(const ds4_session *s) { return s->e->info.n_vocab; }
int ds4_session_test_fail_decode_after(const ds4_session *s) { return s->e->test_fail_decode_after; }
const int32_t *ds4_session_tokens(const ds4_session *s) { return s->toks; }
const float *ds4_session_logits(const ds4_session *s) { return n_pos(s) ? s->logits : NULL; }

int ds4_session_probe(ds4_session *s, struct ds4_act_probe *probe, char *err, size_t errlen) {
    const ds4_engine *e = s->e;
    if (probe && (probe->n_layer != e->info.n_layers || probe->n_embd != e->info.n_embd)) {
        snprintf(err, errlen, "an activation probe of %d x %d for a model of %d layers x %d", probe->n_layer,
                 probe->n_embd, e->info.n_layers, e->info.n_embd);
        return -1;
    }
    if (probe && !e->host_layers) {
        snprintf(err, errlen, "activation dumps run in one process on the CPU backend (not with --cuda or --role)");
        return -1;
    }
    s->probe = probe;
    return 0;
}

bool ds4_engine_has_steering(const ds4_engine *e) { return e->steer_dir != NULL; }

void ds4_engine_steering(const ds4_engine *e, float *ffn, float *attn) {
    *ffn = e->steering.ffn;
    *attn = e->steering.attn;
}

void ds4_session_steering(const ds4_session *s, float *ffn, float *attn) {
    *ffn = s->steering.ffn;
    *attn = s->steering.attn;
}

int ds4_session_set_steering(ds4_session *s, float ffn, float attn, char *err, size_t errlen) {
    if (!s->e->steer_dir) {
        snprintf(err, errlen, "this engine was started without --dir-steering-file");
        return -1;
    }
    if (!isfinite(ffn) || !isfinite(attn)) {
        snprintf(err, errlen, "steering scales must be finite");
        return -1;
    }
    s->steering.ffn = ffn;
    s->steering.attn = attn;
    return 0;
}

/* One backend call appending each step's tokens to its session. all_logits
 * (NULL, or one pointer per step, each NULL or n x vocab) asks for every
 * position's logits; the last token's always land in the session. Nothing
 * changes on error. */
static int eval_steps(ds4_engine *e, const ds4_step *steps, float *const *all_logits, int n_steps, char *err,
                      size_t errlen) {
    ds4_backend *be = e->be;
    const int V = e->info.n_vocab;
    if (e->fam->can_eval && !e->fam->can_eval(e->m, be, err, errlen)) return -1;
    if (n_steps < 0 || n_steps > be->max_batch) {
        snprintf(err, errlen, "%d sessions in one step (at most %d)", n_steps, be->max_batch);
        return -1;
    }
    for (int i = 0; i < n_steps; i++) {
        const ds4_session *s = steps[i].session;
        if (!s || s->e != e || steps[i].n < 1 || !steps[i].toks) {
            snprintf(err, errlen, "step %d: needs a session of this engine and at least one token", i);
            return -1;
        }
        if (n_pos(s) + steps[i].n > s->ctx) {
            snprintf(err, errlen, "context full: %d + %d tokens exceed ctx %d", n_pos(s), steps[i].n, s->ctx);
            return -1;
        }
        float *all = all_logits ? all_logits[i] : NULL;
        ds4_backend_seq *q = &e->seqs[i];
        *q = (ds4_backend_seq){.toks = steps[i].toks, .n = steps[i].n, .logits = all ? all : s->logits,
                               .all_logits = all != NULL,
                               .steer = ds4_steering_active(&s->steering) ? &s->steering : NULL,
                               .probe = s->probe};
        e->fam->seq_bind(s->st, q);
    }
    ds4_power_begin(&be->power);
    const int rc = be->eval(be, e->seqs, n_steps, err, errlen);
    ds4_power_pause(&be->power);
    if (rc) return -1;
    for (int i = 0; i < n_steps; i++) {
        ds4_session *s = steps[i].session;
        const int n = steps[i].n, base = n_pos(s) - n;
        /* memmove: a rewind replays the session's own token list */
        memmove(s->toks + base, steps[i].toks, (size_t)n * sizeof(int32_t));
        if (all_logits && all_logits[i])
            memcpy(s->logits, all_logits[i] + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
        e->fam->stepped(s->st);
    }
    return 0;
}

int ds4_sessions_step(ds4_engine *e, const ds4_step *steps, int n_steps, char *err, size_t errlen) {
    return eval_steps(e, steps, NULL, n_steps, err, errlen);
}

int ds4_engine_max_batch(const ds4_engine *e) { return e->be->max_batch; }
uint64_t ds4_engine_weight_bytes_read(const ds4_engine *e) { return e->be->weight_bytes; }

/* Runs toks through the backend in chunks of at most max_batch. */
static int run(ds4_session *s, const int32_t *toks, int n, float *all_logits, ds4_progress_fn progress, void *ud,
               char *err, size_t errlen) {
    const int chunk = s->e->be->max_batch, V = s->e->info.n_vocab;
    if (n < 0 || n_pos(s) + n > s->ctx) {
        snprintf(err, errlen, "context full: %d + %d tokens exceed ctx %d", n_pos(s), n, s->ctx);
        return -1;
    }
    for (int done = 0; done < n;) {
        ds4_step step = {s, toks + done, n - done < chunk ? n - done : chunk};
        float *out = all_logits ? all_logits + (size_t)done * V : NULL;
        if (eval_steps(s->e, &step, &out, 1, err, errlen)) return -1;
        done += step.n;
        if (progress && progress(ud, done, n)) return 1;
    }
    return 0;
}

int ds4_session_prefill(ds4_session *s, const int32_t *toks, int n, float *all_logits,
                        ds4_progress_fn progress, void *ud, char *err, size_t errlen) {
    return run(s, toks, n, all_logits, progress, ud, err, errlen);
}

int ds4_session_decode(ds4_session *s, int32_t tok, char *err, size_t errlen) {
    return run(s, &tok, 1, NULL, NULL, NULL, err, errlen);
}

/* The logits after token n-1 are not kept, so a rewind always recomputes the
 * last kept token, from the position the family's state goes back to
 * (model_family.h: rewind). */
int ds4_session_rewind(ds4_session *s, int n_tokens, char *err, size_t errlen) {
    const int have = n_pos(s);
    if (n_tokens < 0 || n_tokens > have) {
        snprintf(err, errlen, "cannot rewind to %d tokens: the session holds %d", n_tokens, have);
        return -1;
    }
    if (n_tokens == have) return 0;
    if (n_tokens == 0) { s->e->fam->reset(s->st); return 0; }
    const int from = s->e->fam->rewind(s->st, n_tokens - 1, err, errlen);
    if (from < 0) return -1;
    return run(s, s->toks + from, n_tokens - from, NULL, NULL, NULL, err, errlen);
}

bool ds4_engine_has_draft(const ds4_engine *e) {
    return e->fam->draft_name && e->fam->draft_name(e->m) != NULL;
}

static int draft(ds4_session *s, int32_t last, int max, float margin, int32_t *out, float *logits, char *err,
                 size_t errlen) {
    const ds4_engine *e = s->e;
    if (!ds4_engine_has_draft(e) || max <= 0) return 0;
    if (last < 0 || last >= e->info.n_vocab) {
        snprintf(err, errlen, "token id %d out of range [0, %d)", last, e->info.n_vocab);
        return -1;
    }
    return e->fam->draft(s->st, s->toks, n_pos(s), last, max, margin, out, logits, err, errlen);
}

int ds4_session_draft(ds4_session *s, int32_t last, int max, float margin, int32_t *out, char *err, size_t errlen) {
    return draft(s, last, max, margin, out, NULL, err, errlen);
}

int ds4_session_draft_logits(ds4_session *s, int32_t last, float *logits, char *err, size_t errlen) {
    int32_t id;
    if (!ds4_engine_has_draft(s->e)) {
        snprintf(err, errlen, "this engine has no draft model (--mtp, --dspark)");
        return -1;
    }
    if (n_pos(s) < 1) {
        snprintf(err, errlen, "the draft model needs at least one evaluated token");
        return -1;
    }
    logits[0] = NAN;
    if (draft(s, last, 1, INFINITY, &id, logits, err, errlen) < 0) return -1;
    if (isnan(logits[0])) {
        snprintf(err, errlen, "the draft model has no hidden state of the last token (restored session)");
        return -1;
    }
    return 0;
}

int ds4_session_truncate(ds4_session *s, int n_tokens, const float *logits, char *err, size_t errlen) {
    const int have = n_pos(s);
    if (n_tokens < 1 || n_tokens > have || !logits) {
        snprintf(err, errlen, "cannot truncate to %d tokens: the session holds %d", n_tokens, have);
        return -1;
    }
    if (n_tokens == have) return 0;
    const int from = s->e->fam->rewind(s->st, n_tokens, err, errlen);
    if (from < 0) return -1;
    /* past the state's slack it went back further: recompute the rest, which
     * leaves these same logits (bit-identical evaluation, backend.h) */
    if (from < n_tokens) return run(s, s->toks + from, n_tokens - from, NULL, NULL, NULL, err, errlen);
    memcpy(s->logits, logits, (size_t)s->e->info.n_vocab * sizeof(float));
    return 0;
}

/* ---- snapshots ---- */

ds4_snapshot *ds4_session_snapshot(const ds4_session *s) {
    const ds4_family *f = s->e->fam;
    const int V = s->e->info.n_vocab, n = n_pos(s);
    ds4_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap) return NULL;
    snap->ctx = s->ctx;
    snap->n_toks = n;
    snap->kv_bytes = f->snapshot_bytes(s->st, V);
    snap->kv = malloc(snap->kv_bytes);
    snap->toks = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    snap->logits = malloc((size_t)V * sizeof(float));
    if (!snap->kv || !snap->toks || !snap->logits || !f->snapshot_save(s->st, s->toks, s->logits, V, snap->kv)) {
        ds4_snapshot_free(snap);
        return NULL;
    }
    memcpy(snap->toks, s->toks, (size_t)n * sizeof(int32_t));
    memcpy(snap->logits, s->logits, (size_t)V * sizeof(float));
    return snap;
}

int ds4_session_restore(ds4_session *s, const ds4_snapshot *snap, char *err, size_t errlen) {
    if (snap->ctx != s->ctx) {
        snprintf(err, errlen, "snapshot does not fit this session (ctx %d vs %d)", snap->ctx, s->ctx);
        return -1;
    }
    return s->e->fam->snapshot_load(s->st, s->toks, s->logits, s->e->info.n_vocab, snap->kv, snap->kv_bytes,
                                    snap->toks, snap->n_toks, snap->logits, err, errlen);
}

void ds4_snapshot_free(ds4_snapshot *snap) {
    if (!snap) return;
    free(snap->kv);
    free(snap->toks);
    free(snap->logits);
    free(snap);
}

size_t ds4_session_payload_bytes(const ds4_session *s) {
    return s->e->fam->payload_bytes(s->st, s->e->info.n_vocab);
}

void ds4_session_save_payload(const ds4_session *s, void *dst) {
    s->e->fam->payload_save(s->st, s->toks, s->logits, s->e->info.n_vocab, dst);
}

int ds4_session_load_payload(ds4_session *s, const void *src, size_t n, char *err, size_t errlen) {
    return s->e->fam->payload_load(s->st, s->toks, s->logits, s->e->info.n_vocab, src, n, err, errlen);
}

bool ds4_session_save_payload_to(const ds4_session *s, const ds4_sink *sink) {
    return s->e->fam->payload_save_to(s->st, s->toks, s->logits, s->e->info.n_vocab, sink);
}

int ds4_session_load_payload_from(ds4_session *s, const ds4_source *src, size_t n, char *err, size_t errlen) {
    return s->e->fam->payload_load_from(s->st, s->toks, s->logits, s->e->info.n_vocab, src, n, err, errlen);
}
