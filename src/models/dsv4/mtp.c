/* mtp.c -- the MTP drafter: the support file's block as a one-layer model on
 * a sibling CPU backend, and per session a ring of the main model's final
 * hidden streams plus the block's own window state. */
#include "models/dsv4/mtp.h"

#include "format/gguf.h"
#include "models/dsv4/forward_cpu.h"
#include "models/dsv4/kv.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Positions the drafter's window state can drop without recomputing: its
 * chained drafts (at most MAX_CHAIN past the committed tokens) are dropped
 * after every proposal. The hidden-state ring holds a window plus as many,
 * so a verification pass that keeps fewer rows than it evaluated still
 * leaves a full window behind. */
enum { MTP_SLACK = 32, MAX_CHAIN = MTP_SLACK / 2 };

struct ds4_mtp {
    ds4_gguf *g;
    ds4_model *m;
    ds4_backend *be;
    int slots, hcE;
    /* scratch of one drafting call (the engine is single-threaded) */
    float *in;          /* [window][hcE] hidden states entering the block */
    int32_t *toks;      /* [window] the token after each of them */
    float *out_hc;      /* [slots][hcE] the block's own output streams */
    float *logits;      /* [n_vocab] */
};

struct ds4_mtp_state {
    ds4_mtp *d;
    ds4_kv *kv;         /* the block's window rows, at the main model's positions */
    float *hc;          /* [slots][hcE] main final streams, slot = position mod slots */
    int hc_lo;          /* ring rows are valid for positions [hc_lo, the main n_pos) */
    int bound_pos;      /* the main n_pos when the pending evaluation was bound */
};

void ds4_mtp_free(ds4_mtp *d) {
    if (!d) return;
    if (d->be) d->be->free(d->be);
    ds4_model_free(d->m);
    ds4_gguf_close(d->g);
    free(d->in);
    free(d->toks);
    free(d->out_hc);
    free(d->logits);
    free(d);
}

ds4_mtp *ds4_mtp_load(const char *path, const ds4_model *main_model, ds4_backend *host, bool numerics, char *err,
                      size_t errlen) {
    char why[384];
    ds4_gguf *g = ds4_gguf_open(path, why, sizeof why);
    if (!g) {
        snprintf(err, errlen, "--mtp %s: %s", path, why);
        return NULL;
    }
    return ds4_mtp_from_gguf(g, path, main_model, host, numerics, err, errlen);
}

ds4_mtp *ds4_mtp_from_gguf(ds4_gguf *g, const char *what, const ds4_model *main_model, ds4_backend *host,
                           bool numerics, char *err, size_t errlen) {
    if (strcmp(host->name, "cpu")) {
        snprintf(err, errlen, "--mtp runs beside the CPU backend only (not %s)", host->name);
        ds4_gguf_close(g);
        return NULL;
    }
    ds4_mtp *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, errlen, "out of memory for the MTP drafter");
        ds4_gguf_close(g);
        return NULL;
    }
    d->g = g;
    char why[384];
    d->m = ds4_model_bind_mtp(d->g, main_model, why, sizeof why);
    if (!d->m) {
        snprintf(err, errlen, "--mtp %s: %s", what, why);
        ds4_mtp_free(d);
        return NULL;
    }
    const ds4_config *c = &d->m->cfg;
    d->slots = c->window + MTP_SLACK;
    d->hcE = c->n_hc * c->n_embd;
    d->be = ds4_cpu_backend_new_sibling(d->m, host, c->window, numerics, why, sizeof why);
    d->in = malloc((size_t)c->window * d->hcE * sizeof(float));
    d->toks = malloc((size_t)c->window * sizeof(int32_t));
    d->out_hc = malloc((size_t)d->slots * d->hcE * sizeof(float));
    d->logits = malloc((size_t)c->n_vocab * sizeof(float));
    if (!d->be) snprintf(err, errlen, "--mtp %s: %s", what, why);
    else if (!d->in || !d->toks || !d->out_hc || !d->logits) snprintf(err, errlen, "out of memory for the MTP drafter");
    else return d;
    ds4_mtp_free(d);
    return NULL;
}

const char *ds4_mtp_name(const ds4_mtp *d) { return d->m->name; }
uint64_t ds4_mtp_file_bytes(const ds4_mtp *d) { return d->m->file_bytes; }

uint64_t ds4_mtp_state_bytes(const ds4_mtp *d, int ctx) {
    return ds4_kv_bytes_for(&d->m->cfg, ctx, MTP_SLACK) + (uint64_t)d->slots * d->hcE * sizeof(float);
}

void ds4_mtp_state_free(ds4_mtp_state *st) {
    if (!st) return;
    ds4_kv_free(st->kv);
    free(st->hc);
    free(st);
}

ds4_mtp_state *ds4_mtp_state_new(ds4_mtp *d, int ctx) {
    ds4_mtp_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->d = d;
    st->kv = ds4_kv_new(&d->m->cfg, ctx, MTP_SLACK);
    st->hc = malloc((size_t)d->slots * d->hcE * sizeof(float));
    if (!st->kv || !st->hc) { ds4_mtp_state_free(st); return NULL; }
    return st;
}

