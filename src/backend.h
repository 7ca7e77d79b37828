/* backend.h -- the narrow interface between the engine and a compute backend
 * (the CPU forward pass today; a GPU backend can implement the same calls).
 *
 * Contract
 * - eval() runs n tokens at positions kv->n_pos ... kv->n_pos+n-1 through the
 *   model as one batch, appending their state to kv (kv->n_pos += n). It
 *   writes next-token logits: for every token (n x n_vocab) when all_logits,
 *   else for the last token only (n_vocab). n must not exceed max_batch and
 *   kv->n_pos + n must not exceed kv->ctx (the engine checks both).
 * - A backend owns its scratch and reuses it across calls; it may serve several
 *   states, one call at a time.
 * - kv_sync (NULL for backends that compute in the host ds4_kv) makes the
 *   host copy of a state current before the engine reads its buffers
 *   (to_host) or the backend's copy current after the engine wrote them
 *   (!to_host). kv_release (may be NULL) drops what the backend keeps for a
 *   state that is being freed.
 */
#ifndef DS4_BACKEND_H
#define DS4_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ds4_kv;

typedef struct ds4_backend ds4_backend;
struct ds4_backend {
    const char *name;
    int max_batch;
    int (*eval)(ds4_backend *be, struct ds4_kv *kv, const int32_t *toks, int n, float *logits,
                bool all_logits, char *err, size_t errlen);
    void (*free)(ds4_backend *be);
    int (*kv_sync)(ds4_backend *be, struct ds4_kv *kv, bool to_host, char *err, size_t errlen);
    void (*kv_release)(ds4_backend *be, struct ds4_kv *kv);
};

#endif
