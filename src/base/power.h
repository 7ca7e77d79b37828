/* power.h -- `--power N`: pacing compute so that, averaged over a run, the
 * process computes about N% of the time and sleeps the rest (less heat,
 * power draw and fan noise on a desktop; docs/performance.md).
 *
 * Contract
 * - ds4_power_begin() marks the start of a unit of work; ds4_power_pause()
 *   ends it: it measures the unit's compute time c and sleeps
 *   c * (100 - N) / N, then marks the start of the next unit. Units are what
 *   the caller makes them (a layer of an evaluation, an evaluation), and
 *   time between an evaluation's last pause and the next begin (waiting for
 *   a request, sampling) is not counted as compute.
 * - c is the unit's wall time, or, with threads > 0 (a CPU backend running
 *   on that many threads), the process CPU time the unit took divided by
 *   threads, at most its wall time: on a machine shared with other work the
 *   time spent waiting for a core is then not taken for compute.
 * - percent outside 1..99 (100, or 0 for an unset value) never sleeps and
 *   reads no clock. Pausing only sleeps: nothing a caller computes depends
 *   on it.
 */
#ifndef DS4_POWER_H
#define DS4_POWER_H

typedef struct ds4_power {
    int percent;
    int threads;    /* > 0: compute is process CPU time / threads; 0: wall time (GPU, pipeline) */
    double mark;    /* CLOCK_MONOTONIC seconds at the start of the current unit */
    double cpu_mark;/* CLOCK_PROCESS_CPUTIME_ID seconds then (threads > 0) */
} ds4_power;

void ds4_power_begin(ds4_power *p);
void ds4_power_pause(ds4_power *p);

#endif
