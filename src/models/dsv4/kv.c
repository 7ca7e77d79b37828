/* kv.c -- session state allocation, truncation and serialisation. */
#include "models/dsv4/kv.h"
#include "format/payload_stream.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_MAGIC 0x3456534bu /* "KSV4" */

typedef struct {
    size_t raw, comp, idx, f, fi;   /* float counts of each buffer */
} layer_sizes;

static layer_sizes sizes_of(const ds4_config *c, int l, int ctx, int slack, int *comp_cap, int *f_cap) {
    layer_sizes s = {0};
    const size_t D = (size_t)c->head_dim, DI = (size_t)c->idx_head_dim;
    s.raw = (size_t)(c->window + slack) * D;
    int r = ds4_cfg_ratio(c, l);
    *comp_cap = *f_cap = 0;
    if (r) {
        int coff = ds4_cfg_coff(c, l);
        *comp_cap = ctx / r + 1;
        *f_cap = coff * r + slack;
        s.comp = (size_t)*comp_cap * D;
        s.f = (size_t)*f_cap * coff * D;
        if (ds4_cfg_has_indexer(c, l)) {
            s.idx = (size_t)*comp_cap * DI;
            s.fi = (size_t)*f_cap * 2 * DI;
        }
    }
    return s;
}

static size_t ring_bytes_for_layers(const ds4_config *c, int first, int last);

static size_t layer_floats(layer_sizes s) { return s.raw + s.comp + s.idx + 2 * s.f + 2 * s.fi; }

uint64_t ds4_kv_bytes_for_layers(const ds4_config *c, int ctx, int slack, int first, int last) {
    uint64_t n = 0;
    int cc, fc;
    for (int l = first; l <= last; l++) n += layer_floats(sizes_of(c, l, ctx, slack, &cc, &fc));
    return n * sizeof(float);
}

uint64_t ds4_kv_bytes_for(const ds4_config *c, int ctx, int slack) {
    return ds4_kv_bytes_for_layers(c, ctx, slack, 0, c->n_layer - 1);
}

ds4_kv *ds4_kv_new(const ds4_config *c, int ctx, int slack) { return ds4_kv_new_layers(c, ctx, slack, 0, c->n_layer - 1); }

ds4_kv *ds4_kv_new_layers(const ds4_config *c, int ctx, int slack, int first, int last) {
    if (first < 0 || last >= c->n_layer || first > last) return NULL;
    ds4_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return NULL;
    kv->n_layer = c->n_layer;
    kv->first_layer = first;
    kv->last_layer = last;
    kv->ctx = ctx;
    kv->slack = slack;
    kv->raw_cap = c->window + slack;
    kv->head_dim = c->head_dim;
    kv->idx_head_dim = c->idx_head_dim;
    kv->L = calloc((size_t)c->n_layer, sizeof(ds4_kv_layer));
    kv->bytes = ds4_kv_bytes_for_layers(c, ctx, slack, first, last);
    kv->ring_bytes = ring_bytes_for_layers(c, first, last);
    /* calloc: pages of rows not yet produced stay unmapped until written */
    float *p = kv->L ? calloc(kv->bytes / sizeof(float), sizeof(float)) : NULL;
    if (!p) { free(kv->L); free(kv); return NULL; }
    kv->block = p;
    for (int l = 0; l < c->n_layer; l++) {
        ds4_kv_layer *L = &kv->L[l];
        L->ratio = ds4_cfg_ratio(c, l);
        L->coff = L->ratio ? ds4_cfg_coff(c, l) : 0;
        if (l < first || l > last) continue;   /* another process's layers: no buffers */
        layer_sizes s = sizes_of(c, l, ctx, slack, &L->comp_cap, &L->f_cap);
        L->raw = p; p += s.raw;
        if (s.comp) { L->comp = p; p += s.comp; }
        if (s.idx) { L->idx = p; p += s.idx; }
        if (s.f) { L->fk = p; p += s.f; L->fz = p; p += s.f; }
        if (s.fi) { L->ik = p; p += s.fi; L->iz = p; p += s.fi; }
    }
    return kv;
}

void ds4_kv_free(ds4_kv *kv) {
    if (!kv) return;
    free(kv->block);
    free(kv->L);
    free(kv);
}

void ds4_kv_reset(ds4_kv *kv) { kv->n_pos = kv->first_pos = 0; }

bool ds4_kv_seek(ds4_kv *kv, int pos) {
    for (int l = kv->first_layer; l <= kv->last_layer; l++)
        if (kv->L[l].ratio) return false;
    if (pos < 0 || pos > kv->ctx) return false;
    kv->n_pos = kv->first_pos = pos;
    return true;
}

