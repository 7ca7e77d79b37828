/* ds4-bench -- benchmarks. `--kernels` measures memory bandwidth and the
 * CPU kernels (no model needed); `-m MODEL` walks context frontiers and
 * prints prefill/generation speed as CSV, `-m MODEL --sessions LIST`
 * compares batched decode of several sessions (bench_model.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_experts.h"
#include "bench/bench_kernels.h"
#include "bench/bench_model.h"
#include "options/cli_args.h"

static void usage(FILE *f) {
    fprintf(f, "usage: ds4-bench --kernels [-t N]\n"
               "       ds4-bench -m MODEL.gguf [--prompt-file F] [--ctx-start N] [--ctx-max N]\n"
               "                 [--step-incr N | --step-mul F] [--gen-tokens N] [--prefill-chunk N]\n"
               "                 [--numerics exact|ds4] [--layers A:B|A:output] [-t N] [--ssd-streaming...] [--cuda|--cpu] [--gpu-vram ..]\n"
               "                 [--chat-prompt-file F] [--ctx-alloc N] [--csv FILE]\n"
               "       ds4-bench -m MODEL.gguf --sessions 1,2,4,8,16 [--prompt-tokens N] [--gen-tokens N]\n"
               "                 [--repeat N] [--prompt-file F] [-t N] [--cuda|--cpu] [--gpu-vram ..]\n"
               "       ds4-bench -m MODEL.gguf --spec-verify [--prompt-tokens N] [--repeat N] [-t N]\n"
               "  --kernels   memory bandwidth, matvec GB/s per weight type, matmul GFLOP/s\n"
               "  --spec-verify  table: a speculative verification pass of 1..9 tokens against one\n"
               "              decode step (time, weight bytes, tok/s at full acceptance)\n"
               "  -m MODEL    CSV per context frontier: frontier,prefill_tps,gen_tps,kvcache_bytes\n"
               "  --csv FILE  write that CSV to FILE instead of stdout\n"
               "  --prompt-file F       the text whose tokens (repeated) fill the context (default: a fixed sequence)\n"
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

/* Integer option value in [lo, hi]; -1 (after a message) when invalid. */
static long int_arg(int argc, char **argv, int *i, long lo, long hi) {
    const char *opt = argv[*i];
    int v;
    if (!ds4_parse_int(*i + 1 < argc ? argv[++*i] : NULL, lo, hi, &v)) {
        fprintf(stderr, "ds4-bench: %s needs an integer between %ld and %ld\n", opt, lo, hi);
        return -1;
    }
    return v;
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
    struct { const char *name; int *dst; long lo, hi; } ints[] = {
        {"--ctx-start", &mp.ctx_start, 1, 1 << 30}, {"--ctx-max", &mp.ctx_max, 1, 1 << 30},
        {"--step-incr", &mp.step_incr, 1, 1 << 30}, {"--gen-tokens", &mp.gen_tokens, 0, 1 << 20},
        {"--prefill-chunk", &mp.prefill_chunk, 1, 1 << 20}, {"--repeat", &mp.repeat, 1, 64},
        {"--prompt-tokens", &mp.prompt_tokens, 1, 1 << 20}, {"--ctx-alloc", &mp.ctx_alloc, 1, 1 << 30},
    };
    for (int i = 1; i < argc; i++) {
        char gpu_err[256];
        int gpu_arg = ds4_gpu_option(&mp.gpu, argv[i], i + 1 < argc ? argv[i + 1] : NULL, gpu_err, sizeof gpu_err);
        if (gpu_arg < 0) { fprintf(stderr, "ds4-bench: %s\n", gpu_err); return 2; }
        if (gpu_arg > 0) { i += gpu_arg - 1; continue; }
        char ssd_err[256];
        int ssd = ds4_ssd_parse_option(&mp.ssd, argc, argv, &i, ssd_err, sizeof ssd_err);
        if (ssd < 0) { fprintf(stderr, "ds4-bench: %s\n", ssd_err); return 2; }
        if (ssd) continue;
        const int runtime = ds4_runtime_parse_option(&mp.runtime, argc, argv, &i, ssd_err, sizeof ssd_err);
        if (runtime < 0) { fprintf(stderr, "ds4-bench: %s\n", ssd_err); return 2; }
        if (runtime) continue;
        int dist = ds4_dist_parse_option(&mp.dist, argc, argv, &i, ssd_err, sizeof ssd_err);
        if (dist < 0) { fprintf(stderr, "ds4-bench: %s\n", ssd_err); return 2; }
        if (dist) continue;
        size_t k = 0;
        while (k < sizeof ints / sizeof ints[0] && strcmp(argv[i], ints[k].name)) k++;
        if (k < sizeof ints / sizeof ints[0]) {
            long v = int_arg(argc, argv, &i, ints[k].lo, ints[k].hi);
            if (v < 0) return 2;
            *ints[k].dst = (int)v;
        } else if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model") || !strcmp(argv[i], "--prompt-file")) {
            if (i + 1 >= argc) { ds4_cli_missing_value("ds4-bench", argv[i]); return 2; }
            if (!strcmp(argv[i], "--prompt-file")) mp.prompt_file = argv[++i];
            else mp.model_path = argv[++i];
        } else if (!strcmp(argv[i], "--chat-prompt-file") || !strcmp(argv[i], "--csv")) {
            if (i + 1 >= argc) { ds4_cli_missing_value("ds4-bench", argv[i]); return 2; }
            if (!strcmp(argv[i], "--csv")) csv = argv[++i];
            else { mp.prompt_file = argv[++i]; mp.chat_prompt = true; }
        } else if (!strcmp(argv[i], "--step-mul")) {
            char *end = NULL;
            mp.step_mul = i + 1 < argc ? strtod(argv[++i], &end) : 0;
            if (!end || *end || !(mp.step_mul > 1 && mp.step_mul < 1e6)) {
                fprintf(stderr, "ds4-bench: --step-mul needs a factor > 1\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--expert-policy")) {
            if (i + 1 >= argc) { fprintf(stderr, "ds4-bench: --expert-policy needs a trace file\n"); return 2; }
            return ds4_bench_expert_policy(argv[i + 1], stdout) ? 1 : 0;
        } else if (!strcmp(argv[i], "--layers") && i + 1 < argc) {
            mp.layers = argv[++i];
        } else if (!strcmp(argv[i], "--numerics")) {
            if (!ds4_parse_numerics(i + 1 < argc ? argv[++i] : NULL, &mp.numerics)) {
                fprintf(stderr, "ds4-bench: --numerics takes exact or ds4\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--sessions")) {
            if (!session_counts(i + 1 < argc ? argv[++i] : NULL, &mp)) {
                fprintf(stderr, "ds4-bench: --sessions takes up to 16 comma-separated counts, each 1..4096\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--kernels")) kernels = 1;
        else if (!strcmp(argv[i], "--spec-verify")) spec_verify = 1;
        else if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) {
            long v = int_arg(argc, argv, &i, 1, 1024);
            if (v < 0) return 2;
            threads = (int)v;
            threads_set = 1;
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            ds4_cli_unknown_option("ds4-bench", argv[i]);
            return 2;
        }
    }
    if (mp.model_path && !kernels) {
        if (!ds4_cli_model_usable("ds4-bench", mp.model_path)) return 1;
        char dist_err[256];
        if (!ds4_dist_finish_options(&mp.dist, false, dist_err, sizeof dist_err)) {
            fprintf(stderr, "ds4-bench: %s\n", dist_err);
            return 2;
        }
        mp.threads = threads_set ? threads : 0;
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
