/* mempages.c -- page sizes behind memory ranges, re-reading file ranges
 * into large folios; contract in mempages.h. */
#include "base/mempages.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Parses up to 16 hex digits at *p (< end); false when there are none or too many. */
static bool parse_hex(const char **p, const char *end, uint64_t *out) {
    uint64_t v = 0;
    int n = 0;
    for (; *p < end && hex_digit(**p) >= 0; (*p)++, n++) {
        if (n == 16) return false;
        v = v << 4 | (uint64_t)hex_digit(**p);
    }
    *out = v;
    return n > 0;
}

/* A VMA header line: "START-END perms offset dev inode [path]". */
static bool parse_header(const char *line, const char *end, uint64_t *start, uint64_t *stop) {
    const char *p = line;
    if (!parse_hex(&p, end, start) || p >= end || *p != '-') return false;
    p++;
    return parse_hex(&p, end, stop) && p < end && *p == ' ';
}

/* "Name:   123 kB": the value when the line is that field. */
static bool parse_field(const char *line, const char *end, const char *name, uint64_t *kb) {
    const size_t n = strlen(name);
    if ((size_t)(end - line) <= n || memcmp(line, name, n) || line[n] != ':') return false;
    const char *p = line + n + 1;
    while (p < end && *p == ' ') p++;
    uint64_t v = 0;
    int digits = 0;
    for (; p < end && *p >= '0' && *p <= '9' && digits < 19; p++, digits++) v = v * 10 + (uint64_t)(*p - '0');
    *kb = v;
    return digits > 0;
}

/* A hostile text cannot wrap a sum around. */
static void add_kb(uint64_t *sum, uint64_t kb) { *sum = kb > UINT64_MAX - *sum ? UINT64_MAX : *sum + kb; }

int ds4_smaps_sum_range(const char *text, size_t len, uintptr_t lo, uintptr_t hi, ds4_mem_sizes *out) {
    memset(out, 0, sizeof *out);
    int entries = 0;
    bool inside = false;
    for (const char *line = text, *end = text + len; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) eol = end;
        uint64_t start, stop, kb;
        if (parse_header(line, eol, &start, &stop)) {
            inside = lo < hi && start < hi && stop > lo;
            entries += inside && entries < INT32_MAX;
        } else if (inside) {
            if (parse_field(line, eol, "Rss", &kb)) add_kb(&out->rss_kb, kb);
            else if (parse_field(line, eol, "FilePmdMapped", &kb)) add_kb(&out->file_pmd_kb, kb);
            else if (parse_field(line, eol, "AnonHugePages", &kb)) add_kb(&out->anon_huge_kb, kb);
        }
        line = eol + 1;
    }
    return entries;
}

/* /proc files have no size: read until EOF into a growing buffer. */
static char *read_proc(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (ssize_t got = 1; buf && got > 0;) {
        if (n == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) { free(buf); buf = NULL; break; }
            buf = bigger;
            cap *= 2;
        }
        got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) { got = 1; continue; }
        if (got < 0) { free(buf); buf = NULL; break; }
        n += (size_t)got;
    }
    close(fd);
    *len = n;
    return buf;
}

bool ds4_mem_range_sizes(const void *base, size_t len, ds4_mem_sizes *out, char *err, size_t errlen) {
    size_t n = 0;
    char *text = read_proc("/proc/self/smaps", &n);
    if (!text) {
        snprintf(err, errlen, "cannot read /proc/self/smaps: %s", strerror(errno));
        return false;
    }
    const uintptr_t lo = (uintptr_t)base;
    const int entries = ds4_smaps_sum_range(text, n, lo, lo + len, out);
    free(text);
    if (!entries) snprintf(err, errlen, "/proc/self/smaps has no entry for the mapping at %p", base);
    return entries > 0;
}

