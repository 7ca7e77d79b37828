/* test_expert_cache.c -- --ssd-streaming against the mapped path.
 *
 * - Logits with the routed experts streamed through a cache of the minimum
 *   slot count (one layer's selection: every layer evicts) are bit-identical
 *   to the fully mapped engine on the oracle models ($BUILD/ds4tiny) and the
 *   demo model: full prefill (all positions), chunked prefill (more experts
 *   per batch than slots), token-by-token decode, snapshot restore, and two
 *   sessions in one batched step; also with room for the next layer's
 *   guessed experts to be read early (the guess changes reads, never
 *   results).
 * - The routed byte ranges are never brought into memory through the
 *   mapping (mincore on a copy whose page cache was dropped first).
 * - A file truncated after load fails prefill/decode with one line; the
 *   process stays up, and once the file is whole again the next decode works.
 * - An injected read error during decode (next-layer guesses in flight)
 *   fails that step with one line; the retry's logits and those after it
 *   equal an undisturbed run. A budget below one layer's selection, an exact slot
 *   count larger than memory and resident weights larger than memory are
 *   refused with one line.
 * - The slots are resident as soon as the cache exists (anonymous RSS grows
 *   by the pool before any read), so no first touch lands in a decode step.
 * - Eviction bookkeeping: LRU matches a textbook LRU on random traces; aged
 *   LFU keeps a hot set that LRU loses to a scan. */
#include "check.h"
#include "engine/engine.h"
#include "models/dsv4/expert_cache.h"
#include "format/gguf.h"
#include "models/dsv4/model.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void model_shape(const char *path, int *used, int *experts) {
    char err[256];
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    ds4_model *m = g ? ds4_model_bind(g, err, sizeof err) : NULL;
    *used = m ? m->cfg.n_expert_used : 1;
    *experts = m ? m->cfg.n_expert : 1;
    ds4_model_free(m);
    ds4_gguf_close(g);
}

static int experts_used(const char *path) {
    int k, n;
    model_shape(path, &k, &n);
    return k;
}

/* 2 threads, quiet; streaming with exactly `slots` slots, preloading half
 * of them (or none when cold) */
static ds4_engine *load(const char *path, bool stream, int slots, int chunk, bool cold) {
    ds4_engine_params p = {.model_path = path, .n_threads = 2, .prefill_chunk = chunk, .numerics = -1, .quiet = true,
                           .ssd = {.enabled = stream}};
    if (stream) {   /* sub-options without streaming are refused */
        p.ssd.cache_slots = slots;
        p.ssd.cold = cold;
    }
    char err[512];
    ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
    CHECK(e != NULL, "%s: %s", path, err);
    return e;
}

/* A deterministic token sequence inside the vocabulary. */
static int32_t *tokens(int n, int V) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    uint32_t x = 7;
    for (int i = 0; i < n; i++) { x = x * 1664525u + 1013904223u; t[i] = (int32_t)((x >> 8) % (uint32_t)V); }
    return t;
}

/* Runs the same script on an engine: all-position prefill of the first half,
 * decode of the rest, snapshot in the middle and a replay after restore.
 * Everything observed lands in out (the caller compares two runs). */
