/* The agent's tools against a scratch tree: results are checked against the
 * files on disk (the independent truth), refusals against the rules of
 * agent/tools.h. */
#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/tools.h"
#include "check.h"

static char root[PATH_MAX];
static int asked;
static bool answer;

static bool confirm(void *ud, const char *q) {
    (void)ud;
    (void)q;
    asked++;
    return answer;
}

static void put(const char *rel, const char *text) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

static char *get(const char *rel) {
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    return ds4_read_file(p, NULL);
}

/* Runs one call; returns the result text (static, valid until the next run). */
static const char *run(const ds4_agent_tools_opts *o, const char *name, const char *args, bool *ok) {
    static ds4_agent_tool_result r;
    static bool have;
    if (have) ds4_agent_tool_result_free(&r);
    ds4_agent_tool_run(o, name, args, &r);
    have = true;
    *ok = r.ok;
    return r.text.data ? r.text.data : "";
}

/* Live processes running `sleep SECONDS` (their command line; a zombie
 * has none). */
static int sleeps(long seconds) {
    char want[64];
    int want_n = snprintf(want, sizeof want, "sleep%c%ld", 0, seconds) + 1;
    int found = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], buf[128];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        /* "sleep" may be a path (/usr/bin/sleep): compare the tail of argv[0] */
        for (size_t i = 0; i + (size_t)want_n <= n; i++)
            if ((i == 0 || buf[i - 1] == '/') && !memcmp(buf + i, want, (size_t)want_n)) { found++; break; }
    }
    if (d) closedir(d);
    return found;
}

