/* ds4 -- the command-line front end: one-shot prompts, an interactive
 * multi-turn chat, and the debugging dumps (tokens, logits, logprobs).
 *
 * Everything model-related goes through engine.h; this file only parses
 * arguments, renders conversations with chat.h, and talks to the terminal.
 *
 * The interactive chat keeps the conversation as chat messages and one live
 * session. Each turn renders the whole conversation, finds how much of the
 * session's checkpoint is still a prefix of the new prompt (earlier turns'
 * reasoning is dropped from history, so the tail usually differs), rewinds
 * to that point and prefills only the rest.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <editline/readline.h>

#include "text/chat.h"
#include "options/cli_args.h"
#include "engine/engine.h"
#include "base/json_util.h"
#include "base/turn_script.h"
#include "engine/generate.h"
#include "quality/imatrix.h"
#include "quality/perplexity.h"
#include "quality/vectors.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"
#include "nn/steering.h"

typedef struct {
    const char *model;
    const char *prompt;
    const char *prompt_file;
    const char *system;
    int n_predict;
    bool ignore_eos;        /* --ignore-eos */
    int ctx;
    int threads;
    int prefill_chunk;
    int numerics;
    const char *layers;     /* --layers */
    ds4_dist_params dist;   /* --role, --listen, --coordinator, --dist-secret */
    ds4_gpu_opts gpu;
    ds4_sampler_params sampling;
    ds4_think_mode think;
    bool dump_tokens;
    const char *dump_logprobs;
    int logprobs_top_k;
    const char *dump_logits;
    bool logits_all;
    const char *dump_mtp_logits;    /* --dump-mtp-logits: the MTP block's logits at every position */
    int mtp_dump_from;              /* --mtp-dump-from K: the first K tokens prefilled in one pass */
    const char *token_ids;
    const char *perplexity_file;
    const char *imatrix_dataset, *imatrix_out;
    bool imatrix_ids;       /* --imatrix-ids: dataset entries are token ids */
    const char *score_vectors;
    bool ppl_ids;           /* --ppl-ids: the perplexity file holds token ids */
    int ppl_stride;         /* 0: half the context */
    const char *dump_activations;   /* --dump-activations FILE */
    bool inspect;                   /* --inspect: metadata, tensor mix, memory plan, then exit */
    bool activations_attn;          /* --activation-component attn_out (default ffn_out) */
    ds4_ssd_params ssd;
    ds4_runtime_opts runtime;       /* --dir-steering-*, --power */
    ds4_spec_params spec_params;   /* --spec-lookup */
    ds4_spec *spec;         /* the drafter and its run stats (main sets it), or NULL */
} cli_opts;

/* Set by SIGINT; generation and prefill poll it. */
static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
    fprintf(f,
        "usage: ds4 [options]\n"
        "  -m, --model FILE        GGUF model (default ./ds4flash.gguf; `make demo` unpacks models/ds4-tiny.gguf)\n"
        "  -p, --prompt TEXT       one-shot prompt (without -p: interactive chat)\n"
        "      --prompt-file FILE  read the prompt from a file\n"
        "  -sys, --system TEXT     system prompt\n"
        "  -n, --tokens N          max tokens to generate (default 4096)\n"
        "      --ignore-eos        keep generating past end-of-sequence (only -n or Ctrl+C stops)\n"
        "  -c, --ctx N             context size in tokens (default 32768)\n"
        "      --temp F            temperature (default 1.0; 0 = greedy)\n"
        "      --top-p F           nucleus mass (default 1.0)\n"
        "      --top-k N           top-k (default 0 = off)\n"
        "      --min-p F           min-p relative to the top token (default 0.05)\n"
        "      --seed N            sampling seed (default: random)\n"
        "  -t, --threads N         CPU threads (default: all)\n"
        "      --think             thinking mode (default)\n"
        "      --think-max         Think Max (needs --ctx >= 393216, else thinking)\n"
        "      --nothink           direct answers\n"
        "      --prefill-chunk N   prefill chunk size (default 4096)\n"
        "      --numerics MODE     exact | ds4 (FP8 KV / FP4 indexer simulation; default)\n"
        "      --layers A:B|A:output  map only that layer slice (docs/distributed.md)\n"
        "%s"
        "%s"
        "%s"
        "%s"
        "%s"
        "debugging:\n"
        "      --dump-tokens       print the prompt's tokens (id, hex bytes, text) and exit\n"
        "      --dump-logprobs F   greedy continuation with top alternatives, as JSON\n"
        "      --logprobs-top-k K  alternatives per step for --dump-logprobs (default 20)\n"
        "      --dump-logits F     next-token logits of the prompt as JSON\n"
        "      --dump-mtp-logits F with --mtp and --token-ids: the MTP block's logits at every\n"
        "                          position after the first K (--mtp-dump-from K, default 1, prefilled\n"
        "                          in one pass), raw f32 rows of n_vocab\n"
        "      --logits-all        with --dump-logits: every position, not just the last\n"
        "      --token-ids LIST    evaluate raw ids (comma separated), no template/tokenizer\n"
        "quality:\n"
        "      --perplexity-file F perplexity of F's text (BOS + raw tokens) over windows of --ctx tokens\n"
        "      --ppl-stride N      window stride (default: half the window)\n"
        "      --ppl-ids           F holds comma-separated token ids instead of text\n"
        "      --imatrix-dataset F prompts separated by '@@@' lines, each rendered as a chat turn with and without thinking\n"
        "      --imatrix-out F     where the importance matrix goes (llama.cpp's GGUF imatrix format)\n"
        "      --imatrix-ids       dataset entries are comma-separated token ids, evaluated as they are\n"
        "      --score-vectors F   compare with reference top-k logprob vectors (docs/quality.md)\n"
        "      --inspect           print the model's metadata, tensor mix and memory plan (at --ctx), then exit\n"
        "      --dump-activations F  per-layer mean of a sublayer's output over every token of the\n"
        "                          prompts (--prompt-file: one prompt per line, each a chat turn;\n"
        "                          -p; or --token-ids), n_layer x n_embd f32, then exit\n"
        "      --activation-component ffn_out|attn_out  which output (default ffn_out)\n"
        "  -h, --help              this text\n"
        "interactive commands: /help /think /think-max /nothink /ctx N /read FILE /quit\n", ds4_spec_usage,
        ds4_ssd_usage, ds4_runtime_usage,
        ds4_gpu_usage, ds4_dist_usage);
}

