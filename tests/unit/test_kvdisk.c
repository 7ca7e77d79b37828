/* test_kvdisk -- the disk KV cache.
 * - SHA-1 against the FIPS 180 example vectors.
 * - KVC files byte for byte against an image built here from the seed's
 *   table (CRC-32 computed bit by bit), every truncation and every bit flip
 *   rejected (except the two in-place fields), foreign versions/flags.
 * - Crash safety: a write that hits RLIMIT_FSIZE leaves neither a partial
 *   file nor a temp file, and an existing file of the same name intact.
 * - Save-point policy with the documented defaults (docs/kv-cache.md).
 * - The cache on models/demo.gguf: save, prefix lookup, restore bit-exact,
 *   hit counts, tool-id map persistence, context and quant rules, damaged
 *   files ignored and removed,
 *   eviction by score, a full disk during save, two processes on one dir.
 */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "text/chat.h"
#include "check.h"
#include "engine/engine.h"
#include "engine/engine_kvdisk.h"
#include "models/dsv4/kv_payload.h"
#include "kvdisk/kvdisk.h"
#include "base/sha1.h"
#include "text/tokenizer.h"
#include "text/toolmem.h"

static void test_sha1(void) {
    char hex[41];
    ds4_sha1_hex("abc", 3, hex);
    CHECK(!strcmp(hex, "a9993e364706816aba3e25717850c26c9cd0d89d"), "sha1(abc) = %s", hex);
    ds4_sha1_hex("", 0, hex);
    CHECK(!strcmp(hex, "da39a3ee5e6b4b0d3255bfef95601890afd80709"), "sha1('') = %s", hex);
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    ds4_sha1_hex(m, strlen(m), hex);
    CHECK(!strcmp(hex, "84983e441c3bd26ebaae4aa1f95129e5e54670f1"), "sha1(448-bit) = %s", hex);
    /* one million 'a' fed in uneven pieces */
    ds4_sha1 c;
    unsigned char d[20], a[1000];
    memset(a, 'a', sizeof a);
    ds4_sha1_init(&c);
    for (size_t left = 1000000, k = 1; left; k = k % 997 + 1) {
        size_t n = k < left ? k : left;
        ds4_sha1_update(&c, a, n);
        left -= n;
    }
    ds4_sha1_final(&c, d);
    static const unsigned char want[20] = {0x34, 0xaa, 0x97, 0x3c, 0xd4, 0xc4, 0xda, 0xa4, 0xf6, 0x1e,
                                           0xeb, 0x2b, 0xdb, 0xad, 0x27, 0x31, 0x65, 0x34, 0x01, 0x6f};
    CHECK(!memcmp(d, want, 20), "sha1(million a)");
}

/* ---- file format ---- */

static uint32_t crc32_bitwise(const unsigned char *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
    }
    return ~c;
}

typedef struct { unsigned char *p; size_t n; } img;
static void app(img *m, const void *d, size_t n) {
    m->p = realloc(m->p, m->n + n);
    memcpy(m->p + m->n, d, n);
    m->n += n;
}
static void app32(img *m, uint32_t v) { unsigned char b[4] = {v, v >> 8, v >> 16, v >> 24}; app(m, b, 4); }
static void app64(img *m, uint64_t v) { app32(m, (uint32_t)v); app32(m, (uint32_t)(v >> 32)); }

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

/* Files named *suffix (dot files excluded). */
static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name), s = strlen(suffix);
        n += e->d_name[0] != '.' && l >= s && !strcmp(e->d_name + l - s, suffix);
    }
    if (d) closedir(d);
    return n;
}

static int count_temps(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += !strncmp(e->d_name, ".kvtmp.", 7);
    if (d) closedir(d);
    return n;
}

/* A payload already in memory, for ds4_kvc_write(). */
typedef struct { const void *p; size_t n; } mem_payload;
static bool emit_mem(void *ud, const ds4_sink *sink) {
    const mem_payload *m = ud;
    return sink->write(sink->ud, m->p, m->n);
}

static int write_kvc(const char *dir, const char *name, const ds4_kvc_header *h, const char *text, uint32_t text_len,
                     const void *payload, const ds4_kvc_tool *tools, uint32_t n_tools, char *err, size_t errlen) {
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY);
    mem_payload m = {payload, (size_t)h->payload_bytes};
    int rc = ds4_kvc_write(dirfd, name, h, text, text_len, emit_mem, &m, tools, n_tools, err, errlen);
    close(dirfd);
    return rc;
}

