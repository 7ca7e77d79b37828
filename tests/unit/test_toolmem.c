/* Tool-id map: id format and uniqueness, shared blocks, LRU eviction by
 * count and by bytes, replacement of an id. */
#include "check.h"
#include "text/toolmem.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static bool is_hex_id(const char *s, const char *prefix) {
    size_t pl = strlen(prefix);
    if (strncmp(s, prefix, pl) || strlen(s) != pl + 32) return false;
    for (const char *p = s + pl; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return false;
    return true;
}

static bool block_is(ds4_toolmem *m, const char *id, const char *want) {
    char *b = ds4_toolmem_get(m, id);
    bool ok = want ? b && !strcmp(b, want) : b == NULL;
    free(b);
    return ok;
}

int main(void) {
    ds4_toolmem *m = ds4_toolmem_new(3, 1000);
    char a[40], b[40], c[40];
    ds4_toolmem_new_id(m, "call_", NULL, 0, a);
    const char *taken[] = {a};
    ds4_toolmem_new_id(m, "toolu_", taken, 1, b);
    CHECK(is_hex_id(a, "call_") && is_hex_id(b, "toolu_"), "%s %s", a, b);
    CHECK(strcmp(a, b), "distinct");

    const char *turn[] = {"id1", "id2"};
    ds4_toolmem_put(m, turn, 2, "\n\n<block1>", 10);
    CHECK(block_is(m, "id1", "\n\n<block1>") && block_is(m, "id2", "\n\n<block1>"), "shared block");
    CHECK(block_is(m, "nope", NULL), "unknown id");

    /* id1 was used after id2, so id2 is the LRU victim when id3, id4 arrive */
    CHECK(block_is(m, "id1", "\n\n<block1>"), "touch id1");
    const char *t2[] = {"id3"}, *t3[] = {"id4"};
    ds4_toolmem_put(m, t2, 1, "B2", 2);
    ds4_toolmem_put(m, t3, 1, "B3", 2);
    CHECK(ds4_toolmem_count(m) == 3, "count %zu", ds4_toolmem_count(m));
    CHECK(block_is(m, "id2", NULL) && block_is(m, "id1", "\n\n<block1>"), "LRU eviction");

    /* re-putting an id replaces its block; duplicates within one put are fine */
    const char *dup[] = {"id3", "id3"};
    ds4_toolmem_put(m, dup, 2, "B5", 2);
    CHECK(block_is(m, "id3", "B5"), "replace");
    ds4_toolmem_free(m);

    /* byte cap: a 600-byte block evicts an older 600-byte one */
    m = ds4_toolmem_new(100, 1000);
    char big[600];
    memset(big, 'x', sizeof big);
    const char *x1[] = {"x1"}, *x2[] = {"x2"};
    ds4_toolmem_put(m, x1, 1, big, sizeof big);
    ds4_toolmem_put(m, x2, 1, big, sizeof big);
    CHECK(block_is(m, "x1", NULL) && ds4_toolmem_count(m) == 1, "byte cap");
    ds4_toolmem_new_id(m, "call_", NULL, 0, c);
    CHECK(is_hex_id(c, "call_"), "%s", c);
    ds4_toolmem_free(m);
    return check_done("test_toolmem");
}