bool ds4_kv_truncate(ds4_kv *kv, int n) {
    if (n < 0 || n > kv->n_pos || n < kv->n_pos - kv->slack) return false;
    /* rows of windows completed at or after n are simply no longer counted;
     * ring slots past n are overwritten by the next tokens */
    kv->n_pos = n;
    if (kv->first_pos > n) kv->first_pos = n;
    return true;
}

/* ---- ring checkpoints: n_pos, then per layer the ring slots of the last
 * window positions and the last coff*ratio frontier positions ---- */

/* Copies the slots of positions [q - span, q) of a ring of `cap` rows of
 * `width` floats to (save) or from (load) a packed buffer; returns floats used. */
static size_t ring_span(float *ring, int cap, int width, int64_t q, int span, float *buf, bool save) {
    if (!ring || !span) return 0;
    for (int i = 0; i < span; i++) {
        int64_t pos = q - span + i;
        if (pos < 0) continue;
        float *slot = ring + (size_t)(pos % cap) * width, *packed = buf + (size_t)i * width;
        memcpy(save ? packed : slot, save ? slot : packed, (size_t)width * sizeof(float));
    }
    return (size_t)span * width;
}

static size_t ring_walk(const ds4_kv *kv, int64_t q, float *buf, bool save) {
    size_t n = 0;
    const int window = kv->raw_cap - kv->slack;
    for (int l = 0; l < kv->n_layer; l++) {
        const ds4_kv_layer *L = &kv->L[l];
        const int span = L->coff * L->ratio, wc = L->coff * kv->head_dim, wi = 2 * kv->idx_head_dim;
        n += ring_span(L->raw, kv->raw_cap, kv->head_dim, q, window, buf + n, save);
        n += ring_span(L->fk, L->f_cap, wc, q, span, buf + n, save);
        n += ring_span(L->fz, L->f_cap, wc, q, span, buf + n, save);
        n += ring_span(L->ik, L->f_cap, wi, q, span, buf + n, save);
        n += ring_span(L->iz, L->f_cap, wi, q, span, buf + n, save);
    }
    return n;
}

static size_t ring_bytes_for_layers(const ds4_config *c, int first, int last) {
    size_t n = 0;
    for (int l = first; l <= last; l++) {
        const int ratio = ds4_cfg_ratio(c, l), coff = ratio ? ds4_cfg_coff(c, l) : 0;
        const size_t span = (size_t)coff * ratio;
        n += (size_t)c->window * c->head_dim + 2 * span * coff * c->head_dim;
        if (ds4_cfg_has_indexer(c, l)) n += 2 * span * 2 * c->idx_head_dim;
    }
    return sizeof(int64_t) + n * sizeof(float);
}

size_t ds4_kv_ring_bytes_for(const ds4_config *c) { return ring_bytes_for_layers(c, 0, c->n_layer - 1); }

size_t ds4_kv_ring_bytes(const ds4_kv *kv) { return kv->ring_bytes; }

void ds4_kv_ring_save(const ds4_kv *kv, void *dst) {
    int64_t q = kv->n_pos;
    memcpy(dst, &q, sizeof q);
    ring_walk(kv, q, (float *)((char *)dst + sizeof q), true);
}

void ds4_kv_ring_load(ds4_kv *kv, const void *src) {
    int64_t q;
    memcpy(&q, src, sizeof q);
    ring_walk(kv, q, (float *)((char *)src + sizeof q), false);
    kv->n_pos = (int)q;
}

int ds4_kv_ckpt_thin(int *pos, void **slots, int n) {
    /* slots[2i+1] and pos[2i+1] are still the originals when step i reads them */
    for (int i = 0; i < n / 2; i++) {
        void *freed = slots[i];
        slots[i] = slots[2 * i + 1];
        slots[2 * i + 1] = freed;
        pos[i] = pos[2 * i + 1];
    }
    return n / 2;
}

/* ---- serialisation: header, then per layer the fixed rings and the live rows ---- */

typedef struct { uint32_t magic, n_layer; int32_t ctx, slack, n_pos; } kv_header;

/* Walks every buffer of layers first..last of the live state in a fixed
 * order; fn copies one span. */
