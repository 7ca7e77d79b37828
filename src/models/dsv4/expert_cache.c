/* expert_cache.c -- routed-expert slots filled by pread; contract in
 * expert_cache.h. */
#include "models/dsv4/expert_cache.h"
#include "format/gguf.h"
#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* O_DIRECT wants offset, length and buffer aligned to the logical block
 * size; 4 KiB covers every common device. Eight readers keep an SSD's queue
 * busy (one decode layer is 3 x n_expert_used reads). */
enum { IO_ALIGN = 4096, N_READERS = 8 };

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const ds4_tensor *routed(const ds4_layer *L, int j) {
    return j == 0 ? &L->gate_exps : j == 1 ? &L->up_exps : &L->down_exps;
}

static size_t expert_bytes(const ds4_tensor *t) { return (size_t)t->ne[1] * t->row_bytes; }

/* ------------------------------------------------------------ bookkeeping */

/* The slot table and eviction policy, shared by the cache and the trace
 * simulator so the measured policy is the one that runs. A key is
 * layer * n_expert + e. */
typedef struct {
    ds4_evict_policy policy;
    int n_keys, n_slots;
    int32_t *where;      /* [n_keys] slot or -1 */
    int32_t *key;        /* [n_slots] key or -1 */
    uint64_t *last_use;  /* [n_slots] tick of the last access */
    uint64_t *pin;       /* [n_slots] pinned while pin >= epoch: needed by the current layer
                            (or, = epoch + 1, prefetched for the next one) */
    uint8_t *busy;       /* [n_slots] being read: not evictable */
    uint32_t *freq;      /* [n_keys] aged access counts */
    uint64_t tick, epoch, since_aging;
} slot_index;

static bool index_init(slot_index *ix, ds4_evict_policy policy, int n_keys, int n_slots) {
    memset(ix, 0, sizeof *ix);
    ix->policy = policy;
    ix->n_keys = n_keys;
    ix->n_slots = n_slots;
    ix->where = malloc((size_t)n_keys * sizeof *ix->where);
    ix->key = malloc((size_t)n_slots * sizeof *ix->key);
    ix->last_use = calloc((size_t)n_slots, sizeof *ix->last_use);
    ix->pin = calloc((size_t)n_slots, sizeof *ix->pin);
    ix->busy = calloc((size_t)n_slots, 1);
    ix->freq = calloc((size_t)n_keys, sizeof *ix->freq);
    if (!ix->where || !ix->key || !ix->last_use || !ix->pin || !ix->busy || !ix->freq) return false;
    for (int i = 0; i < n_keys; i++) ix->where[i] = -1;
    for (int i = 0; i < n_slots; i++) ix->key[i] = -1;
    ix->epoch = 1;
    return true;
}

static void index_free(slot_index *ix) {
    free(ix->where); free(ix->key); free(ix->last_use); free(ix->pin); free(ix->busy); free(ix->freq);
}

/* One access: counts it and returns its slot or -1. Every count halves once
 * per 10 x n_slots accesses so old popularity fades (the reset of TinyLFU,
 * Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission
 * Policy", 2017). */
static int index_touch(slot_index *ix, int key) {
    ix->tick++;
    if (ix->freq[key] < UINT32_MAX) ix->freq[key]++;
    if (++ix->since_aging >= 10 * (uint64_t)ix->n_slots) {
        for (int i = 0; i < ix->n_keys; i++) ix->freq[i] >>= 1;
        ix->since_aging = 0;
    }
    int s = ix->where[key];
    if (s >= 0) { ix->last_use[s] = ix->tick; ix->pin[s] = ix->epoch; }
    return s;
}

/* The slot to give up: empty first, else the lowest count (LFU) or the
 * oldest use (LRU, and LFU's tie break); never pinned or busy ones. */
static int index_victim(const slot_index *ix) {
    int best = -1;
    for (int s = 0; s < ix->n_slots; s++) {
        if (ix->pin[s] >= ix->epoch || ix->busy[s]) continue;
        if (ix->key[s] < 0) return s;
        if (best < 0) { best = s; continue; }
        if (ix->policy == DS4_EVICT_LFU_AGED) {
            uint32_t fs = ix->freq[ix->key[s]], fb = ix->freq[ix->key[best]];
            if (fs != fb) { if (fs < fb) best = s; continue; }
        }
        if (ix->last_use[s] < ix->last_use[best]) best = s;
    }
    return best;
}

static void index_assign(slot_index *ix, int slot, int key, bool pin) {
    if (ix->key[slot] >= 0) ix->where[ix->key[slot]] = -1;
    ix->key[slot] = key;
    ix->where[key] = slot;
    ix->last_use[slot] = ix->tick;
    if (pin) ix->pin[slot] = ix->epoch;
}

