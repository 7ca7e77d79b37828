/* dsv4_family.c -- DeepSeek V4's entries of the family seam
 * (model_family.h, chat_spec.h): the model binding with --layers slices,
 * the CPU, CUDA and pipeline backends, --ssd-streaming, the KV state with
 * ring checkpoints for deep rewinds, the DSV4 payload, and the DSML chat
 * format. */
#include "models/model_family.h"
#include "base/log.h"

#include "backends/cuda/cuda_backend.h"
#include "dist/tp.h"
#include "models/dsv4/expert_cache.h"
#include "models/dsv4/forward_cpu.h"
#include "kernels/kernels_cpu.h"
#include "format/gguf.h"
#include "models/dsv4/kv.h"
#include "models/dsv4/ds4_layout.h"
#include "models/dsv4/kv_payload.h"
#include "models/dsv4/model.h"
#include "models/dsv4/mtp.h"
#include "models/dsv4/dspark.h"
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Positions a session can drop without recomputing (kv.h): covers the usual
 * rewinds of a turn's tail. Deeper rewinds restore the nearest ring checkpoint
 * (one per prefill_chunk tokens, at most MAX_CKPT, thinned to every other one
 * when full) and recompute from there, or from the start without one. The
 * checkpoint slots are allocated with the session, so its memory is known
 * (and refused) up front rather than growing during a long prefill. */
enum { REWIND_SLACK = 256, MAX_CKPT = 16 };

struct ds4_family_model {
    const ds4_gguf *g;
    ds4_model *m;
    ds4_expert_cache *experts;      /* --ssd-streaming */
    FILE *trace;
    bool ssd_stats, numerics;
    int cpu_threads;                /* 0: not the CPU backend */
    int max_rows;                   /* the backend's rows per evaluation */
    ds4_mtp *mtp;                   /* --mtp: the drafter, or NULL */
    ds4_dspark *dspark;             /* --dspark: the block drafter, or NULL (never both) */
};

static ds4_family_model *bind(const ds4_gguf *g, const ds4_engine_params *p, ds4_family_info *info, char *err,
                              size_t errlen) {
    ds4_layer_slice slice;
    if (p->layers && !ds4_layer_slice_parse(p->layers, &slice, err, errlen)) return NULL;
    ds4_family_model *fm = calloc(1, sizeof *fm);
    if (!fm) { snprintf(err, errlen, "out of memory loading %s", p->model_path); return NULL; }
    fm->g = g;
    fm->m = ds4_model_bind_slice(g, p->layers ? &slice : NULL, err, errlen);
    if (!fm->m) { free(fm); return NULL; }
    if (p->dist.tp && (p->ssd.enabled || p->gpu.backend == DS4_BACKEND_CUDA)) {
        snprintf(err, errlen, "--tensor-parallel works with the CPU backend only, without --ssd-streaming");
        ds4_model_free(fm->m);
        free(fm);
        return NULL;
    }
    /* The expert cache and the GPU upload plan walk every layer; a slice
     * process runs on the CPU with its layers mapped. */
    if (!ds4_model_is_whole(fm->m) && (p->ssd.enabled || p->gpu.backend == DS4_BACKEND_CUDA)) {
        snprintf(err, errlen, "--layers with a part of the model works with the CPU backend only, "
                              "without --ssd-streaming");
        ds4_model_free(fm->m);
        free(fm);
        return NULL;
    }
    const ds4_config *c = &fm->m->cfg;
    *info = (ds4_family_info){fm->m->name, c->n_vocab, c->n_layer, c->n_embd, ds4_model_expert_bits(fm->m), c->train_ctx,
                              fm->m->file_bytes, fm->m->binds_file && !p->dist.tp};
    /* (a tensor-parallel process reads half of the routed experts: the
     * whole file is not paged in at load) */
    fm->numerics = p->numerics < 0 ? ds4_cpu_numerics_supported(c) : p->numerics > 0;
    return fm;
}

/* ---- tensor parallelism (dist/tp.h): the model and its ds4_kv states ---- */

