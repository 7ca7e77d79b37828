/* test_mempages.c -- page sizes behind mappings and the re-read into 2 MiB
 * pages (src/base/mempages.c, ds4_gguf_prefer_large_pages, the engine's load).
 *
 * The smaps parser runs on a captured /proc/self/smaps (tests/fixtures/smaps:
 * a 64 MiB MADV_HUGEPAGE anonymous buffer, then one file mapped as two VMAs,
 * the first half in 4 KiB pages, the second re-read into 2 MiB ones), against
 * the figures printed in it. Whether this kernel gives 2 MiB folios is the
 * machine's business, so the re-read tests check the invariants that hold
 * either way: the bytes and the pointers do not change, every page is mapped
 * afterwards, a model loads and computes bit-identical logits. The kernel's
 * list of small-page ranges (PAGEMAP_SCAN, Linux 6.7+) is checked against
 * the kernel's other account of the same pages, the smaps totals; on an
 * older kernel those checks print NOT RUN. */
#include "check.h"
#include "engine/engine.h"
#include "engine_load.h"
#include "format/gguf.h"
#include "base/mempages.h"
#include "kernels/quant.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static char err[512];

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 16);
    *len = buf ? fread(buf, 1, 1 << 16, f) : 0;
    fclose(f);
    return buf;
}

static void test_smaps_fixture(void) {
    size_t len = 0;
    char *text = read_all("tests/fixtures/smaps/sample.txt", &len);
    CHECK(text && len > 0, "fixture");
    if (!text) return;
    ds4_mem_sizes m;
    const uintptr_t file_lo = 0x7f25aac00000, file_mid = 0x7f25b2c00000, file_hi = 0x7f25bac00000;
    CHECK(ds4_smaps_sum_range(text, len, file_lo, file_mid, &m) == 1 && m.rss_kb == 131072 && m.file_pmd_kb == 0,
          "first half: %d entries? rss %llu pmd %llu", ds4_smaps_sum_range(text, len, file_lo, file_mid, &m),
          (unsigned long long)m.rss_kb, (unsigned long long)m.file_pmd_kb);
    CHECK(ds4_smaps_sum_range(text, len, file_lo, file_hi, &m) == 2 && m.rss_kb == 262144 &&
          m.file_pmd_kb == 131072 && m.anon_huge_kb == 0, "both halves of the file");
    CHECK(ds4_smaps_sum_range(text, len, file_mid + 4096, file_mid + 8192, &m) == 1 && m.file_pmd_kb == 131072,
          "an overlapping entry counts whole");
    CHECK(ds4_smaps_sum_range(text, len, 0x7f373a200000, 0x7f373e200000, &m) == 1 && m.anon_huge_kb == 65536 &&
          m.rss_kb == 65536 && m.file_pmd_kb == 0, "anonymous huge pages");
    CHECK(ds4_smaps_sum_range(text, len, file_hi, 0x7f25badff000, &m) == 0 && m.rss_kb == 0,
          "a gap between entries has none");
    /* every truncation parses to at most the whole text's figures */
    bool bounded = true;
    for (size_t n = 0; n <= len; n++) {
        const int entries = ds4_smaps_sum_range(text, n, file_lo, file_hi, &m);
        bounded &= entries <= 2 && m.rss_kb <= 262144 && m.file_pmd_kb <= 131072;
    }
    CHECK(bounded, "truncated text stays within the whole text's sums");
    free(text);
    const char *junk = "zz-10 x\n7f-\nRss: kB\n10000000000000000-10000000000000001 r--s\nRss: 4 kB\n-1 \n";
    CHECK(ds4_smaps_sum_range(junk, strlen(junk), 0, UINTPTR_MAX, &m) == 0 && m.rss_kb == 0,
          "malformed headers (17 hex digits, no end address) are not entries");
}

/* Leaves a file's page cache in 4 KiB folios, the state a re-read improves:
 * drop it, then read it back in page-sized reads without read-ahead. */
static bool small_page_cache(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char page[4096];
    bool ok = fdatasync(fd) == 0 && !posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) &&
              !posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    for (off_t at = 0; ok; at += (off_t)sizeof page) {
        const ssize_t got = pread(fd, page, sizeof page, at);
        ok = got >= 0;
        if (got < (ssize_t)sizeof page) break;
    }
    close(fd);
    return ok;
}

