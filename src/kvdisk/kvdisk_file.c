/* kvdisk_file.c -- KVC file codec (layout in kvdisk_file.h). */
#include "kvdisk/kvdisk_file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "text/toolmem.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "KVC files are little-endian");

#define KVC_VERSION 1
#define KTM_VERSION 1
#define KCK_VERSION 1
#define TRAILER_BYTES 8u
#define MAX_ID_BYTES 256u
/* I/O piece for streaming the payload and the CRC pass: large enough that
 * syscalls are cheap, small next to any session. */
#define PIECE_BYTES ((size_t)1 << 20)

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); goto fail; } while (0)

/* ---- CRC-32 (IEEE 802.3, reflected, as zlib) ---- */

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

/* Running value: start from 0, feed pieces in order. */
static uint32_t crc_update(uint32_t crc, const void *data, size_t n) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* CRC of the fixed header as the trailer covers it: mutable fields as zero. */
static uint32_t crc_header(const unsigned char *hdr) {
    unsigned char h[DS4_KVC_HEADER_BYTES];
    memcpy(h, hdr, sizeof h);
    memset(h + DS4_KVC_OFF_HITS, 0, 4);
    memset(h + DS4_KVC_OFF_LAST_USED, 0, 8);
    return crc_update(0, h, sizeof h);
}

static void encode_header(const ds4_kvc_header *h, unsigned char *p) {
    memset(p, 0, DS4_KVC_HEADER_BYTES);
    memcpy(p, "KVC", 3);
    p[3] = KVC_VERSION;
    p[4] = h->quant_bits;
    p[5] = h->reason;
    p[6] = h->flags;
    memcpy(p + 8, &h->n_tokens, 4);
    memcpy(p + DS4_KVC_OFF_HITS, &h->hits, 4);
    memcpy(p + 16, &h->ctx, 4);
    memcpy(p + 24, &h->created, 8);
    memcpy(p + DS4_KVC_OFF_LAST_USED, &h->last_used, 8);
    memcpy(p + 40, &h->payload_bytes, 8);
}

/* ---- reading ---- */

static bool fd_pread(void *ud, void *dst, size_t n, uint64_t off) {
    const int fd = *(const int *)ud;
    char *p = dst;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return true;
}

ds4_kvc_input ds4_kvc_fd_input(int *fd, uint64_t size) {
    return (ds4_kvc_input){.pread = fd_pread, .ud = fd, .size = size};
}

typedef struct {
    const unsigned char *p;
    size_t n;
} memory_image;

static bool memory_pread(void *ud, void *dst, size_t n, uint64_t off) {
    const memory_image *m = ud;
    if (off > m->n || n > m->n - off) return false;
    memcpy(dst, m->p + off, n);
    return true;
}

bool ds4_kvc_read_layout(const ds4_kvc_input *in, ds4_kvc_layout *L, bool *foreign, char *err, size_t errlen) {
    unsigned char p[DS4_KVC_HEADER_BYTES + 4];
    ds4_kvc_header *h = &L->h;
    memset(L, 0, sizeof *L);
    *foreign = false;
    const uint64_t size = in->size;
    L->file_bytes = size;
    if (size < sizeof p + TRAILER_BYTES) FAIL("KVC file truncated (%llu bytes)", (unsigned long long)size);
    if (!in->pread(in->ud, p, sizeof p, 0)) FAIL("cannot read the KVC header");
    if (memcmp(p, "KVC", 3)) FAIL("not a KVC file (bad magic)");
    *foreign = true;
    if (p[3] != KVC_VERSION) FAIL("KVC version %u, this build reads %u", p[3], KVC_VERSION);
    h->quant_bits = p[4];
    h->reason = p[5];
    h->flags = p[6];
    memcpy(&h->n_tokens, p + 8, 4);
    memcpy(&h->hits, p + DS4_KVC_OFF_HITS, 4);
    memcpy(&h->ctx, p + 16, 4);
    memcpy(&h->created, p + 24, 8);
    memcpy(&h->last_used, p + DS4_KVC_OFF_LAST_USED, 8);
    memcpy(&h->payload_bytes, p + 40, 8);
    if (h->flags & ~(DS4_KVC_EXT_TOOLS | DS4_KVC_EXT_CHECKSUM)) FAIL("KVC extension flags 0x%02x not understood", h->flags);
    if (!(h->flags & DS4_KVC_EXT_CHECKSUM)) FAIL("KVC file has no integrity trailer");
    *foreign = false;
    if (h->reason > DS4_KVC_SHUTDOWN) FAIL("KVC save reason %u unknown", h->reason);
    if (h->n_tokens > h->ctx) FAIL("KVC file holds %u tokens for a %u-token context", h->n_tokens, h->ctx);
    memcpy(&L->text_len, p + DS4_KVC_HEADER_BYTES, 4);
    const uint64_t body = size - TRAILER_BYTES; /* everything before the trailer */
    L->text_off = sizeof p;
    if (L->text_len > body - L->text_off) FAIL("KVC text length %u exceeds the file", L->text_len);
    L->payload_off = L->text_off + L->text_len;
    if (h->payload_bytes > body - L->payload_off)
        FAIL("KVC payload (%llu bytes) runs past the end", (unsigned long long)h->payload_bytes);
    L->tools_off = L->payload_off + h->payload_bytes;
    L->tools_bytes = body - L->tools_off;
    if (!(h->flags & DS4_KVC_EXT_TOOLS) && L->tools_bytes)
        FAIL("KVC file is %llu bytes, its sections describe %llu", (unsigned long long)size,
             (unsigned long long)(size - L->tools_bytes));
    if ((h->flags & DS4_KVC_EXT_TOOLS) && L->tools_bytes < 8) FAIL("KVC tool-id map section is damaged");
    return true;
fail:
    return false;
}

