/* kvdisk.c -- the disk KV cache: saving, restoring and tool-id lookup over
 * the directory index (kvdisk.h). */
#include "kvdisk/kvdisk.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "base/sha1.h"
#include "text/toolmem.h"

struct ds4_kvdisk {
    ds4_kvdisk_opts o;
    ds4_kvdisk_host host;
    ds4_toolmem *mem;
    ds4_kvdisk_index x;
    /* ds4_kvdisk_stats, read by other threads (metrics) */
    atomic_uint_least64_t saves, fail_nospace, fail_other, nospace_hits, nospace_evictions;
    atomic_bool out_of_space;
};

static const char *const reason_names[] = {"unknown", "cold", "continued", "evict", "shutdown"};

/* The directory must exist (created private), be ours, and admit no other
 * writer: the files hold prompts and are trusted on load. */
static int open_private_dir(const char *dir, char *err, size_t errlen) {
    if (mkdir(dir, 0700) && errno != EEXIST) {
        snprintf(err, errlen, "cannot create --kv-disk-dir %s: %s", dir, strerror(errno));
        return -1;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        snprintf(err, errlen, "cannot open --kv-disk-dir %s: %s", dir, strerror(errno));
    } else if (st.st_uid != geteuid()) {
        snprintf(err, errlen, "--kv-disk-dir %s is owned by uid %u, not by this user (uid %u)", dir,
                 (unsigned)st.st_uid, (unsigned)geteuid());
    } else if (st.st_mode & 022) {
        snprintf(err, errlen, "--kv-disk-dir %s is writable by group or others (mode %03o); chmod 700 it", dir,
                 (unsigned)(st.st_mode & 0777));
    } else if (faccessat(fd, ".", W_OK | X_OK, AT_EACCESS)) {
        snprintf(err, errlen, "--kv-disk-dir %s is not a writable directory", dir);
    } else {
        return fd;
    }
    if (fd >= 0) close(fd);
    return -1;
}

ds4_kvdisk *ds4_kvdisk_open(const ds4_kvdisk_opts *o, const ds4_kvdisk_host *host, ds4_toolmem *mem,
                            ds4_kvdisk_log_fn log, void *log_ud, char *err, size_t errlen) {
    if (!o->dir || !*o->dir) { snprintf(err, errlen, "no --kv-disk-dir given"); return NULL; }
    int dirfd = open_private_dir(o->dir, err, errlen);
    if (dirfd < 0) return NULL;
    ds4_kvdisk *d = calloc(1, sizeof *d);
    if (!d || !ds4_kvdisk_index_init(&d->x, dirfd, o->dir, log, log_ud)) {
        snprintf(err, errlen, "out of memory opening --kv-disk-dir %s", o->dir);
        if (d) ds4_kvdisk_index_free(&d->x);
        else close(dirfd);
        free(d);
        return NULL;
    }
    /* A file-size limit must fail the write (EFBIG), not kill the server. */
    signal(SIGXFSZ, SIG_IGN);
    d->o = *o;
    d->o.dir = d->x.dir;
    d->host = *host;
    d->mem = mem;
    ds4_kvdisk_index_rescan(&d->x);
    ds4_kvdisk_index_log(&d->x, false, "kv-disk: %s: %d cache files", d->x.dir, d->x.n_ents);
    return d;
}

void ds4_kvdisk_close(ds4_kvdisk *d) {
    if (!d) return;
    ds4_kvdisk_index_free(&d->x);
    free(d);
}

const ds4_kvdisk_opts *ds4_kvdisk_options(const ds4_kvdisk *d) { return &d->o; }

/* The tool ids whose sampled block appears in the key text: the ones a
 * client replaying this conversation can send back. */
typedef struct {
    const char *text;
    size_t text_len;
    ds4_kvc_tool *tools;
    uint32_t n, cap;
    const char *last_block;
    bool last_in_text;
    char **ids;                  /* copies: the map may change after its lock is released */
    bool failed;
} tool_collect;

