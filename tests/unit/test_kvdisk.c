/* test_kvdisk -- the disk KV cache.
 * - SHA-1 against the FIPS 180 example vectors.
 * - KVC files byte for byte against an image built here from the seed's
 *   table (CRC-32 computed bit by bit), every truncation and every bit flip
 *   rejected (except the two in-place fields), foreign versions/flags.
 * - Crash safety: a write that hits RLIMIT_FSIZE leaves neither a partial
 *   file nor a temp file, and an existing file of the same name intact.
 * - Save-point policy with the README defaults.
 * - The cache on models/demo.gguf: save, prefix lookup, restore bit-exact,
 *   hit counts, tool-id map persistence, context and quant rules, damaged
 *   files ignored and removed,
 *   eviction by score, a full disk during save, two processes on one dir.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "chat.h"
#include "check.h"
#include "engine.h"
#include "kvdisk.h"
#include "sha1.h"
#include "tokenizer.h"
#include "toolmem.h"

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

static void test_format(const char *dir) {
    const char text[] = "<\xef\xbd\x9cUser\xef\xbd\x9c>hello";
    unsigned char payload[100];
    for (int i = 0; i < 100; i++) payload[i] = (unsigned char)(i * 7 + 3);
    ds4_kvc_tool tools[2] = {{.id = "call_1", .id_len = 6, .dsml = "\n\n<x>", .dsml_len = 5},
                             {.id = "toolu_22", .id_len = 8, .dsml = "", .dsml_len = 0}};
    ds4_kvc_header h = {.quant_bits = 2, .reason = DS4_KVC_EVICT, .n_tokens = 7, .hits = 3, .ctx = 4096,
                        .created = 1700000000, .last_used = 1700000500, .payload_bytes = 100};
    char err[256];
    CHECK(ds4_kvc_write(dir, "f.kv", &h, text, (uint32_t)strlen(text), payload, tools, 2, err, sizeof err) == 0,
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
        int rc = ds4_kvc_write(dir, "f.kv", &hb, text, (uint32_t)strlen(text), big, NULL, 0, err, sizeof err);
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
    strncat(l->text, line, sizeof l->text - strlen(l->text) - 2);
    strcat(l->text, "\n");
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
    ds4_kvdisk *d = ds4_kvdisk_open(&o, e, mem, on_log, &lg, err, sizeof err);
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
    ds4_kvdisk *d2 = ds4_kvdisk_open(&o, e, mem2, on_log, &lg, err, sizeof err);
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
    d2 = ds4_kvdisk_open(&o, e, mem2, on_log, &lg, err, sizeof err);
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
        CHECK(ds4_kvc_write(dir, name, &hq, v.text, v.text_len, v.payload, v.tools, v.n_tools, err, sizeof err) == 0,
              "rewrite with another quant: %s", err);
        free(v.tools);
        ds4_kvdisk_opts strict = o;
        strict.reject_different_quant = true;
        ds4_kvdisk *ds = ds4_kvdisk_open(&strict, e, NULL, on_log, &lg, err, sizeof err);
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
    d = ds4_kvdisk_open(&o, e, mem, on_log, &lg, err, sizeof err);
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
            ds4_kvdisk *dk = ds4_kvdisk_open(&o, e, NULL, on_log, &l2, err, sizeof err);
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
    d = ds4_kvdisk_open(&o, e, mem, on_log, &lg, err, sizeof err);
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

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[700];
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
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
    return have_model ? check_done("test_kvdisk")
                      : check_skipped("test_kvdisk", "models/demo.gguf unavailable, cache tests not run");
}
