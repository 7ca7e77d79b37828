/* test_glm_forward.c -- the GLM reference forward pass (glm_forward.h)
 * against transformers: tests/fixtures/glmtiny/A converted by make test
 * ($BUILD/glmtiny/A-<type>.gguf) run over its 300 tokens (indexer top-16,
 * so every position from 16 on is pruned; dense + MoE layers, full and shared
 * indexer layers) must reproduce the golden float32 logits at every
 * position: f32 and f16 weights (the fixture is bf16-exact, so both hold the
 * same values) within 1e-5 of the logit scale (measured 2.9e-6; the oracle's
 * own float32-vs-float64 gap is 2.6e-6), every argmax equal. (q8_0, with the
 * bound the oracle itself moves by, and every state path: test_glm_engine.c.)
 * Bad token ids fail with one line. */
#include "check.h"
#include "format/gguf.h"
#include "models/glm/glm_forward.h"
#include "models/glm/glm_model.h"
#include "kernels/quant.h"
#include "base/threadpool.h"
#include "base/json_util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>


static void run(const char *type, ds4_pool *pool, const int32_t *toks, int n, const float *gold, double bound) {
    char path[512], err[512];
    const char *b = getenv("BUILD");
    snprintf(path, sizeof path, "%s/glmtiny/A-%s.gguf", b ? b : "build", type);
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "%s", err);
    if (!g) return;
    glm_model *m = ds4_glm_model_bind(g, err, sizeof err);
    CHECK(m != NULL, "%s", err);
    if (m) {
        const int V = (int)m->hp.n_vocab;
        float *lg = malloc((size_t)n * V * sizeof(float));
        CHECK(ds4_glm_forward_sequence(m, pool, toks, n, lg, err, sizeof err) == 0, "%s: %s", type, err);
        double scale = 0, worst = 0;
        int worst_t = -1, argmax_same = 0;
        bool finite = true;
        for (int t = 0; t < n; t++) {
            int am = 0, gm = 0;
            for (int v = 0; v < V; v++) {
                const float x = lg[(size_t)t * V + v], y = gold[(size_t)t * V + v];
                finite &= isfinite(x);
                scale = fmax(scale, fabs(y));
                if (fabs(x - y) > worst) { worst = fabs(x - y); worst_t = t; }
                if (x > lg[(size_t)t * V + am]) am = v;
                if (y > gold[(size_t)t * V + gm]) gm = v;
            }
            argmax_same += am == gm;
        }
        printf("glm forward %s: max |diff| %.3g at position %d (max |logit| %.3g), argmax equal at %d/%d\n", type,
               worst, worst_t, scale, argmax_same, n);
        CHECK(finite, "%s logits finite", type);
        CHECK(worst <= bound * scale, "%s: max |diff| %.3g > %.3g", type, worst, bound * scale);
        CHECK(argmax_same == n, "%s: argmax differs at %d positions", type, n - argmax_same);
        const int32_t bad[2] = {1, (int32_t)V};
        CHECK(ds4_glm_forward_sequence(m, pool, bad, 2, lg, err, sizeof err) == -1 && strstr(err, "outside the vocabulary"),
              "bad token: %s", err);
        free(lg);
        ds4_glm_model_free(m);
    }
    ds4_gguf_close(g);
}

int main(void) {
    ds4_quant_init();
    size_t len;
    char *tj = ds4_read_file("tests/fixtures/glmtiny/A/tokens", &len);
    float *gold = (float *)ds4_read_file("tests/fixtures/glmtiny/A/logits", &len);
    CHECK(tj && gold, "fixture files");
    if (!tj || !gold) return check_done("test_glm_forward");
    cJSON *j = cJSON_Parse(tj);
    const int n = cJSON_GetArraySize(j);
    int32_t *toks = malloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) toks[i] = cJSON_GetArrayItem(j, i)->valueint;
    CHECK(len == (size_t)n * 256 * sizeof(float), "logits size");
    ds4_pool *pool = ds4_pool_new(2);
    run("f32", pool, toks, n, gold, 1e-5);
    run("f16", pool, toks, n, gold, 1e-5);
    ds4_pool_free(pool);
    cJSON_Delete(j);
    free(toks);
    free(tj);
    free(gold);
    return check_done("test_glm_forward");
}