/* Returns 0 on success, 1 after printing help, -1 on a bad argument. */
static int parse_args(int argc, char **argv, cli_opts *o) {
    memset(o, 0, sizeof *o);
    o->model = "./ds4flash.gguf";
    o->n_predict = 4096;
    o->ctx = 32768;
    o->numerics = -1;
    ds4_gpu_opts_default(&o->gpu);
    o->logprobs_top_k = 20;
    o->mtp_dump_from = 1;
    o->think = DS4_THINK_HIGH;
    ds4_sampler_params_default(&o->sampling);
    ds4_spec_params_default(&o->spec_params);
    ds4_runtime_opts_default(&o->runtime);
    o->sampling.seed = ds4_sampler_random_seed();

    static const ds4_cli_int_opt top_k = {"--logprobs-top-k", 0, INT_MAX};
    static const ds4_cli_int_opt ppl_stride = {"--ppl-stride", 1, INT_MAX};
    static const ds4_cli_int_opt mtp_dump_from = {"--mtp-dump-from", 1, INT_MAX};
    ds4_cli c;
    ds4_cli_begin(&c, "ds4", argc, argv);
    while (ds4_cli_next(&c)) {
        if (ds4_cli_is(&c, "-h|--help")) { usage(stdout); return 1; }
        if (ds4_cli_ssd(&c, &o->ssd) || ds4_cli_dist(&c, &o->dist) || ds4_cli_gpu(&c, &o->gpu) ||
            ds4_cli_model(&c, &o->model) || ds4_cli_layers(&c, &o->layers) || ds4_cli_numerics(&c, &o->numerics) ||
            ds4_cli_int(&c, &ds4_opt_tokens, &o->n_predict) || ds4_cli_int(&c, &ds4_opt_ctx, &o->ctx) ||
            ds4_cli_int(&c, &ds4_opt_threads, &o->threads) ||
            ds4_cli_int(&c, &ds4_opt_prefill_chunk, &o->prefill_chunk) || ds4_cli_sampling(&c, &o->sampling) ||
            ds4_cli_spec(&c, &o->spec_params) || ds4_cli_str(&c, "-p|--prompt", &o->prompt) ||
            ds4_cli_str(&c, "--prompt-file", &o->prompt_file) || ds4_cli_str(&c, "-sys|--system", &o->system) ||
            ds4_cli_str(&c, "--dump-logprobs", &o->dump_logprobs) || ds4_cli_int(&c, &top_k, &o->logprobs_top_k) ||
            ds4_cli_str(&c, "--dump-logits", &o->dump_logits) || ds4_cli_str(&c, "--token-ids", &o->token_ids) ||
            ds4_cli_str(&c, "--dump-mtp-logits", &o->dump_mtp_logits) ||
            ds4_cli_int(&c, &mtp_dump_from, &o->mtp_dump_from) ||
            ds4_cli_str(&c, "--perplexity-file", &o->perplexity_file) || ds4_cli_int(&c, &ppl_stride, &o->ppl_stride) ||
            ds4_cli_str(&c, "--imatrix-dataset", &o->imatrix_dataset) ||
            ds4_cli_str(&c, "--imatrix-out", &o->imatrix_out) || ds4_cli_str(&c, "--score-vectors", &o->score_vectors) ||
            ds4_cli_runtime(&c, &o->runtime) || ds4_cli_str(&c, "--dump-activations", &o->dump_activations))
            continue;
        if (ds4_cli_is(&c, "--ignore-eos")) o->ignore_eos = true;
        else if (ds4_cli_is(&c, "--think")) o->think = DS4_THINK_HIGH;
        else if (ds4_cli_is(&c, "--think-max")) o->think = DS4_THINK_MAX;
        else if (ds4_cli_is(&c, "--nothink")) o->think = DS4_THINK_NONE;
        else if (ds4_cli_is(&c, "--dump-tokens")) o->dump_tokens = true;
        else if (ds4_cli_is(&c, "--logits-all")) o->logits_all = true;
        else if (ds4_cli_is(&c, "--ppl-ids")) o->ppl_ids = true;
        else if (ds4_cli_is(&c, "--imatrix-ids")) o->imatrix_ids = true;
        else if (ds4_cli_is(&c, "--inspect")) o->inspect = true;
        else if (ds4_cli_is(&c, "--activation-component")) {
            const char *component = NULL;
            if (ds4_cli_str(&c, "--activation-component", &component) && component &&
                strcmp(component, "ffn_out") && strcmp(component, "attn_out"))
                ds4_cli_bad_value(&c, component, "ffn_out or attn_out");
            o->activations_attn = component && !strcmp(component, "attn_out");
        }
        else ds4_cli_unknown(&c);
    }
    if (c.status || !ds4_cpu_select("ds4", o->runtime.isa, o->runtime.cpu_affinity)) return -1;
    if (o->dump_mtp_logits && (!o->token_ids || !o->spec_params.mtp_path || o->spec_params.quality)) {
        fprintf(stderr, "ds4: --dump-mtp-logits needs --token-ids and --mtp FILE (without --quality)\n");
        return -1;
    }
    if (!o->imatrix_dataset != !o->imatrix_out) {
        fprintf(stderr, "ds4: --imatrix-dataset and --imatrix-out go together\n");
        return -1;
    }
    if (o->prompt && o->prompt_file) {
        fprintf(stderr, "ds4: use either -p or --prompt-file, not both\n");
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- dumps */

static void print_json_string(FILE *f, const char *s, size_t n) {
    ds4_buf b = {0};
    ds4_json_quote(s, n, DS4_JSON_COMPACT, &b);
    fwrite(b.data, 1, b.len, f);
    ds4_buf_free(&b);
}

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[best]) best = i;
    return best;
}

static void dump_tokens(const ds4_tokenizer *tok, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t len = 0;
        const char *bytes = ds4_tokenizer_token_bytes(tok, ids[i], &len);
        printf("%d\t", ids[i]);
        for (size_t j = 0; j < len; j++) printf("%02x", (unsigned char)bytes[j]);
        putchar('\t');
        for (size_t j = 0; j < len; j++) {
            unsigned char c = (unsigned char)bytes[j];
            if (c == '\n') fputs("\\n", stdout);
            else if (c == '\t') fputs("\\t", stdout);
            else if (c == '\r') fputs("\\r", stdout);
            else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
            else putchar(c);
        }
        putchar('\n');
    }
}

static bool parse_token_ids(const char *list, int n_vocab, ds4_token_ids *out) {
    const char *p = list;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v >= n_vocab) {
            fprintf(stderr, "ds4: bad token id near '%.20s' (vocabulary has %d tokens)\n", p, n_vocab);
            return false;
        }
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 64;
            int32_t *nv = realloc(out->v, cap * sizeof *nv);
            if (!nv) return false;
            out->v = nv;
            out->cap = cap;
        }
        out->v[out->n++] = (int32_t)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) {
            fprintf(stderr, "ds4: token ids must be comma separated near '%.20s'\n", p);
            return false;
        }
    }
    if (out->n == 0) {
        fprintf(stderr, "ds4: --token-ids needs at least one id\n");
        return false;
    }
    return true;
}

static void write_logits_row(FILE *f, const float *row, int n_vocab) {
    fputc('[', f);
    for (int j = 0; j < n_vocab; j++) fprintf(f, "%s%.9g", j ? "," : "", row[j]);
    fputc(']', f);
}

/* {"n_vocab":V,"tokens":[...],"logits":[[...],...]}: last position, or all. */
/* --dump-mtp-logits: the first `from` tokens prefilled in one pass, then for
 * each later token the draft model's logits for the token after it (row i:
 * the block at position i reading token i + 1, i = from - 1 .. n - 2) before
 * it is decoded: raw little-endian f32, (n - from) x n_vocab. */
