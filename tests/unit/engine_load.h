/* engine_load.h -- test helper: load a model quietly on 2 threads with the
 * given numerics (-1 default, 0 f32, 1 ds4) and prefill chunk (0 default);
 * NULL (and the reason on stderr) when it cannot be loaded. */
#ifndef DS4_TEST_ENGINE_LOAD_H
#define DS4_TEST_ENGINE_LOAD_H
#include <stdio.h>
#include "engine/engine.h"

/* ... with a draft model's support file (NULL: none): --mtp, or --dspark */
static inline ds4_engine *test_engine_load_draft(const char *path, const char *mtp, const char *dspark, int numerics,
                                                 int chunk) {
    char err[512];
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = path;
    p.mtp_path = mtp;
    p.dspark_path = dspark;
    p.n_threads = 2;
    p.numerics = numerics;
    p.prefill_chunk = chunk;
    p.quiet = true;
    ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
    if (!e) fprintf(stderr, "load %s: %s\n", path, err);
    return e;
}

static inline ds4_engine *test_engine_load_mtp(const char *path, const char *mtp, int numerics, int chunk) {
    return test_engine_load_draft(path, mtp, NULL, numerics, chunk);
}

static inline ds4_engine *test_engine_load(const char *path, int numerics, int chunk) {
    return test_engine_load_mtp(path, NULL, numerics, chunk);
}
#endif
