/* tensor_bind.c -- typed views of GGUF tensors (see tensor_bind.h). */
#include "format/tensor_bind.h"
#include "format/gguf.h"
#include "kernels/quant.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void ds4_bind_fail(ds4_binder *b, const char *fmt, ...) {
    if (b->failed) return;               /* report only the first problem */
    b->failed = true;
    int n = snprintf(b->err, b->errlen, "%s", b->prefix);
    if (n < 0 || (size_t)n >= b->errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err + n, b->errlen - (size_t)n, fmt, ap);
    va_end(ap);
}

/* Out of memory is not a property of the file: its own message. */
void ds4_bind_fail_oom(ds4_binder *b, const char *what) {
    if (b->failed) return;
    b->failed = true;
    snprintf(b->err, b->errlen, "out of memory for %s", what);
}

static bool is_matrix_type(uint32_t t) {
    switch (t) {
    case DS4_TYPE_F32: case DS4_TYPE_F16: case DS4_TYPE_BF16: case DS4_TYPE_Q8_0:
    case DS4_TYPE_Q2_K: case DS4_TYPE_Q3_K: case DS4_TYPE_Q4_K: case DS4_TYPE_Q5_K:
    case DS4_TYPE_Q6_K: case DS4_TYPE_IQ2_XXS:
        return true;
    default:
        return false;
    }
}

static bool is_float_type(uint32_t t) {
    return t == DS4_TYPE_F32 || t == DS4_TYPE_F16 || t == DS4_TYPE_BF16;
}

const ds4_gguf_tensor *ds4_bind_find(ds4_binder *b, const char *name, int n, const uint64_t *ne) {
    if (b->failed) return NULL;
    const ds4_gguf_tensor *t = ds4_gguf_find_tensor(b->g, name);
    if (!t) { ds4_bind_fail(b, "missing tensor %s", name); return NULL; }
    for (int i = 0; i < DS4_GGUF_MAX_DIMS; i++) {
        uint64_t want = i < n ? ne[i] : 1;
        if (t->ne[i] != want) {
            ds4_bind_fail(b, "tensor %s has shape [%llu, %llu, %llu], expected [%lld, %lld, %lld]", name,
                          (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                          (long long)ne[0], (long long)(n > 1 ? ne[1] : 1), (long long)(n > 2 ? ne[2] : 1));
            return NULL;
        }
    }
    return t;
}

ds4_tensor ds4_bind_matrix(ds4_binder *b, const char *name, int n_dims, const uint64_t *ne) {
    ds4_tensor v = {0};
    const ds4_gguf_tensor *t = ds4_bind_find(b, name, n_dims, ne);
    if (!t) return v;
    size_t rb = ds4_type_row_bytes(t->type, ne[0]);
    if (!is_matrix_type(t->type) || rb == 0) {
        const char *tn = ds4_type_name(t->type);
        ds4_bind_fail(b, "tensor %s has type %s, not usable for a %lld-wide matrix", name, tn ? tn : "unknown",
                      (long long)ne[0]);
        return v;
    }
    v.data = t->data;
    v.type = t->type;
    v.ne[0] = (int64_t)ne[0];
    v.ne[1] = n_dims > 1 ? (int64_t)ne[1] : 1;
    v.ne[2] = n_dims > 2 ? (int64_t)ne[2] : 1;
    v.row_bytes = rb;
    return v;
}

float *ds4_bind_floats(ds4_binder *b, const char *name, int n_dims, const uint64_t *ne) {
    const ds4_gguf_tensor *t = ds4_bind_find(b, name, n_dims, ne);
    if (!t) return NULL;
    if (!is_float_type(t->type)) { ds4_bind_fail(b, "tensor %s must be F32/F16/BF16", name); return NULL; }
    float *v = malloc(t->n_elements * sizeof(float));
    if (!v) { ds4_bind_fail_oom(b, name); return NULL; }
    ds4_dequantize_row(t->type, t->data, v, (int64_t)t->n_elements);
    return v;
}
