/* kvdisk_file.h -- the KVC file codec: one disk KV cache checkpoint as a
 * file, written crash-safely and read section by section.
 *
 * Contract
 * - Layout, little-endian:
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
 *              last-used time) read as zero. Required.
 *   (Bits 1-2 are taken by ds4's key-kind flags and are not written here.)
 * - Every section's place follows from the header and the file size, so a
 *   reader seeks: ds4_kvc_read_layout() reads 52 bytes, ds4_kvc_read_tools()
 *   only the KTM section, ds4_kvc_verify() streams the whole file through the
 *   CRC in bounded pieces. Nothing here holds a whole file in memory.
 * - ds4_kvc_write() creates the file 0600 as an unnamed O_TMPFILE in the
 *   directory (or, where the file system lacks O_TMPFILE, under a random
 *   ".kvtmp." name), streams the payload into it, fsyncs, gives it a random
 *   ".kvtmp." name with linkat(), renames it over <name> and fsyncs the
 *   directory. A failure leaves nothing behind; a crash leaves at most a
 *   ".kvtmp." file, which the directory's next lock holder removes (writers
 *   hold the directory lock, see kvdisk_index.h).
 */
#ifndef DS4_KVDISK_FILE_H
#define DS4_KVDISK_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/byte_stream.h"

enum { DS4_KVC_UNKNOWN = 0, DS4_KVC_COLD, DS4_KVC_CONTINUED, DS4_KVC_EVICT, DS4_KVC_SHUTDOWN };
enum { DS4_KVC_EXT_TOOLS = 1u << 0, DS4_KVC_EXT_CHECKSUM = 1u << 3 };
#define DS4_KVC_HEADER_BYTES 48u
#define DS4_KVC_TMP_PREFIX ".kvtmp."
/* byte offsets of the two mutable header fields */
#define DS4_KVC_OFF_HITS 12
#define DS4_KVC_OFF_LAST_USED 32

typedef struct {
    uint8_t quant_bits, reason, flags;
    uint32_t n_tokens, hits, ctx;
    uint64_t created, last_used, payload_bytes;
} ds4_kvc_header;

typedef struct {
    const char *id, *dsml;
    uint32_t id_len, dsml_len;
} ds4_kvc_tool;

/* Where the sections of one file lie. */
typedef struct {
    ds4_kvc_header h;
    uint32_t text_len;
    uint64_t text_off, payload_off, tools_off, tools_bytes, file_bytes;
} ds4_kvc_layout;

/* Random access to one file's bytes: pread() fills exactly n bytes at off. */
typedef struct {
    bool (*pread)(void *ud, void *dst, size_t n, uint64_t off);
    void *ud;
    uint64_t size;
} ds4_kvc_input;

/* A descriptor as input (ud points at the int fd). */
ds4_kvc_input ds4_kvc_fd_input(int *fd, uint64_t size);

/* Header and section placement, checked against the size; 52 bytes read.
 * *foreign: the file may be fine for another build (version, flags), so the
 * caller leaves it alone rather than removing it. */
bool ds4_kvc_read_layout(const ds4_kvc_input *in, ds4_kvc_layout *L, bool *foreign, char *err, size_t errlen);
/* The CRC trailer against every byte before it. */
bool ds4_kvc_verify(const ds4_kvc_input *in, const ds4_kvc_layout *L, char *err, size_t errlen);
/* The tool-id map, reading only its section into *block (malloc'ed; the
 * tools point into it; free both). A file without a map gives 0 tools. */
bool ds4_kvc_read_tools(const ds4_kvc_input *in, const ds4_kvc_layout *L, char **block, ds4_kvc_tool **tools,
                        uint32_t *n_tools, char *err, size_t errlen);

/* The payload section as a sequential source, read in bounded pieces. */
typedef struct {
    const ds4_kvc_input *in;
    uint64_t off, end;
    unsigned char *buf;
    size_t have, pos;
} ds4_kvc_section_reader;

/* False when out of memory; free with ds4_kvc_reader_free(). */
bool ds4_kvc_payload_reader(const ds4_kvc_input *in, const ds4_kvc_layout *L, ds4_kvc_section_reader *r,
                            ds4_source *src);
void ds4_kvc_reader_free(ds4_kvc_section_reader *r);

/* A parsed in-memory image (tests, fuzzing); pointers point into it. */
typedef struct {
    ds4_kvc_header h;
    const char *text;
    uint32_t text_len;
    const void *payload;
    ds4_kvc_tool *tools;         /* malloc'ed, n_tools entries; free with free() */
    uint32_t n_tools;
} ds4_kvc_view;

/* Layout, CRC and tool map of a whole image. The payload is only located;
 * the engine validates it when it is loaded. */
bool ds4_kvc_parse(const void *buf, size_t n, ds4_kvc_view *v, char *err, size_t errlen);

/* Produces exactly the header's payload_bytes into sink; false on failure. */
typedef bool (*ds4_kvc_payload_fn)(void *ud, const ds4_sink *sink);

/* Writes <dirfd>/<name> as described above; the flags' tool and checksum
 * bits are set here. -1 with err on failure, errno the failing call's
 * (ENOSPC / EDQUOT: the file system is full), and nothing is left behind. */
int ds4_kvc_write(int dirfd, const char *name, const ds4_kvc_header *h, const char *text, uint32_t text_len,
                  ds4_kvc_payload_fn payload, void *payload_ud, const ds4_kvc_tool *tools, uint32_t n_tools,
                  char *err, size_t errlen);

#endif
