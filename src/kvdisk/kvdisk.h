/* kvdisk.h -- the disk KV cache: session checkpoints in KVC files keyed by
 * the SHA-1 of their rendered text, so prefixes survive session switches
 * and server restarts.
 *
 * Contract
 * - File <dir>/<sha1 of key text>.kv (key text = the tokenizer-decoded bytes
 *   of the checkpoint tokens); format and crash-safe writing in
 *   kvdisk_file.h, save moments and eviction order in kvdisk_policy.h, the
 *   directory index and its lock in kvdisk_index.h.
 * - This is the state layer: sessions are opaque here. The layer that owns
 *   them supplies a ds4_kvdisk_host (engine_kvdisk.h binds engine sessions).
 * - Open: the directory is created 0700 if missing; one owned by another
 *   user or writable by group or others is refused (the files hold prompts
 *   in plain text). Files are created 0600.
 * - Save: under the directory lock, the payload is streamed from the session
 *   into the file (no whole-session copy in memory), then files are evicted
 *   until the budget fits, lowest score first (score = last-used time +
 *   6 h * log2(1 + hits), kvdisk_policy.h), never the file just written. A lock that cannot
 *   be taken fails the save.
 * - Lookup re-reads the directory (changed files only), so entries written
 *   by another server are seen. The longest key text that is a byte prefix
 *   of the prompt wins among files with at least min_tokens tokens, a saved
 *   context no larger than the session's, and (if asked) the same quant.
 *   Before use the chosen file's stored key text is read back and must hash
 *   to its name and be a prefix of the prompt, the CRC is checked over the
 *   whole file, then the payload is streamed into the session (the payload
 *   loaders refuse values no state holds, and the host refuses tokens that
 *   do not give the key text back). Damaged files are logged and removed;
 *   intact ones from another model, and ones whose payload is refused, are
 *   logged and skipped (the request goes on with a normal prefill).
 * - Tool ids: find_tool reads only the KTM section of a file that lists the
 *   id (structure-checked; the CRC is checked when the file is restored).
 * - Not thread-safe: one worker thread owns a ds4_kvdisk.
 */
#ifndef DS4_KVDISK_H
#define DS4_KVDISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/byte_stream.h"
#include "kvdisk/kvdisk_file.h"
#include "kvdisk/kvdisk_index.h"
#include "kvdisk/kvdisk_policy.h"

struct ds4_session;
struct ds4_toolmem;

/* What the cache needs from the owner of sessions. */
typedef struct {
    void *ud;
    uint8_t quant_bits;                 /* routed-expert quant of the model */
    int32_t user_tok, assistant_tok;    /* <|User|> / <|Assistant|> ids */
    int (*n_tokens)(const struct ds4_session *s);
    int (*ctx)(const struct ds4_session *s);
    /* malloc'ed key text of the session's tokens, NULL on failure */
    char *(*key_text)(void *ud, const struct ds4_session *s, size_t *len);
    size_t (*payload_bytes)(const struct ds4_session *s);
    bool (*save_payload)(const struct ds4_session *s, const ds4_sink *sink);
    /* Restores the payload; its tokens must give key_text back (key_text()
     * of the restored session), so a file whose token ids were changed, CRC
     * recomputed, is refused. -1 with err when refused: the session is
     * unchanged on a validation error before the rows, empty when src fails
     * or a check fails once the rows were read in place. */
    int (*load_payload)(void *ud, struct ds4_session *s, const ds4_source *src, size_t n, const char *key_text,
                        size_t key_len, char *err, size_t errlen);
} ds4_kvdisk_host;

typedef struct ds4_kvdisk ds4_kvdisk;

/* mem (may be NULL) is the exact-DSML replay map persisted in KTM sections. */
ds4_kvdisk *ds4_kvdisk_open(const ds4_kvdisk_opts *o, const ds4_kvdisk_host *host, struct ds4_toolmem *mem,
                            ds4_kvdisk_log_fn log, void *log_ud, char *err, size_t errlen);
void ds4_kvdisk_close(ds4_kvdisk *d);
const ds4_kvdisk_opts *ds4_kvdisk_options(const ds4_kvdisk *d);

/* Saves the whole session under the given reason. 0 saved, 1 skipped (too
 * short, too big for the budget, or already on disk), -1 failed (logged;
 * the session is never touched). A write that fails for lack of space
 * (ENOSPC, EDQUOT) evicts cache files in the eviction order until the file
 * would fit, and is retried once; when even the whole cache could not make
 * room nothing is evicted. */
int ds4_kvdisk_save(ds4_kvdisk *d, const struct ds4_session *s, int reason);

/* What saving did since open. Safe to read from any thread. */
typedef struct {
    uint64_t saves;              /* files written */
    uint64_t fail_nospace;       /* saves that failed for lack of space, after the retry */
    uint64_t fail_other;         /* saves that failed otherwise (I/O errors, the lock, memory) */
    uint64_t nospace_hits;       /* writes that met a full disk, retried or not */
    uint64_t nospace_evictions;  /* files evicted to make room on a full disk */
    bool out_of_space;           /* the latest save attempt failed for lack of space */
} ds4_kvdisk_stats;
void ds4_kvdisk_get_stats(const ds4_kvdisk *d, ds4_kvdisk_stats *st);
/* Restores the longest usable checkpoint whose key text is a prefix of
 * text[0..n) and that holds more than `beat` tokens, then loads its tool
 * map. Returns the key text length; 0: nothing restored, and the session is
 * unchanged unless a load failed once the rows were read in place (then it
 * is empty; callers compare its token count). */
size_t ds4_kvdisk_restore(ds4_kvdisk *d, struct ds4_session *s, const char *text, size_t n, int beat);
/* ds4_kvdisk_next_stop() with this cache's options and the host's
 * <|User|> / <|Assistant|> ids. */
int ds4_kvdisk_prefill_stop(const ds4_kvdisk *d, const int32_t *toks, int n_prompt, int from, bool cold, int *reason);
/* Loads the replay mapping of tool id from any cache file into the map. */
bool ds4_kvdisk_find_tool(ds4_kvdisk *d, const char *id);

#endif
