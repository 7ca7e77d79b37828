/* metrics.c -- process-wide counters and their Prometheus rendering. */
#include "server/metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Endpoints get their own label; anything else is "other". */
static const char *const ENDPOINTS[] = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                                        "/v1/messages/count_tokens", "/v1/models", "/health", "/metrics",
                                        "/tokenize", "/detokenize", "other"};
enum { N_ENDPOINTS = sizeof ENDPOINTS / sizeof ENDPOINTS[0], MAX_PAIRS = 128 };
/* Reuse kinds, matched by prefix of the planner's description. */
static const char *const REUSE[] = {"exact token prefix", "live text prefix", "visible transcript prefix",
                                    "live tool-call continuation", "disk cache", "common token prefix", "cold"};
enum { N_REUSE = sizeof REUSE / sizeof REUSE[0] };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
typedef struct { int endpoint, status; unsigned long long n; } request_count;
static request_count pairs[MAX_PAIRS];
static int n_pairs;
static unsigned long long prompt_tokens, cached_tokens, generated_tokens, prefill_tokens, decode_tokens;
static double prefill_seconds, decode_seconds;
static unsigned long long spec_passes, spec_drafted, spec_accepted, spec_model_runs;
static unsigned long long reuse[N_REUSE];

void ds4_metrics_request(const char *path, int status) {
    int e = 0;
    while (e < N_ENDPOINTS - 1 && strcmp(ENDPOINTS[e], path)) e++;
    pthread_mutex_lock(&mu);
    int i = 0;
    while (i < n_pairs && (pairs[i].endpoint != e || pairs[i].status != status)) i++;
    if (i == n_pairs && n_pairs < MAX_PAIRS) pairs[n_pairs++] = (request_count){e, status, 0};
    if (i < n_pairs) pairs[i].n++;
    pthread_mutex_unlock(&mu);
}

void ds4_metrics_tokens(int prompt, int cached, int generated) {
    pthread_mutex_lock(&mu);
    prompt_tokens += (unsigned long long)prompt;
    cached_tokens += (unsigned long long)cached;
    generated_tokens += (unsigned long long)generated;
    pthread_mutex_unlock(&mu);
}

void ds4_metrics_prefill(int tokens, double seconds) {
    pthread_mutex_lock(&mu);
    prefill_tokens += (unsigned long long)tokens;
    prefill_seconds += seconds;
    pthread_mutex_unlock(&mu);
}

void ds4_metrics_decode(int tokens, double seconds) {
    pthread_mutex_lock(&mu);
    decode_tokens += (unsigned long long)tokens;
    decode_seconds += seconds;
    pthread_mutex_unlock(&mu);
}

void ds4_metrics_spec(uint64_t passes, uint64_t drafted, uint64_t accepted, uint64_t model_runs) {
    pthread_mutex_lock(&mu);
    spec_passes += passes;
    spec_drafted += drafted;
    spec_accepted += accepted;
    spec_model_runs += model_runs;
    pthread_mutex_unlock(&mu);
}

void ds4_metrics_prefix(const char *how) {
    for (int k = 0; k < N_REUSE; k++)
        if (!strncmp(how, REUSE[k], strlen(REUSE[k]))) {
            pthread_mutex_lock(&mu);
            reuse[k]++;
            pthread_mutex_unlock(&mu);
            return;
        }
}

