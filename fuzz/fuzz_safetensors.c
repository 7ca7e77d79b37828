/* Fuzz target: the safetensors reader over an in-memory buffer. A buffer that
 * opens must keep the contract: every tensor's data lies inside the buffer
 * with n_bytes = elements x dtype size, names are unique and found by lookup,
 * and decoding every element is safe (ASan checks the reads, abort() the
 * invariants). */
#include "format/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static volatile float sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    ds4_st *st = ds4_st_open_buffer(data, size, err, sizeof err);
    if (!st) {
        if (!memchr(err, 0, sizeof err) || !err[0]) abort();
        return 0;
    }
    for (size_t i = 0; i < ds4_st_n_tensors(st); i++) {
        const ds4_st_tensor *t = ds4_st_tensor_at(st, i);
        const uint8_t *p = t->data;
        if (p < data || p > data + size || t->n_bytes > (uint64_t)(data + size - p)) abort();
        uint64_t want = t->dtype == DS4_ST_F4 ? (t->n_elements + 1) / 2 : t->n_elements * ds4_st_dtype_size(t->dtype);
        if (t->n_bytes != want) abort();
        if (ds4_st_find(st, t->name) != t) abort();
        if (i && strcmp(ds4_st_tensor_at(st, i - 1)->name, t->name) >= 0) abort();
        float buf[64];
        for (uint64_t at = 0; at < t->n_elements; at += 64) {
            uint64_t n = t->n_elements - at < 64 ? t->n_elements - at : 64;
            if (ds4_st_read_f32(t, at, n, buf)) abort();
            sink += buf[0] + buf[n - 1];
        }
        if (t->n_elements && ds4_st_read_f32(t, t->n_elements, 1, buf) == 0) abort();
    }
    ds4_st_close(st);
    return 0;
}