static uint64_t checksum(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static char tmpdir[] = "/tmp/test_mempages_XXXXXX";

static void test_reread_file(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/pattern.bin", tmpdir);
    const size_t len = (size_t)8 << 20;
    FILE *f = fopen(path, "wb");
    bool written = f != NULL;
    for (size_t i = 0; written && i < len; i += 8) {
        const uint64_t v = i * 0x9e3779b97f4a7c15ull;
        written = fwrite(&v, 8, 1, f) == 1;
    }
    if (f) written &= fclose(f) == 0;
    CHECK(written && small_page_cache(path), "write %s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    const uint8_t *map = fd >= 0 ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    CHECK(map != MAP_FAILED, "mmap");
    if (map == MAP_FAILED) { if (fd >= 0) close(fd); return; }
    const uint64_t before = checksum(map, len);
    CHECK(ds4_file_range_reread(map, len, fd, 0, err, sizeof err), "re-read: %s", err);
    ds4_mem_sizes m;
    CHECK(ds4_mem_range_sizes(map, len, &m, err, sizeof err) && m.rss_kb == len >> 10,
          "every page mapped after the re-read: %llu of %zu kB", (unsigned long long)m.rss_kb, len >> 10);
    CHECK(checksum(map, len) == before, "the same bytes through the same pointer");
    /* a failing step leaves the mapping readable */
    CHECK(!ds4_file_range_reread(map + len / 2, len / 2, -1, len / 2, err, sizeof err) && strstr(err, "dropping the cached pages"),
          "a bad descriptor is one error line: %s", err);
    CHECK(checksum(map, len) == before, "still the same bytes after a failed re-read");
    munmap((void *)map, len);
    close(fd);
    CHECK(!ds4_mem_range_sizes(map, len, &m, err, sizeof err) && strstr(err, "no entry"), "unmapped: %s", err);
    unlink(path);
}

/* the ranges one scan reports: their count, bytes and bounds */
typedef struct { int calls, stop_after; uintptr_t lo, hi, first_lo, last_hi; uint64_t bytes; bool ordered; } range_sum;

static bool sum_range(void *ctx, uintptr_t lo, uintptr_t hi) {
    range_sum *r = ctx;
    r->ordered &= lo < hi && lo >= r->lo && hi <= r->hi && (r->calls == 0 || lo > r->last_hi);
    if (r->calls++ == 0) r->first_lo = lo;
    r->last_hi = hi;
    r->bytes += hi - lo;
    return r->stop_after == 0 || r->calls < r->stop_after;
}

static int scan(const void *base, size_t len, range_sum *r, int stop_after) {
    *r = (range_sum){.stop_after = stop_after, .lo = (uintptr_t)base, .hi = (uintptr_t)base + len, .ordered = true};
    return ds4_mem_small_ranges(base, len, sum_range, r, err, sizeof err);
}

static bool can_list_small_ranges(void) {
    range_sum r;
    static char probe[4096] __attribute__((aligned(4096)));
    return scan(probe, sizeof probe, &r, 0) >= 0;
}

/* 8 MiB of anonymous memory, 2 MiB aligned and its own VMA */
static uint8_t *anon_aligned(size_t len, int advice) {
    const size_t pmd = (size_t)2 << 20;
    uint8_t *raw = mmap(NULL, len + pmd, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)raw + pmd - 1) & ~(uintptr_t)(pmd - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + len + pmd > p + len) munmap(p + len, (size_t)(raw + len + pmd - (p + len)));
    (void)madvise(p, len, advice);
    return p;
}

static void test_small_ranges(void) {
    if (!can_list_small_ranges()) {
        printf("  NOT RUN: listing small-page ranges (%s)\n", err);
        return;
    }
    const size_t len = (size_t)8 << 20, pmd = (size_t)2 << 20;
    range_sum r;
    /* never touched: nothing resident, all of it outside huge entries */
    uint8_t *p = anon_aligned(len, MADV_NOHUGEPAGE);
    CHECK(p && scan(p, len, &r, 0) == 1 && r.ordered && r.first_lo == (uintptr_t)p && r.bytes == len,
          "an untouched mapping is one range of %zu bytes: %d calls, %llu bytes", len, r.calls,
          (unsigned long long)r.bytes);
    if (!p) return;
    memset(p, 1, len);
    CHECK(scan(p, len, &r, 0) == 1 && r.bytes == len, "4 KiB pages: one range");
    CHECK(scan(p + 4096, 2 * 4096, &r, 0) == 1 && r.first_lo == (uintptr_t)p + 4096 && r.bytes == 2 * 4096,
          "a scan stays within its range");
    munmap(p, len);

    /* huge pages where the kernel gives them, then one 4 KiB page dropped
     * from the second 2 MiB page (which then cannot stay one entry): the
     * ranges listed add up to what smaps counts outside huge pages */
    p = anon_aligned(len, MADV_HUGEPAGE);
    CHECK(p != NULL, "mmap");
    if (!p) return;
    memset(p, 2, len);
    CHECK(madvise(p + pmd + 4096, 4096, MADV_DONTNEED) == 0, "drop one page");
    ds4_mem_sizes m;
    const int calls = scan(p, len, &r, 0);
    CHECK(ds4_mem_range_sizes(p, len, &m, err, sizeof err) && calls >= 1 && r.ordered &&
              r.bytes == len - m.anon_huge_kb * 1024,
          "listed %llu bytes outside huge pages, smaps %llu kB huge of %zu", (unsigned long long)r.bytes,
          (unsigned long long)m.anon_huge_kb, len >> 10);
    if (m.anon_huge_kb)
        CHECK(r.first_lo <= (uintptr_t)p + pmd && r.last_hi >= (uintptr_t)p + 2 * pmd,
              "the 2 MiB page with a hole is listed");
    printf("  anonymous: %llu of %zu kB in 2 MiB pages, %d small range(s)\n", (unsigned long long)m.anon_huge_kb,
           len >> 10, calls);
    /* the callback stops the scan */
    memset(p, 3, len);
    CHECK(madvise(p, 4096, MADV_DONTNEED) == 0 && madvise(p + 3 * pmd, 4096, MADV_DONTNEED) == 0, "two holes");
    if (scan(p, len, &r, 0) >= 2) CHECK(scan(p, len, &r, 1) == 1 && r.calls == 1, "stopped after the first range");
    munmap(p, len);
}

static int fill_pattern(void *ctx, size_t idx, void *dst, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)(idx * 7 + i * 13 + (i >> 12));
    return 0;
}

