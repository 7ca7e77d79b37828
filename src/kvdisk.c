/* kvdisk.c -- KVC files, the directory index, eviction and locking. */
#include "kvdisk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sha1.h"
#include "tokenizer.h"
#include "toolmem.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "KVC files are little-endian");

#define KVC_VERSION 1
#define KTM_VERSION 1
#define KCK_VERSION 1
#define TRAILER_BYTES 8u
#define OFF_HITS 12
#define OFF_LAST_USED 32
#define HALF_LIFE_S (6.0 * 3600.0)
#define TMP_PREFIX ".kvtmp."

void ds4_kvdisk_opts_default(ds4_kvdisk_opts *o) {
    memset(o, 0, sizeof *o);
    o->space_bytes = (uint64_t)4096 << 20;
    o->min_tokens = 512;
    o->cold_max_tokens = 30000;
    o->continued_interval = 10000;
    o->boundary_trim = 32;
    o->boundary_align = 2048;
}

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
    memset(h + OFF_HITS, 0, 4);
    memset(h + OFF_LAST_USED, 0, 8);
    return crc_update(0, h, sizeof h);
}

/* ---- file image ---- */

static void encode_header(const ds4_kvc_header *h, unsigned char *p) {
    memset(p, 0, DS4_KVC_HEADER_BYTES);
    memcpy(p, "KVC", 3);
    p[3] = KVC_VERSION;
    p[4] = h->quant_bits;
    p[5] = h->reason;
    p[6] = h->flags;
    memcpy(p + 8, &h->n_tokens, 4);
    memcpy(p + OFF_HITS, &h->hits, 4);
    memcpy(p + 16, &h->ctx, 4);
    memcpy(p + 24, &h->created, 8);
    memcpy(p + OFF_LAST_USED, &h->last_used, 8);
    memcpy(p + 40, &h->payload_bytes, 8);
}

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); goto fail; } while (0)

/* Header checks that need nothing but the 48 bytes and the file size.
 * *foreign: the file may be fine for another build (version, flags), so it
 * is left alone rather than removed. */
static bool decode_header(const unsigned char *p, uint64_t file_bytes, ds4_kvc_header *h, bool *foreign, char *err,
                          size_t errlen) {
    *foreign = false;
    if (file_bytes < DS4_KVC_HEADER_BYTES + 4) FAIL("KVC file truncated (%llu bytes)", (unsigned long long)file_bytes);
    if (memcmp(p, "KVC", 3)) FAIL("not a KVC file (bad magic)");
    *foreign = true;
    if (p[3] != KVC_VERSION) FAIL("KVC version %u, this build reads %u", p[3], KVC_VERSION);
    memset(h, 0, sizeof *h);
    h->quant_bits = p[4];
    h->reason = p[5];
    h->flags = p[6];
    memcpy(&h->n_tokens, p + 8, 4);
    memcpy(&h->hits, p + OFF_HITS, 4);
    memcpy(&h->ctx, p + 16, 4);
    memcpy(&h->created, p + 24, 8);
    memcpy(&h->last_used, p + OFF_LAST_USED, 8);
    memcpy(&h->payload_bytes, p + 40, 8);
    if (h->flags & ~(DS4_KVC_EXT_TOOLS | DS4_KVC_EXT_CHECKSUM)) FAIL("KVC extension flags 0x%02x not understood", h->flags);
    if (!(h->flags & DS4_KVC_EXT_CHECKSUM)) FAIL("KVC file has no integrity trailer");
    *foreign = false;
    if (h->reason > DS4_KVC_SHUTDOWN) FAIL("KVC save reason %u unknown", h->reason);
    if (h->n_tokens > h->ctx) FAIL("KVC file holds %u tokens for a %u-token context", h->n_tokens, h->ctx);
    if (h->payload_bytes > file_bytes) FAIL("KVC payload size %llu exceeds the file", (unsigned long long)h->payload_bytes);
    return true;
fail:
    return false;
}