int main(void) {
    char tmpl[] = "/tmp/ds4-agent-tools-XXXXXX";
    if (!mkdtemp(tmpl) || !realpath(tmpl, root)) { perror("mkdtemp"); return 1; }
    ds4_agent_tools_opts o;
    ds4_agent_tools_opts_default(&o, root);
    o.confirm = confirm;
    /* Room for a quick command on a loaded machine, and still well under the
     * 30 s a tool waiting for a background `sleep 30` would take (below). */
    o.bash_timeout_s = 10;
    bool ok;
    const char *t;

    put("a.txt", "one\ntwo\nthree\nfour\n");
    t = run(&o, "read_file", "{\"path\":\"a.txt\"}", &ok);
    CHECK(ok && !strcmp(t, "one\ntwo\nthree\nfour\n"), "whole file: %s", t);
    t = run(&o, "read_file", "{\"path\":\"a.txt\",\"start_line\":2,\"end_line\":3}", &ok);
    CHECK(ok && !strcmp(t, "two\nthree\n"), "range: %s", t);
    t = run(&o, "read_file", "{\"path\":\"a.txt\",\"start_line\":\"3\"}", &ok);
    CHECK(ok && !strcmp(t, "three\nfour\n"), "quoted start: %s", t);
    t = run(&o, "read_file", "{\"path\":\"a.txt\",\"start_line\":9}", &ok);
    CHECK(!ok && strstr(t, "past the end"), "past the end: %s", t);
    t = run(&o, "read_file", "{\"path\":\"a.txt\",\"start_line\":3,\"end_line\":1}", &ok);
    CHECK(!ok && strstr(t, "start_line"), "bad range: %s", t);
    t = run(&o, "read_file", "{\"path\":\"missing.txt\"}", &ok);
    CHECK(!ok && strstr(t, "No such file"), "missing: %s", t);

    /* a file over the cap: refused whole, readable by range, output capped */
    o.read_cap = 1000;
    char *big = malloc(20001);
    for (int i = 0; i < 20000; i++) big[i] = (i % 50 == 49) ? '\n' : 'x';
    big[20000] = 0;
    put("big.txt", big);
    free(big);
    t = run(&o, "read_file", "{\"path\":\"big.txt\"}", &ok);
    CHECK(!ok && strstr(t, "over the 1000-byte cap"), "cap: %s", t);
    t = run(&o, "read_file", "{\"path\":\"big.txt\",\"start_line\":1,\"end_line\":2}", &ok);
    CHECK(ok && strlen(t) == 100, "range of a big file: %zu bytes", strlen(t));
    t = run(&o, "read_file", "{\"path\":\"big.txt\",\"start_line\":1}", &ok);
    CHECK(ok && strstr(t, "[truncated at 1000 bytes after line 20;"), "open range truncated: %s", t + (strlen(t) > 80 ? strlen(t) - 80 : 0));
    o.read_cap = 256u << 10;

    /* write + edit with the unique-match rule */
    t = run(&o, "write_file", "{\"path\":\"b.c\",\"content\":\"int x = 1;\\nint y = 1;\\n\"}", &ok);
    char *b = get("b.c");
    CHECK(ok && b && !strcmp(b, "int x = 1;\nint y = 1;\n"), "write: %s", t);
    free(b);
    t = run(&o, "edit_file", "{\"path\":\"b.c\",\"old_string\":\" = 1;\",\"new_string\":\" = 2;\"}", &ok);
    CHECK(!ok && strstr(t, "occurs 2 times"), "ambiguous edit refused: %s", t);
    t = run(&o, "edit_file", "{\"path\":\"b.c\",\"old_string\":\"nope\",\"new_string\":\"x\"}", &ok);
    CHECK(!ok && strstr(t, "not found"), "missing text: %s", t);
    ds4_agent_tool_result r;
    ds4_agent_tool_run(&o, "edit_file", "{\"path\":\"b.c\",\"old_string\":\"int y = 1;\",\"new_string\":\"int y = 2;\\nint z = 3;\"}", &r);
    b = get("b.c");
    CHECK(r.ok && b && !strcmp(b, "int x = 1;\nint y = 2;\nint z = 3;\n"), "edit applied: %s", b ? b : "(null)");
    CHECK(r.display.data && !strcmp(r.display.data, "@@ b.c:2\n-int y = 1;\n+int y = 2;\n+int z = 3;\n"),
          "diff: %s", r.display.data ? r.display.data : "(none)");
    free(b);
    ds4_agent_tool_result_free(&r);
    ds4_agent_tool_run(&o, "edit_file", "{\"path\":\"b.c\",\"old_string\":\"x = 1\",\"new_string\":\"x = 0\"}", &r);
    CHECK(r.ok && r.display.data && !strcmp(r.display.data, "@@ b.c:1\n-int x = 1;\n+int x = 0;\n"),
          "a diff shows whole lines: %s", r.display.data ? r.display.data : "(none)");
    ds4_agent_tool_result_free(&r);

    /* list, glob, grep */
    char sub[PATH_MAX + 8];
    snprintf(sub, sizeof sub, "%s/sub", root);
    CHECK(mkdir(sub, 0700) == 0, "mkdir sub");
    put("sub/c.c", "// TODO: fix\nint main(void) { return 0; }\n");
    t = run(&o, "list_dir", "{}", &ok);
    CHECK(ok && !strcmp(t, "a.txt\nb.c\nbig.txt\nsub/\n"), "list: %s", t);
    t = run(&o, "glob", "{\"pattern\":\"*.c\"}", &ok);
    CHECK(ok && !strcmp(t, "b.c\nsub/c.c\n"), "glob basenames: %s", t);
    t = run(&o, "glob", "{\"pattern\":\"sub/*\"}", &ok);
    CHECK(ok && !strcmp(t, "sub/c.c\n"), "glob path: %s", t);
    t = run(&o, "grep", "{\"pattern\":\"TODO|int z\"}", &ok);
    CHECK(ok && !strcmp(t, "b.c:3:int z = 3;\nsub/c.c:1:// TODO: fix\n"), "grep: %s", t);
    t = run(&o, "grep", "{\"pattern\":\"(unclosed\"}", &ok);
    CHECK(!ok && strstr(t, "bad regular expression"), "bad regex: %s", t);
    /* with the root "/", paths are shown without their leading slash */
    ds4_agent_tools_opts top = o;
    top.root = "/";
    char grep_args[PATH_MAX + 64], grep_want[PATH_MAX + 64];
    snprintf(grep_args, sizeof grep_args, "{\"pattern\":\"TODO\",\"path\":\"%s/sub\"}", root);
    snprintf(grep_want, sizeof grep_want, "%s/sub/c.c:1:// TODO: fix\n", root + 1);
    t = run(&top, "grep", grep_args, &ok);
    CHECK(ok && !strcmp(t, grep_want), "grep from the root /: %s", t);
    o.max_results = 3;
    t = run(&o, "grep", "{\"pattern\":\"x\",\"path\":\"big.txt\"}", &ok);
    CHECK(ok && strstr(t, "[stopped after 3 matches]"), "grep cap: %s", t);
    o.max_results = 200;

    /* outside the root: refused unless confirmed, symlinks resolved */
    char link[PATH_MAX + 16];
    snprintf(link, sizeof link, "%s/escape", root);
    CHECK(symlink("/etc", link) == 0, "symlink");
    answer = false;
    asked = 0;
    t = run(&o, "read_file", "{\"path\":\"/etc/passwd\"}", &ok);
    CHECK(!ok && strstr(t, "outside the working directory") && asked == 0, "absolute outside: %s", t);
    t = run(&o, "read_file", "{\"path\":\"escape/passwd\"}", &ok);
    CHECK(!ok && strstr(t, "outside the working directory"), "symlink escape: %s", t);
    t = run(&o, "write_file", "{\"path\":\"../ds4-agent-evil.txt\",\"content\":\"x\"}", &ok);
    CHECK(!ok && strstr(t, "outside the working directory"), "dot-dot write: %s", t);
    /* confined without a question: even a user who would say yes is not asked */
    answer = true;
    asked = 0;
    char outside[PATH_MAX + 16], outside_rel[PATH_MAX + 64], args[2 * PATH_MAX], plant[PATH_MAX + 64];
    snprintf(outside, sizeof outside, "%s-outside", root);
    FILE *of = fopen(outside, "w");
    fputs("secret\n", of);
    fclose(of);
    const char *base = strrchr(outside, '/') + 1;
    snprintf(outside_rel, sizeof outside_rel, "../%s", base);
    snprintf(link, sizeof link, "%s/to-outside", root);
    CHECK(symlink(outside, link) == 0, "symlink to a file outside");
    static const char *const file_calls[][2] = {
        {"read_file", "{\"path\":\"%s\"}"},
        {"write_file", "{\"path\":\"%s\",\"content\":\"overwritten\"}"},
        {"edit_file", "{\"path\":\"%s\",\"old_string\":\"secret\",\"new_string\":\"changed\"}"},
        {"grep", "{\"pattern\":\"secret\",\"path\":\"%s\"}"},
    };
    for (int i = 0; i < 4; i++) {
        const char *targets[] = {outside_rel, "to-outside"};
        for (int k = 0; k < 2; k++) {
            snprintf(args, sizeof args, file_calls[i][1], targets[k]);
            t = run(&o, file_calls[i][0], args, &ok);
            CHECK(!ok && strstr(t, "outside the working directory"), "%s %s refused: %s", file_calls[i][0], targets[k], t);
        }
    }
    t = run(&o, "list_dir", "{\"path\":\"escape\"}", &ok);
    CHECK(!ok && strstr(t, "outside the working directory"), "list_dir through a symlink refused: %s", t);
    t = run(&o, "list_dir", "{\"path\":\"..\"}", &ok);
    CHECK(!ok && strstr(t, "outside the working directory"), "list_dir .. refused: %s", t);
    char *kept = ds4_read_file(outside, NULL);
    CHECK(kept && !strcmp(kept, "secret\n") && asked == 0, "the outside file is untouched and nobody was asked (%d)", asked);
    free(kept);
    unlink(outside);
    unlink(link);
    /* a link planted under write_file's temp name does not redirect the write */
    snprintf(plant, sizeof plant, "%s/planted.ds4-agent.%ld", root, (long)getpid());
    CHECK(symlink(outside, plant) == 0, "planted symlink");
    t = run(&o, "write_file", "{\"path\":\"planted\",\"content\":\"inside\"}", &ok);
    char *planted = get("planted");
    CHECK(ok && planted && !strcmp(planted, "inside") && access(outside, F_OK) != 0, "write stays inside: %s", t);
    free(planted);

    /* bash: confirmation, output, status, timeout, output cap */
    answer = false;
    t = run(&o, "bash", "{\"command\":\"echo hi\"}", &ok);
    CHECK(!ok && strstr(t, "declined"), "bash needs confirmation: %s", t);
    o.auto_yes = true;
    t = run(&o, "bash", "{\"command\":\"pwd; echo err >&2; exit 3\"}", &ok);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "%s\nerr\n\n[exit status 3]", root);
    CHECK(!ok && !strcmp(t, want), "bash output: %s", t);
    o.bash_timeout_s = 1;
    t = run(&o, "bash", "{\"command\":\"sleep 30 & sleep 30; echo never\"}", &ok);
    CHECK(!ok && strstr(t, "[killed: no exit after 1 s]") && !strstr(t, "never"), "timeout: %s", t);
    o.bash_timeout_s = 10;
    t = run(&o, "bash", "{\"command\":\"sleep 30 & echo started\"}", &ok);
    CHECK(ok && !strcmp(t, "started\n\n[exit status 0]"), "a background job does not hold the result: %s", t);
    /* the whole tree dies on a timeout: also what left the process group
     * (setsid, a subshell's orphan), and at the end the jobs of commands
     * that exited normally. The sleeps are named by their length, which is
     * this run's own. */
    long mark = 300000 + (long)getpid() % 100000;
    char cmdline[400];
    snprintf(cmdline, sizeof cmdline,
             "{\"command\":\"setsid sleep %ld & sleep %ld & (setsid sleep %ld &); sleep 30; echo never\"}", mark, mark + 1,
             mark + 2);
    o.bash_timeout_s = 1;
    t = run(&o, "bash", cmdline, &ok);
    CHECK(!ok && strstr(t, "[killed: no exit after 1 s]"), "timeout with escaped jobs: %s", t);
    for (long m = mark; m < mark + 3; m++) CHECK(sleeps(m) == 0, "sleep %ld is gone after the timeout", m);
    o.bash_timeout_s = 10;
    snprintf(cmdline, sizeof cmdline, "{\"command\":\"setsid sleep %ld & sleep %ld & echo started\"}", mark + 3, mark + 4);
    t = run(&o, "bash", cmdline, &ok);
    CHECK(ok && sleeps(mark + 3) == 1 && sleeps(mark + 4) == 1, "jobs of a finished command keep running: %s", t);
    /* a later command's timeout leaves them alone */
    o.bash_timeout_s = 1;
    t = run(&o, "bash", "{\"command\":\"sleep 30\"}", &ok);
    CHECK(!ok && sleeps(mark + 3) == 1 && sleeps(mark + 4) == 1, "another command's timeout spares them");
    o.bash_timeout_s = 10;
    ds4_agent_tools_end_jobs();
    CHECK(sleeps(mark + 3) == 0 && sleeps(mark + 4) == 0, "gone after end_jobs");
    o.output_cap = 100;
    t = run(&o, "bash", "{\"command\":\"yes | head -c 5000\"}", &ok);
    CHECK(ok && strstr(t, "[output truncated at 100 bytes]") && strlen(t) < 200, "output cap: %zu", strlen(t));

    /* model mistakes become results, never crashes */
    t = run(&o, "nope", "{}", &ok);
    CHECK(!ok && strstr(t, "unknown tool"), "unknown tool: %s", t);
    t = run(&o, "read_file", "[1,2]", &ok);
    CHECK(!ok && strstr(t, "not a JSON object"), "bad args: %s", t);
    t = run(&o, "write_file", "{\"path\":\"x\"}", &ok);
    CHECK(!ok && strstr(t, "content"), "missing content: %s", t);

    /* background jobs: asked like a command, started at once, their output
     * tail by lines (a last line without a newline counts), stopped with
     * what they started, and ended with the agent */
    o.auto_yes = false;
    answer = false;
    asked = 0;
    t = run(&o, "bash", "{\"command\":\"echo no\",\"background\":true}", &ok);
    CHECK(!ok && asked == 1 && strstr(t, "declined"), "a background job is asked for too: %s", t);
    answer = true;
    t = run(&o, "bash", "{\"command\":\"echo no\",\"background\":\"yes\"}", &ok);
    CHECK(!ok && strstr(t, "background must be true or false"), "bad background value: %s", t);
    long jmark = 7000 + (long)(getpid() % 1000) * 10;
    char jcmd[200];
    snprintf(jcmd, sizeof jcmd, "{\"command\":\"printf 'a\\\\nb\\\\nc'; sleep %ld & sleep %ld\",\"background\":\"true\"}",
             jmark, jmark + 1);
    t = run(&o, "bash", jcmd, &ok);
    CHECK(ok && strstr(t, "started background job 1 (pid "), "job 1 starts: %s", t);
    t = run(&o, "bash", "{\"command\":\"printf 'x\\\\ny\\\\nz'\",\"background\":true}", &ok);
    CHECK(ok && strstr(t, "started background job 2 "), "job 2 starts: %s", t);
    /* job 2 ends by itself: wait for its exit as job_list reports it */
    for (int i = 0; i < 500 && !strstr(run(&o, "job_list", "{}", &ok), "job 2: exit status 0"); i++) usleep(10000);
    t = run(&o, "job_output", "{\"id\":2,\"lines\":2}", &ok);
    CHECK(ok && strstr(t, "job 2: exit status 0 after ") && strstr(t, "(at most 2):]\ny\nz\n") && !strstr(t, "x\n"),
          "job_output: the last 2 lines of a finished job: %s", t);
    t = run(&o, "job_output", "{\"id\":\"2\"}", &ok);
    CHECK(ok && strstr(t, "(at most 50):]\nx\ny\nz\n"), "job_output: fewer lines than asked: %s", t);
    t = run(&o, "job_output", "{\"id\":9}", &ok);
    CHECK(!ok && strstr(t, "no background job 9"), "unknown job: %s", t);
    t = run(&o, "job_output", "{\"id\":1,\"lines\":0}", &ok);
    CHECK(!ok && strstr(t, "positive"), "bad line count: %s", t);
    for (int i = 0; i < 500 && sleeps(jmark) + sleeps(jmark + 1) < 2; i++) usleep(10000);
    CHECK(sleeps(jmark) == 1 && sleeps(jmark + 1) == 1, "job 1 and the process it started run");
    t = run(&o, "job_list", "{}", &ok);
    CHECK(ok && strstr(t, "job 1: running for ") && strstr(t, "job 2: exit status 0"), "job_list: %s", t);
    t = run(&o, "job_stop", "{\"id\":1}", &ok);
    CHECK(ok && strstr(t, "job 1: killed by signal 15") && sleeps(jmark) == 0 && sleeps(jmark + 1) == 0,
          "job_stop ends the job and what it started: %s", t);
    snprintf(jcmd, sizeof jcmd, "{\"command\":\"sleep %ld\",\"background\":true}", jmark + 2);
    t = run(&o, "bash", jcmd, &ok);
    CHECK(ok && strstr(t, "job 3"), "job 3 starts: %s", t);
    o.auto_yes = true;
    for (int i = 0; i < 500 && sleeps(jmark + 2) < 1; i++) usleep(10000);
    CHECK(sleeps(jmark + 2) == 1, "job 3 runs");
    ds4_agent_tools_end_jobs();
    CHECK(sleeps(jmark + 2) == 0, "end_jobs ends a running job");
    t = run(&o, "job_list", "{}", &ok);
    CHECK(ok && strstr(t, "job 3: killed by signal 9"), "and job_list says so: %s", t);

    run(&o, "list_dir", "{}", &ok);   /* frees the last static result */


    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", root);
    return check_done("agent_tools");
}
