/* tp_split.h -- the arithmetic seam of tensor parallelism (dist/tp.h) that
 * every family's CPU forward pass shares: the exchange callback a rank of a
 * two-rank split calls, and the all-gather of column halves over it.
 *
 * Contract
 * - ds4_cpu_split describes one rank: rank 0 or 1, the routed-expert
 *   boundary mid (rank 0 computes experts [0, mid), rank 1 [mid, n)), and
 *   exchange (NULL: no split). exchange(ud, gate, send, n_send, recv,
 *   n_recv) sends n_send floats to the other rank and fills recv with the
 *   other's n_recv floats; both ranks call it with the same gate, in the
 *   same order. It must fill recv (with anything, on a failed link: the
 *   caller fails the eval and restores the states). The gates a family
 *   uses are its forward pass's (forward_cpu.h, glm_forward.h): three per
 *   layer (3 x layer + k), then one per chunk of output-head rows.
 * - ds4_split_allgather(): x holds T rows of `width` floats of which this
 *   rank computed the columns [c0, c1) and the other rank the rest; one
 *   exchange (gate) through send / recv (T x width floats each at least)
 *   gives each rank the other's columns, so both hold every row whole.
 *   Nothing is summed: every value stays the one its rank computed.
 */
#ifndef DS4_TP_SPLIT_H
#define DS4_TP_SPLIT_H

#include <stddef.h>

typedef struct {
    int rank;   /* 0: (the shared expert and) experts [0, mid); 1: experts [mid, n_expert) */
    int mid;
    void (*exchange)(void *ud, int gate, const float *send, size_t n_send, float *recv, size_t n_recv);
    void *ud;
} ds4_cpu_split;

void ds4_split_allgather(const ds4_cpu_split *sp, int gate, float *x, int T, int width, int c0, int c1, float *send,
                         float *recv);

#endif
