#include "agent/tools.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* Files bigger than this are not searched by grep (logs, binaries). */
#define GREP_MAX_FILE_BYTES (4u << 20)
/* Directory walks stop here, so a huge tree cannot stall the agent. */
#define WALK_MAX_DEPTH 32

void ds4_agent_tools_opts_default(ds4_agent_tools_opts *o, const char *root) {
    memset(o, 0, sizeof *o);
    o->root = root;
    o->bash_timeout_s = 30;
    o->read_cap = 256u << 10;
    o->output_cap = 64u << 10;
    o->max_results = 200;
}

static const ds4_tool_def k_tools[] = {
    {"read_file", "Read a text file in the working directory. Optional 1-based inclusive line range.",
     "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"},\"start_line\":{\"type\":\"integer\"},"
     "\"end_line\":{\"type\":\"integer\"}},\"required\":[\"path\"]}", NULL},
    {"write_file", "Create or overwrite a file with the given content.",
     "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"},\"content\":{\"type\":\"string\"}},"
     "\"required\":[\"path\",\"content\"]}", NULL},
    {"edit_file", "Replace the exact text old_string, which must occur exactly once in the file, with new_string.",
     "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"},\"old_string\":{\"type\":\"string\"},"
     "\"new_string\":{\"type\":\"string\"}},\"required\":[\"path\",\"old_string\",\"new_string\"]}", NULL},
    {"list_dir", "List a directory (default: the working directory); directories end with '/'.",
     "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"}}}", NULL},
    {"glob", "Find files whose path relative to the working directory matches a shell pattern (e.g. src/*.c, *.md).",
     "{\"type\":\"object\",\"properties\":{\"pattern\":{\"type\":\"string\"}},\"required\":[\"pattern\"]}", NULL},
    {"grep", "Search text files under a path (default: the working directory) for a PCRE regular expression; "
     "prints file:line:text.",
     "{\"type\":\"object\",\"properties\":{\"pattern\":{\"type\":\"string\"},\"path\":{\"type\":\"string\"}},"
     "\"required\":[\"pattern\"]}", NULL},
    {"bash", "Run a shell command with /bin/sh in the working directory; returns its output and exit status. "
     "With background true it returns at once with a job id (servers, watchers, long builds): see job_list, "
     "job_output and job_stop.",
     "{\"type\":\"object\",\"properties\":{\"command\":{\"type\":\"string\"},\"background\":{\"type\":\"boolean\"}},"
     "\"required\":[\"command\"]}", NULL},
    {"job_list", "List the background jobs: id, state (running, or exit status) and command.",
     "{\"type\":\"object\",\"properties\":{}}", NULL},
    {"job_output", "A background job's state and the last lines of its output (default 50).",
     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"lines\":{\"type\":\"integer\"}},"
     "\"required\":[\"id\"]}", NULL},
    {"job_stop", "Stop a background job and everything it started; returns its last output lines.",
     "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"]}", NULL},
};

const ds4_tool_def *ds4_agent_tool_defs(int *n) {
    *n = (int)(sizeof k_tools / sizeof k_tools[0]);
    return k_tools;
}

void ds4_agent_tool_result_free(ds4_agent_tool_result *r) {
    ds4_buf_free(&r->text);
    ds4_buf_free(&r->display);
}

static void buf_vprintf(ds4_buf *b, const char *fmt, va_list ap) {
    va_list again;
    va_copy(again, ap);
    char small[512];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n >= 0 && (size_t)n < sizeof small) ds4_buf_put(b, small, (size_t)n);
    else if (n >= 0) {
        char *big = malloc((size_t)n + 1);
        if (!big) b->oom = true;
        else {
            vsnprintf(big, (size_t)n + 1, fmt, again);
            ds4_buf_put(b, big, (size_t)n);
            free(big);
        }
    }
    va_end(again);
}

static void buf_printf(ds4_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(b, fmt, ap);
    va_end(ap);
}

/* Sets the result's outcome: the model gets the message, the user a summary. */
static void fail(ds4_agent_tool_result *r, const char *fmt, ...) {
    r->ok = false;
    ds4_buf_free(&r->text);   /* also clears a sticky out-of-memory flag */
    ds4_buf_puts(&r->text, "error: ");
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&r->text, fmt, ap);
    va_end(ap);
    snprintf(r->summary, sizeof r->summary, "%.199s", r->text.data ? r->text.data : "error: out of memory");
}

static void succeed(ds4_agent_tool_result *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->summary, sizeof r->summary, fmt, ap);
    va_end(ap);
    r->ok = true;
}

static bool ask(const ds4_agent_tools_opts *o, const char *question) {
    return o->confirm && o->confirm(o->confirm_ud, question);
}

/* ---- paths ---- */

static bool under_root(const char *root, const char *abs) {
    size_t n = strlen(root);
    if (strncmp(abs, root, n)) return false;
    return abs[n] == 0 || abs[n] == '/' || (n == 1 && root[0] == '/');
}

/* Resolves path (relative to the root) to an absolute, symlink-free path in
 * out. A missing final component is allowed when may_create. Refuses (and
 * fills r) when it lies outside the root: the file tools are confined to
 * it, without a question a tired user might answer yes. */
