#include "agent/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "text/chat.h"
#include "kvdisk/kvdisk_file.h"
#include "base/sha1.h"
#include "text/tokenizer.h"

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

static int open_dir(const char *dir, char *err, size_t errlen) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) snprintf(err, errlen, "cannot open %s: %s", dir, strerror(errno));
    return fd;
}

/* One open session file: its layout checked against its size, and its text. */
typedef struct {
    int fd;
    ds4_kvc_input in;
    ds4_kvc_layout L;
    char *text;
} session_file;

static void file_close(session_file *f) {
    if (f->fd >= 0) close(f->fd);
    free(f->text);
    f->fd = -1;
    f->text = NULL;
}

/* Opens <id>.kv and reads header, layout and text; with verify, the CRC
 * pass over the whole file too. */
static bool file_open(int dfd, const char *id, bool verify, session_file *f, char *err, size_t errlen) {
    char name[DS4_AGENT_ID_HEX + 8];
    snprintf(name, sizeof name, "%s.kv", id);
    memset(f, 0, sizeof *f);
    f->fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
    struct stat st;
    bool foreign;
    if (f->fd < 0 || fstat(f->fd, &st)) FAIL("cannot open: %s", strerror(errno));
    if (!S_ISREG(st.st_mode)) FAIL("not a regular file");
    f->in = ds4_kvc_fd_input(&f->fd, (uint64_t)st.st_size);
    if (!ds4_kvc_read_layout(&f->in, &f->L, &foreign, err, errlen)) goto fail;
    if (verify && !ds4_kvc_verify(&f->in, &f->L, err, errlen)) goto fail;
    f->text = malloc((size_t)f->L.text_len + 1);
    if (!f->text) FAIL("out of memory for %u bytes of text", f->L.text_len);
    if (!f->in.pread(f->in.ud, f->text, f->L.text_len, f->L.text_off)) FAIL("cannot read the text section");
    f->text[f->L.text_len] = 0;
    return true;
fail:
    file_close(f);
    return false;
}

static bool save_payload(void *ud, const ds4_sink *sink) { return ds4_session_save_payload_to(ud, sink); }
static bool no_payload(void *ud, const ds4_sink *sink) { (void)ud; (void)sink; return true; }

int ds4_agent_store_save(const char *dir, const char *id, uint64_t created, ds4_engine *e, const ds4_session *s,
                         char *err, size_t errlen) {
    int n = ds4_session_n_tokens(s), rc = -1;
    size_t text_len = 0;
    char *text = ds4_tokenizer_decode(ds4_engine_tokenizer(e), ds4_session_tokens(s), (size_t)n, false, &text_len);
    int dfd = -1;
    if (!text) FAIL("out of memory for the session text");
    if (text_len > UINT32_MAX) FAIL("session text too large to save");
    if ((dfd = open_dir(dir, err, errlen)) < 0) goto fail;
    ds4_kvc_header h = {.quant_bits = (uint8_t)ds4_engine_expert_bits(e), .reason = DS4_KVC_UNKNOWN,
                        .n_tokens = (uint32_t)n, .ctx = (uint32_t)ds4_session_ctx(s), .created = created,
                        .last_used = (uint64_t)time(NULL), .payload_bytes = ds4_session_payload_bytes(s)};
    char name[DS4_AGENT_ID_HEX + 8];
    snprintf(name, sizeof name, "%s.kv", id);
    rc = ds4_kvc_write(dfd, name, &h, text, (uint32_t)text_len, save_payload, (void *)s, NULL, 0, err, errlen);
fail:
    if (dfd >= 0) close(dfd);
    free(text);
    return rc;
}

static int newest_first(const void *a, const void *b) {
    const ds4_agent_session_info *x = a, *y = b;
    if (x->updated != y->updated) return x->updated < y->updated ? 1 : -1;
    return strcmp(x->id, y->id);
}

/* <40 hex digits>.kv: the names this store writes (temp files start with '.') */
static bool is_session_name(const char *name) {
    return strlen(name) == DS4_AGENT_ID_HEX + 3 && strspn(name, "0123456789abcdef") == DS4_AGENT_ID_HEX &&
           !strcmp(name + DS4_AGENT_ID_HEX, ".kv");
}

