/* ds4-bench -- benchmarks. `--kernels` measures memory bandwidth and the
 * CPU kernels (no model needed); model benchmark modes come with the
 * forward pass. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_kernels.h"

static void usage(FILE *f) {
    fprintf(f, "usage: ds4-bench --kernels [-t N]\n"
               "  --kernels   memory bandwidth, matvec GB/s per weight type, matmul GFLOP/s\n"
               "  -t N        threads (default 2); also measured with 1 thread\n");
}

int main(int argc, char **argv) {
    int kernels = 0, threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kernels")) kernels = 1;
        else if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) {
            char *end = NULL;
            long v = i + 1 < argc ? strtol(argv[++i], &end, 10) : 0;
            if (!end || *end || v < 1 || v > 1024) {
                fprintf(stderr, "ds4-bench: -t needs a thread count between 1 and 1024\n");
                return 2;
            }
            threads = (int)v;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "ds4-bench: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!kernels) {
        usage(stderr);
        return 2;
    }
    return ds4_bench_kernels(threads, stdout) ? 1 : 0;
}