static void test_format(const char *dir) {
    const char text[] = "<\xef\xbd\x9cUser\xef\xbd\x9c>hello";
    unsigned char payload[100];
    for (int i = 0; i < 100; i++) payload[i] = (unsigned char)(i * 7 + 3);
    ds4_kvc_tool tools[2] = {{.id = "call_1", .id_len = 6, .dsml = "\n\n<x>", .dsml_len = 5},
                             {.id = "toolu_22", .id_len = 8, .dsml = "", .dsml_len = 0}};
    ds4_kvc_header h = {.quant_bits = 2, .reason = DS4_KVC_EVICT, .n_tokens = 7, .hits = 3, .ctx = 4096,
                        .created = 1700000000, .last_used = 1700000500, .payload_bytes = 100};
    char err[256];
    CHECK(write_kvc(dir, "f.kv", &h, text, (uint32_t)strlen(text), payload, tools, 2, err, sizeof err) == 0,
          "write: %s", err);

    /* the seed's layout, built independently */
    img m = {0};
    app(&m, "KVC", 3);
    unsigned char b4[5] = {1, 2, DS4_KVC_EVICT, 0x09, 0};
    app(&m, b4, 5);
    app32(&m, 7); app32(&m, 3); app32(&m, 4096); app32(&m, 0);
    app64(&m, 1700000000); app64(&m, 1700000500); app64(&m, 100);
    app32(&m, (uint32_t)strlen(text));
    app(&m, text, strlen(text));
    app(&m, payload, 100);
    app(&m, "KTM\x01", 4); app32(&m, 2);
    app32(&m, 6); app32(&m, 5); app(&m, "call_1", 6); app(&m, "\n\n<x>", 5);
    app32(&m, 8); app32(&m, 0); app(&m, "toolu_22", 8);
    unsigned char *z = malloc(m.n);
    memcpy(z, m.p, m.n);
    memset(z + 12, 0, 4);
    memset(z + 32, 0, 8);
    uint32_t crc = crc32_bitwise(z, m.n);
    free(z);
    app(&m, "KCK\x01", 4);
    app32(&m, crc);

    char path[600];
    snprintf(path, sizeof path, "%s/f.kv", dir);
    size_t n;
    unsigned char *f = (unsigned char *)read_all(path, &n);
    CHECK(f && n == m.n && !memcmp(f, m.p, n), "file image differs from the seed layout (%zu vs %zu bytes)", n, m.n);
    CHECK(count_temps(dir) == 0, "temp file left behind");

    ds4_kvc_view v;
    CHECK(ds4_kvc_parse(f, n, &v, err, sizeof err), "parse: %s", err);
    CHECK(v.h.n_tokens == 7 && v.h.hits == 3 && v.h.ctx == 4096 && v.h.quant_bits == 2 && v.h.reason == DS4_KVC_EVICT &&
          v.h.created == 1700000000 && v.h.last_used == 1700000500 && v.h.payload_bytes == 100, "header fields");
    CHECK(v.text_len == strlen(text) && !memcmp(v.text, text, v.text_len), "text");
    CHECK(!memcmp(v.payload, payload, 100), "payload");
    CHECK(v.n_tools == 2 && v.tools[0].id_len == 6 && !memcmp(v.tools[0].dsml, "\n\n<x>", 5) &&
          v.tools[1].dsml_len == 0 && !memcmp(v.tools[1].id, "toolu_22", 8), "tool map");
    free(v.tools);

    int accepted = 0;
    for (size_t cut = 0; cut < n; cut++) {
        if (ds4_kvc_parse(f, cut, &v, err, sizeof err)) { accepted++; free(v.tools); }
    }
    CHECK(accepted == 0, "%d truncations accepted", accepted);
    int flips_ok = 0, flips_mutable_bad = 0;
    for (size_t i = 0; i < n; i++) {
        bool mutable_field = (i >= 12 && i < 16) || (i >= 32 && i < 40);
        for (int bit = 0; bit < 8; bit++) {
            f[i] ^= (unsigned char)(1u << bit);
            bool ok = ds4_kvc_parse(f, n, &v, err, sizeof err);
            if (ok) free(v.tools);
            if (ok && !mutable_field) flips_ok++;
            if (!ok && mutable_field) flips_mutable_bad++;
            f[i] ^= (unsigned char)(1u << bit);
        }
    }
    CHECK(flips_ok == 0, "%d bit flips accepted", flips_ok);
    CHECK(flips_mutable_bad == 0, "%d flips of hit count / last-used rejected", flips_mutable_bad);
    f[3] = 2;
    CHECK(!ds4_kvc_parse(f, n, &v, err, sizeof err) && strstr(err, "version"), "version 2: %s", err);
    f[3] = 1;
    f[6] = 0x01;
    CHECK(!ds4_kvc_parse(f, n, &v, err, sizeof err), "no checksum bit accepted");
    f[6] = 0x0b;
    CHECK(!ds4_kvc_parse(f, n, &v, err, sizeof err), "unknown flag bit accepted");
    free(f);
    free(m.p);

    /* a write that runs into the file-size limit: nothing half-written, the
     * old file of that name untouched */
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {300, 300};
        setrlimit(RLIMIT_FSIZE, &rl);
        static unsigned char big[4096];
        ds4_kvc_header hb = h;
        hb.payload_bytes = sizeof big;
        int rc = write_kvc(dir, "f.kv", &hb, text, (uint32_t)strlen(text), big, NULL, 0, err, sizeof err);
        _exit(rc == -1 && strstr(err, "cannot write") ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "write over RLIMIT_FSIZE did not fail cleanly (status %d)", st);
    f = (unsigned char *)read_all(path, &n);
    CHECK(f && ds4_kvc_parse(f, n, &v, err, sizeof err), "old file damaged by a failed write: %s", err);
    if (f) free(v.tools);
    free(f);
    CHECK(count_temps(dir) == 0, "temp file left after a failed write");
    unlink(path);
}

static void test_policy(void) {
    ds4_kvdisk_opts o;
    ds4_kvdisk_opts_default(&o);
    CHECK(o.min_tokens == 512 && o.cold_max_tokens == 30000 && o.continued_interval == 10000 &&
          o.boundary_trim == 32 && o.boundary_align == 2048 && o.space_bytes == (uint64_t)4096 << 20, "defaults");
    const int32_t U = 5, A = 6;
    int32_t *t = calloc(40000, sizeof *t);
    int reason = -1;
    /* no user boundary: prompt - 32 aligned down to 2048 */
    CHECK(ds4_kvdisk_next_stop(&o, t, 5000, 0, true, U, A, &reason) == 4096 && reason == DS4_KVC_COLD, "cold 5000");
    CHECK(ds4_kvdisk_next_stop(&o, t, 2080, 0, true, U, A, &reason) == 2048, "cold 2080 -> 2048");
    CHECK(ds4_kvdisk_next_stop(&o, t, 2079, 0, true, U, A, &reason) == -1, "cold 2079: 2047 aligns to 0");
    CHECK(ds4_kvdisk_next_stop(&o, t, 5000, 0, false, U, A, &reason) == -1, "not a first prompt");
    CHECK(ds4_kvdisk_next_stop(&o, t, 5000, 4096, true, U, A, &reason) == -1, "cold point already passed");
    /* the last user turn before the first assistant turn, when long enough */
    t[100] = U; t[3000] = U; t[3500] = A; t[4000] = U;
    CHECK(ds4_kvdisk_next_stop(&o, t, 5000, 0, true, U, A, &reason) == 3000 && reason == DS4_KVC_COLD, "user boundary");
    t[3000] = 0;
    CHECK(ds4_kvdisk_next_stop(&o, t, 5000, 0, true, U, A, &reason) == 4096, "boundary 100 < min: fallback");
    /* continued: absolute multiples of 10000 rounded up to 2048 = 10240 */
    CHECK(ds4_kvdisk_next_stop(&o, t, 35000, 0, true, U, A, &reason) == 10240 && reason == DS4_KVC_CONTINUED,
          "over cold max: first frontier");
    CHECK(ds4_kvdisk_next_stop(&o, t, 35000, 10240, false, U, A, &reason) == 20480, "second frontier");
    CHECK(ds4_kvdisk_next_stop(&o, t, 20000, 10240, false, U, A, &reason) == -1, "no frontier before the end");
    CHECK(ds4_kvdisk_is_frontier(&o, 20480) && !ds4_kvdisk_is_frontier(&o, 20000) && !ds4_kvdisk_is_frontier(&o, 0),
          "frontiers");
    o.continued_interval = 0;
    CHECK(!ds4_kvdisk_is_frontier(&o, 20480), "interval 0 disables");
    o.cold_max_tokens = 0;
    CHECK(ds4_kvdisk_next_stop(&o, t, 5000, 0, true, U, A, &reason) == -1, "cold max 0 disables");
    free(t);
}

/* ---- the cache on the demo model ---- */

typedef struct { char text[8192]; int warnings; } logbuf;
static void on_log(void *ud, bool warning, const char *line) {
    logbuf *l = ud;
    l->warnings += warning;
    size_t used = strlen(l->text);
    /* keep the latest lines when full */
    if (used + strlen(line) + 2 > sizeof l->text) used = 0;
    snprintf(l->text + used, sizeof l->text - used, "%s\n", line);
}

static ds4_session *prompt_session(ds4_engine *e, const char *text, int ctx) {
    char err[256];
    ds4_token_ids ids = {0};
    ds4_tokenizer_encode(ds4_engine_tokenizer(e), text, strlen(text), DS4_TOK_SPECIALS_CHAT, &ids);
    ds4_session *s = ds4_session_new(e, ctx, err, sizeof err);
    CHECK(ds4_session_prefill(s, ids.v, (int)ids.n, NULL, NULL, NULL, err, sizeof err) == 0, "prefill: %s", err);
    ds4_token_ids_free(&ids);
    return s;
}