bool ds4_kvc_verify(const ds4_kvc_input *in, const ds4_kvc_layout *L, char *err, size_t errlen) {
    unsigned char hdr[DS4_KVC_HEADER_BYTES], tr[TRAILER_BYTES];
    const uint64_t body = L->file_bytes - TRAILER_BYTES;
    unsigned char *piece = malloc(PIECE_BYTES);
    if (!piece) FAIL("out of memory for the KVC checksum pass");
    bool ok = in->pread(in->ud, hdr, sizeof hdr, 0) && in->pread(in->ud, tr, sizeof tr, body);
    uint32_t crc = crc_header(hdr);
    for (uint64_t off = DS4_KVC_HEADER_BYTES; ok && off < body;) {
        size_t n = body - off < PIECE_BYTES ? (size_t)(body - off) : PIECE_BYTES;
        ok = in->pread(in->ud, piece, n, off);
        crc = crc_update(crc, piece, n);
        off += n;
    }
    free(piece);
    if (!ok) FAIL("cannot read the KVC file for its checksum");
    if (memcmp(tr, "KCK", 3) || tr[3] != KCK_VERSION) FAIL("KVC integrity trailer is damaged");
    uint32_t want;
    memcpy(&want, tr + 4, 4);
    if (crc != want) FAIL("KVC checksum mismatch (file 0x%08x, contents 0x%08x)", want, crc);
    return true;
fail:
    return false;
}

/* Parses a KTM section image; the tools point into sec. */
static bool parse_tools(const unsigned char *sec, uint64_t n, ds4_kvc_tool **tools, uint32_t *n_tools, char *err,
                        size_t errlen) {
    *tools = NULL;
    *n_tools = 0;
    if (n < 8 || memcmp(sec, "KTM", 3) || sec[3] != KTM_VERSION) FAIL("KVC tool-id map section is damaged");
    uint32_t count;
    memcpy(&count, sec + 4, 4);
    uint64_t off = 8;
    /* every entry needs at least its two lengths */
    if (count > (n - off) / 8) FAIL("KVC tool-id map lists %u entries, the section is too short", count);
    *tools = calloc(count ? count : 1, sizeof **tools);
    if (!*tools) FAIL("out of memory for %u tool ids", count);
    for (uint32_t i = 0; i < count; i++) {
        ds4_kvc_tool *t = &(*tools)[i];
        if (n - off < 8) FAIL("KVC tool-id map entry %u truncated", i);
        memcpy(&t->id_len, sec + off, 4);
        memcpy(&t->dsml_len, sec + off + 4, 4);
        off += 8;
        if (t->id_len == 0 || t->id_len > MAX_ID_BYTES || (uint64_t)t->id_len + t->dsml_len > n - off)
            FAIL("KVC tool-id map entry %u has bad lengths", i);
        t->id = (const char *)sec + off;
        t->dsml = t->id + t->id_len;
        off += (uint64_t)t->id_len + t->dsml_len;
        if (memchr(t->id, 0, t->id_len)) FAIL("KVC tool-id map entry %u has a NUL in its id", i);
    }
    if (off != n) FAIL("KVC tool-id map is %llu bytes, its entries describe %llu", (unsigned long long)n,
                       (unsigned long long)off);
    *n_tools = count;
    return true;
fail:
    free(*tools);
    *tools = NULL;
    return false;
}