void ds4_mtp_bind(ds4_mtp_state *st, ds4_backend_seq *q) {
    q->hc_ring = st->hc;
    q->hc_ring_slots = st->d->slots;
    st->bound_pos = q->kv->n_pos;
}

/* Rows [bound_pos, n_pos) were just written; the ring's older rows stay
 * valid unless these overwrote their slots. */
void ds4_mtp_evaluated(ds4_mtp_state *st, int n_pos) {
    const int first = st->bound_pos;
    if (st->hc_lo > first) st->hc_lo = first;
    if (st->hc_lo < n_pos - st->d->slots) st->hc_lo = n_pos - st->d->slots;
}

/* Window rows use token i+1: only rows of positions below n_pos - 1 keep a
 * committed token. */
void ds4_mtp_rewound(ds4_mtp_state *st, int n_pos) {
    if (st->hc_lo > n_pos) st->hc_lo = n_pos;
    const int keep = n_pos > 0 ? n_pos - 1 : 0;
    if (st->kv->n_pos > keep && !ds4_kv_truncate(st->kv, keep)) ds4_kv_reset(st->kv);
}

void ds4_mtp_forget(ds4_mtp_state *st, int n_pos) {
    ds4_kv_reset(st->kv);
    st->hc_lo = n_pos;
}

/* Greedy choice with the confidence rule: -1 when the best logit leads the
 * runner-up by less than margin. */
static int confident_argmax(const float *logits, int n, float margin) {
    int best = 0;
    float top = -INFINITY, second = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (logits[i] > top) { second = top; top = logits[i]; best = i; }
        else if (logits[i] > second) second = logits[i];
    }
    if (!isfinite(top)) return -1;
    return top - second >= margin ? best : -1;
}

/* One block evaluation of rows at positions kv->n_pos.. from d->in / d->toks;
 * the last row's logits in d->logits, every row's output streams in out_hc.
 * state_only (the rows before the last of a catch-up): only their window KV
 * rows, which the last row attends to and no draft reads beyond; their
 * attention output and routed experts would make a catch-up of w rows cost
 * about w draft rows after a back-off of w steps (backend.h). */
static int eval_rows(ds4_mtp_state *st, int rows, bool state_only, char *err, size_t errlen) {
    ds4_mtp *d = st->d;
    ds4_backend_seq q = {.kv = st->kv, .toks = d->toks, .n = rows, .state_only = state_only, .hidden_in = d->in};
    if (!state_only) {
        q.logits = d->logits;
        q.hc_ring = d->out_hc;
        q.hc_ring_slots = d->slots;
    }
    return d->be->eval(d->be, &q, 1, err, errlen);
}

int ds4_mtp_draft(ds4_mtp_state *st, const int32_t *toks, int n, int32_t last, int max, float margin, int32_t *out,
                  float *first_logits, char *err, size_t errlen) {
    ds4_mtp *d = st->d;
    const int W = d->m->cfg.window, V = d->m->cfg.n_vocab;
    if (max > MAX_CHAIN) max = MAX_CHAIN;
    if (max > st->kv->ctx - n) max = st->kv->ctx - n;
    if (n < 1 || max < 1 || st->hc_lo > n - 1) return 0;
    /* rows of committed tokens only; the row at n - 1 reads `last` */
    ds4_mtp_rewound(st, n);
    int start = st->kv->n_pos;
    if (start < n - W) start = n - W;
    if (start < st->hc_lo) start = st->hc_lo;
    if (start > st->kv->n_pos) ds4_kv_seek(st->kv, start);
    const int rows = n - start;
    for (int i = 0; i < rows; i++) {
        const int pos = start + i;
        memcpy(d->in + (size_t)i * d->hcE, st->hc + (size_t)(pos % d->slots) * d->hcE, (size_t)d->hcE * sizeof(float));
        d->toks[i] = pos + 1 < n ? toks[pos + 1] : last;
    }
    int k = 0;
    if (rows > 1 && eval_rows(st, rows - 1, true, err, errlen)) { ds4_kv_reset(st->kv); return -1; }
    memmove(d->in, d->in + (size_t)(rows - 1) * d->hcE, (size_t)d->hcE * sizeof(float));
    d->toks[0] = d->toks[rows - 1];
    if (eval_rows(st, 1, false, err, errlen)) { ds4_kv_reset(st->kv); return -1; }
    if (first_logits) memcpy(first_logits, d->logits, (size_t)V * sizeof(float));
    for (int id; k < max && (id = confident_argmax(d->logits, V, margin)) >= 0;) {
        out[k++] = id;
        if (k == max) break;
        /* the next row continues from the block's own streams at n - 2 + k */
        const int prev = n - 2 + k;
        memcpy(d->in, d->out_hc + (size_t)(prev % d->slots) * d->hcE, (size_t)d->hcE * sizeof(float));
        d->toks[0] = id;
        if (eval_rows(st, 1, false, err, errlen)) { ds4_kv_reset(st->kv); return -1; }
    }
    /* chained rows read drafts, not committed tokens */
    if (!ds4_kv_truncate(st->kv, n)) ds4_kv_reset(st->kv);
    return k;
}
