/* test_log.c -- the library's messages go through the log hook (base/log.h):
 * with a hook installed, a model's load report and a front end's refusal of
 * an option (options/cli_args) arrive at the hook, each whole and with the
 * bytes the default prints, and nothing reaches file descriptor 2 (it is
 * redirected to a file and read back); with the hook removed, the default
 * writes exactly the message's bytes to stderr. Input: models/demo.gguf. */
#include "check.h"
#include "base/log.h"
#include "engine/engine.h"
#include "options/cli_args.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEMO "models/demo.gguf"

typedef struct {
    char text[8192];
    int n_msgs, n_info, n_error;
    bool whole;   /* every message ended in '\n' */
} collected;

static void collect(void *ud, ds4_log_level level, const char *text, size_t len) {
    collected *c = ud;
    c->n_msgs++;
    c->n_info += level == DS4_LOG_INFO;
    c->n_error += level == DS4_LOG_ERROR;
    if (!len || text[len - 1] != '\n' || strlen(text) != len) c->whole = false;
    const size_t have = strlen(c->text);
    snprintf(c->text + have, sizeof c->text - have, "%s", text);
}

/* fd 2 -> a fresh temporary file; returns the saved fd 2 */
static int stderr_to_file(FILE **file) {
    fflush(stderr);
    *file = tmpfile();
    const int saved = dup(2);
    if (!*file || saved < 0 || dup2(fileno(*file), 2) < 0) return -1;
    return saved;
}

/* restores fd 2, returns what was written to it meanwhile (malloc'd) */
static char *stderr_back(FILE *file, int saved) {
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fseek(file, 0, SEEK_END);
    const long n = ftell(file) > 0 ? ftell(file) : 0;
    char *s = calloc((size_t)n + 1, 1);
    rewind(file);
    if (s && n > 0 && fread(s, 1, (size_t)n, file) != (size_t)n) s[0] = 0;
    fclose(file);
    return s;
}

int main(void) {
    if (access(DEMO, R_OK) != 0) return check_skipped("test_log", DEMO " is missing (make demo)");
    collected c = {.whole = true};
    ds4_log_set_hook(collect, &c);

    FILE *f;
    int saved = stderr_to_file(&f);
    CHECK(saved >= 0, "redirect fd 2");
    char err[512] = "";
    ds4_engine_params p;
    ds4_engine_params_default(&p);
    p.model_path = DEMO;
    p.n_threads = 2;
    p.quiet = false;   /* the load report is a library message */
    ds4_engine *e = ds4_engine_load(&p, err, sizeof err);
    ds4_cli_unknown_option("ds4", "--no-such-flag");
    const bool usable = ds4_cli_model_usable("ds4", "models/no-such-model.gguf");
    char *leaked = stderr_back(f, saved);

    CHECK(e != NULL, "load %s: %s", DEMO, err);
    CHECK(!usable, "a missing model is refused");
    CHECK(leaked && leaked[0] == 0, "nothing on fd 2 with a hook installed, got: %s", leaked ? leaked : "?");
    CHECK(strstr(c.text, "ds4: ") && strstr(c.text, " layers") && strstr(c.text, "resident"),
          "the load report reached the hook: %s", c.text);
    CHECK(strstr(c.text, "ds4: unknown option --no-such-flag (see --help)\n"), "the refusal reached the hook: %s",
          c.text);
    CHECK(strstr(c.text, "ds4: no model at models/no-such-model.gguf"), "the missing model reached the hook: %s",
          c.text);
    CHECK(c.n_info >= 1 && c.n_error >= 2, "levels: %d info, %d error", c.n_info, c.n_error);
    CHECK(c.whole, "every message arrived whole, one line with its newline");
    free(leaked);

    /* the default hook: the same bytes on stderr, nothing to the old hook */
    ds4_log_set_hook(NULL, NULL);
    const int before = c.n_msgs;
    saved = stderr_to_file(&f);
    ds4_cli_unknown_option("ds4-server", "--x");
    leaked = stderr_back(f, saved);
    CHECK(leaked && strcmp(leaked, "ds4-server: unknown option --x (see --help)\n") == 0, "default: '%s'",
          leaked ? leaked : "?");
    CHECK(c.n_msgs == before, "a removed hook gets nothing");
    free(leaked);
    ds4_engine_free(e);
    return check_done("test_log");
}
