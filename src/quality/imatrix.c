#include "quality/imatrix.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "kernels/quant.h"

typedef struct {
    const void *data;
    char name[72];
    int64_t ne0, n_mat;
    double *sum2;          /* [n_mat][ne0], allocated on the first row */
    double *count;         /* [n_mat] */
} matrix;

struct ds4_imatrix {
    matrix *m;
    size_t n;
    pthread_mutex_t lock;
};

static int by_data(const void *a, const void *b) {
    const char *x = ((const matrix *)a)->data, *y = ((const matrix *)b)->data;
    return x < y ? -1 : x > y;
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(const matrix *const *)a)->name, (*(const matrix *const *)b)->name);
}

ds4_imatrix *ds4_imatrix_new(const ds4_gguf *g) {
    ds4_imatrix *im = calloc(1, sizeof *im);
    if (!im) return NULL;
    size_t nt = ds4_gguf_n_tensors(g);
    im->m = calloc(nt ? nt : 1, sizeof *im->m);
    if (!im->m) { free(im); return NULL; }
    for (size_t i = 0; i < nt; i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        if (t->n_dims < 2 || t->n_dims > 3 || t->name.len >= sizeof im->m[0].name) continue;
        matrix *m = &im->m[im->n++];
        m->data = t->data;
        memcpy(m->name, t->name.ptr, t->name.len);
        m->ne0 = (int64_t)t->ne[0];
        m->n_mat = t->n_dims == 3 ? (int64_t)t->ne[2] : 1;
    }
    qsort(im->m, im->n, sizeof *im->m, by_data);
    pthread_mutex_init(&im->lock, NULL);
    return im;
}

void ds4_imatrix_free(ds4_imatrix *im) {
    if (!im) return;
    for (size_t i = 0; i < im->n; i++) { free(im->m[i].sum2); free(im->m[i].count); }
    free(im->m);
    pthread_mutex_destroy(&im->lock);
    free(im);
}

void ds4_imatrix_observe(void *ud, const void *weight, int64_t expert, const float *x, int64_t xstride, int64_t n, int T) {
    ds4_imatrix *im = ud;
    matrix key = {.data = weight};
    matrix *m = bsearch(&key, im->m, im->n, sizeof *im->m, by_data);
    if (!m || n != m->ne0 || expert < 0 || expert >= m->n_mat) return;
    pthread_mutex_lock(&im->lock);
    if (!m->sum2) {
        m->sum2 = calloc((size_t)(m->ne0 * m->n_mat), sizeof *m->sum2);
        m->count = calloc((size_t)m->n_mat, sizeof *m->count);
        if (!m->sum2 || !m->count) {
            /* out of memory: this matrix stays unrecorded */
            free(m->sum2); free(m->count);
            m->sum2 = m->count = NULL;
            pthread_mutex_unlock(&im->lock);
            return;
        }
    }
    double *s = m->sum2 + expert * m->ne0;
    for (int t = 0; t < T; t++) {
        const float *row = x + (size_t)t * (size_t)xstride;
        for (int64_t j = 0; j < n; j++) s[j] += (double)row[j] * row[j];
    }
    m->count[expert] += T;
    pthread_mutex_unlock(&im->lock);
}

int ds4_imatrix_n_seen(const ds4_imatrix *im) {
    int n = 0;
    for (size_t i = 0; i < im->n; i++) n += im->m[i].sum2 != NULL;
    return n;
}

int ds4_imatrix_write(const ds4_imatrix *im, const char *path, const char *const *datasets, int n_datasets,
                      int chunk_count, int chunk_size, char *err, size_t errlen) {
    int n_seen = ds4_imatrix_n_seen(im), rc = -1;
    const matrix **seen = calloc((size_t)(n_seen ? n_seen : 1), sizeof *seen);
    float **bufs = calloc((size_t)(2 * n_seen + 1), sizeof *bufs);
    ds4_gguf_writer *w = ds4_gguf_writer_new(0);
    if (!seen || !bufs || !w) { snprintf(err, errlen, "out of memory"); goto out; }
    n_seen = 0;
    for (size_t i = 0; i < im->n; i++) if (im->m[i].sum2) seen[n_seen++] = &im->m[i];
    qsort(seen, (size_t)n_seen, sizeof *seen, by_name);
    ds4_gguf_w_str(w, "general.type", "imatrix");
    ds4_gguf_w_arr_str(w, "imatrix.datasets", datasets, (uint64_t)n_datasets);
    ds4_gguf_w_u32(w, "imatrix.chunk_count", (uint32_t)chunk_count);
    ds4_gguf_w_u32(w, "imatrix.chunk_size", (uint32_t)chunk_size);
    for (int i = 0; i < n_seen; i++) {
        const matrix *m = seen[i];
        float *s = malloc((size_t)(m->ne0 * m->n_mat) * sizeof *s), *c = malloc((size_t)m->n_mat * sizeof *c);
        bufs[2 * i] = s;
        bufs[2 * i + 1] = c;
        if (!s || !c) { snprintf(err, errlen, "out of memory"); goto out; }
        for (int64_t k = 0; k < m->ne0 * m->n_mat; k++) s[k] = (float)m->sum2[k];
        for (int64_t k = 0; k < m->n_mat; k++) c[k] = (float)m->count[k];
        char name[96];
        uint64_t ne_s[2] = {(uint64_t)m->ne0, (uint64_t)m->n_mat}, ne_c[2] = {1, (uint64_t)m->n_mat};
        snprintf(name, sizeof name, "%s.in_sum2", m->name);
        ds4_gguf_w_tensor(w, name, DS4_TYPE_F32, 2, ne_s, s);
        snprintf(name, sizeof name, "%s.counts", m->name);
        ds4_gguf_w_tensor(w, name, DS4_TYPE_F32, 2, ne_c, c);
    }
    rc = ds4_gguf_writer_write_file(w, path, NULL, NULL, err, errlen);
out:
    if (bufs) for (int i = 0; i < 2 * n_seen; i++) free(bufs[i]);
    free(bufs);
    free(seen);
    ds4_gguf_writer_free(w);
    return rc;
}