bool ds4_kvc_parse(const void *buf, size_t n, ds4_kvc_view *v, char *err, size_t errlen) {
    const unsigned char *p = buf;
    bool foreign;
    memset(v, 0, sizeof *v);
    if (!decode_header(p, n, &v->h, &foreign, err, errlen)) return false;
    uint32_t text_len;
    memcpy(&text_len, p + DS4_KVC_HEADER_BYTES, 4);
    size_t off = DS4_KVC_HEADER_BYTES + 4;
    if (text_len > n - off) FAIL("KVC text length %u exceeds the file", text_len);
    v->text = (const char *)p + off;
    v->text_len = text_len;
    off += text_len;
    if (v->h.payload_bytes > n - off) FAIL("KVC payload (%llu bytes) runs past the end", (unsigned long long)v->h.payload_bytes);
    v->payload = p + off;
    off += (size_t)v->h.payload_bytes;
    if (v->h.flags & DS4_KVC_EXT_TOOLS) {
        if (n - off < 8 || memcmp(p + off, "KTM", 3) || p[off + 3] != KTM_VERSION) FAIL("KVC tool-id map section is damaged");
        uint32_t count;
        memcpy(&count, p + off + 4, 4);
        off += 8;
        /* every entry needs at least its two lengths */
        if (count > (n - off) / 8) FAIL("KVC tool-id map lists %u entries, the file is too short", count);
        v->tools = calloc(count ? count : 1, sizeof *v->tools);
        if (!v->tools) FAIL("out of memory");
        for (uint32_t i = 0; i < count; i++) {
            ds4_kvc_tool *t = &v->tools[i];
            if (n - off < 8) FAIL("KVC tool-id map entry %u truncated", i);
            memcpy(&t->id_len, p + off, 4);
            memcpy(&t->dsml_len, p + off + 4, 4);
            off += 8;
            if (t->id_len == 0 || t->id_len > 256 || (uint64_t)t->id_len + t->dsml_len > n - off)
                FAIL("KVC tool-id map entry %u has bad lengths", i);
            t->id = (const char *)p + off;
            t->dsml = t->id + t->id_len;
            off += (size_t)t->id_len + t->dsml_len;
            if (memchr(t->id, 0, t->id_len)) FAIL("KVC tool-id map entry %u has a NUL in its id", i);
        }
        v->n_tools = count;
    }
    if (n - off != TRAILER_BYTES) FAIL("KVC file is %zu bytes, its sections describe %zu", n, off + TRAILER_BYTES);
    if (memcmp(p + off, "KCK", 3) || p[off + 3] != KCK_VERSION) FAIL("KVC integrity trailer is damaged");
    uint32_t want;
    memcpy(&want, p + off + 4, 4);
    uint32_t got = crc_update(crc_header(p), p + DS4_KVC_HEADER_BYTES, off - DS4_KVC_HEADER_BYTES);
    if (got != want) FAIL("KVC checksum mismatch (file 0x%08x, contents 0x%08x)", want, got);
    return true;
fail:
    free(v->tools);
    v->tools = NULL;
    v->n_tools = 0;
    return false;
}

/* ---- crash-safe writing ---- */