static size_t tp_state_max(const void *m, int ctx) {
    return (size_t)ds4_kv_bytes_for(&((const ds4_model *)m)->cfg, ctx, REWIND_SLACK);
}
static void *tp_state_new(const void *m, int ctx) { return ds4_kv_new(&((const ds4_model *)m)->cfg, ctx, REWIND_SLACK); }
static void tp_state_free(void *st) { ds4_kv_free(st); }
static int tp_state_pos(const void *st) { return ((const ds4_kv *)st)->n_pos; }
static int tp_state_ctx(const void *st) { return ((const ds4_kv *)st)->ctx; }
static void tp_state_reset(void *st) { ds4_kv_reset(st); }
static bool tp_state_truncate(void *st, int n) { return ds4_kv_truncate(st, n); }
static size_t tp_state_bytes(const void *m, const void *st) { return (void)m, ds4_kv_live_bytes(st); }
static void tp_state_save(const void *m, const void *st, void *dst) { (void)m, ds4_kv_save(st, dst); }
static bool tp_state_load(const void *m, void *st, const void *src, size_t n) { return (void)m, ds4_kv_load(st, src, n); }
static void *tp_undo_save(const void *st, int n) {
    ds4_kv_undo *u = calloc(1, sizeof *u);
    if (u && !ds4_kv_undo_save(u, st, n)) { free(u); return NULL; }
    return u;
}
static void tp_undo_apply(const void *u, void *st) { ds4_kv_undo_apply(u, st); }
static void tp_undo_free(void *u) {
    if (u) ds4_kv_undo_free(u);
    free(u);
}

static ds4_tp_family tp_family(const ds4_model *m) {
    const ds4_config *c = &m->cfg;
    /* a layer exchange per row: the group latents, the shared expert's
     * activation, or half its output row and every selected slot's */
    const size_t slots = ((size_t)c->n_expert_used + 1) * c->n_embd, latents = (size_t)c->o_groups * c->o_lora;
    const size_t wider = slots > latents ? slots : latents, shared = (size_t)c->n_ff_exp;
    return (ds4_tp_family){m, "cpu", m->name, c->n_layer, c->n_embd, c->n_hc, c->n_vocab, c->n_expert,
                           ds4_model_expert_bits(m), ds4_model_is_whole(m), shared > wider ? shared : wider,
                           ds4_cpu_backend_split, tp_state_max, tp_state_new, tp_state_free, tp_state_pos,
                           tp_state_ctx, tp_state_reset, tp_state_truncate, tp_state_bytes, tp_state_save,
                           tp_state_load, tp_undo_save, tp_undo_apply, tp_undo_free};
}

/* Batch scratch of the CPU backend at its largest batch (forward_cpu's
 * grow_batch, rounded up): the automatic expert budget leaves room for it. */
static uint64_t scratch_bytes(const ds4_config *c, int batch) {
    const uint64_t E = (uint64_t)c->n_embd, hcE = (uint64_t)c->n_hc * E, HD = (uint64_t)c->n_head * c->head_dim;
    const uint64_t per_token = 4 * hcE + 6 * E + 4 * (uint64_t)c->n_ff_exp + 3 * HD + (uint64_t)c->n_expert +
                               (uint64_t)c->o_groups * c->o_lora + (uint64_t)c->q_lora + (uint64_t)c->idx_topk;
    return (uint64_t)batch * per_token * sizeof(float) + ((uint64_t)64 << 20);
}