static void index_forget(slot_index *ix, int slot) {
    if (ix->key[slot] >= 0) ix->where[ix->key[slot]] = -1;
    ix->key[slot] = -1;
}

uint64_t ds4_expert_policy_simulate(ds4_evict_policy policy, int n_layer, int n_expert, int n_slots,
                                    const int32_t *trace, size_t n_ints, uint64_t *accesses) {
    slot_index ix = {0};
    uint64_t hits = 0, n_acc = 0;
    if (n_layer <= 0 || n_expert <= 0 || n_slots <= 0 || !index_init(&ix, policy, n_layer * n_expert, n_slots)) {
        index_free(&ix);
        if (accesses) *accesses = 0;
        return 0;
    }
    for (size_t i = 0; i + 2 <= n_ints;) {
        int layer = trace[i], n = trace[i + 1];
        if (layer < 0 || layer >= n_layer || n < 0 || i + 2 + (size_t)n > n_ints) break;
        const int32_t *ids = trace + i + 2;
        ix.epoch++;
        for (int j = 0; j < n; j++) {
            if (ids[j] < 0 || ids[j] >= n_expert) continue;
            int key = layer * n_expert + ids[j];
            n_acc++;
            if (index_touch(&ix, key) >= 0) { hits++; continue; }
            int v = index_victim(&ix);
            if (v >= 0) index_assign(&ix, v, key, true);
        }
        i += 2 + (size_t)n;
    }
    index_free(&ix);
    if (accesses) *accesses = n_acc;
    return hits;
}

/* ------------------------------------------------------------------ cache */

enum { SLOT_EMPTY, SLOT_LOADING, SLOT_READY, SLOT_FAILED };
enum { WAIT_NONE = -1, WAIT_SETTLED = -2 };

typedef struct { int shard; uint64_t offset; size_t bytes; } expert_src;   /* expert 0 of one matrix */

struct ds4_expert_cache {
    const ds4_model *m;
    int n_layer, n_expert;
    slot_index ix;
    int n_shards, *fd;
    bool direct;
    uint64_t test_fail_read;         /* DS4_TEST_EXPERT_READ_EIO (0: off) */
    atomic_uint_fast64_t test_reads; /* matrix reads started, for that hook */
    expert_src *src;                 /* [n_layer * 3] */
    size_t region_off[3], slot_bytes;
    uint8_t *pool, *state;           /* state: [n_slots] SLOT_* */
    uint8_t *parts_left, *part_failed;   /* [n_slots] matrices still being read / any failed */
    int32_t *distinct, *pending;     /* [n_expert] keys of the current layer */
    uint8_t *seen;
    uint8_t *guessed;                /* [n_expert] experts predicted for layer guess_layer */
    int guess_layer;                 /* -1: no prediction pending */
    int n_pending, pending_head, in_use;
    FILE *trace;

    pthread_t readers[N_READERS];
    int n_readers;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int32_t *queue;                  /* ring of slot * 3 + matrix to read, capacity 3 * n_slots */
    int q_head, q_len, in_flight;
    int waiting_for;                 /* the slot the engine's thread waits for, or WAIT_* */
    bool stop, failed;
    double busy_since;
    ds4_expert_stats st;
    char err[256];
};

/* A slot's region for matrix j: the widest expert of any layer (types may
 * differ per layer), plus the up to IO_ALIGN - 1 bytes an aligned read
 * starts early. */
static size_t region_bytes(const ds4_model *m, int j) {
    size_t widest = 0;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        size_t b = expert_bytes(routed(&m->layers[l], j));
        if (b > widest) widest = b;
    }
    return round_up(widest, IO_ALIGN) + IO_ALIGN;
}

size_t ds4_expert_slot_bytes(const ds4_model *m) {
    return region_bytes(m, 0) + region_bytes(m, 1) + region_bytes(m, 2);
}

uint64_t ds4_expert_routed_bytes(const ds4_model *m) {
    uint64_t total = 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int j = 0; j < 3; j++) total += (uint64_t)expert_bytes(routed(&m->layers[l], j)) * m->cfg.n_expert;
    return total;
}

static const ds4_gguf_tensor *gguf_tensor_of(const ds4_gguf *g, const void *data) {
    for (size_t i = 0; i < ds4_gguf_n_tensors(g); i++)
        if (ds4_gguf_tensor_at(g, i)->data == data) return ds4_gguf_tensor_at(g, i);
    return NULL;
}

/* Reads bytes [off, off+len) of fd into dst, whose address is congruent to
 * off modulo IO_ALIGN, with an aligned O_DIRECT read when direct. */
