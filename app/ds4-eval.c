/* ds4-eval -- the capability regression run: the embedded questions
 * (src/quality/eval_questions.h) through the real engine and generation loop
 * (src/quality/eval_run.h), graded (src/quality/eval_grade.h), in a split-screen terminal
 * view (src/quality/eval_tui.h) or plain lines. This file parses arguments and
 * wires them together.
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "options/cli_args.h"
#include "quality/eval_run.h"
#include "quality/eval_tui.h"

typedef struct {
    const char *model, *select, *trace, *regrade, *script, *expect_tokens;
    int threads, prefill_chunk, numerics, max_tokens, think_soft, think_hard;
    ds4_think_mode think;
    ds4_sampler_params sampling;
    ds4_ssd_params ssd;
    ds4_gpu_opts gpu;
    ds4_runtime_opts runtime;   /* --dir-steering-*, --power, --warm-weights */
    ds4_spec_params spec;       /* --mtp*, --spec-lookup, --quality */
    bool plain, list;
} eval_args;

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: ds4-eval [options]\n"
        "  -m, --model FILE        GGUF model (default ./ds4flash.gguf)\n"
        "  -n, --tokens N          generation budget per question (default 16000)\n"
        "      --think | --nothink thinking mode (default --think)\n"
        "      --think-soft N      close the reasoning at the first line end after N tokens (default: 3/4 of the budget)\n"
        "      --think-hard N      close it at once after N tokens (default: 7/8 of the budget)\n"
        "      --questions SPEC    N = the first N questions; or ids, ranges and categories: q3,10-20,math,sec\n"
        "      --list              one line per embedded question and exit\n"
        "      --plain             plain lines instead of the terminal view (default when stdout is not a terminal)\n"
        "      --trace FILE        every prompt, token and verdict as JSON lines\n"
        "      --regrade-trace F   grade an old trace again with the current extractor (no model) and exit\n"
        "      --expect-tokens L   drift gate: generated token counts the selected questions must reproduce (comma list)\n"
        "      --temp F --top-p F --top-k N --min-p F --seed N   sampling (as ds4)\n"
        "  -t, --threads N         CPU threads (default: all)\n"
        "      --prefill-chunk N   prefill chunk size (default 4096)\n"
        "      --numerics MODE     exact | ds4 (FP8 KV / FP4 indexer simulation; default)\n"
        "%s%s%s%s"
        "      --scripted-output F TEST ONLY: replies come from F (entries split by '@@@' lines), one per question in run order\n"
        "  -h, --help              this text\n"
        "keys (terminal view): p pause/resume, q quit and report, Up/Down select, Enter run the selected question next\n",
        ds4_ssd_usage, ds4_runtime_usage, ds4_gpu_usage, ds4_spec_usage);
}

static int parse_args(int argc, char **argv, eval_args *o) {
    *o = (eval_args){.model = "./ds4flash.gguf", .numerics = -1, .max_tokens = 16000, .think_soft = -1, .think_hard = -1,
                     .think = DS4_THINK_HIGH};
    ds4_sampler_params_default(&o->sampling);
    o->sampling.seed = ds4_sampler_random_seed();
    ds4_gpu_opts_default(&o->gpu);
    ds4_runtime_opts_default(&o->runtime);
    ds4_spec_params_default(&o->spec);
    static const ds4_cli_int_opt tokens = {"-n|--tokens", 1, INT_MAX / 2};
    static const ds4_cli_int_opt think_soft = {"--think-soft", 0, INT_MAX};
    static const ds4_cli_int_opt think_hard = {"--think-hard", 0, INT_MAX};
    ds4_cli c;
    ds4_cli_begin(&c, "ds4-eval", argc, argv);
    while (ds4_cli_next(&c)) {
        if (ds4_cli_is(&c, "-h|--help")) { usage(stdout); return 1; }
        if (ds4_cli_ssd(&c, &o->ssd) || ds4_cli_gpu(&c, &o->gpu) || ds4_cli_model(&c, &o->model) ||
            ds4_cli_runtime(&c, &o->runtime) || ds4_cli_spec(&c, &o->spec) ||
            ds4_cli_numerics(&c, &o->numerics) || ds4_cli_int(&c, &tokens, &o->max_tokens) ||
            ds4_cli_int(&c, &think_soft, &o->think_soft) || ds4_cli_int(&c, &think_hard, &o->think_hard) ||
            ds4_cli_int(&c, &ds4_opt_threads, &o->threads) ||
            ds4_cli_int(&c, &ds4_opt_prefill_chunk, &o->prefill_chunk) || ds4_cli_sampling(&c, &o->sampling) ||
            ds4_cli_str(&c, "--questions", &o->select) || ds4_cli_str(&c, "--trace", &o->trace) ||
            ds4_cli_str(&c, "--regrade-trace", &o->regrade) || ds4_cli_str(&c, "--expect-tokens", &o->expect_tokens) ||
            ds4_cli_str(&c, "--scripted-output", &o->script))
            continue;
        if (ds4_cli_is(&c, "--think")) o->think = DS4_THINK_HIGH;
        else if (ds4_cli_is(&c, "--nothink")) o->think = DS4_THINK_NONE;
        else if (ds4_cli_is(&c, "--list")) o->list = true;
        else if (ds4_cli_is(&c, "--plain")) o->plain = true;
        else ds4_cli_unknown(&c);
    }
    if (c.status || !ds4_cpu_select("ds4-eval", o->runtime.isa, o->runtime.cpu_affinity)) return -1;
    /* the reasoning must close early enough for "</think>" and an answer */
    int reserve = o->max_tokens / 8;
    if (o->think_hard < 0) o->think_hard = o->max_tokens - reserve;
    if (o->think_soft < 0) o->think_soft = o->think_hard - reserve < 0 ? 0 : o->think_hard - reserve;
    if (o->think_soft > o->think_hard || o->think_hard >= o->max_tokens) {
        fprintf(stderr, "ds4-eval: need --think-soft <= --think-hard < --tokens (%d, %d, %d)\n", o->think_soft,
                o->think_hard, o->max_tokens);
        return -1;
    }
    return 0;
}

