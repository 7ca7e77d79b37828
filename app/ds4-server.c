/* ds4-server -- OpenAI / Anthropic / Responses compatible HTTP server.
 * Argument parsing only; everything else is src/server/server.c. */
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_args.h"

static void usage(FILE *f) {
    fprintf(f,
        "usage: ds4-server [options]\n"
        "  -m, --model FILE              GGUF model (default ./ds4flash.gguf; `make demo` unpacks models/ds4-tiny.gguf)\n"
        "      --host ADDR               IPv4 bind address (default 127.0.0.1; 0.0.0.0 for LAN)\n"
        "      --port N                  TCP port (default 8000)\n"
        "  -c, --ctx N                   context size in tokens (default 32768)\n"
        "  -n, --tokens N                default output limit when a request gives none (default 393216)\n"
        "  -t, --threads N               CPU threads (default: all)\n"
        "      --api-key KEY             require KEY (Authorization: Bearer or x-api-key); default $DS4_API_KEY\n"
        "      --no-api-key              allow a non-loopback --host without a key\n"
        "      --max-connections N       open connections, at most 1024 (default 1024)\n"
        "      --max-client-connections N  open connections per client address (default 256)\n"
        "      --request-timeout S       a request's head and body must arrive within S seconds (default 30)\n"
        "      --head-timeout S          a request's head must arrive within S seconds (default 10)\n"
        "      --prefill-chunk N         prefill chunk size (default 4096)\n"
        "      --batched-session N       N resident sessions serving N requests at once, decoded\n"
        "                                together in batches (default 1: one request at a time)\n"
        "      --numerics MODE           exact | ds4 (FP8 KV / FP4 indexer simulation; default)\n"
        "      --layers A:B|A:output     map only that layer slice (docs/distributed.md)\n"
        "      --cors                    send Access-Control-Allow-* headers\n"
        "      --chdir DIR               change directory before loading anything\n"
        "      --trace FILE              log rendered prompts, cache decisions, outputs, tool parsing\n"
        "      --tool-memory-max-ids N   exact-DSML replay map size (default 100000)\n"
        "      --disable-exact-dsml-tool-replay  always render tool calls canonically\n"
        "      --kv-disk-dir DIR         disk KV cache directory (default: off)\n"
        "      --kv-disk-space-mb N      disk KV cache budget (default 4096)\n"
        "      --kv-cache-min-tokens N   never save/load shorter prefixes (default 512)\n"
        "      --kv-cache-cold-max-tokens N  cold-save first prompts up to N tokens (default 30000, 0 off)\n"
        "      --kv-cache-continued-interval-tokens N  continued-save spacing (default 10000, 0 off)\n"
        "      --kv-cache-boundary-trim-tokens N  tail trimmed before a cold save (default 32)\n"
        "      --kv-cache-boundary-align-tokens N  alignment of cold/continued saves (default 2048)\n"
        "      --kv-cache-reject-different-quant  only reuse snapshots of the same expert quant\n"
        "      --completions-chat        wrap /v1/completions string prompts as a chat turn (default: raw)\n"
        "      --scripted-output FILE    TEST ONLY: every generation emits this file's text\n"
        "%s"
        "%s"
        "%s"
        "  -h, --help\n", ds4_ssd_usage, ds4_gpu_usage, ds4_dist_usage);
}

static int parse_int(const char *flag, const char *v, long lo, long hi) {
    int x;
    if (!ds4_parse_int(v, lo, hi, &x)) {
        fprintf(stderr, "ds4-server: %s needs an integer in [%ld, %ld]\n", flag, lo, hi);
        exit(2);
    }
    return x;
}