static bool read_span(int fd, bool direct, bool inject_eio, uint8_t *dst, uint64_t off, size_t len, char *err,
                      size_t errlen) {
    const uint64_t start = direct ? off / IO_ALIGN * IO_ALIGN : off;
    const size_t want = (size_t)(off - start) + len;
    const size_t ask = direct ? round_up(want, IO_ALIGN) : want;
    uint8_t *buf = dst - (off - start);
    size_t got = 0;
    while (got < want) {
        ssize_t r = inject_eio ? (errno = EIO, -1) : pread(fd, buf + got, ask - got, (off_t)(start + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { snprintf(err, errlen, "expert read at offset %llu failed: %s", (unsigned long long)off, strerror(errno)); return false; }
        if (r == 0) {
            snprintf(err, errlen, "model file truncated: expert bytes at offset %llu..%llu are missing",
                     (unsigned long long)(start + got), (unsigned long long)(off + len));
            return false;
        }
        got += (size_t)r;
    }
    if (!direct) posix_fadvise(fd, (off_t)start, (off_t)want, POSIX_FADV_DONTNEED);
    return true;
}

/* Reads matrix j of key's expert into its slot region; false on failure (err). */
static bool read_part(ds4_expert_cache *c, int slot, int key, int j, char *err, size_t errlen) {
    const int layer = key / c->n_expert, e = key % c->n_expert;
    const expert_src *s = &c->src[layer * 3 + j];
    const uint64_t off = s->offset + (uint64_t)e * s->bytes;
    uint8_t *dst = c->pool + (size_t)slot * c->slot_bytes + c->region_off[j] + off % IO_ALIGN;
    const bool inject_eio = c->test_fail_read && atomic_fetch_add(&c->test_reads, 1) + 1 == c->test_fail_read;
    return read_span(c->fd[s->shard], c->direct, inject_eio, dst, off, s->bytes, err, errlen);
}

/* Readers take one matrix of one expert at a time, so the three matrices of
 * an expert and the experts of a layer are all in flight together. */
static void *reader_main(void *arg) {
    ds4_expert_cache *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && c->q_len == 0) pthread_cond_wait(&c->work, &c->mu);
        if (c->stop) break;
        const int part = c->queue[c->q_head];
        c->q_head = (c->q_head + 1) % (3 * c->ix.n_slots);
        c->q_len--;
        const int slot = part / 3, j = part % 3, key = c->ix.key[slot];
        if (c->in_flight++ == 0) c->busy_since = now_s();
        pthread_mutex_unlock(&c->mu);
        char err[200];
        const bool ok = read_part(c, slot, key, j, err, sizeof err);
        pthread_mutex_lock(&c->mu);
        if (--c->in_flight == 0) c->st.read_seconds += now_s() - c->busy_since;
        if (ok) c->st.bytes_read += c->src[(key / c->n_expert) * 3 + j].bytes;
        else if (!c->failed) { snprintf(c->err, sizeof c->err, "%s", err); c->failed = true; }
        c->part_failed[slot] |= !ok;
        if (--c->parts_left[slot]) continue;
        c->ix.busy[slot] = 0;
        if (!c->part_failed[slot]) {
            c->state[slot] = SLOT_READY;
        } else {
            /* zeros, never stale bytes; and forget the key so no later fetch
             * mistakes them for the expert */
            memset(c->pool + (size_t)slot * c->slot_bytes, 0, c->slot_bytes);
            c->state[slot] = SLOT_FAILED;
            index_forget(&c->ix, slot);
        }
        /* only the engine's thread waits, and only for one slot or for the
         * readers to settle: waking it for any other slot would cost a
         * context switch per read on a machine whose cores are computing */
        if (c->waiting_for == slot || (c->waiting_for == WAIT_SETTLED && !c->q_len && !c->in_flight))
            pthread_cond_signal(&c->done);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Under mu: until slot's read has ended. */
static void wait_slot(ds4_expert_cache *c, int slot) {
    c->waiting_for = slot;
    while (c->state[slot] == SLOT_LOADING) pthread_cond_wait(&c->done, &c->mu);
    c->waiting_for = WAIT_NONE;
}

/* Under mu: until no read is queued or in flight. */
static void wait_settled(ds4_expert_cache *c) {
    c->waiting_for = WAIT_SETTLED;
    while (c->q_len || c->in_flight) pthread_cond_wait(&c->done, &c->mu);
    c->waiting_for = WAIT_NONE;
}

/* Under mu: key goes into slot and its three matrices are queued. */
static void issue(ds4_expert_cache *c, int slot, int key, bool pin) {
    index_assign(&c->ix, slot, key, pin);
    c->ix.busy[slot] = 1;
    c->state[slot] = SLOT_LOADING;
    c->parts_left[slot] = 3;
    c->part_failed[slot] = 0;
    /* one reader per matrix: a broadcast would wake all of them for three
     * reads, and the rest would only take the lock and sleep again */
    for (int j = 0; j < 3; j++) {
        c->queue[(c->q_head + c->q_len++) % (3 * c->ix.n_slots)] = slot * 3 + j;
        pthread_cond_signal(&c->work);
    }
}

/* Under mu: issue the layer's remaining experts while slots can be freed. */
static void refill(ds4_expert_cache *c) {
    while (c->pending_head < c->n_pending) {
        int v = index_victim(&c->ix);
        if (v < 0) break;
        issue(c, v, c->pending[c->pending_head++], true);
    }
}

bool ds4_expert_cache_direct(const ds4_expert_cache *c) { return c->direct; }
bool ds4_expert_cache_take_error(ds4_expert_cache *c, char *err, size_t errlen) {
    pthread_mutex_lock(&c->mu);
    const bool failed = c->failed;
    /* a slot is forgotten only when its last matrix is read, and reads of a
     * later layer (a guess, a prefill read-ahead) may still be in flight:
     * settle them all, so the next fetch finds no slot failing under it */
    if (failed) wait_settled(c);
    if (failed) snprintf(err, errlen, "%s", c->err);
    /* the failed slots were forgotten: the next fetch reads them again */
    c->failed = false;
    pthread_mutex_unlock(&c->mu);
    return failed;
}
void ds4_expert_cache_record(ds4_expert_cache *c, FILE *trace) { c->trace = trace; }

ds4_expert_stats ds4_expert_cache_stats(const ds4_expert_cache *c) {
    pthread_mutex_lock((pthread_mutex_t *)&c->mu);
    ds4_expert_stats st = c->st;
    pthread_mutex_unlock((pthread_mutex_t *)&c->mu);
    return st;
}

/* O_DIRECT is refused at open by some filesystems and at the first read by
 * others; both mean: read buffered. */
static bool open_shards(ds4_expert_cache *c, const ds4_gguf *g, char *err, size_t errlen) {
    c->n_shards = ds4_gguf_n_shards(g);
    c->fd = malloc((size_t)c->n_shards * sizeof *c->fd);
    if (!c->fd) { snprintf(err, errlen, "out of memory"); return false; }
    for (int i = 0; i < c->n_shards; i++) c->fd[i] = -1;
    c->direct = !getenv("DS4_TEST_EXPERT_NO_DIRECT");
    for (int i = 0; i < c->n_shards; i++) {
        const char *path = ds4_gguf_shard_path(g, i);
        if (!path) { snprintf(err, errlen, "--ssd-streaming needs a model file"); return false; }
        c->fd[i] = c->direct ? open(path, O_RDONLY | O_DIRECT | O_CLOEXEC) : -1;
        if (c->fd[i] < 0) c->fd[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (c->fd[i] < 0) { snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno)); return false; }
        posix_fadvise(c->fd[i], 0, 0, POSIX_FADV_RANDOM);
        if (!(fcntl(c->fd[i], F_GETFL) & O_DIRECT)) c->direct = false;
    }
    for (int i = 0; c->direct && i < c->n_shards; i++) {
        ssize_t r;
        do r = pread(c->fd[i], c->pool, IO_ALIGN, 0); while (r < 0 && errno == EINTR);
        if (r < 0 && errno != EINVAL) { snprintf(err, errlen, "cannot read %s: %s", ds4_gguf_shard_path(g, i), strerror(errno)); return false; }
        if (r < 0) c->direct = false;
    }
    if (!c->direct) {
        for (int i = 0; i < c->n_shards; i++) fcntl(c->fd[i], F_SETFL, fcntl(c->fd[i], F_GETFL) & ~O_DIRECT);
        ds4_log(DS4_LOG_WARN, "ds4: ssd-streaming: the filesystem refuses O_DIRECT; reading through the page cache "
                              "and dropping what was read\n");
    }
    return true;
}

ds4_expert_cache *ds4_expert_cache_new(const ds4_gguf *g, const ds4_model *m, int n_slots, ds4_evict_policy policy,
                                       char *err, size_t errlen) {
    const ds4_config *cf = &m->cfg;
    if (n_slots < cf->n_expert_used) {
        snprintf(err, errlen, "expert cache of %d slots is smaller than one layer's %d selected experts",
                 n_slots, cf->n_expert_used);
        return NULL;
    }
    const int n_keys = cf->n_layer * cf->n_expert;
    if (n_slots > n_keys) n_slots = n_keys;
    ds4_expert_cache *c = calloc(1, sizeof *c);
    if (!c) { snprintf(err, errlen, "out of memory"); return NULL; }
    c->m = m;
    c->n_layer = cf->n_layer;
    c->n_expert = cf->n_expert;
    c->in_use = -1;
    c->waiting_for = WAIT_NONE;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->done, NULL);
    c->slot_bytes = ds4_expert_slot_bytes(m);
    c->region_off[1] = region_bytes(m, 0);
    c->region_off[2] = c->region_off[1] + region_bytes(m, 1);
    c->src = calloc((size_t)cf->n_layer * 3, sizeof *c->src);
    c->state = calloc((size_t)n_slots, 1);
    c->distinct = malloc((size_t)cf->n_expert * sizeof *c->distinct);
    c->pending = malloc((size_t)cf->n_expert * sizeof *c->pending);
    c->seen = calloc((size_t)cf->n_expert, 1);
    c->guessed = calloc((size_t)cf->n_expert, 1);
    c->guess_layer = -1;
    c->queue = malloc((size_t)n_slots * 3 * sizeof *c->queue);
    c->parts_left = calloc((size_t)n_slots, 1);
    c->part_failed = calloc((size_t)n_slots, 1);
    const size_t pool_bytes = (size_t)n_slots * c->slot_bytes;
    if (posix_memalign((void **)&c->pool, IO_ALIGN, pool_bytes)) c->pool = NULL;
    /* commit the slots now, not at their first read: a page's first touch
     * (zeroing it, on a VM also the host backing it) would otherwise land in
     * a decode step, and memory that is not there fails here, at start;
     * EINVAL is a kernel before 5.14, which faults the pages in later */
    if (c->pool && madvise(c->pool, pool_bytes, MADV_POPULATE_WRITE) && errno != EINVAL) {
        free(c->pool);
        c->pool = NULL;
    }
    if (!c->src || !c->state || !c->distinct || !c->pending || !c->seen || !c->guessed || !c->queue || !c->pool ||
        !c->parts_left || !c->part_failed ||
        !index_init(&c->ix, policy, n_keys, n_slots)) {
        snprintf(err, errlen, "out of memory for %d expert slots (%.1f MiB)", n_slots,
                 (double)n_slots * (double)c->slot_bytes / (1 << 20));
        ds4_expert_cache_free(c);
        return NULL;
    }
    for (int l = 0; l < cf->n_layer; l++)
        for (int j = 0; j < 3; j++) {
            const ds4_tensor *t = routed(&m->layers[l], j);
            const ds4_gguf_tensor *gt = gguf_tensor_of(g, t->data);
            if (!gt) { snprintf(err, errlen, "routed tensor of layer %d not found in the file", l); ds4_expert_cache_free(c); return NULL; }
            c->src[l * 3 + j] = (expert_src){gt->shard, gt->file_offset, expert_bytes(t)};
        }
    const char *fail_read = getenv("DS4_TEST_EXPERT_READ_EIO");
    c->test_fail_read = fail_read ? strtoull(fail_read, NULL, 10) : 0;
    atomic_init(&c->test_reads, 0);
    if (!open_shards(c, g, err, errlen)) { ds4_expert_cache_free(c); return NULL; }
    for (int i = 0; i < N_READERS; i++) {
        if (pthread_create(&c->readers[i], NULL, reader_main, c)) break;
        c->n_readers++;
    }
    if (!c->n_readers) { snprintf(err, errlen, "cannot start the expert reader threads"); ds4_expert_cache_free(c); return NULL; }
    return c;
}