bool ds4_kvc_read_tools(const ds4_kvc_input *in, const ds4_kvc_layout *L, char **block, ds4_kvc_tool **tools,
                        uint32_t *n_tools, char *err, size_t errlen) {
    *block = NULL;
    *tools = NULL;
    *n_tools = 0;
    if (!(L->h.flags & DS4_KVC_EXT_TOOLS)) return true;
    if (L->tools_bytes > SIZE_MAX) FAIL("KVC tool-id map too large");
    *block = malloc((size_t)L->tools_bytes);
    if (!*block) FAIL("out of memory for a %llu-byte tool-id map", (unsigned long long)L->tools_bytes);
    if (!in->pread(in->ud, *block, (size_t)L->tools_bytes, L->tools_off)) FAIL("cannot read the KVC tool-id map");
    if (!parse_tools((const unsigned char *)*block, L->tools_bytes, tools, n_tools, err, errlen)) goto fail;
    return true;
fail:
    free(*block);
    *block = NULL;
    return false;
}

static bool section_read(void *ud, void *data, size_t n) {
    ds4_kvc_section_reader *r = ud;
    unsigned char *p = data;
    while (n) {
        if (r->pos == r->have) {
            if (r->off == r->end) return false;
            size_t k = r->end - r->off < PIECE_BYTES ? (size_t)(r->end - r->off) : PIECE_BYTES;
            if (!r->in->pread(r->in->ud, r->buf, k, r->off)) return false;
            r->off += k;
            r->have = k;
            r->pos = 0;
        }
        size_t k = r->have - r->pos < n ? r->have - r->pos : n;
        memcpy(p, r->buf + r->pos, k);
        r->pos += k;
        p += k;
        n -= k;
    }
    return true;
}

bool ds4_kvc_payload_reader(const ds4_kvc_input *in, const ds4_kvc_layout *L, ds4_kvc_section_reader *r,
                            ds4_source *src) {
    *r = (ds4_kvc_section_reader){.in = in, .off = L->payload_off, .end = L->payload_off + L->h.payload_bytes,
                                  .buf = malloc(PIECE_BYTES)};
    *src = (ds4_source){section_read, r};
    return r->buf != NULL;
}

void ds4_kvc_reader_free(ds4_kvc_section_reader *r) {
    free(r->buf);
    r->buf = NULL;
}

bool ds4_kvc_parse(const void *buf, size_t n, ds4_kvc_view *v, char *err, size_t errlen) {
    memory_image m = {buf, n};
    const ds4_kvc_input in = {memory_pread, &m, n};
    ds4_kvc_layout L;
    bool foreign;
    memset(v, 0, sizeof *v);
    if (!ds4_kvc_read_layout(&in, &L, &foreign, err, errlen) || !ds4_kvc_verify(&in, &L, err, errlen)) return false;
    if ((L.h.flags & DS4_KVC_EXT_TOOLS) &&
        !parse_tools(m.p + L.tools_off, L.tools_bytes, &v->tools, &v->n_tools, err, errlen))
        return false;
    v->h = L.h;
    v->text = (const char *)m.p + L.text_off;
    v->text_len = L.text_len;
    v->payload = m.p + L.payload_off;
    return true;
}

/* ---- crash-safe writing ---- */

/* Buffered, checksummed file output; counts payload bytes to hold the
 * producer to the header's size. */
typedef struct {
    int fd;
    uint32_t crc;
    bool ok;
    unsigned char *buf;
    size_t used;
    uint64_t counted;
} file_out;

static bool flush_out(file_out *o) {
    const unsigned char *p = o->buf;
    size_t n = o->used;
    while (o->ok && n) {
        ssize_t w = write(o->fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) o->ok = false;
        else { p += w; n -= (size_t)w; }
    }
    o->used = 0;
    return o->ok;
}

static bool out_write(void *ud, const void *data, size_t n) {
    file_out *o = ud;
    const unsigned char *p = data;
    o->crc = crc_update(o->crc, data, n);
    o->counted += n;
    while (o->ok && n) {
        size_t k = PIECE_BYTES - o->used < n ? PIECE_BYTES - o->used : n;
        memcpy(o->buf + o->used, p, k);
        o->used += k;
        p += k;
        n -= k;
        if (o->used == PIECE_BYTES) flush_out(o);
    }
    return o->ok;
}

