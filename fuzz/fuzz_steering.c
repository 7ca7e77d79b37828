/* Fuzz target: the steering-file reader (nn/steering.h). The first two bytes
 * pick the shape (1..8 layers x 1..16 floats), the rest is the file, served
 * through a memfd. Invariants (abort() on violation): the reader accepts
 * exactly the files of n_layer * n_embd * 4 bytes whose values are all
 * finite, returns them unchanged, and otherwise gives NULL with a one-line
 * message. */
#include "nn/steering.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const int n_layer = data[0] % 8 + 1, n_embd = data[1] % 16 + 1;
    const uint8_t *file = data + 2;
    const size_t n = size - 2;
    const int fd = memfd_create("steering", 0);
    if (fd < 0) return 0;
    if (write(fd, file, n) != (ssize_t)n) { close(fd); return 0; }
    char path[64], err[256] = "";
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    float *d = ds4_steering_read(path, n_layer, n_embd, err, sizeof err);
    bool want = n == (size_t)n_layer * n_embd * sizeof(float);
    for (size_t i = 0; want && i < n / sizeof(float); i++) {
        float x;
        memcpy(&x, file + i * sizeof x, sizeof x);
        want = isfinite(x);
    }
    if (want != (d != NULL)) abort();
    if (d && memcmp(d, file, n)) abort();
    if (!d && (!err[0] || strchr(err, '\n'))) abort();
    free(d);
    close(fd);
    return 0;
}
