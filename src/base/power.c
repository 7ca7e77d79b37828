#include "base/power.h"

#include <errno.h>
#include <stdbool.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool pacing(const ds4_power *p) { return p->percent > 0 && p->percent < 100; }

void ds4_power_begin(ds4_power *p) {
    if (pacing(p)) p->mark = now();
}

void ds4_power_pause(ds4_power *p) {
    if (!pacing(p)) return;
    const double busy = now() - p->mark;
    double rest = busy > 0 ? busy * (100 - p->percent) / p->percent : 0;
    struct timespec ts = {(time_t)rest, (long)((rest - (double)(time_t)rest) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
    p->mark = now();
}
