/* toolmem.h -- tool-call ids and the exact-DSML replay map.
 *
 * Contract
 * - ds4_toolmem_new_id() makes an unguessable id: prefix ("call_" or
 *   "toolu_") + 32 lowercase hex digits from getrandom(), checked unique
 *   against the map (and against `taken`, the ids already handed out in the
 *   same response).
 * - ds4_toolmem_put() remembers, for every id of one assistant tool-call
 *   turn, the exact DSML block the model sampled (one block shared by all
 *   ids of the turn). The map is a bounded LRU: at most max_ids ids and
 *   max_bytes of block text; the least recently used ids go first.
 * - ds4_toolmem_get() returns a malloc'ed copy of the block for an id (and
 *   marks it used), or NULL. Copies keep the map thread-safe: the renderer
 *   may run on a request thread while the worker inserts.
 * - All functions are thread-safe.
 */
#ifndef DS4_TOOLMEM_H
#define DS4_TOOLMEM_H

#include <stddef.h>

typedef struct ds4_toolmem ds4_toolmem;

ds4_toolmem *ds4_toolmem_new(size_t max_ids, size_t max_bytes);
void ds4_toolmem_free(ds4_toolmem *m);

/* 2*nbytes lowercase hex digits from getrandom() into out (NUL-terminated). */
void ds4_random_hex(char *out, int nbytes);
/* out must hold at least 40 bytes. */
void ds4_toolmem_new_id(ds4_toolmem *m, const char *prefix, const char *const *taken, int n_taken,
                        char *out);
void ds4_toolmem_put(ds4_toolmem *m, const char *const *ids, int n, const char *block, size_t len);
char *ds4_toolmem_get(ds4_toolmem *m, const char *id);
size_t ds4_toolmem_count(ds4_toolmem *m);
/* Calls fn for every id, most recently used first, under the map's lock (fn
 * must not call back into the map). The disk KV cache persists entries. */
void ds4_toolmem_each(ds4_toolmem *m, void (*fn)(void *ud, const char *id, const char *block, size_t len),
                      void *ud);

#endif
