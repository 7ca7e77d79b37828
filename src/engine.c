/* engine.c -- the public engine API over the model binding, the backend
 * (CPU or CUDA) and the session state. */
#include "engine.h"
#include "backend.h"
#include "cli_args.h"
#include "cuda/cuda_backend.h"
#include "expert_cache.h"
#include "forward_cpu.h"
#include "gguf.h"
#include "glm_backend.h"
#include "glm_kv.h"
#include "glm_model.h"
#include "glm_payload.h"
#include "kv.h"
#include "kv_payload.h"
#include "model.h"
#include "quant.h"
#include "tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Positions a session can drop without recomputing (kv.h): covers the usual
 * rewinds of a turn's tail. Deeper rewinds restore the nearest ring checkpoint
 * (one per prefill_chunk tokens, at most MAX_CKPT, thinned to every other one
 * when full) and recompute from there, or from the start without one. The
 * checkpoint slots are allocated with the session, so its memory is known
 * (and refused) up front rather than growing during a long prefill. */
enum { REWIND_SLACK = 256, MAX_CKPT = 16 };

struct ds4_engine {
    ds4_gguf *g;
    ds4_model *m;           /* DeepSeek V4; NULL for GLM */
    glm_model *glm;         /* GLM 5.2; NULL for DeepSeek V4 */
    int n_vocab;
    ds4_backend *be;
    ds4_tokenizer *tok;
    int prefill_chunk;
    ds4_backend_seq *seqs;  /* [max_batch]: one backend call's sequences */
    ds4_expert_cache *experts;      /* --ssd-streaming */
    FILE *trace;
    bool ssd_stats;
    int test_fail_decode_after;     /* DS4_TEST_FAIL_DECODE_AFTER, -1: unset */
};

struct ds4_session {
    ds4_engine *e;
    ds4_kv *kv;         /* DeepSeek V4 state */
    glm_kv *glm;        /* GLM state: every position kept, so no ring checkpoints */
    int ctx;
    int32_t *toks;      /* [ctx]; kv->n_pos of them are live */
    float *logits;      /* [n_vocab], valid when kv->n_pos > 0 */
    void *ckpt[MAX_CKPT];   /* ring checkpoint slots; the first n_ckpt hold ascending positions */
    int ckpt_pos[MAX_CKPT], n_ckpt, ckpt_every;
    void *ckpt_block;       /* the MAX_CKPT slots */
};

/* GLM snapshots hold the GLM payload in kv (its tokens and logits included). */
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
    ds4_gpu_opts_default(&p->gpu);
}

const char ds4_ssd_usage[] =
    "      --ssd-streaming           keep non-routed weights resident, stream routed experts from the file\n"
    "      --ssd-streaming-cache-experts B  expert cache: NGB/NMB bytes, or a plain number of slots (default: auto)\n"
    "      --ssd-streaming-preload-experts N  hot experts read at start (default: half the slots)\n"
    "      --ssd-streaming-cold      no preload (measurements)\n"
    "      --ssd-streaming-stats     print hit rate, bytes read per token, read throughput and stall time at exit\n";

/* "32GB", "1.5GiB", "512MB" (binary units) -> bytes; a plain integer -> slots. */
static bool parse_cache_size(const char *v, ds4_ssd_params *p) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || !isfinite(x) || x <= 0) return false;
    static const struct { const char *unit; double scale; } units[] = {
        {"KB", 1 << 10}, {"KiB", 1 << 10}, {"MB", 1 << 20}, {"MiB", 1 << 20},
        {"GB", 1 << 30}, {"GiB", 1 << 30}, {"TB", 1099511627776.0}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].unit) && x * units[i].scale < 1.8e19) {
            p->cache_bytes = (uint64_t)(x * units[i].scale);
            p->cache_slots = 0;
            return true;
        }
    int slots;
    if (!ds4_parse_int(v, 1, 1 << 30, &slots)) return false;
    p->cache_slots = slots;
    p->cache_bytes = 0;
    return true;
}

