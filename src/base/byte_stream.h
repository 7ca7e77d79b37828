/* byte_stream.h -- sequential byte sinks and sources, so large state (a
 * session payload, a KVC file) moves between memory and files piece by
 * piece instead of through one whole-size buffer.
 *
 * Contract
 * - write() consumes exactly n bytes or returns false; after a false the
 *   stream is dead and the producer stops.
 * - read() fills exactly n bytes or returns false (short input, I/O error);
 *   after a false the consumer stops.
 * - Pieces arrive in stream order; their sizes carry no meaning.
 */
#ifndef DS4_BYTE_STREAM_H
#define DS4_BYTE_STREAM_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    bool (*write)(void *ud, const void *data, size_t n);
    void *ud;
} ds4_sink;

typedef struct {
    bool (*read)(void *ud, void *data, size_t n);
    void *ud;
} ds4_source;

#endif
