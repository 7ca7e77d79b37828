/* Fuzz target: the GGUF reader over an in-memory buffer. A file that opens
 * must keep the contract: every pointer handed out lies inside the buffer,
 * lookups by name find exactly the listed entry, and reading every value and
 * tensor byte is safe (ASan checks the reads, abort() the invariants). */
#include "format/gguf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t *lo, *hi;
static volatile uint64_t sink;

static void must_be_inside(const void *p, uint64_t n) {
    const uint8_t *q = p;
    if (n && (q < lo || q > hi || n > (uint64_t)(hi - q))) abort();
}

static char *cstr(ds4_gguf_str s) {
    char *p = malloc(s.len + 1);
    if (!p) abort();
    memcpy(p, s.ptr, s.len);
    p[s.len] = 0;
    return p;
}

static void touch(const void *p, uint64_t n) {
    if (!n) return;
    must_be_inside(p, n);
    sink += ((const uint8_t *)p)[0] + ((const uint8_t *)p)[n - 1];
}

static void walk_kv(const ds4_gguf *g, const ds4_gguf_kv *kv) {
    touch(kv->key.ptr, kv->key.len);
    char *key = cstr(kv->key);
    if (ds4_gguf_find_kv(g, key) != kv) abort();
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    double d;
    bool b;
    ds4_gguf_str s;
    sink += ds4_gguf_get_u32(g, key, &u32) + ds4_gguf_get_u64(g, key, &u64) +
            ds4_gguf_get_f32(g, key, &f) + ds4_gguf_get_bool(g, key, &b) + ds4_gguf_get_str(g, key, &s);
    free(key);
    if (kv->type == DS4_GGUF_STRING) touch(kv->str.ptr, kv->str.len);
    if (kv->type != DS4_GGUF_ARRAY) return;
    if (kv->arr_type == DS4_GGUF_STRING) {
        for (uint64_t i = 0; i < kv->arr_n; i++) touch(kv->arr_strs[i].ptr, kv->arr_strs[i].len);
    }
    uint64_t last = kv->arr_n ? kv->arr_n - 1 : 0;
    sink += ds4_gguf_arr_i64(kv, 0, &i64) + ds4_gguf_arr_u64(kv, last, &u64) +
            ds4_gguf_arr_f64(kv, last, &d) + ds4_gguf_arr_i64(kv, kv->arr_n, &i64);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    ds4_gguf *g = ds4_gguf_open_buffer(data, size, err, sizeof err);
    if (!g) {
        if (strncmp(err, "gguf: ", 6) != 0 || strchr(err, '\n')) abort();
        return 0;
    }
    lo = data;
    hi = data + size;
    for (size_t i = 0; i < ds4_gguf_n_kv(g); i++) walk_kv(g, ds4_gguf_kv_at(g, i));
    for (size_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        touch(t->name.ptr, t->name.len);
        touch(t->data, t->n_bytes);
        if ((const uint8_t *)t->data != data + t->file_offset || t->file_offset > size) abort();
        char *name = cstr(t->name);
        if (ds4_gguf_find_tensor(g, name) != t) abort();
        free(name);
    }
    ds4_gguf_close(g);
    return 0;
}
