/* ds4-agent -- the native coding agent: the engine runs in-process and the
 * conversation's KV state is the session (src/agent/loop.h); sessions are
 * KVC files (src/agent/store.h). This file parses arguments, runs the
 * line editor and the slash commands.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <editline/readline.h>

#include "agent/loop.h"
#include "agent/store.h"
#include "text/chat.h"
#include "options/cli_args.h"
#include "engine/engine.h"

typedef struct {
    const char *model;
    int ctx, threads, prefill_chunk, max_tokens, bash_timeout, numerics;
    const char *layers;     /* --layers */
    ds4_dist_params dist;   /* --role coordinator ... */
    ds4_think_mode think;
    ds4_sampler_params sampling;
    ds4_spec_params spec;        /* --spec-lookup */
    ds4_ssd_params ssd;
    ds4_runtime_opts runtime;    /* --dir-steering-*, --power */
    const char *chdir_to;
    const char *sessions_dir;
    bool yes, autosave;
    const char *script, *trace, *dump_logits;
    const char *prompt;     /* -p: one turn, then exit */
    const char *system;     /* -sys: replaces the built-in system prompt */
    ds4_gpu_opts gpu;
} agent_args;

/* A step that would fill more of the context than this compacts the
 * conversation first (upstream's threshold). */
#define COMPACT_PERCENT 85

static volatile sig_atomic_t g_interrupted, g_quit;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* SIGTERM, SIGHUP (the terminal closed): stop what runs and leave through
 * the normal exit, which saves and ends the commands' jobs */
static void on_quit(int sig) {
    (void)sig;
    g_interrupted = 1;
    g_quit = 1;
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: ds4-agent [options]\n"
        "  -p, --prompt TEXT       one-shot: answer TEXT (tools included), save, exit\n"
        "  -sys, --system TEXT     system prompt instead of the built-in one\n"
        "  -m, --model FILE        GGUF model (default ./ds4flash.gguf)\n"
        "  -c, --ctx N             context size in tokens (default 100000)\n"
        "  -t, --threads N         CPU threads (default: all)\n"
        "  -n, --tokens N          max tokens per assistant message (default 50000)\n"
        "      --think | --think-max | --nothink   thinking mode (default --think)\n"
        "      --temp F --top-p F --top-k N --min-p F --seed N   sampling (as ds4)\n"
        "%s"
        "      --prefill-chunk N   prefill chunk size (default 4096)\n"
        "      --numerics MODE     exact | ds4 (FP8 KV / FP4 indexer simulation; default)\n"
        "      --layers A:B|A:output  map only that layer slice (docs/distributed.md)\n"
        "%s%s%s%s"
        "      --chdir DIR         working directory of the tools (default: the current one)\n"
        "      --yes               run bash commands without asking\n"
        "      --bash-timeout S    seconds before a command is killed (default 30)\n"
        "      --sessions-dir DIR  saved sessions (default ~/.ds4/kvcache)\n"
        "      --no-autosave       save only on /save (default: after each turn and on exit)\n"
        "      --trace FILE        append one line per prefill/generation (token counts)\n"
        "      --scripted-output F TEST ONLY: the model's messages come from F (entries split by '@@@' lines)\n"
        "  -h, --help              this text\n"
        "commands: /help /list /save /switch ID /del ID /strip ID /new /ctx /compact /jobs /history N /think /nothink /think-show /quit\n",
        ds4_spec_usage, ds4_ssd_usage, ds4_runtime_usage, ds4_gpu_usage, ds4_dist_usage);
}