static bool resolve(const ds4_agent_tools_opts *o, const char *tool, const char *path, bool may_create,
                    char out[PATH_MAX], ds4_agent_tool_result *r) {
    if (!path || !*path) { fail(r, "%s: empty path", tool); return false; }
    char joined[PATH_MAX * 2];
    if (path[0] == '/') snprintf(joined, sizeof joined, "%s", path);
    else snprintf(joined, sizeof joined, "%s/%s", o->root, path);
    if (strlen(joined) >= PATH_MAX) { fail(r, "%s: path too long", tool); return false; }
    if (!realpath(joined, out)) {
        if (errno != ENOENT || !may_create) { fail(r, "%s: %s: %s", tool, path, strerror(errno)); return false; }
        char *slash = strrchr(joined, '/');
        const char *base = slash + 1;
        *slash = 0;
        char parent[PATH_MAX];
        if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) { fail(r, "%s: %s: not a file name", tool, path); return false; }
        if (!realpath(*joined ? joined : "/", parent)) {
            fail(r, "%s: %s: parent directory: %s", tool, path, strerror(errno));
            return false;
        }
        if ((size_t)snprintf(out, PATH_MAX, "%s/%s", strcmp(parent, "/") ? parent : "", base) >= PATH_MAX) {
            fail(r, "%s: path too long", tool);
            return false;
        }
    }
    if (under_root(o->root, out)) return true;
    fail(r, "%s: %s is outside the working directory %s (refused; the file tools work only inside it)", tool, path,
         o->root);
    return false;
}

/* ---- arguments ---- */

static const char *arg_str(const cJSON *args, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(args, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Integer argument: absent = dflt; a string of digits is accepted too
 * (models often quote numbers). False when present but not a number. */
static bool arg_int(const cJSON *args, const char *key, long dflt, long *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(args, key);
    *out = dflt;
    if (!v || cJSON_IsNull(v)) return true;
    if (cJSON_IsNumber(v)) { *out = (long)v->valuedouble; return v->valuedouble == (double)*out; }
    if (cJSON_IsString(v)) {
        char *end;
        errno = 0;
        *out = strtol(v->valuestring, &end, 10);
        return !errno && end != v->valuestring && !*end;
    }
    return false;
}

/* Boolean argument: absent = false; "true"/"false" strings are accepted
 * (a DSML parameter may arrive as either). False when present but not one. */
static bool arg_bool(const cJSON *args, const char *key, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(args, key);
    *out = false;
    if (!v || cJSON_IsNull(v)) return true;
    if (cJSON_IsBool(v)) { *out = cJSON_IsTrue(v); return true; }
    if (cJSON_IsString(v) && (!strcmp(v->valuestring, "true") || !strcmp(v->valuestring, "false"))) {
        *out = !strcmp(v->valuestring, "true");
        return true;
    }
    return false;
}

/* ---- file tools ---- */

static void tool_read(const ds4_agent_tools_opts *o, const cJSON *a, ds4_agent_tool_result *r) {
    char path[PATH_MAX];
    long first, last;
    if (!arg_int(a, "start_line", 1, &first) || !arg_int(a, "end_line", LONG_MAX, &last) || first < 1 || last < first) {
        fail(r, "read_file: start_line/end_line must be integers with 1 <= start_line <= end_line");
        return;
    }
    if (!resolve(o, "read_file", arg_str(a, "path"), false, path, r)) return;
    bool ranged = cJSON_GetObjectItemCaseSensitive(a, "start_line") || cJSON_GetObjectItemCaseSensitive(a, "end_line");
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode)) { fail(r, "read_file: %s is not a regular file", path); return; }
    if ((size_t)st.st_size > o->read_cap && !ranged) {
        fail(r, "read_file: %s is %lld bytes, over the %zu-byte cap; read a line range (start_line, end_line)",
             arg_str(a, "path"), (long long)st.st_size, o->read_cap);
        return;
    }
    FILE *f = fopen(path, "r");
    if (!f) { fail(r, "read_file: %s: %s", path, strerror(errno)); return; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long no = 0, shown = 0;
    bool truncated = false;
    while ((len = getline(&line, &cap, f)) >= 0) {
        if (++no < first) continue;
        if (no > last) break;
        if (r->text.len + (size_t)len > o->read_cap) { truncated = true; break; }
        ds4_buf_put(&r->text, line, (size_t)len);
        shown++;
    }
    free(line);
    bool io_error = ferror(f);
    fclose(f);
    if (io_error) { fail(r, "read_file: %s: read error", path); return; }
    if (truncated) buf_printf(&r->text, "\n[truncated at %zu bytes after line %ld; read a later range]", o->read_cap, first + shown - 1);
    if (shown == 0 && first > 1) { fail(r, "read_file: %s has %ld lines, start_line %ld is past the end", arg_str(a, "path"), no, first); return; }
    succeed(r, "%ld lines, %zu bytes%s", shown, r->text.len, truncated ? " (truncated)" : "");
}

/* Writes data to path through a temp file in the same directory and a
 * rename, so a failed write never leaves a half file. Keeps the old mode. */
static bool replace_file(const char *path, const char *data, size_t n, char *err, size_t errlen) {
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.ds4-agent.%ld", path, (long)getpid());
    struct stat st;
    mode_t mode = stat(path, &st) == 0 ? (st.st_mode & 07777) : 0644;
    /* a fresh file: a link planted under the temp name (by a command) must
     * not send the write outside the root */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) { snprintf(err, errlen, "%s", strerror(errno)); return false; }
    bool ok = true;
    for (size_t off = 0; ok && off < n;) {
        ssize_t w = write(fd, data + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) ok = false;
        else off += (size_t)w;
    }
    if (ok) ok = fchmod(fd, mode) == 0;
    int saved = errno;
    if (close(fd) && ok) { ok = false; saved = errno; }
    if (ok && rename(tmp, path)) { ok = false; saved = errno; }
    if (!ok) { unlink(tmp); snprintf(err, errlen, "%s", strerror(saved)); }
    return ok;
}