void ds4_expert_cache_free(ds4_expert_cache *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->work);
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_readers; i++) pthread_join(c->readers[i], NULL);
    for (int i = 0; c->fd && i < c->n_shards; i++) if (c->fd[i] >= 0) close(c->fd[i]);
    free(c->fd);
    index_free(&c->ix);
    free(c->src); free(c->state); free(c->distinct); free(c->pending); free(c->seen); free(c->queue); free(c->pool);
    free(c->parts_left); free(c->part_failed); free(c->guessed);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->work);
    pthread_cond_destroy(&c->done);
    free(c);
}

/* Under mu: the previous get's expert has been computed. */
static void release_in_use(ds4_expert_cache *c) {
    if (c->in_use < 0) return;
    c->ix.pin[c->in_use] = 0;
    c->in_use = -1;
    refill(c);
}

/* Under mu: a batch that needs (nearly) every expert of a layer is a
 * prefill; its next layer will too, so it is read now, into slots reserved
 * for the next fetch, while this layer computes. Only when the pool holds two
 * whole layers, so this layer's own experts are never displaced. */
static void prefetch_next_layer(ds4_expert_cache *c, int layer, int n_distinct) {
    if (layer + 1 >= c->n_layer || 10 * n_distinct < 9 * c->n_expert || c->ix.n_slots < 2 * c->n_expert) return;
    for (int e = 0; e < c->n_expert; e++) {
        const int key = (layer + 1) * c->n_expert + e;
        if (c->ix.where[key] >= 0) continue;
        const int v = index_victim(&c->ix);
        if (v < 0) return;
        issue(c, v, key, false);
        c->ix.pin[v] = c->ix.epoch + 1;
        c->st.prefetched++;
    }
}