static char *session_text(ds4_engine *e, const ds4_session *s, size_t *n) {
    return ds4_tokenizer_decode(ds4_engine_tokenizer(e), ds4_session_tokens(s), (size_t)ds4_session_n_tokens(s), false, n);
}

static void kv_path(const char *dir, const char *text, size_t n, char *out, size_t outn) {
    char hex[41];
    ds4_sha1_hex(text, n, hex);
    snprintf(out, outn, "%s/%s.kv", dir, hex);
}

static bool same_state(const ds4_session *a, const ds4_session *b) {
    size_t na = ds4_session_payload_bytes(a), nb = ds4_session_payload_bytes(b);
    if (na != nb) return false;
    char *pa = malloc(na), *pb = malloc(nb);
    ds4_session_save_payload(a, pa);
    ds4_session_save_payload(b, pb);
    /* the saved-context and capacity fields (2 and 6) follow the session's ctx */
    memset(pa + 8, 0, 4); memset(pb + 8, 0, 4);
    memset(pa + 24, 0, 4); memset(pb + 24, 0, 4);
    bool same = !memcmp(pa, pb, na);
    free(pa);
    free(pb);
    return same;
}

static void test_cache(ds4_engine *e, const char *dir) {
    char err[256], path[700];
    ds4_kvdisk_opts o;
    ds4_kvdisk_opts_default(&o);
    o.dir = dir;
    o.min_tokens = 8;
    logbuf lg = {0};
    ds4_toolmem *mem = ds4_toolmem_new(100, 1 << 20);
    ds4_kvdisk *d = ds4_engine_kvdisk_open(&o, e, mem, on_log, &lg, err, sizeof err);
    CHECK(d != NULL, "open: %s", err);
    if (!d) return;

    const char *p1 = DS4_STR_BOS "You are a terse assistant." DS4_STR_USER "List the files." DS4_STR_ASSISTANT
                     DS4_STR_THINK_CLOSE "\n\n<\xef\xbd\x9c" "DSML\xef\xbd\x9ctool_calls>\n<x/>";
    ds4_session *a = prompt_session(e, p1, 512);
    const char *ids[2] = {"call_aaaa", "call_bbbb"};
    const char *block = "\n\n<\xef\xbd\x9c" "DSML\xef\xbd\x9ctool_calls>\n<x/>";
    ds4_toolmem_put(mem, ids, 2, block, strlen(block));
    const char *other[1] = {"call_notintext"};
    ds4_toolmem_put(mem, other, 1, "<not in the text>", 17);
    CHECK(ds4_kvdisk_save(d, a, DS4_KVC_SHUTDOWN) == 0, "save");
    CHECK(ds4_kvdisk_save(d, a, DS4_KVC_SHUTDOWN) == 1, "second save of the same state is skipped");
    size_t tn;
    char *ta = session_text(e, a, &tn);
    kv_path(dir, ta, tn, path, sizeof path);
    size_t fn;
    char *f = read_all(path, &fn);
    ds4_kvc_view v;
    CHECK(f && ds4_kvc_parse(f, fn, &v, err, sizeof err), "saved file %s parses: %s", path, err);
    if (f) {
        CHECK(v.h.reason == DS4_KVC_SHUTDOWN && v.h.n_tokens == (uint32_t)ds4_session_n_tokens(a) && v.h.ctx == 512 &&
              v.h.quant_bits == (uint8_t)ds4_engine_expert_bits(e) && v.h.hits == 0, "saved header");
        CHECK(v.text_len == tn && !memcmp(v.text, ta, tn), "key text = decoded tokens");
        CHECK(v.n_tools == 2, "only the ids whose block is in the text are stored (%u)", v.n_tools);
        free(v.tools);
    }
    free(f);

    /* lookup: the cached text + a suffix restores exactly; other text misses */
    char *prompt = malloc(tn + 64);
    memcpy(prompt, ta, tn);
    strcpy(prompt + tn, "</\xef\xbd\x9c" "DSML\xef\xbd\x9ctool_calls>more");
    ds4_toolmem *mem2 = ds4_toolmem_new(100, 1 << 20);
    ds4_kvdisk *d2 = ds4_engine_kvdisk_open(&o, e, mem2, on_log, &lg, err, sizeof err);
    ds4_session *b = ds4_session_new(e, 1024, err, sizeof err);
    CHECK(ds4_kvdisk_restore(d2, b, "unrelated", 9, 0) == 0 && ds4_session_n_tokens(b) == 0, "miss");
    CHECK(ds4_kvdisk_restore(d2, b, prompt, tn + 10, ds4_session_n_tokens(a)) == 0, "a hit must beat the live tokens");
    CHECK(ds4_kvdisk_restore(d2, b, prompt, tn + 10, 0) == tn, "hit returns the key length");
    CHECK(same_state(a, b), "restored state differs from the saved session");
    char *got = ds4_toolmem_get(mem2, "call_bbbb");
    CHECK(got && !strcmp(got, block), "tool map loaded on hit");
    free(got);
    f = read_all(path, &fn);
    CHECK(f && ds4_kvc_parse(f, fn, &v, err, sizeof err) && v.h.hits == 1 && v.h.last_used >= v.h.created,
          "hit counted in place: %s", err);
    if (f) free(v.tools);
    free(f);
    ds4_kvdisk_close(d2);
    ds4_toolmem_free(mem2);
    /* find a single tool id without a hit (restart, history scan) */
    mem2 = ds4_toolmem_new(100, 1 << 20);
    d2 = ds4_engine_kvdisk_open(&o, e, mem2, on_log, &lg, err, sizeof err);
    CHECK(ds4_kvdisk_find_tool(d2, "call_aaaa") && !ds4_kvdisk_find_tool(d2, "call_notintext"), "find_tool");
    CHECK(ds4_toolmem_count(mem2) == 1, "only the asked id loaded");
    ds4_kvdisk_close(d2);
    ds4_toolmem_free(mem2);

    /* context: a file saved for ctx 512 is not used by a 256-token session */
    ds4_session *small = ds4_session_new(e, 256, err, sizeof err);
    CHECK(ds4_kvdisk_restore(d, small, prompt, tn + 10, 0) == 0, "ctx 512 snapshot into ctx 256");
    ds4_session_free(small);

    /* another routed-expert quant: reused by default, refused when strict */
    f = read_all(path, &fn);
    CHECK(f && ds4_kvc_parse(f, fn, &v, err, sizeof err), "reparse: %s", err);
    if (f) {
        char name[64];
        snprintf(name, sizeof name, "%s", strrchr(path, '/') + 1);
        ds4_kvc_header hq = v.h;
        hq.quant_bits = (uint8_t)(ds4_engine_expert_bits(e) == 4 ? 2 : 4);
        CHECK(write_kvc(dir, name, &hq, v.text, v.text_len, v.payload, v.tools, v.n_tools, err, sizeof err) == 0,
              "rewrite with another quant: %s", err);
        free(v.tools);
        ds4_kvdisk_opts strict = o;
        strict.reject_different_quant = true;
        ds4_kvdisk *ds = ds4_engine_kvdisk_open(&strict, e, NULL, on_log, &lg, err, sizeof err);
        ds4_session *q = ds4_session_new(e, 1024, err, sizeof err);
        CHECK(ds4_kvdisk_restore(ds, q, prompt, tn + 10, 0) == 0, "strict: other quant refused");
        CHECK(ds4_kvdisk_restore(d, q, prompt, tn + 10, 0) == tn && same_state(a, q), "default: other quant reused");
        ds4_session_free(q);
        ds4_kvdisk_close(ds);
    }
    free(f);

    /* damage: a flipped payload byte and a truncation are ignored, logged, removed */
    for (int kind = 0; kind < 2; kind++) {
        CHECK(ds4_kvdisk_save(d, a, DS4_KVC_SHUTDOWN) == 0 || access(path, F_OK) == 0, "resave");
        f = read_all(path, &fn);
        FILE *w = fopen(path, "r+b");
        if (kind == 0) { fseek(w, (long)(fn / 2), SEEK_SET); fputc(f[fn / 2] ^ 0x10, w); fclose(w); }
        else { fclose(w); CHECK(truncate(path, (off_t)(fn - 1000)) == 0, "truncate"); }
        free(f);
        int warn0 = lg.warnings;
        ds4_session *c = ds4_session_new(e, 1024, err, sizeof err);
        CHECK(ds4_kvdisk_restore(d, c, prompt, tn + 10, 0) == 0 && ds4_session_n_tokens(c) == 0,
              "damaged file (%s) was loaded", kind ? "truncated" : "bit flip");
        CHECK(lg.warnings > warn0, "no log line for a damaged file");
        CHECK(access(path, F_OK) != 0, "damaged file not removed");
        ds4_session_free(c);
    }
    /* another version is ignored but left alone */
    CHECK(ds4_kvdisk_save(d, a, DS4_KVC_SHUTDOWN) == 0, "resave");
    FILE *w = fopen(path, "r+b");
    fseek(w, 3, SEEK_SET);
    fputc(9, w);
    fclose(w);
    ds4_session *c = ds4_session_new(e, 1024, err, sizeof err);
    CHECK(ds4_kvdisk_restore(d, c, prompt, tn + 10, 0) == 0, "version 9 file was loaded");
    CHECK(access(path, F_OK) == 0, "a file of another version was removed");
    unlink(path);

    /* CRC-valid files whose payload is refused: a token id changed to another
     * valid id (the tokens no longer give the key text), NaN in the logits,
     * 3e38 and +Inf in the layer rows. The restore misses with a log line
     * saying why; the session is left empty, so the request prefills. */
    const char *const why_refused[4] = {"do not decode to its key text", "logit", "rows hold", "rows hold"};
    for (int kind = 0; kind < 4; kind++) {
        unlink(path);
        CHECK(ds4_kvdisk_save(d, a, DS4_KVC_SHUTDOWN) == 0, "resave for refusal %d", kind);
        f = read_all(path, &fn);
        if (!f || !ds4_kvc_parse(f, fn, &v, err, sizeof err)) {
            CHECK(false, "parse: %s", err);
            free(f);
            break;
        }
        unsigned char *pl = malloc(v.h.payload_bytes);
        memcpy(pl, v.payload, v.h.payload_bytes);
        const size_t logits = DS4_PAYLOAD_HEADER_BYTES + 4 * (size_t)v.h.n_tokens;
        const size_t rows = logits + 4 * ((size_t)ds4_engine_n_vocab(e) + 2 * (size_t)ds4_engine_n_layers(e));
        const float bad[4] = {0, NAN, 3e38f, INFINITY};
        const size_t at[4] = {DS4_PAYLOAD_HEADER_BYTES + 4 * 5, logits + 4 * 7, rows, v.h.payload_bytes - 4};
        if (kind == 0) {
            uint32_t id;
            memcpy(&id, pl + at[0], 4);
            id = id == 100 ? 101 : 100;
            memcpy(pl + at[0], &id, 4);
        } else {
            memcpy(pl + at[kind], &bad[kind], 4);
        }
        char name[64];
        snprintf(name, sizeof name, "%s", strrchr(path, '/') + 1);
        CHECK(write_kvc(dir, name, &v.h, v.text, v.text_len, pl, v.tools, v.n_tools, err, sizeof err) == 0,
              "rewrite with a refused payload: %s", err);
        free(v.tools);
        free(pl);
        free(f);
        lg.text[0] = 0;
        const int warn0 = lg.warnings;
        ds4_kvdisk *dk = ds4_engine_kvdisk_open(&o, e, NULL, on_log, &lg, err, sizeof err);
        ds4_session *r = ds4_session_new(e, 1024, err, sizeof err);
        CHECK(dk && r && ds4_kvdisk_restore(dk, r, prompt, tn + 10, 0) == 0 && ds4_session_n_tokens(r) == 0,
              "refused payload %d was restored", kind);
        CHECK(lg.warnings > warn0 && strstr(lg.text, why_refused[kind]) && strstr(lg.text, name),
              "refused payload %d: no log line naming the file and \"%s\":\n%s", kind, why_refused[kind], lg.text);
        ds4_session_free(r);
        ds4_kvdisk_close(dk);
    }
    unlink(path);

    /* a full disk while saving: the save fails, nothing is left, the session is intact */
    ds4_session *before = prompt_session(e, p1, 512);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &rl);
        int rc = ds4_kvdisk_save(d, a, DS4_KVC_EVICT);
        _exit(rc == -1 && same_state(a, before) ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "save on a full disk (status %d)", st);
    CHECK(count_files(dir, ".kv") == 0 && count_temps(dir) == 0, "files left after a failed save");
    ds4_session_free(before);

    /* eviction: budget for two files; the one with a hit outlives the older unhit one */
    const char *texts[3] = {DS4_STR_BOS "the first conversation is about apples, pears and other fruit",
                            DS4_STR_BOS "the second conversation is about boats, rivers and the sea",
                            DS4_STR_BOS "the third conversation is about clocks, bells and towers"};
    ds4_session *s3[3];
    for (int i = 0; i < 3; i++) s3[i] = prompt_session(e, texts[i], 512);
    size_t one = ds4_session_payload_bytes(s3[0]) + 400;
    ds4_kvdisk_close(d);
    o.space_bytes = 2 * one + one / 2;
    d = ds4_engine_kvdisk_open(&o, e, mem, on_log, &lg, err, sizeof err);
    CHECK(ds4_kvdisk_save(d, s3[0], DS4_KVC_COLD) == 0 && ds4_kvdisk_save(d, s3[1], DS4_KVC_COLD) == 0, "save 2");
    ds4_session_free(c);
    c = ds4_session_new(e, 1024, err, sizeof err);
    CHECK(ds4_kvdisk_restore(d, c, texts[0], strlen(texts[0]), 0) > 0, "hit first");
    CHECK(ds4_kvdisk_save(d, s3[2], DS4_KVC_COLD) == 0, "save third");
    CHECK(count_files(dir, ".kv") == 2, "%d files after eviction", count_files(dir, ".kv"));
    char *t1 = session_text(e, s3[1], &tn);
    kv_path(dir, t1, tn, path, sizeof path);
    CHECK(access(path, F_OK) != 0, "the unhit older file should be evicted");
    free(t1);

    /* two processes saving into one directory: every file stays valid */
    ds4_kvdisk_close(d);
    o.space_bytes = (uint64_t)1 << 30;
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        if ((kids[k] = fork()) == 0) {
            logbuf l2 = {0};
            ds4_kvdisk *dk = ds4_engine_kvdisk_open(&o, e, NULL, on_log, &l2, err, sizeof err);
            int fails = 0;
            for (int r = 0; r < 6; r++)
                for (int i = 0; i < 3; i++) {
                    char name[700];
                    size_t n2;
                    char *t2 = session_text(e, s3[i], &n2);
                    kv_path(dir, t2, n2, name, sizeof name);
                    free(t2);
                    /* force rewrites so both processes race on the same names */
                    if ((r + k) % 2) unlink(name);
                    fails += ds4_kvdisk_save(dk, s3[i], DS4_KVC_CONTINUED) < 0;
                }
            ds4_kvdisk_close(dk);
            _exit(fails ? 1 : 0);
        }
    }
    for (int k = 0; k < 2; k++) {
        waitpid(kids[k], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "concurrent saver %d failed", k);
    }
    DIR *dd = opendir(dir);
    struct dirent *de;
    int valid = 0, invalid = 0;
    while ((de = readdir(dd))) {
        if (!strstr(de->d_name, ".kv") || de->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        f = read_all(path, &fn);
        if (f && ds4_kvc_parse(f, fn, &v, err, sizeof err)) { valid++; free(v.tools); }
        else invalid++;
        free(f);
    }
    closedir(dd);
    CHECK(invalid == 0 && count_temps(dir) == 0, "%d invalid files / temps after concurrent saves", invalid);
    d = ds4_engine_kvdisk_open(&o, e, mem, on_log, &lg, err, sizeof err);
    for (int i = 0; i < 3; i++) {
        ds4_session *r = ds4_session_new(e, 1024, err, sizeof err);
        CHECK(ds4_kvdisk_restore(d, r, texts[i], strlen(texts[i]), 0) > 0 && same_state(r, s3[i]),
              "conversation %d after concurrent saves", i);
        ds4_session_free(r);
        ds4_session_free(s3[i]);
    }
    ds4_session_free(c);
    ds4_kvdisk_close(d);
    if (check_failed) fprintf(stderr, "cache log:\n%s", lg.text);
    ds4_session_free(a);
    ds4_session_free(b);
    free(prompt);
    free(ta);
    ds4_toolmem_free(mem);
}