static int parse_args(int argc, char **argv, agent_args *o) {
    /* context and message defaults as upstream's agent */
    *o = (agent_args){.model = "./ds4flash.gguf", .ctx = 100000, .max_tokens = 50000, .bash_timeout = 30,
                      .numerics = -1, .think = DS4_THINK_HIGH, .autosave = true};
    ds4_sampler_params_default(&o->sampling);
    o->sampling.seed = ds4_sampler_random_seed();
    ds4_spec_params_default(&o->spec);
    ds4_gpu_opts_default(&o->gpu);
    static const ds4_cli_int_opt bash_timeout = {"--bash-timeout", 1, 86400};
    ds4_runtime_opts_default(&o->runtime);
    ds4_cli c;
    ds4_cli_begin(&c, "ds4-agent", argc, argv);
    while (ds4_cli_next(&c)) {
        if (ds4_cli_is(&c, "-h|--help")) { usage(stdout); return 1; }
        if (ds4_cli_ssd(&c, &o->ssd) || ds4_cli_dist(&c, &o->dist) || ds4_cli_gpu(&c, &o->gpu) ||
            ds4_cli_model(&c, &o->model) || ds4_cli_str(&c, "-p|--prompt", &o->prompt) ||
            ds4_cli_str(&c, "-sys|--system", &o->system) || ds4_cli_layers(&c, &o->layers) || ds4_cli_numerics(&c, &o->numerics) ||
            ds4_cli_int(&c, &ds4_opt_ctx, &o->ctx) || ds4_cli_int(&c, &ds4_opt_threads, &o->threads) ||
            ds4_cli_int(&c, &ds4_opt_tokens, &o->max_tokens) ||
            ds4_cli_int(&c, &ds4_opt_prefill_chunk, &o->prefill_chunk) ||
            ds4_cli_int(&c, &bash_timeout, &o->bash_timeout) || ds4_cli_sampling(&c, &o->sampling) ||
            ds4_cli_spec(&c, &o->spec) || ds4_cli_runtime(&c, &o->runtime) || ds4_cli_str(&c, "--chdir", &o->chdir_to) ||
            ds4_cli_str(&c, "--sessions-dir", &o->sessions_dir) || ds4_cli_str(&c, "--trace", &o->trace) ||
            ds4_cli_str(&c, "--scripted-output", &o->script) ||
            /* test hook: the final next-token logits as raw f32, to compare runs bit for bit */
            ds4_cli_str(&c, "--dump-logits", &o->dump_logits))
            continue;
        if (ds4_cli_is(&c, "--think")) o->think = DS4_THINK_HIGH;
        else if (ds4_cli_is(&c, "--think-max")) o->think = DS4_THINK_MAX;
        else if (ds4_cli_is(&c, "--nothink")) o->think = DS4_THINK_NONE;
        else if (ds4_cli_is(&c, "--yes")) o->yes = true;
        else if (ds4_cli_is(&c, "--no-autosave")) o->autosave = false;
        else ds4_cli_unknown(&c);
    }
    if (c.status || !ds4_cpu_select("ds4-agent", o->runtime.isa, o->runtime.cpu_affinity)) return -1;
    return 0;
}

/* Absolute paths for what the user named relative to the launch directory,
 * since --chdir moves the process. */
static char *absolute(const char *path) {
    if (path[0] == '/') return strdup(path);
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return NULL;
    size_t n = strlen(cwd) + strlen(path) + 2;
    char *out = malloc(n);
    if (out) snprintf(out, n, "%s/%s", cwd, path);
    return out;
}

/* Files the agent writes for the user (trace, logits dump) are private. */
static FILE *open_private(const char *path, const char *mode, int flags) {
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | flags, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, mode) : NULL;
    if (fd >= 0 && !f) close(fd);
    return f;
}

static bool confirm(void *ud, const char *question) {
    ds4_agent_display_interject(ud);
    char prompt[1024];
    snprintf(prompt, sizeof prompt, "%s [y/N] ", question);
    g_interrupted = 0;
    char *line = readline(prompt);
    bool yes = line && (line[0] == 'y' || line[0] == 'Y');
    free(line);
    return yes;
}

typedef struct {
    ds4_agent *agent;
    ds4_agent_display *display;
    const char *dir;
    bool autosave;
} repl;

static void save_now(repl *r, bool quiet) {
    if (!ds4_agent_id(r->agent)[0]) return;
    char err[512];
    if (ds4_agent_save(r->agent, r->dir, err, sizeof err)) ds4_agent_display_note(r->display, "save failed: %s (the previous file is kept)", err);
    else if (!quiet) ds4_agent_display_note(r->display, "[saved session %.12s]", ds4_agent_id(r->agent));
}

static void human_size(uint64_t bytes, char *out, size_t n) {
    if (bytes >= (1ull << 30)) snprintf(out, n, "%.1f GiB", bytes / 1073741824.0);
    else if (bytes >= (1ull << 20)) snprintf(out, n, "%.1f MiB", bytes / 1048576.0);
    else snprintf(out, n, "%.1f KiB", bytes / 1024.0);
}

