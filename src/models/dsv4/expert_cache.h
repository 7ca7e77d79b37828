/* expert_cache.h -- routed-expert streaming for models larger than RAM
 * (--ssd-streaming): the routed expert matrices are read from the GGUF with
 * pread into a fixed pool of slots; nothing else in the process reads them.
 *
 * Contract
 * - An expert is (layer, e): row block e of that layer's ffn_gate_exps,
 *   ffn_up_exps and ffn_down_exps. One slot holds one expert, each matrix in
 *   its own 4 KiB aligned region, at the same address offset modulo 4096 as
 *   in the file, so the reads can use O_DIRECT and the kernels see the same
 *   alignment as through the mapping. The bytes are the file's bytes: results
 *   equal the mmapped path bit for bit.
 * - ds4_expert_cache_new() opens every shard again, with O_DIRECT where the
 *   filesystem allows it; otherwise it says so in one line and reads through
 *   the page cache, dropping what it read (POSIX_FADV_DONTNEED) so the page
 *   cache does not hold a second copy. It starts a few reader threads and
 *   commits the slots' memory at once (MADV_POPULATE_WRITE), so a page's
 *   first touch never lands in a decode step.
 * - ds4_expert_cache_make_resident() replaces every non-routed byte range of
 *   the mapping with an anonymous copy (same addresses, same bytes), so the
 *   model's tensor views stay valid, the weights stay resident without the
 *   page cache, and a file truncated later can only surface as a read error
 *   of the cache, never as SIGBUS. The routed ranges are never touched.
 * - ds4_expert_cache_fetch(layer, ids, n_tokens, k): the routing of a batch
 *   (n_tokens x k expert ids). Every distinct expert is a hit (resident) or a
 *   miss; all misses that fit are issued to the readers at once and the
 *   layer's experts are pinned until the next fetch. Experts beyond the slot
 *   count are read as earlier ones are consumed (prefill streams the layer).
 *   A batch that needs at least 90% of a layer's experts also reads the next
 *   layer's missing experts ahead, when the pool holds two whole layers (the
 *   seed's prefill headroom); those slots are kept for the next fetch.
 * - ds4_expert_cache_predict(layer, ids, n_tokens, k): a guess at the next
 *   fetch of that layer (decode: the next layer's router run early). Its
 *   missing experts are read into slots that are neither pinned by the
 *   current layer nor being read, and those slots are kept through that
 *   fetch; no access is counted, so a wrong guess costs a read and a slot,
 *   never a result. The fetch of that layer scores the guess
 *   (predicted_right).
 * - ds4_expert_cache_get(layer, e, views[3]) waits for expert e (reading it
 *   now if the fetch could not) and fills gate/up/down views with ne[2] = 1
 *   pointing into its slot. Valid until the next get or fetch. Calls must
 *   follow the fetch of that layer, from one thread.
 * - A short read (file truncated) or read error makes the cache failed:
 *   views then point at zeroed memory, never at stale bytes, and
 *   ds4_expert_cache_take_error() returns true with the one-line message;
 *   the caller must drop the results. Taking the error clears it and the
 *   experts that failed were forgotten, so the next fetch reads them again:
 *   a transient error fails one evaluation, not the process.
 * - Test-only fault hooks (environment, read by ds4_expert_cache_new; never
 *   set outside tests): DS4_TEST_EXPERT_READ_EIO=N makes the Nth matrix read
 *   (1-based, preload included) fail once with EIO through the real error
 *   path; DS4_TEST_EXPERT_NO_DIRECT=1 takes the path of a filesystem that
 *   refuses O_DIRECT (buffered reads, one warning line).
 * - Eviction: LFU with aging (each access counts; all counts halve every
 *   10 x n_slots accesses; ties go to the least recently used) or plain
 *   LRU, for measurement. ds4_expert_policy_simulate() runs a recorded
 *   routing trace through the same bookkeeping without I/O.
 * - Preload reads the n hottest experts of a routing histogram into slots.
 */
#ifndef DS4_EXPERT_CACHE_H
#define DS4_EXPERT_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/mempages.h"   /* ds4_memory_available */
#include <stdio.h>
#include "models/dsv4/model.h"

struct ds4_gguf;

