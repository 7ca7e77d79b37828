/* glm_payload.h -- the GLM session payload: one GLM 5.2 session's exact
 * decode state (glm_kv.h) as a flat little-endian byte stream, the GLM
 * counterpart of the DSV4 payload (kv_payload.h); the disk KV cache and the
 * engine's snapshots carry it.
 *
 * Contract
 * - Layout (all little-endian): ten u32 header fields
 *     0 magic "GLM5"            1 version (1)            2 model family (2 = GLM 5.2, glm-dsa)
 *     3 saved context size      4 tokens                 5 layer count (trunk layers)
 *     6 latent width (kv_lora_rank)  7 rope key width (n_rot)
 *     8 indexer key width       9 vocabulary size
 *   then u32[tokens] token ids, f32[vocab] next-token logits (zeros when
 *   empty), u32[layers] indexer flags (1: the layer keeps indexer keys), and
 *   for every layer in order: tokens rows of latent + rope key floats, then
 *   (flagged layers) tokens rows of indexer key floats, position order.
 * - ds4_glm_payload_load_from() checks the magic (a DSV4 payload gets one line
 *   saying it is a DeepSeek V4 session), version, family, every geometry
 *   field, the flags, token ids, logits and the exact total size against the
 *   target before touching it; on a mismatch it returns false with one line
 *   in err and the target is unchanged. Logits and rows must be values a
 *   state holds (finite, |x| <= DS4_KV_MAX_ABS, kv.h). If the source fails,
 *   or a row holds a value outside that range, while the rows are read in
 *   place, the target is left empty (n_pos 0). A state saved for
 *   a context no larger than the target's restores bit-exactly.
 * - The buffer forms are the streaming forms over memory.
 */
#ifndef GLM_PAYLOAD_H
#define GLM_PAYLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/byte_stream.h"
#include "models/glm/glm_kv.h"
#include "format/payload_stream.h"   /* the magics, the row walk, memory streams */

#define GLM_PAYLOAD_VERSION 1u
#define GLM_PAYLOAD_FAMILY 2u
#define GLM_PAYLOAD_HEADER_BYTES 40u

size_t ds4_glm_payload_bytes(const glm_kv *kv, int n_vocab);
bool ds4_glm_payload_write_to(const glm_kv *kv, const int32_t *toks, const float *logits, int n_vocab,
                          const ds4_sink *sink);
void ds4_glm_payload_write(const glm_kv *kv, const int32_t *toks, const float *logits, int n_vocab, void *dst);
/* toks must hold kv->ctx ids, logits n_vocab floats. */
bool ds4_glm_payload_load_from(glm_kv *kv, int32_t *toks, float *logits, int n_vocab, const ds4_source *src, size_t n,
                           char *err, size_t errlen);
bool ds4_glm_payload_load(glm_kv *kv, int32_t *toks, float *logits, int n_vocab, const void *src, size_t n, char *err,
                      size_t errlen);

#endif
