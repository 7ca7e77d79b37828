/* none.c -- the CUDA backend's stand-in in builds without CUDA. */
#include "backends/cuda/cuda_backend.h"

#include <stdio.h>

ds4_backend *ds4_cuda_backend_new(const ds4_model *m, const ds4_gpu_opts *o, int ctx, int kv_slack, int max_batch,
                                  bool numerics, bool quiet, char *err, size_t errlen) {
    snprintf(err, errlen, "this binary was built without CUDA support (build it with `make cuda`)");
    return NULL;
}

const char *ds4_backends_built(void) { return "cpu"; }