static int dump_mtp_logits(ds4_session *s, const int32_t *ids, int n, int from, int n_vocab, const char *path) {
    char err[512];
    if (from < 1 || from >= n) {
        fprintf(stderr, "ds4: --mtp-dump-from %d: needs 1 <= K < the %d tokens\n", from, n);
        return 1;
    }
    float *row = malloc((size_t)n_vocab * sizeof(float));
    FILE *f = row ? fopen(path, "wb") : NULL;
    if (!f) { fprintf(stderr, "ds4: cannot write %s\n", path); free(row); return 1; }
    int rc = ds4_session_prefill(s, ids, from, NULL, NULL, NULL, err, sizeof err);
    for (int i = from; !rc && i < n; i++) {
        rc = ds4_session_draft_logits(s, ids[i], row, err, sizeof err);
        if (!rc && fwrite(row, sizeof(float), (size_t)n_vocab, f) != (size_t)n_vocab) {
            snprintf(err, sizeof err, "write error on %s", path);
            rc = -1;
        }
        if (!rc) rc = ds4_session_decode(s, ids[i], err, sizeof err);
    }
    if (fclose(f) && !rc) { snprintf(err, sizeof err, "write error on %s", path); rc = -1; }
    if (rc) fprintf(stderr, "ds4: %s\n", err);
    free(row);
    return rc ? 1 : 0;
}

static int write_logits_json(const char *path, const int32_t *ids, size_t n, const float *all,
                             int n_vocab, bool every_position) {
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "ds4: cannot write %s: %s\n", path, strerror(errno)); return -1; }
    fprintf(f, "{\"n_vocab\":%d,\"tokens\":[", n_vocab);
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", ids[i]);
    fputs("],\"logits\":[", f);
    size_t first = every_position ? 0 : n - 1;
    for (size_t i = first; i < n; i++) {
        if (i > first) fputc(',', f);
        write_logits_row(f, all + i * (size_t)n_vocab, n_vocab);
    }
    fputs("]}\n", f);
    if (fclose(f) != 0) { fprintf(stderr, "ds4: write error on %s\n", path); return -1; }
    return 0;
}

/* ------------------------------------------------------------- sessions */

typedef struct {
    double t0;
    bool shown;
} prefill_progress;

/* Long prefills show a live tokens/s line; Ctrl+C cancels. */
static int on_prefill_progress(void *ud, int done, int total) {
    prefill_progress *p = ud;
    double dt = now_s() - p->t0;
    if (total >= 256 && dt > 0.5 && isatty(STDERR_FILENO)) {
        fprintf(stderr, "\r\033[Kprefill %d/%d tokens, %.1f t/s", done, total, done / dt);
        p->shown = true;
    }
    return g_interrupted ? 1 : 0;
}

/* Brings the session to exactly `ids`, reusing the longest common prefix of
 * its checkpoint. Returns 0, 1 when interrupted, -1 on error. */
static int sync_session(ds4_session *s, const int32_t *ids, size_t n, double *prefill_tps,
                        int *prefilled) {
    int have = ds4_session_n_tokens(s);
    const int32_t *cur = ds4_session_tokens(s);
    int common = 0;
    while (common < have && (size_t)common < n && cur[common] == ids[common]) common++;
    /* Keep at least one token to prefill so fresh logits exist for it. */
    if ((size_t)common == n && common > 0 && common == have) { *prefilled = 0; *prefill_tps = 0; return 0; }
    if ((size_t)common == n) common--;
    char err[256];
    if (common < have && ds4_session_rewind(s, common, err, sizeof err) != 0) {
        fprintf(stderr, "ds4: %s\n", err);
        return -1;
    }
    prefill_progress pp = { now_s(), false };
    int todo = (int)n - common;
    int rc = ds4_session_prefill(s, ids + common, todo, NULL, on_prefill_progress, &pp, err, sizeof err);
    double dt = now_s() - pp.t0;
    if (pp.shown) fprintf(stderr, "\r\033[K");
    if (rc < 0) { fprintf(stderr, "ds4: %s\n", err); return -1; }
    *prefilled = todo;
    *prefill_tps = dt > 0 ? todo / dt : 0;
    return rc;
}

typedef struct {
    ds4_buf text;          /* everything generated this turn */
    int n_generated;
    double gen_tps;
    bool interrupted;
} gen_result;

/* What the shared loop's hooks need to print a turn. */
typedef struct {
    gen_result *out;
    int32_t last_id;
    int32_t think_end;
    bool tty, in_reasoning;
} turn_printer;

static bool turn_cancelled(void *ud) {
    (void)ud;
    return g_interrupted;
}

static void turn_token(void *ud, int32_t tok, const float *logits) {
    (void)logits;
    ((turn_printer *)ud)->last_id = tok;
}

/* Reasoning (up to </think>) is shown dimmed on a terminal and the marker
 * itself as a line break; the recorded text keeps it for split_reasoning. */
static bool turn_text(void *ud, const char *text, size_t len) {
    turn_printer *p = ud;
    ds4_buf_put(&p->out->text, text, len);
    if (p->last_id == p->think_end && p->in_reasoning) {
        p->in_reasoning = false;
        if (p->tty) fputs("\033[0m", stdout);
        fputs("\n", stdout);
    } else {
        fwrite(text, 1, len, stdout);
    }
    fflush(stdout);
    return false;
}

/* The drafter's line for the run so far, on stderr beside the speed report. */
static void print_spec_stats(const ds4_spec *sp) {
    if (!sp) return;
    char line[512];
    ds4_spec_stats_line(sp, line, sizeof line);
    fprintf(stderr, "ds4: %s\n", line);
}

/* Samples up to n_predict tokens, streaming text to stdout. */
static int generate(ds4_engine *e, ds4_session *s, ds4_sampler *smp, const cli_opts *o,
                    bool thinking, gen_result *out) {
    const ds4_tokenizer *tok = ds4_engine_tokenizer(e);
    turn_printer tp = {.out = out, .last_id = -1, .think_end = ds4_tokenizer_specials(tok)->think_end,
                       .tty = isatty(STDOUT_FILENO), .in_reasoning = thinking};
    ds4_gen_hooks hooks = {.cancelled = turn_cancelled, .on_token = turn_token, .on_text = turn_text, .ud = &tp,
                           .ignore_stop = o->ignore_eos, .spec = o->spec};
    double t0 = now_s();
    char err[256];
    if (tp.in_reasoning && tp.tty) fputs("\033[2m", stdout);
    ds4_gen_result r = ds4_generate(s, tok, smp, o->n_predict, &hooks, err, sizeof err);
    if (tp.in_reasoning && tp.tty) fputs("\033[0m", stdout);
    fputs("\n", stdout);
    fflush(stdout);   /* the speed report goes to stderr right after */
    if (r.end == DS4_GEN_CTX_FULL) fprintf(stderr, "ds4: context full (%d tokens)\n", ds4_session_ctx(s));
    if (r.end == DS4_GEN_ERROR) fprintf(stderr, "ds4: %s\n", err);
    print_spec_stats(o->spec);
    out->interrupted = r.end == DS4_GEN_CANCELLED;
    out->n_generated = r.n_decoded;
    double el = now_s() - t0;
    out->gen_tps = el > 0 ? out->n_generated / el : 0;
    return r.end == DS4_GEN_ERROR ? -1 : 0;
}