/* --ssd-streaming: size the cache, make the rest resident, preload. */
static bool start_streaming(ds4_family_model *fm, ds4_backend *be, const ds4_engine_params *p, int prefill_chunk,
                            char *err, size_t errlen) {
    const ds4_model *m = fm->m;
    const ds4_config *c = &m->cfg;
    const uint64_t routed = ds4_expert_routed_bytes(m);
    ds4_expert_budget b = {0};
    b.resident_bytes = m->file_bytes - routed;
    /* a batch never exceeds the context */
    const int batch = p->ssd.ctx > 0 && p->ssd.ctx < prefill_chunk ? p->ssd.ctx : prefill_chunk;
    b.reserve_bytes = scratch_bytes(c, batch) + (p->ssd.ctx > 0 ? ds4_kv_bytes_for(c, p->ssd.ctx, REWIND_SLACK) : 0);
    b.budget_bytes = p->ssd.cache_bytes;
    b.slots = p->ssd.cache_slots;
    char note[160];
    int slots = ds4_expert_cache_plan(m, &b, note, sizeof note, err, errlen);
    if (slots < 0) return false;
    if (!ds4_expert_cache_make_resident(fm->g, m, err, errlen)) return false;
    fm->experts = ds4_expert_cache_new(fm->g, m, slots, p->ssd.lru ? DS4_EVICT_LRU : DS4_EVICT_LFU_AGED, err, errlen);
    if (!fm->experts) return false;
    if (p->ssd.trace_path) {
        fm->trace = fopen(p->ssd.trace_path, "wb");
        if (!fm->trace) { snprintf(err, errlen, "cannot write %s", p->ssd.trace_path); return false; }
        ds4_expert_cache_record(fm->experts, fm->trace);
    }
    const size_t slot = ds4_expert_slot_bytes(m);
    int preloaded = 0;
    const int want = p->ssd.cold ? 0 : p->ssd.preload_experts > 0 ? p->ssd.preload_experts : slots / 2;
    if (want > 0) {
        uint32_t *hist = ds4_expert_static_histogram(m);
        if (!hist) { snprintf(err, errlen, "out of memory"); return false; }
        preloaded = ds4_expert_cache_preload(fm->experts, hist, want);
        free(hist);
        if (ds4_expert_cache_take_error(fm->experts, err, errlen)) return false;
    }
    ds4_cpu_backend_stream_experts(be, fm->experts, !p->ssd.no_predict);
    fm->ssd_stats = p->ssd.stats;
    if (!p->quiet) {
        const double GiB = 1 << 30;
        ds4_log(DS4_LOG_INFO, "ds4: ssd-streaming: %.2f GiB resident, expert cache %d slots x %.1f MiB = %.2f GiB "
                              "(%.0f%% of %.2f GiB routed), working set %.1f MiB per token, %d preloaded, %s reads%s%s\n",
                (double)b.resident_bytes / GiB, slots, (double)slot / (1 << 20), (double)slots * slot / GiB,
                100.0 * slots / ((double)c->n_layer * c->n_expert), (double)routed / GiB,
                (double)c->n_layer * c->n_expert_used * routed / ((double)c->n_layer * c->n_expert) / (1 << 20),
                preloaded, ds4_expert_cache_direct(fm->experts) ? "O_DIRECT" : "buffered", note[0] ? "; " : "",
                note);
    }
    return true;
}

static ds4_backend *backend_new(ds4_family_model *fm, const ds4_engine_params *p, int prefill_chunk, char *err,
                                size_t errlen) {
    if (p->gpu.backend == DS4_BACKEND_CUDA && p->ssd.enabled) {
        /* the expert cache feeds the CPU kernels; the CUDA backend uploads every weight */
        snprintf(err, errlen, "--ssd-streaming works with the CPU backend only, not with --cuda");
        return NULL;
    }
    ds4_backend *be;
    if (p->gpu.backend == DS4_BACKEND_CUDA)
        be = ds4_cuda_backend_new(fm->m, &p->gpu, p->gpu_ctx > 0 ? p->gpu_ctx : 32768, REWIND_SLACK,
                                  prefill_chunk, fm->numerics, p->quiet, err, errlen);
    else
        be = ds4_cpu_backend_new(fm->m, p->n_threads, prefill_chunk, fm->numerics, err, errlen);
    fm->cpu_threads = be && p->gpu.backend == DS4_BACKEND_CPU ? ds4_cpu_backend_threads(be) : 0;
    const ds4_tp_family tp = tp_family(fm->m);
    if (be && p->dist.role == DS4_DIST_COORDINATOR)
        be = p->dist.tp ? ds4_tp_coordinator_new(be, &tp, &p->dist, fm->numerics, err, errlen)
                        : ds4_dist_coordinator_new(be, fm->m, &p->dist, fm->numerics, err, errlen);
    if (be && p->ssd.enabled && !start_streaming(fm, be, p, prefill_chunk, err, errlen)) {
        be->free(be);
        return NULL;
    }
    if (be) fm->max_rows = be->max_batch;
    return be;
}

static void report(const ds4_family_model *fm, const ds4_backend *be, const ds4_engine_params *p, uint64_t rss) {
    (void)be;
    const ds4_model *m = fm->m;
    const ds4_config *c = &m->cfg;
    char where[64] = "cuda";
    if (p->gpu.backend == DS4_BACKEND_CPU)
        snprintf(where, sizeof where, "%d threads, cpu kernels %s", fm->cpu_threads,
                 ds4_isa_cap_name(ds4_kernels_isa()));
    const ds4_layer_slice *sl = &m->slice;
    char held[80] = "";
    if (!ds4_model_is_whole(m))
        snprintf(held, sizeof held, " (this process: layers %d..%d%s)", sl->first, sl->last,
                 sl->output ? " + output head" : "");
    ds4_log(DS4_LOG_INFO, "ds4: %s: %d layers%s, %d experts (%d-bit), %.2f GiB file, %.1f MiB resident, "
                          "%s, numerics %s\n",
            m->name, c->n_layer, held, c->n_expert, ds4_model_expert_bits(m), (double)m->file_bytes / (1 << 30),
            (double)rss / (1 << 20), where, fm->numerics ? "ds4" : "f32");
}

