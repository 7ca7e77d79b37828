/* bench_model.c -- frontier benchmark of prefill and generation speed. */
#include "bench_model.h"
#include "engine/engine.h"
#include "text/chat.h"
#include "text/tokenizer.h"

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
    p->repeat = 3;
    p->prompt_tokens = 64;
    ds4_gpu_opts_default(&p->gpu);
    ds4_runtime_opts_default(&p->runtime);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The file's text as the model's chat template renders one user turn with a
 * generation prompt (--chat-prompt-file): the text stays text. */
static bool chat_tokens(const ds4_engine *e, const char *text, ds4_token_ids *ids) {
    ds4_chat_msg msg = {.role = DS4_ROLE_USER, .content = text};
    ds4_chat_opts co;
    ds4_chat_opts_default(&co);
    co.profile = ds4_chat_profile_for(ds4_engine_tokenizer(e));
    ds4_chat_spans client = {0};
    co.client_spans = &client;
    ds4_buf out = {0};
    char err[256];
    bool ok = ds4_chat_render(&msg, 1, &co, &out, err, sizeof err) && !client.oom &&
              !ds4_chat_encode(ds4_engine_tokenizer(e), out.data, 0, out.len, &client, ids);
    if (!ok) fprintf(stderr, "ds4-bench: cannot render the chat prompt%s%s\n", err[0] ? ": " : "", err);
    ds4_chat_spans_free(&client);
    ds4_buf_free(&out);
    return ok;
}

