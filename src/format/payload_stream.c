/* payload_stream.c -- the row walk, memory streams and value check every
 * family's payload shares (payload_stream.h). */
#include "format/payload_stream.h"

#include <math.h>
#include <string.h>

size_t ds4_kv_first_bad(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)   /* written so that NaN fails the test too */
        if (!(fabsf(x[i]) <= DS4_KV_MAX_ABS)) return i;
    return n;
}

void ds4_payload_rows(ds4_payload_cursor *c, float *base, int cap, size_t row_floats, int first, int n) {
    const size_t bytes = row_floats * sizeof(float);
    for (int i = 0; c->ok && (c->sink || c->src) && i < n; i++) {
        int pos = first + i;
        float *r = base + (size_t)(cap ? pos % cap : pos) * row_floats;
        c->ok = c->sink ? c->sink->write(c->sink->ud, r, bytes) : c->src->read(c->src->ud, r, bytes);
        const size_t bad = c->ok && c->src ? ds4_kv_first_bad(r, row_floats) : row_floats;
        if (bad < row_floats) {
            c->ok = false;
            c->inadmissible = true;
            c->bad_value = r[bad];
        }
    }
    c->total += (size_t)n * bytes;
}

static bool memory_write(void *ud, const void *data, size_t n) {
    ds4_memory_stream *m = ud;
    memcpy(m->p, data, n);
    m->p += n;
    return true;
}

static bool memory_read(void *ud, void *data, size_t n) {
    ds4_memory_stream *m = ud;
    if (n > m->left) return false;
    memcpy(data, m->src, n);
    m->src += n;
    m->left -= n;
    return true;
}

ds4_sink ds4_memory_sink(ds4_memory_stream *m) { return (ds4_sink){memory_write, m}; }
ds4_source ds4_memory_source(ds4_memory_stream *m) { return (ds4_source){memory_read, m}; }
