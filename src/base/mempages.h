/* mempages.h -- which page size backs a range of this process's memory, and
 * re-reading a file mapping's range so that it comes back in 2 MiB pages.
 *
 * Why: streaming reads of weights run about twice as fast from memory the
 * kernel maps with 2 MiB (PMD) entries as from 4 KiB pages on the VMs this
 * was measured on (docs/performance.md). A file's page cache holds
 * large folios only when it was read with large read-ahead; once cached in
 * 4 KiB folios it stays so until those pages are dropped and read again.
 *
 * Contract
 * - ds4_smaps_sum_range(text, len, lo, hi, out) parses /proc/<pid>/smaps text
 *   (len bytes, need not be NUL-terminated) and sums the Rss, FilePmdMapped
 *   and AnonHugePages fields (kB) of every entry (one VMA) whose address range
 *   overlaps [lo, hi) (an empty range overlaps none); an overlapping entry
 *   counts whole; sums saturate. Returns the number
 *   of such entries (0: none, *out zeroed). Lines it does not understand are
 *   skipped; it never reads outside text.
 * - ds4_mem_range_sizes(base, len, out, err, errlen): the same over this
 *   process's /proc/self/smaps. False with one line in err when smaps cannot
 *   be read or holds no entry for the range.
 * - ds4_file_range_reread(base, len, fd, offset, err, errlen): [base, base+len)
 *   is (part of) a PROT_READ MAP_SHARED mapping of fd at file offset `offset`,
 *   base page-aligned (len is rounded up to whole pages). Drops this process's page-table entries for it
 *   (MADV_DONTNEED: the mapping and every pointer into it stay valid), marks
 *   it MADV_HUGEPAGE (mmap read-ahead in 2 MiB folios), asks the kernel to
 *   drop the file's cached pages of that range (POSIX_FADV_DONTNEED: pages any
 *   other process maps stay cached), and maps it again (MADV_POPULATE_READ),
 *   which reads what was dropped from the file. The bytes read through the
 *   mapping never change. False with one line in err on the first failing
 *   step; the mapping stays readable either way (a later read faults pages in).
 * - ds4_mem_small_ranges(base, len, fn, ctx, err, errlen): the parts of
 *   [base, base+len) (page-aligned) that this process does not map with huge
 *   (2 MiB) entries, resident in small pages or not resident, as the kernel's
 *   PAGEMAP_SCAN ioctl reports them (Linux 6.7): fn(ctx, lo, hi) once per
 *   maximal such range, in address order, within [base, base+len); fn
 *   returning false stops the scan. Returns the number of calls made, or -1
 *   with one line in err when the kernel has no such ioctl or the scan fails
 *   (callers then fall back to the smaps totals above).
 */
#ifndef DS4_MEMPAGES_H
#define DS4_MEMPAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t rss_kb;        /* resident in this process's page tables */
    uint64_t file_pmd_kb;   /* of which file pages mapped by 2 MiB entries */
    uint64_t anon_huge_kb;  /* of which anonymous memory in transparent huge pages */
} ds4_mem_sizes;

int ds4_smaps_sum_range(const char *text, size_t len, uintptr_t lo, uintptr_t hi, ds4_mem_sizes *out);
bool ds4_mem_range_sizes(const void *base, size_t len, ds4_mem_sizes *out, char *err, size_t errlen);
typedef bool (*ds4_mem_range_fn)(void *ctx, uintptr_t lo, uintptr_t hi);
int ds4_mem_small_ranges(const void *base, size_t len, ds4_mem_range_fn fn, void *ctx, char *err, size_t errlen);
bool ds4_file_range_reread(const void *base, size_t len, int fd, uint64_t offset, char *err, size_t errlen);

/* Memory this process may still use: min(MemAvailable, its memory cgroup's
 * limit, v1 or v2); 0 if unknown. */
uint64_t ds4_memory_available(void);

/* This process's resident memory now (/proc/self/statm); 0 if unknown. */
uint64_t ds4_process_rss_bytes(void);

#endif