/* The ids to run, in order: all, the first N, or a selection. */
static int *selected_ids(const char *spec, int *count) {
    int n;
    const ds4_eval_question *q = ds4_eval_questions(&n);
    bool *mask = calloc((size_t)n, sizeof *mask);
    int *ids = calloc((size_t)n, sizeof *ids);
    if (!mask || !ids) { free(mask); free(ids); fprintf(stderr, "ds4-eval: out of memory\n"); return NULL; }
    int first;
    char err[200];
    if (!spec) for (int i = 0; i < n; i++) mask[i] = true;
    else if (ds4_parse_int(spec, 1, n, &first)) for (int i = 0; i < first; i++) mask[i] = true;
    else if (!ds4_eval_select(spec, mask, n, err, sizeof err)) {
        fprintf(stderr, "ds4-eval: %s\n", err);
        free(mask); free(ids);
        return NULL;
    }
    *count = 0;
    for (int i = 0; i < n; i++) if (mask[i]) ids[(*count)++] = q[i].id;
    free(mask);
    return ids;
}

static void list_questions(void) {
    int n;
    const ds4_eval_question *q = ds4_eval_questions(&n);
    for (int i = 0; i < n; i++) {
        char words[64];
        size_t k = 0;
        for (const char *p = q[i].text; *p && k < 56; p++) words[k++] = *p == '\n' ? ' ' : *p;
        words[k] = 0;
        printf("q%-3d %-5s %s%s\n", q[i].id, ds4_eval_category_name(q[i].cat), words, strlen(q[i].text) > k ? "..." : "");
    }
}

/* ---------------------------------------------------------- plain view */

typedef struct { const ds4_eval_run *r; int done; } plain_view;

static void plain_start(void *ud, int item) {
    plain_view *p = ud;
    const ds4_eval_item *it = &p->r->items[item];
    printf("[%d/%d] q%d %s: %zu prompt tokens\n", p->done + 1, p->r->n, it->q->id, ds4_eval_category_name(it->q->cat), it->prompt.n);
    fflush(stdout);
}

static void plain_end(void *ud, int item) {
    plain_view *p = ud;
    const ds4_eval_item *it = &p->r->items[item];
    p->done++;
    if (it->state != DS4_EVAL_DONE) return;
    printf("        %s  answer %s  expected %s  (%d tokens, %.1f s)\n", it->v.pass ? "PASS" : "FAIL",
           it->v.picked[0] ? it->v.picked : "-", it->q->answer, it->gen_tokens, it->seconds);
    fflush(stdout);
}

static bool plain_poll(void *ud) { (void)ud; return g_interrupted != 0; }

/* The drift gate: generated token counts must equal the baseline's. */
static bool check_gate(const char *list, const ds4_eval_run *r) {
    const char *p = list;
    bool ok = true;
    int i = 0;
    for (; *p && i < r->n; i++) {
        char *end;
        long want = strtol(p, &end, 10);
        if (end == p || (*end && *end != ',')) { fprintf(stderr, "ds4-eval: bad --expect-tokens list near '%.20s'\n", p); return false; }
        const ds4_eval_item *it = &r->items[i];
        if (it->state != DS4_EVAL_DONE || it->gen_tokens != want) {
            printf("gate: q%d generated %d tokens, the baseline %ld\n", it->q->id, it->gen_tokens, want);
            ok = false;
        }
        p = *end ? end + 1 : end;
    }
    if (*p || i != r->n) {
        printf("gate: %d questions ran, the baseline lists a different number\n", r->n);
        return false;
    }
    printf("gate: %s\n", ok ? "generated token counts match the baseline" : "DRIFT");
    return ok;
}

