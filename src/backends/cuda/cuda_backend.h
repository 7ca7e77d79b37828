/* cuda_backend.h -- the CUDA backend (backend.h) for a bound DS4 model.
 *
 * Contract
 * - ds4_cuda_backend_new() finds the devices (--gpu-devices, default 0),
 *   resolves the budgets (--gpu-vram, auto = free memory), places the layers
 *   (cuda_plan.h) reserving KV for one `ctx`-token session (kv.h with
 *   kv_slack) and scratch for `max_batch` tokens,
 *   and uploads every weight once, in its stored (quantized) format. No GPU, a
 *   driver too old, a placement that would spill, or running out of device
 *   memory: NULL and one line in err; nothing is left allocated.
 * - eval() runs the batch's sequences one after another, each exactly as it
 *   would run alone (every kernel computes a row from that row only; the
 *   same holds for any split into calls), so backend.h's exactness holds by
 *   construction; states advance only after all sequences ran.
 * - The forward pass mirrors the CPU's (forward_cpu.c) op by op, including
 *   the activation quantization before every matrix product and the ds4
 *   numerics simulation, so logits agree with the CPU backend to float
 *   rounding. Session state lives on the device in the same layout as the
 *   host ds4_kv (one block, same offsets); kv_sync() copies it to or from the
 *   host so snapshots and payloads are the CPU's, byte for byte in layout.
 *   Decode (one token) replays a captured CUDA graph per session.
 * - Directional steering (backend.h steer): the directions go to the device
 *   with the first steered sequence; from then on every pass projects the
 *   attention and FFN outputs with the running sequence's scales, read on
 *   the device, so a captured decode graph follows a session's scales (a
 *   graph captured before the upload is captured again); a zero scale
 *   leaves the rows untouched.
 * - Builds without CUDA link src/backends/cuda/none.c, whose constructor
 *   refuses with one line.
 */
#ifndef DS4_CUDA_BACKEND_H
#define DS4_CUDA_BACKEND_H

#ifdef __cplusplus
extern "C" {   /* the C headers below too: backend.cu is C++ */
#endif

#include <stdbool.h>
#include <stddef.h>
#include "backends/backend.h"
#include "backends/cuda/cuda_plan.h"
#include "models/dsv4/model.h"

ds4_backend *ds4_cuda_backend_new(const ds4_model *m, const ds4_gpu_opts *o, int ctx, int kv_slack, int max_batch,
                                  bool numerics, bool quiet, char *err, size_t errlen);
/* The backends this binary was built with, for messages: "cpu" or "cpu, cuda". */
const char *ds4_backends_built(void);

#ifdef __cplusplus
}
#endif

#endif
