/* kvdisk_index.h -- the disk KV cache's view of its directory: one entry per
 * KVC file (header, key text, tool ids), the directory lock and eviction.
 *
 * Contract
 * - The directory is held as a descriptor and every file is named relative
 *   to it (openat and friends), so no path is ever built or truncated.
 * - Cache files are named <40 hex digits>.kv; other names are ignored except
 *   ".lock" and ".kvtmp.*" temp files (kvdisk_file.h).
 * - Lock: an exclusive flock on <dir>/.lock (created 0600). It is recursive
 *   within one index, so a locked save may call helpers that lock again.
 *   If the lock file cannot be opened or locked, the lock fails: nothing that
 *   writes or deletes proceeds unlocked.
 * - Every deletion happens under the lock: a rescan removes ".kvtmp." files
 *   only while the lock is held (writers hold it for their whole write, so a
 *   temp file seen then belongs to a writer that died; no PID is consulted),
 *   and damaged files are removed under the lock after checking that the
 *   name still points at the file that was judged.
 * - A rescan re-reads only new or changed files (inode, size, mtime), so
 *   files written by another process are seen. Files of another version or
 *   with unknown flags are logged once and left alone.
 * - Not thread-safe: one thread owns an index.
 */
#ifndef DS4_KVDISK_INDEX_H
#define DS4_KVDISK_INDEX_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "kvdisk/kvdisk_file.h"

/* warning: damaged files, I/O errors (servers also print these). */
typedef void (*ds4_kvdisk_log_fn)(void *ud, bool warning, const char *line);

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
} ds4_kvdisk_entry;

typedef struct {
    int dirfd;
    char *dir;                   /* for log lines only */
    int lock_fd, lock_depth;
    ds4_kvdisk_entry *ents;      /* sorted by name */
    int n_ents, cap_ents;
    ds4_kvdisk_log_fn log;
    void *log_ud;
} ds4_kvdisk_index;

/* Takes ownership of dirfd. */
bool ds4_kvdisk_index_init(ds4_kvdisk_index *x, int dirfd, const char *dir, ds4_kvdisk_log_fn log, void *log_ud);
void ds4_kvdisk_index_free(ds4_kvdisk_index *x);

__attribute__((format(printf, 3, 4)))
void ds4_kvdisk_index_log(const ds4_kvdisk_index *x, bool warning, const char *fmt, ...);

bool ds4_kvdisk_index_lock(ds4_kvdisk_index *x, char *err, size_t errlen);
void ds4_kvdisk_index_unlock(ds4_kvdisk_index *x);

void ds4_kvdisk_index_rescan(ds4_kvdisk_index *x);
ds4_kvdisk_entry *ds4_kvdisk_index_find(ds4_kvdisk_index *x, const char *name);
/* Logs why, removes the file (under the lock, if it is still the same file)
 * and the entry. */
void ds4_kvdisk_index_drop(ds4_kvdisk_index *x, ds4_kvdisk_entry *e, const char *why);
/* Removes files in eviction order (kvdisk_policy.h) until the .kv bytes fit
 * budget, never the file named keep; returns how many it removed and adds
 * their bytes to *freed (may be NULL). Caller holds the lock. */
int ds4_kvdisk_index_evict(ds4_kvdisk_index *x, uint64_t budget, const char *keep, uint64_t *freed);
/* Bytes of the .kv files the index holds. */
uint64_t ds4_kvdisk_index_bytes(const ds4_kvdisk_index *x);
/* Opens an entry's file (writable: for the in-place hit count): *fd and *in describe it, *L its layout.
 * False with err when it cannot be opened or its layout is damaged. */
bool ds4_kvdisk_index_open(const ds4_kvdisk_index *x, const ds4_kvdisk_entry *e, bool writable, int *fd,
                           ds4_kvc_input *in, ds4_kvc_layout *L, char *err, size_t errlen);

#endif
