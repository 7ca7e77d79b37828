/* sha1.h -- SHA-1 (FIPS 180-4), used to name disk KV cache files after their
 * rendered-text key, and HMAC-SHA1 (RFC 2104), which seals pipeline frames
 * with the shared secret (dist_proto.h). HMAC-SHA1 stays a sound MAC: the
 * SHA-1 collision attacks do not forge it.
 *
 * Contract
 * - Streaming: init, any number of updates, final (20-byte digest).
 * - ds4_sha1_hex() hashes one buffer into 40 lowercase hex digits + NUL.
 * - ds4_hmac_sha1() is HMAC-SHA1 of msg under key (any key length; keys
 *   longer than the 64-byte block are hashed first, as RFC 2104 says).
 */
#ifndef DS4_SHA1_H
#define DS4_SHA1_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[5];
    uint64_t bytes;
    unsigned char buf[64];
    size_t nbuf;
} ds4_sha1;

void ds4_sha1_init(ds4_sha1 *c);
void ds4_sha1_update(ds4_sha1 *c, const void *data, size_t n);
void ds4_sha1_final(ds4_sha1 *c, unsigned char out[20]);
void ds4_sha1_hex(const void *data, size_t n, char out[41]);
void ds4_hmac_sha1(const void *key, size_t key_len, const void *msg, size_t n, unsigned char out[20]);

#endif
