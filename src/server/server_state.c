#include "server_state.h"

#include <stdarg.h>
#include <time.h>

atomic_int ds4_srv_stop;

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void trace(server *s, const char *fmt, ...) {
    if (!s->trace) return;
    pthread_mutex_lock(&s->trace_mu);
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
    pthread_mutex_unlock(&s->trace_mu);
}

void trace_text(server *s, const char *label, const char *text, size_t n) {
    if (!s->trace) return;
    pthread_mutex_lock(&s->trace_mu);
    fprintf(s->trace, "---- %s (%zu bytes)\n", label, n);
    fwrite(text, 1, n, s->trace);
    fprintf(s->trace, "\n---- end %s\n", label);
    fflush(s->trace);
    pthread_mutex_unlock(&s->trace_mu);
}

void kv_log(void *ud, bool warning, const char *line) {
    trace(ud, "%s", line);
    if (warning) fprintf(stderr, "ds4-server: %s\n", line);
}
