#include "cli_args.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

bool ds4_parse_numerics(const char *s, int *out) {
    if (!s) return false;
    if (!strcmp(s, "exact")) *out = 0;
    else if (!strcmp(s, "ds4")) *out = 1;
    else return false;
    return true;
}

void ds4_cli_unknown_option(const char *prog, const char *opt) {
    fprintf(stderr, "%s: unknown option %s (see --help)\n", prog, opt);
}

void ds4_cli_missing_value(const char *prog, const char *opt) {
    fprintf(stderr, "%s: %s needs a value\n", prog, opt);
}

bool ds4_cli_model_usable(const char *prog, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: no model at %s (%s): pass -m models/ds4-tiny.gguf for the trained tiny model "
                "that `make demo` unpacks, or fetch DeepSeek V4 Flash with ./download_model.sh\n",
                prog, path, strerror(errno));
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "%s: %s is not a regular file; -m takes a GGUF file\n", prog, path);
        return false;
    }
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "%s: cannot read %s: %s\n", prog, path, strerror(errno));
        return false;
    }
    return true;
}
