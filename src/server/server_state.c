#include "server/server_state.h"
#include "base/log.h"

#include "server/batcher.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

atomic_int ds4_srv_stop;

double ds4_srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void ds4_srv_trace(server *s, const char *fmt, ...) {
    if (!s->trace) return;
    pthread_mutex_lock(s->trace_mu);
    time_t t = time(NULL);
    char ts[32];
    struct tm tm;
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    fprintf(s->trace, "[%s] ", ts);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(s->trace, fmt, ap);
    va_end(ap);
    fputc('\n', s->trace);
    fflush(s->trace);
    pthread_mutex_unlock(s->trace_mu);
}

void ds4_srv_trace_text(server *s, const char *label, const char *text, size_t n) {
    if (!s->trace) return;
    pthread_mutex_lock(s->trace_mu);
    fprintf(s->trace, "---- %s (%zu bytes)\n", label, n);
    fwrite(text, 1, n, s->trace);
    fprintf(s->trace, "\n---- end %s\n", label);
    fflush(s->trace);
    pthread_mutex_unlock(s->trace_mu);
}

void ds4_srv_kv_log(void *ud, bool warning, const char *line) {
    ds4_srv_trace(ud, "%s", line);
    if (warning) ds4_log(DS4_LOG_WARN, "ds4-server: %s\n", line);
}

void ds4_srv_session_changed(server *s) {
    const int n = ds4_session_n_tokens(s->sess);
    ds4_queue_publish_session(s, n, n ? ds4_session_payload_bytes(s->sess) : 0);
}

int ds4_srv_eval(server *s, const int32_t *toks, int n, bool prompt_start, char *err, size_t errlen) {
    int rc = s->batcher ? ds4_batcher_eval(s->batcher, s->sess, toks, n, prompt_start, err, errlen)
                        : ds4_session_prefill(s->sess, toks, n, NULL, NULL, NULL, err, errlen);
    ds4_srv_session_changed(s);
    return rc;
}

int ds4_srv_rewind(server *s, int n_tokens, char *err, size_t errlen) {
    if (s->batcher) ds4_batcher_lock(s->batcher);
    int rc = ds4_session_rewind(s->sess, n_tokens, err, errlen);
    if (s->batcher) ds4_batcher_unlock(s->batcher);
    ds4_srv_session_changed(s);
    return rc;
}

int ds4_srv_steer(server *s, const ds4_request *r, char *err, size_t errlen) {
    const char *file = s->o.runtime.steering.file;
    float ffn, attn, want_ffn, want_attn;
    ds4_engine_steering(s->eng, &want_ffn, &want_attn);
    if (r->steer_file) {
        const char *base = file ? strrchr(file, '/') : NULL;
        if (!file || (strcmp(r->steer_file, file) && strcmp(r->steer_file, base ? base + 1 : file))) {
            snprintf(err, errlen, "dir_steering.file '%.100s' is not this server's steering file (%s%.100s)",
                     r->steer_file, file ? "started with --dir-steering-file " : "started without one", file ? file : "");
            return 400;
        }
        want_ffn = r->steer_ffn;
        want_attn = r->steer_attn;
    }
    /* cache files do not record scales: only unsteered states go there, so a
     * server started with other (or no) steering never reads a steered one */
    s->steered = want_ffn != 0 || want_attn != 0;
    if (!ds4_engine_has_steering(s->eng)) return 0;
    ds4_session_steering(s->sess, &ffn, &attn);
    if (ffn == want_ffn && attn == want_attn) return 0;
    if (ds4_session_n_tokens(s->sess) > 0 && ds4_srv_rewind(s, 0, err, errlen)) return 500;
    s->visible_tokens = -1;
    s->n_live_ids = 0;
    if (s->batcher) ds4_batcher_lock(s->batcher);
    const int rc = ds4_session_set_steering(s->sess, want_ffn, want_attn, err, errlen);
    if (s->batcher) ds4_batcher_unlock(s->batcher);
    return rc ? 500 : 0;
}

int ds4_srv_prefill_rows(server *s, const int32_t *toks, int n, float *rows, char *err, size_t errlen) {
    if (s->batcher) ds4_batcher_lock(s->batcher);
    int rc = ds4_session_prefill(s->sess, toks, n, rows, NULL, NULL, err, errlen);
    if (s->batcher) ds4_batcher_unlock(s->batcher);
    ds4_srv_session_changed(s);
    return rc;
}

void ds4_srv_kvd_lock(server *s) { if (s->kvd) pthread_mutex_lock(s->kvd_mu); }
void ds4_srv_kvd_unlock(server *s) { if (s->kvd) pthread_mutex_unlock(s->kvd_mu); }

static size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t k = 0;
    while (k < na && k < nb && a[k] == b[k]) k++;
    return k;
}

void ds4_srv_remember_prompt(server *s) {
    const int live_n = ds4_session_n_tokens(s->sess);
    const size_t n = (size_t)(s->live_prompt_tokens < live_n ? s->live_prompt_tokens : live_n);
    const int32_t *live = ds4_session_tokens(s->sess);
    if (!n || (s->replaced[0].n == n && common_prefix(live, n, s->replaced[0].v, n) == n)) return;
    ds4_token_ids keep = s->replaced[DS4_SRV_REPLACED_PROMPTS - 1];
    memmove(s->replaced + 1, s->replaced, (DS4_SRV_REPLACED_PROMPTS - 1) * sizeof *s->replaced);
    keep.n = 0;
    if (keep.cap < n) {
        int32_t *v = realloc(keep.v, n * sizeof *v);
        if (v) { keep.v = v; keep.cap = n; }
    }
    if (keep.cap >= n) {
        memcpy(keep.v, live, n * sizeof *keep.v);
        keep.n = n;
    }
    s->replaced[0] = keep;
}

int ds4_srv_branch_point(const server *s, const int32_t *toks, size_t n) {
    size_t best = 0;
    for (int k = 0; k < DS4_SRV_REPLACED_PROMPTS; k++) {
        size_t c = common_prefix(toks, n, s->replaced[k].v, s->replaced[k].n);
        if (c > best) best = c;
    }
    return (int)best;
}
