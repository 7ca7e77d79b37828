#include "nn/steering.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

float *ds4_steering_read(const char *path, int n_layer, int n_embd, char *err, size_t errlen) {
    const uint64_t want = (uint64_t)n_layer * (uint64_t)n_embd * sizeof(float);
    FILE *fp = fopen(path, "rb");
    if (!fp) { snprintf(err, errlen, "steering file %s: %s", path, strerror(errno)); return NULL; }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "steering file %s is not a regular file", path);
        fclose(fp);
        return NULL;
    }
    if ((uint64_t)st.st_size != want) {
        snprintf(err, errlen, "steering file %s has %lld bytes; this model needs %d layers x %d floats = %llu bytes",
                 path, (long long)st.st_size, n_layer, n_embd, (unsigned long long)want);
        fclose(fp);
        return NULL;
    }
    float *d = malloc(want ? want : 1);
    const bool ok = d && fread(d, 1, want, fp) == want;
    fclose(fp);
    if (!ok) {
        snprintf(err, errlen, d ? "cannot read steering file %s" : "out of memory for steering file %s", path);
        free(d);
        return NULL;
    }
    for (uint64_t i = 0; i < want / sizeof(float); i++)
        if (!isfinite(d[i])) {
            snprintf(err, errlen, "steering file %s: value %llu (layer %llu) is not finite", path,
                     (unsigned long long)i, (unsigned long long)(i / (uint64_t)n_embd));
            free(d);
            return NULL;
        }
    return d;
}

void ds4_steer_row(const ds4_steering *s, ds4_steer_site site, int l, float *y) {
    const float scale = ds4_steering_scale(s, site);
    if (scale == 0.0f || l < 0 || l >= s->n_layer) return;
    const int n = s->n_embd;
    const float *d = s->dir + (size_t)l * n;
    double dot = 0;
    for (int i = 0; i < n; i++) dot += (double)d[i] * y[i];
    const float k = (float)(scale * dot);
    for (int i = 0; i < n; i++) y[i] -= k * d[i];
}

void ds4_probe_row(ds4_act_probe *p, ds4_steer_site site, int l, const float *y) {
    if (!p || p->site != site || l < 0 || l >= p->n_layer) return;
    double *sum = p->sum + (size_t)l * p->n_embd;
    for (int i = 0; i < p->n_embd; i++) sum[i] += y[i];
    if (l == 0) p->rows++;
}