static void tool_write(const ds4_agent_tools_opts *o, const cJSON *a, ds4_agent_tool_result *r) {
    const char *content = arg_str(a, "content");
    char path[PATH_MAX], err[256];
    if (!content) { fail(r, "write_file: content (a string) is required"); return; }
    if (!resolve(o, "write_file", arg_str(a, "path"), true, path, r)) return;
    size_t n = strlen(content);
    if (!replace_file(path, content, n, err, sizeof err)) { fail(r, "write_file: %s: %s", path, err); return; }
    buf_printf(&r->text, "wrote %zu bytes to %s", n, arg_str(a, "path"));
    succeed(r, "wrote %zu bytes", n);
}

static size_t count_lines(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

/* Appends lines of s[0..n) to the diff, each with the marker in front. */
static void diff_lines(ds4_buf *d, char marker, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - (s + i)) : n - i;
        ds4_buf_putc(d, marker);
        ds4_buf_put(d, s + i, len);
        ds4_buf_putc(d, '\n');
        i += len + 1;
    }
}

static void tool_edit(const ds4_agent_tools_opts *o, const cJSON *a, ds4_agent_tool_result *r) {
    const char *old_s = arg_str(a, "old_string"), *new_s = arg_str(a, "new_string");
    char path[PATH_MAX], err[256];
    if (!old_s || !new_s) { fail(r, "edit_file: old_string and new_string (strings) are required"); return; }
    if (!*old_s) { fail(r, "edit_file: old_string is empty; use write_file to create a file"); return; }
    if (!resolve(o, "edit_file", arg_str(a, "path"), false, path, r)) return;
    size_t n;
    char *text = ds4_read_file(path, &n);
    if (!text) { fail(r, "edit_file: cannot read %s", arg_str(a, "path")); return; }
    size_t old_n = strlen(old_s), new_n = strlen(new_s);
    const char *hit = NULL;
    int count = 0;
    for (const char *p = text; (p = memmem(p, n - (size_t)(p - text), old_s, old_n)); p++) {
        if (!hit) hit = p;
        count++;
    }
    if (count != 1) {
        if (count == 0) fail(r, "edit_file: old_string not found in %s (it must match exactly, white space included)", arg_str(a, "path"));
        else fail(r, "edit_file: old_string occurs %d times in %s; include more context so it is unique", count, arg_str(a, "path"));
        free(text);
        return;
    }
    size_t at = (size_t)(hit - text);
    ds4_buf out = {0};
    ds4_buf_put(&out, text, at);
    ds4_buf_put(&out, new_s, new_n);
    ds4_buf_put(&out, hit + old_n, n - at - old_n);
    bool ok = !out.oom && replace_file(path, out.data ? out.data : "", out.len, err, sizeof err);
    ds4_buf_free(&out);
    if (!ok) { fail(r, "edit_file: %s: %s", path, out.oom ? "out of memory" : err); free(text); return; }
    size_t line = count_lines(text, at) + 1;
    /* the diff shows whole lines: the change plus the rest of its first and last line */
    size_t head = at, tail = at + old_n;
    while (head > 0 && text[head - 1] != '\n') head--;
    while (tail < n && text[tail] != '\n') tail++;
    ds4_buf after = {0};
    ds4_buf_put(&after, text + head, at - head);
    ds4_buf_put(&after, new_s, new_n);
    ds4_buf_put(&after, text + at + old_n, tail - at - old_n);
    buf_printf(&r->display, "@@ %s:%zu\n", arg_str(a, "path"), line);
    diff_lines(&r->display, '-', text + head, tail - head);
    diff_lines(&r->display, '+', after.data ? after.data : "", after.len);
    if (after.oom) r->display.oom = true;
    ds4_buf_free(&after);
    buf_printf(&r->text, "edited %s at line %zu: replaced %zu lines with %zu lines", arg_str(a, "path"), line,
               count_lines(old_s, old_n) + 1, count_lines(new_s, new_n) + 1);
    succeed(r, "line %zu: -%zu +%zu lines", line, count_lines(old_s, old_n) + 1, count_lines(new_s, new_n) + 1);
    free(text);
}

