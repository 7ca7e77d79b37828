/* ds4-vocab -- inspect, use and convert the DeepSeek V4 tokenizer.
 *
 *   ds4-vocab [--added FILE] SOURCE --info
 *   ds4-vocab [--added FILE] SOURCE [--specials none|chat|all] --encode TEXT
 *   ds4-vocab [--added FILE] SOURCE [--specials none|chat|all] --encode-file FILE
 *   ds4-vocab [--added FILE] SOURCE --decode ID...
 *   ds4-vocab [--added FILE] SOURCE --bench FILE
 *   ds4-vocab [--added FILE] tokenizer.json --write-gguf OUT.gguf
 *
 * SOURCE is a GGUF model (its tokenizer.* keys) or an HF tokenizer.json;
 * --added overlays the "added_tokens" of another JSON (e.g. the V4 specials
 * over the V3 base file). --write-gguf writes a GGUF holding only the
 * tokenizer keys (what the converter embeds). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "options/cli_args.h"
#include "base/json_util.h"
#include "text/tokenizer_internal.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The benchmark counts this thread's CPU time: on a shared machine wall time
 * mostly measures the neighbours. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int count_piece(void *ctx, const char *p, size_t n) {
    (void)p; (void)n;
    ++*(size_t *)ctx;
    return 0;
}

static int usage(void) {
    fprintf(stderr,
            "usage: ds4-vocab [--added FILE] SOURCE [--specials none|chat|all] COMMAND\n"
            "  SOURCE: MODEL.gguf or tokenizer.json\n"
            "  COMMAND: --info | --encode TEXT | --encode-file FILE | --decode ID... |\n"
            "           --bench FILE | --write-gguf OUT.gguf (SOURCE = tokenizer.json)\n");
    return 2;
}

static bool is_gguf(const char *path) {
    size_t l = strlen(path);
    return l >= 5 && strcmp(path + l - 5, ".gguf") == 0;
}

static void print_ids(const ds4_token_ids *ids) {
    for (size_t i = 0; i < ids->n; i++) printf(i ? " %d" : "%d", ids->v[i]);
    printf("\n");
}

/* Tokenizes the file once cold (empty word cache), then repeatedly; reports
 * MB/s and the time for a 100k-token prompt at the measured rate, then the
 * pre-tokenizer alone, hand-written matcher vs the PCRE2 regexes. Repeated
 * passes report their fastest run: on a shared machine the slower ones
 * measure the neighbours. */
static int bench(const ds4_tokenizer *t, const char *path, enum ds4_tok_specials sp) {
    size_t len;
    char *text = ds4_read_file(path, &len);
    if (!text) { fprintf(stderr, "ds4-vocab: cannot read %s\n", path); return 1; }
    ds4_token_ids ids = {0};
    double t0 = cpu_s();
    if (ds4_tokenizer_encode(t, text, len, sp, &ids) < 0) { fprintf(stderr, "ds4-vocab: out of memory\n"); return 1; }
    double cold = cpu_s() - t0, warm = 1e30, fast = 1e30, regex = 1e30, spent = 0;
    size_t n_tok = ids.n, n_fast = 0, n_regex = 0;
    char err[256];
    ds4_pretok_regex *re = ds4_pretok_regex_new(err, sizeof err);
    if (!re) { fprintf(stderr, "ds4-vocab: %s\n", err); return 1; }
    for (int reps = 0; spent < 2.0 || reps < 5; reps++) {
        double a = cpu_s();
        ids.n = 0;
        ds4_tokenizer_encode(t, text, len, sp, &ids);
        double b = cpu_s();
        n_fast = 0;
        ds4_pretok_run(text, len, count_piece, &n_fast);
        double c = cpu_s();
        n_regex = 0;
        ds4_pretok_regex_run(re, text, len, count_piece, &n_regex);
        double d = cpu_s();
        if (b - a < warm) warm = b - a;
        if (c - b < fast) fast = c - b;
        if (d - c < regex) regex = d - c;
        spent += d - a;
    }
    double mb = (double)len / 1e6;
    printf("%-32s %10s %10s %12s\n", "file", "bytes", "tokens", "bytes/token");
    printf("%-32.32s %10zu %10zu %12.2f\n", path, len, n_tok, n_tok ? (double)len / n_tok : 0.0);
    printf("%-32s %10s %12s   (one core, CPU time)\n", "pass", "MB/s", "Mtokens/s");
    printf("%-32s %10.1f %12.2f\n", "encode, first (cold word cache)", mb / cold, n_tok / cold / 1e6);
    printf("%-32s %10.1f %12.2f\n", "encode, repeated (best)", mb / warm, n_tok / warm / 1e6);
    printf("%-32s %10.1f %12s   (%zu pieces)\n", "pre-tokenizer, hand-written", mb / fast, "", n_fast);
    printf("%-32s %10.1f %12s   (%zu pieces)\n", "pre-tokenizer, PCRE2 regexes", mb / regex, "", n_regex);
    if (n_tok) printf("100k-token prompt: %.1f ms cold, %.1f ms repeated (best)\n",
                      cold * 1e5 / n_tok * 1e3, warm * 1e5 / n_tok * 1e3);
    ds4_pretok_regex_free(re);
    ds4_token_ids_free(&ids);
    free(text);
    return 0;
}

