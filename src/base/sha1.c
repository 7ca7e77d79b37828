/* sha1.c -- SHA-1 per FIPS 180-4 section 6.1. */
#include "base/sha1.h"

#include <stdio.h>
#include <string.h>

static uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static void block(ds4_sha1 *c, const unsigned char *p) {
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 80; i++) w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4];
    for (int i = 0; i < 80; i++) {
        uint32_t f, k;
        if (i < 20) { f = (b & cc) | (~b & d); k = 0x5a827999u; }
        else if (i < 40) { f = b ^ cc ^ d; k = 0x6ed9eba1u; }
        else if (i < 60) { f = (b & cc) | (b & d) | (cc & d); k = 0x8f1bbcdcu; }
        else { f = b ^ cc ^ d; k = 0xca62c1d6u; }
        uint32_t t = rol(a, 5) + f + e + k + w[i];
        e = d; d = cc; cc = rol(b, 30); b = a; a = t;
    }
    c->h[0] += a; c->h[1] += b; c->h[2] += cc; c->h[3] += d; c->h[4] += e;
}

void ds4_sha1_init(ds4_sha1 *c) {
    static const uint32_t iv[5] = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u, 0xc3d2e1f0u};
    memcpy(c->h, iv, sizeof iv);
    c->bytes = 0;
    c->nbuf = 0;
}

void ds4_sha1_update(ds4_sha1 *c, const void *data, size_t n) {
    const unsigned char *p = data;
    c->bytes += n;
    while (n) {
        if (c->nbuf == 0 && n >= 64) { block(c, p); p += 64; n -= 64; continue; }
        size_t k = 64 - c->nbuf < n ? 64 - c->nbuf : n;
        memcpy(c->buf + c->nbuf, p, k);
        c->nbuf += k; p += k; n -= k;
        if (c->nbuf == 64) { block(c, c->buf); c->nbuf = 0; }
    }
}

void ds4_sha1_final(ds4_sha1 *c, unsigned char out[20]) {
    uint64_t bits = c->bytes * 8;
    unsigned char pad[72] = {0x80};
    size_t padn = (c->nbuf < 56 ? 56 : 120) - c->nbuf;
    for (int i = 0; i < 8; i++) pad[padn + i] = (unsigned char)(bits >> (56 - 8 * i));
    ds4_sha1_update(c, pad, padn + 8);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (unsigned char)(c->h[i] >> (24 - 8 * j));
}

void ds4_sha1_hex(const void *data, size_t n, char out[41]) {
    ds4_sha1 c;
    unsigned char d[20];
    ds4_sha1_init(&c);
    ds4_sha1_update(&c, data, n);
    ds4_sha1_final(&c, d);
    for (int i = 0; i < 20; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

void ds4_hmac_sha1(const void *key, size_t key_len, const void *msg, size_t n, unsigned char out[20]) {
    unsigned char block[64] = {0}, pad[64], inner[20];
    if (key_len > sizeof block) {
        ds4_sha1 c;
        ds4_sha1_init(&c);
        ds4_sha1_update(&c, key, key_len);
        ds4_sha1_final(&c, block);
    } else if (key_len) {
        memcpy(block, key, key_len);
    }
    ds4_sha1 c;
    for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x36;
    ds4_sha1_init(&c);
    ds4_sha1_update(&c, pad, sizeof pad);
    ds4_sha1_update(&c, msg, n);
    ds4_sha1_final(&c, inner);
    for (int i = 0; i < 64; i++) pad[i] = block[i] ^ 0x5c;
    ds4_sha1_init(&c);
    ds4_sha1_update(&c, pad, sizeof pad);
    ds4_sha1_update(&c, inner, sizeof inner);
    ds4_sha1_final(&c, out);
}
