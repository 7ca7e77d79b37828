/* tp_split.c -- the all-gather of a two-rank split (see tp_split.h). */
#include "nn/tp_split.h"

#include <string.h>

void ds4_split_allgather(const ds4_cpu_split *sp, int gate, float *x, int T, int width, int c0, int c1, float *send,
                         float *recv) {
    const int own = c1 - c0, other = width - own;
    for (int t = 0; t < T; t++)
        memcpy(send + (size_t)t * own, x + (size_t)t * width + c0, (size_t)own * sizeof(float));
    sp->exchange(sp->ud, gate, send, (size_t)T * own, recv, (size_t)T * other);
    for (int t = 0; t < T; t++) {
        const float *in = recv + (size_t)t * other;
        float *row = x + (size_t)t * width;
        memcpy(row, in, (size_t)c0 * sizeof(float));
        memcpy(row + c1, in + c0, (size_t)(width - c1) * sizeof(float));
    }
}