static int by_string(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void tool_list(const ds4_agent_tools_opts *o, const cJSON *a, ds4_agent_tool_result *r) {
    char path[PATH_MAX];
    const char *arg = arg_str(a, "path");
    if (!resolve(o, "list_dir", arg ? arg : ".", false, path, r)) return;
    DIR *d = opendir(path);
    if (!d) { fail(r, "list_dir: %s: %s", arg ? arg : ".", strerror(errno)); return; }
    char **names = NULL;
    size_t n = 0, cap = 0;
    bool oom = false;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) { oom = true; break; }
            names = nn;
        }
        char full[PATH_MAX * 2];
        snprintf(full, sizeof full, "%s/%s", path, e->d_name);
        struct stat st;
        bool dir = stat(full, &st) == 0 && S_ISDIR(st.st_mode);
        size_t len = strlen(e->d_name);
        if (!(names[n] = malloc(len + 2))) { oom = true; break; }
        memcpy(names[n], e->d_name, len);
        names[n][len] = dir ? '/' : 0;
        names[n][len + 1] = 0;
        n++;
    }
    closedir(d);
    if (n) qsort(names, n, sizeof *names, by_string);
    size_t shown = 0;
    for (; shown < n && shown < (size_t)o->max_results * 5; shown++) buf_printf(&r->text, "%s\n", names[shown]);
    if (shown < n) buf_printf(&r->text, "[%zu more entries]\n", n - shown);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (oom) { fail(r, "list_dir: out of memory"); return; }
    succeed(r, "%zu entries", n);
}

/* ---- tree walks (glob, grep) ---- */

typedef bool (*walk_fn)(void *ud, const char *full, const char *rel);

/* Visits regular files under dir in name order; rel is relative to the root
 * prefix length skip. Stops when fn returns false. */
static bool walk(const char *dir, size_t skip, int depth, walk_fn fn, void *ud) {
    if (depth > WALK_MAX_DEPTH) return true;
    struct dirent **list;
    int n = scandir(dir, &list, NULL, alphasort);
    if (n < 0) return true;
    bool go = true;
    for (int i = 0; i < n; i++) {
        const char *name = list[i]->d_name;
        if (go && strcmp(name, ".") && strcmp(name, "..") && strcmp(name, ".git")) {
            char full[PATH_MAX];
            if ((size_t)snprintf(full, sizeof full, "%s/%s", dir, name) < sizeof full) {
                struct stat st;
                if (lstat(full, &st) == 0) {
                    if (S_ISDIR(st.st_mode)) go = walk(full, skip, depth + 1, fn, ud);
                    else if (S_ISREG(st.st_mode)) go = fn(ud, full, full + skip);
                }
            }
        }
        free(list[i]);
    }
    free(list);
    return go;
}

typedef struct {
    const ds4_agent_tools_opts *o;
    const char *pattern;
    bool basename_only;
    ds4_agent_tool_result *r;
    int hits;
} glob_walk;

static bool glob_visit(void *ud, const char *full, const char *rel) {
    glob_walk *g = ud;
    (void)full;
    const char *subject = rel;
    if (g->basename_only) {
        const char *slash = strrchr(rel, '/');
        subject = slash ? slash + 1 : rel;
    }
    if (fnmatch(g->pattern, subject, 0) != 0) return true;
    if (++g->hits > g->o->max_results) return false;
    buf_printf(&g->r->text, "%s\n", rel);
    return true;
}

static void tool_glob(const ds4_agent_tools_opts *o, const cJSON *a, ds4_agent_tool_result *r) {
    const char *pattern = arg_str(a, "pattern");
    if (!pattern || !*pattern) { fail(r, "glob: pattern (a string) is required"); return; }
    /* "**" /: fnmatch without FNM_PATHNAME lets '*' cross directories */
    while (!strncmp(pattern, "**/", 3)) pattern += 3;
    if (!strncmp(pattern, "./", 2)) pattern += 2;
    glob_walk g = {o, pattern, strchr(pattern, '/') == NULL, r, 0};
    walk(o->root, strlen(o->root) + 1, 0, glob_visit, &g);
    if (g.hits > o->max_results) buf_printf(&r->text, "[stopped after %d matches]\n", o->max_results);
    if (g.hits == 0) ds4_buf_puts(&r->text, "no files match\n");
    succeed(r, "%d file%s%s", g.hits > o->max_results ? o->max_results : g.hits, g.hits == 1 ? "" : "s",
            g.hits > o->max_results ? " (capped)" : "");
}

typedef struct {
    const ds4_agent_tools_opts *o;
    pcre2_code *re;
    pcre2_match_data *md;
    ds4_agent_tool_result *r;
    int hits;
} grep_walk;

static bool grep_visit(void *ud, const char *full, const char *rel) {
    grep_walk *g = ud;
    struct stat st;
    if (stat(full, &st) || st.st_size > GREP_MAX_FILE_BYTES) return true;
    size_t n;
    char *text = ds4_read_file(full, &n);
    if (!text) return true;
    if (memchr(text, 0, n < 4096 ? n : 4096)) { free(text); return true; }
    size_t line_no = 1;
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(text + i, '\n', n - i);
        size_t len = nl ? (size_t)(nl - (text + i)) : n - i;
        if (pcre2_match(g->re, (PCRE2_SPTR)(text + i), len, 0, 0, g->md, NULL) >= 0) {
            if (++g->hits > g->o->max_results) { free(text); return false; }
            /* long lines (minified files) are cut so one hit cannot flood the context */
            buf_printf(&g->r->text, "%s:%zu:%.*s\n", rel, line_no, (int)(len > 300 ? 300 : len), text + i);
        }
        i += len + 1;
        line_no++;
    }
    free(text);
    return true;
}

