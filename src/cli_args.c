#include "cli_args.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

bool ds4_parse_int(const char *s, long lo, long hi, int *out) {
    if (!s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

bool ds4_parse_float(const char *s, float *out) {
    if (!s) return false;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) return false;
    *out = v;
    return true;
}

int ds4_parse_sampling_option(const char *name, const char *value, ds4_sampler_params *p) {
    if (!strcmp(name, "--temp")) return ds4_parse_float(value, &p->temperature) ? 1 : -1;
    if (!strcmp(name, "--top-p")) return ds4_parse_float(value, &p->top_p) ? 1 : -1;
    if (!strcmp(name, "--min-p")) return ds4_parse_float(value, &p->min_p) ? 1 : -1;
    if (!strcmp(name, "--top-k")) return ds4_parse_int(value, 0, INT_MAX, &p->top_k) ? 1 : -1;
    if (strcmp(name, "--seed")) return 0;
    if (!value) return -1;
    char *end;
    errno = 0;
    unsigned long long seed = strtoull(value, &end, 10);
    if (errno || end == value || *end) return -1;
    p->seed = seed;
    return 1;
}