/* Splits generated text at </think> into reasoning and answer (thinking mode). */
static void split_reasoning(const char *text, bool thinking, char **reasoning, char **answer) {
    const char *end = thinking ? strstr(text, DS4_TOK_THINK_END) : NULL;
    if (end) {
        *reasoning = strndup(text, (size_t)(end - text));
        *answer = strdup(end + strlen(DS4_TOK_THINK_END));
    } else {
        *reasoning = thinking ? strdup(text) : NULL;
        *answer = thinking ? strdup("") : strdup(text);
    }
}

/* ------------------------------------------------------------- chat */

typedef struct {
    ds4_chat_msg *msgs;
    char **owned;          /* strings owned by the transcript */
    int n, cap, n_owned, cap_owned;
} transcript;

static char *own(transcript *t, char *s) {
    if (!s) return NULL;
    if (t->n_owned == t->cap_owned) {
        t->cap_owned = t->cap_owned ? t->cap_owned * 2 : 16;
        t->owned = realloc(t->owned, (size_t)t->cap_owned * sizeof *t->owned);
        if (!t->owned) { perror("ds4"); exit(1); }
    }
    t->owned[t->n_owned++] = s;
    return s;
}

static void add_msg(transcript *t, ds4_chat_role role, char *content, char *reasoning) {
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 16;
        t->msgs = realloc(t->msgs, (size_t)t->cap * sizeof *t->msgs);
        if (!t->msgs) { perror("ds4"); exit(1); }
    }
    ds4_chat_msg *m = &t->msgs[t->n++];
    memset(m, 0, sizeof *m);
    m->role = role;
    m->content = own(t, content);
    m->reasoning_content = own(t, reasoning);
}

static void transcript_free(transcript *t) {
    for (int i = 0; i < t->n_owned; i++) free(t->owned[i]);
    free(t->owned);
    free(t->msgs);
    memset(t, 0, sizeof *t);
}

typedef struct {
    ds4_engine *engine;
    ds4_session *session;
    cli_opts *opts;
    transcript tr;
} chat_state;

/* Renders the transcript with a generation prompt and tokenizes it: the
 * template's markers become protocol tokens, what the user typed never does. */
static bool render_prompt(chat_state *c, ds4_token_ids *ids) {
    ds4_chat_opts co;
    ds4_chat_opts_default(&co);
    co.profile = ds4_chat_profile_for(ds4_engine_tokenizer(c->engine));
    co.think = c->opts->think;
    co.ctx = ds4_session_ctx(c->session);
    ds4_chat_spans client = {0};
    co.client_spans = &client;
    ds4_buf text = {0};
    char err[256];
    bool ok = ds4_chat_render(c->tr.msgs, c->tr.n, &co, &text, err, sizeof err);
    if (!ok) fprintf(stderr, "ds4: %s\n", err);
    else if (client.oom || ds4_chat_encode(ds4_engine_tokenizer(c->engine), text.data, 0, text.len, &client, ids)) {
        fprintf(stderr, "ds4: out of memory\n");
        ok = false;
    }
    ds4_chat_spans_free(&client);
    ds4_buf_free(&text);
    return ok;
}

/* One user turn: render, reuse the KV prefix, prefill, generate, record. */
static int chat_turn(chat_state *c, const char *user_text, ds4_sampler *smp, bool report) {
    add_msg(&c->tr, DS4_ROLE_USER, strdup(user_text), NULL);
    ds4_token_ids ids = {0};
    if (!render_prompt(c, &ids)) return -1;
    if ((int)ids.n >= ds4_session_ctx(c->session)) {
        fprintf(stderr, "ds4: prompt has %zu tokens, context is %d (use --ctx or /ctx)\n",
                ids.n, ds4_session_ctx(c->session));
        c->tr.n--;
        ds4_token_ids_free(&ids);
        return -1;
    }
    double prefill_tps = 0;
    int prefilled = 0;
    g_interrupted = 0;
    int rc = sync_session(c->session, ids.v, ids.n, &prefill_tps, &prefilled);
    ds4_token_ids_free(&ids);
    if (rc != 0) {
        c->tr.n--;          /* the turn never happened */
        if (rc > 0) fprintf(stderr, "\n[interrupted during prefill]\n");
        return rc < 0 ? -1 : 0;
    }
    bool thinking = ds4_chat_effective_think(c->opts->think, ds4_session_ctx(c->session)) != DS4_THINK_NONE;
    gen_result g = {0};
    rc = generate(c->engine, c->session, smp, c->opts, thinking, &g);
    char *reasoning = NULL, *answer = NULL;
    split_reasoning(g.text.data ? g.text.data : "", thinking, &reasoning, &answer);
    add_msg(&c->tr, DS4_ROLE_ASSISTANT, answer, reasoning);
    ds4_buf_free(&g.text);
    if (g.interrupted) fprintf(stderr, "[interrupted]\n");
    if (report)
        fprintf(stderr, "prefill: %d tokens, %.2f t/s | generation: %d tokens, %.2f t/s\n",
                prefilled, prefill_tps, g.n_generated, g.gen_tps);
    return rc;
}

static void repl_help(void) {
    printf("/help          this text\n"
           "/think         thinking mode\n"
           "/think-max     Think Max (needs a context of at least %d tokens)\n"
           "/nothink       direct answers\n"
           "/ctx N         new context size (starts a fresh session, keeps the transcript)\n"
           "/read FILE     send a file's contents as the next message\n"
           "/quit          exit (Ctrl+D too); Ctrl+C stops the current generation\n",
           DS4_THINK_MAX_MIN_CTX);
}

static char *history_path(void) {
    const char *home = getenv("HOME");
    if (!home) return NULL;
    size_t n = strlen(home) + 32;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/.ds4_history", home);
    return p;
}

