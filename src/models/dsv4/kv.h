/* kv.h -- one conversation's decode state for the DS4 forward pass.
 *
 * Contract
 * - Per layer: a raw ring of post-RoPE KV rows (slot = position mod raw_cap),
 *   the compressed attention rows and (ratio-4 layers) indexer rows produced
 *   so far (row w covers window w; ctx/ratio + 1 rows reserved), and the
 *   compressor frontier: projected K and Z (position bias already added) of the
 *   most recent positions (slot = position mod f_cap).
 * - Rings hold `slack` more positions than the math needs (window, or the
 *   current plus previous compression window), so ds4_kv_truncate() can drop
 *   up to `slack` trailing positions exactly, with no recomputation. Deeper
 *   rewinds return false; the caller then recomputes from the token list.
 * - All buffers are allocated once at creation (one block per layer kind),
 *   with exact byte accounting; nothing grows afterwards.
 * - ds4_kv_save() serialises the live part (rings, frontiers, the rows
 *   produced so far) into a flat buffer; ds4_kv_load() restores it into a state
 *   of the same config and ctx, bit-identically (snapshots use this).
 * - The layer-range forms move the same live buffers of layers first..last
 *   only (pipeline parallelism: a worker's slice). They are independent of
 *   ctx, so a state of another context size holding n_pos positions takes
 *   them, as long as n_pos fits it.
 * - ds4_kv_new_layers() allocates (and accounts: bytes, ring_bytes) the
 *   buffers of layers first..last only, for a process that computes just
 *   those (a pipeline worker); the other layers have no buffers, ring
 *   checkpoints cover the range, and the whole-state forms (save, load,
 *   the payload) are for states of every layer.
 * - A state only holds finite floats of magnitude <= DS4_KV_MAX_ABS (the
 *   largest finite binary16). The reference numerics store attention rows
 *   as binary16 and every row is a projection of a normalised vector, so a
 *   healthy state never comes near it; past it a row's sum of squares (norms,
 *   scores) can overflow f32 and the kernels would compute on Inf/NaN.
 *   Everything that restores state from outside the process (payloads, the
 *   pipeline's KV_PUT through ds4_kv_layers_load()) refuses values outside
 *   that range with ds4_kv_first_bad() before they reach a kernel.
 */
#ifndef DS4_KV_H
#define DS4_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "models/dsv4/model.h"

typedef struct {
    int ratio, coff;
    float *raw;          /* [raw_cap][head_dim] */
    float *comp;         /* [comp_cap][head_dim] */
    float *idx;          /* [comp_cap][idx_head_dim] or NULL */
    float *fk, *fz;      /* [f_cap][coff*head_dim] */
    float *ik, *iz;      /* [f_cap][2*idx_head_dim] or NULL */
    int comp_cap, f_cap;
} ds4_kv_layer;

typedef struct ds4_kv {
    int n_layer, ctx, raw_cap, slack;
    int first_layer, last_layer;   /* the layers with buffers (all but for ds4_kv_new_layers) */
    int head_dim, idx_head_dim;
    int n_pos;           /* positions consumed so far */
    int first_pos;       /* no rows below it (ds4_kv_seek); 0 for every ordinary state */
    ds4_kv_layer *L;
    void *block;         /* the single allocation behind every buffer */
    uint64_t bytes;
    size_t ring_bytes;   /* one ring checkpoint (ds4_kv_ring_bytes) */
} ds4_kv;

/* Bytes a state for `ctx` tokens needs (what ds4_kv_new allocates). */
uint64_t ds4_kv_bytes_for(const ds4_config *c, int ctx, int slack);
ds4_kv *ds4_kv_new(const ds4_config *c, int ctx, int slack);   /* NULL: out of memory */
uint64_t ds4_kv_bytes_for_layers(const ds4_config *c, int ctx, int slack, int first, int last);
/* NULL: out of memory or a range outside the model */
ds4_kv *ds4_kv_new_layers(const ds4_config *c, int ctx, int slack, int first, int last);
void ds4_kv_free(ds4_kv *kv);
/* Drop positions >= n. False (state untouched) when n < n_pos - slack. */
bool ds4_kv_truncate(ds4_kv *kv, int n);
void ds4_kv_reset(ds4_kv *kv);
/* States whose layers are all window-only (the MTP block): empties the state
 * and makes it continue at position pos with no rows before it, so attention
 * at a position p reads rows max(first_pos, p - window + 1)..p. A state whose
 * window rows are all recomputed from pos on needs nothing older. False
 * (state untouched) when a layer compresses. */
bool ds4_kv_seek(ds4_kv *kv, int pos);
/* Ring checkpoint: what a state at n_pos needs from its rings (raw rows of
 * the last window, compressor K/Z of the current and previous window), in a
 * fixed-size buffer. Loading one sets n_pos back to the saved position; it is
 * exact as long as the compressed rows before that position are unchanged,
 * i.e. the state has not been truncated below it since the save. The engine
 * keeps a few of these so a deep rewind recomputes from the nearest one. */
size_t ds4_kv_ring_bytes(const ds4_kv *kv);
size_t ds4_kv_ring_bytes_for(const ds4_config *c);
void ds4_kv_ring_save(const ds4_kv *kv, void *dst);
void ds4_kv_ring_load(ds4_kv *kv, const void *src);

/* A full list of n ring checkpoints (positions ascending, one slot each)
 * thinned to its odd entries, the others' slots moved behind them for
 * reuse; returns n / 2. The engine's policy, shared with pipeline workers,
 * which keep their checkpoints at the engine's positions. */
int ds4_kv_ckpt_thin(int *pos, void **slots, int n);

/* Where a state was before a call that appends n tokens and may fail half
 * way, so the caller puts it back: a span within the rings' slack is
 * truncated away; a longer one restores a ring checkpoint (exact while the
 * rows before the position stay). save is false when out of memory. */
typedef struct {
    int pos;
    void *rings;
} ds4_kv_undo;
bool ds4_kv_undo_save(ds4_kv_undo *u, const ds4_kv *kv, int n);
void ds4_kv_undo_apply(const ds4_kv_undo *u, ds4_kv *kv);
void ds4_kv_undo_free(ds4_kv_undo *u);

size_t ds4_kv_live_bytes(const ds4_kv *kv);
void ds4_kv_save(const ds4_kv *kv, void *dst);            /* writes ds4_kv_live_bytes() */
/* False when the buffer does not fit this state's geometry. */
bool ds4_kv_load(ds4_kv *kv, const void *src, size_t n);

size_t ds4_kv_layers_bytes(const ds4_kv *kv, int first, int last, int n_pos);
/* writes ds4_kv_layers_bytes(kv, first, last, kv->n_pos) */
void ds4_kv_layers_save(const ds4_kv *kv, int first, int last, void *dst);
/* Sets n_pos too (the caller loads every layer it uses); false (state
 * untouched, one line in err) when the range, n_pos or the size does not
 * fit or a value is not admissible (ds4_kv_first_bad). */
bool ds4_kv_layers_load(ds4_kv *kv, int first, int last, int n_pos, const void *src, size_t n, char *err,
                        size_t errlen);

#endif
