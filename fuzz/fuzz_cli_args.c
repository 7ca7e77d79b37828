/* Fuzz target: the command-line options (options/cli_args.h). The input is
 * argv, NUL-separated. Every argument is offered to every option group a
 * binary uses, as the binaries do; messages go to a silent log hook.
 * Invariants (abort() on violation): the cursor only moves forward and stays
 * inside argv; a walk ends at the end or with status 2 (a refusal); a shared
 * integer option that was taken lies in its range; an --isa that was taken
 * names a level; a --cpu-affinity that was taken is the argument itself. */
#include "base/log.h"
#include "kernels/kernels_cpu.h"
#include "options/cli_args.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void quiet(void *ud, ds4_log_level level, const char *text, size_t len) {
    (void)ud, (void)level, (void)text, (void)len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ds4_log_set_hook(quiet, NULL);
    char *buf = malloc(size + 1);
    char *argv[65];
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    int argc = 0;
    argv[argc++] = "fuzz";
    for (size_t i = 0; i <= size && argc < 64; i += strlen(buf + i) + 1) argv[argc++] = buf + i;
    argv[argc] = NULL;

    ds4_cli c;
    ds4_cli_begin(&c, "fuzz", argc, argv);
    ds4_sampler_params sp;
    ds4_sampler_params_default(&sp);
    ds4_spec_params spec = {0};
    ds4_gpu_opts gpu;
    ds4_gpu_opts_default(&gpu);
    ds4_ssd_params ssd = {0};
    ds4_dist_params dist = {0};
    const char *model = NULL, *layers = NULL;
    int numerics = -1, ctx = 32768, threads = 0, tokens = 1, chunk = 1;
    ds4_runtime_opts rt;
    ds4_runtime_opts_default(&rt);
    int last = 0;
    while (ds4_cli_next(&c)) {
        if (c.i <= last || c.at != c.i) abort();
        if (ds4_cli_sampling(&c, &sp) || ds4_cli_spec(&c, &spec) || ds4_cli_gpu(&c, &gpu) || ds4_cli_ssd(&c, &ssd) ||
            ds4_cli_dist(&c, &dist) || ds4_cli_model(&c, &model) || ds4_cli_layers(&c, &layers) ||
            ds4_cli_numerics(&c, &numerics) || ds4_cli_int(&c, &ds4_opt_ctx, &ctx) ||
            ds4_cli_int(&c, &ds4_opt_threads, &threads) || ds4_cli_int(&c, &ds4_opt_tokens, &tokens) ||
            ds4_cli_int(&c, &ds4_opt_prefill_chunk, &chunk) || ds4_cli_runtime(&c, &rt)) {
        } else {
            ds4_cli_unknown(&c);
        }
        if (c.i >= argc || c.i < c.at) abort();
        last = c.i;
    }
    if (c.status != 0 && c.status != 2) abort();
    if (!c.status && c.i != argc - 1) abort();
    if (ctx < ds4_opt_ctx.lo || ctx > ds4_opt_ctx.hi || threads < 0 || threads > ds4_opt_threads.hi ||
        tokens < 0 || chunk < 1 || (numerics != -1 && numerics != 0 && numerics != 1) ||
        spec.lookup_max < 0 || spec.lookup_max > DS4_SPEC_MAX_DRAFT || rt.isa < -1 || rt.isa > DS4_ISA_AMX)
        abort();
    if (rt.cpu_affinity) {
        bool found = false;
        for (int i = 1; i < argc && !found; i++) found = argv[i] == rt.cpu_affinity;
        if (!found) abort();
    }
    free(buf);
    return 0;
}