static void collect_tool(void *ud, const char *id, const char *block, size_t len) {
    tool_collect *c = ud;
    /* ids of one turn share a block: search each block once */
    if (block != c->last_block) {
        c->last_block = block;
        c->last_in_text = len && memmem(c->text, c->text_len, block, len) != NULL;
    }
    size_t il = strlen(id);
    if (!c->last_in_text || il > 256 || c->failed) return;
    if (c->n == c->cap) {
        uint32_t cap = c->cap ? 2 * c->cap : 16;
        ds4_kvc_tool *t = realloc(c->tools, cap * sizeof *t);
        if (t) c->tools = t;
        char **ids = t ? realloc(c->ids, cap * sizeof *ids) : NULL;
        if (ids) c->ids = ids;
        if (!t || !ids) { c->failed = true; return; }
        c->cap = cap;
    }
    char *copy = malloc(il + len);
    if (!copy) { c->failed = true; return; }
    memcpy(copy, id, il);
    memcpy(copy + il, block, len);
    c->ids[c->n] = copy;
    c->tools[c->n++] = (ds4_kvc_tool){.id = copy, .id_len = (uint32_t)il, .dsml = copy + il, .dsml_len = (uint32_t)len};
}

static void collect_free(tool_collect *c) {
    for (uint32_t i = 0; i < c->n; i++) free(c->ids[i]);
    free(c->ids);
    free(c->tools);
}

typedef struct {
    const ds4_kvdisk_host *host;
    const struct ds4_session *s;
} payload_job;

static bool emit_payload(void *ud, const ds4_sink *sink) {
    const payload_job *j = ud;
    return j->host->save_payload(j->s, sink);
}

/* After a write failed for lack of space: evicts cache files in the usual
 * order until a file of `need` bytes would fit, when it can fit at all (the
 * cache's own files and the free space together); never empties the cache
 * for a file that cannot fit. True when files were evicted (worth a retry). */
static bool make_room(ds4_kvdisk *d, uint64_t need, const char *why) {
    struct statvfs vs;
    const uint64_t avail = fstatvfs(d->x.dirfd, &vs) ? 0 : (uint64_t)vs.f_bavail * vs.f_frsize;
    ds4_kvdisk_index_rescan(&d->x);
    const uint64_t cached = ds4_kvdisk_index_bytes(&d->x);
    /* free space that looks sufficient (a quota, reserved blocks) still failed: free need anyway */
    const uint64_t short_by = need > avail ? need - avail : need;
    if (short_by > cached) {
        ds4_kvdisk_index_log(&d->x, true,
                             "kv-disk: %s save: the disk is full and the cache's %llu MiB cannot make room for "
                             "%llu MiB; nothing evicted", why, (unsigned long long)(cached >> 20),
                             (unsigned long long)(need >> 20));
        return false;
    }
    uint64_t freed = 0;
    const int n = ds4_kvdisk_index_evict(&d->x, cached - short_by, "", &freed);
    atomic_fetch_add(&d->nospace_evictions, (uint64_t)n);
    ds4_kvdisk_index_log(&d->x, true, "kv-disk: %s save: the disk is full; evicted %d files (%llu KiB), retrying", why,
                         n, (unsigned long long)(freed >> 10));
    return n > 0;
}

void ds4_kvdisk_get_stats(const ds4_kvdisk *d, ds4_kvdisk_stats *st) {
    *st = (ds4_kvdisk_stats){.saves = atomic_load(&d->saves), .fail_nospace = atomic_load(&d->fail_nospace),
                             .fail_other = atomic_load(&d->fail_other), .nospace_hits = atomic_load(&d->nospace_hits),
                             .nospace_evictions = atomic_load(&d->nospace_evictions),
                             .out_of_space = atomic_load(&d->out_of_space)};
}

