/* glm_backend.h -- the GLM 5.2 CPU backend: glm_forward behind backend.h.
 *
 * Contract
 * - glm_cpu_backend_new() creates a backend (backend.h) for a bound GLM
 *   model with a thread pool of n_threads (<= 0: the physical cores) and
 *   row scratch for GLM_BACKEND_ROWS rows; eval() takes up to max_batch rows
 *   and runs longer runs in pieces of that size, which changes nothing
 *   (glm_forward's results do not depend on the split).
 * - Each sequence's state is a glm_kv (seq.glm); a state must not appear
 *   twice in one call. Sequences are evaluated one after another, each
 *   alone, so a row's logits never depend on what shares its batch.
 * - Everything eval() could refuse (bad token id, context full, more rows
 *   than max_batch, out of memory for scratch) is checked for every
 *   sequence before any runs: on error no state has changed.
 * - Hidden-state slices (hidden_in / hidden_out, pipeline parallelism) are
 *   not supported for GLM: a sequence carrying them is refused.
 * - weight_bytes counts the weight matrices read (glm_forward.h).
 */
#ifndef GLM_BACKEND_H
#define GLM_BACKEND_H

#include <stddef.h>

#include "backend.h"

struct glm_model;

/* Row scratch of one forward call: bounds the backend's memory whatever the
 * prefill chunk (GLM 5.2's rows are ~0.4 MB of scratch each). */
#define GLM_BACKEND_ROWS 256

ds4_backend *glm_cpu_backend_new(const struct glm_model *m, int n_threads, int max_batch, char *err, size_t errlen);
int glm_cpu_backend_threads(const ds4_backend *be);

#endif