/* ---- the cache over a synthetic host: big payloads without a model ---- */

/* A stand-in session: its payload is `bytes` pattern bytes made on the fly,
 * so the test itself never holds a payload in memory. */
typedef struct {
    int n_tokens, ctx;
    const char *text;
    size_t bytes;
    unsigned seed, loaded_seed;
} fake_session;

#define FAKE(s) ((fake_session *)(void *)(s))
#define AS_SESSION(f) ((struct ds4_session *)(void *)(f))

static unsigned char pattern(unsigned seed, size_t i) { return (unsigned char)((i * 131u) ^ (i >> 12) ^ seed); }

static int fake_n_tokens(const struct ds4_session *s) { return FAKE(s)->n_tokens; }
static int fake_ctx(const struct ds4_session *s) { return FAKE(s)->ctx; }
static size_t fake_bytes(const struct ds4_session *s) { return FAKE(s)->bytes; }
static char *fake_text(void *ud, const struct ds4_session *s, size_t *len) {
    *len = strlen(FAKE(s)->text);
    return strdup(FAKE(s)->text);
}
static bool fake_save(const struct ds4_session *s, const ds4_sink *sink) {
    unsigned char piece[65536];
    const fake_session *f = FAKE(s);
    for (size_t off = 0; off < f->bytes; off += sizeof piece) {
        size_t n = f->bytes - off < sizeof piece ? f->bytes - off : sizeof piece;
        for (size_t i = 0; i < n; i++) piece[i] = pattern(f->seed, off + i);
        if (!sink->write(sink->ud, piece, n)) return false;
    }
    return true;
}
/* The seed is in byte 0 of the pattern (i = 0 gives 0 ^ 0 ^ seed). */
static int fake_load(void *ud, struct ds4_session *s, const ds4_source *src, size_t n, const char *key_text,
                     size_t key_len, char *err, size_t errlen) {
    unsigned char piece[65536];
    unsigned seed = 0;
    for (size_t off = 0; off < n; off += sizeof piece) {
        size_t k = n - off < sizeof piece ? n - off : sizeof piece;
        if (!src->read(src->ud, piece, k)) { snprintf(err, errlen, "short read"); return -1; }
        if (!off) seed = piece[0];
        for (size_t i = 0; i < k; i++)
            if (piece[i] != pattern(seed, off + i)) { snprintf(err, errlen, "pattern broken at %zu", off + i); return -1; }
    }
    FAKE(s)->loaded_seed = seed;
    FAKE(s)->n_tokens = 1 << 20; /* stands for "restored": tests compare it */
    return 0;
}

