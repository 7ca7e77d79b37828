#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "chat.h"
#include "kvdisk.h"
#include "sha1.h"
#include "tokenizer.h"

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); goto fail; } while (0)

void ds4_agent_session_id(const char *first_prompt, uint64_t created, char out[DS4_AGENT_ID_HEX + 1]) {
    char stamp[24];
    int sl = snprintf(stamp, sizeof stamp, "%llu", (unsigned long long)created);
    ds4_sha1 c;
    unsigned char digest[20];
    ds4_sha1_init(&c);
    ds4_sha1_update(&c, first_prompt, strlen(first_prompt));
    ds4_sha1_update(&c, stamp, (size_t)sl);
    ds4_sha1_final(&c, digest);
    for (int i = 0; i < 20; i++) snprintf(out + 2 * i, 3, "%02x", digest[i]);
}

void ds4_agent_title(const char *text, size_t n, char out[DS4_AGENT_TITLE_MAX + 4]) {
    out[0] = 0;
    const char *u = memmem(text, n, DS4_STR_USER, strlen(DS4_STR_USER));
    if (!u) return;
    u += strlen(DS4_STR_USER);
    size_t left = n - (size_t)(u - text), len = 0;
    /* the line ends at a newline or at the next protocol token */
    static const char marker[] = "<\xef\xbd\x9c";   /* "<｜", how every turn token starts */
    while (len < left && u[len] != '\n' && !(left - len >= 4 && !memcmp(u + len, marker, 4))) len++;
    bool cut = len > DS4_AGENT_TITLE_MAX;
    if (cut) {
        len = DS4_AGENT_TITLE_MAX;
        while (len > 0 && ((unsigned char)u[len] & 0xC0) == 0x80) len--;   /* no split UTF-8 */
    }
    memcpy(out, u, len);
    strcpy(out + len, cut ? "..." : "");
}

static void path_of(const char *dir, const char *id, char *out, size_t n) { snprintf(out, n, "%s/%s.kv", dir, id); }

int ds4_agent_store_init(const char *dir, char *err, size_t errlen) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) FAIL("sessions directory path too long");
    for (char *p = buf + 1;; p++) {
        bool end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            if (mkdir(buf, 0700) && errno != EEXIST) FAIL("cannot create %s: %s", buf, strerror(errno));
            if (end) break;
            *p = '/';
        }
    }
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) FAIL("%s is not a directory", dir);
    return 0;
fail:
    return -1;
}

/* The mapped file, validated by ds4_kvc_parse. */
typedef struct {
    void *map;
    size_t bytes;
    ds4_kvc_view v;
} mapped;

static void unmap(mapped *m) {
    if (m->map) munmap(m->map, m->bytes);
    free(m->v.tools);
    memset(m, 0, sizeof *m);
}

static bool map_file(const char *path, mapped *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) FAIL("cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) { close(fd); FAIL("cannot stat %s: %s", path, strerror(errno)); }
    if (st.st_size < (off_t)DS4_KVC_HEADER_BYTES) { close(fd); FAIL("truncated (%lld bytes)", (long long)st.st_size); }
    m->bytes = (size_t)st.st_size;
    m->map = mmap(NULL, m->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m->map == MAP_FAILED) { m->map = NULL; FAIL("cannot map %s: %s", path, strerror(errno)); }
    if (!ds4_kvc_parse(m->map, m->bytes, &m->v, err, errlen)) goto fail;
    return true;
fail:
    unmap(m);
    return false;
}

/* Writes the file with the directory's privacy: kvdisk's writer creates
 * files with the process umask applied, so it is narrowed for the call. */
static int write_private(const char *dir, const char *id, const ds4_kvc_header *h, const char *text, size_t text_len,
                         const void *payload, char *err, size_t errlen) {
    char name[DS4_AGENT_ID_HEX + 8];
    snprintf(name, sizeof name, "%s.kv", id);
    mode_t old = umask(077);
    int rc = ds4_kvc_write(dir, name, h, text, (uint32_t)text_len, payload, NULL, 0, err, errlen);
    umask(old);
    return rc;
}

int ds4_agent_store_save(const char *dir, const char *id, uint64_t created, ds4_engine *e, const ds4_session *s,
                         char *err, size_t errlen) {
    int n = ds4_session_n_tokens(s);
    size_t text_len = 0;
    char *text = ds4_tokenizer_decode(ds4_engine_tokenizer(e), ds4_session_tokens(s), (size_t)n, false, &text_len);
    size_t pbytes = ds4_session_payload_bytes(s);
    void *payload = malloc(pbytes ? pbytes : 1);
    int rc = -1;
    if (!text || !payload) FAIL("out of memory for a %zu-byte session", pbytes);
    if (text_len > UINT32_MAX) FAIL("session text too large to save");
    ds4_session_save_payload(s, payload);
    ds4_kvc_header h = {.quant_bits = (uint8_t)ds4_engine_expert_bits(e), .reason = DS4_KVC_UNKNOWN,
                        .n_tokens = (uint32_t)n, .ctx = (uint32_t)ds4_session_ctx(s), .created = created,
                        .last_used = (uint64_t)time(NULL), .payload_bytes = pbytes};
    rc = write_private(dir, id, &h, text, text_len, payload, err, errlen);
fail:
    free(text);
    free(payload);
    return rc;
}

