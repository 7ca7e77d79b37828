/* check.h -- the unit-test harness: CHECK() records a failure with its
 * location and keeps going, so one run reports every broken case;
 * check_done() prints "<test>: N passed, N failed" and returns the exit code;
 * check_skipped() is its counterpart for a suite that could not run. */
#ifndef DS4_CHECK_H
#define DS4_CHECK_H
#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(cond, ...) do {                                              \
    if (cond) { check_passed++; }                                          \
    else {                                                                 \
        check_failed++;                                                    \
        fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
        fprintf(stderr, __VA_ARGS__);                                      \
        fputc('\n', stderr);                                               \
    }                                                                      \
} while (0)

static inline int check_done(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

/* For a suite whose main part could not run here (a missing input): says why
 * and exits 77, which tests/run_tests.sh reports as skipped, never as passed;
 * checks that did run and failed still make it a failure. */
static inline int check_skipped(const char *name, const char *why) {
    printf("%s: %d passed, %d failed, SKIPPED: %s\n", name, check_passed, check_failed, why);
    return check_failed ? 1 : 77;
}
#endif