static void tool_grep(const ds4_agent_tools_opts *o, const cJSON *a, ds4_agent_tool_result *r) {
    const char *pattern = arg_str(a, "pattern"), *arg = arg_str(a, "path");
    char path[PATH_MAX];
    if (!pattern || !*pattern) { fail(r, "grep: pattern (a string) is required"); return; }
    if (!resolve(o, "grep", arg ? arg : ".", false, path, r)) return;
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF,
                                   &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof msg);
        fail(r, "grep: bad regular expression at offset %zu: %s", (size_t)off, (const char *)msg);
        return;
    }
    grep_walk g = {o, re, pcre2_match_data_create_from_pattern(re, NULL), r, 0};
    if (!g.md) { pcre2_code_free(re); fail(r, "grep: out of memory"); return; }
    struct stat st;
    /* paths are shown relative to the root (which may be "/") */
    size_t skip = strcmp(o->root, "/") ? strlen(o->root) + 1 : 1;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) grep_visit(&g, path, path + skip);
    else walk(path, skip, 0, grep_visit, &g);
    pcre2_match_data_free(g.md);
    pcre2_code_free(re);
    if (g.hits > o->max_results) buf_printf(&r->text, "[stopped after %d matches]\n", o->max_results);
    if (g.hits == 0) ds4_buf_puts(&r->text, "no matches\n");
    succeed(r, "%d match%s%s", g.hits > o->max_results ? o->max_results : g.hits, g.hits == 1 ? "" : "es",
            g.hits > o->max_results ? " (capped)" : "");
}

/* ---- bash ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the commands' processes ----
 *
 * A command's processes are found by parentage, not by process group:
 * setsid(1), or a daemon that forks twice, leaves the group. The agent
 * process is a child subreaper (prctl), so what a command orphans is
 * re-parented to the agent instead of init and stays below it; every
 * process below the agent is a command's (the agent starts none of its
 * own). A cgroup would also hold a process that escapes the subreaper
 * (one started by a service), but needs a writable cgroup v2 tree. */

/* ---- background jobs ----
 *
 * A background job is a command started like bash's (own process group,
 * stdin from /dev/null, the root as its directory) whose output goes to an
 * unlinked temporary file, so it never blocks on a full pipe and its tail
 * can be read at any time. The agent's reaping below records a job's exit
 * status here, since waitpid() hands it out only once. */

#define MAX_JOBS 32

typedef struct {
    int id;
    pid_t pid;              /* the shell; its process group */
    char *cmd;
    int out_fd;             /* the output file, read with pread */
    double started, ended;
    bool done;
    int status;
} bg_job;

static bg_job g_jobs[MAX_JOBS];
static int g_n_jobs, g_next_job_id = 1;

static void reap(pid_t pid) {
    int status;
    if (waitpid(pid, &status, WNOHANG) != pid) return;
    for (int i = 0; i < g_n_jobs; i++)
        if (g_jobs[i].pid == pid && !g_jobs[i].done) {
            g_jobs[i].done = true;
            g_jobs[i].status = status;
            g_jobs[i].ended = now_s();
        }
}

typedef struct {
    pid_t pid, ppid;
    char state;
} proc_entry;

static int by_pid(const void *a, const void *b) {
    pid_t x = ((const proc_entry *)a)->pid, y = ((const proc_entry *)b)->pid;
    return (x > y) - (x < y);
}

/* Every process's pid, parent and state from /proc, sorted by pid; NULL
 * when /proc cannot be read. */
static proc_entry *proc_scan(size_t *n) {
    DIR *d = opendir("/proc");
    if (!d) return NULL;
    proc_entry *v = NULL;
    size_t cap = 0;
    *n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t got = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (got <= 0) continue;
        buf[got] = 0;
        /* "pid (comm) state ppid ...": comm may hold spaces and ')' */
        char *rp = strrchr(buf, ')');
        char state;
        long ppid;
        if (!rp || sscanf(rp + 1, " %c %ld", &state, &ppid) != 2) continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 512;
            proc_entry *nv = realloc(v, cap * sizeof *nv);
            if (!nv) break;
            v = nv;
        }
        v[(*n)++] = (proc_entry){(pid_t)pid, (pid_t)ppid, state};
    }
    closedir(d);
    if (*n) qsort(v, *n, sizeof *v, by_pid);
    return v;
}

/* The agent's child that pid descends from (pid itself when it is one), or
 * 0 when pid is not below the agent. */
static pid_t top_child(const proc_entry *t, size_t n, pid_t pid) {
    pid_t self = getpid();
    for (size_t depth = 0; depth <= n; depth++) {
        proc_entry key = {.pid = pid};
        const proc_entry *e = bsearch(&key, t, n, sizeof *t, by_pid);
        if (!e || e->ppid <= 1) return 0;
        if (e->ppid == self) return pid;
        pid = e->ppid;
    }
    return 0;
}