/* Under mu: the distinct experts of a batch's routing into c->distinct, in
 * ascending order (as the forward pass consumes them); returns how many. */
static int distinct_experts(ds4_expert_cache *c, const int *ids, int n_ids) {
    for (int i = 0; i < n_ids; i++) c->seen[ids[i]] = 1;
    int n = 0;
    for (int e = 0; e < c->n_expert; e++)
        if (c->seen[e]) { c->seen[e] = 0; c->distinct[n++] = e; }
    return n;
}

/* Under mu: scores the pending prediction against the real routing of its
 * layer (n distinct experts in c->distinct) and drops it. */
static void score_prediction(ds4_expert_cache *c, int layer, int n) {
    if (c->guess_layer != layer) return;
    for (int i = 0; i < n; i++) c->st.predicted_right += c->guessed[c->distinct[i]];
    memset(c->guessed, 0, (size_t)c->n_expert);
    c->guess_layer = -1;
}

void ds4_expert_cache_fetch(ds4_expert_cache *c, int layer, const int *ids, int n_tokens, int k) {
    pthread_mutex_lock(&c->mu);
    c->in_use = -1;
    c->ix.epoch++;
    c->n_pending = c->pending_head = 0;
    if (layer == 0) c->st.tokens += (uint64_t)n_tokens;
    const int n = distinct_experts(c, ids, n_tokens * k);
    score_prediction(c, layer, n);
    if (c->trace) {
        int32_t head[2] = {layer, n};
        fwrite(head, sizeof head, 1, c->trace);
        fwrite(c->distinct, sizeof *c->distinct, (size_t)n, c->trace);
    }
    /* ascending expert order, as the forward pass consumes them */
    for (int i = 0; i < n; i++) {
        const int key = layer * c->n_expert + c->distinct[i];
        if (index_touch(&c->ix, key) >= 0) { c->st.hits++; continue; }
        c->st.misses++;
        c->pending[c->n_pending++] = key;
    }
    refill(c);
    if (c->pending_head == c->n_pending) prefetch_next_layer(c, layer, n);
    pthread_mutex_unlock(&c->mu);
}