static const ds4_kvdisk_host fake_host = {
    .quant_bits = 2, .user_tok = 1, .assistant_tok = 2, .n_tokens = fake_n_tokens, .ctx = fake_ctx,
    .key_text = fake_text, .payload_bytes = fake_bytes, .save_payload = fake_save, .load_payload = fake_load,
};

static ds4_kvdisk *fake_open(const char *dir, uint64_t space, ds4_toolmem *mem, logbuf *lg) {
    char err[512];
    ds4_kvdisk_opts o;
    ds4_kvdisk_opts_default(&o);
    o.dir = dir;
    o.min_tokens = 8;
    o.space_bytes = space;
    ds4_kvdisk *d = ds4_kvdisk_open(&o, &fake_host, mem, on_log, lg, err, sizeof err);
    CHECK(d != NULL, "open %s: %s", dir, err);
    return d;
}

static void fake_path(const char *dir, const char *text, char *out, size_t n) { kv_path(dir, text, strlen(text), out, n); }

static size_t restore_fake(ds4_kvdisk *d, const char *prompt, unsigned *seed) {
    fake_session into = {.n_tokens = 0, .ctx = 100000};
    size_t got = ds4_kvdisk_restore(d, AS_SESSION(&into), prompt, strlen(prompt), 0);
    *seed = into.loaded_seed;
    return got;
}

static long proc_field(const char *file, const char *key) {
    FILE *f = fopen(file, "r");
    char line[256];
    long v = -1;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl)) v = strtol(line + kl, NULL, 10);
    if (f) fclose(f);
    return v;
}

/* Peak RSS growth (KiB) over fn: the peak is reset first (clear_refs 5). */
static long peak_growth_kib(void (*fn)(void *), void *ud) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    CHECK(f && fputs("5", f) >= 0, "cannot reset the peak RSS");
    if (f) fclose(f);
    long before = proc_field("/proc/self/status", "VmRSS:");
    fn(ud);
    return proc_field("/proc/self/status", "VmHWM:") - before;
}

typedef struct { ds4_kvdisk *d; fake_session *s; int rc; unsigned seed; size_t got; const char *prompt; } io_job;
static void do_save(void *ud) { io_job *j = ud; j->rc = ds4_kvdisk_save(j->d, AS_SESSION(j->s), DS4_KVC_COLD); }
static void do_restore(void *ud) { io_job *j = ud; j->got = restore_fake(j->d, j->prompt, &j->seed); }

static void rm_dir(const char *dir);