static int run_repl(chat_state *c, ds4_sampler *smp) {
    char *hist = history_path();
    using_history();
    if (hist) read_history(hist);
    printf("DwarfStar interactive chat. /help for commands.\n");
    for (;;) {
        g_interrupted = 0;
        char *line = readline("ds4> ");
        if (!line) {
            putchar('\n');
            if (g_interrupted) continue;   /* Ctrl+C at the prompt clears the line */
            break;                         /* Ctrl+D */
        }
        if (g_interrupted) { free(line); continue; }
        char *s = line;
        while (*s == ' ' || *s == '\t') s++;
        if (!*s) { free(line); continue; }
        add_history(s);
        if (s[0] == '/') {
            char *arg = strchr(s, ' ');
            if (arg) { *arg++ = 0; while (*arg == ' ') arg++; }
            if (!strcmp(s, "/quit") || !strcmp(s, "/exit")) { free(line); break; }
            else if (!strcmp(s, "/help")) repl_help();
            else if (!strcmp(s, "/think")) { c->opts->think = DS4_THINK_HIGH; printf("thinking mode\n"); }
            else if (!strcmp(s, "/nothink")) { c->opts->think = DS4_THINK_NONE; printf("non-thinking mode\n"); }
            else if (!strcmp(s, "/think-max")) {
                c->opts->think = DS4_THINK_MAX;
                if (ds4_chat_effective_think(DS4_THINK_MAX, ds4_session_ctx(c->session)) != DS4_THINK_MAX)
                    printf("Think Max needs --ctx >= %d; using normal thinking at ctx %d\n",
                           DS4_THINK_MAX_MIN_CTX, ds4_session_ctx(c->session));
                else
                    printf("Think Max mode\n");
            }
            else if (!strcmp(s, "/ctx")) {
                int n;
                char err[256];
                if (!ds4_parse_int(arg, 16, INT_MAX, &n)) { printf("usage: /ctx N\n"); }
                else {
                    ds4_session *ns = ds4_session_new(c->engine, n, err, sizeof err);
                    if (!ns) printf("ds4: %s\n", err);
                    else {
                        ds4_session_free(c->session);
                        c->session = ns;
                        c->opts->ctx = n;
                        printf("context %d tokens (%.1f MiB KV)\n", n,
                               ds4_engine_kv_bytes(c->engine, n) / 1048576.0);
                    }
                }
            }
            else if (!strcmp(s, "/read")) {
                size_t len;
                char *text = arg && *arg ? ds4_read_file(arg, &len) : NULL;
                if (!text) printf("ds4: cannot read %s\n", arg && *arg ? arg : "(no file given)");
                else { chat_turn(c, text, smp, true); free(text); }
            }
            else printf("unknown command %s (/help)\n", s);
            free(line);
            continue;
        }
        chat_turn(c, s, smp, true);
        free(line);
    }
    if (hist) { write_history(hist); free(hist); }
    return 0;
}

/* ------------------------------------------------------- perplexity */

static bool print_chunk(void *ud, const ds4_ppl_chunk *c) {
    (void)ud;
    printf("[%d] tokens %d-%d: %d scored, mean NLL %.6f, PPL %.4f\n", c->index + 1, c->begin, c->end, c->scored,
           c->scored ? c->nll_sum / c->scored : 0.0, c->scored ? exp(c->nll_sum / c->scored) : 0.0);
    fflush(stdout);
    return !g_interrupted;
}

static int run_perplexity(ds4_engine *e, ds4_session *s, const ds4_tokenizer *tok, const cli_opts *o) {
    size_t len;
    char *text = ds4_read_file(o->perplexity_file, &len);
    if (!text) { fprintf(stderr, "ds4: cannot read %s\n", o->perplexity_file); return 1; }
    ds4_token_ids ids = {0};
    bool ok = true;
    if (o->ppl_ids) {
        while (len && strchr(" \t\r\n", text[len - 1])) text[--len] = 0;
        ok = parse_token_ids(text, ds4_engine_n_vocab(e), &ids);
    } else if (!tok) {
        fprintf(stderr, "ds4: this model has no tokenizer; give --ppl-ids and a file of token ids\n");
        ok = false;
    } else {
        /* raw text: special strings in it are text, not protocol tokens */
        int32_t bos = ds4_tokenizer_specials(tok)->bos;
        ds4_token_ids body = {0};
        ok = ds4_tokenizer_encode(tok, text, len, DS4_TOK_SPECIALS_NONE, &body) == 0 &&
             (ids.v = malloc((body.n + 1) * sizeof *ids.v)) != NULL;
        if (ok) {
            if (bos >= 0) ids.v[ids.n++] = bos;
            memcpy(ids.v + ids.n, body.v, body.n * sizeof *ids.v);
            ids.n += body.n;
            ids.cap = body.n + 1;
        } else {
            fprintf(stderr, "ds4: out of memory\n");
        }
        ds4_token_ids_free(&body);
    }
    free(text);
    int rc = 1;
    if (ok) {
        int n = (int)ids.n, window = o->ctx < n ? o->ctx : n;
        int stride = o->ppl_stride ? o->ppl_stride : window / 2;
        printf("perplexity: %d tokens, context %d, stride %d\n", n, window, stride);
        ds4_ppl_result r;
        char err[256];
        int pr = ds4_perplexity(s, ds4_engine_n_vocab(e), ids.v, n, window, stride, print_chunk, NULL, &r, err, sizeof err);
        if (pr < 0) fprintf(stderr, "ds4: %s\n", err);
        else {
            printf("perplexity: %ld tokens scored in %d windows%s: mean NLL %.9f, PPL %.6f\n", r.scored, r.chunks,
                   pr ? " (interrupted)" : "", r.mean_nll, r.ppl);
            rc = 0;
        }
    }
    ds4_token_ids_free(&ids);
    return rc;
}

/* ---------------------------------------------------------- imatrix */

/* One dataset entry as the sequences to evaluate: its ids as written, or
 * the chat turn rendered with thinking and without. */
static bool imatrix_entry(ds4_engine *e, ds4_session *s, const cli_opts *o, const char *text, size_t len,
                          ds4_token_ids seqs[2], int *n_seqs) {
    *n_seqs = 0;
    char *copy = strndup(text, len);
    if (!copy) return false;
    if (o->imatrix_ids) {
        size_t n = strlen(copy);
        while (n && strchr(" \t\r\n", copy[n - 1])) copy[--n] = 0;
        bool ok = parse_token_ids(copy, ds4_engine_n_vocab(e), &seqs[0]);
        free(copy);
        *n_seqs = ok;
        return ok;
    }
    static const ds4_think_mode modes[2] = {DS4_THINK_HIGH, DS4_THINK_NONE};
    bool ok = true;
    for (int m = 0; m < 2 && ok; m++) {
        cli_opts mo = *o;
        mo.think = modes[m];
        chat_state c = { e, s, &mo, {0} };
        add_msg(&c.tr, DS4_ROLE_USER, strdup(copy), NULL);
        ok = render_prompt(&c, &seqs[m]);
        transcript_free(&c.tr);
        *n_seqs += ok;
    }
    free(copy);
    return ok;
}

