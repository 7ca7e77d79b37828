#include "base/numparse.h"

#include <errno.h>
#include <stdlib.h>

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