static bool ssd_stats(const ds4_family_model *fm, ds4_ssd_stats *out) {
    if (!fm->experts) return false;
    ds4_expert_stats st = ds4_expert_cache_stats(fm->experts);
    *out = (ds4_ssd_stats){st.hits, st.misses, st.bytes_read, st.tokens, st.preloaded, st.prefetched,
                           st.predicted, st.predicted_right, st.predicted_read,
                           st.read_seconds, st.stall_seconds};
    return true;
}

static bool observe_matmuls(ds4_family_model *fm, ds4_backend *be, ds4_matmul_observer fn, void *ud, char *err,
                            size_t errlen) {
    if (fm->experts || strcmp(be->name, "cpu")) {
        snprintf(err, errlen, "matrix inputs can be collected on the CPU backend only (no --cuda, --ssd-streaming "
                              "or pipeline parallelism)");
        return false;
    }
    ds4_cpu_backend_observe(be, fn, ud);
    return true;
}

static void print_ssd_stats(const ds4_family_model *fm) {
    ds4_ssd_stats st;
    if (!ssd_stats(fm, &st)) return;
    const uint64_t acc = st.hits + st.misses;
    ds4_log(DS4_LOG_INFO, "ds4: ssd-streaming stats: %llu tokens, hit rate %.1f%% (%llu of %llu), %.2f MiB read per token, "
                          "read %.1f MiB/s, stall %.2f s, %llu preloaded, %llu prefetched, "
                          "next-layer guesses %.1f%% right (%llu of %llu, %llu read ahead)\n",
            (unsigned long long)st.tokens, acc ? 100.0 * st.hits / acc : 0.0, (unsigned long long)st.hits,
            (unsigned long long)acc, st.tokens ? (double)st.bytes_read / st.tokens / (1 << 20) : 0.0,
            st.read_seconds > 0 ? (double)st.bytes_read / st.read_seconds / (1 << 20) : 0.0, st.stall_seconds,
            (unsigned long long)st.preloaded, (unsigned long long)st.prefetched,
            st.predicted ? 100.0 * st.predicted_right / st.predicted : 0.0, (unsigned long long)st.predicted_right,
            (unsigned long long)st.predicted, (unsigned long long)st.predicted_read);
}

static void model_free(ds4_family_model *fm) {
    if (!fm) return;
    if (fm->ssd_stats) print_ssd_stats(fm);
    ds4_mtp_free(fm->mtp);
    ds4_dspark_free(fm->dspark);
    ds4_expert_cache_free(fm->experts);
    if (fm->trace) fclose(fm->trace);
    ds4_model_free(fm->m);
    free(fm);
}

static bool can_eval(const ds4_family_model *fm, const ds4_backend *be, char *err, size_t errlen) {
    if (ds4_model_is_whole(fm->m) || !strcmp(be->name, "dist")) return true;
    const ds4_layer_slice *sl = &fm->m->slice;
    snprintf(err, errlen, "this process holds layers %d..%d%s only (--layers): it cannot compute logits "
                          "alone (run it with --role coordinator or --role worker)",
             sl->first, sl->last, sl->output ? " and the output head" : "");
    return false;
}

static int serve_worker(ds4_family_model *fm, ds4_backend *be, int ctx, const ds4_dist_params *p) {
    const ds4_tp_family tp = tp_family(fm->m);
    if (p->tp) return ds4_tp_worker_serve(&tp, be, fm->numerics, ctx, p);
    return ds4_dist_worker_serve(fm->m, be, fm->numerics, ctx, p);
}

static bool draft_load(ds4_family_model *fm, ds4_backend *be, const char *path, bool dspark, char *err,
                       size_t errlen) {
    if (!dspark) {
        fm->mtp = ds4_mtp_load(path, fm->m, be, fm->numerics, err, errlen);
        return fm->mtp != NULL;
    }
    if (strcmp(be->name, "cpu")) {
        snprintf(err, errlen, "--dspark runs beside the CPU backend only (not %s)", be->name);
        return false;
    }
    fm->dspark = ds4_dspark_load(path, fm->m, ds4_cpu_backend_pool(be), err, errlen);
    return fm->dspark != NULL;
}

