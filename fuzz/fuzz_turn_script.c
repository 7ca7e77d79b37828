/* Fuzz target: the scripted-output splitter (base/turn_script.h) with
 * either binary's separator, picked by the first input byte.
 * Invariants (abort() on violation): entries lie inside the input, in
 * order and without overlap; no entry contains a separator line; at(k)
 * is the k-th entry and repeats the last one past the end. */
#include "base/turn_script.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int has_separator_line(const char *e, size_t n, const char *sep) {
    const size_t m = strlen(sep);
    for (size_t i = 0; i + m <= n; i++)
        if ((i == 0 || e[i - 1] == '\n') && !memcmp(e + i, sep, m) && (i + m == n || e[i + m] == '\n')) return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const char *sep = data[0] & 1 ? DS4_SERVER_SCRIPT_SEPARATOR : DS4_AGENT_SCRIPT_SEPARATOR;
    data++, size--;
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);
    ds4_turn_script s;
    if (ds4_turn_script_parse(&s, text, size, sep)) return 0;
    const char *prev_end = text;
    size_t len, at_len;
    const char *e;
    for (long k = 0; (e = ds4_turn_script_next(&s, &len)); k++) {
        if (e < prev_end || e + len > text + size) abort();
        if (has_separator_line(e, len, sep)) abort();
        if (ds4_turn_script_at(&s, k, &at_len) != e || at_len != len) abort();
        prev_end = e + len;
    }
    if (s.n ? ds4_turn_script_at(&s, s.n + 5, &at_len) != s.entries[s.n - 1] : ds4_turn_script_at(&s, 0, &at_len) != NULL)
        abort();
    ds4_turn_script_free(&s);
    return 0;
}
