/* kvdisk_index.c -- the cache directory: entries, lock, rescan, eviction
 * (kvdisk_index.h). */
#include "kvdisk/kvdisk_index.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvdisk/kvdisk_policy.h"

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); goto fail; } while (0)

bool ds4_kvdisk_index_init(ds4_kvdisk_index *x, int dirfd, const char *dir, ds4_kvdisk_log_fn log, void *log_ud) {
    memset(x, 0, sizeof *x);
    x->dirfd = dirfd;
    x->lock_fd = -1;
    x->log = log;
    x->log_ud = log_ud;
    x->dir = strdup(dir);
    return x->dir != NULL;
}

static void entry_free(ds4_kvdisk_entry *e) {
    free(e->text);
    for (uint32_t i = 0; i < e->n_tool_ids; i++) free(e->tool_ids[i]);
    free(e->tool_ids);
    memset(e, 0, sizeof *e);
}

void ds4_kvdisk_index_free(ds4_kvdisk_index *x) {
    for (int i = 0; i < x->n_ents; i++) entry_free(&x->ents[i]);
    free(x->ents);
    free(x->dir);
    if (x->lock_fd >= 0) close(x->lock_fd);
    if (x->dirfd >= 0) close(x->dirfd);
    memset(x, 0, sizeof *x);
}

void ds4_kvdisk_index_log(const ds4_kvdisk_index *x, bool warning, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (x->log) x->log(x->log_ud, warning, line);
}