static const char *draft_name(const ds4_family_model *fm) {
    return fm->mtp ? ds4_mtp_name(fm->mtp) : fm->dspark ? ds4_dspark_name(fm->dspark) : NULL;
}

/* The DSpark ring holds every row of one evaluation of a session: the
 * backend's batch (a prefill chunk), never more than the context. */
static int dspark_ring_rows(int ctx, int max_rows) { return max_rows < ctx ? max_rows : ctx; }

static uint64_t state_bytes(const ds4_family_model *fm, int ctx) {
    const ds4_config *c = &fm->m->cfg;
    return ds4_kv_bytes_for(c, ctx, REWIND_SLACK) + (uint64_t)MAX_CKPT * ds4_kv_ring_bytes_for(c) +
           (fm->mtp ? ds4_mtp_state_bytes(fm->mtp, ctx) : 0) +
           (fm->dspark ? ds4_dspark_state_bytes(fm->dspark, ctx, dspark_ring_rows(ctx, fm->max_rows)) : 0);
}

/* ---- session state ---- */

struct ds4_family_state {
    ds4_kv *kv;
    ds4_backend *be;
    int prefill_chunk;
    void *ckpt[MAX_CKPT];   /* ring checkpoint slots; the first n_ckpt hold ascending positions */
    int ckpt_pos[MAX_CKPT], n_ckpt, ckpt_every;
    void *ckpt_block;       /* the MAX_CKPT slots */
    ds4_mtp_state *mtp;     /* --mtp: the drafter's side of this session */
    ds4_dspark_state *dspark;
};

static void state_free(ds4_family_state *st) {
    if (!st) return;
    ds4_mtp_state_free(st->mtp);
    ds4_dspark_state_free(st->dspark);
    free(st->ckpt_block);
    if (st->kv && st->be->kv_release) st->be->kv_release(st->be, st->kv);
    ds4_kv_free(st->kv);
    free(st);
}

static ds4_family_state *state_new(ds4_family_model *fm, ds4_backend *be, int ctx, int prefill_chunk) {
    ds4_family_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->be = be;
    st->prefill_chunk = prefill_chunk;
    st->kv = ds4_kv_new(&fm->m->cfg, ctx, REWIND_SLACK);
    st->ckpt_every = prefill_chunk;
    const size_t ring = ds4_kv_ring_bytes_for(&fm->m->cfg);
    /* calloc: a slot's pages are touched only when a checkpoint is taken */
    st->ckpt_block = calloc(MAX_CKPT, ring);
    for (int i = 0; st->ckpt_block && i < MAX_CKPT; i++) st->ckpt[i] = (char *)st->ckpt_block + (size_t)i * ring;
    if (fm->mtp) st->mtp = ds4_mtp_state_new(fm->mtp, ctx);
    if (fm->dspark) st->dspark = ds4_dspark_state_new(fm->dspark, ctx, dspark_ring_rows(ctx, be->max_batch));
    if (!st->kv || !st->ckpt_block || (fm->mtp && !st->mtp) || (fm->dspark && !st->dspark)) {
        state_free(st);
        return NULL;
    }
    return st;
}

static int n_pos(const ds4_family_state *st) { return st->kv->n_pos; }
static void seq_bind(ds4_family_state *st, ds4_backend_seq *q) {
    q->kv = st->kv;
    if (st->mtp) ds4_mtp_bind(st->mtp, q);
    if (st->dspark) ds4_dspark_bind(st->dspark, q);
}

/* The block after the session's tokens; first_logits: its first row's,
 * whatever the schedule keeps (oracle tests ask with an infinite threshold). */
static int dspark_draft(ds4_dspark_state *d, int32_t last, float threshold, int max, int32_t *out,
                        float *first_logits) {
    int32_t toks[DS4_DSPARK_BLOCK_MAX];
    if (first_logits && ds4_dspark_block(d, last, 0, 1, toks, first_logits, NULL) < 1) return 0;
    const int k = ds4_dspark_block(d, last, threshold, max, toks, NULL, NULL);
    memcpy(out, toks, (size_t)k * sizeof(int32_t));
    return k;
}