/* A cache over the synthetic host in a fresh private directory base/name. */
static ds4_kvdisk *fake_dir(const char *base, const char *name, char *dir, size_t n, uint64_t space, ds4_toolmem *mem,
                            logbuf *lg) {
    snprintf(dir, n, "%s/%s", base, name);
    CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    return fake_open(dir, space, mem, lg);
}

#define BIG_PAYLOAD ((size_t)48 << 20)

/* Defect: saves copied the whole session into memory, restores read whole
 * files; both must stream. */
static void test_streaming_memory(const char *base) {
    char dir[300];
    logbuf lg = {0};
    ds4_kvdisk *d = fake_dir(base, "stream", dir, sizeof dir, (uint64_t)1 << 30, NULL, &lg);
    if (!d) return;
    fake_session s = {.n_tokens = 100, .ctx = 1000, .text = "streamed conversation", .bytes = BIG_PAYLOAD, .seed = 77};
    io_job j = {.d = d, .s = &s, .prompt = "streamed conversation and more"};
    long save_kib = peak_growth_kib(do_save, &j);
    CHECK(j.rc == 0, "big save failed:\n%s", lg.text);
    long restore_kib = peak_growth_kib(do_restore, &j);
    CHECK(j.got == strlen(s.text) && j.seed == 77, "big restore: %zu bytes, seed %u\n%s", j.got, j.seed, lg.text);
    printf("test_kvdisk: %zu MiB payload: peak RSS growth save %ld KiB, restore %ld KiB\n", BIG_PAYLOAD >> 20,
           save_kib, restore_kib);
    /* a quarter of the payload is far above the streaming buffers (a few MiB)
     * and far below one copy */
    CHECK(save_kib >= 0 && save_kib < (long)(BIG_PAYLOAD >> 12), "save grew RSS by %ld KiB", save_kib);
    CHECK(restore_kib >= 0 && restore_kib < (long)(BIG_PAYLOAD >> 12), "restore grew RSS by %ld KiB", restore_kib);

    /* find_tool reads the KTM section, not the file around it */
    ds4_toolmem *mem = ds4_toolmem_new(100, 1 << 20);
    const char *ids[1] = {"call_inbig"};
    s.text = "streamed conversation with <tool block> inside";
    ds4_toolmem_put(mem, ids, 1, "<tool block>", 12);
    ds4_kvdisk_close(d);
    d = fake_open(dir, (uint64_t)1 << 30, mem, &lg);
    CHECK(ds4_kvdisk_save(d, AS_SESSION(&s), DS4_KVC_COLD) == 0, "save with a tool map");
    ds4_kvdisk_close(d);
    ds4_toolmem *mem2 = ds4_toolmem_new(100, 1 << 20);
    d = fake_open(dir, (uint64_t)1 << 30, mem2, &lg);
    long rchar = proc_field("/proc/self/io", "rchar:");
    CHECK(ds4_kvdisk_find_tool(d, "call_inbig"), "find_tool in a big file");
    rchar = proc_field("/proc/self/io", "rchar:") - rchar;
    CHECK(rchar >= 0 && rchar < 65536, "find_tool read %ld bytes of a %zu-byte file", rchar, BIG_PAYLOAD);
    char *got = ds4_toolmem_get(mem2, "call_inbig");
    CHECK(got && !strcmp(got, "<tool block>"), "find_tool block");
    free(got);
    ds4_kvdisk_close(d);
    ds4_toolmem_free(mem);
    ds4_toolmem_free(mem2);
    rm_dir(dir);
}

/* Defect: a checkpoint just written (0 hits) was evicted at once because
 * older files with a hit outranked it. */
static void test_new_file_survives_eviction(const char *base) {
    char dir[300], path[700];
    logbuf lg = {0};
    const size_t one = 1 << 20;
    ds4_kvdisk *d = fake_dir(base, "evict", dir, sizeof dir, 2 * one + one / 2, NULL, &lg);
    if (!d) return;
    fake_session a = {.n_tokens = 50, .ctx = 1000, .text = "conversation about apples", .bytes = one, .seed = 1};
    fake_session b = {.n_tokens = 50, .ctx = 1000, .text = "conversation about boats", .bytes = one, .seed = 2};
    fake_session c = {.n_tokens = 50, .ctx = 1000, .text = "conversation about clocks", .bytes = one, .seed = 3};
    unsigned seed;
    CHECK(ds4_kvdisk_save(d, AS_SESSION(&a), DS4_KVC_COLD) == 0 && ds4_kvdisk_save(d, AS_SESSION(&b), DS4_KVC_COLD) == 0,
          "save two");
    CHECK(restore_fake(d, a.text, &seed) && seed == 1 && restore_fake(d, b.text, &seed) && seed == 2, "hit both");
    CHECK(ds4_kvdisk_save(d, AS_SESSION(&c), DS4_KVC_COLD) == 0, "save a third over budget");
    fake_path(dir, c.text, path, sizeof path);
    CHECK(access(path, F_OK) == 0, "the file just written was evicted in its own save:\n%s", lg.text);
    CHECK(count_files(dir, ".kv") == 2, "%d files after eviction", count_files(dir, ".kv"));
    ds4_kvdisk_close(d);
    rm_dir(dir);
}

/* Defects: temp files judged by PID (a crashed PID-1 writer's name blocked
 * saves forever; a live writer in another PID namespace could lose its
 * file); a lock file that cannot be opened let saves run unlocked; deletions
 * in rescans without the lock. */
static void test_temps_and_lock(const char *base) {
    char dir[300], path[700];
    logbuf lg = {0};
    ds4_kvdisk *d = fake_dir(base, "temps", dir, sizeof dir, (uint64_t)1 << 30, NULL, &lg);
    if (!d) return;
    fake_session a = {.n_tokens = 50, .ctx = 1000, .text = "conversation about temps", .bytes = 4096, .seed = 5};
    /* a writer that is alive: it holds the lock while its temp file exists */
    int to_child[2], to_parent[2];
    CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0, "pipes");
    pid_t pid = fork();
    if (pid == 0) {
        snprintf(path, sizeof path, "%s/.lock", dir);
        int lock = open(path, O_RDWR | O_CREAT, 0600);
        flock(lock, LOCK_EX);
        snprintf(path, sizeof path, "%s/.kvtmp.live-writer", dir);
        close(open(path, O_WRONLY | O_CREAT, 0600));
        char c = 1;
        if (write(to_parent[1], &c, 1) != 1 || read(to_child[0], &c, 1) != 1) _exit(1);
        _exit(0); /* dies holding the temp file: a crash mid-write */
    }
    char c;
    CHECK(read(to_parent[0], &c, 1) == 1, "child ready");
    unsigned seed;
    restore_fake(d, "anything", &seed);
    CHECK(!ds4_kvdisk_find_tool(d, "call_x"), "find_tool");
    snprintf(path, sizeof path, "%s/.kvtmp.live-writer", dir);
    CHECK(access(path, F_OK) == 0, "a live writer's temp file was deleted without the lock");
    CHECK(write(to_child[1], &c, 1) == 1, "release child");
    int st;
    waitpid(pid, &st, 0);
    /* names a PID-based scheme would keep: PID 1 never "dies" */
    snprintf(path, sizeof path, "%s/.kvtmp.1.0", dir);
    close(open(path, O_WRONLY | O_CREAT, 0600));
    CHECK(ds4_kvdisk_save(d, AS_SESSION(&a), DS4_KVC_COLD) == 0, "save with leftover temp files: %s", lg.text);
    CHECK(count_temps(dir) == 0, "%d leftover temp files after a save", count_temps(dir));

    /* permissions: private directory, private files */
    struct stat sb;
    fake_path(dir, a.text, path, sizeof path);
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600, "cache file mode %o", sb.st_mode & 0777);
    snprintf(path, sizeof path, "%s/.lock", dir);
    CHECK(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600, "lock file mode %o", sb.st_mode & 0777);

    /* a lock file that cannot be opened fails the save, and nothing is
     * deleted without the lock (a damaged file stays) */
    CHECK(unlink(path) == 0 && mkdir(path, 0700) == 0, "lock replaced by a directory");
    fake_session b = {.n_tokens = 50, .ctx = 1000, .text = "conversation about locks", .bytes = 4096, .seed = 6};
    int warn0 = lg.warnings;
    CHECK(ds4_kvdisk_save(d, AS_SESSION(&b), DS4_KVC_COLD) == -1 && lg.warnings > warn0 && strstr(lg.text, ".lock"),
          "save without the lock did not fail");
    fake_path(dir, b.text, path, sizeof path);
    CHECK(access(path, F_OK) != 0 && count_temps(dir) == 0, "save without the lock wrote a file");
    fake_path(dir, a.text, path, sizeof path);
    CHECK(truncate(path, 100) == 0, "damage");
    ds4_kvdisk_close(d);
    d = fake_open(dir, (uint64_t)1 << 30, NULL, &lg);
    CHECK(d && access(path, F_OK) == 0, "damaged file deleted without the lock");
    ds4_kvdisk_close(d);
    rm_dir(dir);
}