int ds4_kvdisk_save(ds4_kvdisk *d, const struct ds4_session *s, int reason) {
    const ds4_kvdisk_host *H = &d->host;
    const char *why = reason_names[reason];
    const int n = H->n_tokens(s);
    if (n < d->o.min_tokens || n <= 0) return 1;
    size_t text_len = 0;
    char *text = H->key_text(H->ud, s, &text_len);
    if (!text || text_len > UINT32_MAX) {
        atomic_fetch_add(&d->fail_other, 1);
        ds4_kvdisk_index_log(&d->x, true, "kv-disk: %s save failed: cannot render the key text", why);
        free(text);
        return -1;
    }
    char name[48], err[512];
    ds4_sha1_hex(text, text_len, name);
    strcat(name, ".kv");
    if (!ds4_kvdisk_index_lock(&d->x, err, sizeof err)) {
        atomic_fetch_add(&d->fail_other, 1);
        ds4_kvdisk_index_log(&d->x, true, "kv-disk: %s save failed: %s", why, err);
        free(text);
        return -1;
    }
    ds4_kvdisk_index_rescan(&d->x);
    int rc = 1;
    const ds4_kvdisk_entry *have = ds4_kvdisk_index_find(&d->x, name);
    const size_t pbytes = H->payload_bytes(s);
    const uint64_t file_bytes = (uint64_t)pbytes + text_len + 1024;   /* with the header, tool map and trailer */
    tool_collect tc = {.text = text, .text_len = text_len};
    if (have && have->h.n_tokens == (uint32_t)n) goto out;
    if (file_bytes > d->o.space_bytes) {
        ds4_kvdisk_index_log(&d->x, false, "kv-disk: %s save of %d tokens skipped: %zu bytes exceed the %llu MiB budget",
                             why, n, pbytes, (unsigned long long)(d->o.space_bytes >> 20));
        goto out;
    }
    if (d->mem) ds4_toolmem_each(d->mem, collect_tool, &tc);
    rc = -1;
    if (tc.failed) {
        atomic_fetch_add(&d->fail_other, 1);
        ds4_kvdisk_index_log(&d->x, true, "kv-disk: %s save failed: out of memory collecting tool ids", why);
        goto out;
    }
    uint64_t now = (uint64_t)time(NULL);
    ds4_kvc_header h = {.quant_bits = H->quant_bits, .reason = (uint8_t)reason, .n_tokens = (uint32_t)n,
                        .ctx = (uint32_t)H->ctx(s), .created = now, .last_used = now, .payload_bytes = pbytes};
    payload_job job = {H, s};
    int werr = ds4_kvc_write(d->x.dirfd, name, &h, text, (uint32_t)text_len, emit_payload, &job, tc.tools, tc.n, err,
                             sizeof err) ? errno : 0;
    if (werr == ENOSPC || werr == EDQUOT) {
        atomic_fetch_add(&d->nospace_hits, 1);
        if (make_room(d, file_bytes, why))
            werr = ds4_kvc_write(d->x.dirfd, name, &h, text, (uint32_t)text_len, emit_payload, &job, tc.tools, tc.n,
                                 err, sizeof err) ? errno : 0;
    }
    if (werr) {
        const bool nospace = werr == ENOSPC || werr == EDQUOT;
        atomic_fetch_add(nospace ? &d->fail_nospace : &d->fail_other, 1);
        atomic_store(&d->out_of_space, nospace);
        ds4_kvdisk_index_log(&d->x, true, "kv-disk: %s save failed: %s", why, err);
        goto out;
    }
    atomic_fetch_add(&d->saves, 1);
    atomic_store(&d->out_of_space, false);
    ds4_kvdisk_index_log(&d->x, false, "kv-disk: saved %s (%s, %d tokens, %u text bytes, %u tool ids)", name, why, n,
                         (unsigned)text_len, tc.n);
    rc = 0;
    ds4_kvdisk_index_rescan(&d->x);
    ds4_kvdisk_index_evict(&d->x, d->o.space_bytes, name, NULL);
out:
    ds4_kvdisk_index_unlock(&d->x);
    collect_free(&tc);
    free(text);
    return rc;
}

