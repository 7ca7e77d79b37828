/* glm_backend.c -- the GLM CPU backend (see glm_backend.h). */
#include "models/glm/glm_backend.h"
#include "models/glm/glm_forward.h"
#include "models/glm/glm_kv.h"
#include "models/glm/glm_model.h"
#include "base/threadpool.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct {
    ds4_backend be;          /* first: the engine holds a ds4_backend * */
    struct ds4_pool *pool;
    glm_forward *f;
    glm_run *runs;           /* [max_batch]: one forward call's runs */
    int n_vocab;
} glm_cpu;

static int glm_eval(ds4_backend *be, const ds4_backend_seq *seqs, int n_seqs, char *err, size_t errlen) {
    glm_cpu *c = (glm_cpu *)be;
    int total = 0;
    for (int q = 0; q < n_seqs; q++) {
        const ds4_backend_seq *sq = &seqs[q];
        if (sq->hidden_in || sq->hidden_out) {
            snprintf(err, errlen, "the GLM backend runs whole models only (no hidden-state slices)");
            return -1;
        }
        for (int j = 0; j < q; j++)
            if (seqs[j].glm == sq->glm) { snprintf(err, errlen, "one state appears twice in a batch"); return -1; }
        total += sq->n;
        if (total > be->max_batch) {
            snprintf(err, errlen, "%d rows in one batch (at most %d)", total, be->max_batch);
            return -1;
        }
        if (ds4_glm_forward_prepare(c->f, sq->glm, sq->toks, sq->n, err, errlen)) return -1;
    }
    /* rows packed into calls of at most `piece`, a long run split at call
     * boundaries (only its last piece asks for the last token's logits) */
    const int piece = ds4_glm_forward_max_rows(c->f);
    for (int q = 0, done = 0; q < n_seqs;) {
        int rows = 0, n_runs = 0;
        while (q < n_seqs && rows < piece) {
            const ds4_backend_seq *sq = &seqs[q];
            const int n = sq->n - done < piece - rows ? sq->n - done : piece - rows;
            const bool last = done + n == sq->n;
            /* (logits NULL: rank 1 of a split, which computes its half of
             * the head and writes none) */
            float *out = !sq->logits ? NULL : sq->all_logits ? sq->logits + (size_t)done * c->n_vocab : sq->logits;
            c->runs[n_runs++] = (glm_run){sq->glm, sq->toks + done, n, out, sq->all_logits, sq->all_logits || last,
                                          sq->steer, sq->probe};
            rows += n;
            done += n;
            if (last) { q++; done = 0; }
        }
        if (ds4_glm_forward_eval(c->f, c->runs, n_runs, err, errlen)) return -1;
    }
    be->weight_bytes = ds4_glm_forward_weight_bytes(c->f);
    return 0;
}

static void glm_free(ds4_backend *be) {
    glm_cpu *c = (glm_cpu *)be;
    ds4_glm_forward_free(c->f);
    free(c->runs);
    ds4_pool_free(c->pool);
    free(c);
}

int ds4_glm_cpu_backend_threads(const ds4_backend *be) { return ds4_pool_threads(((const glm_cpu *)be)->pool); }

ds4_backend *ds4_glm_cpu_backend_new(const glm_model *m, int n_threads, int max_batch, char *err, size_t errlen) {
    glm_cpu *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, errlen, "out of memory for the GLM backend"); return NULL; }
    c->pool = ds4_pool_new(n_threads);
    if (!c->pool) { snprintf(err, errlen, "cannot start the thread pool"); free(c); return NULL; }
    c->f = ds4_glm_forward_new(m, c->pool, max_batch < GLM_BACKEND_ROWS ? max_batch : GLM_BACKEND_ROWS, err, errlen);
    if (!c->f) { glm_free(&c->be); return NULL; }
    c->runs = malloc((size_t)(max_batch > 0 ? max_batch : 1) * sizeof(glm_run));
    if (!c->runs) { snprintf(err, errlen, "out of memory for the GLM backend"); glm_free(&c->be); return NULL; }
    c->n_vocab = (int)m->hp.n_vocab;
    c->be = (ds4_backend){.name = "glm-cpu", .max_batch = max_batch, .eval = glm_eval, .free = glm_free};
    c->be.power.threads = ds4_pool_threads(c->pool);   /* --power counts this pool's CPU time */
    ds4_glm_forward_pace(c->f, &c->be.power);
    return &c->be;
}

bool ds4_glm_cpu_backend_split(ds4_backend *be, const ds4_cpu_split *sp) { return ds4_glm_forward_split(((glm_cpu *)be)->f, sp); }