static int draft(ds4_family_state *st, const int32_t *toks, int n, int32_t last, int max, float margin, int32_t *out,
                 float *first_logits, char *err, size_t errlen) {
    if (st->mtp) return ds4_mtp_draft(st->mtp, toks, n, last, max, margin, out, first_logits, err, errlen);
    if (!st->dspark || ds4_dspark_context(st->dspark) != n) return 0;
    return dspark_draft(st->dspark, last, margin, max, out, first_logits);
}

/* The backend may hold the state elsewhere (CUDA): bring the host copy up to
 * date before reading its buffers, and push it back after writing them. */
static int kv_sync(const ds4_family_state *st, bool to_host, char *err, size_t errlen) {
    return st->be->kv_sync ? st->be->kv_sync(st->be, st->kv, to_host, err, errlen) : 0;
}

/* The host ds4_kv made to hold the whole state (device copy, and the layers
 * a pipeline coordinator's workers hold), before the state is serialised. */
static int kv_gather(const ds4_family_state *st, char *err, size_t errlen) {
    if (kv_sync(st, true, err, errlen)) return -1;
    return st->be->kv_gather ? st->be->kv_gather(st->be, st->kv, err, errlen) : 0;
}

/* After the host state was replaced: the backend's copies follow. */
static int kv_scatter(const ds4_family_state *st, const int32_t *toks, char *err, size_t errlen) {
    if (kv_sync(st, false, err, errlen)) return -1;
    return st->be->kv_scatter ? st->be->kv_scatter(st->be, st->kv, toks, err, errlen) : 0;
}

/* Forgets checkpoints past position n (all of them for n < 0). */
static void drop_ckpts(ds4_family_state *st, int n) {
    while (st->n_ckpt && st->ckpt_pos[st->n_ckpt - 1] > n) st->n_ckpt--;
}

static void stepped(ds4_family_state *st) {
    const int pos = st->kv->n_pos, last = st->n_ckpt ? st->ckpt_pos[st->n_ckpt - 1] : 0;
    if (st->mtp) ds4_mtp_evaluated(st->mtp, pos);
    if (st->dspark) ds4_dspark_evaluated(st->dspark, pos);
    if (pos - last < st->ckpt_every) return;
    if (st->n_ckpt == MAX_CKPT) {
        st->n_ckpt = ds4_kv_ckpt_thin(st->ckpt_pos, st->ckpt, MAX_CKPT);
        st->ckpt_every *= 2;
    }
    char err[256];
    if (kv_sync(st, true, err, sizeof err)) return;   /* a missing checkpoint only makes a deep rewind slower */
    ds4_kv_ring_save(st->kv, st->ckpt[st->n_ckpt]);
    st->ckpt_pos[st->n_ckpt++] = pos;
}

/* From the truncated state when the rings still cover keep, else from the
 * nearest checkpoint, else from the start of the token list. */
static int rewind_main(ds4_family_state *st, int keep, char *err, size_t errlen) {
    drop_ckpts(st, keep);
    if (ds4_kv_truncate(st->kv, keep)) return keep;
    if (!st->n_ckpt) {
        ds4_kv_reset(st->kv);
        return 0;
    }
    if (kv_sync(st, true, err, errlen)) return -1;
    ds4_kv_ring_load(st->kv, st->ckpt[st->n_ckpt - 1]);
    if (kv_sync(st, false, err, errlen)) return -1;
    return st->ckpt_pos[st->n_ckpt - 1];
}

static int rewind_to(ds4_family_state *st, int keep, char *err, size_t errlen) {
    const int from = rewind_main(st, keep, err, errlen);
    if (from >= 0 && st->mtp) ds4_mtp_rewound(st->mtp, from);
    if (from >= 0 && st->dspark) ds4_dspark_rewound(st->dspark, from);
    return from;
}

static void reset(ds4_family_state *st) {
    drop_ckpts(st, -1);
    ds4_kv_reset(st->kv);
    if (st->mtp) ds4_mtp_forget(st->mtp, 0);
    if (st->dspark) ds4_dspark_forget(st->dspark);
}

/* A restored state brings no hidden states: the drafter starts over. */
static void replaced(ds4_family_state *st) {
    drop_ckpts(st, -1);
    if (st->mtp) ds4_mtp_forget(st->mtp, st->kv->n_pos);
    if (st->dspark) ds4_dspark_forget(st->dspark);
}

