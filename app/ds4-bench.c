/* ds4-bench -- benchmarks. `--kernels` measures memory bandwidth and the
 * CPU kernels (no model needed); `-m MODEL` walks context frontiers and
 * prints prefill/generation speed as CSV, `-m MODEL --sessions LIST`
 * compares batched decode of several sessions (bench_model.h). */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_experts.h"
#include "bench/bench_kernels.h"
#include "bench/bench_model.h"
#include "options/cli_args.h"

/* The default --prompt-file: a public-domain English novel committed with the
 * sources (data/bench/README.md: provenance and licence). */
#define DEFAULT_TEXT "data/bench/persuasion.txt"

/* DEFAULT_TEXT next to this binary (a build in the repository, run from
 * anywhere), else in the current directory; NULL when neither has it. */
static const char *default_text(char *buf, size_t len) {
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        if ((size_t)snprintf(buf, len, "%s/%s", exe, DEFAULT_TEXT) < len && access(buf, R_OK) == 0) return buf;
    }
    return access(DEFAULT_TEXT, R_OK) == 0 ? DEFAULT_TEXT : NULL;
}

static void usage(FILE *f) {
    fprintf(f, "usage: ds4-bench --kernels [-t N] [--isa LEVEL] [--cpu-affinity LIST]\n"
               "       ds4-bench -m MODEL.gguf [--prompt-file F] [--ctx-start N] [--ctx-max N]\n"
               "                 [--step-incr N | --step-mul F] [--gen-tokens N] [--prefill-chunk N]\n"
               "                 [--numerics exact|ds4] [--layers A:B|A:output] [-t N] [--ssd-streaming...] [--cuda|--cpu] [--gpu-vram ..]\n"
               "                 [--chat-prompt-file F] [--ctx-alloc N] [--csv FILE]\n"
               "       ds4-bench -m MODEL.gguf --sessions 1,2,4,8,16 [--prompt-tokens N] [--gen-tokens N]\n"
               "                 [--repeat N] [--prompt-file F] [-t N] [--cuda|--cpu] [--gpu-vram ..]\n"
               "       ds4-bench -m MODEL.gguf --spec-verify [--mtp FILE | --dspark FILE] [--prompt-tokens N] [--repeat N] [-t N]\n"
               "  --kernels   memory bandwidth, matvec GB/s per weight type, matmul GFLOP/s\n"
               "  --spec-verify  table: a speculative verification pass of 1..9 tokens against one\n"
               "              decode step (time, weight bytes, tok/s at full and at no acceptance;\n"
               "              with --mtp or --dspark also the drafter's cost)\n"
               "  -m MODEL    CSV per context frontier: frontier,prefill_tps,gen_tps,kvcache_bytes\n"
               "  --csv FILE  write that CSV to FILE instead of stdout\n"
               "  --prompt-file F       the text whose tokens (repeated) fill the context (default: the novel\n"
               "                        " DEFAULT_TEXT " next to this binary or in the current directory)\n"
               "  --chat-prompt-file F  the same, with the file rendered as one chat user turn first\n"
               "  --ctx-alloc N         allocate a session of N tokens (default: --ctx-max + --gen-tokens + 1)\n"
               "  --sessions  table: that many sessions decoding together (batched), per-session and\n"
               "              aggregate tokens/s, weight bytes read per token (prompt default 64)\n"
               "  -t N        threads (--kernels: default 2, also measured with 1 thread;\n"
               "              -m: default all CPUs)\n"
               "  --ssd-streaming-trace F  record every layer's routing (int32 records: layer, n, ids)\n"
               "  --ssd-streaming-lru      plain LRU eviction instead of aged LFU (measurements)\n"
               "  --ssd-streaming-no-predict  no early reads of the next layer's guessed experts (measurements)\n"
               "  --expert-policy F  replay a routing trace: hit rates of aged LFU vs LRU\n"
               "%s%s", ds4_ssd_usage, ds4_runtime_usage);
}

/* "1,2,4,8,16" into mp->session_counts; false when malformed. */
static bool session_counts(const char *list, ds4_bench_model_params *mp) {
    mp->n_session_counts = 0;
    while (list && *list) {
        char item[16];
        size_t len = strcspn(list, ",");
        int v;
        if (len == 0 || len >= sizeof item || mp->n_session_counts == 16) return false;
        memcpy(item, list, len);
        item[len] = 0;
        if (!ds4_parse_int(item, 1, 4096, &v)) return false;
        mp->session_counts[mp->n_session_counts++] = v;
        list += len + (list[len] == ',');
    }
    return mp->n_session_counts > 0;
}

