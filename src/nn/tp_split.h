/* tp_split.h -- the arithmetic seam of tensor parallelism (dist/tp.h) that
 * every family's CPU forward pass shares: the link a rank of a two-rank
 * split talks through, the gates it numbers its exchanges by, the halves
 * it cuts, and the schedules both families run on them (the all-gather of
 * column halves, a product split by its rows, the shared expert by halves
 * and the MoE exchange that ends it).
 *
 * Contract
 * - ds4_cpu_split describes one rank: rank 0 or 1, the routed-expert
 *   boundary mid (rank 0 computes experts [0, mid), rank 1 [mid, n)), and
 *   the link (send NULL: no split). send(ud, gate, data, n) queues n floats
 *   for the other rank and returns without waiting for it; recv(ud, gate,
 *   data, n) waits for the other rank's floats of that gate and fills data.
 *   Each gate is one send and one recv on each rank, sends in gate order,
 *   recvs in gate order, and a rank may send a later gate before it
 *   receives an earlier one (the shared expert's activation goes out
 *   before the routed experts run and comes in after). recv must fill data
 *   (with anything, on a failed link: the caller fails the eval and
 *   restores the states).
 * - Gates: DS4_SPLIT_GATES per layer, ds4_split_gate(layer, which), then
 *   the output head's, one per chunk of its rows from
 *   ds4_split_gate(n_layer, 0) on. A layer that does not use a gate (a
 *   dense GLM layer has no shared split or MoE exchange) skips it.
 * - Halves: this rank's share of n items is [ds4_split_lo, + ds4_split_len):
 *   rank 0 the first n / 2, rank 1 the rest (odd n: rank 1 one more).
 * - ds4_split_exchange(): send then recv at one gate.
 * - ds4_split_allgather(): x holds T rows of `width` floats of which this
 *   rank computed the columns [c0, c1) and the other rank the rest; one
 *   exchange (gate) through send / recv (T x width floats each at least)
 *   gives each rank the other's columns, so both hold every row whole.
 * - ds4_split_join(): out (T rows of width) from this rank's half of every
 *   row (own, packed T x len) and the other's (other, packed).
 * - ds4_split_rows(): a product split by W's rows: this rank's half of
 *   them over X into send (packed), one exchange (gate), the whole product
 *   (T x W's rows) joined into out.
 * - The shared expert (F = its width): ds4_split_shared_begin() computes
 *   this rank's half of the gate and up rows over X, their SwiGLU into
 *   act (T x len(F), packed), and sends it; ds4_split_shared_end()
 *   receives the other half into recv, joins the whole activation into
 *   whole (T x F) and computes this rank's half of the down projection's
 *   rows into out (T x len(E), packed). Every value is the one the single
 *   process computes (a row of a product does not depend on which rows
 *   run beside it; SwiGLU is elementwise). ds4_split_moe_exchange() then
 *   sends out (the head of send) with the n_own floats the caller put at
 *   ds4_split_moe_extra(send), receives the other's half and n_other
 *   floats into recv (it returns where those start), and joins the shared
 *   output into shared_out (T x E). Nothing is summed across ranks
 *   anywhere, so nothing changes float order.
 */
#ifndef DS4_TP_SPLIT_H
#define DS4_TP_SPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "format/tensor.h"

struct ds4_pool;

typedef struct {
    int rank;   /* 0: experts [0, mid); 1: experts [mid, n_expert) */
    int mid;
    void (*send)(void *ud, int gate, const float *data, size_t n);
    void (*recv)(void *ud, int gate, float *data, size_t n);
    void *ud;
} ds4_cpu_split;

/* a layer's gates: the attention heads' all-gather, the attention output
 * rows' all-gather, the shared expert's activation, the MoE exchange */
enum { DS4_SPLIT_HEADS, DS4_SPLIT_ATTN_OUT, DS4_SPLIT_SHARED, DS4_SPLIT_MOE, DS4_SPLIT_GATES };

static inline int ds4_split_gate(int layer, int which) { return DS4_SPLIT_GATES * layer + which; }
static inline int ds4_split_lo(const ds4_cpu_split *sp, int n) { return sp->rank ? n / 2 : 0; }
static inline int ds4_split_len(const ds4_cpu_split *sp, int n) { return sp->rank ? n - n / 2 : n / 2; }

void ds4_split_exchange(const ds4_cpu_split *sp, int gate, const float *send, size_t n_send, float *recv,
                        size_t n_recv);
void ds4_split_allgather(const ds4_cpu_split *sp, int gate, float *x, int T, int width, int c0, int c1, float *send,
                         float *recv);
void ds4_split_join(const ds4_cpu_split *sp, int T, int width, const float *own, const float *other, float *out);

/* A family's product: rows [row0, row0 + rows) of W times T rows of X
 * (x_stride apart) into Y (T x rows, packed), with its own accounting. */
typedef struct {
    void (*rows)(void *ctx, const ds4_tensor *W, int64_t row0, int64_t rows, const float *X, size_t x_stride, int T,
                 float *Y);
    void *ctx;
    struct ds4_pool *pool;
} ds4_split_product;

void ds4_split_shared_begin(const ds4_cpu_split *sp, int layer, const ds4_split_product *pr, const ds4_tensor *gate,
                            const ds4_tensor *up, float limit, const float *X, size_t x_stride, int T, float *act,
                            float *up_buf);
void ds4_split_shared_end(const ds4_cpu_split *sp, int layer, const ds4_split_product *pr, const ds4_tensor *down,
                          int T, const float *act, float *recv, float *whole, float *out);
static inline float *ds4_split_moe_extra(const ds4_cpu_split *sp, float *send, int T, int E) {
    return send + (size_t)T * ds4_split_len(sp, E);
}
const float *ds4_split_moe_exchange(const ds4_cpu_split *sp, int layer, int T, int E, const float *send, size_t n_own,
                                    float *recv, size_t n_other, float *shared_out);
void ds4_split_rows(const ds4_cpu_split *sp, int gate, const ds4_split_product *pr, const ds4_tensor *W,
                    const float *X, size_t x_stride, int T, float *send, float *recv, float *out);

#endif