int ds4_ssd_parse_option(ds4_ssd_params *p, int argc, char **argv, int *i, char *err, size_t errlen) {
    const char *a = argv[*i];
    if (strncmp(a, "--ssd-streaming", 15)) return 0;
    if (!strcmp(a, "--ssd-streaming")) { p->enabled = true; return 1; }
    if (!strcmp(a, "--ssd-streaming-cold")) { p->cold = true; return 1; }
    if (!strcmp(a, "--ssd-streaming-stats")) { p->stats = true; return 1; }
    if (!strcmp(a, "--ssd-streaming-lru")) { p->lru = true; return 1; }
    if (!strcmp(a, "--ssd-streaming-no-predict")) { p->no_predict = true; return 1; }
    if (!strcmp(a, "--ssd-streaming-trace")) {
        if (*i + 1 >= argc) { snprintf(err, errlen, "%s needs a file", a); return -1; }
        p->trace_path = argv[++*i];
        return 1;
    }
    const bool cache = !strcmp(a, "--ssd-streaming-cache-experts"), preload = !strcmp(a, "--ssd-streaming-preload-experts");
    if (!cache && !preload) return 0;
    if (*i + 1 >= argc) { snprintf(err, errlen, "%s needs a value", a); return -1; }
    const char *v = argv[++*i];
    if (cache ? !parse_cache_size(v, p) : !ds4_parse_int(v, 0, 1 << 30, &p->preload_experts)) {
        snprintf(err, errlen, "%s: bad value '%s' (%s)", a, v, cache ? "NGB, NMB or a slot count" : "an expert count");
        return -1;
    }
    if (preload && p->preload_experts == 0) p->cold = true;
    return 1;
}

bool ds4_engine_ssd_stats(const ds4_engine *e, ds4_ssd_stats *out) {
    if (!e->experts) return false;
    ds4_expert_stats st = ds4_expert_cache_stats(e->experts);
    *out = (ds4_ssd_stats){st.hits, st.misses, st.bytes_read, st.tokens, st.preloaded, st.prefetched,
                           st.predicted, st.predicted_right, st.predicted_read,
                           st.read_seconds, st.stall_seconds};
    return true;
}