/* Counts the hit in the file's header, in place (not covered by the CRC). */
static void touch(ds4_kvdisk *d, ds4_kvdisk_entry *e, int fd) {
    e->h.hits++;
    e->h.last_used = (uint64_t)time(NULL);
    if (pwrite(fd, &e->h.hits, 4, DS4_KVC_OFF_HITS) != 4 || pwrite(fd, &e->h.last_used, 8, DS4_KVC_OFF_LAST_USED) != 8)
        ds4_kvdisk_index_log(&d->x, true, "kv-disk: cannot update the hit count of %s", e->name);
}

static void load_tools(ds4_kvdisk *d, const ds4_kvc_tool *tools, uint32_t n_tools, const char *only) {
    if (!d->mem) return;
    for (uint32_t i = 0; i < n_tools; i++) {
        const ds4_kvc_tool *t = &tools[i];
        char id[257];
        memcpy(id, t->id, t->id_len);
        id[t->id_len] = 0;
        if (only && strcmp(only, id)) continue;
        const char *ids[1] = {id};
        ds4_toolmem_put(d->mem, ids, 1, t->dsml, t->dsml_len);
    }
}

static bool usable(const ds4_kvdisk *d, const ds4_kvdisk_entry *e, const struct ds4_session *s) {
    if (e->skip || e->h.n_tokens < (uint32_t)d->o.min_tokens || e->h.ctx > (uint32_t)d->host.ctx(s)) return false;
    return !d->o.reject_different_quant || e->h.quant_bits == d->host.quant_bits;
}

/* The stored key text must be the one the file's name hashes and a prefix of
 * the prompt it was chosen for: the payload is trusted on that basis. */
static bool belongs(const ds4_kvc_input *in, const ds4_kvc_layout *L, const char *name, const char *text, size_t n,
                    char *err, size_t errlen) {
    if (L->text_len > n) { snprintf(err, errlen, "its key text is longer than the prompt it was chosen for"); return false; }
    char *stored = malloc(L->text_len ? L->text_len : 1), hex[41];
    if (!stored || !in->pread(in->ud, stored, L->text_len, L->text_off)) {
        snprintf(err, errlen, "cannot read its key text");
        free(stored);
        return false;
    }
    ds4_sha1_hex(stored, L->text_len, hex);
    bool ok = !strncmp(hex, name, 40) && !memcmp(stored, text, L->text_len);
    free(stored);
    if (!ok) snprintf(err, errlen, "its stored key text does not match its name or the prompt");
    return ok;
}

enum { LOADED, DAMAGED, INCOMPATIBLE, EMPTIED };

/* Checks and loads one file into s; on success *tools holds its tool map. */
static int load_file(ds4_kvdisk *d, ds4_kvdisk_entry *e, struct ds4_session *s, const char *text, size_t n,
                     char *err, size_t errlen) {
    int fd;
    ds4_kvc_input in;
    ds4_kvc_layout L;
    char *block = NULL;
    ds4_kvc_tool *tools = NULL;
    uint32_t n_tools = 0;
    if (!ds4_kvdisk_index_open(&d->x, e, true, &fd, &in, &L, err, errlen)) return DAMAGED;
    int rc = DAMAGED;
    if (!belongs(&in, &L, e->name, text, n, err, errlen) || !ds4_kvc_verify(&in, &L, err, errlen) ||
        !ds4_kvc_read_tools(&in, &L, &block, &tools, &n_tools, err, errlen))
        goto out;
    ds4_kvc_section_reader r;
    ds4_source src;
    if (!ds4_kvc_payload_reader(&in, &L, &r, &src)) {
        snprintf(err, errlen, "out of memory for the payload reader");
        rc = INCOMPATIBLE;
        goto out;
    }
    const int before = d->host.n_tokens(s);
    /* belongs() showed the key text is text[0..text_len) */
    rc = d->host.load_payload(d->host.ud, s, &src, (size_t)L.h.payload_bytes, text, L.text_len, err, errlen)
             ? INCOMPATIBLE
             : LOADED;
    ds4_kvc_reader_free(&r);
    if (rc != LOADED && d->host.n_tokens(s) != before) rc = EMPTIED;
    if (rc == LOADED) {
        load_tools(d, tools, n_tools, NULL);
        touch(d, e, fd);
        ds4_kvdisk_index_log(&d->x, false, "kv-disk: hit %s (%u tokens, %u text bytes, %u tool ids, hit %u)", e->name,
                             e->h.n_tokens, e->text_len, n_tools, e->h.hits);
    }
out:
    free(tools);
    free(block);
    close(fd);
    return rc;
}

