/* bench_kernels.h -- the kernel benchmark behind `ds4-bench --kernels`.
 *
 * Contract
 * - ds4_bench_kernels(threads, out) measures, in one run, the machine's
 *   memory bandwidth (STREAM-like read, copy and triad over arrays far
 *   larger than the last-level cache, in 2 MiB pages where the kernel gives
 *   them: the table states the share it got) and, for every weight type the
 *   kernels support, matvec throughput in GB/s of weight bytes on a matrix
 *   larger than cache, with 1 and `threads` threads, next to the percentage
 *   of the measured bandwidth, and on an L2-resident matrix (the kernel's
 *   compute ceiling, which explains a low percentage); then matmul (prefill) throughput for a batch
 *   of tokens in GFLOP/s-equivalent (2·rows·n·T / time).
 * - It prints tables to `out` and never asserts; returns 0, or -1 with a
 *   one-line message on stderr when memory cannot be allocated.
 * - Timings take the best of several repetitions, as STREAM does, so a
 *   busy shared machine disturbs the numbers as little as possible; a
 *   result whose best run did not get the requested cores (process CPU
 *   time < 90% of threads x wall time) is marked '*' as a lower bound.
 */
#ifndef DS4_BENCH_KERNELS_H
#define DS4_BENCH_KERNELS_H

#include <stdio.h>

int ds4_bench_kernels(int threads, FILE *out);

#endif
