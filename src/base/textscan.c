/* textscan.c -- see textscan.h. */
#include "base/textscan.h"

#include <string.h>

bool ds4_scan_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

enum ds4_scan_match ds4_scan_match(const char *s, size_t n, const char *lit) {
    size_t l = strlen(lit);
    if (n >= l) return memcmp(s, lit, l) == 0 ? DS4_SCAN_FULL : DS4_SCAN_NO;
    return memcmp(s, lit, n) == 0 ? DS4_SCAN_PARTIAL : DS4_SCAN_NO;
}

size_t ds4_scan_find(const char *s, size_t n, const char *lit) {
    const char *h = memmem(s, n, lit, strlen(lit));
    return h ? (size_t)(h - s) : n + 1;
}

size_t ds4_scan_partial_suffix(const char *s, size_t n, const char *lit) {
    size_t l = strlen(lit);
    for (size_t k = l - 1 < n ? l - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, lit, k) == 0) return k;
    return 0;
}

size_t ds4_scan_utf8_cut(const char *s, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue;
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return len > back ? n - back : n;
    }
    return n;
}