static void cmd_list(repl *r) {
    ds4_agent_session_info *list;
    int n;
    char err[512];
    if (ds4_agent_store_list(r->dir, &list, &n, err, sizeof err)) { printf("%s\n", err); return; }
    if (n == 0) printf("no saved sessions in %s\n", r->dir);
    for (int i = 0; i < n; i++) {
        const ds4_agent_session_info *s = &list[i];
        if (s->unreadable) { printf("  %-12.12s  unreadable: %s\n", s->id, s->why); continue; }
        char when[32], size[32];
        time_t t = (time_t)s->updated;
        strftime(when, sizeof when, "%Y-%m-%d %H:%M", localtime(&t));
        human_size(s->file_bytes, size, sizeof size);
        printf("%c %-12.12s  %s  %7u tokens  %10s%s  %s\n", strcmp(s->id, ds4_agent_id(r->agent)) ? ' ' : '*', s->id,
               when, s->n_tokens, size, s->stripped ? " (stripped)" : "", s->title);
    }
    free(list);
}

static void cmd_ctx(repl *r) {
    ds4_agent_stats st;
    ds4_agent_stats_get(r->agent, &st);
    printf("context %d/%d tokens | restored %d, prefilled %lld, generated %lld | last prefill %d tokens at %d | "
           "session %s\n", st.n_tokens, st.ctx, st.restored, st.prefilled, st.decoded, st.last_prefill_n,
           st.last_prefill_from, ds4_agent_id(r->agent)[0] ? ds4_agent_id(r->agent) : "(new)");
}

/* Commands that name a saved session: resolve the prefix, then act. */
static void cmd_session(repl *r, const char *cmd, const char *arg) {
    char id[DS4_AGENT_ID_HEX + 1], err[512];
    if (ds4_agent_store_find(r->dir, arg, id, err, sizeof err)) { printf("%s\n", err); return; }
    if (!strcmp(cmd, "/del")) {
        if (ds4_agent_store_delete(r->dir, id, err, sizeof err)) printf("%s\n", err);
        else printf("deleted %.12s\n", id);
    } else if (!strcmp(cmd, "/strip")) {
        if (ds4_agent_store_strip(r->dir, id, err, sizeof err)) printf("%s\n", err);
        else printf("stripped %.12s (text and title kept; switching re-prefills)\n", id);
    } else {
        if (r->autosave) save_now(r, true);
        g_interrupted = 0;
        int rc = ds4_agent_switch(r->agent, r->dir, id, err, sizeof err);
        if (rc) { printf("%s\n", err); return; }
        ds4_agent_stats st;
        ds4_agent_stats_get(r->agent, &st);
        printf("switched to %.12s: %d tokens, %s\n", id, st.n_tokens,
               st.restored ? "restored from its KV payload (no prefill)" : "rebuilt by prefilling its text");
    }
}

static void help(void) {
    printf("/list          saved sessions, most recently updated first\n"
           "/save          save this session now\n"
           "/switch ID     resume a saved session (ID: a prefix of its sha)\n"
           "/del ID        delete a saved session\n"
           "/strip ID      keep a session's text and title, drop its KV payload\n"
           "/new           start a new session\n"
           "/ctx           context use and prefill counters\n"
           "/jobs          the background jobs the model started (bash with background)\n"
           "/compact       summarise the conversation into a new session (the old one stays saved)\n"
           "/history [N]   the conversation's last N messages (default 10), one line each\n"
           "/think /nothink   thinking mode for the next messages\n"
           "/think-show    show or hide the model's reasoning\n"
           "/quit          save (unless --no-autosave) and exit; Ctrl+D too\n"
           "Ctrl+C stops the current prefill, generation or command.\n");
}

