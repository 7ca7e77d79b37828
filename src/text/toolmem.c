#include "text/toolmem.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* One sampled block, shared by the ids of its turn. */
typedef struct block {
    int refs;
    size_t len;
    char text[];
} block;

typedef struct entry {
    struct entry *hnext;          /* hash chain */
    struct entry *prev, *next;    /* LRU list, most recent at head */
    block *blk;
    char id[];
} entry;

struct ds4_toolmem {
    pthread_mutex_t mu;
    entry **tab;
    size_t nbuckets, count, bytes, max_ids, max_bytes;
    entry *head, *tail;
};

static uint64_t hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

ds4_toolmem *ds4_toolmem_new(size_t max_ids, size_t max_bytes) {
    ds4_toolmem *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->max_ids = max_ids ? max_ids : 1;
    m->max_bytes = max_bytes;
    m->nbuckets = 1024;
    while (m->nbuckets < m->max_ids && m->nbuckets < (1u << 22)) m->nbuckets *= 2;
    m->tab = calloc(m->nbuckets, sizeof *m->tab);
    if (!m->tab) { free(m); return NULL; }
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

static entry **slot(ds4_toolmem *m, const char *id) {
    entry **p = &m->tab[hash(id) & (m->nbuckets - 1)];
    while (*p && strcmp((*p)->id, id)) p = &(*p)->hnext;
    return p;
}

static void lru_unlink(ds4_toolmem *m, entry *e) {
    if (e->prev) e->prev->next = e->next; else m->head = e->next;
    if (e->next) e->next->prev = e->prev; else m->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_front(ds4_toolmem *m, entry *e) {
    e->next = m->head;
    if (m->head) m->head->prev = e;
    m->head = e;
    if (!m->tail) m->tail = e;
}

static void drop(ds4_toolmem *m, entry *e) {
    entry **p = slot(m, e->id);
    *p = e->hnext;
    lru_unlink(m, e);
    if (--e->blk->refs == 0) {
        m->bytes -= e->blk->len;
        free(e->blk);
    }
    m->count--;
    free(e);
}

void ds4_toolmem_free(ds4_toolmem *m) {
    if (!m) return;
    while (m->tail) drop(m, m->tail);
    pthread_mutex_destroy(&m->mu);
    free(m->tab);
    free(m);
}

void ds4_random_hex(char *out, int nbytes) {
    unsigned char r[32];
    if (nbytes > 32) nbytes = 32;
    size_t got = 0;
    while (got < (size_t)nbytes) {
        ssize_t n = getrandom(r + got, (size_t)nbytes - got, 0);
        if (n > 0) got += (size_t)n;
    }
    for (int i = 0; i < nbytes; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
}

void ds4_toolmem_new_id(ds4_toolmem *m, const char *prefix, const char *const *taken, int n_taken,
                        char *out) {
    for (;;) {
        int o = snprintf(out, 40, "%.7s", prefix);
        ds4_random_hex(out + o, 16);
        bool dup = false;
        for (int i = 0; i < n_taken && !dup; i++) dup = taken[i] && !strcmp(taken[i], out);
        if (m) {
            pthread_mutex_lock(&m->mu);
            dup = dup || *slot(m, out);
            pthread_mutex_unlock(&m->mu);
        }
        if (!dup) return;
    }
}

void ds4_toolmem_put(ds4_toolmem *m, const char *const *ids, int n, const char *text, size_t len) {
    if (n <= 0 || len > m->max_bytes) return;
    block *b = malloc(sizeof *b + len + 1);
    if (!b) return;
    b->refs = 1; /* held by this call, so replacing a duplicate id cannot free it */
    b->len = len;
    memcpy(b->text, text, len);
    b->text[len] = 0;
    pthread_mutex_lock(&m->mu);
    m->bytes += len;
    for (int i = 0; i < n; i++) {
        entry **p = slot(m, ids[i]);
        if (*p) drop(m, *p);
        size_t il = strlen(ids[i]);
        entry *e = calloc(1, sizeof *e + il + 1);
        if (!e) continue;
        memcpy(e->id, ids[i], il + 1);
        e->blk = b;
        b->refs++;
        p = slot(m, ids[i]);
        *p = e;
        lru_front(m, e);
        m->count++;
    }
    if (--b->refs == 0) { m->bytes -= len; free(b); b = NULL; }
    /* Evict from the cold end; never the block just inserted. */
    while (m->tail && (m->count > m->max_ids || m->bytes > m->max_bytes) && m->tail->blk != b)
        drop(m, m->tail);
    pthread_mutex_unlock(&m->mu);
}

char *ds4_toolmem_get(ds4_toolmem *m, const char *id) {
    char *r = NULL;
    pthread_mutex_lock(&m->mu);
    entry *e = *slot(m, id);
    if (e) {
        lru_unlink(m, e);
        lru_front(m, e);
        r = malloc(e->blk->len + 1);
        if (r) memcpy(r, e->blk->text, e->blk->len + 1);
    }
    pthread_mutex_unlock(&m->mu);
    return r;
}

size_t ds4_toolmem_count(ds4_toolmem *m) {
    pthread_mutex_lock(&m->mu);
    size_t n = m->count;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void ds4_toolmem_each(ds4_toolmem *m, void (*fn)(void *ud, const char *id, const char *block, size_t len),
                      void *ud) {
    pthread_mutex_lock(&m->mu);
    for (entry *e = m->head; e; e = e->next) fn(ud, e->id, e->blk->text, e->blk->len);
    pthread_mutex_unlock(&m->mu);
}