static bool has_pid(const pid_t *v, size_t n, pid_t p) {
    for (size_t i = 0; i < n; i++) if (v[i] == p) return true;
    return false;
}

/* The agent's children now (the jobs that earlier commands left running). */
static pid_t *children_now(size_t *n_out) {
    size_t n;
    proc_entry *t = proc_scan(&n);
    pid_t *v = t && n ? malloc(n * sizeof *v) : NULL;
    *n_out = 0;
    for (size_t i = 0; v && i < n; i++) if (t[i].ppid == getpid()) v[(*n_out)++] = t[i].pid;
    free(t);
    return v;
}

/* SIGKILLs every process below the agent, except the subtrees of the
 * children in keep, until none is left alive (a process can fork between
 * a scan and its kill: the next scan finds the child). Reaps the agent's
 * dead children, except `except`, which the caller waits for; reaping
 * also lets their orphans re-parent to the agent, where the next pass
 * finds them. */
static void kill_below(const pid_t *keep, size_t n_keep, pid_t except) {
    for (int pass = 0; pass < 1000; pass++) {
        size_t n;
        proc_entry *t = proc_scan(&n);
        if (!t) return;
        size_t left = 0;
        for (size_t i = 0; i < n; i++) {
            pid_t top = top_child(t, n, t[i].pid);
            if (!top || has_pid(keep, n_keep, top)) continue;
            if (t[i].state != 'Z') { kill(t[i].pid, SIGKILL); left++; }
            else if (t[i].ppid != getpid()) left++;   /* its parent is dying: it comes to us next */
            else if (t[i].pid != except) reap(t[i].pid);
        }
        free(t);
        if (!left) return;
        struct timespec pause = {0, 2000000};
        nanosleep(&pause, NULL);
    }
}

/* Reaps the jobs of earlier commands that have exited since: orphans
 * re-parented to the agent are its children, and nobody else waits for
 * them. */
static void reap_finished_jobs(void) {
    size_t n;
    proc_entry *t = proc_scan(&n);
    for (size_t i = 0; t && i < n; i++)
        if (t[i].ppid == getpid() && t[i].state == 'Z') reap(t[i].pid);
    free(t);
}

void ds4_agent_tools_end_jobs(void) { kill_below(NULL, 0, 0); }

/* The agent's notes after a command's output start on their own line. */
static void status_line(ds4_buf *b, const char *fmt, ...) {
    if (b->len) ds4_buf_putc(b, '\n');
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(b, fmt, ap);
    va_end(ap);
}

/* Forks `sh -c cmd` in the root with its own process group, stdin from
 * /dev/null and stdout+stderr to out_fd; -1 on failure (errno set). */
static pid_t spawn(const ds4_agent_tools_opts *o, const char *cmd, int out_fd) {
    /* once is enough; what it makes findable is all the agent's processes */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    pid_t pid = fork();
    if (pid == 0) {
        /* own process group: a timeout, Ctrl+C or job_stop kills the whole pipeline */
        setpgid(0, 0);
        /* ignored signals stay ignored across exec: give the command the defaults */
        signal(SIGINT, SIG_DFL);
        signal(SIGXFSZ, SIG_DFL);
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, 0);
        dup2(out_fd, 1);
        dup2(out_fd, 2);
        if (chdir(o->root) == 0) execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    if (pid > 0) setpgid(pid, pid);
    return pid;
}

static void describe_exit(char *out, size_t n, int status) {
    if (WIFEXITED(status)) snprintf(out, n, "exit status %d", WEXITSTATUS(status));
    else snprintf(out, n, "killed by signal %d", WTERMSIG(status));
}

/* "job N: running for S s" / "job N: exit status X after S s", pid, command. */
static void job_line(ds4_buf *b, const bg_job *j) {
    char state[64];
    if (j->done) describe_exit(state, sizeof state, j->status);
    else snprintf(state, sizeof state, "running");
    double t = (j->done ? j->ended : now_s()) - j->started;
    buf_printf(b, "job %d: %s %s %.0f s, pid %d: %s\n", j->id, state, j->done ? "after" : "for", t, (int)j->pid, j->cmd);
}

static void start_job(const ds4_agent_tools_opts *o, const char *cmd, ds4_agent_tool_result *r) {
    reap_finished_jobs();
    int slot = -1;
    for (int i = 0; i < g_n_jobs && slot < 0; i++)
        if (g_jobs[i].done) slot = i;
    if (slot < 0 && g_n_jobs == MAX_JOBS) { fail(r, "bash: %d background jobs are running; stop one first", MAX_JOBS); return; }
    const char *tmp = getenv("TMPDIR");
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/ds4-agent-job-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0) { fail(r, "bash: cannot create the job's output file: %s", strerror(errno)); return; }
    unlink(path);   /* private to the agent and the job; gone with them */
    char *copy = strdup(cmd);
    pid_t pid = copy ? spawn(o, cmd, fd) : -1;
    if (pid < 0) { free(copy); close(fd); fail(r, "bash: cannot start the job: %s", strerror(errno)); return; }
    if (slot < 0) slot = g_n_jobs++;
    else { free(g_jobs[slot].cmd); close(g_jobs[slot].out_fd); }
    g_jobs[slot] = (bg_job){.id = g_next_job_id++, .pid = pid, .cmd = copy, .out_fd = fd, .started = now_s()};
    buf_printf(&r->text, "started background job %d (pid %d). job_output {\"id\":%d} shows its output, job_stop "
               "stops it; it is killed when the agent exits.", g_jobs[slot].id, (int)pid, g_jobs[slot].id);
    succeed(r, "background job %d started (pid %d)", g_jobs[slot].id, (int)pid);
}