static int run_imatrix(ds4_engine *e, ds4_session *s, const cli_opts *o) {
    if (!o->imatrix_ids && !ds4_engine_tokenizer(e)) {
        fprintf(stderr, "ds4: this model has no tokenizer; give --imatrix-ids and a dataset of token ids\n");
        return 1;
    }
    ds4_turn_script ds;
    char err[512];
    if (ds4_turn_script_load(o->imatrix_dataset, DS4_AGENT_SCRIPT_SEPARATOR, &ds, err, sizeof err)) { fprintf(stderr, "ds4: %s\n", err); return 1; }
    ds4_imatrix *im = ds4_imatrix_new(ds4_engine_gguf(e));
    if (!im) { fprintf(stderr, "ds4: out of memory\n"); ds4_turn_script_free(&ds); return 1; }
    int rc = 0, chunks = 0, window = ds4_session_ctx(s);
    long tokens = 0;
    if (!ds4_engine_observe_matmuls(e, ds4_imatrix_observe, im, err, sizeof err)) { fprintf(stderr, "ds4: %s\n", err); rc = 1; }
    size_t len;
    const char *entry;
    for (int k = 1; !rc && !g_interrupted && (entry = ds4_turn_script_next(&ds, &len)); k++) {
        ds4_token_ids seqs[2] = {{0}, {0}};
        int n_seqs;
        if (!imatrix_entry(e, s, o, entry, len, seqs, &n_seqs)) {
            fprintf(stderr, "ds4: %s: entry %d cannot be evaluated\n", o->imatrix_dataset, k);
            rc = 1;
        }
        /* longer than the context: consecutive windows, each from empty */
        for (int q = 0; !rc && q < n_seqs; q++)
            for (size_t b = 0; !rc && b < seqs[q].n; b += (size_t)window) {
                int n = (int)(seqs[q].n - b < (size_t)window ? seqs[q].n - b : (size_t)window);
                if (ds4_session_rewind(s, 0, err, sizeof err) ||
                    ds4_session_prefill(s, seqs[q].v + b, n, NULL, NULL, NULL, err, sizeof err)) {
                    fprintf(stderr, "ds4: %s\n", err);
                    rc = 1;
                }
                chunks++;
                tokens += n;
            }
        ds4_token_ids_free(&seqs[0]);
        ds4_token_ids_free(&seqs[1]);
    }
    ds4_engine_observe_matmuls(e, NULL, NULL, err, sizeof err);
    if (!rc && chunks == 0) { fprintf(stderr, "ds4: %s holds no entries\n", o->imatrix_dataset); rc = 1; }
    if (!rc) {
        const char *name = o->imatrix_dataset;
        if (ds4_imatrix_write(im, o->imatrix_out, &name, 1, chunks, window, err, sizeof err)) {
            fprintf(stderr, "ds4: %s\n", err);
            rc = 1;
        } else {
            printf("imatrix: %d matrices from %ld tokens in %d chunks (context %d) -> %s\n", ds4_imatrix_n_seen(im), tokens,
                   chunks, window, o->imatrix_out);
        }
    }
    ds4_imatrix_free(im);
    ds4_turn_script_free(&ds);
    return rc;
}

/* ---------------------------------------------------------- vectors */

typedef struct { long steps, top1; double rank, gap, kl; long max_rank; } vec_totals;

static void vec_add(vec_totals *t, const ds4_vec_score *s) {
    t->steps++;
    t->top1 += s->top1;
    t->rank += (double)s->rank;
    t->gap += s->gap;
    t->kl += s->kl;
    if (s->rank > t->max_rank) t->max_rank = s->rank;
}

static void vec_print(const char *what, const vec_totals *t) {
    double n = t->steps ? (double)t->steps : 1;
    printf("%s: %ld steps, top-1 agreement %ld/%ld (%.2f%%), reference token rank mean %.6f max %ld, "
           "logprob gap mean %.9f, KL over top-k mean %.9f\n", what, t->steps, t->top1, t->steps, 100.0 * t->top1 / n,
           t->rank / n, t->max_rank, t->gap / n, t->kl / n);
}

/* Teacher-forced along each prompt's reference tokens: the local logits
 * of every step, scored against the reference's top-k. */
static int run_score_vectors(ds4_engine *e, ds4_session *s, const cli_opts *o) {
    size_t len;
    char *text = ds4_read_file(o->score_vectors, &len);
    if (!text) { fprintf(stderr, "ds4: cannot read %s\n", o->score_vectors); return 1; }
    ds4_vectors v;
    char err[512];
    int n_vocab = ds4_engine_n_vocab(e);
    bool ok = ds4_vectors_parse(text, len, n_vocab, &v, err, sizeof err);
    free(text);
    if (!ok) { fprintf(stderr, "ds4: %s: %s\n", o->score_vectors, err); return 1; }
    vec_totals all = {0};
    int rc = 0;
    for (int i = 0; i < v.n && !rc && !g_interrupted; i++) {
        const ds4_vec_prompt *p = &v.p[i];
        if (p->n_prompt + p->n_steps > ds4_session_ctx(s)) {
            fprintf(stderr, "ds4: prompt %s needs %d tokens, more than --ctx %d\n", p->name, p->n_prompt + p->n_steps,
                    ds4_session_ctx(s));
            rc = 1;
            break;
        }
        if (ds4_session_rewind(s, 0, err, sizeof err) || ds4_session_prefill(s, p->prompt, p->n_prompt, NULL, NULL, NULL, err, sizeof err)) {
            fprintf(stderr, "ds4: %s\n", err);
            rc = 1;
            break;
        }
        vec_totals t = {0};
        for (int k = 0; k < p->n_steps; k++) {
            ds4_vec_score sc;
            ds4_vectors_score_step(&p->steps[k], ds4_session_logits(s), n_vocab, &sc);
            vec_add(&t, &sc);
            vec_add(&all, &sc);
            if (k + 1 < p->n_steps && ds4_session_decode(s, p->steps[k].id, err, sizeof err)) {
                fprintf(stderr, "ds4: %s\n", err);
                rc = 1;
                break;
            }
        }
        char what[160];
        snprintf(what, sizeof what, "vectors %s", p->name);
        if (!rc) vec_print(what, &t);
    }
    if (!rc) vec_print("vectors overall", &all);
    ds4_vectors_free(&v);
    return rc;
}

/* ------------------------------------------------------------- main */

typedef struct {
    FILE *f;
    const ds4_tokenizer *tok;
    int n_vocab, k, n_steps;
    int *top_ids;
    float *top_lp;
    bool out_of_memory;
} logprob_writer;

/* A token's text as valid UTF-8 (a token holding part of a character gives
 * U+FFFD, as the streaming decoder would); its exact bytes go in "bytes". */
static void write_token_text(logprob_writer *w, int32_t id) {
    size_t len;
    char *text = ds4_tokenizer_decode(w->tok, &id, 1, true, &len);
    if (!text) { w->out_of_memory = true; fputs("\"\"", w->f); return; }
    print_json_string(w->f, text, len);
    free(text);
}

/* One JSON step per chosen token (the greedy sampler's pick), EOS included. */
static void write_logprob_step(void *ud, int32_t id, const float *logits) {
    logprob_writer *w = ud;
    int n_top = ds4_top_logprobs(logits, w->n_vocab, w->k, w->top_ids, w->top_lp);
    size_t len;
    const char *bytes = ds4_tokenizer_token_bytes(w->tok, id, &len);
    fprintf(w->f, "%s{\"id\":%d,\"text\":", w->n_steps++ ? "," : "", id);
    write_token_text(w, id);
    fputs(",\"bytes\":\"", w->f);
    for (size_t b = 0; b < len; b++) fprintf(w->f, "%02x", (unsigned char)bytes[b]);
    fputc('"', w->f);
    fprintf(w->f, ",\"logprob\":%.9g,\"top\":[", ds4_logprob(logits, w->n_vocab, id));
    for (int j = 0; j < n_top; j++) {
        fprintf(w->f, "%s{\"id\":%d,\"text\":", j ? "," : "", w->top_ids[j]);
        write_token_text(w, w->top_ids[j]);
        fprintf(w->f, ",\"logprob\":%.9g}", w->top_lp[j]);
    }
    fputs("]}", w->f);
}

