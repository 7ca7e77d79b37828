/* The scripted-output file format (base/turn_script.h): entries split at
 * separator lines for either binary's separator; next() consumes them and
 * ends, at(k) is the k-th entry with the last one repeating (ds4-server's
 * turn k). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/turn_script.h"
#include "check.h"

static void parse(ds4_turn_script *s, const char *text, const char *sep) {
    size_t n = strlen(text);
    char *copy = malloc(n + 1);
    memcpy(copy, text, n + 1);
    if (ds4_turn_script_parse(s, copy, n, sep)) { fprintf(stderr, "out of memory\n"); exit(1); }
}

/* len is read after the call that sets it (argument order is unspecified) */
static int is(const char *e, const size_t *len, const char *want) {
    return e && *len == strlen(want) && !memcmp(e, want, *len);
}

int main(void) {
    ds4_turn_script s;
    size_t len = 0;
    const char *e;

    /* the agent's separator: every entry once, then none */
    parse(&s, "first\n@@@\nsecond\nline\n@@@\n@@@\nlast\n", DS4_AGENT_SCRIPT_SEPARATOR);
    CHECK(s.n == 4, "entries: %d", s.n);
    CHECK(is(ds4_turn_script_next(&s, &len), &len, "first"), "entry 1");
    CHECK(is(ds4_turn_script_next(&s, &len), &len, "second\nline"), "entry 2");
    CHECK((e = ds4_turn_script_next(&s, &len)) && len == 0, "entry 3 empty");
    CHECK(is(ds4_turn_script_next(&s, &len), &len, "last"), "entry 4");
    CHECK(!ds4_turn_script_next(&s, &len), "exhausted");
    ds4_turn_script_free(&s);

    /* the server's: a tool call, then text; the last answer repeats */
    const char *server = "<tool call>\n  with lines\n<<<NEXT>>>\nDone: edited.\n<<<NEXT>>> \n@@@\n";
    parse(&s, server, DS4_SERVER_SCRIPT_SEPARATOR);
    CHECK(s.n == 2, "server entries: %d", s.n);
    CHECK(is(ds4_turn_script_at(&s, 0, &len), &len, "<tool call>\n  with lines"), "turn 1 is the tool call");
    /* a line with more than the separator, or another binary's, is text */
    CHECK(is(ds4_turn_script_at(&s, 1, &len), &len, "Done: edited.\n<<<NEXT>>> \n@@@"), "turn 2 keeps look-alike lines");
    CHECK(is(ds4_turn_script_at(&s, 2, &len), &len, "Done: edited.\n<<<NEXT>>> \n@@@"), "turn 3 repeats the last");
    CHECK(is(ds4_turn_script_at(&s, 1000000, &len), &len, "Done: edited.\n<<<NEXT>>> \n@@@"), "far turns repeat the last");
    ds4_turn_script_free(&s);

    /* no separator: one answer, the whole text less its final newline */
    parse(&s, "only answer\n", DS4_SERVER_SCRIPT_SEPARATOR);
    CHECK(s.n == 1 && is(ds4_turn_script_at(&s, 5, &len), &len, "only answer"), "single answer repeats");
    ds4_turn_script_free(&s);

    /* an empty file has no answer: the server's model stops at once */
    parse(&s, "", DS4_SERVER_SCRIPT_SEPARATOR);
    CHECK(s.n == 0 && !ds4_turn_script_at(&s, 0, &len) && !ds4_turn_script_next(&s, &len), "empty script");
    ds4_turn_script_free(&s);

    /* a leading separator makes an empty first answer */
    parse(&s, "<<<NEXT>>>\nsecond", DS4_SERVER_SCRIPT_SEPARATOR);
    CHECK(s.n == 2 && ds4_turn_script_at(&s, 0, &len) && len == 0, "empty first answer");
    CHECK(is(ds4_turn_script_at(&s, 1, &len), &len, "second"), "then the second");
    ds4_turn_script_free(&s);
    /* load(): the file's bytes, or one error line naming it */
    char path[] = "/tmp/ds4-turn-script-XXXXXX", err[256] = "";
    int fd = mkstemp(path);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    CHECK(f && fputs("a\n<<<NEXT>>>\nb\n", f) >= 0 && !fclose(f), "temp file");
    CHECK(!ds4_turn_script_load(path, DS4_SERVER_SCRIPT_SEPARATOR, &s, err, sizeof err) && s.n == 2, "load: %s", err);
    CHECK(is(ds4_turn_script_at(&s, 1, &len), &len, "b"), "loaded second answer");
    ds4_turn_script_free(&s);
    unlink(path);
    CHECK(ds4_turn_script_load(path, DS4_SERVER_SCRIPT_SEPARATOR, &s, err, sizeof err) && strstr(err, path) && s.n == 0,
          "missing file: %s", err);
    return check_done("test_turn_script");
}
