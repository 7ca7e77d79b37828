/* tp_split.c -- the shared schedules of a two-rank split (see tp_split.h). */
#include "nn/tp_split.h"

#include "nn/nn_math.h"

#include <string.h>

void ds4_split_exchange(const ds4_cpu_split *sp, int gate, const float *send, size_t n_send, float *recv,
                        size_t n_recv) {
    sp->send(sp->ud, gate, send, n_send);
    sp->recv(sp->ud, gate, recv, n_recv);
}

void ds4_split_allgather(const ds4_cpu_split *sp, int gate, float *x, int T, int width, int c0, int c1, float *send,
                         float *recv) {
    const int own = c1 - c0, other = width - own;
    for (int t = 0; t < T; t++)
        memcpy(send + (size_t)t * own, x + (size_t)t * width + c0, (size_t)own * sizeof(float));
    ds4_split_exchange(sp, gate, send, (size_t)T * own, recv, (size_t)T * other);
    for (int t = 0; t < T; t++) {
        const float *in = recv + (size_t)t * other;
        float *row = x + (size_t)t * width;
        memcpy(row, in, (size_t)c0 * sizeof(float));
        memcpy(row + c1, in + c0, (size_t)(width - c1) * sizeof(float));
    }
}

void ds4_split_join(const ds4_cpu_split *sp, int T, int width, const float *own, const float *other, float *out) {
    const int lo = width / 2, hi = width - lo;
    const float *first = sp->rank ? other : own, *second = sp->rank ? own : other;
    for (int t = 0; t < T; t++) {
        memcpy(out + (size_t)t * width, first + (size_t)t * lo, (size_t)lo * sizeof(float));
        memcpy(out + (size_t)t * width + lo, second + (size_t)t * hi, (size_t)hi * sizeof(float));
    }
}

void ds4_split_shared_begin(const ds4_cpu_split *sp, int layer, const ds4_split_product *pr, const ds4_tensor *gate,
                            const ds4_tensor *up, float limit, const float *X, size_t x_stride, int T, float *act,
                            float *up_buf) {
    const int F = (int)gate->ne[1], f0 = ds4_split_lo(sp, F), nf = ds4_split_len(sp, F);
    pr->rows(pr->ctx, gate, f0, nf, X, x_stride, T, act);
    pr->rows(pr->ctx, up, f0, nf, X, x_stride, T, up_buf);
    ds4_swiglu(pr->pool, act, up_buf, T, nf, limit);
    sp->send(sp->ud, ds4_split_gate(layer, DS4_SPLIT_SHARED), act, (size_t)T * nf);
}

void ds4_split_shared_end(const ds4_cpu_split *sp, int layer, const ds4_split_product *pr, const ds4_tensor *down,
                          int T, const float *act, float *recv, float *whole, float *out) {
    const int F = (int)down->ne[0], E = (int)down->ne[1];
    sp->recv(sp->ud, ds4_split_gate(layer, DS4_SPLIT_SHARED), recv, (size_t)T * (F - ds4_split_len(sp, F)));
    ds4_split_join(sp, T, F, act, recv, whole);
    pr->rows(pr->ctx, down, ds4_split_lo(sp, E), ds4_split_len(sp, E), whole, (size_t)F, T, out);
}

const float *ds4_split_moe_exchange(const ds4_cpu_split *sp, int layer, int T, int E, const float *send, size_t n_own,
                                    float *recv, size_t n_other, float *shared_out) {
    const size_t own = (size_t)T * ds4_split_len(sp, E), other = (size_t)T * E - own;
    ds4_split_exchange(sp, ds4_split_gate(layer, DS4_SPLIT_MOE), send, own + n_own, recv, other + n_other);
    ds4_split_join(sp, T, E, send, recv, shared_out);
    return recv + other;
}

void ds4_split_rows(const ds4_cpu_split *sp, int gate, const ds4_split_product *pr, const ds4_tensor *W,
                    const float *X, size_t x_stride, int T, float *send, float *recv, float *out) {
    const int rows = (int)W->ne[1], own = ds4_split_len(sp, rows);
    pr->rows(pr->ctx, W, ds4_split_lo(sp, rows), own, X, x_stride, T, send);
    ds4_split_exchange(sp, gate, send, (size_t)T * own, recv, (size_t)T * (rows - own));
    ds4_split_join(sp, T, rows, send, recv, out);
}