/* smp must be greedy (temperature 0): the dump follows the argmax path. */
static int run_logprobs(ds4_engine *e, ds4_session *s, ds4_sampler *smp, const cli_opts *o) {
    int k = o->logprobs_top_k;
    logprob_writer w = {.tok = ds4_engine_tokenizer(e), .n_vocab = ds4_engine_n_vocab(e), .k = k,
                        .top_ids = malloc(sizeof(int) * (size_t)(k > 0 ? k : 1)),
                        .top_lp = malloc(sizeof(float) * (size_t)(k > 0 ? k : 1)),
                        .f = fopen(o->dump_logprobs, "w")};
    int rc = 0;
    if (!w.f || !w.top_ids || !w.top_lp) {
        fprintf(stderr, "ds4: cannot write %s\n", o->dump_logprobs);
        rc = 1;
    } else {
        fprintf(w.f, "{\"prompt_tokens\":%d,\"steps\":[", ds4_session_n_tokens(s));
        ds4_gen_hooks hooks = {.on_token = write_logprob_step, .ud = &w, .ignore_stop = o->ignore_eos,
                               .spec = o->spec};
        char err[256];
        if (ds4_generate(s, w.tok, smp, o->n_predict, &hooks, err, sizeof err).end == DS4_GEN_ERROR) {
            fprintf(stderr, "ds4: %s\n", err);
            rc = 1;
        }
        fputs("]}\n", w.f);
        print_spec_stats(o->spec);
        if (w.out_of_memory) {
            fprintf(stderr, "ds4: out of memory while writing %s\n", o->dump_logprobs);
            rc = 1;
        }
    }
    if (w.f) fclose(w.f);
    free(w.top_ids);
    free(w.top_lp);
    return rc;
}

/* One prompt of --dump-activations into the probe, from an empty session. */
static bool probe_prompt(chat_state *c, const char *text, const int32_t *raw, size_t n_raw, ds4_act_probe *probe) {
    char err[256];
    ds4_token_ids ids = {0};
    bool ok = true;
    if (!raw) {
        if (c->opts->system) add_msg(&c->tr, DS4_ROLE_SYSTEM, strdup(c->opts->system), NULL);
        add_msg(&c->tr, DS4_ROLE_USER, strdup(text), NULL);
        ok = render_prompt(c, &ids);
        transcript_free(&c->tr);
        raw = ids.v;
        n_raw = ids.n;
    }
    if (ok && (int)n_raw > ds4_session_ctx(c->session)) {
        fprintf(stderr, "ds4: a prompt of %zu tokens exceeds --ctx %d\n", n_raw, ds4_session_ctx(c->session));
        ok = false;
    }
    if (ok && (ds4_session_rewind(c->session, 0, err, sizeof err) || ds4_session_probe(c->session, probe, err, sizeof err) ||
               ds4_session_prefill(c->session, raw, (int)n_raw, NULL, NULL, NULL, err, sizeof err))) {
        fprintf(stderr, "ds4: %s\n", err);
        ok = false;
    }
    ds4_session_probe(c->session, NULL, err, sizeof err);
    ds4_token_ids_free(&ids);
    return ok;
}

/* --dump-activations: the mean over every token of every prompt of one
 * sublayer output per layer, written as n_layer x n_embd little-endian f32
 * (the layout of a steering file, so the direction tool subtracts two). */
static int dump_activations(ds4_engine *e, ds4_session *s, cli_opts *o, char *prompt_text) {
    const int L = ds4_engine_n_layers(e), E = ds4_engine_n_embd(e);
    ds4_act_probe probe = {o->activations_attn ? DS4_STEER_ATTN : DS4_STEER_FFN, L, E,
                           calloc((size_t)L * E, sizeof(double)), 0};
    if (!probe.sum) { fprintf(stderr, "ds4: out of memory\n"); return 1; }
    chat_state c = {e, s, o, {0}};
    int n_prompts = 0, status = 0;
    if (o->token_ids) {
        ds4_token_ids ids = {0};
        status = parse_token_ids(o->token_ids, ds4_engine_n_vocab(e), &ids) && probe_prompt(&c, NULL, ids.v, ids.n, &probe) ? 0 : 1;
        n_prompts = 1;
        ds4_token_ids_free(&ids);
    } else if (!prompt_text || !ds4_engine_tokenizer(e)) {
        fprintf(stderr, "ds4: --dump-activations needs --token-ids, or -p/--prompt-file with a tokenizer\n");
        status = 2;
    } else {
        /* --prompt-file: one prompt per non-empty line; -p: the one prompt */
        for (char *line = prompt_text, *next; !status && line && *line; line = next) {
            next = o->prompt_file ? strchr(line, '\n') : NULL;
            if (next) *next++ = 0;
            if (!*line) continue;
            status = probe_prompt(&c, line, NULL, 0, &probe) ? 0 : 1;
            n_prompts++;
        }
    }
    if (!status && probe.rows == 0) { fprintf(stderr, "ds4: --dump-activations: no prompt\n"); status = 2; }
    FILE *f = status ? NULL : fopen(o->dump_activations, "wb");
    if (!status && !f) { fprintf(stderr, "ds4: cannot write %s: %s\n", o->dump_activations, strerror(errno)); status = 1; }
    for (size_t i = 0; f && i < (size_t)L * E; i++) {
        const float m = (float)(probe.sum[i] / (double)probe.rows);
        if (fwrite(&m, sizeof m, 1, f) != 1) status = 1;
    }
    if (f && (fclose(f) || status)) { fprintf(stderr, "ds4: cannot write %s\n", o->dump_activations); status = 1; }
    if (!status)
        fprintf(stderr, "ds4: mean %s of %d prompts (%ld tokens), %d layers x %d -> %s\n",
                o->activations_attn ? "attn_out" : "ffn_out", n_prompts, probe.rows, L, E, o->dump_activations);
    free(probe.sum);
    return status;
}