bool ds4_file_range_reread(const void *base, size_t len, int fd, uint64_t offset, char *err, size_t errlen) {
    void *p = (void *)base;
    const char *step = NULL;
    /* Our own mapping pins the cached pages; fadvise drops only unmapped ones. */
    if (madvise(p, len, MADV_DONTNEED)) step = "dropping the mapping's page-table entries";
    /* VM_HUGEPAGE makes the fault path read ahead in PMD-sized folios, as
     * large as the ones a sequential read() with a big read-ahead window gets. */
    else if (madvise(p, len, MADV_HUGEPAGE)) step = "MADV_HUGEPAGE";
    else if ((errno = posix_fadvise(fd, (off_t)offset, (off_t)len, POSIX_FADV_DONTNEED))) step = "dropping the cached pages";
    else if (madvise(p, len, MADV_POPULATE_READ)) step = "reading the file again";
    if (step) snprintf(err, errlen, "%s: %s", step, strerror(errno));
    return step == NULL;
}

/* The PAGEMAP_SCAN ioctl of /proc/<pid>/pagemap (Linux 6.7, uapi
 * linux/fs.h), spelled out here because the C library's kernel headers may
 * predate it; the layout is the kernel's ABI. */
struct pm_page_region {
    uint64_t start, end, categories;
};
struct pm_scan_arg {
    uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
    uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define PM_PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PM_PAGE_IS_HUGE (1u << 6)

int ds4_mem_small_ranges(const void *base, size_t len, ds4_mem_range_fn fn, void *ctx, char *err, size_t errlen) {
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open /proc/self/pagemap: %s", strerror(errno));
        return -1;
    }
    /* pages whose categories, HUGE inverted, match HUGE: every page not in a
     * huge mapping (4 KiB resident or not resident); returning only that
     * category lets the kernel merge neighbours into one region */
    struct pm_page_region vec[64];
    const uint64_t hi = (uintptr_t)base + len;
    uint64_t at = (uintptr_t)base, lo = 0, end = 0;  /* [lo, end): the range not yet passed to fn */
    int count = 0;
    bool go = true;
    while (go && at < hi) {
        struct pm_scan_arg a = {.size = sizeof a, .start = at, .end = hi, .vec = (uintptr_t)vec,
                                .vec_len = sizeof vec / sizeof vec[0], .category_inverted = PM_PAGE_IS_HUGE,
                                .category_mask = PM_PAGE_IS_HUGE, .return_mask = PM_PAGE_IS_HUGE};
        const long got = ioctl(fd, PM_PAGEMAP_SCAN, &a);
        if (got < 0) {
            if (errno == EINTR) continue;
            snprintf(err, errlen, "PAGEMAP_SCAN: %s", errno == ENOTTY || errno == EINVAL ? "not in this kernel (6.7+)" : strerror(errno));
            close(fd);
            return -1;
        }
        for (long i = 0; go && i < got; i++) {
            if (end && vec[i].start == end) { end = vec[i].end; continue; }
            if (end) { go = fn(ctx, (uintptr_t)lo, (uintptr_t)end); count++; }
            lo = vec[i].start;
            end = vec[i].end;
        }
        /* the walk stops early when vec fills; it never goes backwards */
        if (a.walk_end <= at) break;
        at = a.walk_end;
    }
    if (go && end) { fn(ctx, (uintptr_t)lo, (uintptr_t)end); count++; }
    close(fd);
    return count;
}

static uint64_t read_u64_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[64] = {0};
    uint64_t v = 0;
    if (fgets(buf, sizeof buf, f) && strncmp(buf, "max", 3)) v = strtoull(buf, NULL, 10);
    fclose(f);
    return v;
}

/* The memory cgroup of this process (v1 "N:memory:/path", v2 "0::/path"). */
static uint64_t cgroup_limit(void) {
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return 0;
    char line[512], path[700];
    uint64_t limit = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c2 = 0;
        const char *ctrl = c1 + 1, *rel = c2 + 1;
        uint64_t v = 0;
        if (!strcmp(ctrl, "memory")) {
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", rel);
            v = read_u64_file(path);
        } else if (!*ctrl) {
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", rel);
            v = read_u64_file(path);
        }
        /* v1 writes "no limit" as a huge page-rounded number */
        if (v && v < (1ull << 60) && (!limit || v < limit)) limit = v;
    }
    fclose(f);
    return limit;
}

uint64_t ds4_memory_available(void) {
    uint64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (uint64_t)kb << 10;
        fclose(f);
    }
    uint64_t cg = cgroup_limit();
    if (cg && (!avail || cg < avail)) avail = cg;
    return avail;
}

uint64_t ds4_process_rss_bytes(void) {
    unsigned long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
    fclose(f);
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}
