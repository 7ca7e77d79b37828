/* agent/store.h -- ds4-agent sessions as files: one KVC file (kvdisk.h's
 * codec: header, text, DSV4 payload, CRC trailer, temp + fsync + rename) per
 * session in a sessions directory.
 *
 * Contract
 * - A session's file is <dir>/<id>.kv, id = SHA-1 hex of the first user
 *   prompt followed by the creation time as decimal text; it is stable
 *   across saves (the header keeps the creation time; last-used is the last
 *   save). The text section is the decoded checkpoint tokens (the whole
 *   rendered conversation); the title is its first user line.
 * - A stripped session keeps header, text and title but has no payload
 *   (payload_bytes = 0); loading it gives the text, and the caller
 *   re-prefills it.
 * - Files and the directory are private (0600 / 0700). A failed save (full
 *   disk, size limit) leaves the previous file untouched (the codec writes a
 *   temp file and renames it). The payload streams to and from the file.
 * - Listing reads each <sha>.kv file's header, section layout (checked
 *   against the file size) and text, not its payload; a damaged or foreign
 *   file is listed as unreadable with the reason. Loading and stripping also
 *   verify the CRC of the whole file first, so a damaged file is never
 *   loaded. Sorted by last update, newest first.
 * - Loading refuses a file saved for another routed-expert quantization or
 *   whose payload does not fit the engine (another model), or a context
 *   larger than the session's, with one clear line; the session is then
 *   unchanged.
 */
#ifndef DS4_AGENT_STORE_H
#define DS4_AGENT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

#define DS4_AGENT_ID_HEX 40
#define DS4_AGENT_TITLE_MAX 72

typedef struct {
    char id[DS4_AGENT_ID_HEX + 1];
    char title[DS4_AGENT_TITLE_MAX + 4];
    uint32_t n_tokens, ctx;
    uint64_t created, updated, file_bytes;
    bool stripped;
    bool unreadable;
    char why[200];          /* unreadable: the reason */
} ds4_agent_session_info;

void ds4_agent_session_id(const char *first_prompt, uint64_t created, char out[DS4_AGENT_ID_HEX + 1]);
/* The first user line of a rendered conversation, cut to the title size. */
void ds4_agent_title(const char *text, size_t n, char out[DS4_AGENT_TITLE_MAX + 4]);

/* Creates dir (and its parents) with mode 0700 when missing. */
int ds4_agent_store_init(const char *dir, char *err, size_t errlen);
/* Saves the session's exact state and text under id. */
int ds4_agent_store_save(const char *dir, const char *id, uint64_t created, ds4_engine *e, const ds4_session *s,
                         char *err, size_t errlen);
/* All sessions, newest first; *out is malloc'ed (free()). */
int ds4_agent_store_list(const char *dir, ds4_agent_session_info **out, int *n, char *err, size_t errlen);
/* The one session whose id starts with prefix (>= 4 hex digits). */
int ds4_agent_store_find(const char *dir, const char *prefix, char id[DS4_AGENT_ID_HEX + 1], char *err, size_t errlen);
/* Restores the payload into s (unless stripped) and returns the text
 * (malloc'ed, *text_len bytes) and creation time. *stripped tells the
 * caller it must prefill the text itself. */
int ds4_agent_store_load(const char *dir, const char *id, ds4_engine *e, ds4_session *s, char **text, size_t *text_len,
                         uint64_t *created, bool *stripped, char *err, size_t errlen);
int ds4_agent_store_strip(const char *dir, const char *id, char *err, size_t errlen);
int ds4_agent_store_delete(const char *dir, const char *id, char *err, size_t errlen);

#endif
