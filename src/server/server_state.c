#include "server/server_state.h"
#include "base/log.h"

#include "server/batcher.h"

#include <stdarg.h>
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

int ds4_srv_prefill_rows(server *s, const int32_t *toks, int n, float *rows, char *err, size_t errlen) {
    if (s->batcher) ds4_batcher_lock(s->batcher);
    int rc = ds4_session_prefill(s->sess, toks, n, rows, NULL, NULL, err, errlen);
    if (s->batcher) ds4_batcher_unlock(s->batcher);
    ds4_srv_session_changed(s);
    return rc;
}

void ds4_srv_kvd_lock(server *s) { if (s->kvd) pthread_mutex_lock(s->kvd_mu); }
void ds4_srv_kvd_unlock(server *s) { if (s->kvd) pthread_mutex_unlock(s->kvd_mu); }