static size_t snapshot_bytes(const ds4_family_state *st, int n_vocab) { (void)n_vocab; return ds4_kv_live_bytes(st->kv); }

static bool snapshot_save(const ds4_family_state *st, const int32_t *toks, const float *logits, int n_vocab,
                          void *dst) {
    char err[256];
    if (kv_gather(st, err, sizeof err)) return false;
    ds4_kv_save(st->kv, dst);
    return true;
}

static int snapshot_load(ds4_family_state *st, int32_t *toks, float *logits, int n_vocab, const void *src, size_t n,
                         const int32_t *snap_toks, int n_toks, const float *snap_logits, char *err, size_t errlen) {
    if (!ds4_kv_load(st->kv, src, n)) {
        snprintf(err, errlen, "snapshot does not fit this session (ctx %d vs %d)", st->kv->ctx, st->kv->ctx);
        return -1;
    }
    replaced(st);
    memcpy(toks, snap_toks, (size_t)n_toks * sizeof(int32_t));
    memcpy(logits, snap_logits, (size_t)n_vocab * sizeof(float));
    return kv_scatter(st, toks, err, errlen);
}

static size_t payload_bytes(const ds4_family_state *st, int n_vocab) { return ds4_payload_bytes(st->kv, n_vocab); }

/* Before a payload is written from the host copy: when the device lost the
 * state, an empty session is saved rather than stale rows. */
static void payload_sync(const ds4_family_state *st) {
    char err[256];
    if (!kv_gather(st, err, sizeof err)) return;
    ds4_log(DS4_LOG_WARN, "ds4: %s; the session is dropped\n", err);
    ds4_kv_reset(st->kv);
}

static void payload_save(const ds4_family_state *st, const int32_t *toks, const float *logits, int n_vocab,
                         void *dst) {
    payload_sync(st);
    ds4_payload_write(st->kv, toks, logits, n_vocab, st->prefill_chunk, dst);
}

static bool payload_save_to(const ds4_family_state *st, const int32_t *toks, const float *logits, int n_vocab,
                            const ds4_sink *sink) {
    payload_sync(st);
    return ds4_payload_write_to(st->kv, toks, logits, n_vocab, st->prefill_chunk, sink);
}

static int payload_load(ds4_family_state *st, int32_t *toks, float *logits, int n_vocab, const void *src, size_t n,
                        char *err, size_t errlen) {
    if (!ds4_payload_load(st->kv, toks, logits, n_vocab, src, n, err, errlen)) return -1;
    replaced(st);
    return kv_scatter(st, toks, err, errlen);
}

static int payload_load_from(ds4_family_state *st, int32_t *toks, float *logits, int n_vocab, const ds4_source *src,
                             size_t n, char *err, size_t errlen) {
    const int before = st->kv->n_pos;
    bool ok = ds4_payload_load_from(st->kv, toks, logits, n_vocab, src, n, err, errlen);
    /* rewind checkpoints describe the old state once the rows changed */
    if (ok || st->kv->n_pos != before) replaced(st);
    /* a part-way load changed the host rows too: the device copy follows */
    char sync_err[256];
    if (kv_scatter(st, toks, ok ? err : sync_err, ok ? errlen : sizeof sync_err)) return -1;
    return ok ? 0 : -1;
}

/* ---- chat ---- */

/* The continuation tail for trailing tool results of the live turn: EOS,
 * the tool-result user turn(s), the generation prompt. */
static void render_tail(const ds4_chat_msg *msgs, int n, const ds4_chat_opts *o, ds4_buf *out) {
    ds4_buf_puts(out, DS4_STR_EOS);
    bool in_results = false;
    for (int i = 0; i < n; i++) {
        const ds4_chat_msg *m = &msgs[i];
        const char *c = m->content ? m->content : "";
        size_t start;
        if (m->role == DS4_ROLE_TOOL) {
            if (!in_results) ds4_buf_puts(out, DS4_STR_USER);
            start = out->len;
            ds4_chat_tool_result(c, strlen(c), DS4_CHAT_DS4, out);
            in_results = true;
        } else if (m->role == DS4_ROLE_USER) {
            ds4_buf_puts(out, DS4_STR_USER);
            start = out->len;
            ds4_buf_puts(out, c);
            in_results = false;
        } else {
            continue;
        }
        ds4_chat_spans_add(o->client_spans, start, out->len);
    }
    ds4_buf_puts(out, DS4_STR_ASSISTANT);
    ds4_buf_puts(out, o->think == DS4_THINK_NONE ? DS4_STR_THINK_CLOSE : DS4_STR_THINK_OPEN);
}

