/* test_steering.c -- nn/steering.h by its invariants.
 * - ds4_steer_row with a unit direction: scale 1 leaves no component along d
 *   and keeps the orthogonal part; scale -1 doubles the component; scale s
 *   scales it by (1 - s); scale 0, a NULL steering and a layer outside the
 *   file leave the row bit for bit.
 * - ds4_probe_row sums rows of its own site per layer and counts rows at
 *   layer 0 only; another site or a NULL probe adds nothing.
 * - ds4_steering_read returns the file's floats unchanged; a wrong size (the
 *   line names the layers x floats it needs), a non-finite value and a
 *   missing file give NULL and one line. */
#include "check.h"
#include "nn/steering.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { L = 3, E = 8 };

static double dotd(const float *a, const float *b) {
    double s = 0;
    for (int i = 0; i < E; i++) s += (double)a[i] * b[i];
    return s;
}

int main(void) {
    float dir[L][E];
    for (int l = 0; l < L; l++) {
        double n = 0;
        for (int i = 0; i < E; i++) { dir[l][i] = (float)sin(1.0 + l * 7 + i * 3); n += (double)dir[l][i] * dir[l][i]; }
        for (int i = 0; i < E; i++) dir[l][i] = (float)(dir[l][i] / sqrt(n));
    }
    float y0[E];
    for (int i = 0; i < E; i++) y0[i] = (float)cos(0.3 * i) * 2.0f;
    const float scales[] = {1.0f, -1.0f, 0.5f, 2.5f};
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++)
        for (int l = 0; l < L; l++) {
            ds4_steering s = {&dir[0][0], L, E, 0.0f, scales[k]};
            float y[E];
            memcpy(y, y0, sizeof y);
            ds4_steer_row(&s, DS4_STEER_FFN, l, y);
            const double before = dotd(dir[l], y0), after = dotd(dir[l], y);
            CHECK(fabs(after - (1 - scales[k]) * before) < 1e-5, "scale %g layer %d: component %g -> %g", scales[k], l,
                  before, after);
            float orth0[E], orth[E];
            for (int i = 0; i < E; i++) {
                orth0[i] = (float)(y0[i] - before * dir[l][i]);
                orth[i] = (float)(y[i] - after * dir[l][i]);
            }
            for (int i = 0; i < E; i++) CHECK(fabsf(orth[i] - orth0[i]) < 1e-5f, "orthogonal part kept");
            memcpy(y, y0, sizeof y);
            ds4_steer_row(&s, DS4_STEER_ATTN, l, y);   /* attention scale is 0 */
            CHECK(!memcmp(y, y0, sizeof y), "a zero scale leaves the row bit for bit");
        }
    float y[E];
    memcpy(y, y0, sizeof y);
    ds4_steer_row(NULL, DS4_STEER_FFN, 0, y);
    ds4_steering s = {&dir[0][0], L, E, 1.0f, 1.0f};
    ds4_steer_row(&s, DS4_STEER_FFN, L, y);
    CHECK(!memcmp(y, y0, sizeof y), "NULL steering and a layer outside the file leave the row");

    double sum[L * E] = {0};
    ds4_act_probe p = {DS4_STEER_ATTN, L, E, sum, 0};
    for (int r = 0; r < 2; r++)
        for (int l = 0; l < L; l++) {
            ds4_probe_row(&p, DS4_STEER_ATTN, l, dir[l]);
            ds4_probe_row(&p, DS4_STEER_FFN, l, y0);
        }
    ds4_probe_row(NULL, DS4_STEER_ATTN, 0, y0);
    bool ok = p.rows == 2;
    for (int l = 0; l < L; l++)
        for (int i = 0; i < E; i++) ok = ok && sum[l * E + i] == 2.0 * dir[l][i];
    CHECK(ok, "the probe sums its site's rows per layer and counts %ld rows", p.rows);

    char path[] = "/tmp/test_steering_XXXXXX", err[256];
    const int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, dir, sizeof dir) == (ssize_t)sizeof dir, "temp file");
    float *got = ds4_steering_read(path, L, E, err, sizeof err);
    CHECK(got && !memcmp(got, dir, sizeof dir), "the file's floats unchanged: %s", got ? "" : err);
    free(got);
    got = ds4_steering_read(path, L + 1, E, err, sizeof err);
    CHECK(!got && strstr(err, "4 layers x 8 floats") && !strchr(err, '\n'), "wrong size: %s", err);
    const float inf = INFINITY;
    CHECK(pwrite(fd, &inf, sizeof inf, 5 * sizeof(float)) == sizeof inf, "write inf");
    got = ds4_steering_read(path, L, E, err, sizeof err);
    CHECK(!got && strstr(err, "not finite"), "a non-finite value: %s", err);
    close(fd);
    unlink(path);
    got = ds4_steering_read(path, L, E, err, sizeof err);
    CHECK(!got && strstr(err, path), "a missing file: %s", err);
    return check_done("test_steering");
}