bool ds4_kvdisk_index_lock(ds4_kvdisk_index *x, char *err, size_t errlen) {
    if (x->lock_depth) { x->lock_depth++; return true; }
    int fd = openat(x->dirfd, ".lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) FAIL("cannot open the lock file %s/.lock: %s", x->dir, strerror(errno));
    int rc;
    while ((rc = flock(fd, LOCK_EX)) && errno == EINTR) {}
    if (rc) {
        int saved = errno;
        close(fd);
        FAIL("cannot lock %s/.lock: %s", x->dir, strerror(saved));
    }
    x->lock_fd = fd;
    x->lock_depth = 1;
    return true;
fail:
    return false;
}

void ds4_kvdisk_index_unlock(ds4_kvdisk_index *x) {
    if (!x->lock_depth || --x->lock_depth) return;
    close(x->lock_fd);
    x->lock_fd = -1;
}

static bool is_cache_name(const char *n) {
    if (strlen(n) != 43 || strcmp(n + 40, ".kv")) return false;
    for (int i = 0; i < 40; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return false;
    return true;
}

static bool same_file(const ds4_kvdisk_entry *e, const struct stat *st) {
    return e->ino == st->st_ino && e->dev == st->st_dev && e->size == st->st_size &&
           e->mtime.tv_sec == st->st_mtim.tv_sec && e->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

/* Unlinks e's file if the name still points at the file e describes. */
static void remove_judged(ds4_kvdisk_index *x, const ds4_kvdisk_entry *e) {
    char err[256];
    struct stat st;
    if (!ds4_kvdisk_index_lock(x, err, sizeof err)) {
        ds4_kvdisk_index_log(x, true, "kv-disk: %s kept: %s", e->name, err);
        return;
    }
    if (!fstatat(x->dirfd, e->name, &st, AT_SYMLINK_NOFOLLOW) && same_file(e, &st)) unlinkat(x->dirfd, e->name, 0);
    ds4_kvdisk_index_unlock(x);
}

static void remove_entry(ds4_kvdisk_index *x, ds4_kvdisk_entry *e) {
    entry_free(e);
    int i = (int)(e - x->ents);
    memmove(e, e + 1, (size_t)(x->n_ents - i - 1) * sizeof *e);
    x->n_ents--;
}

void ds4_kvdisk_index_drop(ds4_kvdisk_index *x, ds4_kvdisk_entry *e, const char *why) {
    ds4_kvdisk_index_log(x, true, "kv-disk: ignoring %s: %s", e->name, why);
    remove_judged(x, e);
    remove_entry(x, e);
}

bool ds4_kvdisk_index_open(const ds4_kvdisk_index *x, const ds4_kvdisk_entry *e, bool writable, int *fd,
                           ds4_kvc_input *in, ds4_kvc_layout *L, char *err, size_t errlen) {
    struct stat st;
    bool foreign;
    *fd = openat(x->dirfd, e->name, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
    if (*fd < 0) FAIL("cannot open: %s", strerror(errno));
    if (fstat(*fd, &st)) FAIL("cannot stat: %s", strerror(errno));
    *in = ds4_kvc_fd_input(fd, (uint64_t)st.st_size);
    if (!ds4_kvc_read_layout(in, L, &foreign, err, errlen)) goto fail;
    return true;
fail:
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return false;
}

/* Reads the header, key text and tool ids of one file into e. */
static bool index_file(ds4_kvdisk_index *x, ds4_kvdisk_entry *e, bool *foreign, char *err, size_t errlen) {
    int fd = openat(x->dirfd, e->name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    char *block = NULL;
    ds4_kvc_tool *tools = NULL;
    uint32_t n_tools = 0;
    ds4_kvc_layout L;
    *foreign = false;
    if (fd < 0) FAIL("cannot open: %s", strerror(errno));
    ds4_kvc_input in = ds4_kvc_fd_input(&fd, (uint64_t)e->size);
    if (!ds4_kvc_read_layout(&in, &L, foreign, err, errlen)) goto fail;
    e->h = L.h;
    e->text_len = L.text_len;
    e->text = malloc((size_t)L.text_len + 1);
    if (!e->text) FAIL("out of memory for a %u-byte key text", L.text_len);
    if (!in.pread(in.ud, e->text, L.text_len, L.text_off)) FAIL("cannot read the key text");
    e->text[L.text_len] = 0;
    if (!ds4_kvc_read_tools(&in, &L, &block, &tools, &n_tools, err, errlen)) goto fail;
    e->tool_ids = calloc(n_tools ? n_tools : 1, sizeof *e->tool_ids);
    if (!e->tool_ids) FAIL("out of memory for %u tool ids", n_tools);
    for (uint32_t i = 0; i < n_tools; i++) {
        char *id = strndup(tools[i].id, tools[i].id_len);
        if (!id) FAIL("out of memory for a tool id");
        e->tool_ids[e->n_tool_ids++] = id;
    }
    free(tools);
    free(block);
    close(fd);
    return true;
fail:
    free(tools);
    free(block);
    if (fd >= 0) close(fd);
    return false;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const ds4_kvdisk_entry *)a)->name, ((const ds4_kvdisk_entry *)b)->name);
}

ds4_kvdisk_entry *ds4_kvdisk_index_find(ds4_kvdisk_index *x, const char *name) {
    ds4_kvdisk_entry key;
    snprintf(key.name, sizeof key.name, "%s", name);
    return x->n_ents ? bsearch(&key, x->ents, (size_t)x->n_ents, sizeof key, by_name) : NULL;
}

/* The entry for a new or changed file, emptied; NULL when out of memory. */
static ds4_kvdisk_entry *fresh_entry(ds4_kvdisk_index *x, ds4_kvdisk_entry *e) {
    if (e) { entry_free(e); return e; }
    if (x->n_ents == x->cap_ents) {
        int cap = x->cap_ents ? 2 * x->cap_ents : 64;
        ds4_kvdisk_entry *n = realloc(x->ents, (size_t)cap * sizeof *n);
        if (!n) return NULL;
        x->ents = n;
        x->cap_ents = cap;
    }
    e = &x->ents[x->n_ents++];
    memset(e, 0, sizeof *e);
    return e;
}

void ds4_kvdisk_index_rescan(ds4_kvdisk_index *x) {
    int fd = openat(x->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        ds4_kvdisk_index_log(x, true, "kv-disk: cannot read %s: %s", x->dir, strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    for (int i = 0; i < x->n_ents; i++) x->ents[i].seen = false;
    struct dirent *de;
    char err[256];
    while ((de = readdir(dir))) {
        if (!strncmp(de->d_name, DS4_KVC_TMP_PREFIX, strlen(DS4_KVC_TMP_PREFIX))) {
            /* writers hold the lock while a temp name exists, so one seen by
             * the lock holder was left by a writer that died */
            if (x->lock_depth) unlinkat(x->dirfd, de->d_name, 0);
            continue;
        }
        if (!is_cache_name(de->d_name)) continue;
        struct stat st;
        if (fstatat(x->dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode)) continue;
        ds4_kvdisk_entry *e = ds4_kvdisk_index_find(x, de->d_name);
        if (e && same_file(e, &st)) {
            e->seen = true;
            continue;
        }
        if (!(e = fresh_entry(x, e))) {
            ds4_kvdisk_index_log(x, true, "kv-disk: out of memory indexing %s", x->dir);
            break;
        }
        memcpy(e->name, de->d_name, 44); /* is_cache_name: 43 characters */
        e->ino = st.st_ino;
        e->dev = st.st_dev;
        e->size = st.st_size;
        e->mtime = st.st_mtim;
        e->seen = true;
        bool foreign = false;
        if (!index_file(x, e, &foreign, err, sizeof err)) {
            ds4_kvdisk_index_log(x, true, "kv-disk: ignoring %s: %s", e->name, err);
            if (foreign) e->skip = true;
            else { remove_judged(x, e); e->seen = false; }
        }
        /* keep the array sorted for bsearch */
        qsort(x->ents, (size_t)x->n_ents, sizeof *x->ents, by_name);
    }
    closedir(dir);
    int k = 0;
    for (int i = 0; i < x->n_ents; i++) {
        if (x->ents[i].seen) x->ents[k++] = x->ents[i];
        else entry_free(&x->ents[i]);
    }
    x->n_ents = k;
}

static ds4_kvdisk_rank rank_of(const ds4_kvdisk_entry *e) {
    return (ds4_kvdisk_rank){.last_used = e->h.last_used, .hits = e->h.hits, .mtime = e->mtime};
}

uint64_t ds4_kvdisk_index_bytes(const ds4_kvdisk_index *x) {
    uint64_t total = 0;
    for (int i = 0; i < x->n_ents; i++) total += (uint64_t)x->ents[i].size;
    return total;
}

int ds4_kvdisk_index_evict(ds4_kvdisk_index *x, uint64_t budget, const char *keep, uint64_t *freed) {
    for (int removed = 0;; removed++) {
        int worst = -1;
        for (int i = 0; i < x->n_ents; i++) {
            const ds4_kvdisk_entry *e = &x->ents[i];
            if (!strcmp(e->name, keep)) continue;
            ds4_kvdisk_rank a = rank_of(e), b = worst >= 0 ? rank_of(&x->ents[worst]) : a;
            if (worst < 0 || ds4_kvdisk_evict_first(&a, &b)) worst = i;
        }
        if (ds4_kvdisk_index_bytes(x) <= budget || worst < 0) return removed;
        ds4_kvdisk_entry *w = &x->ents[worst];
        ds4_kvdisk_index_log(x, false, "kv-disk: evicting %s (%u tokens, %u hits) to fit %llu MiB", w->name,
                             w->h.n_tokens, w->h.hits, (unsigned long long)(budget >> 20));
        if (freed) *freed += (uint64_t)w->size;
        unlinkat(x->dirfd, w->name, 0);
        remove_entry(x, w);
    }
}
