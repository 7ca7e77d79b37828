/* fuzz_mtp.c -- MTP support-file binding and drafting on arbitrary GGUF
 * bytes, against the fixed micro model of the model corpus: binding must
 * reject anything inconsistent with it with one error line, and a block
 * that binds must draft after a few evaluated tokens without crashing
 * (every dimension it uses comes from the main model, checked against the
 * file's keys and tensor shapes). */
#include <stdint.h>
#include <stdlib.h>

#include "backends/backend.h"
#include "format/gguf.h"
#include "models/dsv4/forward_cpu.h"
#include "models/dsv4/kv.h"
#include "models/dsv4/model.h"
#include "models/dsv4/mtp.h"

static ds4_gguf *main_g;
static ds4_model *main_m;
static ds4_backend *main_be;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    if (!main_be) {
        main_g = ds4_gguf_open("fuzz/corpus/model/micro-f16.gguf", err, sizeof err);
        main_m = main_g ? ds4_model_bind(main_g, err, sizeof err) : NULL;
        main_be = main_m ? ds4_cpu_backend_new(main_m, 1, 8, false, err, sizeof err) : NULL;
        if (!main_be) abort();   /* run from the repository root */
    }
    ds4_gguf *g = ds4_gguf_open_buffer(data, size, err, sizeof err);
    if (!g) return 0;
    ds4_mtp *d = ds4_mtp_from_gguf(g, "fuzz", main_m, main_be, false, err, sizeof err);
    ds4_mtp_state *st = d ? ds4_mtp_state_new(d, 16) : NULL;
    ds4_kv *kv = st ? ds4_kv_new(&main_m->cfg, 16, 4) : NULL;
    float *logits = kv ? malloc((size_t)main_m->cfg.n_vocab * sizeof(float)) : NULL;
    if (logits) {
        int32_t toks[8], out[4];
        for (int i = 0; i < 8; i++) toks[i] = (int32_t)((size + (size_t)i * 7) % (size_t)main_m->cfg.n_vocab);
        ds4_backend_seq q = {.kv = kv, .toks = toks, .n = 6, .logits = logits};
        ds4_mtp_bind(st, &q);
        if (main_be->eval(main_be, &q, 1, err, sizeof err) == 0) {
            ds4_mtp_evaluated(st, kv->n_pos);
            ds4_mtp_draft(st, toks, 6, toks[6], 3, 0.0f, out, logits, err, sizeof err);
            ds4_mtp_rewound(st, 4);
            ds4_mtp_draft(st, toks, 4, toks[4], 2, 0.0f, out, NULL, err, sizeof err);
        }
    }
    free(logits);
    ds4_kv_free(kv);
    ds4_mtp_state_free(st);
    ds4_mtp_free(d);
    return 0;
}