size_t ds4_kvdisk_restore(ds4_kvdisk *d, struct ds4_session *s, const char *text, size_t n, int beat) {
    ds4_kvdisk_index_rescan(&d->x);
    for (;;) {
        ds4_kvdisk_entry *best = NULL;
        for (int i = 0; i < d->x.n_ents; i++) {
            ds4_kvdisk_entry *e = &d->x.ents[i];
            if (e->text_len > n || (int64_t)e->h.n_tokens <= beat || !usable(d, e, s)) continue;
            if (memcmp(e->text, text, e->text_len)) continue;
            if (!best || e->text_len > best->text_len) best = e;
        }
        if (!best) return 0;
        /* the live session is about to be replaced: keep it first (this may
         * rescan and evict, so the choice is looked up again by name) */
        char name[48], err[512];
        snprintf(name, sizeof name, "%s", best->name);
        if (d->host.n_tokens(s) >= d->o.min_tokens) ds4_kvdisk_save(d, s, DS4_KVC_EVICT);
        if (!(best = ds4_kvdisk_index_find(&d->x, name))) continue;
        switch (load_file(d, best, s, text, n, err, sizeof err)) {
        case LOADED:
            return best->text_len;
        case DAMAGED:
            ds4_kvdisk_index_drop(&d->x, best, err);
            break;
        case INCOMPATIBLE:
            /* intact but saved by an incompatible model or session layout */
            ds4_kvdisk_index_log(&d->x, true, "kv-disk: ignoring %s: %s", best->name, err);
            best->skip = true;
            break;
        case EMPTIED:
            ds4_kvdisk_index_log(&d->x, true, "kv-disk: restoring %s failed, the session is empty: %s", best->name, err);
            best->skip = true;
            return 0;
        }
    }
}

int ds4_kvdisk_prefill_stop(const ds4_kvdisk *d, const int32_t *toks, int n_prompt, int from, bool cold, int *reason) {
    return ds4_kvdisk_next_stop(&d->o, toks, n_prompt, from, cold, d->host.user_tok, d->host.assistant_tok, reason);
}

bool ds4_kvdisk_find_tool(ds4_kvdisk *d, const char *id) {
    if (!d->mem) return false;
    ds4_kvdisk_index_rescan(&d->x);
    for (int i = 0; i < d->x.n_ents; i++) {
        ds4_kvdisk_entry *e = &d->x.ents[i];
        bool has = false;
        for (uint32_t k = 0; k < e->n_tool_ids && !has; k++) has = !strcmp(e->tool_ids[k], id);
        if (e->skip || !has) continue;
        int fd;
        ds4_kvc_input in;
        ds4_kvc_layout L;
        char *block = NULL, err[512];
        ds4_kvc_tool *tools = NULL;
        uint32_t n_tools = 0;
        bool ok = ds4_kvdisk_index_open(&d->x, e, false, &fd, &in, &L, err, sizeof err);
        if (ok) {
            ok = ds4_kvc_read_tools(&in, &L, &block, &tools, &n_tools, err, sizeof err);
            close(fd);
        }
        if (ok) load_tools(d, tools, n_tools, id);
        free(tools);
        free(block);
        if (ok) {
            ds4_kvdisk_index_log(&d->x, false, "kv-disk: tool id %s replay block loaded from %s", id, e->name);
            return true;
        }
        ds4_kvdisk_index_drop(&d->x, e, err);
        i--;
    }
    return false;
}