static int write_gguf(const char *json, const char *added, const char *out) {
    char err[512];
    ds4_gguf_writer *w = ds4_gguf_writer_new(32);
    int rc = ds4_tokenizer_gguf_from_hf_json(w, json, added, err, sizeof err);
    if (rc == 0) rc = ds4_gguf_writer_write_file(w, out, NULL, NULL, err, sizeof err);
    ds4_gguf_writer_free(w);
    if (rc) { fprintf(stderr, "ds4-vocab: %s\n", err); return 1; }
    printf("wrote %s\n", out);
    return 0;
}

static bool is_command(const char *arg) {
    static const char *const commands[] = {"--info", "--encode", "--encode-file", "--decode", "--bench", "--write-gguf"};
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
        if (!strcmp(arg, commands[k])) return true;
    return false;
}

int main(int argc, char **argv) {
    const char *added = NULL, *source = NULL;
    enum ds4_tok_specials sp = DS4_TOK_SPECIALS_NONE;
    int i = 1;
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--added") && i + 1 < argc) added = argv[++i];
        else if (!strcmp(argv[i], "--specials") && i + 1 < argc) {
            const char *m = argv[++i];
            if (!strcmp(m, "none")) sp = DS4_TOK_SPECIALS_NONE;
            else if (!strcmp(m, "chat")) sp = DS4_TOK_SPECIALS_CHAT;
            else if (!strcmp(m, "all")) sp = DS4_TOK_SPECIALS_ALL;
            else return usage();
        } else if (argv[i][0] != '-' && !source) source = argv[i];
        else if (!strcmp(argv[i], "--added") || !strcmp(argv[i], "--specials")) {
            ds4_cli_missing_value("ds4-vocab", argv[i]);
            return 2;
        } else if (argv[i][0] == '-' && !is_command(argv[i]) && strcmp(argv[i], "-h") && strcmp(argv[i], "--help")) {
            ds4_cli_unknown_option("ds4-vocab", argv[i]);
            return 2;
        } else break;
    }
    if (!source || i >= argc) return usage();
    const char *cmd = argv[i];
    if (!strcmp(cmd, "--write-gguf")) return i + 1 < argc ? write_gguf(source, added, argv[i + 1]) : usage();

    char err[512];
    double t0 = now_s(), c0 = cpu_s();
    ds4_gguf *g = NULL;
    ds4_tokenizer *t;
    if (is_gguf(source)) {
        g = ds4_gguf_open(source, err, sizeof err);
        t = g ? ds4_tokenizer_from_gguf(g, err, sizeof err) : NULL;
    } else {
        t = ds4_tokenizer_from_hf_json(source, added, err, sizeof err);
    }
    double load = now_s() - t0, load_cpu = cpu_s() - c0;
    if (!t) { fprintf(stderr, "ds4-vocab: %s\n", err); ds4_gguf_close(g); return 1; }

    int rc = 0;
    if (!strcmp(cmd, "--info")) {
        const ds4_special_ids *s = ds4_tokenizer_specials(t);
        int n_special = 0;
        for (int32_t id = 0; id < ds4_tokenizer_n_vocab(t); id++) n_special += ds4_tokenizer_is_special(t, id);
        printf("source          %s\nload time       %.1f ms CPU, %.1f ms wall\nn_vocab         %d\n"
               "added tokens    %d\n", source, load_cpu * 1e3, load * 1e3, ds4_tokenizer_n_vocab(t), n_special);
        printf("bos %d  eos %d  user %d  assistant %d  think %d  /think %d  dsml %d  latest_reminder %d\n",
               s->bos, s->eos, s->user, s->assistant, s->think, s->think_end, s->dsml, s->latest_reminder);
    } else if (!strcmp(cmd, "--encode") && i + 1 < argc) {
        ds4_token_ids ids = {0};
        rc = ds4_tokenizer_encode(t, argv[i + 1], strlen(argv[i + 1]), sp, &ids) ? 1 : 0;
        print_ids(&ids);
        ds4_token_ids_free(&ids);
    } else if (!strcmp(cmd, "--encode-file") && i + 1 < argc) {
        size_t len;
        char *text = ds4_read_file(argv[i + 1], &len);
        ds4_token_ids ids = {0};
        if (!text) { fprintf(stderr, "ds4-vocab: cannot read %s\n", argv[i + 1]); rc = 1; }
        else { rc = ds4_tokenizer_encode(t, text, len, sp, &ids) ? 1 : 0; print_ids(&ids); }
        ds4_token_ids_free(&ids);
        free(text);
    } else if (!strcmp(cmd, "--decode")) {
        ds4_detok d;
        ds4_detok_init(&d);
        char out[DS4_DETOK_OUT_MAX];
        for (int k = i + 1; k < argc; k++) {
            char *end;
            long id = strtol(argv[k], &end, 10);
            if (*end || id < 0 || id >= ds4_tokenizer_n_vocab(t)) {
                fprintf(stderr, "ds4-vocab: bad token id %s\n", argv[k]);
                rc = 1;
                break;
            }
            fwrite(out, 1, ds4_detok_push(&d, t, (int32_t)id, out), stdout);
        }
        fwrite(out, 1, ds4_detok_flush(&d, out), stdout);
        printf("\n");
    } else if (!strcmp(cmd, "--bench") && i + 1 < argc) {
        printf("tokenizer load: %.1f ms CPU, %.1f ms wall\n", load_cpu * 1e3, load * 1e3);
        rc = bench(t, argv[i + 1], sp);
    } else {
        rc = usage();
    }
    ds4_tokenizer_free(t);
    ds4_gguf_close(g);
    return rc;
}
