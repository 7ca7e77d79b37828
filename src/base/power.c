#include "base/power.h"

#include <errno.h>
#include <stdbool.h>
#include <time.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool pacing(const ds4_power *p) { return p->percent > 0 && p->percent < 100; }

static void mark(ds4_power *p) {
    p->mark = clock_s(CLOCK_MONOTONIC);
    if (p->threads > 0) p->cpu_mark = clock_s(CLOCK_PROCESS_CPUTIME_ID);
}

void ds4_power_begin(ds4_power *p) {
    if (pacing(p)) mark(p);
}

void ds4_power_pause(ds4_power *p) {
    if (!pacing(p)) return;
    double busy = clock_s(CLOCK_MONOTONIC) - p->mark;
    if (p->threads > 0) {
        const double cpu = (clock_s(CLOCK_PROCESS_CPUTIME_ID) - p->cpu_mark) / p->threads;
        if (cpu < busy) busy = cpu;
    }
    const double rest = busy > 0 ? busy * (100 - p->percent) / p->percent : 0;
    struct timespec ts = {(time_t)rest, (long)((rest - (double)(time_t)rest) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    mark(p);
}
