/* tensor_bind.h -- binding GGUF tensors to typed weight views, shared by the
 * model families' binders (model.c for DeepSeek V4, glm_model.c for GLM).
 *
 * Contract
 * - A ds4_binder carries the first error only: after one failure every call
 *   is a no-op returning an empty view / NULL, so a binder can bind a whole
 *   model and report once. Errors read "<prefix><problem>", e.g.
 *   "not a GLM 5.2 GGUF: missing tensor blk.3.ffn_gate_inp.weight"; running
 *   out of memory reads "out of memory for <what>" (not the file's fault).
 * - ds4_bind_find() checks the tensor exists and has exactly the expected
 *   shape (dims beyond n_dims are 1).
 * - ds4_bind_matrix() also checks a type the CPU kernels multiply
 *   (F32/F16/BF16/Q8_0/Q2_K..Q6_K/IQ2_XXS) with whole blocks per row; the
 *   view points into the mapping. ds4_bind_floats() accepts F32/F16/BF16 and
 *   returns a malloc'd f32 copy the caller frees.
 */
#ifndef DS4_TENSOR_BIND_H
#define DS4_TENSOR_BIND_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#include "format/tensor.h"

struct ds4_gguf;
struct ds4_gguf_tensor;

typedef struct {
    const struct ds4_gguf *g;
    const char *prefix;
    char *err;
    size_t errlen;
    bool failed;
} ds4_binder;

void ds4_bind_fail(ds4_binder *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ds4_bind_fail_oom(ds4_binder *b, const char *what);
const struct ds4_gguf_tensor *ds4_bind_find(ds4_binder *b, const char *name, int n_dims, const uint64_t *ne);
ds4_tensor ds4_bind_matrix(ds4_binder *b, const char *name, int n_dims, const uint64_t *ne);
float *ds4_bind_floats(ds4_binder *b, const char *name, int n_dims, const uint64_t *ne);

#endif