/* Two forms: 0 keeps an empty think block (tool context), 1 drops the reasoning. */
static void visible_turns(const char *prompt, size_t prompt_len, const char *content, size_t content_len,
                          const char *calls, size_t calls_len, ds4_buf out[2]) {
    const size_t open = strlen(DS4_STR_THINK_OPEN);
    for (int k = 0; k < 2; k++) {
        ds4_buf *v = &out[k];
        ds4_buf_clear(v);
        ds4_buf_put(v, prompt, prompt_len - (k ? open : 0));
        ds4_buf_puts(v, DS4_STR_THINK_CLOSE);
        ds4_buf_put(v, content, content_len);
        if (calls) ds4_buf_put(v, calls, calls_len);
    }
}

static void inline_tool_result(const char *content, size_t n, ds4_buf *out) {
    ds4_chat_tool_result(content, n, DS4_CHAT_DS4, out);
}

static void *parser_create(const ds4_tool_parser_opts *o, ds4_dsml_event_fn fn, void *ud) {
    ds4_dsml_opts po = {.thinking = o->thinking, .tools = o->tools, .decode_entities = true};
    return ds4_dsml_new(&po, fn, ud);
}
static void parser_free(void *p) { ds4_dsml_free(p); }
static void parser_feed(void *p, const char *s, size_t n) { ds4_dsml_feed(p, s, n); }
static void parser_finish(void *p) { ds4_dsml_finish(p); }
static bool parser_done(const void *p) { return ds4_dsml_done(p) || ds4_dsml_failed(p); }
static bool parser_in_reasoning(const void *p) { return ds4_dsml_in_reasoning(p); }
/* a closed block counts: DSML's turn ends with its closing tag */
static bool parser_in_calls(const void *p) { return ds4_dsml_block_open(p) || ds4_dsml_done(p); }
static bool parser_in_structure(const void *p) { return ds4_dsml_in_structure(p); }

static const ds4_tool_parser_ops PARSER = {parser_create, parser_free, parser_feed, parser_finish, parser_done,
                                           parser_in_reasoning, parser_in_calls, parser_in_structure};

static const ds4_model_id MODELS[] = {{"deepseek-v4-flash", "DeepSeek V4 Flash"}, {"deepseek-v4-pro", "DeepSeek V4 Pro"}};

const ds4_chat_spec ds4_chat_spec_dsv4 = {
    .profile = DS4_CHAT_DS4,
    .models = MODELS,
    .n_models = sizeof MODELS / sizeof *MODELS,
    .bos_token = DS4_TOK_BOS,
    .eos_token = DS4_TOK_EOS,
    .add_special_prefix = DS4_TOK_BOS,
    .think_max_default = false,
    .tool_result_turn = false,
    .effective_think = ds4_chat_effective_think,
    .inline_tool_result = inline_tool_result,
    .render_tail = render_tail,
    .visible_turns = visible_turns,
    .parser = &PARSER,
};

const ds4_family ds4_family_dsv4 = {
    .arch = DS4_ARCH,
    .features = DS4_FEAT_SSD_STREAMING | DS4_FEAT_NUMERICS | DS4_FEAT_CUDA | DS4_FEAT_LAYERS | DS4_FEAT_ROLE |
                DS4_FEAT_TP,
    .refusal = NULL,
    .chat = &ds4_chat_spec_dsv4,
    .bind = bind,
    .backend_new = backend_new,
    .report = report,
    .model_free = model_free,
    .can_eval = can_eval,
    .serve_worker = serve_worker,
    .ssd_stats = ssd_stats,
    .observe_matmuls = observe_matmuls,
    .state_bytes = state_bytes,
    .draft_load = draft_load,
    .draft_name = draft_name,
    .draft = draft,
    .state_new = state_new,
    .state_free = state_free,
    .n_pos = n_pos,
    .seq_bind = seq_bind,
    .stepped = stepped,
    .rewind = rewind_to,
    .reset = reset,
    .snapshot_bytes = snapshot_bytes,
    .snapshot_save = snapshot_save,
    .snapshot_load = snapshot_load,
    .payload_bytes = payload_bytes,
    .payload_save = payload_save,
    .payload_save_to = payload_save_to,
    .payload_load = payload_load,
    .payload_load_from = payload_load_from,
};