static bg_job *find_job(const cJSON *a, const char *tool, ds4_agent_tool_result *r) {
    long id;
    if (!arg_int(a, "id", -1, &id) || id < 0) { fail(r, "%s: id (a job number from job_list) is required", tool); return NULL; }
    reap_finished_jobs();
    for (int i = 0; i < g_n_jobs; i++)
        if (g_jobs[i].id == id) return &g_jobs[i];
    fail(r, "%s: there is no background job %ld (job_list lists them)", tool, id);
    return NULL;
}

/* The last `lines` lines of a job's output, at most cap bytes. */
static void job_tail(ds4_buf *b, const bg_job *j, long lines, size_t cap) {
    struct stat st;
    if (fstat(j->out_fd, &st)) { buf_printf(b, "[its output cannot be read: %s]\n", strerror(errno)); return; }
    size_t size = (size_t)st.st_size, want = size < cap ? size : cap;
    char *data = malloc(want + 1);
    if (!data) { b->oom = true; return; }
    ssize_t got = want ? pread(j->out_fd, data, want, (off_t)(size - want)) : 0;
    if (got < 0) got = 0;
    size_t from = (size_t)got, seen = 0;
    /* a last line without its newline counts as a line */
    if (from && data[from - 1] == '\n') from--;
    while (from > 0 && seen < (size_t)lines) {
        if (data[from - 1] == '\n' && ++seen == (size_t)lines) break;
        from--;
    }
    buf_printf(b, "[%zu bytes of output in all; its last lines (at most %ld):]\n", size, lines);
    ds4_buf_put(b, data + from, (size_t)got - from);
    if (got && data[got - 1] != '\n') ds4_buf_putc(b, '\n');
    free(data);
}

static void tool_job_list(const ds4_agent_tools_opts *o, const cJSON *a, ds4_agent_tool_result *r) {
    (void)o, (void)a;
    ds4_agent_tools_jobs(&r->text);
    succeed(r, "%d background job%s", g_n_jobs, g_n_jobs == 1 ? "" : "s");
}

static void tool_job_output(const ds4_agent_tools_opts *o, const cJSON *a, ds4_agent_tool_result *r) {
    bg_job *j = find_job(a, "job_output", r);
    if (!j) return;
    long lines;
    if (!arg_int(a, "lines", 50, &lines) || lines < 1) { fail(r, "job_output: lines must be a positive integer"); return; }
    job_line(&r->text, j);
    job_tail(&r->text, j, lines, o->output_cap);
    succeed(r, "job %d %s", j->id, j->done ? "done" : "running");
}

static void tool_job_stop(const ds4_agent_tools_opts *o, const cJSON *a, ds4_agent_tool_result *r) {
    bg_job *j = find_job(a, "job_stop", r);
    if (!j) return;
    if (!j->done) {
        /* TERM first, so a server can clean up; then whatever is left of
         * the group and of the processes below the job goes */
        kill(-j->pid, SIGTERM);
        for (int i = 0; i < 50 && !j->done; i++) {
            struct timespec pause = {0, 20000000};
            nanosleep(&pause, NULL);
            reap(j->pid);
        }
        kill(-j->pid, SIGKILL);
        size_t n_keep;
        pid_t *keep = children_now(&n_keep);
        size_t k = 0;
        for (size_t i = 0; i < n_keep; i++) if (keep[i] != j->pid) keep[k++] = keep[i];
        kill_below(keep, k, j->pid);
        free(keep);
        while (!j->done && waitpid(j->pid, &j->status, 0) < 0 && errno == EINTR) {}
        if (!j->done) { j->done = true; j->ended = now_s(); }
    } else {
        /* its shell is gone; what it left in its group is not */
        kill(-j->pid, SIGKILL);
    }
    job_line(&r->text, j);
    job_tail(&r->text, j, 20, o->output_cap);
    succeed(r, "job %d stopped", j->id);
}

void ds4_agent_tools_jobs(ds4_buf *out) {
    reap_finished_jobs();
    if (!g_n_jobs) ds4_buf_puts(out, "no background jobs\n");
    for (int i = 0; i < g_n_jobs; i++) job_line(out, &g_jobs[i]);
}