/* A GGUF at path with one F32 tensor "w" of `mib` MiB, its page cache left
 * in 4 KiB folios, opened and populated. */
static ds4_gguf *small_cached_gguf(const char *path, uint64_t mib) {
    ds4_gguf_writer *w = ds4_gguf_writer_new(0);
    ds4_gguf_w_tensor(w, "w", DS4_TYPE_F32, 2, (uint64_t[2]){(uint64_t)1 << 20, mib / 4}, NULL);
    CHECK(ds4_gguf_writer_write_file(w, path, fill_pattern, NULL, err, sizeof err) == 0, "write: %s", err);
    ds4_gguf_writer_free(w);
    CHECK(small_page_cache(path), "page cache of %s", path);
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g && ds4_gguf_populate(g, err, sizeof err), "open and populate: %s", err);
    return g;
}

static void test_gguf_large_pages(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/w.gguf", tmpdir);
    ds4_gguf *g = small_cached_gguf(path, 12);
    if (!g) return;
    const ds4_gguf_tensor *t = ds4_gguf_find_tensor(g, "w");
    const void *data = t->data;
    const uint64_t before = checksum(data, t->n_bytes);
    ds4_gguf_pages r;
    const bool large = ds4_gguf_prefer_large_pages(g, (uint64_t)4 << 20, &r);
    CHECK(ds4_gguf_find_tensor(g, "w")->data == data && checksum(data, t->n_bytes) == before,
          "tensor pointer and bytes unchanged");
    CHECK(r.before >= 0 && r.before <= 1 && r.after >= 0 && r.after <= 1, "shares %f %f", r.before, r.after);
    CHECK(large || r.note[0], "a reason when not in large pages");
    CHECK(!r.reread || large, "a completed re-read reports success");
    printf("  this kernel: 2 MiB entries %.0f%% -> %.0f%%, %s%s\n", 100 * r.before, 100 * r.after,
           r.reread ? "re-read" : "not re-read: ", r.note);
    ds4_gguf_close(g);

    /* Part of the cache back in 2 MiB pages, the rest in 4 KiB ones (as after
     * a partial eviction), with the probe's piece among the large part: the
     * existing 2 MiB entries prove the kernel makes them, so everything is
     * re-read even though the probe piece itself could not gain. */
    CHECK(small_page_cache(path), "page cache of %s", path);
    g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g && ds4_gguf_populate(g, err, sizeof err), "open and populate again: %s", err);
    if (!g) return;
    t = ds4_gguf_find_tensor(g, "w");
    const uint8_t *base = (const uint8_t *)t->data - t->file_offset;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0 && ds4_file_range_reread(base, (size_t)4 << 20, fd, 0, err, sizeof err), "re-read 4 MiB: %s", err);
    if (fd >= 0) close(fd);
    const bool partial_ok = ds4_gguf_prefer_large_pages(g, (uint64_t)4 << 20, &r);
    CHECK(checksum(t->data, t->n_bytes) == before, "bytes unchanged after the partial case");
    const uint64_t whole_pages = ds4_gguf_file_bytes(g) & ~(((uint64_t)2 << 20) - 1);
    if (r.before > 0) { /* this kernel made 2 MiB entries of the first 4 MiB */
        CHECK(partial_ok && r.reread && r.after > r.before, "partial cache re-read: %.0f%% -> %.0f%% (%s)",
              100 * r.before, 100 * r.after, r.note);
        /* listed: only the small part of the whole 2 MiB pages is read again */
        if (can_list_small_ranges())
            CHECK(r.reread_bytes == whole_pages - ((uint64_t)4 << 20), "re-read %llu bytes, the small part is %llu",
                  (unsigned long long)r.reread_bytes, (unsigned long long)(whole_pages - ((uint64_t)4 << 20)));
    }
    printf("  partial cache: 2 MiB entries %.0f%% -> %.0f%%, %s%s\n", 100 * r.before, 100 * r.after,
           r.reread ? "re-read" : "not re-read: ", r.note);
    ds4_gguf_close(g);
    unlink(path);

    /* a GGUF in a caller's buffer has no file behind it */
    snprintf(path, sizeof path, "%s/s.gguf", tmpdir);
    ds4_gguf_writer *w = ds4_gguf_writer_new(0);
    ds4_gguf_w_tensor(w, "s", DS4_TYPE_F32, 2, (uint64_t[2]){64, 2}, NULL);
    CHECK(ds4_gguf_writer_write_file(w, path, fill_pattern, NULL, err, sizeof err) == 0, "write: %s", err);
    ds4_gguf_writer_free(w);
    size_t len = 0;
    char *img = read_all(path, &len);
    g = img ? ds4_gguf_open_buffer(img, len, err, sizeof err) : NULL;
    CHECK(g && !ds4_gguf_prefer_large_pages(g, (uint64_t)4 << 20, &r) && strstr(r.note, "not a file mapping"),
          "a buffer: %s", g ? r.note : err);
    ds4_gguf_close(g);
    free(img);
    unlink(path);
}

