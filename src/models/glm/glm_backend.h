/* glm_backend.h -- the GLM 5.2 CPU backend: glm_forward behind backend.h.
 *
 * Contract
 * - ds4_glm_cpu_backend_new() creates a backend (backend.h) for a bound GLM
 *   model with a thread pool of n_threads (<= 0: the physical cores) and
 *   row scratch for GLM_BACKEND_ROWS rows; eval() takes up to max_batch rows
 *   and packs the sequences' rows into forward calls of that size, a long
 *   run split at call boundaries: several sessions' decode rows and prefill
 *   chunks share one pass over the weights. Neither the packing nor the
 *   split changes a bit (glm_forward.h: a row's result depends only on its
 *   token, position and own state).
 * - Each sequence's state is a glm_kv (seq.glm); a state must not appear
 *   twice in one call.
 * - Everything eval() could refuse (bad token id, context full, more rows
 *   than max_batch, out of memory for scratch) is checked for every
 *   sequence before any runs: on error no state has changed.
 * - Hidden-state slices (hidden_in / hidden_out, pipeline parallelism) are
 *   not supported for GLM: a sequence carrying them is refused.
 * - ds4_glm_cpu_backend_split() makes the backend one rank of a
 *   tensor-parallel pair (glm_forward.h ds4_glm_forward_split: rank 1's
 *   sequences may carry NULL logits); false when out of memory.
 * - weight_bytes counts the weight matrices read (glm_forward.h).
 */
#ifndef GLM_BACKEND_H
#define GLM_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "backends/backend.h"
#include "nn/tp_split.h"

struct glm_model;

/* Row scratch of one forward call: bounds the backend's memory whatever the
 * prefill chunk (GLM 5.2: about 0.7 MB of scratch per row, 180 MB in all). */
#define GLM_BACKEND_ROWS 256

ds4_backend *ds4_glm_cpu_backend_new(const struct glm_model *m, int n_threads, int max_batch, char *err, size_t errlen);
int ds4_glm_cpu_backend_threads(const ds4_backend *be);
bool ds4_glm_cpu_backend_split(ds4_backend *be, const ds4_cpu_split *sp);

#endif