/* Defect: the cache directory and files were world-readable, and any
 * directory was accepted; a payload was used without checking that it
 * belongs to the key it was found under. */
static void test_private_dir_and_key(const char *base) {
    char dir[300], path[700], other[700], err[512];
    snprintf(dir, sizeof dir, "%s/created", base);
    logbuf lg = {0};
    ds4_kvdisk *d = fake_open(dir, (uint64_t)1 << 30, NULL, &lg);
    struct stat sb;
    CHECK(stat(dir, &sb) == 0 && (sb.st_mode & 0777) == 0700, "new cache dir mode %o", sb.st_mode & 0777);
    fake_session a = {.n_tokens = 50, .ctx = 1000, .text = "conversation about keys", .bytes = 4096, .seed = 8};
    fake_session b = {.n_tokens = 50, .ctx = 1000, .text = "conversation about locks", .bytes = 4096, .seed = 9};
    CHECK(d && ds4_kvdisk_save(d, AS_SESSION(&a), DS4_KVC_COLD) == 0, "save");
    /* b's file put under a's name: its text is a's prompt prefix no more */
    CHECK(ds4_kvdisk_save(d, AS_SESSION(&b), DS4_KVC_COLD) == 0, "save b");
    fake_path(dir, a.text, path, sizeof path);
    fake_path(dir, b.text, other, sizeof other);
    CHECK(rename(other, path) == 0, "move b over a");
    unsigned seed = 0;
    CHECK(restore_fake(d, "conversation about locks, continued", &seed) == 0 && seed == 0,
          "a file whose key text does not hash to its name was loaded (seed %u)", seed);
    CHECK(access(path, F_OK) != 0, "the misnamed file was not removed");
    ds4_kvdisk_close(d);

    ds4_kvdisk_opts o;
    ds4_kvdisk_opts_default(&o);
    o.dir = dir;
    CHECK(chmod(dir, 0777) == 0, "chmod");
    CHECK(!ds4_kvdisk_open(&o, &fake_host, NULL, on_log, &lg, err, sizeof err) && strstr(err, "writable by group or others"),
          "world-writable dir accepted: %s", err);
    CHECK(chmod(dir, 0770) == 0, "chmod");
    CHECK(!ds4_kvdisk_open(&o, &fake_host, NULL, on_log, &lg, err, sizeof err), "group-writable dir accepted");
    CHECK(chmod(dir, 0700) == 0, "chmod");
    /* owned by someone else: root can make one; others find "/" */
    if (geteuid() == 0) CHECK(chown(dir, 65534, 65534) == 0, "chown");
    else o.dir = "/";
    CHECK(!ds4_kvdisk_open(&o, &fake_host, NULL, on_log, &lg, err, sizeof err) && strstr(err, "owned by uid"),
          "a directory of another user accepted: %s", err);
    rm_dir(dir);
}

/* Defect: fixed 4096-byte path buffers truncated long names silently, so a
 * save went to another (truncated) path. */
static void test_long_dir(const char *base) {
    char dir[4100];
    size_t n = (size_t)snprintf(dir, sizeof dir, "%s", base);
    char comp[201];
    memset(comp, 'd', 200);
    comp[200] = 0;
    /* stop below PATH_MAX for the directory itself, past it with a file name */
    while (n + 201 < 4070) {
        n += (size_t)snprintf(dir + n, sizeof dir - n, "/%s", comp);
        CHECK(mkdir(dir, 0700) == 0, "mkdir level %zu", n);
    }
    n += (size_t)snprintf(dir + n, sizeof dir - n, "/%.*s", (int)(4070 - n - 1), comp);
    CHECK(mkdir(dir, 0700) == 0 && strlen(dir) == 4070, "mkdir %zu-byte dir", strlen(dir));
    logbuf lg = {0};
    ds4_kvdisk *d = fake_open(dir, (uint64_t)1 << 30, NULL, &lg);
    fake_session a = {.n_tokens = 50, .ctx = 1000, .text = "conversation in a deep directory", .bytes = 4096, .seed = 4};
    unsigned seed = 0;
    CHECK(d && ds4_kvdisk_save(d, AS_SESSION(&a), DS4_KVC_COLD) == 0, "save in a long dir:\n%s", lg.text);
    CHECK(d && restore_fake(d, a.text, &seed) == strlen(a.text) && seed == 4, "restore in a long dir:\n%s", lg.text);
    CHECK(count_files(dir, ".kv") == 1, "the file did not land in the long directory");
    ds4_kvdisk_close(d);
    /* remove bottom-up */
    rm_dir(dir);
    for (char *slash; (slash = strrchr(dir, '/')) && (size_t)(slash - dir) > strlen(base);) {
        *slash = 0;
        rmdir(dir);
    }
}

