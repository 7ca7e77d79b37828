/* bench_model.c -- frontier benchmark of prefill and generation speed. */
#include "bench_model.h"
#include "engine.h"
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

void ds4_bench_model_defaults(ds4_bench_model_params *p) {
    memset(p, 0, sizeof *p);
    p->numerics = -1;
    p->ctx_start = 2048;
    p->ctx_max = 65536;
    p->step_incr = 2048;
    p->gen_tokens = 128;
    ds4_gpu_opts_default(&p->gpu);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* n tokens: the prompt's tokens repeated, or a fixed LCG sequence. */
static int32_t *bench_tokens(const ds4_engine *e, const char *prompt_file, int n) {
    int32_t *toks = malloc((size_t)n * sizeof(int32_t));
    const ds4_tokenizer *tk = ds4_engine_tokenizer(e);
    ds4_token_ids ids = {0};
    if (tk && prompt_file) {
        FILE *f = fopen(prompt_file, "rb");
        if (!f) { fprintf(stderr, "ds4-bench: cannot open %s\n", prompt_file); free(toks); return NULL; }
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *text = malloc((size_t)len + 1);
        size_t got = fread(text, 1, (size_t)len, f);
        fclose(f);
        ds4_tokenizer_encode(tk, text, got, DS4_TOK_SPECIALS_NONE, &ids);
        free(text);
    }
    uint32_t x = 12345;
    const int V = ds4_engine_n_vocab(e);
    for (int i = 0; i < n; i++) {
        if (ids.n) toks[i] = ids.v[(size_t)i % ids.n];
        else { x = x * 1664525u + 1013904223u; toks[i] = (int32_t)((x >> 8) % (uint32_t)V); }
    }
    ds4_token_ids_free(&ids);
    return toks;
}

static int32_t greedy(const float *lg, int V, int32_t eos) {
    int32_t best = -1;
    for (int v = 0; v < V; v++)
        if (v != eos && (best < 0 || lg[v] > lg[best])) best = v;
    return best;
}

int ds4_bench_model(const ds4_bench_model_params *p, FILE *out) {
    char err[512];
    if (p->ctx_start < 1 || p->ctx_max < p->ctx_start || (p->step_incr < 1 && p->step_mul <= 1)) {
        fprintf(stderr, "ds4-bench: need 1 <= --ctx-start <= --ctx-max and a positive step\n");
        return -1;
    }
    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = p->model_path;
    ep.n_threads = p->threads;
    ep.prefill_chunk = p->prefill_chunk;
    ep.numerics = p->numerics;
    ep.gpu = p->gpu;
    ep.gpu_ctx = p->ctx_max;
    ds4_engine *e = ds4_engine_load(&ep, err, sizeof err);
    if (!e) { fprintf(stderr, "ds4-bench: %s\n", err); return -1; }
    const ds4_tokenizer *tk = ds4_engine_tokenizer(e);
    const int32_t eos = tk ? ds4_tokenizer_specials(tk)->eos : -1;
    int32_t *toks = bench_tokens(e, p->prompt_file, p->ctx_max);
    ds4_session *s = toks ? ds4_session_new(e, p->ctx_max + p->gen_tokens, err, sizeof err) : NULL;
    if (!s) {
        if (toks) fprintf(stderr, "ds4-bench: %s\n", err);
        free(toks);
        ds4_engine_free(e);
        return -1;
    }
    const int V = ds4_engine_n_vocab(e);
    int rc = 0;
    fprintf(out, "frontier,prefill_tps,gen_tps,kvcache_bytes\n");
    for (int done = 0, f = p->ctx_start; done < p->ctx_max;) {
        if (f > p->ctx_max) f = p->ctx_max;
        double t0 = now();
        if (ds4_session_prefill(s, toks + done, f - done, NULL, NULL, NULL, err, sizeof err)) { rc = -1; break; }
        double t_pre = now() - t0;
        ds4_snapshot *snap = ds4_session_snapshot(s);
        if (!snap) { snprintf(err, sizeof err, "out of memory for a snapshot"); rc = -1; break; }
        t0 = now();
        for (int g = 0; g < p->gen_tokens && rc == 0; g++)
            if (ds4_session_decode(s, greedy(ds4_session_logits(s), V, eos), err, sizeof err)) rc = -1;
        double t_gen = now() - t0;
        if (rc == 0 && ds4_session_restore(s, snap, err, sizeof err)) rc = -1;
        ds4_snapshot_free(snap);
        if (rc) break;
        fprintf(out, "%d,%.2f,%.2f,%llu\n", f, (f - done) / t_pre, p->gen_tokens ? p->gen_tokens / t_gen : 0.0,
                (unsigned long long)ds4_engine_kv_bytes(e, f));
        fflush(out);
        done = f;
        int next = p->step_mul > 1 ? (int)(f * p->step_mul) : f + p->step_incr;
        f = next > f ? next : f + 1;
    }
    if (rc) fprintf(stderr, "ds4-bench: %s\n", err);
    ds4_session_free(s);
    free(toks);
    ds4_engine_free(e);
    return rc;
}
