/* Fuzz target: the /proc/<pid>/smaps parser (mempages.h).
 * The first 16 bytes choose an address range, the rest is the text.
 * Invariants (abort() on violation): an entry counts whole or not at all,
 * so a range's entries and sums never exceed those of the whole address
 * space; an empty range has no entry. */
#include "base/mempages.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint64_t bounds[2] = {0, 0};
    const size_t head = size < sizeof bounds ? size : sizeof bounds;
    memcpy(bounds, data, head);
    const char *text = (const char *)data + head;
    const size_t len = size - head;
    const uintptr_t lo = (uintptr_t)(bounds[0] < bounds[1] ? bounds[0] : bounds[1]);
    const uintptr_t hi = (uintptr_t)(bounds[0] < bounds[1] ? bounds[1] : bounds[0]);
    ds4_mem_sizes part, all;
    const int n_part = ds4_smaps_sum_range(text, len, lo, hi, &part);
    const int n_all = ds4_smaps_sum_range(text, len, 0, UINTPTR_MAX, &all);
    if (n_part < 0 || n_part > n_all) abort();
    if (part.rss_kb > all.rss_kb || part.file_pmd_kb > all.file_pmd_kb || part.anon_huge_kb > all.anon_huge_kb)
        abort();
    if (lo == hi && (ds4_smaps_sum_range(text, len, lo, lo, &part) != 0 || part.rss_kb)) abort();
    return 0;
}