static void run_repl(repl *r, const char *history) {
    using_history();
    if (history) read_history(history);
    printf("ds4-agent: /help for commands. Sessions in %s\n", r->dir);
    for (;;) {
        g_interrupted = 0;
        if (g_quit) break;
        char *line = readline("agent> ");
        if (g_quit) { free(line); break; }
        if (!line) {
            if (g_interrupted) { putchar('\n'); continue; }
            putchar('\n');
            break;
        }
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (!*s || g_interrupted) { free(line); continue; }
        add_history(s);
        if (s[0] == '/') {
            char *arg = strchr(s, ' ');
            if (arg) { *arg++ = 0; while (*arg == ' ') arg++; }
            bool quit = false;
            if (!strcmp(s, "/quit") || !strcmp(s, "/exit")) quit = true;
            else if (!strcmp(s, "/help")) help();
            else if (!strcmp(s, "/list")) cmd_list(r);
            else if (!strcmp(s, "/save")) save_now(r, false);
            else if (!strcmp(s, "/switch") || !strcmp(s, "/del") || !strcmp(s, "/strip")) cmd_session(r, s, arg);
            else if (!strcmp(s, "/new")) {
                if (r->autosave) save_now(r, true);
                ds4_agent_reset(r->agent);
                printf("new session\n");
            }
            else if (!strcmp(s, "/ctx")) cmd_ctx(r);
            else if (!strcmp(s, "/jobs")) {
                ds4_buf jobs = {0};
                ds4_agent_tools_jobs(&jobs);
                fwrite(jobs.data ? jobs.data : "", 1, jobs.len, stdout);
                ds4_buf_free(&jobs);
            }
            else if (!strcmp(s, "/compact")) {
                g_interrupted = 0;
                if (ds4_agent_compact(r->agent) == 0 && r->autosave) save_now(r, true);
            }
            else if (!strcmp(s, "/history")) {
                int n = 10;
                if (arg && *arg && !ds4_parse_int(arg, 1, 100000, &n)) printf("/history N: N is a count of messages\n");
                else ds4_agent_history(r->agent, n, stdout);
            }
            else if (!strcmp(s, "/think")) { ds4_agent_set_think(r->agent, DS4_THINK_HIGH); printf("thinking mode\n"); }
            else if (!strcmp(s, "/nothink")) { ds4_agent_set_think(r->agent, DS4_THINK_NONE); printf("non-thinking mode\n"); }
            else if (!strcmp(s, "/think-show")) {
                r->display->show_reasoning = !r->display->show_reasoning;
                printf("reasoning %s\n", r->display->show_reasoning ? "shown" : "hidden");
            }
            else printf("unknown command %s (/help)\n", s);
            free(line);
            if (quit) break;
            continue;
        }
        g_interrupted = 0;
        int rc = ds4_agent_turn(r->agent, s);
        if (rc >= 0 && r->autosave) save_now(r, true);
        free(line);
    }
    if (history) {
        /* the history holds what was typed: created private like the sessions */
        int fd = open(history, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) close(fd);
        write_history(history);
    }
}

static char *home_path(const char *rel) {
    const char *home = getenv("HOME");
    if (!home) return NULL;
    size_t n = strlen(home) + strlen(rel) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", home, rel);
    return p;
}

static int write_logits(const char *path, ds4_engine *e, const ds4_session *s) {
    const float *logits = ds4_session_logits(s);
    FILE *f = open_private(path, "wb", O_TRUNC);
    if (!f || !logits) { if (f) fclose(f); fprintf(stderr, "ds4-agent: cannot dump logits to %s\n", path); return -1; }
    size_t n = (size_t)ds4_engine_n_vocab(e);
    bool ok = fwrite(logits, sizeof *logits, n, f) == n;
    if (fclose(f) || !ok) { fprintf(stderr, "ds4-agent: write error on %s\n", path); return -1; }
    return 0;
}

