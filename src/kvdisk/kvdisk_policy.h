/* kvdisk_policy.h -- when the disk KV cache saves and what it evicts.
 *
 * Contract
 * - Save moments (server): cold = a first prompt of [min, cold_max] tokens,
 *   saved before generation at the last <|User|> before the first
 *   <|Assistant|> if that is >= min tokens, else at (tokens - trim) aligned
 *   down to align; continued = every multiple of interval rounded up to
 *   align, in prefill or generation; evict = before an unrelated request
 *   replaces the live session; shutdown = at clean exit. The server adds
 *   branch checkpoints (server/job.c), saved with the continued reason:
 *   where a prompt parts from one it saw before.
 * - Eviction order: lowest score first, score = last-used time +
 *   6 h * log2(1 + hits) (a hit is worth six hours of recency, so this is
 *   not LRU: a file hit often outlives a newer one hit never); equal scores
 *   go oldest file first. The caller never offers the file it just wrote.
 * - Pure functions of their arguments.
 */
#ifndef DS4_KVDISK_POLICY_H
#define DS4_KVDISK_POLICY_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

typedef struct {
    const char *dir;             /* NULL: no disk cache */
    uint64_t space_bytes;        /* --kv-disk-space-mb (default 4096 MiB) */
    int min_tokens;              /* 512 */
    int cold_max_tokens;         /* 30000; 0 disables cold saves */
    int continued_interval;      /* 10000; 0 disables continued saves */
    int boundary_trim;           /* 32 */
    int boundary_align;          /* 2048 */
    bool reject_different_quant;
} ds4_kvdisk_opts;

void ds4_kvdisk_opts_default(ds4_kvdisk_opts *o);

/* The next position in (from, n_prompt] where prefill should stop for a save
 * (cold only when cold is set), or -1; *reason gets the save reason. */
int ds4_kvdisk_next_stop(const ds4_kvdisk_opts *o, const int32_t *toks, int n_prompt, int from, bool cold,
                         int32_t user_tok, int32_t assistant_tok, int *reason);
/* True when n tokens is an absolute continued-save frontier. */
bool ds4_kvdisk_is_frontier(const ds4_kvdisk_opts *o, int n);

/* One file as eviction sees it. */
typedef struct {
    uint64_t last_used;
    uint32_t hits;
    struct timespec mtime;
} ds4_kvdisk_rank;

/* Whether a should be evicted before b. */
bool ds4_kvdisk_evict_first(const ds4_kvdisk_rank *a, const ds4_kvdisk_rank *b);

#endif