/* n tokens: the prompt's tokens repeated, or a fixed LCG sequence. */
static int32_t *bench_tokens(const ds4_engine *e, const char *prompt_file, bool chat, int n) {
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
        text[got] = 0;
        const bool ok = chat ? chat_tokens(e, text, &ids)
                             : (ds4_tokenizer_encode(tk, text, got, DS4_TOK_SPECIALS_NONE, &ids), true);
        free(text);
        if (!ok) { ds4_token_ids_free(&ids); free(toks); return NULL; }
        /* which text, and how much of it, a table was measured on */
        fprintf(stderr, "ds4-bench: prompt %s: %zu tokens%s\n", prompt_file, ids.n,
                ids.n && ids.n < (size_t)n ? ", repeated to fill the context" : "");
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

/* Untimed warm-up: the first touches of the mmapped weights (page faults) and
 * of the session's and the backend's buffers land here, not in the timed
 * rows. It prefills as many tokens as the largest prefill step of the timed
 * rows (their largest batch: the backend's scratch grows to the largest batch
 * it has seen, and a larger one is new memory, faulted in page by page; at
 * 512 rows that was 81k faults, 1-2% of the timed prefill), and at least 128,
 * which route to nearly every expert (1 - (1 - k/E)^128 of them: 95% for
 * Flash's 6 of 256), fewer when the session is smaller. The session is
 * restored to empty afterwards. */
#define WARMUP_TOKENS 128

static int warm_up(ds4_session *s, const int32_t *toks, int n, int V, int32_t eos, char *err, size_t errlen) {
    ds4_snapshot *empty = ds4_session_snapshot(s);
    if (!empty) { snprintf(err, errlen, "out of memory for a snapshot"); return -1; }
    int rc = ds4_session_prefill(s, toks, n, NULL, NULL, NULL, err, errlen);
    if (rc == 0) rc = ds4_session_decode(s, greedy(ds4_session_logits(s), V, eos), err, errlen);
    if (rc == 0) rc = ds4_session_restore(s, empty, err, errlen);
    ds4_snapshot_free(empty);
    return rc;
}

/* The frontier after f */
static int next_frontier(const ds4_bench_model_params *p, int f) {
    int next = p->step_mul > 1 ? (int)(f * p->step_mul) : f + p->step_incr;
    return next > f ? next : f + 1;
}

/* The most tokens one timed prefill appends, in batches of at most max_batch */
static int largest_prefill_batch(const ds4_bench_model_params *p, int max_batch) {
    int most = 0;
    for (int done = 0, f = p->ctx_start; done < p->ctx_max; done = f, f = next_frontier(p, f)) {
        if (f > p->ctx_max) f = p->ctx_max;
        if (f - done > most) most = f - done;
    }
    return most < max_batch ? most : max_batch;
}

/* The session's context: the timed rows' ctx_max + gen_tokens, and one slot
 * for the token the warm-up decodes after prefilling up to ctx_max */
static int session_ctx(const ds4_bench_model_params *p) {
    const int need = p->ctx_max + p->gen_tokens + 1;
    return p->ctx_alloc > need ? p->ctx_alloc : need;
}

static ds4_engine *load_engine(const ds4_bench_model_params *p) {
    char err[512];
    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = p->model_path;
    ep.n_threads = p->threads;
    ep.prefill_chunk = p->prefill_chunk;
    ep.numerics = p->numerics;
    ep.layers = p->layers;
    ep.dist = p->dist;
    ep.ssd = p->ssd;
    ep.ssd.ctx = session_ctx(p);
    ep.gpu = p->gpu;
    ep.gpu_ctx = p->ctx_max;
    ep.mtp_path = p->mtp_path;
    ep.dspark_path = p->dspark_path;
    ds4_runtime_apply(&p->runtime, &ep);
    ds4_engine *e = ds4_engine_load(&ep, err, sizeof err);
    if (!e) fprintf(stderr, "ds4-bench: %s\n", err);
    return e;
}

static int32_t eos_of(const ds4_engine *e) {
    const ds4_tokenizer *tk = ds4_engine_tokenizer(e);
    return tk ? ds4_tokenizer_specials(tk)->eos : -1;
}

int ds4_bench_model(const ds4_bench_model_params *p, FILE *out) {
    char err[512];
    if (p->ctx_start < 1 || p->ctx_max < p->ctx_start || (p->step_incr < 1 && p->step_mul <= 1)) {
        fprintf(stderr, "ds4-bench: need 1 <= --ctx-start <= --ctx-max and a positive step\n");
        return -1;
    }
    ds4_engine *e = load_engine(p);
    if (!e) return -1;
    const int32_t eos = eos_of(e);
    int32_t *toks = bench_tokens(e, p->prompt_file, p->chat_prompt, p->ctx_max + p->gen_tokens);
    ds4_session *s = toks ? ds4_session_new(e, session_ctx(p), err, sizeof err) : NULL;
    if (!s) {
        if (toks) fprintf(stderr, "ds4-bench: %s\n", err);
        free(toks);
        ds4_engine_free(e);
        return -1;
    }
    const int V = ds4_engine_n_vocab(e);
    int warm = largest_prefill_batch(p, ds4_engine_max_batch(e));
    if (warm < WARMUP_TOKENS) warm = WARMUP_TOKENS;
    if (warm > p->ctx_max) warm = p->ctx_max;
    int rc = warm_up(s, toks, warm, V, eos, err, sizeof err);
    ds4_ssd_stats st0, st1;
    const bool ssd = ds4_engine_ssd_stats(e, &st0);
    if (rc == 0)
        fprintf(out, "frontier,prefill_tps,gen_tps,kvcache_bytes%s\n",
                ssd ? ",gen_hit_rate,gen_mib_per_token,read_mib_s,gen_stall_s" : "");
    for (int done = 0, f = p->ctx_start; rc == 0 && done < p->ctx_max;) {
        if (f > p->ctx_max) f = p->ctx_max;
        double t0 = now();
        if (ds4_session_prefill(s, toks + done, f - done, NULL, NULL, NULL, err, sizeof err)) { rc = -1; break; }
        double t_pre = now() - t0;
        ds4_snapshot *snap = ds4_session_snapshot(s);
        if (!snap) { snprintf(err, sizeof err, "out of memory for a snapshot"); rc = -1; break; }
        ds4_engine_ssd_stats(e, &st0);
        t0 = now();
        for (int g = 0; g < p->gen_tokens && rc == 0; g++)
            if (ds4_session_decode(s, greedy(ds4_session_logits(s), V, eos), err, sizeof err)) rc = -1;
        double t_gen = now() - t0;
        if (rc == 0 && ds4_session_restore(s, snap, err, sizeof err)) rc = -1;
        ds4_snapshot_free(snap);
        if (rc) break;
        fprintf(out, "%d,%.2f,%.2f,%llu", f, (f - done) / t_pre, p->gen_tokens ? p->gen_tokens / t_gen : 0.0,
                (unsigned long long)ds4_engine_kv_bytes(e, f));
        if (ssd && ds4_engine_ssd_stats(e, &st1)) {
            const double acc = (double)(st1.hits + st1.misses - st0.hits - st0.misses);
            const double mib = (double)(st1.bytes_read - st0.bytes_read) / (1 << 20);
            const double busy = st1.read_seconds - st0.read_seconds;
            fprintf(out, ",%.4f,%.3f,%.1f,%.3f", acc > 0 ? (double)(st1.hits - st0.hits) / acc : 0.0,
                    p->gen_tokens ? mib / p->gen_tokens : 0.0, busy > 0 ? mib / busy : 0.0,
                    st1.stall_seconds - st0.stall_seconds);
        }
        fputc('\n', out);
        fflush(out);
        done = f;
        f = next_frontier(p, f);
    }
    if (rc) fprintf(stderr, "ds4-bench: %s\n", err);
    ds4_session_free(s);
    free(toks);
    ds4_engine_free(e);
    return rc;
}

/* ---- several sessions decoding together (ds4_sessions_step) ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One timed run: every session (already holding its prompt) decodes
 * gen_tokens greedy tokens in lockstep, then rewinds to the prompt. Returns
 * seconds, or -1; *bytes gets the weight bytes read. */
static double decode_together(ds4_engine *e, ds4_session **ss, int n, int prompt, int gen, int32_t eos,
                              ds4_step *steps, int32_t *next, uint64_t *bytes) {
    char err[512];
    const int V = ds4_engine_n_vocab(e);
    const uint64_t b0 = ds4_engine_weight_bytes_read(e);
    const double t0 = now();
    for (int g = 0; g < gen; g++) {
        for (int i = 0; i < n; i++) {
            next[i] = greedy(ds4_session_logits(ss[i]), V, eos);
            steps[i] = (ds4_step){ss[i], &next[i], 1};
        }
        if (ds4_sessions_step(e, steps, n, err, sizeof err)) { fprintf(stderr, "ds4-bench: %s\n", err); return -1; }
    }
    const double secs = now() - t0;
    *bytes = ds4_engine_weight_bytes_read(e) - b0;
    for (int i = 0; i < n; i++)
        if (ds4_session_rewind(ss[i], prompt, err, sizeof err)) { fprintf(stderr, "ds4-bench: %s\n", err); return -1; }
    return secs;
}

int ds4_bench_sessions(const ds4_bench_model_params *p, FILE *out) {
    char err[512];
    int most = 0;
    for (int k = 0; k < p->n_session_counts; k++) if (p->session_counts[k] > most) most = p->session_counts[k];
    if (most < 1 || p->gen_tokens < 1 || p->repeat < 1 || p->repeat > 64 || p->prompt_tokens < 1) {
        fprintf(stderr, "ds4-bench: --sessions needs counts >= 1, --gen-tokens >= 1, --repeat 1..64\n");
        return -1;
    }
    ds4_engine *e = load_engine(p);
    if (!e) return -1;
    const int prompt = p->prompt_tokens, gen = p->gen_tokens;
    const int32_t eos = eos_of(e);
    /* session i's prompt starts i tokens into one fixed sequence, so the
     * sessions route to different experts */
    int32_t *toks = bench_tokens(e, p->prompt_file, p->chat_prompt, prompt + most);
    ds4_session **ss = calloc((size_t)most, sizeof *ss);
    ds4_step *steps = calloc((size_t)most, sizeof *steps);
    int32_t *next = calloc((size_t)most, sizeof *next);
    const int runs = p->n_session_counts * p->repeat;
    double *secs = calloc((size_t)runs, sizeof *secs);
    uint64_t *bytes = calloc((size_t)runs, sizeof *bytes);
    int rc = toks && ss && steps && next && secs && bytes ? 0 : -1;
    if (rc) fprintf(stderr, "ds4-bench: out of memory\n");
    for (int i = 0; i < most && rc == 0; i++) {
        ss[i] = ds4_session_new(e, prompt + gen, err, sizeof err);
        if (!ss[i]) { fprintf(stderr, "ds4-bench: %s\n", err); rc = -1; }
    }
    /* the prompts go in together too, as many per step as fit */
    const int max_rows = ds4_engine_max_batch(e);
    for (int i = 0; i < most && rc == 0;) {
        int n = 1;
        if (prompt > max_rows) {
            rc = ds4_session_prefill(ss[i], toks + i, prompt, NULL, NULL, NULL, err, sizeof err);
        } else {
            n = most - i < max_rows / prompt ? most - i : max_rows / prompt;
            for (int q = 0; q < n; q++) steps[q] = (ds4_step){ss[i + q], toks + i + q, prompt};
            rc = ds4_sessions_step(e, steps, n, err, sizeof err);
        }
        if (rc) fprintf(stderr, "ds4-bench: %s\n", err);
        i += n;
    }
    /* the counts interleave (1,2,4,...,1,2,4,...) so a noisy neighbour hits them alike */
    for (int r = 0; r < p->repeat && rc == 0; r++)
        for (int k = 0; k < p->n_session_counts && rc == 0; k++) {
            const int run = k * p->repeat + r;
            secs[run] = decode_together(e, ss, p->session_counts[k], prompt, gen, eos, steps, next, &bytes[run]);
            if (secs[run] < 0) rc = -1;
        }
    if (rc == 0) {
        fprintf(out, "decode, %d sessions at most, prompt %d tokens each, %d tokens generated per session, "
                     "%d runs per row (min / median / max)\n\n", most, prompt, gen, p->repeat);
        fprintf(out, "| sessions | per-session tok/s | aggregate tok/s | aggregate vs 1 session (median) | "
                     "GB of weights read per generated token |\n|---|---|---|---|---|\n");
        double base = 0;   /* median aggregate of the 1-session row */
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < p->n_session_counts; k++) {
                const int n = p->session_counts[k];
                double agg[64];
                for (int r = 0; r < p->repeat; r++) agg[r] = (double)n * gen / secs[k * p->repeat + r];
                qsort(agg, (size_t)p->repeat, sizeof agg[0], cmp_double);
                const double med = agg[p->repeat / 2];
                if (pass == 0) { if (n == 1) base = med; continue; }
                char ratio[32] = "n/a";
                if (base > 0) snprintf(ratio, sizeof ratio, "%.2fx", med / base);
                fprintf(out, "| %d | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %s | %.3f |\n", n, agg[0] / n,
                        med / n, agg[p->repeat - 1] / n, agg[0], med, agg[p->repeat - 1], ratio,
                        (double)bytes[k * p->repeat] / ((double)n * gen) / 1e9);
            }
    }
    for (int i = 0; ss && i < most; i++) ds4_session_free(ss[i]);
    free(ss);
    free(steps);
    free(next);
    free(secs);
    free(bytes);
    free(toks);
    ds4_engine_free(e);
    return rc;
}