static int newest_first(const void *a, const void *b) {
    const ds4_agent_session_info *x = a, *y = b;
    if (x->updated != y->updated) return x->updated < y->updated ? 1 : -1;
    return strcmp(x->id, y->id);
}

static bool is_session_name(const char *name) {
    size_t n = strlen(name);
    return n > 3 && !strcmp(name + n - 3, ".kv") && name[0] != '.';
}

int ds4_agent_store_list(const char *dir, ds4_agent_session_info **out, int *n_out, char *err, size_t errlen) {
    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) FAIL("cannot open %s: %s", dir, strerror(errno));
    ds4_agent_session_info *list = NULL;
    int n = 0, cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (!is_session_name(ent->d_name)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            ds4_agent_session_info *nl = realloc(list, (size_t)cap * sizeof *nl);
            if (!nl) { free(list); closedir(d); FAIL("out of memory"); }
            list = nl;
        }
        ds4_agent_session_info *info = &list[n++];
        memset(info, 0, sizeof *info);
        snprintf(info->id, sizeof info->id, "%.*s", (int)(strlen(ent->d_name) - 3), ent->d_name);
        char path[4096];
        path_of(dir, info->id, path, sizeof path);
        mapped m;
        if (!map_file(path, &m, info->why, sizeof info->why)) { info->unreadable = true; continue; }
        info->n_tokens = m.v.h.n_tokens;
        info->ctx = m.v.h.ctx;
        info->created = m.v.h.created;
        info->updated = m.v.h.last_used;
        info->file_bytes = m.bytes;
        info->stripped = m.v.h.payload_bytes == 0;
        ds4_agent_title(m.v.text, m.v.text_len, info->title);
        unmap(&m);
    }
    closedir(d);
    if (n) qsort(list, (size_t)n, sizeof *list, newest_first);
    *out = list;
    *n_out = n;
    return 0;
fail:
    return -1;
}

int ds4_agent_store_find(const char *dir, const char *prefix, char id[DS4_AGENT_ID_HEX + 1], char *err, size_t errlen) {
    size_t pl = prefix ? strlen(prefix) : 0;
    if (pl < 4 || pl > DS4_AGENT_ID_HEX || strspn(prefix, "0123456789abcdef") != pl)
        FAIL("give at least 4 hex digits of a session id (see /list)");
    DIR *d = opendir(dir);
    if (!d) FAIL("cannot open %s: %s", dir, strerror(errno));
    int found = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        size_t n = strlen(ent->d_name);
        if (n != DS4_AGENT_ID_HEX + 3 || !is_session_name(ent->d_name) || strncmp(ent->d_name, prefix, pl)) continue;
        if (found++ == 0) snprintf(id, DS4_AGENT_ID_HEX + 1, "%.*s", DS4_AGENT_ID_HEX, ent->d_name);
    }
    closedir(d);
    if (found == 0) FAIL("no session %s (see /list)", prefix);
    if (found > 1) FAIL("%d sessions start with %s; give more digits", found, prefix);
    return 0;
fail:
    return -1;
}

int ds4_agent_store_load(const char *dir, const char *id, ds4_engine *e, ds4_session *s, char **text, size_t *text_len,
                         uint64_t *created, bool *stripped, char *err, size_t errlen) {
    char path[4096], why[256];
    path_of(dir, id, path, sizeof path);
    mapped m;
    *text = NULL;
    if (!map_file(path, &m, why, sizeof why)) FAIL("session %.12s is unreadable: %s", id, why);
    if (m.v.h.quant_bits != (uint8_t)ds4_engine_expert_bits(e))
        { unmap(&m); FAIL("session %.12s was saved with another model (%u-bit experts, this one has %d)", id,
                          m.v.h.quant_bits, ds4_engine_expert_bits(e)); }
    if (m.v.h.ctx > (uint32_t)ds4_session_ctx(s))
        { unmap(&m); FAIL("session %.12s needs a context of %u tokens; start with --ctx %u", id, m.v.h.ctx, m.v.h.ctx); }
    *stripped = m.v.h.payload_bytes == 0;
    if (!*stripped && ds4_session_load_payload(s, m.v.payload, (size_t)m.v.h.payload_bytes, why, sizeof why)) {
        unmap(&m);
        FAIL("session %.12s was saved with another model: %s", id, why);
    }
    *text = malloc(m.v.text_len + 1);
    if (!*text) { unmap(&m); FAIL("out of memory"); }
    memcpy(*text, m.v.text, m.v.text_len);
    (*text)[m.v.text_len] = 0;
    *text_len = m.v.text_len;
    *created = m.v.h.created;
    unmap(&m);
    return 0;
fail:
    return -1;
}

int ds4_agent_store_strip(const char *dir, const char *id, char *err, size_t errlen) {
    char path[4096], why[256];
    path_of(dir, id, path, sizeof path);
    mapped m;
    if (!map_file(path, &m, why, sizeof why)) FAIL("session %.12s is unreadable: %s", id, why);
    ds4_kvc_header h = m.v.h;
    h.payload_bytes = 0;
    int rc = write_private(dir, id, &h, m.v.text, m.v.text_len, NULL, err, errlen);
    unmap(&m);
    return rc;
fail:
    return -1;
}

int ds4_agent_store_delete(const char *dir, const char *id, char *err, size_t errlen) {
    char path[4096];
    path_of(dir, id, path, sizeof path);
    if (unlink(path)) FAIL("cannot delete %s: %s", path, strerror(errno));
    return 0;
fail:
    return -1;
}
