/* fuzz_model.c -- DS4 binding and the forward pass on arbitrary GGUF bytes:
 * binding must reject anything inconsistent with one error line, and a
 * model that binds must run a few tokens without crashing (every dimension
 * the forward pass uses comes from metadata checked against tensor shapes). */
#include <stdint.h>
#include <stdlib.h>

#include "backends/backend.h"
#include "models/dsv4/forward_cpu.h"
#include "format/gguf.h"
#include "models/dsv4/kv.h"
#include "models/dsv4/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    ds4_gguf *g = ds4_gguf_open_buffer(data, size, err, sizeof err);
    if (!g) return 0;
    ds4_model *m = ds4_model_bind(g, err, sizeof err);
    ds4_backend *be = m ? ds4_cpu_backend_new(m, 1, 8, false, err, sizeof err) : NULL;
    ds4_kv *kv = be ? ds4_kv_new(&m->cfg, 16, 4) : NULL;
    if (kv) {
        int32_t toks[8];
        float *logits = malloc((size_t)m->cfg.n_vocab * sizeof(float));
        for (int i = 0; i < 8; i++) toks[i] = (int32_t)((size + (size_t)i * 7) % (size_t)m->cfg.n_vocab);
        if (logits) {
            ds4_backend_seq prefill = {.kv = kv, .toks = toks, .n = 5, .logits = logits};
            ds4_backend_seq decode = {.kv = kv, .toks = toks + 5, .n = 1, .logits = logits};
            if (be->eval(be, &prefill, 1, err, sizeof err) == 0) be->eval(be, &decode, 1, err, sizeof err);
        }
        free(logits);
    }
    ds4_kv_free(kv);
    if (be) be->free(be);
    ds4_model_free(m);
    ds4_gguf_close(g);
    return 0;
}