static int write_all(int fd, const void *data, size_t n, uint32_t *crc) {
    const char *p = data;
    if (crc) *crc = crc_update(*crc, data, n);
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int ds4_kvc_write(const char *dir, const char *name, const ds4_kvc_header *hin, const char *text, uint32_t text_len,
                  const void *payload, const ds4_kvc_tool *tools, uint32_t n_tools, char *err, size_t errlen) {
    static unsigned counter;
    char tmp[4096], dst[4096];
    snprintf(tmp, sizeof tmp, "%s/" TMP_PREFIX "%ld.%u", dir, (long)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    ds4_kvc_header h = *hin;
    h.flags = (uint8_t)((h.flags & ~DS4_KVC_EXT_TOOLS) | DS4_KVC_EXT_CHECKSUM | (n_tools ? DS4_KVC_EXT_TOOLS : 0));
    unsigned char hdr[DS4_KVC_HEADER_BYTES];
    encode_header(&h, hdr);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) { snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno)); return -1; }
    uint32_t crc = crc_header(hdr);
    bool ok = write_all(fd, hdr, sizeof hdr, NULL) == 0 && write_all(fd, &text_len, 4, &crc) == 0 &&
              write_all(fd, text, text_len, &crc) == 0 && write_all(fd, payload, (size_t)h.payload_bytes, &crc) == 0;
    if (ok && n_tools) {
        unsigned char ktm[8] = {'K', 'T', 'M', KTM_VERSION};
        memcpy(ktm + 4, &n_tools, 4);
        ok = write_all(fd, ktm, 8, &crc) == 0;
        for (uint32_t i = 0; ok && i < n_tools; i++) {
            uint32_t lens[2] = {tools[i].id_len, tools[i].dsml_len};
            ok = write_all(fd, lens, 8, &crc) == 0 && write_all(fd, tools[i].id, tools[i].id_len, &crc) == 0 &&
                 write_all(fd, tools[i].dsml, tools[i].dsml_len, &crc) == 0;
        }
    }
    if (ok) {
        unsigned char tr[TRAILER_BYTES] = {'K', 'C', 'K', KCK_VERSION};
        memcpy(tr + 4, &crc, 4);
        ok = write_all(fd, tr, sizeof tr, NULL) == 0;
    }
    /* the data must be durable before the name points at it */
    if (ok) ok = fsync(fd) == 0;
    int saved = errno;
    if (close(fd) && ok) { ok = false; saved = errno; }
    if (ok && rename(tmp, dst)) { ok = false; saved = errno; }
    if (!ok) {
        unlink(tmp);
        snprintf(err, errlen, "cannot write %s: %s", dst, strerror(saved));
        return -1;
    }
    fsync_dir(dir);
    return 0;
}

/* ---- save-point policy ---- */

static int frontier_step(const ds4_kvdisk_opts *o) {
    if (o->continued_interval <= 0) return 0;
    int a = o->boundary_align > 0 ? o->boundary_align : 1;
    return (o->continued_interval + a - 1) / a * a;
}

bool ds4_kvdisk_is_frontier(const ds4_kvdisk_opts *o, int n) {
    int f = frontier_step(o);
    return f > 0 && n > 0 && n % f == 0 && n >= o->min_tokens;
}

/* Where a cold save of a first prompt goes: the system/tools prefix when it
 * alone is long enough, else the prompt minus a BPE-unstable tail, aligned. */
static int cold_point(const ds4_kvdisk_opts *o, const int32_t *toks, int n, int32_t user_tok, int32_t assistant_tok) {
    if (o->cold_max_tokens <= 0 || n < o->min_tokens || n > o->cold_max_tokens) return -1;
    int last_user = -1;
    for (int i = 0; i < n && toks[i] != assistant_tok; i++)
        if (toks[i] == user_tok) last_user = i;
    if (last_user >= o->min_tokens) return last_user;
    int a = o->boundary_align > 0 ? o->boundary_align : 1;
    int c = (n - o->boundary_trim) / a * a;
    return c >= o->min_tokens ? c : -1;
}

int ds4_kvdisk_next_stop(const ds4_kvdisk_opts *o, const int32_t *toks, int n_prompt, int from, bool cold,
                         int32_t user_tok, int32_t assistant_tok, int *reason) {
    int best = -1;
    int f = frontier_step(o);
    if (f > 0) {
        int next = (from / f + 1) * f;
        if (next <= n_prompt && next >= o->min_tokens) { best = next; *reason = DS4_KVC_CONTINUED; }
    }
    int c = cold ? cold_point(o, toks, n_prompt, user_tok, assistant_tok) : -1;
    if (c > from && (best < 0 || c < best)) { best = c; *reason = DS4_KVC_COLD; }
    return best;
}

/* ---- the cache ---- */

typedef struct {
    char name[48];               /* <sha1>.kv */
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    ds4_kvc_header h;
    char *text;
    uint32_t text_len;
    char **tool_ids;
    uint32_t n_tool_ids;
    bool seen;                   /* present in the latest directory scan */
    bool skip;                   /* unusable here (other version or model); kept until it changes */
} entry;

struct ds4_kvdisk {
    ds4_kvdisk_opts o;
    char *dir;
    ds4_engine *e;
    const ds4_tokenizer *tok;
    ds4_toolmem *mem;
    ds4_kvdisk_log_fn log;
    void *log_ud;
    entry *ents;
    int n_ents, cap_ents;
};