int main(int argc, char **argv) {
    int kernels = 0, spec_verify = 0, threads = 2, threads_set = 0;
    const char *csv = NULL;     /* --csv FILE: the frontier table there instead of stdout */
    ds4_bench_model_params mp;
    ds4_bench_model_defaults(&mp);
    static const ds4_cli_int_opt ctx_start = {"--ctx-start", 1, 1 << 30}, ctx_max = {"--ctx-max", 1, 1 << 30},
                                 step_incr = {"--step-incr", 1, 1 << 30}, gen_tokens = {"--gen-tokens", 0, 1 << 20},
                                 repeat = {"--repeat", 1, 64}, prompt_tokens = {"--prompt-tokens", 1, 1 << 20},
                                 ctx_alloc = {"--ctx-alloc", 1, 1 << 30};
    ds4_cli c;
    ds4_cli_begin(&c, "ds4-bench", argc, argv);
    while (ds4_cli_next(&c)) {
        const char *v = NULL;
        if (ds4_cli_is(&c, "-h|--help")) { usage(stdout); return 0; }
        if (ds4_cli_gpu(&c, &mp.gpu) || ds4_cli_ssd(&c, &mp.ssd) || ds4_cli_dist(&c, &mp.dist) ||
            ds4_cli_model(&c, &mp.model_path) || ds4_cli_layers(&c, &mp.layers) ||
            ds4_cli_numerics(&c, &mp.numerics) || ds4_cli_str(&c, "--prompt-file", &mp.prompt_file) ||
            ds4_cli_int(&c, &ds4_opt_prefill_chunk, &mp.prefill_chunk) || ds4_cli_int(&c, &ctx_start, &mp.ctx_start) ||
            ds4_cli_int(&c, &ctx_max, &mp.ctx_max) || ds4_cli_int(&c, &step_incr, &mp.step_incr) ||
            ds4_cli_int(&c, &gen_tokens, &mp.gen_tokens) || ds4_cli_int(&c, &repeat, &mp.repeat) ||
            ds4_cli_int(&c, &prompt_tokens, &mp.prompt_tokens) || ds4_cli_int(&c, &ctx_alloc, &mp.ctx_alloc) ||
            ds4_cli_runtime(&c, &mp.runtime) || ds4_cli_str(&c, "--csv", &csv) ||
            ds4_cli_str(&c, "--mtp", &mp.mtp_path) || ds4_cli_str(&c, "--dspark", &mp.dspark_path))
            continue;
        if (ds4_cli_str(&c, "--chat-prompt-file", &mp.prompt_file)) mp.chat_prompt = true;
        else if (ds4_cli_int(&c, &ds4_opt_threads, &threads)) threads_set = threads > 0;
        else if (ds4_cli_str(&c, "--step-mul", &v)) {
            char *end = NULL;
            mp.step_mul = v ? strtod(v, &end) : 0;
            if (v && (end == v || *end || !(mp.step_mul > 1 && mp.step_mul < 1e6))) {
                ds4_cli_bad_value(&c, v, "a factor > 1");
            }
        } else if (ds4_cli_str(&c, "--expert-policy", &v)) {
            if (v) return ds4_bench_expert_policy(v, stdout) ? 1 : 0;
        } else if (ds4_cli_str(&c, "--sessions", &v)) {
            if (v && !session_counts(v, &mp)) {
                ds4_cli_bad_value(&c, v, "up to 16 comma-separated counts, each 1..4096");
            }
        } else if (ds4_cli_is(&c, "--kernels")) kernels = 1;
        else if (ds4_cli_is(&c, "--spec-verify")) spec_verify = 1;
        else ds4_cli_unknown(&c);
    }
    if (c.status) return c.status;
    if (!ds4_cpu_select("ds4-bench", mp.runtime.isa, mp.runtime.cpu_affinity)) return 2;
    if (!threads_set) threads = 2;
    if (mp.model_path && !kernels) {
        if (!ds4_cli_model_usable("ds4-bench", mp.model_path)) return 1;
        char dist_err[256];
        if (!ds4_dist_finish_options(&mp.dist, false, dist_err, sizeof dist_err)) {
            fprintf(stderr, "ds4-bench: %s\n", dist_err);
            return 2;
        }
        mp.threads = threads_set ? threads : 0;
        char text_path[PATH_MAX + sizeof DEFAULT_TEXT];
        if (!mp.prompt_file && !(mp.prompt_file = default_text(text_path, sizeof text_path)))
            fprintf(stderr, "ds4-bench: %s is neither next to this binary nor in the current directory: a fixed token "
                            "sequence fills the context (give --prompt-file)\n", DEFAULT_TEXT);
        if (spec_verify) return ds4_bench_spec_verify(&mp, stdout) ? 1 : 0;
        if (mp.n_session_counts) return ds4_bench_sessions(&mp, stdout) ? 1 : 0;
        FILE *out = csv ? fopen(csv, "w") : stdout;
        if (!out) { fprintf(stderr, "ds4-bench: cannot write %s\n", csv); return 2; }
        const int rc = ds4_bench_model(&mp, out);
        if (csv && fclose(out)) { fprintf(stderr, "ds4-bench: cannot write %s\n", csv); return 1; }
        return rc ? 1 : 0;
    }
    if (!kernels) {
        usage(stderr);
        return 2;
    }
    return ds4_bench_kernels(threads, stdout) ? 1 : 0;
}