int main(int argc, char **argv) {
    eval_args o;
    int pr = parse_args(argc, argv, &o);
    if (pr) return pr > 0 ? 0 : 2;
    if (o.list) { list_questions(); return 0; }
    if (o.regrade) return ds4_eval_regrade(stdout, o.regrade) ? 1 : 0;

    int n_ids = 0;
    int *ids = selected_ids(o.select, &n_ids);
    if (!ids) return 2;
    ds4_turn_script script;
    char err[512];
    if (o.script && ds4_turn_script_load(o.script, DS4_AGENT_SCRIPT_SEPARATOR, &script, err, sizeof err)) {
        fprintf(stderr, "ds4-eval: %s\n", err);
        free(ids);
        return 1;
    }
    if (!ds4_cli_model_usable("ds4-eval", o.model)) { free(ids); return 1; }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);

    bool tui = !o.plain && isatty(STDOUT_FILENO) && isatty(STDIN_FILENO);
    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = o.model;
    ep.n_threads = o.threads;
    ep.prefill_chunk = o.prefill_chunk;
    ep.numerics = o.numerics;
    ep.gpu = o.gpu;
    ep.ssd = o.ssd;
    ep.mtp_path = ds4_spec_engine_mtp(&o.spec);
    ds4_runtime_apply(&o.runtime, &ep);
    int status = 1;
    ds4_engine *e = ds4_engine_load(&ep, err, sizeof err);
    ds4_eval_run r = {0};
    ds4_session *s = NULL;
    ds4_sampler *smp = NULL;
    FILE *trace = NULL;
    if (!e) { fprintf(stderr, "ds4-eval: %s\n", err); goto out; }
    if (o.trace && !(trace = fopen(o.trace, "w"))) { fprintf(stderr, "ds4-eval: cannot write %s\n", o.trace); goto out; }
    static ds4_spec drafter;
    if ((o.spec.lookup_max || o.spec.mtp_path) && !o.spec.quality &&
        !ds4_spec_init(&drafter, &o.spec, err, sizeof err)) {
        fprintf(stderr, "ds4-eval: %s\n", err);
        goto out;
    }
    ds4_eval_opts eo = {.max_tokens = o.max_tokens, .think_soft = o.think_soft, .think_hard = o.think_hard, .think = o.think,
                        .trace = trace, .script = o.script ? &script : NULL,
                        .spec = ds4_spec_enabled(&drafter) ? &drafter : NULL};
    if (ds4_eval_prepare(&r, e, ids, n_ids, &eo, err, sizeof err)) { fprintf(stderr, "ds4-eval: %s\n", err); goto out; }
    if (!(s = ds4_session_new(e, r.ctx, err, sizeof err))) { fprintf(stderr, "ds4-eval: %s\n", err); goto out; }
    if (!(smp = ds4_sampler_new(&o.sampling, ds4_engine_n_vocab(e)))) { fprintf(stderr, "ds4-eval: out of memory\n"); goto out; }
    ds4_eval_trace_header(&r, &o.sampling);
    fprintf(stderr, "ds4-eval: %d questions, context %d tokens, budget %d tokens (think soft %d, hard %d)\n", r.n, r.ctx,
            o.max_tokens, o.think_soft, o.think_hard);

    double t0 = ds4_eval_clock();
    int rc;
    if (tui) {
        ds4_eval_tui *t = ds4_eval_tui_open(&r, stdout, &g_interrupted);
        if (!t) { fprintf(stderr, "ds4-eval: cannot set up the terminal view; use --plain\n"); goto out; }
        ds4_eval_view v = ds4_eval_tui_view(t);
        rc = ds4_eval_run_all(&r, s, smp, &v, err, sizeof err);
        ds4_eval_tui_close(t);
    } else {
        plain_view pv = {&r, 0};
        ds4_eval_view v = {.start = plain_start, .end = plain_end, .poll = plain_poll, .ud = &pv};
        rc = ds4_eval_run_all(&r, s, smp, &v, err, sizeof err);
    }
    if (rc < 0) fprintf(stderr, "ds4-eval: %s\n", err);
    printf("\n");
    ds4_eval_report(stdout, r.items, r.n, ds4_eval_clock() - t0);
    if (eo.spec) {
        char line[512];
        ds4_spec_stats_line(eo.spec, line, sizeof line);
        fprintf(stderr, "ds4-eval: %s\n", line);
    }
    status = rc < 0 ? 1 : 0;
    if (rc == 0 && o.expect_tokens && !check_gate(o.expect_tokens, &r)) status = 1;
out:
    if (trace) fclose(trace);
    ds4_sampler_free(smp);
    ds4_session_free(s);
    ds4_eval_run_free(&r);
    ds4_engine_free(e);
    if (o.script) ds4_turn_script_free(&script);
    free(ids);
    return status;
}
