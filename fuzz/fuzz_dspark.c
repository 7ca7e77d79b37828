/* fuzz_dspark.c -- DSpark support-file binding and the block forward on
 * arbitrary GGUF bytes, against the fixed micro model of the model corpus:
 * binding must reject anything inconsistent with it with one error line,
 * and a drafter that binds must take a few context positions and draft
 * blocks without crashing (every dimension the forward uses comes from keys
 * checked against tensor shapes and the main model). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "models/dsv4/dspark.h"
#include "models/dsv4/model.h"

static ds4_gguf *main_g;
static ds4_model *main_m;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    if (!main_m) {
        main_g = ds4_gguf_open("fuzz/corpus/model/micro-f16.gguf", err, sizeof err);
        main_m = main_g ? ds4_model_bind(main_g, err, sizeof err) : NULL;
        if (!main_m) abort();   /* run from the repository root */
    }
    ds4_gguf *g = ds4_gguf_open_buffer(data, size, err, sizeof err);
    if (!g) return 0;
    ds4_dspark *d = ds4_dspark_from_gguf(g, "fuzz", main_m, NULL, err, sizeof err);
    ds4_dspark_state *st = d ? ds4_dspark_state_new(d, 8, 4) : NULL;
    if (st) {
        const size_t n = (size_t)ds4_dspark_n_targets(d) * (size_t)main_m->cfg.n_embd;
        float *feat = calloc(n, sizeof(float));
        int32_t toks[DS4_DSPARK_BLOCK_MAX];
        for (size_t i = 0; feat && i < n; i++) feat[i] = (float)data[i % size] / 64.0f - 2.0f;
        for (int p = 0; feat && p < 3; p++) {
            ds4_dspark_push(st, feat);
            ds4_dspark_block(st, (int32_t)(data[p % size] % (unsigned)main_m->cfg.n_vocab), 0, DS4_DSPARK_BLOCK_MAX,
                             toks, NULL, NULL);
        }
        ds4_dspark_rewound(st, 1);
        free(feat);
    }
    ds4_dspark_state_free(st);
    ds4_dspark_free(d);
    return 0;
}