__attribute__((format(printf, 3, 4)))
static void logf_(ds4_kvdisk *d, bool warning, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (d->log) d->log(d->log_ud, warning, line);
}

static void entry_free(entry *e) {
    free(e->text);
    for (uint32_t i = 0; i < e->n_tool_ids; i++) free(e->tool_ids[i]);
    free(e->tool_ids);
    memset(e, 0, sizeof *e);
}

static bool read_at(int fd, void *buf, size_t n, off_t off) {
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return true;
}

static bool is_cache_name(const char *n) {
    if (strlen(n) != 43 || strcmp(n + 40, ".kv")) return false;
    for (int i = 0; i < 40; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return false;
    return true;
}

static void path_of(const ds4_kvdisk *d, const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s", d->dir, name);
}

/* Removes a damaged file, unless another writer has replaced it since. */
static void drop_damaged(ds4_kvdisk *d, const entry *e, const char *why) {
    char path[4096];
    struct stat st;
    path_of(d, e->name, path, sizeof path);
    logf_(d, true, "kv-disk: ignoring %s: %s", e->name, why);
    if (!stat(path, &st) && st.st_ino == e->ino && st.st_dev == e->dev && st.st_size == e->size) unlink(path);
}

/* Reads the header, key text and tool ids of one file into e. */
static bool index_file(ds4_kvdisk *d, entry *e, int fd, bool *foreign, char *err, size_t errlen) {
    unsigned char hdr[DS4_KVC_HEADER_BYTES + 4];
    *foreign = false;
    if (!read_at(fd, hdr, sizeof hdr, 0)) FAIL("short read");
    if (!decode_header(hdr, (uint64_t)e->size, &e->h, foreign, err, errlen)) goto fail;
    memcpy(&e->text_len, hdr + DS4_KVC_HEADER_BYTES, 4);
    uint64_t off = DS4_KVC_HEADER_BYTES + 4;
    if (e->text_len > (uint64_t)e->size - off) FAIL("text length %u exceeds the file", e->text_len);
    e->text = malloc((size_t)e->text_len + 1);
    if (!e->text || !read_at(fd, e->text, e->text_len, (off_t)off)) FAIL("cannot read the key text");
    e->text[e->text_len] = 0;
    off += e->text_len + e->h.payload_bytes;
    if (off + TRAILER_BYTES > (uint64_t)e->size) FAIL("file shorter than its sections");
    if (e->h.flags & DS4_KVC_EXT_TOOLS) {
        unsigned char k[8];
        uint32_t count;
        if (!read_at(fd, k, 8, (off_t)off) || memcmp(k, "KTM", 3)) FAIL("tool-id map section is damaged");
        memcpy(&count, k + 4, 4);
        off += 8;
        if (count > ((uint64_t)e->size - off) / 8) FAIL("tool-id map lists too many entries");
        e->tool_ids = calloc(count ? count : 1, sizeof *e->tool_ids);
        if (!e->tool_ids) FAIL("out of memory");
        for (uint32_t i = 0; i < count; i++) {
            uint32_t lens[2];
            if (!read_at(fd, lens, 8, (off_t)off) || lens[0] == 0 || lens[0] > 256) FAIL("tool-id map entry %u is damaged", i);
            char *id = calloc(1, lens[0] + 1);
            if (!id || !read_at(fd, id, lens[0], (off_t)off + 8)) { free(id); FAIL("tool-id map entry %u is damaged", i); }
            e->tool_ids[e->n_tool_ids++] = id;
            off += 8 + (uint64_t)lens[0] + lens[1];
        }
    }
    return true;
fail:
    return false;
}

static int by_name(const void *a, const void *b) { return strcmp(((const entry *)a)->name, ((const entry *)b)->name); }

static entry *find(ds4_kvdisk *d, const char *name) {
    entry key;
    snprintf(key.name, sizeof key.name, "%s", name);
    return d->n_ents ? bsearch(&key, d->ents, (size_t)d->n_ents, sizeof key, by_name) : NULL;
}

/* Brings the index up to date with the directory: new and changed files are
 * (re)read, vanished ones dropped, damaged ones removed. */
static void rescan(ds4_kvdisk *d) {
    DIR *dir = opendir(d->dir);
    if (!dir) { logf_(d, true, "kv-disk: cannot read %s: %s", d->dir, strerror(errno)); return; }
    for (int i = 0; i < d->n_ents; i++) d->ents[i].seen = false;
    struct dirent *de;
    char path[4096], err[256];
    while ((de = readdir(dir))) {
        if (!strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX))) {
            /* a temp file of a process that died mid-write */
            long pid = strtol(de->d_name + strlen(TMP_PREFIX), NULL, 10);
            if (pid > 0 && kill((pid_t)pid, 0) && errno == ESRCH) {
                path_of(d, de->d_name, path, sizeof path);
                unlink(path);
            }
            continue;
        }
        if (!is_cache_name(de->d_name)) continue;
        path_of(d, de->d_name, path, sizeof path);
        struct stat st;
        if (stat(path, &st) || !S_ISREG(st.st_mode)) continue;
        entry *e = find(d, de->d_name);
        if (e && e->ino == st.st_ino && e->dev == st.st_dev && e->size == st.st_size &&
            e->mtime.tv_sec == st.st_mtim.tv_sec && e->mtime.tv_nsec == st.st_mtim.tv_nsec) {
            e->seen = true;
            continue;
        }
        if (!e) {
            if (d->n_ents == d->cap_ents) {
                int cap = d->cap_ents ? 2 * d->cap_ents : 64;
                entry *n = realloc(d->ents, (size_t)cap * sizeof *n);
                if (!n) break;
                d->ents = n;
                d->cap_ents = cap;
            }
            e = &d->ents[d->n_ents++];
            memset(e, 0, sizeof *e);
        } else {
            entry_free(e);
        }
        memcpy(e->name, de->d_name, 44); /* is_cache_name: 43 characters */
        e->ino = st.st_ino;
        e->dev = st.st_dev;
        e->size = st.st_size;
        e->mtime = st.st_mtim;
        e->seen = true;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        bool foreign = false;
        bool ok = fd >= 0 && index_file(d, e, fd, &foreign, err, sizeof err);
        if (fd >= 0) close(fd);
        if (!ok && foreign) {
            logf_(d, true, "kv-disk: ignoring %s: %s", e->name, err);
            e->skip = true;
        } else if (!ok) {
            if (fd >= 0) drop_damaged(d, e, err);
            e->seen = false;
        }
        /* keep the array sorted for bsearch */
        qsort(d->ents, (size_t)d->n_ents, sizeof *d->ents, by_name);
    }
    closedir(dir);
    int k = 0;
    for (int i = 0; i < d->n_ents; i++) {
        if (d->ents[i].seen) d->ents[k++] = d->ents[i];
        else entry_free(&d->ents[i]);
    }
    d->n_ents = k;
}