int main(int argc, char **argv) {
    cli_opts o;
    int pr = parse_args(argc, argv, &o);
    if (pr != 0) return pr > 0 ? 0 : 2;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);   /* no SA_RESTART: readline returns on Ctrl+C */

    if (!ds4_cli_model_usable("ds4", o.model)) return 1;
    char err[512];
    static ds4_spec drafter;
    if (ds4_spec_wanted(&o.spec_params)) {
        if (!ds4_spec_init(&drafter, &o.spec_params, err, sizeof err)) { fprintf(stderr, "ds4: %s\n", err); return 2; }
        o.spec = &drafter;
    }
    if (!ds4_dist_finish_options(&o.dist, true, err, sizeof err)) { fprintf(stderr, "ds4: %s\n", err); return 2; }
    ds4_engine_params ep;
    ds4_engine_params_default(&ep);
    ep.model_path = o.model;
    ep.mtp_path = ds4_spec_engine_mtp(&o.spec_params);
    ep.dspark_path = ds4_spec_engine_dspark(&o.spec_params);
    ep.n_threads = o.threads;
    ep.prefill_chunk = o.prefill_chunk;
    ep.numerics = o.numerics;
    ep.layers = o.layers;
    ep.gpu = o.gpu;
    ep.gpu_ctx = o.ctx;
    /* a worker's first line is its registration (what scripts wait for) */
    ep.quiet = o.dump_tokens || o.dist.role == DS4_DIST_WORKER;
    ep.ssd = o.ssd;
    ep.ssd.ctx = o.ctx;
    ep.dist = o.dist;
    ds4_runtime_apply(&o.runtime, &ep);
    ep.lazy_weights = o.inspect;
    ds4_engine *e = ds4_engine_load(&ep, err, sizeof err);
    if (!e) {
        fprintf(stderr, "%s: %s\n", o.dist.role == DS4_DIST_WORKER ? "ds4 worker" : "ds4", err);
        return 1;
    }
    if (o.inspect) {
        ds4_engine_inspect(e, o.ctx, stdout);
        ds4_engine_free(e);
        return 0;
    }
    if (o.dist.role == DS4_DIST_WORKER) {
        /* the slice is the engine's (paged, streamed, on its backend as any load); the worker loop serves it */
        const int rc = ds4_engine_serve_worker(e, o.ctx, &ep.dist);
        ds4_engine_free(e);
        return rc;
    }
    const ds4_tokenizer *tok = ds4_engine_tokenizer(e);
    int n_vocab = ds4_engine_n_vocab(e);
    int status = 0;

    char *prompt_text = NULL;
    if (o.prompt_file) {
        prompt_text = ds4_read_file(o.prompt_file, NULL);
        if (!prompt_text) { fprintf(stderr, "ds4: cannot read %s\n", o.prompt_file); ds4_engine_free(e); return 1; }
    } else if (o.prompt) {
        prompt_text = strdup(o.prompt);
    }

    if (o.dump_tokens) {
        if (!tok || !prompt_text) {
            fprintf(stderr, "ds4: --dump-tokens needs -p or --prompt-file and a model with a tokenizer\n");
            status = 2;
        } else {
            ds4_token_ids ids = {0};
            ds4_tokenizer_encode(tok, prompt_text, strlen(prompt_text), DS4_TOK_SPECIALS_CHAT, &ids);
            dump_tokens(tok, ids.v, ids.n);
            ds4_token_ids_free(&ids);
        }
        free(prompt_text);
        ds4_engine_free(e);
        return status;
    }

    ds4_session *s = ds4_session_new(e, o.ctx, err, sizeof err);
    if (!s) { fprintf(stderr, "ds4: %s\n", err); free(prompt_text); ds4_engine_free(e); return 1; }
    if (o.perplexity_file) {
        status = run_perplexity(e, s, tok, &o);
        goto done;
    }
    if (o.imatrix_dataset) {
        status = run_imatrix(e, s, &o);
        goto done;
    }
    if (o.score_vectors) {
        status = run_score_vectors(e, s, &o);
        goto done;
    }
    if (o.dump_activations) {
        status = dump_activations(e, s, &o, prompt_text);
        goto done;
    }
    if (!o.token_ids && !o.dump_logits && !o.imatrix_dataset && !o.score_vectors) {
        /* KV grows with context: report the marginal cost so users can size --ctx. */
        int half = o.ctx / 2;
        double per_tok = (double)(ds4_engine_kv_bytes(e, o.ctx) - ds4_engine_kv_bytes(e, half)) / (o.ctx - half);
        fprintf(stderr, "ds4: context %d tokens: KV state %.1f MiB (%.1f KiB per token)\n", o.ctx,
                ds4_engine_kv_bytes(e, o.ctx) / 1048576.0, per_tok / 1024.0);
    }

    if (o.token_ids || o.dump_logits) {
        ds4_token_ids ids = {0};
        bool ok = true;
        if (o.token_ids) ok = parse_token_ids(o.token_ids, n_vocab, &ids);
        else if (!tok || !prompt_text) {
            fprintf(stderr, "ds4: --dump-logits needs --token-ids, or -p/--prompt-file with a tokenizer\n");
            ok = false;
        } else {
            chat_state c = { e, s, &o, {0} };
            if (o.system) add_msg(&c.tr, DS4_ROLE_SYSTEM, strdup(o.system), NULL);
            add_msg(&c.tr, DS4_ROLE_USER, strdup(prompt_text), NULL);
            ok = render_prompt(&c, &ids);
            transcript_free(&c.tr);
        }
        if (ok && (int)ids.n > o.ctx) { fprintf(stderr, "ds4: %zu tokens exceed --ctx %d\n", ids.n, o.ctx); ok = false; }
        if (ok && o.dump_mtp_logits) {
            status = dump_mtp_logits(s, ids.v, (int)ids.n, o.mtp_dump_from, n_vocab, o.dump_mtp_logits);
            ds4_token_ids_free(&ids);
            goto done;
        }
        float *all = ok ? malloc(ids.n * (size_t)n_vocab * sizeof(float)) : NULL;
        if (ok && !all) { fprintf(stderr, "ds4: out of memory for %zu x %d logits\n", ids.n, n_vocab); ok = false; }
        if (ok && ds4_session_prefill(s, ids.v, (int)ids.n, all, NULL, NULL, err, sizeof err) != 0) {
            fprintf(stderr, "ds4: %s\n", err);
            ok = false;
        }
        if (ok && o.dump_logits)
            ok = write_logits_json(o.dump_logits, ids.v, ids.n, all, n_vocab, o.logits_all) == 0;
        if (ok && !o.dump_logits) {
            /* raw ids without a dump: print the greedy next token */
            int best = argmax(ds4_session_logits(s), n_vocab);
            printf("next token: %d\n", best);
        }
        free(all);
        ds4_token_ids_free(&ids);
        status = ok ? 0 : 1;
        goto done;
    }

    if (!tok) {
        fprintf(stderr, "ds4: this model has no tokenizer; use --token-ids\n");
        status = 2;
        goto done;
    }

    ds4_sampler_params sp = o.sampling;
    if (o.dump_logprobs) sp.temperature = 0;
    ds4_sampler *smp = ds4_sampler_new(&sp, n_vocab);
    if (!smp) { fprintf(stderr, "ds4: out of memory\n"); status = 1; goto done; }

    chat_state c = { e, s, &o, {0} };
    if (o.system) add_msg(&c.tr, DS4_ROLE_SYSTEM, strdup(o.system), NULL);
    if (o.dump_logprobs) {
        if (!prompt_text) { fprintf(stderr, "ds4: --dump-logprobs needs -p or --prompt-file\n"); status = 2; }
        else {
            add_msg(&c.tr, DS4_ROLE_USER, strdup(prompt_text), NULL);
            ds4_token_ids ids = {0};
            double tps;
            int np;
            if (!render_prompt(&c, &ids) || sync_session(c.session, ids.v, ids.n, &tps, &np) != 0) status = 1;
            else status = run_logprobs(e, c.session, smp, &o);
            ds4_token_ids_free(&ids);
        }
    } else if (prompt_text) {
        status = chat_turn(&c, prompt_text, smp, true) == 0 ? 0 : 1;
    } else {
        status = run_repl(&c, smp);
    }
    s = c.session;   /* /ctx may have replaced it */
    transcript_free(&c.tr);
    ds4_sampler_free(smp);
done:
    free(prompt_text);
    ds4_session_free(s);
    ds4_engine_free(e);
    return status;
}
