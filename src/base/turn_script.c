#include "base/turn_script.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json_util.h"

static bool push(ds4_turn_script *s, char *start, size_t len, int *cap) {
    if (s->n == *cap) {
        int nc = *cap ? *cap * 2 : 8;
        char **ne = realloc(s->entries, (size_t)nc * sizeof *ne);
        if (!ne) return false;
        s->entries = ne;
        size_t *nl = realloc(s->lens, (size_t)nc * sizeof *nl);
        if (!nl) return false;
        s->lens = nl;
        *cap = nc;
    }
    s->entries[s->n] = start;
    s->lens[s->n++] = len;
    return true;
}

int ds4_turn_script_parse(ds4_turn_script *s, char *text, size_t n, const char *separator) {
    memset(s, 0, sizeof *s);
    s->text = text;
    const size_t sep = strlen(separator);
    char *end = text + n, *entry = text, *line = text;
    int cap = 0;
    bool ok = true;
    while (ok && line < end) {
        char *nl = memchr(line, '\n', (size_t)(end - line));
        char *line_end = nl ? nl : end;
        if ((size_t)(line_end - line) == sep && !memcmp(line, separator, sep)) {
            ok = push(s, entry, line > entry ? (size_t)(line - 1 - entry) : 0, &cap);
            entry = nl ? nl + 1 : end;
        }
        line = nl ? nl + 1 : end;
    }
    /* text after the last separator is a final entry (its last newline dropped) */
    if (ok && entry < end) ok = push(s, entry, (size_t)(end - entry) - (end[-1] == '\n'), &cap);
    if (!ok) ds4_turn_script_free(s);
    return ok ? 0 : -1;
}

int ds4_turn_script_load(const char *path, const char *separator, ds4_turn_script *s, char *err, size_t errlen) {
    size_t n;
    char *text = ds4_read_file(path, &n);
    memset(s, 0, sizeof *s);
    if (!text) { snprintf(err, errlen, "cannot read %s", path); return -1; }
    if (ds4_turn_script_parse(s, text, n, separator)) { snprintf(err, errlen, "out of memory reading %s", path); return -1; }
    return 0;
}

const char *ds4_turn_script_next(ds4_turn_script *s, size_t *len) {
    if (s->next >= s->n) return NULL;
    *len = s->lens[s->next];
    return s->entries[s->next++];
}

const char *ds4_turn_script_at(const ds4_turn_script *s, long k, size_t *len) {
    if (s->n == 0) return NULL;
    int i = k < s->n - 1 ? (int)k : s->n - 1;
    *len = s->lens[i];
    return s->entries[i];
}

void ds4_turn_script_free(ds4_turn_script *s) {
    free(s->text);
    free(s->entries);
    free(s->lens);
    memset(s, 0, sizeof *s);
}