ds4_kvdisk *ds4_kvdisk_open(const ds4_kvdisk_opts *o, ds4_engine *e, ds4_toolmem *mem, ds4_kvdisk_log_fn log,
                            void *log_ud, char *err, size_t errlen) {
    if (!o->dir || !*o->dir) { snprintf(err, errlen, "no --kv-disk-dir given"); return NULL; }
    if (mkdir(o->dir, 0755) && errno != EEXIST) {
        snprintf(err, errlen, "cannot create --kv-disk-dir %s: %s", o->dir, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (stat(o->dir, &st) || !S_ISDIR(st.st_mode) || access(o->dir, W_OK)) {
        snprintf(err, errlen, "--kv-disk-dir %s is not a writable directory", o->dir);
        return NULL;
    }
    /* A file-size limit must fail the write (EFBIG), not kill the server. */
    signal(SIGXFSZ, SIG_IGN);
    ds4_kvdisk *d = calloc(1, sizeof *d);
    d->o = *o;
    d->dir = strdup(o->dir);
    d->o.dir = d->dir;
    d->e = e;
    d->tok = e ? ds4_engine_tokenizer(e) : NULL;
    d->mem = mem;
    d->log = log;
    d->log_ud = log_ud;
    rescan(d);
    logf_(d, false, "kv-disk: %s: %d cache files", d->dir, d->n_ents);
    return d;
}

void ds4_kvdisk_close(ds4_kvdisk *d) {
    if (!d) return;
    for (int i = 0; i < d->n_ents; i++) entry_free(&d->ents[i]);
    free(d->ents);
    free(d->dir);
    free(d);
}

const ds4_kvdisk_opts *ds4_kvdisk_options(const ds4_kvdisk *d) { return &d->o; }

static int lock_dir(const ds4_kvdisk *d) {
    char path[4096];
    path_of(d, ".lock", path, sizeof path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) while (flock(fd, LOCK_EX) && errno == EINTR) {}
    return fd;
}

static void unlock_dir(int fd) {
    if (fd >= 0) close(fd);
}

static double score(const entry *e) {
    return (double)e->h.last_used + HALF_LIFE_S * log2(1.0 + e->h.hits);
}

/* Whether a should go before b; equal scores (same second) by file age. */
static bool evict_first(const entry *a, const entry *b) {
    double sa = score(a), sb = score(b);
    if (sa != sb) return sa < sb;
    if (a->mtime.tv_sec != b->mtime.tv_sec) return a->mtime.tv_sec < b->mtime.tv_sec;
    return a->mtime.tv_nsec < b->mtime.tv_nsec;
}

/* Removes the lowest-scored files until the directory fits the budget. */
static void evict(ds4_kvdisk *d) {
    for (;;) {
        uint64_t total = 0;
        int worst = -1;
        for (int i = 0; i < d->n_ents; i++) {
            total += (uint64_t)d->ents[i].size;
            if (worst < 0 || evict_first(&d->ents[i], &d->ents[worst])) worst = i;
        }
        if (total <= d->o.space_bytes || worst < 0) return;
        char path[4096];
        path_of(d, d->ents[worst].name, path, sizeof path);
        logf_(d, false, "kv-disk: evicting %s (%u tokens, %u hits) to fit %llu MiB", d->ents[worst].name,
              d->ents[worst].h.n_tokens, d->ents[worst].h.hits, (unsigned long long)(d->o.space_bytes >> 20));
        unlink(path);
        entry_free(&d->ents[worst]);
        d->ents[worst] = d->ents[--d->n_ents];
        qsort(d->ents, (size_t)d->n_ents, sizeof *d->ents, by_name);
    }
}

typedef struct {
    const char *text;
    size_t text_len;
    ds4_kvc_tool *tools;
    uint32_t n, cap;
    const char *last_block;
    bool last_in_text;
    char **ids;                  /* copies: the map may change after the lock is released */
} tool_collect;

static void collect_tool(void *ud, const char *id, const char *block, size_t len) {
    tool_collect *c = ud;
    /* ids of one turn share a block: search each block once */
    if (block != c->last_block) {
        c->last_block = block;
        c->last_in_text = len && memmem(c->text, c->text_len, block, len) != NULL;
    }
    if (!c->last_in_text || strlen(id) > 256) return;
    if (c->n == c->cap) {
        uint32_t cap = c->cap ? 2 * c->cap : 16;
        ds4_kvc_tool *t = realloc(c->tools, cap * sizeof *t);
        char **ids = realloc(c->ids, cap * sizeof *ids);
        if (t) c->tools = t;
        if (ids) c->ids = ids;
        if (!t || !ids) return;
        c->cap = cap;
    }
    char *copy = malloc(strlen(id) + 1 + len);
    if (!copy) return;
    size_t il = strlen(id);
    memcpy(copy, id, il);
    memcpy(copy + il, block, len);
    c->ids[c->n] = copy;
    c->tools[c->n++] = (ds4_kvc_tool){.id = copy, .id_len = (uint32_t)il, .dsml = copy + il, .dsml_len = (uint32_t)len};
}

int ds4_kvdisk_save(ds4_kvdisk *d, const ds4_session *s, int reason) {
    static const char *const names[] = {"unknown", "cold", "continued", "evict", "shutdown"};
    const int n = ds4_session_n_tokens(s);
    if (n < d->o.min_tokens || n <= 0 || !d->tok) return 1;
    size_t text_len = 0;
    char *text = ds4_tokenizer_decode(d->tok, ds4_session_tokens(s), (size_t)n, false, &text_len);
    if (!text || text_len > UINT32_MAX) { free(text); return -1; }
    char name[48];
    ds4_sha1_hex(text, text_len, name);
    strcat(name, ".kv");
    int lock = lock_dir(d);
    rescan(d);
    int rc = 1;
    entry *have = find(d, name);
    size_t pbytes = ds4_session_payload_bytes(s);
    tool_collect tc = {.text = text, .text_len = text_len};
    void *payload = NULL;
    if (have && have->h.n_tokens == (uint32_t)n) goto out;
    if (pbytes + text_len + 1024 > d->o.space_bytes) {
        logf_(d, false, "kv-disk: %s save of %d tokens skipped: %zu bytes exceed the %llu MiB budget", names[reason], n,
              pbytes, (unsigned long long)(d->o.space_bytes >> 20));
        goto out;
    }
    payload = malloc(pbytes);
    if (!payload) { rc = -1; logf_(d, true, "kv-disk: out of memory for a %zu-byte snapshot", pbytes); goto out; }
    ds4_session_save_payload(s, payload);
    if (d->mem) ds4_toolmem_each(d->mem, collect_tool, &tc);
    uint64_t now = (uint64_t)time(NULL);
    ds4_kvc_header h = {.quant_bits = (uint8_t)ds4_engine_expert_bits(d->e), .reason = (uint8_t)reason,
                        .n_tokens = (uint32_t)n, .ctx = (uint32_t)ds4_session_ctx(s), .created = now,
                        .last_used = now, .payload_bytes = pbytes};
    char err[512];
    if (ds4_kvc_write(d->dir, name, &h, text, (uint32_t)text_len, payload, tc.tools, tc.n, err, sizeof err)) {
        logf_(d, true, "kv-disk: %s save failed: %s", names[reason], err);
        rc = -1;
        goto out;
    }
    logf_(d, false, "kv-disk: saved %s (%s, %d tokens, %u text bytes, %u tool ids)", name, names[reason], n,
          (unsigned)text_len, tc.n);
    rc = 0;
    rescan(d);
    evict(d);
out:
    unlock_dir(lock);
    for (uint32_t i = 0; i < tc.n; i++) free(tc.ids[i]);
    free(tc.ids);
    free(tc.tools);
    free(payload);
    free(text);
    return rc;
}

/* Reads and fully validates one file; v points into *buf. */
static bool read_file(ds4_kvdisk *d, const entry *e, unsigned char **buf, ds4_kvc_view *v, char *err, size_t errlen) {
    char path[4096];
    path_of(d, e->name, path, sizeof path);
    *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) FAIL("cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) { close(fd); FAIL("cannot stat: %s", strerror(errno)); }
    *buf = malloc(st.st_size ? (size_t)st.st_size : 1);
    bool ok = *buf && read_at(fd, *buf, (size_t)st.st_size, 0);
    close(fd);
    if (!ok) FAIL("cannot read %lld bytes", (long long)st.st_size);
    return ds4_kvc_parse(*buf, (size_t)st.st_size, v, err, errlen);
fail:
    return false;
}

/* Counts the hit in the file's header, in place (not covered by the CRC). */
static void touch(ds4_kvdisk *d, entry *e) {
    char path[4096];
    path_of(d, e->name, path, sizeof path);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return;
    e->h.hits++;
    e->h.last_used = (uint64_t)time(NULL);
    if (pwrite(fd, &e->h.hits, 4, OFF_HITS) != 4 || pwrite(fd, &e->h.last_used, 8, OFF_LAST_USED) != 8)
        logf_(d, true, "kv-disk: cannot update the hit count of %s", e->name);
    close(fd);
}

static void load_tools(ds4_kvdisk *d, const ds4_kvc_view *v, const char *only) {
    if (!d->mem) return;
    for (uint32_t i = 0; i < v->n_tools; i++) {
        const ds4_kvc_tool *t = &v->tools[i];
        char id[257];
        memcpy(id, t->id, t->id_len);
        id[t->id_len] = 0;
        if (only && strcmp(only, id)) continue;
        const char *ids[1] = {id};
        ds4_toolmem_put(d->mem, ids, 1, t->dsml, t->dsml_len);
    }
}

static bool usable(const ds4_kvdisk *d, const entry *e, const ds4_session *s) {
    if (e->skip || e->h.n_tokens < (uint32_t)d->o.min_tokens || e->h.ctx > (uint32_t)ds4_session_ctx(s)) return false;
    return !d->o.reject_different_quant || e->h.quant_bits == ds4_engine_expert_bits(d->e);
}

size_t ds4_kvdisk_restore(ds4_kvdisk *d, ds4_session *s, const char *text, size_t n, int beat) {
    rescan(d);
    for (;;) {
        entry *best = NULL;
        for (int i = 0; i < d->n_ents; i++) {
            entry *e = &d->ents[i];
            if (e->text_len > n || (int64_t)e->h.n_tokens <= beat || !usable(d, e, s)) continue;
            if (memcmp(e->text, text, e->text_len)) continue;
            if (!best || e->text_len > best->text_len) best = e;
        }
        if (!best) return 0;
        /* the live session is about to be replaced: keep it first (this may
         * rescan and evict, so the choice is looked up again by name) */
        char name[48];
        snprintf(name, sizeof name, "%s", best->name);
        if (ds4_session_n_tokens(s) >= d->o.min_tokens) ds4_kvdisk_save(d, s, DS4_KVC_EVICT);
        if (!(best = find(d, name))) continue;
        unsigned char *buf = NULL;
        ds4_kvc_view v = {0};
        char err[512];
        bool damaged = !read_file(d, best, &buf, &v, err, sizeof err);
        bool ok = !damaged && !ds4_session_load_payload(s, v.payload, (size_t)v.h.payload_bytes, err, sizeof err);
        if (ok) {
            load_tools(d, &v, NULL);
            touch(d, best);
            logf_(d, false, "kv-disk: hit %s (%u tokens, %u text bytes, %u tool ids, hit %u)", best->name,
                  best->h.n_tokens, best->text_len, v.n_tools, best->h.hits);
        }
        size_t matched = best->text_len;
        free(v.tools);
        free(buf);
        if (ok) return matched;
        if (damaged) {
            drop_damaged(d, best, err);
            entry_free(best);
            *best = d->ents[--d->n_ents];
            qsort(d->ents, (size_t)d->n_ents, sizeof *d->ents, by_name);
        } else {
            /* intact but saved by an incompatible model or session layout */
            logf_(d, true, "kv-disk: ignoring %s: %s", best->name, err);
            best->skip = true;
        }
    }
}

int ds4_kvdisk_prefill_stop(const ds4_kvdisk *d, const int32_t *toks, int n_prompt, int from, bool cold, int *reason) {
    if (!d->tok) return -1;
    const ds4_special_ids *sp = ds4_tokenizer_specials(d->tok);
    return ds4_kvdisk_next_stop(&d->o, toks, n_prompt, from, cold, sp->user, sp->assistant, reason);
}

bool ds4_kvdisk_find_tool(ds4_kvdisk *d, const char *id) {
    if (!d->mem) return false;
    rescan(d);
    for (int i = 0; i < d->n_ents; i++) {
        entry *e = &d->ents[i];
        if (e->skip) continue;
        bool has = false;
        for (uint32_t k = 0; k < e->n_tool_ids && !has; k++) has = !strcmp(e->tool_ids[k], id);
        if (!has) continue;
        unsigned char *buf = NULL;
        ds4_kvc_view v = {0};
        char err[512];
        bool ok = read_file(d, e, &buf, &v, err, sizeof err);
        if (ok) load_tools(d, &v, id);
        else drop_damaged(d, e, err);
        free(v.tools);
        free(buf);
        if (ok) {
            logf_(d, false, "kv-disk: tool id %s replay block loaded from %s", id, e->name);
            return true;
        }
    }
    return false;
}
