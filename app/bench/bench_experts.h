/* bench_experts.h -- `ds4-bench --expert-policy TRACE`: eviction policies of
 * the expert cache replayed on a recorded routing trace.
 *
 * Contract
 * - The trace is the file --ssd-streaming-trace writes (int32 records:
 *   layer, n, n expert ids; one record per layer per batch). Layer and
 *   expert counts are the largest seen plus one.
 * - Prints a table: slots (as a share of all experts), then hit rates of
 *   aged LFU and plain LRU (ds4_expert_policy_simulate, the cache's own
 *   bookkeeping). Never asserts; returns 0, or -1 with one line on stderr.
 */
#ifndef DS4_BENCH_EXPERTS_H
#define DS4_BENCH_EXPERTS_H

#include <stdio.h>

int ds4_bench_expert_policy(const char *trace_path, FILE *out);

#endif
