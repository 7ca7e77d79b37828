/* kvdisk.h -- the disk KV cache: session checkpoints in KVC files keyed by
 * the SHA-1 of their rendered text, so prefixes survive session switches
 * and server restarts.
 *
 * Contract
 * - File <dir>/<sha1 of key text>.kv (key text = the tokenizer-decoded bytes
 *   of the checkpoint tokens), little-endian:
 *     48-byte header: "KVC", version 1, routed-expert quant bits, save reason
 *       (0 unknown, 1 cold, 2 continued, 3 evict, 4 shutdown), extension
 *       flags, reserved, u32 tokens, u32 hit count, u32 context, 4 reserved,
 *       u64 creation time, u64 last-used time, u64 payload bytes;
 *     u32 text length, the key text; the DSV4 payload (kv_payload.h);
 *     appended sections in flag-bit order:
 *       bit 0: tool-id map "KTM", version 1, u32 count, then per entry u32 id
 *              length, u32 DSML length, id, the exact sampled DSML block;
 *       bit 3: integrity trailer "KCK", version 1, u32 CRC-32 (IEEE) of every
 *              preceding byte with the two mutable header fields (hit count,
 *              last-used time) read as zero. Required: files without it, with
 *              unknown flag bits, a bad CRC or any size mismatch are ignored
 *              (and removed when damaged) with a log line, never loaded.
 *   (Bits 1-2 are taken by ds4's key-kind flags and are not written here.)
 * - Writes go to a per-process temp name, are fsynced, renamed into place
 *   and the directory is fsynced, all under an exclusive flock on
 *   <dir>/.lock (also held while evicting), so a crash, a full disk or a
 *   second server on the same directory never leaves a half file under a
 *   real name. Hit count and last-used time are rewritten in place.
 * - Lookup re-reads the directory (changed files only), so entries written
 *   by another server are seen. The longest key text that is a byte prefix
 *   of the prompt wins among files with at least min_tokens tokens, a saved
 *   context no larger than the session's, and (if asked) the same quant.
 * - Space: after each save, files are removed until the directory's .kv
 *   bytes fit space_bytes, lowest score first: score = last-used time +
 *   6 h * log2(1 + hits) (a hit is worth six hours of recency).
 * - Save moments (server): cold = a first prompt of [min, cold_max] tokens,
 *   saved before generation at the last <|User|> before the first
 *   <|Assistant|> if that is >= min tokens, else at (tokens - trim) aligned
 *   down to align; continued = every multiple of interval rounded up to
 *   align, in prefill or generation; evict = before an unrelated request
 *   replaces the live session; shutdown = at clean exit.
 * - Not thread-safe: one worker thread owns a ds4_kvdisk.
 */
#ifndef DS4_KVDISK_H
#define DS4_KVDISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

struct ds4_toolmem;

enum { DS4_KVC_UNKNOWN = 0, DS4_KVC_COLD, DS4_KVC_CONTINUED, DS4_KVC_EVICT, DS4_KVC_SHUTDOWN };
enum { DS4_KVC_EXT_TOOLS = 1u << 0, DS4_KVC_EXT_CHECKSUM = 1u << 3 };
#define DS4_KVC_HEADER_BYTES 48u

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

/* ---- the file format ---- */

typedef struct {
    uint8_t quant_bits, reason, flags;
    uint32_t n_tokens, hits, ctx;
    uint64_t created, last_used, payload_bytes;
} ds4_kvc_header;

typedef struct {
    const char *id, *dsml;
    uint32_t id_len, dsml_len;
} ds4_kvc_tool;

/* A parsed file image; pointers point into the image. */
typedef struct {
    ds4_kvc_header h;
    const char *text;
    uint32_t text_len;
    const void *payload;
    ds4_kvc_tool *tools;         /* malloc'ed, n_tools entries; free with free() */
    uint32_t n_tools;
} ds4_kvc_view;

/* Validates a whole file image (header, sizes, sections, CRC). The payload
 * is only located; ds4_session_load_payload() validates it. */
bool ds4_kvc_parse(const void *buf, size_t n, ds4_kvc_view *v, char *err, size_t errlen);
/* Writes <dir>/<name> crash-safely (temp, fsync, rename, fsync dir); the
 * flags' tool and checksum bits are set here. -1 with err on failure, and
 * nothing is left behind. */
int ds4_kvc_write(const char *dir, const char *name, const ds4_kvc_header *h, const char *text, uint32_t text_len,
                  const void *payload, const ds4_kvc_tool *tools, uint32_t n_tools, char *err, size_t errlen);

/* ---- save-point policy ---- */

/* The next position in (from, n_prompt] where prefill should stop for a save
 * (cold only when cold is set), or -1; *reason gets the save reason. */
int ds4_kvdisk_next_stop(const ds4_kvdisk_opts *o, const int32_t *toks, int n_prompt, int from, bool cold,
                         int32_t user_tok, int32_t assistant_tok, int *reason);
/* True when n tokens is an absolute continued-save frontier. */
bool ds4_kvdisk_is_frontier(const ds4_kvdisk_opts *o, int n);

/* ---- the cache ---- */

typedef struct ds4_kvdisk ds4_kvdisk;
/* warning: damaged files, I/O errors (servers also print these). */
typedef void (*ds4_kvdisk_log_fn)(void *ud, bool warning, const char *line);

/* mem (may be NULL) is the exact-DSML replay map persisted in KTM sections. */
ds4_kvdisk *ds4_kvdisk_open(const ds4_kvdisk_opts *o, ds4_engine *e, struct ds4_toolmem *mem,
                            ds4_kvdisk_log_fn log, void *log_ud, char *err, size_t errlen);
void ds4_kvdisk_close(ds4_kvdisk *d);
const ds4_kvdisk_opts *ds4_kvdisk_options(const ds4_kvdisk *d);

/* Saves the whole session under the given reason. 0 saved, 1 skipped (too
 * short, too big for the budget, or already on disk), -1 failed (logged;
 * the session is never touched). */
int ds4_kvdisk_save(ds4_kvdisk *d, const ds4_session *s, int reason);
/* Restores the longest usable checkpoint whose key text is a prefix of
 * text[0..n) and that holds more than `beat` tokens, then loads its tool
 * map. Returns the key text length (0: nothing restored, session unchanged). */
size_t ds4_kvdisk_restore(ds4_kvdisk *d, ds4_session *s, const char *text, size_t n, int beat);
/* ds4_kvdisk_next_stop() with this cache's options and its tokenizer's
 * <|User|> / <|Assistant|> ids. */
int ds4_kvdisk_prefill_stop(const ds4_kvdisk *d, const int32_t *toks, int n_prompt, int from, bool cold, int *reason);
/* Loads the replay mapping of tool id from any cache file into the map. */
bool ds4_kvdisk_find_tool(ds4_kvdisk *d, const char *id);

#endif