/* The cost of speculative verification: one pass that appends k + 1 tokens
 * (the decoded token and k drafts, every position's logits kept) against one
 * decode step, at the prompt's depth; the pass is truncated away after each
 * timing, so every row starts from the same state. */
int ds4_bench_spec_verify(const ds4_bench_model_params *p, FILE *out) {
    enum { MAX_K = 8 };
    char err[512];
    if (p->repeat < 1 || p->repeat > 64 || p->prompt_tokens < 1) {
        fprintf(stderr, "ds4-bench: --spec-verify needs --prompt-tokens >= 1 and --repeat 1..64\n");
        return -1;
    }
    ds4_engine *e = load_engine(p);
    if (!e) return -1;
    const int prompt = p->prompt_tokens, V = ds4_engine_n_vocab(e);
    int32_t *toks = bench_tokens(e, p->prompt_file, p->chat_prompt, prompt + MAX_K + 1);
    float *rows = malloc((size_t)(MAX_K + 1) * V * sizeof(float)), *keep = malloc((size_t)V * sizeof(float));
    double secs[MAX_K + 1][64], draft_secs[MAX_K + 1][64] = {{0}};
    uint64_t bytes[MAX_K + 1] = {0};
    const bool mtp = ds4_engine_has_draft(e);
    int32_t drafted[MAX_K];
    ds4_session *s = ds4_session_new(e, prompt + MAX_K + 1, err, sizeof err);
    int rc = toks && rows && keep && s ? 0 : -1;
    if (rc) fprintf(stderr, "ds4-bench: %s\n", s ? "out of memory" : err);
    if (!rc && (rc = ds4_session_prefill(s, toks, prompt, NULL, NULL, NULL, err, sizeof err)))
        fprintf(stderr, "ds4-bench: %s\n", err);
    if (!rc) memcpy(keep, ds4_session_logits(s), (size_t)V * sizeof(float));
    /* an untimed pass first: first-touch faults stay out of the figures */
    for (int r = -1; r < p->repeat && rc == 0; r++)
        for (int k = 0; k <= MAX_K && rc == 0; k++) {
            if (mtp && k) {
                /* margin (DSpark: confidence) 0: the drafter proposes all k it can, as a pass of k
                 * drafts needs */
                const double d0 = now();
                if (ds4_session_draft(s, toks[prompt], k, 0.0f, drafted, err, sizeof err) < 0) {
                    fprintf(stderr, "ds4-bench: %s\n", err);
                    rc = -1;
                    break;
                }
                if (r >= 0) draft_secs[k][r] = now() - d0;
            }
            const uint64_t b0 = ds4_engine_weight_bytes_read(e);
            const double t0 = now();
            rc = ds4_session_prefill(s, toks + prompt, k + 1, k ? rows : NULL, NULL, NULL, err, sizeof err);
            if (r >= 0) secs[k][r] = now() - t0;
            if (r == 0) bytes[k] = ds4_engine_weight_bytes_read(e) - b0;
            if (!rc) rc = ds4_session_truncate(s, prompt, keep, err, sizeof err);
            if (rc) fprintf(stderr, "ds4-bench: %s\n", err);
        }
    if (rc == 0) {
        for (int k = 0; k <= MAX_K; k++) {
            qsort(secs[k], (size_t)p->repeat, sizeof(double), cmp_double);
            qsort(draft_secs[k], (size_t)p->repeat, sizeof(double), cmp_double);
        }
        const double one = secs[0][p->repeat / 2];
        fprintf(out, "verification pass at depth %d, %d runs per row (median; min / max in ms)\n\n", prompt,
                p->repeat);
        fprintf(out, "| tokens in the pass (k+1) | ms per pass | cost vs one decode step | weight bytes vs one step "
                     "| tok/s at 100%% acceptance vs target-only | at 0%% |%s\n|---|---|---|---|---|---|%s\n",
                mtp ? " drafting k, ms | vs one step | tok/s at 100% net of drafting |" : "",
                mtp ? "---|---|---|" : "");
        for (int k = 0; k <= MAX_K; k++) {
            const double med = secs[k][p->repeat / 2], draft = draft_secs[k][p->repeat / 2];
            fprintf(out, "| %d | %.2f (%.2f / %.2f) | %.2fx | %.2fx | %.2fx | %.2fx |", k + 1, med * 1e3,
                    secs[k][0] * 1e3, secs[k][p->repeat - 1] * 1e3, med / one,
                    bytes[0] ? (double)bytes[k] / (double)bytes[0] : 0.0, (k + 1) * one / med, one / med);
            if (mtp) fprintf(out, " %.2f | %.2fx | %.2fx |", draft * 1e3, draft / one, (k + 1) * one / (med + draft));
            fputc('\n', out);
        }
    }
    ds4_session_free(s);
    free(rows);
    free(keep);
    free(toks);
    ds4_engine_free(e);
    return rc;
}
