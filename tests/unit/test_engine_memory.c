/* test_engine_memory.c -- the engine's allocation policy (issue 9, 4.1-4.3):
 *
 * - allocation failure is injected with RLIMIT_AS (the address-space limit
 *   makes malloc/calloc return NULL, as a real out-of-memory does): a batch
 *   whose backend scratch cannot grow, and a session that cannot be created,
 *   fail with one clear error; afterwards (limit lifted) the same engine and
 *   session work and give bit-identical logits to an engine that never failed;
 * - a session's allocation is exactly what ds4_engine_kv_bytes() reports
 *   (rewind checkpoints included) and a long prefill that takes and thins
 *   checkpoints allocates nothing more.
 * Runs on the fuzz corpus' micro model (always present). */
#include "check.h"
#include "engine_load.h"
#include "engine/engine.h"

#include <malloc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1       /* ASan reserves terabytes of shadow and has its own allocator */
#else
#define UNDER_ASAN 0
#endif

static const char *MODEL = "fuzz/corpus/model/micro-f16.gguf";

static ds4_engine *load(int chunk) { return test_engine_load(MODEL, -1, chunk); }

static uint64_t vm_bytes(void) {
    unsigned long size = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%lu", &size) != 1) size = 0;
    fclose(f);
    return (uint64_t)size * (uint64_t)sysconf(_SC_PAGESIZE);
}

static void limit_as(rlim_t bytes) {
    struct rlimit r;
    getrlimit(RLIMIT_AS, &r);
    r.rlim_cur = bytes;            /* soft limit only, so it can be lifted again */
    CHECK(setrlimit(RLIMIT_AS, &r) == 0, "setrlimit");
}

static void tokens(int32_t *toks, int n, int V) {
    for (int i = 0; i < n; i++) toks[i] = (i * 7919 + 13) % V;
}

static void test_failed_grow(void) {
    enum { N = 4096 };
    char err[512];
    ds4_engine *ref = load(0), *e = load(0);
    CHECK(ref && e, "load");
    if (!ref || !e) { ds4_engine_free(ref); ds4_engine_free(e); return; }
    const int V = ds4_engine_n_vocab(e);
    static int32_t toks[N];
    tokens(toks, N, V);
    ds4_session *rs = ds4_session_new(ref, N, err, sizeof err);
    CHECK(rs && ds4_session_prefill(rs, toks, N, NULL, NULL, NULL, err, sizeof err) == 0, "reference: %s", err);
    ds4_session *s = ds4_session_new(e, N, err, sizeof err);
    CHECK(s && ds4_session_prefill(s, toks, 3, NULL, NULL, NULL, err, sizeof err) == 0, "warm: %s", err);
    if (!rs || !s) goto out;

    /* a 4096-row batch needs megabytes of scratch this engine has not grown yet */
    struct rlimit saved;
    getrlimit(RLIMIT_AS, &saved);
    limit_as(vm_bytes() + (1u << 20));
    int rc = ds4_session_prefill(s, toks + 3, N - 3, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == -1 && strstr(err, "out of memory"), "grow under the limit: rc %d (%s)", rc, err);
    CHECK(ds4_session_n_tokens(s) == 3, "a failed batch changed the session (%d tokens)", ds4_session_n_tokens(s));
    ds4_session *big = ds4_session_new(e, 1 << 24, err, sizeof err);
    CHECK(!big && strstr(err, "out of memory"), "session under the limit: %s", big ? "created" : err);
    ds4_session_free(big);
    setrlimit(RLIMIT_AS, &saved);

    /* the same engine and session carry on, bit-identical to the reference:
     * first a batch smaller than the scratch grown before the failure (which
     * a half-replaced scratch would crash on), then the big one */
    CHECK(ds4_session_decode(s, toks[3], err, sizeof err) == 0, "decode after: %s", err);
    CHECK(ds4_session_prefill(s, toks + 4, N - 4, NULL, NULL, NULL, err, sizeof err) == 0, "after: %s", err);
    CHECK(ds4_session_n_tokens(s) == N, "after: %d tokens", ds4_session_n_tokens(s));
    CHECK(memcmp(ds4_session_logits(s), ds4_session_logits(rs), (size_t)V * sizeof(float)) == 0,
          "logits after a failed grow differ from an engine that never failed");
out:
    ds4_session_free(s);
    ds4_session_free(rs);
    ds4_engine_free(e);
    ds4_engine_free(ref);
}

static size_t heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static void test_session_accounting(void) {
    enum { CTX = 700 };
    char err[512];
    /* chunk 16: 700 tokens take 43 checkpoints, thinned twice */
    ds4_engine *e = load(16);
    CHECK(e != NULL, "load");
    if (!e) return;
    const int V = ds4_engine_n_vocab(e);
    static int32_t toks[CTX];
    tokens(toks, CTX, V);
    ds4_session *warm = ds4_session_new(e, CTX, err, sizeof err);   /* grows the backend scratch */
    CHECK(warm && ds4_session_prefill(warm, toks, CTX, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);

    const size_t before = heap_in_use();
    ds4_session *s = ds4_session_new(e, CTX, err, sizeof err);
    const size_t created = heap_in_use();
    const uint64_t reported = ds4_engine_kv_bytes(e, CTX);
    /* beyond the reported buffers: the session, state and per-layer
     * descriptors and malloc's block headers, well under 1 KiB here */
    CHECK(created - before >= reported && created - before <= reported + 1024,
          "session allocates %zu bytes, ds4_engine_kv_bytes reports %llu", created - before,
          (unsigned long long)reported);
    CHECK(s && ds4_session_prefill(s, toks, CTX, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(heap_in_use() == created, "a prefill taking checkpoints allocated %zd bytes",
          (ssize_t)(heap_in_use() - created));
    /* a deep rewind (from a checkpoint) still works from preallocated slots */
    CHECK(ds4_session_rewind(s, 100, err, sizeof err) == 0, "%s", err);
    CHECK(ds4_session_prefill(s, toks + 100, CTX - 100, NULL, NULL, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(ds4_session_logits(s), ds4_session_logits(warm), (size_t)V * sizeof(float)) == 0,
          "deep rewind + re-prefill differs from the straight prefill");
    ds4_session_free(s);
    ds4_session_free(warm);
    ds4_engine_free(e);
}

int main(void) {
    /* Neither part can run under ASan (RLIMIT_AS against its terabytes of
     * shadow; its own allocator has no mallinfo2): a skip, never a pass. */
    if (UNDER_ASAN)
        return check_skipped("test_engine_memory", "allocation-failure injection and mallinfo2 accounting need the "
                                                   "plain allocator, not ASan's");
    test_failed_grow();
    test_session_accounting();
    return check_done("test_engine_memory");
}
