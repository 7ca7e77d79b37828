/* tensor.h -- a weight view over a mapped file, the type every family's
 * binder (model.h, glm_model.h, tensor_bind.h) fills and the kernels read.
 *
 * Contract: row-major rows of ne[0] elements of GGML type `type`
 * (quant.h); ne[1] rows per matrix, ne[2] > 1 for expert stacks; data
 * points into the mapping and is never owned. */
#ifndef DS4_TENSOR_H
#define DS4_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const void *data;
    uint32_t type;
    int64_t ne[3];
    size_t row_bytes;                     /* bytes of one ne[0]-element row */
} ds4_tensor;

#endif