int main(int argc, char **argv) {
    agent_args o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);   /* no SA_RESTART: readline and poll return on Ctrl+C */
    sa.sa_handler = on_quit;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* a file-size limit must fail the write (and keep the old session), not kill us */
    signal(SIGXFSZ, SIG_IGN);

    char *dir = o.sessions_dir ? absolute(o.sessions_dir) : home_path(".ds4/kvcache");
    char *model = absolute(o.model), *trace_path = o.trace ? absolute(o.trace) : NULL;
    char *dump = o.dump_logits ? absolute(o.dump_logits) : NULL, *history = home_path(".ds4_agent_history");
    int status = 1;
    ds4_engine *e = NULL;
    ds4_agent *agent = NULL;
    FILE *trace = NULL;
    ds4_turn_script script = {0};
    char err[512], root[PATH_MAX];
    /* the model first: a wrong -m should not leave a sessions directory behind */
    if (!model || !ds4_cli_model_usable("ds4-agent", model)) goto out;
    if (!ds4_dist_finish_options(&o.dist, false, err, sizeof err)) { fprintf(stderr, "ds4-agent: %s\n", err); goto out; }
    if (!dir) { fprintf(stderr, "ds4-agent: no sessions directory (set HOME or --sessions-dir)\n"); goto out; }
    if (ds4_agent_store_init(dir, err, sizeof err)) { fprintf(stderr, "ds4-agent: %s\n", err); goto out; }
    if (o.script && ds4_turn_script_load(o.script, DS4_AGENT_SCRIPT_SEPARATOR, &script, err, sizeof err)) { fprintf(stderr, "ds4-agent: %s\n", err); goto out; }
    if (trace_path && !(trace = open_private(trace_path, "a", O_APPEND))) { fprintf(stderr, "ds4-agent: cannot open %s: %s\n", trace_path, strerror(errno)); goto out; }
    if (o.chdir_to && chdir(o.chdir_to)) { fprintf(stderr, "ds4-agent: --chdir %s: %s\n", o.chdir_to, strerror(errno)); goto out; }
    if (!realpath(".", root)) { fprintf(stderr, "ds4-agent: cannot resolve the working directory: %s\n", strerror(errno)); goto out; }

    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = model;
    ep.mtp_path = ds4_spec_engine_mtp(&o.spec);
    ep.dspark_path = ds4_spec_engine_dspark(&o.spec);
    ep.n_threads = o.threads;
    ep.prefill_chunk = o.prefill_chunk;
    ep.numerics = o.numerics;
    ep.layers = o.layers;
    ep.dist = o.dist;
    ep.ssd = o.ssd;
    ep.ssd.ctx = o.ctx;
    ep.gpu = o.gpu;
    ep.gpu_ctx = o.ctx;
    ds4_runtime_apply(&o.runtime, &ep);
    if (!(e = ds4_engine_load(&ep, err, sizeof err))) { fprintf(stderr, "ds4-agent: %s\n", err); goto out; }

    ds4_agent_display display;
    ds4_agent_display_init(&display, stdout, stderr);
    ds4_agent_opts ao = {.engine = e, .ctx = o.ctx, .think = o.think, .sampling = o.sampling,
                         .max_gen_tokens = o.max_tokens, .max_steps = 64, .script = o.script ? &script : NULL,
                         .system_prompt = o.system, .sessions_dir = dir, .compact_percent = COMPACT_PERCENT,
                         .trace = trace, .interrupted = &g_interrupted, .display = &display};
    static ds4_spec drafter;
    if (ds4_spec_wanted(&o.spec)) {
        if (!ds4_spec_init(&drafter, &o.spec, err, sizeof err)) { fprintf(stderr, "ds4-agent: %s\n", err); goto out; }
        ao.spec = &drafter;
    }
    ds4_agent_tools_opts_default(&ao.tools, root);
    ao.tools.auto_yes = o.yes;
    ao.tools.bash_timeout_s = o.bash_timeout;
    ao.tools.confirm = confirm;
    ao.tools.confirm_ud = &display;
    ao.tools.interrupted = &g_interrupted;
    if (!(agent = ds4_agent_new(&ao, err, sizeof err))) { fprintf(stderr, "ds4-agent: %s\n", err); goto out; }

    repl r = {agent, &display, dir, o.autosave};
    int turn = 0;
    if (o.prompt) {
        /* one-shot: the turn's answer (and what its tools did) is the output;
         * the session is saved like an interactive one */
        turn = ds4_agent_turn(agent, o.prompt);
        if (turn >= 0 && o.autosave) save_now(&r, true);
    } else {
        run_repl(&r, history);
        if (o.autosave) save_now(&r, false);
    }
    status = turn != 0 || (dump && write_logits(dump, e, ds4_agent_session(agent))) ? 1 : 0;
out:
    /* no command outlives the agent: its jobs (`server &`, setsid ...) end here */
    ds4_agent_tools_end_jobs();
    ds4_agent_free(agent);
    ds4_engine_free(e);
    ds4_turn_script_free(&script);
    if (trace) fclose(trace);
    free(dir);
    free(model);
    free(trace_path);
    free(dump);
    free(history);
    return status;
}