void ds4_expert_cache_predict(ds4_expert_cache *c, int layer, const int *ids, int n_tokens, int k) {
    pthread_mutex_lock(&c->mu);
    memset(c->guessed, 0, (size_t)c->n_expert);
    c->guess_layer = layer;
    /* c->distinct is the fetch's scratch (its misses live on in pending) */
    const int n = distinct_experts(c, ids, n_tokens * k);
    bool room = true;
    for (int i = 0; i < n; i++) {
        const int key = layer * c->n_expert + c->distinct[i];
        c->guessed[c->distinct[i]] = 1;
        c->st.predicted++;
        int slot = c->ix.where[key];
        if (slot < 0) {
            /* only slots nobody needs before that fetch: the current layer's
             * experts stay pinned, so a wrong guess costs a read, never a
             * stall of this layer */
            if (!room || (slot = index_victim(&c->ix)) < 0) { room = false; continue; }
            issue(c, slot, key, false);
            c->st.predicted_read++;
        }
        c->ix.pin[slot] = c->ix.epoch + 1;
    }
    pthread_mutex_unlock(&c->mu);
}

void ds4_expert_cache_get(ds4_expert_cache *c, int layer, int e, ds4_tensor views[3]) {
    const int key = layer * c->n_expert + e;
    pthread_mutex_lock(&c->mu);
    if (c->in_use >= 0 && c->ix.key[c->in_use] != key) release_in_use(c);
    int slot = c->ix.where[key];
    if (slot < 0 && !c->failed) {
        /* only reachable when the forward pass asks for an expert its fetch did not name */
        snprintf(c->err, sizeof c->err, "expert %d of layer %d was not fetched", e, layer);
        c->failed = true;
    }
    if (slot >= 0 && c->state[slot] == SLOT_LOADING) {
        const double t0 = now_s();
        wait_slot(c, slot);
        c->st.stall_seconds += now_s() - t0;
    }
    if (slot < 0 || c->state[slot] != SLOT_READY) {
        /* any slot will do as long as it reads as zeros: the eval fails anyway */
        slot = c->ix.n_slots - 1;
        wait_slot(c, slot);
        memset(c->pool + (size_t)slot * c->slot_bytes, 0, c->slot_bytes);
        index_forget(&c->ix, slot);
        c->state[slot] = SLOT_EMPTY;
    } else {
        c->in_use = slot;
    }
    pthread_mutex_unlock(&c->mu);
    const uint8_t *base = c->pool + (size_t)slot * c->slot_bytes;
    for (int j = 0; j < 3; j++) {
        const expert_src *s = &c->src[layer * 3 + j];
        views[j] = *routed(&c->m->layers[layer], j);
        views[j].data = base + c->region_off[j] + (s->offset + (uint64_t)e * s->bytes) % IO_ALIGN;
        views[j].ne[2] = 1;
    }
}

