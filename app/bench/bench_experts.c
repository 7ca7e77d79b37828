/* bench_experts.c -- eviction policies on a recorded routing trace. */
#include "bench_experts.h"
#include "models/dsv4/expert_cache.h"

#include <stdint.h>
#include <stdlib.h>

int ds4_bench_expert_policy(const char *trace_path, FILE *out) {
    FILE *f = fopen(trace_path, "rb");
    if (!f) { fprintf(stderr, "ds4-bench: cannot open %s\n", trace_path); return -1; }
    size_t cap = 1 << 16, n = 0;
    int32_t *trace = malloc(cap * sizeof *trace);
    size_t got;
    while (trace && (got = fread(trace + n, sizeof *trace, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            int32_t *grown = realloc(trace, 2 * cap * sizeof *trace);
            if (!grown) { free(trace); trace = NULL; break; }
            trace = grown;
            cap *= 2;
        }
    }
    fclose(f);
    if (!trace) { fprintf(stderr, "ds4-bench: out of memory reading %s\n", trace_path); return -1; }
    int n_layer = 0, n_expert = 0;
    size_t records = 0, i = 0;
    for (; i + 2 <= n; records++) {
        const int layer = trace[i], cnt = trace[i + 1];
        if (layer < 0 || cnt < 0 || i + 2 + (size_t)cnt > n) break;
        if (layer + 1 > n_layer) n_layer = layer + 1;
        for (int j = 0; j < cnt; j++) if (trace[i + 2 + j] + 1 > n_expert) n_expert = trace[i + 2 + j] + 1;
        i += 2 + (size_t)cnt;
    }
    if (i != n || !records || !n_expert) {
        fprintf(stderr, "ds4-bench: %s is not a routing trace (record %zu is malformed)\n", trace_path, records);
        free(trace);
        return -1;
    }
    fprintf(out, "routing trace: %zu records, %d layers x %d experts\n", records, n_layer, n_expert);
    fprintf(out, "| slots | share of experts | aged LFU hit rate | LRU hit rate |\n|---:|---:|---:|---:|\n");
    static const int percent[] = {5, 10, 25, 50, 75};
    const int all = n_layer * n_expert;
    for (size_t p = 0; p < sizeof percent / sizeof percent[0]; p++) {
        const int slots = all * percent[p] / 100 > 0 ? all * percent[p] / 100 : 1;
        uint64_t acc = 0;
        const uint64_t lfu = ds4_expert_policy_simulate(DS4_EVICT_LFU_AGED, n_layer, n_expert, slots, trace, n, &acc);
        const uint64_t lru = ds4_expert_policy_simulate(DS4_EVICT_LRU, n_layer, n_expert, slots, trace, n, NULL);
        fprintf(out, "| %d | %d%% | %.1f%% | %.1f%% |\n", slots, percent[p], acc ? 100.0 * lfu / acc : 0.0,
                acc ? 100.0 * lru / acc : 0.0);
    }
    free(trace);
    return 0;
}