static void tool_bash(const ds4_agent_tools_opts *o, const cJSON *a, ds4_agent_tool_result *r) {
    const char *cmd = arg_str(a, "command");
    if (!cmd || !*cmd) { fail(r, "bash: command (a string) is required"); return; }
    bool background;
    if (!arg_bool(a, "background", &background)) { fail(r, "bash: background must be true or false"); return; }
    if (!o->auto_yes) {
        char q[600];
        snprintf(q, sizeof q, "run %s`%.500s`?", background ? "in the background " : "", cmd);
        if (!ask(o, q)) { fail(r, "bash: the user declined to run this command"); return; }
    }
    if (background) { start_job(o, cmd, r); return; }
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    reap_finished_jobs();
    size_t n_jobs;
    pid_t *jobs = children_now(&n_jobs);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC)) { free(jobs); fail(r, "bash: pipe: %s", strerror(errno)); return; }
    pid_t pid = spawn(o, cmd, fds[1]);
    if (pid < 0) { free(jobs); close(fds[0]); close(fds[1]); fail(r, "bash: fork: %s", strerror(errno)); return; }
    close(fds[1]);
    double deadline = now_s() + o->bash_timeout_s;
    bool timed_out = false, interrupted = false, truncated = false, reaped = false;
    int status = 0;
    char chunk[4096];
    for (;;) {
        if (o->interrupted && *o->interrupted) { interrupted = true; break; }
        if (now_s() >= deadline) { timed_out = true; break; }
        struct pollfd p = {fds[0], POLLIN, 0};
        int pr = poll(&p, 1, 100);
        if (pr < 0 && errno != EINTR) break;
        /* the shell is done and its output drained: a background job that
         * still holds the pipe (`server &`) does not keep us waiting */
        if (pr == 0 && waitpid(pid, &status, WNOHANG) == pid) { reaped = true; break; }
        if (pr <= 0) continue;
        ssize_t got = read(fds[0], chunk, sizeof chunk);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        size_t room = r->text.len < o->output_cap ? o->output_cap - r->text.len : 0;
        if ((size_t)got > room) truncated = true;
        ds4_buf_put(&r->text, chunk, (size_t)got < room ? (size_t)got : room);
    }
    if (timed_out || interrupted) {
        kill(-pid, SIGKILL);
        /* and whatever left the group: all that is below the agent now,
         * except the jobs earlier commands left running */
        kill_below(jobs, n_jobs, pid);
    }
    free(jobs);
    close(fds[0]);
    while (!reaped && waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (truncated) status_line(&r->text, "[output truncated at %zu bytes]", o->output_cap);
    if (timed_out) {
        status_line(&r->text, "[killed: no exit after %d s]", o->bash_timeout_s);
        r->ok = false;
        snprintf(r->summary, sizeof r->summary, "timed out after %d s (killed)", o->bash_timeout_s);
    } else if (interrupted) {
        status_line(&r->text, "[interrupted by the user]");
        r->ok = false;
        snprintf(r->summary, sizeof r->summary, "interrupted (killed)");
    } else if (WIFEXITED(status)) {
        status_line(&r->text, "[exit status %d]", WEXITSTATUS(status));
        r->ok = WEXITSTATUS(status) == 0;
        snprintf(r->summary, sizeof r->summary, "exit %d, %zu bytes of output", WEXITSTATUS(status), r->text.len);
    } else {
        status_line(&r->text, "[killed by signal %d]", WTERMSIG(status));
        r->ok = false;
        snprintf(r->summary, sizeof r->summary, "killed by signal %d", WTERMSIG(status));
    }
}

/* ---- dispatch ---- */

typedef void (*tool_fn)(const ds4_agent_tools_opts *, const cJSON *, ds4_agent_tool_result *);

void ds4_agent_tool_run(const ds4_agent_tools_opts *o, const char *name, const char *args_json,
                        ds4_agent_tool_result *r) {
    static const struct { const char *name; tool_fn fn; } table[] = {
        {"read_file", tool_read}, {"write_file", tool_write}, {"edit_file", tool_edit}, {"list_dir", tool_list},
        {"glob", tool_glob}, {"grep", tool_grep}, {"bash", tool_bash}, {"job_list", tool_job_list},
        {"job_output", tool_job_output}, {"job_stop", tool_job_stop},
    };
    memset(r, 0, sizeof *r);
    cJSON *args = cJSON_Parse(args_json ? args_json : "{}");
    if (!cJSON_IsObject(args)) {
        fail(r, "%s: arguments are not a JSON object", name ? name : "?");
    } else {
        size_t i = 0;
        while (i < sizeof table / sizeof table[0] && strcmp(table[i].name, name ? name : "")) i++;
        if (i == sizeof table / sizeof table[0]) fail(r, "unknown tool '%s'; the tools are read_file, write_file, edit_file, list_dir, glob, grep, bash, "
                                                          "job_list, job_output, job_stop", name ? name : "");
        else table[i].fn(o, args, r);
    }
    cJSON_Delete(args);
    if (!r->text.oom && memchr(r->text.data ? r->text.data : "", 0, r->text.len)) {
        /* the chat renderer takes a result as a C string: NUL bytes (binary
         * output) are written as the two characters \0 */
        ds4_buf out = {0};
        for (size_t i = 0; i < r->text.len; i++) {
            if (r->text.data[i]) ds4_buf_putc(&out, r->text.data[i]);
            else ds4_buf_puts(&out, "\\0");
        }
        ds4_buf_free(&r->text);
        r->text = out;
    }
    if (r->text.oom || r->display.oom) fail(r, "%s: out of memory", name);
}