/* Defect: only 64 tool ids of one turn were remembered. */
static void test_many_tool_ids(const char *base) {
    char dir[300];
    logbuf lg = {0};
    ds4_toolmem *mem = ds4_toolmem_new(1000, 1 << 20);
    enum { N = 100 };
    char names[N][24];
    const char *ids[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "call_%03d", i);
        ids[i] = names[i];
    }
    ds4_toolmem_put(mem, ids, N, "<one turn, 100 calls>", 21);
    ds4_kvdisk *d = fake_dir(base, "tools", dir, sizeof dir, (uint64_t)1 << 30, mem, &lg);
    fake_session a = {.n_tokens = 50, .ctx = 1000, .text = "text <one turn, 100 calls> end", .bytes = 4096, .seed = 3};
    CHECK(d && ds4_kvdisk_save(d, AS_SESSION(&a), DS4_KVC_COLD) == 0, "save");
    ds4_kvdisk_close(d);
    ds4_toolmem *mem2 = ds4_toolmem_new(1000, 1 << 20);
    d = fake_open(dir, (uint64_t)1 << 30, mem2, &lg);
    int found = 0;
    for (int i = 0; i < N; i++) found += d && ds4_kvdisk_find_tool(d, ids[i]);
    CHECK(found == N, "%d of %d tool ids of one turn found after a restart", found, N);
    ds4_kvdisk_close(d);
    ds4_toolmem_free(mem);
    ds4_toolmem_free(mem2);
    rm_dir(dir);
}

/* Removes dir and the files (and empty directories) in it. */
/* Defect: a full disk was never recovered from; every later save failed.
 * On a real full file system (a 4 MiB tmpfs in a private mount namespace of
 * a child process): three 1 MiB files fill it, a fourth save meets ENOSPC,
 * evicts the oldest file and succeeds on its retry; a save that could not
 * fit even in an empty cache evicts nothing and fails, which the stats and
 * their "out of space" flag report; a later save that fits clears it. The
 * child exits with its failure count; 100 = the mount was refused. */
static const char *full_disk_not_run;

static void full_disk_scenario(const char *dir) {
    logbuf lg = {0};
    ds4_kvdisk *d = fake_open(dir, (uint64_t)1 << 30, NULL, &lg);
    if (!d) return;
    const size_t mib = (size_t)1 << 20;
    fake_session s[4] = {{.n_tokens = 50, .ctx = 1000, .text = "full disk conversation a", .bytes = mib, .seed = 11},
                         {.n_tokens = 50, .ctx = 1000, .text = "full disk conversation b", .bytes = mib, .seed = 12},
                         {.n_tokens = 50, .ctx = 1000, .text = "full disk conversation c", .bytes = mib, .seed = 13},
                         {.n_tokens = 50, .ctx = 1000, .text = "full disk conversation d", .bytes = mib, .seed = 14}};
    for (int i = 0; i < 3; i++) CHECK(ds4_kvdisk_save(d, AS_SESSION(&s[i]), DS4_KVC_COLD) == 0, "save %d", i);
    ds4_kvdisk_stats st;
    ds4_kvdisk_get_stats(d, &st);
    CHECK(st.saves == 3 && st.nospace_hits == 0, "three files fit: %llu saves", (unsigned long long)st.saves);
    CHECK(ds4_kvdisk_save(d, AS_SESSION(&s[3]), DS4_KVC_COLD) == 0, "the save on a full disk was not recovered:\n%s",
          lg.text);
    ds4_kvdisk_get_stats(d, &st);
    CHECK(st.nospace_hits == 1 && st.nospace_evictions >= 1 && st.fail_nospace == 0 && !st.out_of_space &&
              st.saves == 4, "stats after the recovered save: hits %llu, evictions %llu, failures %llu, flag %d",
          (unsigned long long)st.nospace_hits, (unsigned long long)st.nospace_evictions,
          (unsigned long long)st.fail_nospace, st.out_of_space);
    char path[400];
    fake_path(dir, s[0].text, path, sizeof path);
    CHECK(access(path, F_OK) != 0, "the oldest file was not the one evicted");
    unsigned seed = 0;
    CHECK(restore_fake(d, "full disk conversation d, go on", &seed) == strlen(s[3].text) && seed == 14,
          "the file written after the eviction restores (seed %u)", seed);
    const int files = count_files(dir, ".kv");

    fake_session huge = {.n_tokens = 50, .ctx = 1000, .text = "full disk conversation huge", .bytes = 6 * mib, .seed = 15};
    CHECK(ds4_kvdisk_save(d, AS_SESSION(&huge), DS4_KVC_COLD) == -1, "a 6 MiB file on a 4 MiB disk");
    ds4_kvdisk_get_stats(d, &st);
    CHECK(st.fail_nospace == 1 && st.out_of_space, "stats after a save that cannot fit: failures %llu, flag %d",
          (unsigned long long)st.fail_nospace, st.out_of_space);
    CHECK(count_files(dir, ".kv") == files && count_temps(dir) == 0,
          "a save that cannot fit emptied the cache or left temps (%d files, were %d)", count_files(dir, ".kv"), files);

    fake_session small = {.n_tokens = 50, .ctx = 1000, .text = "full disk conversation small", .bytes = mib / 4,
                          .seed = 16};
    CHECK(ds4_kvdisk_save(d, AS_SESSION(&small), DS4_KVC_COLD) == 0, "a small save after the failure");
    ds4_kvdisk_get_stats(d, &st);
    CHECK(!st.out_of_space, "the out-of-space flag clears after a save succeeds");
    if (check_failed) fprintf(stderr, "cache log:\n%s", lg.text);
    ds4_kvdisk_close(d);
}

static void test_full_disk(const char *base) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/fulldisk", base);
    CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    pid_t pid = fork();
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
            mount("tmpfs", dir, "tmpfs", 0, "size=4m,mode=0700")) {
            fprintf(stderr, "test_kvdisk: cannot mount a tmpfs: %s\n", strerror(errno));
            _exit(100);
        }
        full_disk_scenario(dir);
        _exit(check_failed > 99 ? 99 : check_failed);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 100) {
        full_disk_not_run = "full-disk recovery NOT RUN: a tmpfs could not be mounted (needs root)";
        printf("test_kvdisk: %s\n", full_disk_not_run);
        return;
    }
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "full-disk recovery: %d failures (status %d)",
          WIFEXITED(st) ? WEXITSTATUS(st) : -1, st);
}

static void rm_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(fd, e->d_name, 0)) unlinkat(fd, e->d_name, AT_REMOVEDIR);
    }
    if (d) closedir(d);
    rmdir(dir);
}

int main(void) {
    test_sha1();
    test_policy();
    char dir[] = "/tmp/ds4-kvdisk-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    test_format(dir);
    test_streaming_memory(dir);
    test_new_file_survives_eviction(dir);
    test_temps_and_lock(dir);
    test_private_dir_and_key(dir);
    test_long_dir(dir);
    test_many_tool_ids(dir);
    test_full_disk(dir);
    if (access("models/demo.gguf", R_OK)) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "make -s BUILD=%.500s demo-model >/dev/null 2>&1", getenv("BUILD") ? getenv("BUILD") : "build");
        if (system(cmd)) printf("test_kvdisk: make demo-model failed\n");
    }
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = "models/demo.gguf";
    p.n_threads = 2;
    p.quiet = true;
    char err[512];
    bool have_model = !access(p.model_path, R_OK);
    ds4_engine *e = have_model ? ds4_engine_load(&p, err, sizeof err) : NULL;
    CHECK(!have_model || e, "models/demo.gguf does not load: %s", err);
    if (e) test_cache(e, dir);
    ds4_engine_free(e);
    rm_dir(dir);
    if (full_disk_not_run) return check_skipped("test_kvdisk", full_disk_not_run);
    return have_model ? check_done("test_kvdisk")
                      : check_skipped("test_kvdisk", "models/demo.gguf unavailable, cache tests not run");
}