/* A cache mostly in 2 MiB pages already (22 of 24 MiB, 92%): where the
 * kernel lists the small parts, only those 2 MiB are read again (a share
 * above 90% was once left as it was); the scan of the file mapping agrees
 * with smaps before and after. */
static void test_gguf_mostly_large(void) {
    char path[128];
    snprintf(path, sizeof path, "%s/m.gguf", tmpdir);
    ds4_gguf *g = small_cached_gguf(path, 24);
    if (!g) return;
    const ds4_gguf_tensor *t = ds4_gguf_find_tensor(g, "w");
    const uint8_t *base = (const uint8_t *)t->data - t->file_offset;
    const size_t mapped = (size_t)((ds4_gguf_file_bytes(g) + 4095) & ~(uint64_t)4095);
    const uint64_t sum = checksum(t->data, t->n_bytes), pmd = (uint64_t)2 << 20;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0 && ds4_file_range_reread(base, (size_t)(11 * pmd), fd, 0, err, sizeof err), "re-read 22 MiB: %s",
          err);
    if (fd >= 0) close(fd);
    range_sum listed;
    ds4_mem_sizes m;
    const bool can_list = can_list_small_ranges();
    if (can_list)
        CHECK(scan(base, mapped, &listed, 0) >= 1 && ds4_mem_range_sizes(base, mapped, &m, err, sizeof err) &&
                  listed.bytes == (m.rss_kb - m.file_pmd_kb) * 1024,
              "listed %llu bytes in small pages, smaps %llu kB of %llu kB", (unsigned long long)listed.bytes,
              (unsigned long long)(m.rss_kb - m.file_pmd_kb), (unsigned long long)m.rss_kb);
    ds4_gguf_pages r;
    const bool ok = ds4_gguf_prefer_large_pages(g, (uint64_t)4 << 20, &r);
    CHECK(checksum(t->data, t->n_bytes) == sum, "bytes unchanged");
    if (!can_list)
        printf("  NOT RUN: re-reading only the small parts (%s)\n", err);
    else if (r.before < 0.9)
        printf("  NOT RUN: this kernel kept the 22 MiB re-read in small pages (%.0f%%)\n", 100 * r.before);
    else {
        CHECK(ok && r.reread && r.reread_bytes == 12 * pmd - 11 * pmd && r.after > r.before,
              "%.0f%% in 2 MiB pages: re-read %llu bytes -> %.0f%% (%s)", 100 * r.before,
              (unsigned long long)r.reread_bytes, 100 * r.after, r.note);
        CHECK(scan(base, mapped, &listed, 0) >= 0 && ds4_mem_range_sizes(base, mapped, &m, err, sizeof err) &&
                  listed.bytes == (m.rss_kb - m.file_pmd_kb) * 1024 && listed.bytes < pmd,
              "after: listed %llu bytes in small pages (the file's tail), smaps %llu kB",
              (unsigned long long)listed.bytes, (unsigned long long)(m.rss_kb - m.file_pmd_kb));
    }
    printf("  mostly large: 2 MiB entries %.0f%% -> %.0f%%, %llu bytes re-read\n", 100 * r.before, 100 * r.after,
           (unsigned long long)r.reread_bytes);
    ds4_gguf_close(g);
    unlink(path);
}