int ds4_expert_cache_preload(ds4_expert_cache *c, const uint32_t *hist, int n) {
    const int n_keys = c->ix.n_keys;
    if (n > c->ix.n_slots) n = c->ix.n_slots;
    int32_t *order = malloc((size_t)n_keys * sizeof *order);
    if (!order || n <= 0) { free(order); return 0; }
    for (int i = 0; i < n_keys; i++) order[i] = i;
    /* partial selection of the n largest counts; ties keep the lower key */
    for (int i = 0; i < n; i++) {
        int best = i;
        for (int j = i + 1; j < n_keys; j++)
            if (hist[order[j]] > hist[order[best]]) best = j;
        int32_t t = order[i]; order[i] = order[best]; order[best] = t;
    }
    pthread_mutex_lock(&c->mu);
    int issued = 0;
    for (int i = 0; i < n; i++) {
        if (c->ix.where[order[i]] >= 0) continue;
        int v = index_victim(&c->ix);
        if (v < 0) break;
        issue(c, v, order[i], false);
        /* counts as seen once, so LFU does not drop it before anything else */
        c->ix.freq[order[i]] = 1;
        issued++;
    }
    wait_settled(c);
    c->st.preloaded += (uint64_t)issued;
    pthread_mutex_unlock(&c->mu);
    free(order);
    return issued;
}

uint32_t *ds4_expert_static_histogram(const ds4_model *m) {
    const ds4_config *c = &m->cfg;
    uint32_t *hist = calloc((size_t)c->n_layer * c->n_expert, sizeof *hist);
    if (!hist) return NULL;
    for (int l = 0; l < c->n_layer; l++) {
        const ds4_layer *L = &m->layers[l];
        uint32_t *h = hist + (size_t)l * c->n_expert;
        if (L->tid2eid) {
            for (size_t i = 0; i < (size_t)c->n_vocab * c->n_expert_used; i++) h[L->tid2eid[i]]++;
        } else if (L->exp_probs_b) {
            /* rank by bias: the expert with the largest bias gets n_expert */
            for (int e = 0; e < c->n_expert; e++) {
                uint32_t above = 0;
                for (int o = 0; o < c->n_expert; o++) above += L->exp_probs_b[o] > L->exp_probs_b[e];
                h[e] = (uint32_t)c->n_expert - above;
            }
        }
    }
    return hist;
}

/* ------------------------------------------------------- resident weights */

typedef struct { uint64_t lo, hi; } span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Replaces [lo, hi) of a shard's mapping (page aligned) with an anonymous
 * copy of the same bytes. */