typedef enum { DS4_EVICT_LFU_AGED = 0, DS4_EVICT_LRU = 1 } ds4_evict_policy;

typedef struct {
    uint64_t hits, misses;        /* per (layer, expert) access of a fetch */
    uint64_t bytes_read, tokens;  /* tokens: batches' tokens seen at layer 0 */
    double read_seconds;          /* wall time with at least one read in flight */
    double stall_seconds;         /* time get() waited for a read */
    uint64_t preloaded;
    uint64_t prefetched;          /* whole next layers read ahead during prefill */
    uint64_t predicted;           /* experts named by predict() */
    uint64_t predicted_right;     /* of those, named again by the fetch of that layer */
    uint64_t predicted_read;      /* of those, read because they were not resident */
} ds4_expert_stats;

typedef struct ds4_expert_cache ds4_expert_cache;

/* Bytes of one slot (three aligned regions) and of all routed tensors. */
size_t ds4_expert_slot_bytes(const ds4_model *m);
uint64_t ds4_expert_routed_bytes(const ds4_model *m);

/* NULL on error (err: one line). n_slots >= n_expert_used. */
ds4_expert_cache *ds4_expert_cache_new(const struct ds4_gguf *g, const ds4_model *m, int n_slots,
                                       ds4_evict_policy policy, char *err, size_t errlen);
void ds4_expert_cache_free(ds4_expert_cache *c);
bool ds4_expert_cache_direct(const ds4_expert_cache *c);
/* false with err on a read or mapping failure. */
bool ds4_expert_cache_make_resident(const struct ds4_gguf *g, const ds4_model *m, char *err, size_t errlen);

void ds4_expert_cache_fetch(ds4_expert_cache *c, int layer, const int *ids, int n_tokens, int k);
/* A guess at the routing of a later fetch of layer (same shape as fetch):
 * missing experts start reading now into slots kept until that fetch. */
void ds4_expert_cache_predict(ds4_expert_cache *c, int layer, const int *ids, int n_tokens, int k);
void ds4_expert_cache_get(ds4_expert_cache *c, int layer, int e, ds4_tensor views[3]);
/* true (err: the line) if a read failed since the last call; clears it. */
bool ds4_expert_cache_take_error(ds4_expert_cache *c, char *err, size_t errlen);
ds4_expert_stats ds4_expert_cache_stats(const ds4_expert_cache *c);

/* Reads the n experts with the highest counts of hist[layer * n_expert + e]
 * (n capped at the slot count); returns how many were read. */
int ds4_expert_cache_preload(ds4_expert_cache *c, const uint32_t *hist, int n);
/* A histogram from the model alone: hash layers count their token table;
 * biased layers rank by the router's selection bias. Caller frees. */
uint32_t *ds4_expert_static_histogram(const ds4_model *m);

/* Hits of a routing trace under a policy with n_slots: the trace is a
 * sequence of records (layer, count, ids[count]) as int32, each one fetch. */
uint64_t ds4_expert_policy_simulate(ds4_evict_policy policy, int n_layer, int n_expert, int n_slots,
                                    const int32_t *trace, size_t n_ints, uint64_t *accesses);

/* Slot count for a budget (contract of --ssd-streaming-cache-experts):
 * slots > 0 is taken as is; else budget_bytes (0: automatic = 80% of the
 * memory available, minus resident and reserve bytes) divided by the slot
 * size. mem_available 0 means: read MemAvailable and the cgroup limit
 * (v1 memory.limit_in_bytes, v2 memory.max), the smaller wins. Returns -1
 * with one line in err when the resident weights plus reserve do not fit,
 * when an exact slot count does not fit, or when the budget holds fewer
 * experts than one layer selects; a byte budget above what fits is capped
 * (note says so). */
typedef struct {
    uint64_t resident_bytes, reserve_bytes, budget_bytes, mem_available;
    int slots;
} ds4_expert_budget;
int ds4_expert_cache_plan(const ds4_model *m, const ds4_expert_budget *b, char *note, size_t notelen,
                          char *err, size_t errlen);

/* Appends every fetch's record (see above) to the file (NULL: off). */
void ds4_expert_cache_record(ds4_expert_cache *c, FILE *trace);

#endif