static uint64_t rss_bytes(void) {
    unsigned long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
    fclose(f);
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Batch scratch of the CPU backend at its largest batch (forward_cpu's
 * grow_batch, rounded up): the automatic expert budget leaves room for it. */
static uint64_t scratch_bytes(const ds4_config *c, int batch) {
    const uint64_t E = (uint64_t)c->n_embd, hcE = (uint64_t)c->n_hc * E, HD = (uint64_t)c->n_head * c->head_dim;
    const uint64_t per_token = 4 * hcE + 6 * E + 4 * (uint64_t)c->n_ff_exp + 3 * HD + (uint64_t)c->n_expert +
                               (uint64_t)c->o_groups * c->o_lora + (uint64_t)c->q_lora + (uint64_t)c->idx_topk;
    return (uint64_t)batch * per_token * sizeof(float) + ((uint64_t)64 << 20);
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
 * ones: decode streams them about twice as fast (docs/performance.md); the
 * probe keeps a system without large folios to one small
 * re-read per start. */
#define LARGE_PAGE_PROBE_BYTES ((uint64_t)64 << 20)

static void page_in_weights(const ds4_engine *e, const ds4_engine_params *p) {
    const uint64_t bytes = ds4_gguf_file_bytes(e->g), avail = ds4_memory_available();
    if (p->gpu.backend != DS4_BACKEND_CPU || p->ssd.enabled || p->dist.role != DS4_DIST_NONE || p->layers ||
        !avail || bytes > avail)
        return;
    char why[256];
    const double t0 = seconds_now();
    if (!ds4_gguf_populate(e->g, why, sizeof why)) {
        if (!p->quiet) fprintf(stderr, "ds4: weights stay lazily mapped: %s\n", why);
        return;
    }
    const double t1 = seconds_now();
    ds4_gguf_pages pages;
    const bool large = ds4_gguf_prefer_large_pages(e->g, LARGE_PAGE_PROBE_BYTES, &pages);
    if (p->quiet) return;
    fprintf(stderr, "ds4: weights paged in: %.2f GiB in %.2f s; in 2 MiB pages: %.0f%%", (double)bytes / (1 << 30),
            t1 - t0, 100.0 * pages.before);
    if (pages.reread) fprintf(stderr, " -> %.0f%% after re-reading the page cache (%.2f s)", 100.0 * pages.after,
                              seconds_now() - t1);
    if (!large) fprintf(stderr, " (kept: %s)", pages.note);
    fprintf(stderr, "\n");
}

/* --ssd-streaming: size the cache, make the rest resident, preload. */
static bool start_streaming(ds4_engine *e, const ds4_engine_params *p, char *err, size_t errlen) {
    const ds4_config *c = &e->m->cfg;
    const uint64_t routed = ds4_expert_routed_bytes(e->m);
    ds4_expert_budget b = {0};
    b.resident_bytes = e->m->file_bytes - routed;
    /* a batch never exceeds the context */
    const int batch = p->ssd.ctx > 0 && p->ssd.ctx < e->prefill_chunk ? p->ssd.ctx : e->prefill_chunk;
    b.reserve_bytes = scratch_bytes(c, batch) + (p->ssd.ctx > 0 ? ds4_kv_bytes_for(c, p->ssd.ctx, REWIND_SLACK) : 0);
    b.budget_bytes = p->ssd.cache_bytes;
    b.slots = p->ssd.cache_slots;
    char note[160];
    int slots = ds4_expert_cache_plan(e->m, &b, note, sizeof note, err, errlen);
    if (slots < 0) return false;
    if (!ds4_expert_cache_make_resident(e->g, e->m, err, errlen)) return false;
    e->experts = ds4_expert_cache_new(e->g, e->m, slots, p->ssd.lru ? DS4_EVICT_LRU : DS4_EVICT_LFU_AGED, err, errlen);
    if (!e->experts) return false;
    if (p->ssd.trace_path) {
        e->trace = fopen(p->ssd.trace_path, "wb");
        if (!e->trace) { snprintf(err, errlen, "cannot write %s", p->ssd.trace_path); return false; }
        ds4_expert_cache_record(e->experts, e->trace);
    }
    const size_t slot = ds4_expert_slot_bytes(e->m);
    int preloaded = 0;
    const int want = p->ssd.cold ? 0 : p->ssd.preload_experts > 0 ? p->ssd.preload_experts : slots / 2;
    if (want > 0) {
        uint32_t *hist = ds4_expert_static_histogram(e->m);
        if (!hist) { snprintf(err, errlen, "out of memory"); return false; }
        preloaded = ds4_expert_cache_preload(e->experts, hist, want);
        free(hist);
        if (ds4_expert_cache_take_error(e->experts, err, errlen)) return false;
    }
    ds4_cpu_backend_stream_experts(e->be, e->experts, !p->ssd.no_predict);
    e->ssd_stats = p->ssd.stats;
    if (!p->quiet) {
        const double GiB = 1 << 30;
        fprintf(stderr, "ds4: ssd-streaming: %.2f GiB resident, expert cache %d slots x %.1f MiB = %.2f GiB "
                        "(%.0f%% of %.2f GiB routed), working set %.1f MiB per token, %d preloaded, %s reads%s%s\n",
                (double)b.resident_bytes / GiB, slots, (double)slot / (1 << 20), (double)slots * slot / GiB,
                100.0 * slots / ((double)c->n_layer * c->n_expert), (double)routed / GiB,
                (double)c->n_layer * c->n_expert_used * routed / ((double)c->n_layer * c->n_expert) / (1 << 20),
                preloaded, ds4_expert_cache_direct(e->experts) ? "O_DIRECT" : "buffered", note[0] ? "; " : "", note);
    }
    return true;
}

static bool load_tokenizer(ds4_engine *e, char *err, size_t errlen) {
    if (!ds4_gguf_find_kv(e->g, "tokenizer.ggml.tokens")) return true;
    e->tok = ds4_tokenizer_from_gguf(e->g, err, errlen);
    return e->tok != NULL;
}

/* What both families read from the parameters the same way. */
static bool common_params(ds4_engine *e, const ds4_engine_params *p, char *err, size_t errlen) {
    e->prefill_chunk = p->prefill_chunk > 0 ? p->prefill_chunk : 4096;
    const ds4_ssd_params *ssd = &p->ssd;
    if (!ssd->enabled && (ssd->cold || ssd->stats || ssd->lru || ssd->no_predict || ssd->trace_path ||
                          ssd->cache_bytes || ssd->cache_slots || ssd->preload_experts)) {
        /* a silently ignored sub-option would make a measurement lie */
        snprintf(err, errlen, "the --ssd-streaming-* options need --ssd-streaming");
        return false;
    }
    /* No real input makes a healthy engine fail one decode step, so the
     * end-to-end tests of the decode-error answers need this switch. */
    const char *fail_after = getenv("DS4_TEST_FAIL_DECODE_AFTER");
    e->test_fail_decode_after = fail_after && *fail_after ? atoi(fail_after) : -1;
    return true;
}

/* GLM 5.2: the CPU backend over glm_forward, exact f32 math. The
 * DeepSeek-only features refuse the file by name rather than being ignored. */
static bool load_glm(ds4_engine *e, const ds4_engine_params *p, char *err, size_t errlen) {
    const char *refused = p->ssd.enabled ? "--ssd-streaming"
                          : p->numerics > 0 ? "--numerics ds4 (DeepSeek V4's FP8/FP4 storage simulation)"
                          : p->gpu.backend == DS4_BACKEND_CUDA ? "--cuda"
                          : p->layers ? "--layers"
                          : p->dist.role != DS4_DIST_NONE ? "--role" : NULL;
    if (refused) {
        snprintf(err, errlen, "%s: %s works with DeepSeek V4 models only, this is a GLM 5.2 (glm-dsa) model",
                 p->model_path, refused);
        return false;
    }
    e->glm = glm_model_bind(e->g, err, errlen);
    if (!e->glm) return false;
    e->n_vocab = (int)e->glm->hp.n_vocab;
    if (!load_tokenizer(e, err, errlen) || !common_params(e, p, err, errlen)) return false;
    e->be = glm_cpu_backend_new(e->glm, p->n_threads, e->prefill_chunk, err, errlen);
    if (!e->be) return false;
    page_in_weights(e, p);
    e->seqs = malloc((size_t)e->be->max_batch * sizeof(ds4_backend_seq));
    if (!e->seqs) { snprintf(err, errlen, "out of memory for the engine"); return false; }
    if (!p->quiet) {
        const glm_hparams *hp = &e->glm->hp;
        fprintf(stderr, "ds4: %s: GLM 5.2, %u layers, %u experts, %.2f GiB file, %.1f MiB resident, %d threads, "
                        "numerics f32\n",
                e->glm->name, glm_n_trunk(hp), hp->n_expert, (double)e->glm->file_bytes / (1 << 30),
                (double)rss_bytes() / (1 << 20), glm_cpu_backend_threads(e->be));
    }
    return true;
}

ds4_engine *ds4_engine_load(const ds4_engine_params *p, char *err, size_t errlen) {
    ds4_engine *e = calloc(1, sizeof *e);
    if (!e) { snprintf(err, errlen, "out of memory loading %s", p->model_path); return NULL; }
    e->g = ds4_gguf_open(p->model_path, err, errlen);
    if (!e->g) goto fail;
    if (glm_gguf_is_glm(e->g)) {
        if (!load_glm(e, p, err, errlen)) goto fail;
        return e;
    }
    ds4_layer_slice slice;
    if (p->layers && !ds4_layer_slice_parse(p->layers, &slice, err, errlen)) goto fail;
    e->m = ds4_model_bind_slice(e->g, p->layers ? &slice : NULL, err, errlen);
    if (!e->m) goto fail;
    e->n_vocab = e->m->cfg.n_vocab;
    /* The expert cache and the GPU upload plan walk every layer; a slice
     * process runs on the CPU with its layers mapped. */
    if (!ds4_model_is_whole(e->m) && (p->ssd.enabled || p->gpu.backend == DS4_BACKEND_CUDA)) {
        snprintf(err, errlen, "--layers with a part of the model works with the CPU backend only, "
                              "without --ssd-streaming");
        goto fail;
    }
    if (!load_tokenizer(e, err, errlen)) goto fail;
    bool numerics = p->numerics < 0 ? ds4_cpu_numerics_supported(&e->m->cfg) : p->numerics > 0;
    if (!common_params(e, p, err, errlen)) goto fail;
    if (p->gpu.backend == DS4_BACKEND_CUDA && p->ssd.enabled) {
        /* the expert cache feeds the CPU kernels; the CUDA backend uploads every weight */
        snprintf(err, errlen, "--ssd-streaming works with the CPU backend only, not with --cuda");
        goto fail;
    }
    if (p->gpu.backend == DS4_BACKEND_CUDA)
        e->be = ds4_cuda_backend_new(e->m, &p->gpu, p->gpu_ctx > 0 ? p->gpu_ctx : 32768, REWIND_SLACK,
                                     e->prefill_chunk, numerics, p->quiet, err, errlen);
    else
        e->be = ds4_cpu_backend_new(e->m, p->n_threads, e->prefill_chunk, numerics, err, errlen);
    const int cpu_threads = e->be && p->gpu.backend == DS4_BACKEND_CPU ? ds4_cpu_backend_threads(e->be) : 0;
    if (e->be && p->dist.role == DS4_DIST_COORDINATOR)
        e->be = ds4_dist_coordinator_new(e->be, e->m, &p->dist, numerics, err, errlen);
    if (!e->be) goto fail;
    e->seqs = malloc((size_t)e->be->max_batch * sizeof(ds4_backend_seq));
    if (!e->seqs) { snprintf(err, errlen, "out of memory for the engine"); goto fail; }
    if (p->ssd.enabled && !start_streaming(e, p, err, errlen)) goto fail;
    page_in_weights(e, p);
    if (!p->quiet) {
        const ds4_config *c = &e->m->cfg;
        char where[64] = "cuda";
        if (p->gpu.backend == DS4_BACKEND_CPU) snprintf(where, sizeof where, "%d threads", cpu_threads);
        const ds4_layer_slice *sl = &e->m->slice;
        char held[80] = "";
        if (!ds4_model_is_whole(e->m))
            snprintf(held, sizeof held, " (this process: layers %d..%d%s)", sl->first, sl->last,
                     sl->output ? " + output head" : "");
        fprintf(stderr, "ds4: %s: %d layers%s, %d experts (%d-bit), %.2f GiB file, %.1f MiB resident, "
                        "%s, numerics %s\n",
                e->m->name, c->n_layer, held, c->n_expert, ds4_model_expert_bits(e->m),
                (double)e->m->file_bytes / (1 << 30), (double)rss_bytes() / (1 << 20),
                where, numerics ? "ds4" : "f32");
    }
    return e;
fail:
    ds4_engine_free(e);
    return NULL;
}

static void print_ssd_stats(const ds4_engine *e) {
    ds4_ssd_stats st;
    if (!ds4_engine_ssd_stats(e, &st)) return;
    const uint64_t acc = st.hits + st.misses;
    fprintf(stderr, "ds4: ssd-streaming stats: %llu tokens, hit rate %.1f%% (%llu of %llu), %.2f MiB read per token, "
                    "read %.1f MiB/s, stall %.2f s, %llu preloaded, %llu prefetched, "
                    "next-layer guesses %.1f%% right (%llu of %llu, %llu read ahead)\n",
            (unsigned long long)st.tokens, acc ? 100.0 * st.hits / acc : 0.0, (unsigned long long)st.hits,
            (unsigned long long)acc, st.tokens ? (double)st.bytes_read / st.tokens / (1 << 20) : 0.0,
            st.read_seconds > 0 ? (double)st.bytes_read / st.read_seconds / (1 << 20) : 0.0, st.stall_seconds,
            (unsigned long long)st.preloaded, (unsigned long long)st.prefetched,
            st.predicted ? 100.0 * st.predicted_right / st.predicted : 0.0, (unsigned long long)st.predicted_right,
            (unsigned long long)st.predicted, (unsigned long long)st.predicted_read);
}

void ds4_engine_free(ds4_engine *e) {
    if (!e) return;
    if (e->ssd_stats) print_ssd_stats(e);
    if (e->be) e->be->free(e->be);
    free(e->seqs);
    ds4_expert_cache_free(e->experts);
    if (e->trace) fclose(e->trace);
    ds4_tokenizer_free(e->tok);
    ds4_model_free(e->m);
    glm_model_free(e->glm);
    ds4_gguf_close(e->g);
    free(e);
}

const struct ds4_tokenizer *ds4_engine_tokenizer(const ds4_engine *e) { return e->tok; }
const struct ds4_gguf *ds4_engine_gguf(const ds4_engine *e) { return e->g; }

bool ds4_engine_observe_matmuls(ds4_engine *e, void (*fn)(void *ud, const void *weight, int64_t expert, const float *x,
                                                          int64_t xstride, int64_t n, int T),
                                void *ud, char *err, size_t errlen) {
    if (e->glm || e->experts || strcmp(e->be->name, "cpu")) {
        snprintf(err, errlen, "matrix inputs can be collected on the CPU backend of a DeepSeek model only "
                              "(no --cuda, --ssd-streaming or pipeline parallelism)");
        return false;
    }
    ds4_cpu_backend_observe(e->be, fn, ud);
    return true;
}
ds4_model_family ds4_engine_family(const ds4_engine *e) { return e->glm ? DS4_FAMILY_GLM : DS4_FAMILY_DEEPSEEK4; }
int ds4_engine_n_vocab(const ds4_engine *e) { return e->n_vocab; }
int ds4_engine_n_layers(const ds4_engine *e) { return e->glm ? (int)glm_n_trunk(&e->glm->hp) : e->m->cfg.n_layer; }
int ds4_engine_train_ctx(const ds4_engine *e) {
    uint64_t c = e->glm ? e->glm->hp.n_ctx_train : e->m->cfg.train_ctx;
    return c > (1u << 30) ? 1 << 30 : (int)c;
}
/* GLM: whole bits per weight of the routed experts (of the head in an
 * all-dense file): the block formats' bits rounded down, as DS4 reports them. */
static int glm_expert_bits(const glm_model *m) {
    const ds4_tensor *t = &m->output;
    for (uint32_t l = 0; l < glm_n_trunk(&m->hp) && t == &m->output; l++)
        if (m->layers[l].gate_exps.data) t = &m->layers[l].gate_exps;
    return (int)(8 * ds4_type_row_bytes(t->type, 256) / 256);
}
int ds4_engine_expert_bits(const ds4_engine *e) { return e->glm ? glm_expert_bits(e->glm) : ds4_model_expert_bits(e->m); }
const char *ds4_engine_model_name(const ds4_engine *e) { return e->glm ? e->glm->name : e->m->name; }
uint64_t ds4_engine_model_bytes(const ds4_engine *e) { return e->glm ? e->glm->file_bytes : e->m->file_bytes; }
uint64_t ds4_engine_kv_bytes(const ds4_engine *e, int ctx) {
    const uint64_t glue = (uint64_t)ctx * sizeof(int32_t) + (uint64_t)e->n_vocab * sizeof(float);
    if (e->glm) return glm_kv_bytes_for(&e->glm->hp, ctx) + glue;
    const ds4_config *c = &e->m->cfg;
    return ds4_kv_bytes_for(c, ctx, REWIND_SLACK) + (uint64_t)MAX_CKPT * ds4_kv_ring_bytes_for(c) + glue;
}

/* ---- sessions ---- */

ds4_session *ds4_session_new(ds4_engine *e, int ctx, char *err, size_t errlen) {
    if (ctx <= 0) { snprintf(err, errlen, "context size must be positive (got %d)", ctx); return NULL; }
    ds4_session *s = calloc(1, sizeof *s);
    bool ok = s != NULL;
    if (ok) {
        s->e = e;
        s->ctx = ctx;
        s->toks = malloc((size_t)ctx * sizeof(int32_t));
        s->logits = malloc((size_t)e->n_vocab * sizeof(float));
        ok = s->toks && s->logits;
    }
    if (ok && e->glm) {
        s->glm = glm_kv_new(&e->glm->hp, ctx);
        ok = s->glm != NULL;
    } else if (ok) {
        s->kv = ds4_kv_new(&e->m->cfg, ctx, REWIND_SLACK);
        s->ckpt_every = e->prefill_chunk;
        const size_t ring = ds4_kv_ring_bytes_for(&e->m->cfg);
        /* calloc: a slot's pages are touched only when a checkpoint is taken */
        s->ckpt_block = calloc(MAX_CKPT, ring);
        for (int i = 0; s->ckpt_block && i < MAX_CKPT; i++) s->ckpt[i] = (char *)s->ckpt_block + (size_t)i * ring;
        ok = s->kv && s->ckpt_block;
    }
    if (!ok) {
        snprintf(err, errlen, "out of memory for a %d-token session (%.1f MiB of state)", ctx,
                 (double)ds4_engine_kv_bytes(e, ctx) / (1 << 20));
        ds4_session_free(s);
        return NULL;
    }
    return s;
}

static int n_pos(const ds4_session *s) { return s->glm ? s->glm->n_pos : s->kv->n_pos; }

/* The backend may hold the state elsewhere (CUDA): bring the host copy up to
 * date before reading its buffers, and push it back after writing them. */
static int kv_sync(const ds4_session *s, bool to_host, char *err, size_t errlen) {
    ds4_backend *be = s->e->be;
    return be->kv_sync ? be->kv_sync(be, s->kv, to_host, err, errlen) : 0;
}

/* The host ds4_kv made to hold the whole state (device copy, and the layers
 * a pipeline coordinator's workers hold), before the engine serialises it. */
static int kv_gather(const ds4_session *s, char *err, size_t errlen) {
    ds4_backend *be = s->e->be;
    if (kv_sync(s, true, err, errlen)) return -1;
    return be->kv_gather ? be->kv_gather(be, s->kv, err, errlen) : 0;
}

/* After the engine replaced the host state: the backend's copies follow. */
static int kv_scatter(const ds4_session *s, char *err, size_t errlen) {
    ds4_backend *be = s->e->be;
    if (kv_sync(s, false, err, errlen)) return -1;
    return be->kv_scatter ? be->kv_scatter(be, s->kv, s->toks, err, errlen) : 0;
}

/* Forgets checkpoints past position n (all of them for n < 0). */
static void drop_ckpts(ds4_session *s, int n) {
    while (s->n_ckpt && s->ckpt_pos[s->n_ckpt - 1] > n) s->n_ckpt--;
}

static void maybe_ckpt(ds4_session *s) {
    if (s->glm) return;
    const int pos = s->kv->n_pos, last = s->n_ckpt ? s->ckpt_pos[s->n_ckpt - 1] : 0;
    if (pos - last < s->ckpt_every) return;
    if (s->n_ckpt == MAX_CKPT) {
        s->n_ckpt = ds4_kv_ckpt_thin(s->ckpt_pos, s->ckpt, MAX_CKPT);
        s->ckpt_every *= 2;
    }
    char err[256];
    if (kv_sync(s, true, err, sizeof err)) return;   /* a missing checkpoint only makes a deep rewind slower */
    ds4_kv_ring_save(s->kv, s->ckpt[s->n_ckpt]);
    s->ckpt_pos[s->n_ckpt++] = pos;
}

void ds4_session_free(ds4_session *s) {
    if (!s) return;
    free(s->ckpt_block);
    if (s->kv && s->e->be->kv_release) s->e->be->kv_release(s->e->be, s->kv);
    ds4_kv_free(s->kv);
    glm_kv_free(s->glm);
    free(s->toks);
    free(s->logits);
    free(s);
}

int ds4_session_ctx(const ds4_session *s) { return s->ctx; }
int ds4_session_n_tokens(const ds4_session *s) { return n_pos(s); }
int ds4_session_test_fail_decode_after(const ds4_session *s) { return s->e->test_fail_decode_after; }
const int32_t *ds4_session_tokens(const ds4_session *s) { return s->toks; }
const float *ds4_session_logits(const ds4_session *s) { return n_pos(s) ? s->logits : NULL; }

/* One backend call appending each step's tokens to its session. all_logits
 * (NULL, or one pointer per step, each NULL or n x vocab) asks for every
 * position's logits; the last token's always land in the session. Nothing
 * changes on error. */
static int eval_steps(ds4_engine *e, const ds4_step *steps, float *const *all_logits, int n_steps, char *err,
                      size_t errlen) {
    ds4_backend *be = e->be;
    const int V = e->n_vocab;
    if (e->m && !ds4_model_is_whole(e->m) && strcmp(be->name, "dist")) {
        const ds4_layer_slice *sl = &e->m->slice;
        snprintf(err, errlen, "this process holds layers %d..%d%s only (--layers): it cannot compute logits "
                              "alone (run it with --role coordinator or --role worker)",
                 sl->first, sl->last, sl->output ? " and the output head" : "");
        return -1;
    }
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
                               .all_logits = all != NULL};
        if (s->glm) q->glm = s->glm;
        else q->kv = s->kv;
    }
    if (be->eval(be, e->seqs, n_steps, err, errlen)) return -1;
    for (int i = 0; i < n_steps; i++) {
        ds4_session *s = steps[i].session;
        const int n = steps[i].n, base = n_pos(s) - n;
        /* memmove: a rewind replays the session's own token list */
        memmove(s->toks + base, steps[i].toks, (size_t)n * sizeof(int32_t));
        if (all_logits && all_logits[i])
            memcpy(s->logits, all_logits[i] + (size_t)(n - 1) * V, (size_t)V * sizeof(float));
        maybe_ckpt(s);
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
    const int chunk = s->e->be->max_batch, V = s->e->n_vocab;
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

/* A GLM state keeps every position, so its truncation never fails (glm_kv.h). */
static bool truncate_state(ds4_session *s, int n) {
    return s->glm ? glm_kv_truncate(s->glm, n) : ds4_kv_truncate(s->kv, n);
}

static void reset_state(ds4_session *s) {
    if (s->glm) s->glm->n_pos = 0;
    else ds4_kv_reset(s->kv);
}

/* The logits after token n-1 are not kept, so a rewind always recomputes the
 * last kept token: from the truncated state when the rings still cover it
 * (always for GLM), else from the nearest checkpoint, else from the start of
 * the token list. */
int ds4_session_rewind(ds4_session *s, int n_tokens, char *err, size_t errlen) {
    const int have = n_pos(s);
    if (n_tokens < 0 || n_tokens > have) {
        snprintf(err, errlen, "cannot rewind to %d tokens: the session holds %d", n_tokens, have);
        return -1;
    }
    if (n_tokens == have) return 0;
    int keep = n_tokens - 1;
    drop_ckpts(s, keep);
    if (n_tokens == 0) { reset_state(s); return 0; }
    if (!truncate_state(s, keep)) {
        if (s->n_ckpt) {
            if (kv_sync(s, true, err, errlen)) return -1;
            ds4_kv_ring_load(s->kv, s->ckpt[s->n_ckpt - 1]);
            if (kv_sync(s, false, err, errlen)) return -1;
            keep = s->ckpt_pos[s->n_ckpt - 1];
        } else {
            keep = 0;
            ds4_kv_reset(s->kv);
        }
    }
    return run(s, s->toks + keep, n_tokens - keep, NULL, NULL, NULL, err, errlen);
}

/* ---- snapshots ---- */

ds4_snapshot *ds4_session_snapshot(const ds4_session *s) {
    const int V = s->e->n_vocab, n = n_pos(s);
    ds4_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap) return NULL;
    snap->ctx = s->ctx;
    snap->n_toks = n;
    snap->kv_bytes = s->glm ? glm_payload_bytes(s->glm, V) : ds4_kv_live_bytes(s->kv);
    snap->kv = malloc(snap->kv_bytes);
    snap->toks = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    snap->logits = malloc((size_t)V * sizeof(float));
    char err[256];
    if (!snap->kv || !snap->toks || !snap->logits || kv_gather(s, err, sizeof err)) {
        ds4_snapshot_free(snap);
        return NULL;
    }
    if (s->glm) glm_payload_write(s->glm, s->toks, s->logits, V, snap->kv);
    else ds4_kv_save(s->kv, snap->kv);
    memcpy(snap->toks, s->toks, (size_t)n * sizeof(int32_t));
    memcpy(snap->logits, s->logits, (size_t)V * sizeof(float));
    return snap;
}

int ds4_session_restore(ds4_session *s, const ds4_snapshot *snap, char *err, size_t errlen) {
    if (s->glm && snap->ctx == s->ctx)
        return glm_payload_load(s->glm, s->toks, s->logits, s->e->n_vocab, snap->kv, snap->kv_bytes, err, errlen) ? 0
                                                                                                                   : -1;
    if (snap->ctx != s->ctx || !s->kv || !ds4_kv_load(s->kv, snap->kv, snap->kv_bytes)) {
        snprintf(err, errlen, "snapshot does not fit this session (ctx %d vs %d)", snap->ctx, s->ctx);
        return -1;
    }
    drop_ckpts(s, -1);
    memcpy(s->toks, snap->toks, (size_t)snap->n_toks * sizeof(int32_t));
    memcpy(s->logits, snap->logits, (size_t)s->e->n_vocab * sizeof(float));
    return kv_scatter(s, err, errlen);
}

void ds4_snapshot_free(ds4_snapshot *snap) {
    if (!snap) return;
    free(snap->kv);
    free(snap->toks);
    free(snap->logits);
    free(snap);
}

size_t ds4_session_payload_bytes(const ds4_session *s) {
    return s->glm ? glm_payload_bytes(s->glm, s->e->n_vocab) : ds4_payload_bytes(s->kv, s->e->n_vocab);
}

/* Before a payload is written from the host copy: when the device lost the
 * state, an empty session is saved rather than stale rows. */
static void payload_sync(const ds4_session *s) {
    char err[256];
    if (!kv_gather(s, err, sizeof err)) return;
    fprintf(stderr, "ds4: %s; the session is dropped\n", err);
    ds4_kv_reset(s->kv);
}

void ds4_session_save_payload(const ds4_session *s, void *dst) {
    payload_sync(s);
    if (s->glm) glm_payload_write(s->glm, s->toks, s->logits, s->e->n_vocab, dst);
    else ds4_payload_write(s->kv, s->toks, s->logits, s->e->n_vocab, s->e->prefill_chunk, dst);
}

int ds4_session_load_payload(ds4_session *s, const void *src, size_t n, char *err, size_t errlen) {
    const bool ok = s->glm ? glm_payload_load(s->glm, s->toks, s->logits, s->e->n_vocab, src, n, err, errlen)
                           : ds4_payload_load(s->kv, s->toks, s->logits, s->e->n_vocab, src, n, err, errlen);
    if (!ok) return -1;
    drop_ckpts(s, -1);
    return kv_scatter(s, err, errlen);
}

bool ds4_session_save_payload_to(const ds4_session *s, const ds4_sink *sink) {
    payload_sync(s);
    if (s->glm) return glm_payload_write_to(s->glm, s->toks, s->logits, s->e->n_vocab, sink);
    return ds4_payload_write_to(s->kv, s->toks, s->logits, s->e->n_vocab, s->e->prefill_chunk, sink);
}

int ds4_session_load_payload_from(ds4_session *s, const ds4_source *src, size_t n, char *err, size_t errlen) {
    const int before = n_pos(s);
    bool ok = s->glm ? glm_payload_load_from(s->glm, s->toks, s->logits, s->e->n_vocab, src, n, err, errlen)
                     : ds4_payload_load_from(s->kv, s->toks, s->logits, s->e->n_vocab, src, n, err, errlen);
    /* rewind checkpoints describe the old state once the rows changed */
    if (ok || n_pos(s) != before) drop_ckpts(s, -1);
    /* a part-way load changed the host rows too: the device copy follows */
    char sync_err[256];
    if (kv_scatter(s, ok ? err : sync_err, ok ? errlen : sizeof sync_err)) return -1;
    return ok ? 0 : -1;
}