static bool copy_range(int fd, uint8_t *base, uint64_t lo, uint64_t hi, uint64_t file_size, char *err, size_t errlen) {
    if (hi <= lo) return true;
    void *p = mmap(base + lo, (size_t)(hi - lo), PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { snprintf(err, errlen, "cannot map resident weights: %s", strerror(errno)); return false; }
    const uint64_t end = hi < file_size ? hi : file_size;
    if (end > lo && !read_span(fd, false, false, base + lo, lo, (size_t)(end - lo), err, errlen)) return false;
    mprotect(p, (size_t)(hi - lo), PROT_READ);
    return true;
}

bool ds4_expert_cache_make_resident(const ds4_gguf *g, const ds4_model *m, char *err, size_t errlen) {
    const long page = sysconf(_SC_PAGESIZE);
    const int n_layer = m->cfg.n_layer;
    span *sp = malloc((size_t)n_layer * 3 * sizeof *sp);
    bool ok = sp != NULL;
    if (!ok) snprintf(err, errlen, "out of memory");
    for (int sh = 0; ok && sh < ds4_gguf_n_shards(g); sh++) {
        const char *path = ds4_gguf_shard_path(g, sh);
        uint8_t *base = NULL;
        uint64_t file_size = 0;
        for (size_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
            const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
            if (t->shard != sh) continue;
            base = (uint8_t *)t->data - t->file_offset;
            if (t->file_offset + t->n_bytes > file_size) file_size = t->file_offset + t->n_bytes;
        }
        if (!base || !path) continue;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) { snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno)); ok = false; break; }
        /* no readahead from the resident ranges into the routed ones */
        posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
        /* routed ranges shrunk to whole pages: only those stay file-backed */
        int n = 0;
        for (int l = 0; l < n_layer; l++)
            for (int j = 0; j < 3; j++) {
                const ds4_gguf_tensor *t = gguf_tensor_of(g, routed(&m->layers[l], j)->data);
                if (!t || t->shard != sh) continue;
                span s = {round_up(t->file_offset, (size_t)page), (t->file_offset + t->n_bytes) / (uint64_t)page * (uint64_t)page};
                if (s.hi > s.lo) sp[n++] = s;
            }
        qsort(sp, (size_t)n, sizeof *sp, span_cmp);
        uint64_t at = 0;
        for (int i = 0; ok && i < n; i++) {
            ok = copy_range(fd, base, at, sp[i].lo > at ? sp[i].lo : at, file_size, err, errlen);
            if (sp[i].hi > at) at = sp[i].hi;
        }
        if (ok) ok = copy_range(fd, base, at, round_up(file_size, (size_t)page), file_size, err, errlen);
        /* whatever opening the file read ahead into routed ranges goes: the
         * page cache must not become a second expert cache */
        for (int i = 0; ok && i < n; i++) {
            madvise(base + sp[i].lo, (size_t)(sp[i].hi - sp[i].lo), MADV_DONTNEED);   /* unmap what fault-around mapped */
            posix_fadvise(fd, (off_t)sp[i].lo, (off_t)(sp[i].hi - sp[i].lo), POSIX_FADV_DONTNEED);
        }
        close(fd);
    }
    free(sp);
    return ok;
}

/* ----------------------------------------------------------------- sizing */

int ds4_expert_cache_plan(const ds4_model *m, const ds4_expert_budget *b, char *note, size_t notelen,
                          char *err, size_t errlen) {
    const double GiB = 1 << 30;
    const uint64_t slot = ds4_expert_slot_bytes(m);
    const int k = m->cfg.n_expert_used;
    const uint64_t all = (uint64_t)m->cfg.n_layer * (uint64_t)m->cfg.n_expert;
    const uint64_t mem = b->mem_available ? b->mem_available : ds4_memory_available();
    const uint64_t fixed = b->resident_bytes + b->reserve_bytes;
    if (note && notelen) note[0] = 0;
    if (mem && fixed + (uint64_t)k * slot > mem) {
        snprintf(err, errlen, "ssd-streaming: the non-routed weights (%.2f GiB) plus KV and scratch (%.2f GiB) and "
                 "one layer's experts do not fit in %.2f GiB of available memory",
                 (double)b->resident_bytes / GiB, (double)b->reserve_bytes / GiB, (double)mem / GiB);
        return -1;
    }
    const uint64_t room = mem ? mem - fixed : UINT64_MAX;
    uint64_t slots;
    if (b->slots > 0) {
        slots = (uint64_t)b->slots;
        if (slots > all) slots = all;
        if (slots * slot > room) {
            snprintf(err, errlen, "ssd-streaming: %d expert slots need %.2f GiB but only %.2f GiB are available "
                     "after the non-routed weights, KV and scratch", b->slots, (double)slots * slot / GiB, (double)room / GiB);
            return -1;
        }
    } else {
        uint64_t budget = b->budget_bytes;
        if (!budget) {
            if (!mem) { snprintf(err, errlen, "ssd-streaming: cannot read the available memory; give --ssd-streaming-cache-experts"); return -1; }
            budget = (uint64_t)(0.8 * (double)mem) > fixed ? (uint64_t)(0.8 * (double)mem) - fixed : 0;
        } else if (budget > room) {
            if (note) snprintf(note, notelen, "requested %.2f GiB capped to the %.2f GiB that fit", (double)budget / GiB, (double)room / GiB);
            budget = room;
        }
        slots = budget / slot;
        if (slots > all) slots = all;
    }
    if (slots < (uint64_t)k) {
        snprintf(err, errlen, "ssd-streaming: an expert budget of %llu slots (%.1f MiB) is smaller than one layer's "
                 "%d selected experts (%.1f MiB)", (unsigned long long)slots, (double)slots * slot / (1 << 20), k,
                 (double)k * slot / (1 << 20));
        return -1;
    }
    return (int)slots;
}