static size_t script(ds4_engine *e, const int32_t *toks, int n, float *out) {
    const int V = ds4_engine_n_vocab(e);
    char err[512];
    ds4_session *s = ds4_session_new(e, n + 8, err, sizeof err);
    if (!s) { CHECK(0, "%s", err); return 0; }
    size_t at = 0;
    const int half = n / 2;
    CHECK(ds4_session_prefill(s, toks, half, out, NULL, NULL, err, sizeof err) == 0, "%s", err);
    at += (size_t)half * V;
    ds4_snapshot *snap = NULL;
    for (int i = half; i < n; i++) {
        if (i == half + (n - half) / 2) snap = ds4_session_snapshot(s);
        CHECK(ds4_session_decode(s, toks[i], err, sizeof err) == 0, "%s", err);
        memcpy(out + at, ds4_session_logits(s), (size_t)V * sizeof(float));
        at += (size_t)V;
    }
    CHECK(snap && ds4_session_restore(s, snap, err, sizeof err) == 0, "restore: %s", err);
    for (int i = half + (n - half) / 2; i < n; i++) {
        CHECK(ds4_session_decode(s, toks[i], err, sizeof err) == 0, "%s", err);
        memcpy(out + at, ds4_session_logits(s), (size_t)V * sizeof(float));
        at += (size_t)V;
    }
    ds4_snapshot_free(snap);
    ds4_session_free(s);
    /* two sessions in one batched pass: a prefill chunk next to a decode */
    ds4_session *pair[2] = {ds4_session_new(e, n + 8, err, sizeof err), ds4_session_new(e, n + 8, err, sizeof err)};
    for (int round = 0; pair[0] && pair[1] && round < 2; round++) {
        ds4_step steps[2] = {{pair[0], toks + 4 * round, 4}, {pair[1], toks + n - 1 - round, 1}};
        CHECK(ds4_sessions_step(e, steps, 2, err, sizeof err) == 0, "batched step: %s", err);
        for (int q = 0; q < 2; q++) {
            memcpy(out + at, ds4_session_logits(pair[q]), (size_t)V * sizeof(float));
            at += (size_t)V;
        }
    }
    ds4_session_free(pair[0]);
    ds4_session_free(pair[1]);
    return at;
}

static void identical_to_mapped(const char *path, int n) {
    if (access(path, R_OK)) { CHECK(0, "missing %s (make builds it)", path); return; }
    ds4_engine *ref = load(path, false, 0, 7, true);
    if (!ref) return;
    const int V = ds4_engine_n_vocab(ref);
    int32_t *toks = tokens(n, V);
    const size_t cap = (size_t)2 * n * V;
    float *a = malloc(cap * sizeof(float)), *b = malloc(cap * sizeof(float));
    size_t na = script(ref, toks, n, a);
    ds4_engine_free(ref);
    /* slot counts: the minimum (k) and one more (chunk 7 puts more distinct
     * experts in a batch than there are slots), room for a decode layer's
     * next-layer guess beside its own experts, two whole layers (the
     * prefill reads the next layer ahead), and two layers half preloaded */
    int k, n_expert;
    model_shape(path, &k, &n_expert);
    const int slot_counts[] = {k, k + 1, 3 * k, 2 * n_expert, 2 * n_expert};
    enum { GUESS_RUN = 2, PREFETCH_RUN = 3, PRELOAD_RUN = 4, N_RUNS };
    for (int run = 0; run < N_RUNS; run++) {
        ds4_engine *st = load(path, true, slot_counts[run], 7, run < PRELOAD_RUN);
        if (!st) break;
        memset(b, 0xff, cap * sizeof(float));
        size_t nb = script(st, toks, n, b);
        CHECK(na == nb && memcmp(a, b, na * sizeof(float)) == 0, "%s: streamed logits differ (slots %d)", path, slot_counts[run]);
        ds4_ssd_stats stats;
        CHECK(ds4_engine_ssd_stats(st, &stats), "no stats");
        CHECK(stats.misses > 0 && stats.bytes_read > 0, "%s: no reads counted", path);
        CHECK(run < PREFETCH_RUN || stats.prefetched > 0, "%s: no layer read ahead", path);
        /* decode guesses every layer after the first, and with room some are read early */
        CHECK(stats.predicted > 0 && stats.predicted_right <= stats.predicted, "%s: %llu guesses, %llu right", path,
              (unsigned long long)stats.predicted, (unsigned long long)stats.predicted_right);
        CHECK(run != GUESS_RUN || stats.predicted_read > 0, "%s: no guessed expert read early", path);
        CHECK(stats.preloaded == (run == PRELOAD_RUN ? (uint64_t)n_expert : 0), "%s: %llu preloaded", path,
              (unsigned long long)stats.preloaded);
        CHECK(stats.tokens >= (uint64_t)n, "%s: %llu tokens counted for %d run", path, (unsigned long long)stats.tokens, n);
        ds4_engine_free(st);
    }
    free(a); free(b); free(toks);
}