static size_t walk(const ds4_kv *kv, int first, int last, int n_pos, void (*fn)(void *, float *, size_t), void *ud) {
    size_t total = 0;
    for (int l = first; l <= last; l++) {
        const ds4_kv_layer *L = &kv->L[l];
        size_t wc = (size_t)L->coff * kv->head_dim, wi = 2 * (size_t)kv->idx_head_dim;
        size_t rows = L->ratio ? (size_t)(n_pos / L->ratio) : 0;
        struct { float *p; size_t n; } spans[] = {
            {L->raw, (size_t)kv->raw_cap * kv->head_dim},
            {L->comp, rows * kv->head_dim},
            {L->idx, rows * kv->idx_head_dim},
            {L->fk, (size_t)L->f_cap * wc}, {L->fz, (size_t)L->f_cap * wc},
            {L->ik, (size_t)L->f_cap * wi}, {L->iz, (size_t)L->f_cap * wi},
        };
        for (size_t i = 0; i < sizeof spans / sizeof spans[0]; i++) {
            if (!spans[i].p || !spans[i].n) continue;
            if (fn) fn(ud, spans[i].p, spans[i].n);
            total += spans[i].n * sizeof(float);
        }
    }
    return total;
}

size_t ds4_kv_live_bytes(const ds4_kv *kv) {
    return sizeof(kv_header) + walk(kv, 0, kv->n_layer - 1, kv->n_pos, NULL, NULL);
}

static void put(void *ud, float *p, size_t n) {
    char **dst = ud;
    memcpy(*dst, p, n * sizeof(float));
    *dst += n * sizeof(float);
}

static void get(void *ud, float *p, size_t n) {
    const char **src = ud;
    memcpy(p, *src, n * sizeof(float));
    *src += n * sizeof(float);
}

void ds4_kv_save(const ds4_kv *kv, void *dst) {
    kv_header h = {KV_MAGIC, (uint32_t)kv->n_layer, kv->ctx, kv->slack, kv->n_pos};
    memcpy(dst, &h, sizeof h);
    char *p = (char *)dst + sizeof h;
    walk(kv, 0, kv->n_layer - 1, kv->n_pos, put, &p);
}

bool ds4_kv_load(ds4_kv *kv, const void *src, size_t n) {
    kv_header h;
    if (n < sizeof h) return false;
    memcpy(&h, src, sizeof h);
    if (h.magic != KV_MAGIC || h.n_layer != (uint32_t)kv->n_layer || h.ctx != kv->ctx || h.slack != kv->slack ||
        h.n_pos < 0 || h.n_pos > kv->ctx)
        return false;
    if (n != sizeof h + walk(kv, 0, kv->n_layer - 1, h.n_pos, NULL, NULL)) return false;
    const char *p = (const char *)src + sizeof h;
    walk(kv, 0, kv->n_layer - 1, h.n_pos, get, &p);
    kv->n_pos = h.n_pos;
    return true;
}

size_t ds4_kv_layers_bytes(const ds4_kv *kv, int first, int last, int n_pos) {
    return walk(kv, first, last, n_pos, NULL, NULL);
}

void ds4_kv_layers_save(const ds4_kv *kv, int first, int last, void *dst) {
    char *p = dst;
    walk(kv, first, last, kv->n_pos, put, &p);
}

bool ds4_kv_layers_load(ds4_kv *kv, int first, int last, int n_pos, const void *src, size_t n, char *err,
                        size_t errlen) {
    if (first < kv->first_layer || last > kv->last_layer || first > last || n_pos < 0 || n_pos > kv->ctx ||
        n != walk(kv, first, last, n_pos, NULL, NULL)) {
        snprintf(err, errlen, "layer state of %zu bytes for %d tokens does not fit layers %d..%d", n, n_pos, first, last);
        return false;
    }
    const size_t bad = ds4_kv_first_bad(src, n / sizeof(float));
    if (bad < n / sizeof(float)) {
        snprintf(err, errlen, "layer state value %zu is %g, outside the range a session state holds (|x| <= %g)", bad,
                 (double)((const float *)src)[bad], (double)DS4_KV_MAX_ABS);
        return false;
    }
    const char *p = src;
    walk(kv, first, last, n_pos, get, &p);
    kv->n_pos = n_pos;
    return true;
}

bool ds4_kv_undo_save(ds4_kv_undo *u, const ds4_kv *kv, int n) {
    u->pos = kv->n_pos;
    u->rings = NULL;
    if (n <= kv->slack) return true;
    if (!(u->rings = malloc(ds4_kv_ring_bytes(kv)))) return false;
    ds4_kv_ring_save(kv, u->rings);
    return true;
}

void ds4_kv_undo_apply(const ds4_kv_undo *u, ds4_kv *kv) {
    if (u->rings) ds4_kv_ring_load(kv, u->rings);
    else ds4_kv_truncate(kv, u->pos);
}

void ds4_kv_undo_free(ds4_kv_undo *u) {
    free(u->rings);
    u->rings = NULL;
}
