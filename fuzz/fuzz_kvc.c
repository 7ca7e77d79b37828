/* Fuzz target: the KVC file parser and the DSV4 payload loader, over a small
 * synthetic model geometry (4 layers: raw only, ratio 4 with indexer, ratio
 * 16, ratio 4; head dim 8, indexer dim 4, window 4, ctx 64, slack 4).
 * Input: one mode byte, then the bytes. Mode bit 0 rewrites the KVC CRC so
 * mutations get past the checksum; bit 1 feeds the bytes straight to the
 * payload loader. Invariants (abort() on violation): everything the parser
 * hands out lies inside the input; a payload that loads is written back
 * byte-identically (up to the fields that describe the target session); the
 * file reader path (layout by seek, payload streamed through the section
 * reader) agrees with the in-memory parse and load. */
#include "models/dsv4/kv.h"
#include "models/dsv4/kv_payload.h"
#include "kvdisk/kvdisk.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { CTX = 64, SLACK = 4, VOCAB = 16 };

static ds4_kv *kv;
static int32_t toks[CTX];
static float logits[VOCAB];

static void init(void) {
    static int ratios[4] = {0, 4, 16, 4};
    static uint32_t kinds[4] = {DS4_ATTN_WINDOW, DS4_ATTN_CSA, DS4_ATTN_HCA, DS4_ATTN_CSA};
    static ds4_config c;
    c.n_layer = 4;
    c.n_vocab = VOCAB;
    c.head_dim = 8;
    c.idx_head_dim = 4;
    c.window = 4;
    c.compress_ratio = ratios;
    c.attn_kind = kinds;
    kv = ds4_kv_new(&c, CTX, SLACK);
    if (!kv) abort();
}

static uint32_t crc32_of(const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = p[i];
        if ((i >= 12 && i < 16) || (i >= 32 && i < 40)) b = 0; /* the in-place fields */
        c ^= b;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

static void inside(const uint8_t *lo, size_t n, const void *p, size_t len) {
    const uint8_t *q = p;
    if (len && (q < lo || q > lo + n || len > (size_t)(lo + n - q))) abort();
}

typedef struct { const uint8_t *p; size_t n; } image;
static bool image_pread(void *ud, void *dst, size_t n, uint64_t off) {
    const image *m = ud;
    if (off > m->n || n > m->n - off) return false;
    memcpy(dst, m->p + off, n);
    return true;
}

/* The streaming file path over the same bytes: same verdict, same state. */
static void streamed_agrees(const uint8_t *buf, size_t n, const ds4_kvc_view *v) {
    image m = {buf, n};
    const ds4_kvc_input in = {image_pread, &m, n};
    ds4_kvc_layout L;
    bool foreign;
    char err[256];
    if (!ds4_kvc_read_layout(&in, &L, &foreign, err, sizeof err) || !ds4_kvc_verify(&in, &L, err, sizeof err)) abort();
    if (L.text_len != v->text_len || L.h.payload_bytes != v->h.payload_bytes) abort();
    char *block;
    ds4_kvc_tool *tools;
    uint32_t n_tools;
    if (!ds4_kvc_read_tools(&in, &L, &block, &tools, &n_tools, err, sizeof err) || n_tools != v->n_tools) abort();
    free(tools);
    free(block);
    ds4_kvc_section_reader r;
    ds4_source src;
    if (!ds4_kvc_payload_reader(&in, &L, &r, &src)) abort();
    bool mem_ok = ds4_payload_load(kv, toks, logits, VOCAB, v->payload, (size_t)v->h.payload_bytes, err, sizeof err);
    int mem_pos = kv->n_pos;
    bool stream_ok = ds4_payload_load_from(kv, toks, logits, VOCAB, &src, (size_t)L.h.payload_bytes, err, sizeof err);
    ds4_kvc_reader_free(&r);
    if (mem_ok != stream_ok || (stream_ok && kv->n_pos != mem_pos)) abort();
}

static void payload_round_trip(const uint8_t *p, size_t n) {
    char err[256];
    ds4_payload_header h;
    bool peeked = ds4_payload_peek(p, n, &h, err, sizeof err);
    if (!ds4_payload_load(kv, toks, logits, VOCAB, p, n, err, sizeof err)) return;
    if (!peeked || kv->n_pos != (int)h.n_tokens) abort();
    size_t m = ds4_payload_bytes(kv, VOCAB);
    if (m != n) abort();
    uint8_t *q = malloc(m);
    if (!q) abort();
    ds4_payload_write(kv, toks, logits, VOCAB, (int)h.prefill_chunk, q);
    /* fields 2 (ctx) and 6 (capacity) describe the target session */
    memcpy(q + 8, p + 8, 4);
    memcpy(q + 24, p + 24, 4);
    /* an empty state writes zero logits */
    if (h.n_tokens == 0) memcpy(q + DS4_PAYLOAD_HEADER_BYTES, p + DS4_PAYLOAD_HEADER_BYTES, VOCAB * 4);
    if (memcmp(p, q, n)) abort();
    free(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!kv) init();
    if (size < 1) return 0;
    uint8_t mode = data[0];
    size_t n = size - 1;
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) abort();
    memcpy(buf, data + 1, n);
    if (mode & 2) {
        payload_round_trip(buf, n);
        free(buf);
        return 0;
    }
    if ((mode & 1) && n >= 56) {
        uint32_t crc = crc32_of(buf, n - 8);
        memcpy(buf + n - 4, &crc, 4);
    }
    ds4_kvc_view v;
    char err[256];
    if (ds4_kvc_parse(buf, n, &v, err, sizeof err)) {
        inside(buf, n, v.text, v.text_len);
        inside(buf, n, v.payload, (size_t)v.h.payload_bytes);
        for (uint32_t i = 0; i < v.n_tools; i++) {
            inside(buf, n, v.tools[i].id, v.tools[i].id_len);
            inside(buf, n, v.tools[i].dsml, v.tools[i].dsml_len);
        }
        payload_round_trip(v.payload, (size_t)v.h.payload_bytes);
        streamed_agrees(buf, n, &v);
        free(v.tools);
    }
    free(buf);
    return 0;
}
