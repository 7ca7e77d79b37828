#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void log_default(void *ud, ds4_log_level level, const char *text, size_t len) {
    (void)ud;
    (void)level;
    fwrite(text, 1, len, stderr);
}

/* fn and ud change together, so a message never reaches one hook with the
 * other's user data. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static ds4_log_hook log_fn = log_default;
static void *log_ud;

void ds4_log_set_hook(ds4_log_hook fn, void *ud) {
    pthread_mutex_lock(&log_mu);
    log_fn = fn ? fn : log_default;
    log_ud = fn ? ud : NULL;
    pthread_mutex_unlock(&log_mu);
}

void ds4_log(ds4_log_level level, const char *fmt, ...) {
    /* most messages are one line; a longer one takes the heap */
    char small[512];
    char *text = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof small) {
        text = malloc((size_t)n + 1);
        if (!text) {
            /* the message is lost past its first bytes rather than not at all */
            text = small;
            n = (int)sizeof small - 1;
        } else {
            va_start(ap, fmt);
            vsnprintf(text, (size_t)n + 1, fmt, ap);
            va_end(ap);
        }
    }
    pthread_mutex_lock(&log_mu);
    ds4_log_hook fn = log_fn;
    void *ud = log_ud;
    pthread_mutex_unlock(&log_mu);
    fn(ud, level, text, (size_t)n);
    if (text != small) free(text);
}

void ds4_log_append(char *buf, size_t cap, const char *fmt, ...) {
    const size_t len = strnlen(buf, cap);
    if (len + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}