/* Matrix reads started so far: every miss, guess, next-layer prefetch and
 * preload is one expert of three matrices. */
static uint64_t matrix_reads(ds4_engine *e) {
    ds4_ssd_stats st;
    if (!ds4_engine_ssd_stats(e, &st)) return 0;
    return 3 * (st.misses + st.predicted_read + st.prefetched + st.preloaded);
}

/* Prefills 8 tokens and decodes 4 (logits into out, NULL: not kept); with
 * fail_at, read number fail_at (1-based, through the EIO hook) falls in the
 * decode: that step fails with the read's line and is retried. Returns the
 * matrix reads of the prefill. */
static uint64_t decode_run(const char *path, int slots, uint64_t fail_at, float *out) {
    char env[32], err[512];
    snprintf(env, sizeof env, "%llu", (unsigned long long)fail_at);
    if (fail_at) setenv("DS4_TEST_EXPERT_READ_EIO", env, 1);
    ds4_engine *e = load(path, true, slots, 7, true);
    unsetenv("DS4_TEST_EXPERT_READ_EIO");
    if (!e) return 0;
    const int V = ds4_engine_n_vocab(e);
    int32_t *toks = tokens(12, V);
    ds4_session *s = ds4_session_new(e, 32, err, sizeof err);
    CHECK(s && ds4_session_prefill(s, toks, 8, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    const uint64_t prefill_reads = matrix_reads(e);
    int failures = 0;
    for (int i = 8; s && i < 12; i++) {
        int rc = ds4_session_decode(s, toks[i], err, sizeof err);
        if (rc && fail_at && !failures++) {
            CHECK(strstr(err, "expert read at offset") && strstr(err, "Input/output error"), "injected EIO: '%s'", err);
            rc = ds4_session_decode(s, toks[i], err, sizeof err);
        }
        CHECK(rc == 0, "decode %d: %s", i, err);
        if (out) memcpy(out + (size_t)(i - 8) * V, ds4_session_logits(s), (size_t)V * sizeof(float));
    }
    CHECK(failures == (fail_at ? 1 : 0), "%s: %d decode steps failed with read %llu failing", path, failures,
          (unsigned long long)fail_at);
    ds4_session_free(s);
    ds4_engine_free(e);
    free(toks);
    return prefill_reads;
}

/* A read error in decode, where next-layer guesses are read too (room for
 * them: 3 x k slots): the step fails with the read's line, the retry
 * reads the expert again, and every logit equals an undisturbed run. Two
 * positions: the first decode read (a layer-0 miss) and a later one. */
static void decode_read_error(const char *path) {
    int k, n_expert;
    model_shape(path, &k, &n_expert);
    ds4_engine *probe = load(path, false, 0, 7, true);
    if (!probe) return;
    const size_t V = (size_t)ds4_engine_n_vocab(probe);
    ds4_engine_free(probe);
    float *want = malloc(4 * V * sizeof(float)), *got = malloc(4 * V * sizeof(float));
    const uint64_t prefill_reads = decode_run(path, 3 * k, 0, want);
    CHECK(prefill_reads > 0, "%s: no reads in the prefill", path);
    const uint64_t offsets[] = {1, 3 * (uint64_t)k + 2};
    for (int i = 0; i < 2; i++) {
        memset(got, 0xff, 4 * V * sizeof(float));
        decode_run(path, 3 * k, prefill_reads + offsets[i], got);
        CHECK(memcmp(want, got, 4 * V * sizeof(float)) == 0, "%s: logits after a failed read differ (read %llu)", path,
              (unsigned long long)(prefill_reads + offsets[i]));
    }
    free(want); free(got);
}

/* A private copy of a model whose pages are not in the page cache. */
static bool cold_copy(const char *src, const char *dst) {
    int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    bool ok = in >= 0 && out >= 0;
    char buf[1 << 16];
    ssize_t r;
    while (ok && (r = read(in, buf, sizeof buf)) > 0) ok = write(out, buf, (size_t)r) == r;
    ok = ok && fsync(out) == 0 && posix_fadvise(out, 0, 0, POSIX_FADV_DONTNEED) == 0;
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    return ok;
}

/* Pages strictly inside routed tensors of `layout` (a model with the same
 * layout) that are in the page cache of `path`. The file is mapped but never
 * touched, so the check itself faults nothing in. */
static size_t routed_pages_resident(const char *layout, const char *path) {
    char err[256];
    ds4_gguf *g = ds4_gguf_open(layout, err, sizeof err);
    int fd = open(path, O_RDONLY);
    off_t size = fd >= 0 ? lseek(fd, 0, SEEK_END) : 0;
    uint8_t *map = size > 0 ? mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0) close(fd);
    if (!g || map == MAP_FAILED) { ds4_gguf_close(g); return (size_t)-1; }
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    size_t resident = 0;
    for (size_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        if (!strstr(t->name.ptr, "_exps.weight") || memcmp(t->name.ptr, "blk.", 4)) continue;
        uint64_t lo = (t->file_offset + page - 1) / page * page, hi = (t->file_offset + t->n_bytes) / page * page;
        if (hi <= lo || hi > (uint64_t)size) continue;
        size_t np = (size_t)((hi - lo) / page);
        unsigned char *vec = malloc(np);
        if (mincore(map + lo, (size_t)(hi - lo), vec) == 0)
            for (size_t p = 0; p < np; p++) resident += vec[p] & 1;
        free(vec);
    }
    munmap(map, (size_t)size);
    ds4_gguf_close(g);
    return resident;
}

/* Streams from a cold copy, checks residency, then truncates it mid-run. */
static void cold_file_and_truncation(const char *path, const char *tmp) {
    if (!cold_copy(path, tmp)) { CHECK(0, "cannot copy %s", path); return; }
    size_t res = routed_pages_resident(path, tmp);
    CHECK(res == 0, "the copy starts with %zu routed pages cached", res);
    ds4_engine *e = load(tmp, true, experts_used(path), 7, true);
    if (!e) { unlink(tmp); return; }
    const int V = ds4_engine_n_vocab(e);
    int32_t *toks = tokens(16, V);
    char err[512];
    ds4_session *s = ds4_session_new(e, 64, err, sizeof err);
    CHECK(ds4_session_prefill(s, toks, 12, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    /* the engine's own mapping is private to it; a fresh mapping of the same
     * file sees the page cache, which is what must stay free of routed bytes */
    res = routed_pages_resident(path, tmp);
    CHECK(res == 0, "%zu routed pages in the page cache after streaming", res);
    /* cut the file in the middle of its routed bytes */
    CHECK(truncate(tmp, 4096 * 3) == 0, "truncate");
    int rc = 0;
    for (int i = 12; i < 16 && rc == 0; i++) rc = ds4_session_decode(s, toks[i], err, sizeof err);
    CHECK(rc == -1 && strstr(err, "truncated"), "decode after truncation: rc %d, '%s'", rc, err);
    rc = ds4_session_decode(s, toks[0], err, sizeof err);
    CHECK(rc == -1 && strstr(err, "truncated"), "the retry reads again and fails again: rc %d", rc);
    /* the fault was transient after all: the next call reads the experts again */
    CHECK(cold_copy(path, tmp), "restore %s", tmp);
    rc = ds4_session_decode(s, toks[0], err, sizeof err);
    CHECK(rc == 0, "decode after the file is whole again: rc %d, '%s'", rc, err);
    ds4_session_free(s);
    ds4_engine_free(e);
    free(toks);
    unlink(tmp);
}

static uint64_t rss_anon_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb << 10;
}

/* The slots are committed when the cache is made, before any read: a first
 * touch must never land in a decode step (nor memory turn out missing then). */
static void slots_committed_at_start(const char *path) {
    char err[512];
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    ds4_model *m = g ? ds4_model_bind(g, err, sizeof err) : NULL;
    if (!m) { CHECK(0, "%s", err); ds4_gguf_close(g); return; }
    const int n_slots = 8;
    const uint64_t before = rss_anon_bytes();
    ds4_expert_cache *c = ds4_expert_cache_new(g, m, n_slots, DS4_EVICT_LFU_AGED, err, sizeof err);
    CHECK(c != NULL, "%s", err);
    const uint64_t grown = rss_anon_bytes() - before, pool = (uint64_t)n_slots * ds4_expert_slot_bytes(m);
    CHECK(before > 0 && grown >= pool, "anonymous RSS grew %llu bytes for %llu bytes of slots, nothing read yet",
          (unsigned long long)grown, (unsigned long long)pool);
    CHECK(c && ds4_expert_cache_stats(c).bytes_read == 0, "no expert read by creating the cache");
    ds4_expert_cache_free(c);
    ds4_model_free(m);
    ds4_gguf_close(g);
}

static void refusals(const char *path) {
    char err[512];
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = path;
    p.quiet = true;
    p.ssd.enabled = true;
    p.ssd.cache_bytes = 1 << 20;   /* one f32 expert of the oracle model is 768 KiB */
    ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
    CHECK(!e && strstr(err, "smaller than one layer"), "1 MiB budget: '%s'", e ? "loaded" : err);
    ds4_engine_free(e);

    /* the plan itself, with a fixed amount of memory */
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    ds4_model *m = g ? ds4_model_bind(g, err, sizeof err) : NULL;
    if (!m) { CHECK(0, "%s", err); ds4_gguf_close(g); return; }
    const uint64_t slot = ds4_expert_slot_bytes(m);
    ds4_expert_budget b = {.resident_bytes = 100 << 20, .reserve_bytes = 10 << 20, .mem_available = 1000ull << 20};
    char note[160];
    int n = ds4_expert_cache_plan(m, &b, note, sizeof note, err, sizeof err);
    const uint64_t all = (uint64_t)m->cfg.n_layer * m->cfg.n_expert;
    uint64_t want = ((uint64_t)(0.8 * (1000ull << 20)) - (110ull << 20)) / slot;
    CHECK(n == (int)(want < all ? want : all), "automatic slots %d", n);
    b.slots = 5;
    CHECK(ds4_expert_cache_plan(m, &b, note, sizeof note, err, sizeof err) == 5, "exact slot count");
    b.mem_available = (110ull << 20) + 3 * slot;
    CHECK(ds4_expert_cache_plan(m, &b, note, sizeof note, err, sizeof err) < 0 && strstr(err, "only"),
          "5 slots larger than memory: '%s'", err);
    b.slots = 0;
    b.budget_bytes = 1ull << 40;
    n = ds4_expert_cache_plan(m, &b, note, sizeof note, err, sizeof err);
    CHECK(n == 3 && strstr(note, "capped"), "a byte budget above memory is capped: %d '%s'", n, note);
    b.mem_available = 50 << 20;
    CHECK(ds4_expert_cache_plan(m, &b, note, sizeof note, err, sizeof err) < 0 && strstr(err, "do not fit"),
          "resident weights above memory: '%s'", err);
    ds4_model_free(m);
    ds4_gguf_close(g);
}

/* ---- policy ---- */

/* Textbook LRU over single-access records: a recency list. */
static uint64_t lru_oracle(const int32_t *keys, int n, int slots) {
    int32_t *list = malloc((size_t)slots * sizeof *list);
    int used = 0;
    uint64_t hits = 0;
    for (int i = 0; i < n; i++) {
        int at = -1;
        for (int j = 0; j < used; j++) if (list[j] == keys[i]) at = j;
        if (at >= 0) hits++;
        else at = used < slots ? used++ : 0;   /* list[0] is the least recent */
        for (int j = at; j + 1 < used; j++) list[j] = list[j + 1];
        list[used - 1] = keys[i];
    }
    free(list);
    return hits;
}

static void policies(void) {
    enum { N = 4000, LAYERS = 2, EXPERTS = 16 };
    int32_t *trace = malloc((size_t)N * 3 * sizeof *trace), *keys = malloc(N * sizeof *keys);
    uint32_t x = 99;
    for (int slots = 1; slots <= 12; slots += 5) {
        for (int i = 0; i < N; i++) {
            x = x * 1664525u + 1013904223u;
            int layer = (int)(x >> 30) % LAYERS, e = (int)((x >> 10) % EXPERTS);
            if ((x >> 20) % 3) e %= 4;   /* skewed: a quarter of the experts get most accesses */
            trace[3 * i] = layer; trace[3 * i + 1] = 1; trace[3 * i + 2] = e;
            keys[i] = layer * EXPERTS + e;
        }
        uint64_t acc = 0, hits = ds4_expert_policy_simulate(DS4_EVICT_LRU, LAYERS, EXPERTS, slots, trace, (size_t)N * 3, &acc);
        CHECK(acc == N && hits == lru_oracle(keys, N, slots), "LRU %d slots: %llu hits vs oracle %llu", slots,
              (unsigned long long)hits, (unsigned long long)lru_oracle(keys, N, slots));
    }
    /* a hot set of 4 touched every round, then a scan of 8 experts never seen
     * before: with 8 slots LRU loses the hot set to every scan; LFU loses it
     * once (round 0: all counts tie at 1, so recency decides) and keeps it
     * from round 1 on, through every halving (hot >= 2 > 1) */
    int n = 0;
    for (int round = 0; round < 50; round++) {
        for (int h = 0; h < 4; h++) { trace[n++] = 0; trace[n++] = 1; trace[n++] = h; }
        for (int c = 0; c < 8; c++) { trace[n++] = 0; trace[n++] = 1; trace[n++] = 4 + round * 8 + c; }
    }
    uint64_t lfu = ds4_expert_policy_simulate(DS4_EVICT_LFU_AGED, 1, 4 + 50 * 8, 8, trace, (size_t)n, NULL);
    uint64_t lru = ds4_expert_policy_simulate(DS4_EVICT_LRU, 1, 4 + 50 * 8, 8, trace, (size_t)n, NULL);
    CHECK(lfu == 48 * 4 && lru == 0, "hot set under a scan: LFU %llu hits, LRU %llu", (unsigned long long)lfu,
          (unsigned long long)lru);
    uint64_t acc = 1;
    CHECK(ds4_expert_policy_simulate(DS4_EVICT_LRU, 0, 16, 8, trace, (size_t)n, &acc) == 0 && acc == 0,
          "an empty geometry simulates nothing");
    free(trace); free(keys);
}

int main(void) {
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char path[512], tmp[600];
    policies();
    /* first: glibc serves a later pool of this size from memory freed by
     * the other checks, which is resident already */
    snprintf(path, sizeof path, "%s/ds4tiny/A-f32.gguf", build);
    slots_committed_at_start(path);
    const char *models[] = {"A-f32", "A-q8_0", "B-f32"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        snprintf(path, sizeof path, "%s/ds4tiny/%s.gguf", build, models[i]);
        identical_to_mapped(path, 24);
    }
    if (access("models/demo.gguf", R_OK) == 0) identical_to_mapped("models/demo.gguf", 24);
    else CHECK(0, "models/demo.gguf missing (make builds it)");
    snprintf(path, sizeof path, "%s/ds4tiny/A-f32.gguf", build);
    snprintf(tmp, sizeof tmp, "%s/ds4tiny/stream-copy-%d.gguf", build, (int)getpid());
    cold_file_and_truncation(path, tmp);
    decode_read_error(path);
    decode_read_error("models/demo.gguf");
    refusals(path);
    return check_done("test_expert_cache");
}