/* The unnamed file, or (no O_TMPFILE support) a random temp name in tmp. */
static int create_temp(int dirfd, char *tmp, size_t tmpn, bool *named) {
    int fd = openat(dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
    *named = fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL);
    if (!*named) return fd;
    char hex[33];
    ds4_random_hex(hex, 16);
    snprintf(tmp, tmpn, DS4_KVC_TMP_PREFIX "%s", hex);
    return openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
}

/* Gives the unnamed file fd a random temp name in the directory. */
static bool link_temp(int dirfd, int fd, char *tmp, size_t tmpn) {
    char proc[64], hex[33];
    ds4_random_hex(hex, 16);
    snprintf(tmp, tmpn, DS4_KVC_TMP_PREFIX "%s", hex);
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    if (!linkat(AT_FDCWD, proc, dirfd, tmp, AT_SYMLINK_FOLLOW)) return true;
    /* without /proc, AT_EMPTY_PATH does the same for privileged processes */
    return !linkat(fd, "", dirfd, tmp, AT_EMPTY_PATH);
}

int ds4_kvc_write(int dirfd, const char *name, const ds4_kvc_header *hin, const char *text, uint32_t text_len,
                  ds4_kvc_payload_fn payload, void *payload_ud, const ds4_kvc_tool *tools, uint32_t n_tools,
                  char *err, size_t errlen) {
    char tmp[64] = "";
    ds4_kvc_header h = *hin;
    h.flags = (uint8_t)((h.flags & ~DS4_KVC_EXT_TOOLS) | DS4_KVC_EXT_CHECKSUM | (n_tools ? DS4_KVC_EXT_TOOLS : 0));
    unsigned char hdr[DS4_KVC_HEADER_BYTES];
    encode_header(&h, hdr);
    bool named;
    file_out o = {.fd = create_temp(dirfd, tmp, sizeof tmp, &named), .ok = true, .buf = malloc(PIECE_BYTES)};
    if (o.fd < 0) {
        const int e = errno;
        snprintf(err, errlen, "cannot create a temp file for %s: %s", name, strerror(e));
        free(o.buf);
        errno = e;
        return -1;
    }
    int saved = ENOMEM;
    o.ok = o.buf != NULL;
    const ds4_sink sink = {out_write, &o};
    o.ok = o.ok && sink.write(sink.ud, hdr, sizeof hdr);
    o.crc = crc_header(hdr);
    o.ok = o.ok && sink.write(sink.ud, &text_len, 4) && sink.write(sink.ud, text, text_len);
    const uint64_t before = o.counted;
    o.ok = o.ok && payload(payload_ud, &sink);
    bool sized = !o.ok || o.counted - before == h.payload_bytes;
    o.ok = o.ok && sized;
    if (o.ok && n_tools) {
        unsigned char ktm[8] = {'K', 'T', 'M', KTM_VERSION};
        memcpy(ktm + 4, &n_tools, 4);
        o.ok = sink.write(sink.ud, ktm, 8);
        for (uint32_t i = 0; o.ok && i < n_tools; i++) {
            uint32_t lens[2] = {tools[i].id_len, tools[i].dsml_len};
            o.ok = sink.write(sink.ud, lens, 8) && sink.write(sink.ud, tools[i].id, tools[i].id_len) &&
                   sink.write(sink.ud, tools[i].dsml, tools[i].dsml_len);
        }
    }
    if (o.ok) {
        unsigned char tr[TRAILER_BYTES] = {'K', 'C', 'K', KCK_VERSION};
        memcpy(tr + 4, &o.crc, 4);
        o.ok = sink.write(sink.ud, tr, sizeof tr) && flush_out(&o);
    }
    if (o.buf && !o.ok) saved = errno;
    /* the data must be durable before a name points at it */
    if (o.ok && fsync(o.fd)) { o.ok = false; saved = errno; }
    if (o.ok && !named && !link_temp(dirfd, o.fd, tmp, sizeof tmp)) { o.ok = false; saved = errno; }
    if (close(o.fd) && o.ok) { o.ok = false; saved = errno; }
    if (o.ok && renameat(dirfd, tmp, dirfd, name)) { o.ok = false; saved = errno; }
    free(o.buf);
    if (!o.ok) {
        if (*tmp) unlinkat(dirfd, tmp, 0);
        if (!sized) saved = EINVAL;
        if (!sized) snprintf(err, errlen, "cannot write %s: the payload did not match its declared size", name);
        else snprintf(err, errlen, "cannot write %s: %s", name, strerror(saved));
        errno = saved;
        return -1;
    }
    fsync(dirfd);
    return 0;
}
