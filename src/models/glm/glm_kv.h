/* glm_kv.h -- one conversation's decode state for the GLM 5.2 forward pass
 * (glm_forward.h).
 *
 * Contract
 * - Layout, per trunk layer l (the MTP block keeps nothing), for every
 *   position p < ctx:
 *     rows[l][p]: kv_lora_rank floats of the RMS-normalised MLA latent, then
 *                 n_rot floats of the shared rope key after RoPE at p
 *                 (row width = kv_lora_rank + n_rot, the GGUF key_length);
 *     idx[l][p]:  idx_head_dim floats of the indexer key after LayerNorm and
 *                 RoPE at p, on full-indexer layers only (NULL on shared
 *                 layers, which reuse the previous full layer's top-k).
 *   Every width comes from the model's metadata. Nothing is a ring: every
 *   position's row is kept, so ds4_glm_kv_truncate() to any n <= n_pos is exact
 *   without recomputation (rows at or past n are simply no longer counted;
 *   the indexer keys are per position like the latent, so they truncate
 *   the same way and the top-k of a later query sees exactly the kept keys).
 * - One allocation (calloc, so rows not yet produced stay unmapped), sized
 *   at creation with exact byte accounting (ds4_glm_kv_bytes_for()).
 */
#ifndef GLM_KV_H
#define GLM_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "models/glm/glm_layout.h"

typedef struct glm_kv {
    int n_layer, ctx, n_pos;
    int row_width;       /* kv_lora_rank + n_rot */
    int latent_width;    /* kv_lora_rank */
    int idx_width;       /* idx_head_dim */
    float **rows;        /* [n_layer] -> [ctx][row_width] */
    float **idx;         /* [n_layer] -> [ctx][idx_width] or NULL */
    void *block;
    uint64_t bytes;
} glm_kv;

uint64_t ds4_glm_kv_bytes_for(const glm_hparams *hp, int ctx);
glm_kv *ds4_glm_kv_new(const glm_hparams *hp, int ctx);   /* NULL: out of memory */
void ds4_glm_kv_free(glm_kv *kv);
/* Keep positions [0, n); false (state untouched) when n is not in [0, n_pos]. */
bool ds4_glm_kv_truncate(glm_kv *kv, int n);

#endif