int main(int argc, char **argv) {
    ds4_server_opts o;
    ds4_server_opts_default(&o);
    o.api_key = getenv("DS4_API_KEY");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char gpu_err[256];
        int gpu_arg = ds4_gpu_option(&o.gpu, a, v, gpu_err, sizeof gpu_err);
        if (gpu_arg < 0) { fprintf(stderr, "ds4-server: %s\n", gpu_err); return 2; }
        if (gpu_arg > 0) { i += gpu_arg - 1; continue; }
        char ssd_err[256];
        int ssd = ds4_ssd_parse_option(&o.ssd, argc, argv, &i, ssd_err, sizeof ssd_err);
        if (ssd < 0) { fprintf(stderr, "ds4-server: %s\n", ssd_err); return 2; }
        if (ssd) continue;
        int dist = ds4_dist_parse_option(&o.dist, argc, argv, &i, ssd_err, sizeof ssd_err);
        if (dist < 0) { fprintf(stderr, "ds4-server: %s\n", ssd_err); return 2; }
        if (dist) continue;
#define ARG(s) (!strcmp(a, s))
/* consumes the option's value, or stops with the shared message */
#define VALUE() do { if (!v) { ds4_cli_missing_value("ds4-server", a); return 2; } i++; } while (0)
        if (ARG("-h") || ARG("--help")) { usage(stdout); return 0; }
        else if (ARG("--cors")) o.cors = true;
        else if (ARG("--disable-exact-dsml-tool-replay")) o.disable_exact_replay = true;
        else if (ARG("--completions-chat")) o.completions_chat = true;
        else if (ARG("--kv-cache-reject-different-quant")) o.kvdisk.reject_different_quant = true;
        else if (ARG("--no-api-key")) o.no_api_key = true;
        else if (ARG("-m") || ARG("--model")) { VALUE(); o.model_path = v; }
        else if (ARG("--host")) { VALUE(); o.host = v; }
        else if (ARG("--port")) { VALUE(); o.port = parse_int(a, v, 0, 65535); }
        else if (ARG("-c") || ARG("--ctx")) { VALUE(); o.ctx = parse_int(a, v, 16, 1 << 24); }
        else if (ARG("-n") || ARG("--tokens")) { VALUE(); o.default_max_tokens = parse_int(a, v, 0, 1 << 30); }
        else if (ARG("-t") || ARG("--threads")) { VALUE(); o.threads = parse_int(a, v, 0, 4096); }
        else if (ARG("--prefill-chunk")) { VALUE(); o.prefill_chunk = parse_int(a, v, 1, 1 << 30); }
        else if (ARG("--batched-session")) { VALUE(); o.batched_sessions = parse_int(a, v, 1, 256); }
        else if (ARG("--layers")) { VALUE(); o.layers = v; }
        else if (ARG("--numerics")) {
            VALUE();
            if (!ds4_parse_numerics(v, &o.numerics)) { fprintf(stderr, "ds4-server: --numerics takes exact or ds4\n"); return 2; }
        }
        else if (ARG("--trace")) { VALUE(); o.trace_path = v; }
        else if (ARG("--api-key")) { VALUE(); o.api_key = v; }
        else if (ARG("--max-connections")) { VALUE(); o.max_connections = parse_int(a, v, 1, DS4_SERVER_MAX_CONNECTIONS); }
        else if (ARG("--max-client-connections")) { VALUE(); o.max_client_connections = parse_int(a, v, 1, 1 << 20); }
        else if (ARG("--request-timeout")) { VALUE(); o.limits.request_timeout_ms = parse_int(a, v, 1, 3600) * 1000; }
        else if (ARG("--head-timeout")) { VALUE(); o.limits.head_timeout_ms = parse_int(a, v, 1, 3600) * 1000; }
        else if (ARG("--tool-memory-max-ids")) { VALUE(); o.tool_memory_max_ids = (size_t)parse_int(a, v, 1, 1 << 30); }
        else if (ARG("--scripted-output")) { VALUE(); o.scripted_output = v; }
        else if (ARG("--kv-disk-dir")) { VALUE(); o.kvdisk.dir = v; }
        else if (ARG("--kv-disk-space-mb")) { VALUE(); o.kvdisk.space_bytes = (uint64_t)parse_int(a, v, 1, 1 << 30) << 20; }
        else if (ARG("--kv-cache-min-tokens")) { VALUE(); o.kvdisk.min_tokens = parse_int(a, v, 1, 1 << 30); }
        else if (ARG("--kv-cache-cold-max-tokens")) { VALUE(); o.kvdisk.cold_max_tokens = parse_int(a, v, 0, 1 << 30); }
        else if (ARG("--kv-cache-continued-interval-tokens")) { VALUE(); o.kvdisk.continued_interval = parse_int(a, v, 0, 1 << 30); }
        else if (ARG("--kv-cache-boundary-trim-tokens")) { VALUE(); o.kvdisk.boundary_trim = parse_int(a, v, 0, 1 << 30); }
        else if (ARG("--kv-cache-boundary-align-tokens")) { VALUE(); o.kvdisk.boundary_align = parse_int(a, v, 1, 1 << 30); }
        else if (ARG("--chdir")) {
            VALUE();
            if (chdir(v)) { fprintf(stderr, "ds4-server: --chdir %s: %s\n", v, strerror(errno)); return 2; }
        }
        else { ds4_cli_unknown_option("ds4-server", a); return 2; }
#undef VALUE
#undef ARG
    }
    if (!ds4_cli_model_usable("ds4-server", o.model_path)) return 1;
    char dist_err[256];
    if (!ds4_dist_finish_options(&o.dist, false, dist_err, sizeof dist_err)) {
        fprintf(stderr, "ds4-server: %s\n", dist_err);
        return 2;
    }
    return ds4_server_run(&o);
}
