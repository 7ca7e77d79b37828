/* payload_stream.h -- what every family's session payload (kv_payload.h,
 * glm_payload.h) shares: the magics that tell the payloads apart, the row
 * walk over a state's buffers, and byte streams over one memory buffer.
 *
 * Contract
 * - A payload starts with its family's u32 magic, little-endian; a loader
 *   given another family's payload refuses it with one line naming both.
 * - ds4_payload_rows() moves rows [first, first + n) of a ring of cap slots
 *   (slot = position mod cap), or of a plain row array when cap is 0, to the
 *   cursor's sink (save) or from its source (load), or only counts their
 *   bytes in total when both are NULL. ok turns false at the first failed
 *   piece and the walk stops moving bytes; a loaded row holding a value no
 *   session state may hold fails it too, with inadmissible set and
 *   bad_value the first such value.
 * - A state only holds finite floats of magnitude <= DS4_KV_MAX_ABS (the
 *   largest finite f16): ds4_kv_first_bad() returns the index of the first
 *   value outside that range, n when all are admissible. Restored payloads
 *   and layer state are checked with it before they reach a kernel.
 * - ds4_memory_sink / ds4_memory_source: a byte_stream over one buffer; the
 *   sink trusts the caller to have sized it, the source fails past `left`.
 */
#ifndef DS4_PAYLOAD_STREAM_H
#define DS4_PAYLOAD_STREAM_H

#include <stdbool.h>
#include <stddef.h>

#include "base/byte_stream.h"

#define DS4_PAYLOAD_MAGIC 0x34565344u /* "DSV4" read as a little-endian u32 */
#define GLM_PAYLOAD_MAGIC 0x354d4c47u /* "GLM5" read as a little-endian u32 */

typedef struct {
    const ds4_sink *sink;
    const ds4_source *src;
    bool ok, inadmissible;
    float bad_value;
    size_t total;
} ds4_payload_cursor;
void ds4_payload_rows(ds4_payload_cursor *c, float *base, int cap, size_t row_floats, int first, int n);

typedef struct {
    unsigned char *p;            /* sink: next byte to write */
    const unsigned char *src;    /* source: next byte to read */
    size_t left;                 /* source: bytes left */
} ds4_memory_stream;
ds4_sink ds4_memory_sink(ds4_memory_stream *m);
ds4_source ds4_memory_source(ds4_memory_stream *m);

#define DS4_KV_MAX_ABS 65504.0f
size_t ds4_kv_first_bad(const float *x, size_t n);

#endif