/* The engine re-reads at load: a model loaded from a page cache in 4 KiB
 * pages computes what it computed before, bit for bit (test_forward checks
 * the same file against transformers' logits). */
static void test_engine_logits(void) {
    const char *build = getenv("BUILD");
    char path[512];
    snprintf(path, sizeof path, "%s/ds4tiny/A-f32.gguf", build ? build : "build");
    const int32_t toks[] = {1, 17, 42, 99, 3, 250, 7, 64};
    const int n = (int)(sizeof toks / sizeof toks[0]);
    float *logits[2] = {NULL, NULL};
    for (int run = 0; run < 2; run++) {
        if (run == 1) CHECK(small_page_cache(path), "page cache of %s", path);
        ds4_engine *e = test_engine_load(path, 0, 0);
        CHECK(e != NULL, "load %s", path);
        if (!e) break;
        const size_t V = (size_t)ds4_engine_n_vocab(e);
        ds4_session *s = ds4_session_new(e, 64, err, sizeof err);
        logits[run] = malloc((size_t)n * V * sizeof(float));
        CHECK(s && logits[run] && ds4_session_prefill(s, toks, n, logits[run], NULL, NULL, err, sizeof err) == 0,
              "prefill: %s", err);
        if (run == 1 && logits[0])
            CHECK(memcmp(logits[0], logits[1], (size_t)n * V * sizeof(float)) == 0, "bit-identical logits");
        ds4_session_free(s);
        ds4_engine_free(e);
    }
    free(logits[0]);
    free(logits[1]);
}

int main(void) {
    test_smaps_fixture();
    CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp");
    test_small_ranges();
    test_reread_file();
    test_gguf_large_pages();
    test_gguf_mostly_large();
    rmdir(tmpdir);
    test_engine_logits();
    return check_done("test_mempages");
}