int ds4_agent_store_list(const char *dir, ds4_agent_session_info **out, int *n_out, char *err, size_t errlen) {
    *out = NULL;
    *n_out = 0;
    int dfd = open_dir(dir, err, errlen);
    if (dfd < 0) return -1;
    DIR *d = fdopendir(dup(dfd));
    if (!d) { close(dfd); FAIL("cannot read %s: %s", dir, strerror(errno)); }
    ds4_agent_session_info *list = NULL;
    int n = 0, cap = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        if (!is_session_name(ent->d_name)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            ds4_agent_session_info *nl = realloc(list, (size_t)cap * sizeof *nl);
            if (!nl) { free(list); closedir(d); close(dfd); FAIL("out of memory"); }
            list = nl;
        }
        ds4_agent_session_info *info = &list[n++];
        memset(info, 0, sizeof *info);
        snprintf(info->id, sizeof info->id, "%.*s", DS4_AGENT_ID_HEX, ent->d_name);
        session_file f;
        if (!file_open(dfd, info->id, false, &f, info->why, sizeof info->why)) { info->unreadable = true; continue; }
        info->n_tokens = f.L.h.n_tokens;
        info->ctx = f.L.h.ctx;
        info->created = f.L.h.created;
        info->updated = f.L.h.last_used;
        info->file_bytes = f.L.file_bytes;
        info->stripped = f.L.h.payload_bytes == 0;
        ds4_agent_title(f.text, f.L.text_len, info->title);
        file_close(&f);
    }
    closedir(d);
    close(dfd);
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
        if (!is_session_name(ent->d_name) || strncmp(ent->d_name, prefix, pl)) continue;
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
    char why[256];
    session_file f = {.fd = -1};
    ds4_kvc_section_reader r;
    ds4_source src;
    *text = NULL;
    int dfd = open_dir(dir, err, errlen);
    if (dfd < 0) return -1;
    if (!file_open(dfd, id, true, &f, why, sizeof why)) FAIL("session %.12s is unreadable: %s", id, why);
    const ds4_kvc_header *h = &f.L.h;
    if (h->quant_bits != (uint8_t)ds4_engine_expert_bits(e))
        FAIL("session %.12s was saved with another model (%u-bit experts, this one has %d)", id, h->quant_bits,
             ds4_engine_expert_bits(e));
    if (h->ctx > (uint32_t)ds4_session_ctx(s))
        FAIL("session %.12s needs a context of %u tokens; start with --ctx %u", id, h->ctx, h->ctx);
    *stripped = h->payload_bytes == 0;
    if (!*stripped) {
        if (!ds4_kvc_payload_reader(&f.in, &f.L, &r, &src)) FAIL("out of memory for the payload reader");
        int rc = ds4_session_load_payload_from(s, &src, (size_t)h->payload_bytes, why, sizeof why);
        ds4_kvc_reader_free(&r);
        if (rc) FAIL("session %.12s was saved with another model: %s", id, why);
    }
    *text = f.text;
    *text_len = f.L.text_len;
    *created = h->created;
    f.text = NULL;
    file_close(&f);
    close(dfd);
    return 0;
fail:
    file_close(&f);
    close(dfd);
    return -1;
}

int ds4_agent_store_strip(const char *dir, const char *id, char *err, size_t errlen) {
    char why[256];
    session_file f = {.fd = -1};
    int dfd = open_dir(dir, err, errlen), rc = -1;
    if (dfd < 0) return -1;
    if (!file_open(dfd, id, true, &f, why, sizeof why)) FAIL("session %.12s is unreadable: %s", id, why);
    ds4_kvc_header h = f.L.h;
    h.payload_bytes = 0;
    char name[DS4_AGENT_ID_HEX + 8];
    snprintf(name, sizeof name, "%s.kv", id);
    rc = ds4_kvc_write(dfd, name, &h, f.text, f.L.text_len, no_payload, NULL, NULL, 0, err, errlen);
fail:
    file_close(&f);
    close(dfd);
    return rc;
}

int ds4_agent_store_delete(const char *dir, const char *id, char *err, size_t errlen) {
    char name[DS4_AGENT_ID_HEX + 8];
    snprintf(name, sizeof name, "%s.kv", id);
    int dfd = open_dir(dir, err, errlen);
    if (dfd < 0) return -1;
    int rc = unlinkat(dfd, name, 0);
    if (rc) snprintf(err, errlen, "cannot delete %s/%s: %s", dir, name, strerror(errno));
    close(dfd);
    return rc ? -1 : 0;
}