static void line(ds4_buf *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line(ds4_buf *out, const char *fmt, ...) {
    char b[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (n > 0) ds4_buf_put(out, b, (size_t)n < sizeof b ? (size_t)n : sizeof b - 1);
}

static void counter(ds4_buf *out, const char *name, const char *help, unsigned long long v) {
    line(out, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, v);
}

static void gauge(ds4_buf *out, const char *name, const char *help, double v) {
    line(out, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

/* a counter of seconds (Prometheus counters are floats) */
static void seconds(ds4_buf *out, const char *name, const char *help, double v) {
    line(out, "# HELP %s %s\n# TYPE %s counter\n%s %.17g\n", name, help, name, name, v);
}

static double per_second(unsigned long long tokens, double s) { return s > 0 ? (double)tokens / s : 0.0; }

void ds4_metrics_render(ds4_buf *out, const ds4_metrics_gauges *g) {
    pthread_mutex_lock(&mu);
    line(out, "# HELP ds4_requests_total HTTP requests by endpoint and status (client_closed: no response, the "
              "client had gone).\n"
              "# TYPE ds4_requests_total counter\n");
    for (int i = 0; i < n_pairs; i++) {
        char status[16];
        snprintf(status, sizeof status, "%d", pairs[i].status);
        line(out, "ds4_requests_total{endpoint=\"%s\",status=\"%s\"} %llu\n", ENDPOINTS[pairs[i].endpoint],
             pairs[i].status ? status : "client_closed", pairs[i].n);
    }
    counter(out, "ds4_prompt_tokens_total", "Prompt tokens of answered requests.", prompt_tokens);
    counter(out, "ds4_prompt_tokens_cached_total", "Prompt tokens reused from a session or the disk cache.",
            cached_tokens);
    counter(out, "ds4_generated_tokens_total", "Generated tokens.", generated_tokens);
    counter(out, "ds4_spec_passes_total", "Speculative verification passes (--spec-lookup, --mtp).", spec_passes);
    counter(out, "ds4_spec_draft_tokens_total", "Tokens drafted for verification.", spec_drafted);
    counter(out, "ds4_spec_accepted_tokens_total", "Drafted tokens the model's own choice confirmed.",
            spec_accepted);
    counter(out, "ds4_spec_draft_model_runs_total",
            "Decode steps on which the draft model (--mtp, --dspark) ran, within its time budget.", spec_model_runs);
    counter(out, "ds4_prefill_tokens_total", "Tokens prefilled.", prefill_tokens);
    seconds(out, "ds4_prefill_seconds_total", "Seconds spent prefilling (wall, per request).", prefill_seconds);
    gauge(out, "ds4_prefill_tokens_per_second", "Average prefill rate of a request since start.",
          per_second(prefill_tokens, prefill_seconds));
    counter(out, "ds4_decode_tokens_total", "Tokens decoded.", decode_tokens);
    seconds(out, "ds4_decode_seconds_total", "Seconds spent decoding (wall, per request).", decode_seconds);
    gauge(out, "ds4_decode_tokens_per_second", "Average decode rate of a request since start.",
          per_second(decode_tokens, decode_seconds));
    line(out, "# HELP ds4_prompt_reuse_total Prompts by how their prefix was reused.\n"
              "# TYPE ds4_prompt_reuse_total counter\n");
    for (int k = 0; k < N_REUSE; k++) line(out, "ds4_prompt_reuse_total{how=\"%s\"} %llu\n", REUSE[k], reuse[k]);
    pthread_mutex_unlock(&mu);
    gauge(out, "ds4_slots", "Resident sessions (--batched-session).", g->slots);
    gauge(out, "ds4_slots_busy", "Slots running a request.", g->slots_busy);
    gauge(out, "ds4_queue_depth", "Requests waiting for a slot.", g->queued);
    gauge(out, "ds4_kv_bytes", "Bytes of session state allocated for the slots.", (double)g->kv_bytes);
    gauge(out, "ds4_kv_tokens", "Tokens the slots' sessions hold.", (double)g->kv_tokens);
    gauge(out, "ds4_kv_bytes_used", "Bytes of session state those tokens fill (their saved size).",
          (double)g->kv_state_bytes);
    const ds4_kvdisk_stats *d = g->kv_disk;
    if (!d) return;
    counter(out, "ds4_kv_disk_saves_total", "Disk KV cache files written.", d->saves);
    line(out, "# HELP ds4_kv_disk_save_failures_total Disk KV cache saves that failed, by reason.\n"
              "# TYPE ds4_kv_disk_save_failures_total counter\n"
              "ds4_kv_disk_save_failures_total{reason=\"no_space\"} %llu\n"
              "ds4_kv_disk_save_failures_total{reason=\"other\"} %llu\n",
         (unsigned long long)d->fail_nospace, (unsigned long long)d->fail_other);
    counter(out, "ds4_kv_disk_no_space_total", "Disk KV cache writes that met a full disk (ENOSPC, EDQUOT).",
            d->nospace_hits);
    counter(out, "ds4_kv_disk_no_space_evictions_total", "Disk KV cache files evicted to make room on a full disk.",
            d->nospace_evictions);
    gauge(out, "ds4_kv_disk_out_of_space", "1 when the latest disk KV cache save failed for lack of space.",
          d->out_of_space ? 1 : 0);
}
