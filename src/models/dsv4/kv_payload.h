/* kv_payload.h -- the DSV4 session payload: one session's exact decode state
 * as a flat little-endian byte stream (the part of a disk KV cache file that
 * holds model state; see kvdisk.h for the file around it).
 *
 * Contract
 * - Layout (all little-endian): thirteen u32 header fields
 *     0 magic "DSV4"            1 version (2)          2 saved context size
 *     3 prefill chunk size      4 raw ring capacity    5 raw window length
 *     6 compressed capacity     7 checkpoint tokens    8 layer count
 *     9 head dim               10 indexer head dim    11 vocabulary size
 *    12 live raw rows serialised
 *   then u32[tokens] checkpoint token ids, f32[vocab] next-token logits,
 *   u32[layers] compressed row counts, u32[layers] indexer row counts, and
 *   for every layer in order: the live raw rows, then (compressed layers) the
 *   compressed rows and the compressor frontier K rows and Z rows, then
 *   (ratio-4 layers) the indexer rows and indexer frontier K rows and Z rows.
 *   Ring buffers (raw rows, frontiers) are written in logical position order,
 *   oldest first: the last min(tokens, ring capacity) positions.
 * - "Compressed capacity" is the largest per-layer row capacity for the saved
 *   context (ctx / smallest ratio + 1); the frontier ring capacity of a layer
 *   follows from its ratio and the rewind slack (raw capacity - window).
 * - ds4_payload_load() checks every header field, every row count, every
 *   token id (below the vocabulary size), every logit (finite, |x| <=
 *   DS4_KV_MAX_ABS, kv.h) and the exact total size against the target state
 *   before touching it; on any mismatch it returns false with one line in
 *   err and the target is unchanged. A state may be restored into a session
 *   with a larger context. The layer rows are checked the same way as they
 *   are read in place: a row holding NaN, Inf or a value past DS4_KV_MAX_ABS
 *   fails the load and leaves the target empty, as a failing source does.
 * - Restore is bit-exact: the restored state continues exactly as the saved
 *   one would have (same logits, same rewind reach).
 * - Streaming forms (byte_stream.h) move the same bytes piece by piece, so a
 *   session is saved to or restored from a file without a whole-payload
 *   buffer. ds4_payload_load_from() stages only the token ids, logits and row
 *   counts (checked before the target is touched, as above); if the source
 *   fails while the layer rows are read in place, the target is left empty
 *   (n_pos 0) rather than half restored. The buffer forms are these with a
 *   memory sink/source.
 * - The memory streams and the row walk are payload_stream.h's, shared with
 *   the GLM payload (glm_payload.h).
 * - A GLM payload (magic "GLM5") given to the DSV4 loader is refused with one
 *   line naming both families.
 */
#ifndef DS4_KV_PAYLOAD_H
#define DS4_KV_PAYLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/byte_stream.h"
#include "models/dsv4/kv.h"
#include "format/payload_stream.h"   /* the magics, the row walk, memory streams */

#define DS4_PAYLOAD_VERSION 2u
#define DS4_PAYLOAD_HEADER_BYTES 52u

typedef struct {
    uint32_t version, ctx, prefill_chunk, raw_cap, window, comp_cap;
    uint32_t n_tokens, n_layer, head_dim, idx_head_dim, n_vocab, raw_rows;
} ds4_payload_header;

/* Bytes ds4_payload_write() produces for this state. */
size_t ds4_payload_bytes(const ds4_kv *kv, int n_vocab);
/* toks: kv->n_pos ids; logits: n_vocab floats (ignored when kv is empty). */
void ds4_payload_write(const ds4_kv *kv, const int32_t *toks, const float *logits, int n_vocab,
                       int prefill_chunk, void *dst);
/* ds4_payload_write() to a sink; false when the sink failed. */
bool ds4_payload_write_to(const ds4_kv *kv, const int32_t *toks, const float *logits, int n_vocab, int prefill_chunk,
                          const ds4_sink *sink);
/* Reads and sanity-checks the fixed header only (magic, version, counts that
 * do not depend on a model). */
bool ds4_payload_peek(const void *src, size_t n, ds4_payload_header *h, char *err, size_t errlen);
/* Validates src against kv's geometry and n_vocab, then restores kv, the
 * first n_tokens entries of toks and n_vocab logits. toks must hold kv->ctx. */
bool ds4_payload_load(ds4_kv *kv, int32_t *toks, float *logits, int n_vocab, const void *src, size_t n,
                      char *err, size_t errlen);
/* ds4_payload_load() from a source holding exactly n payload bytes. */
bool ds4_payload_load_from(ds4_kv *kv, int32_t *toks, float *logits, int n_vocab, const ds4_source *src, size_t n,
                           char *err, size_t errlen);

#endif
