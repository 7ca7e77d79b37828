/* ds4-server -- OpenAI / Anthropic / Responses compatible HTTP server.
 * Argument parsing only; everything else is src/server/server.c. */
#include "server/server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "options/cli_args.h"

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
        "      --spec-lookup N           speculative decoding with up to N drafted tokens (1..16) from\n"
        "                                earlier text of the context; answers are unchanged (one\n"
        "                                session only; default 0 = off)\n"
        "      --quality                 target-only decoding: no drafter runs\n"
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
        "      --scripted-output FILE    TEST ONLY: generation k emits FILE's k-th answer (answers split by\n"
        "                                '<<<NEXT>>>' lines; the last one repeats)\n"
        "%s"
        "%s"
        "%s"
        "%s"
        "  -h, --help\n", ds4_ssd_usage, ds4_runtime_usage, ds4_gpu_usage, ds4_dist_usage);
}

/* ds4-server's own integer options, each with its one range */
static const ds4_cli_int_opt opt_port = {"--port", 0, 65535}, opt_batched = {"--batched-session", 1, 256},
                             opt_max_conn = {"--max-connections", 1, DS4_SERVER_MAX_CONNECTIONS},
                             opt_client_conn = {"--max-client-connections", 1, 1 << 20},
                             opt_request_timeout = {"--request-timeout", 1, 3600},
                             opt_head_timeout = {"--head-timeout", 1, 3600},
                             opt_tool_ids = {"--tool-memory-max-ids", 1, 1 << 30},
                             opt_disk_mb = {"--kv-disk-space-mb", 1, 1 << 30},
                             opt_min_tokens = {"--kv-cache-min-tokens", 1, 1 << 30},
                             opt_cold_max = {"--kv-cache-cold-max-tokens", 0, 1 << 30},
                             opt_continued = {"--kv-cache-continued-interval-tokens", 0, 1 << 30},
                             opt_trim = {"--kv-cache-boundary-trim-tokens", 0, 1 << 30},
                             opt_align = {"--kv-cache-boundary-align-tokens", 1, 1 << 30};

int main(int argc, char **argv) {
    ds4_server_opts o;
    ds4_server_opts_default(&o);
    o.api_key = getenv("DS4_API_KEY");
    ds4_cli c;
    ds4_cli_begin(&c, "ds4-server", argc, argv);
    while (ds4_cli_next(&c)) {
        int v = 0;
        const char *dir = NULL;
        if (ds4_cli_is(&c, "-h|--help")) { usage(stdout); return 0; }
        if (ds4_cli_gpu(&c, &o.gpu) || ds4_cli_ssd(&c, &o.ssd) || ds4_cli_dist(&c, &o.dist) ||
            ds4_cli_model(&c, &o.model_path) || ds4_cli_layers(&c, &o.layers) || ds4_cli_numerics(&c, &o.numerics) ||
            ds4_cli_int(&c, &ds4_opt_ctx, &o.ctx) || ds4_cli_int(&c, &ds4_opt_tokens, &o.default_max_tokens) ||
            ds4_cli_int(&c, &ds4_opt_threads, &o.threads) || ds4_cli_int(&c, &ds4_opt_prefill_chunk, &o.prefill_chunk) ||
            ds4_cli_spec(&c, &o.spec) || ds4_cli_runtime(&c, &o.runtime) || ds4_cli_str(&c, "--host", &o.host) ||
            ds4_cli_int(&c, &opt_port, &o.port) ||
            ds4_cli_int(&c, &opt_batched, &o.batched_sessions) || ds4_cli_str(&c, "--trace", &o.trace_path) ||
            ds4_cli_str(&c, "--api-key", &o.api_key) || ds4_cli_int(&c, &opt_max_conn, &o.max_connections) ||
            ds4_cli_int(&c, &opt_client_conn, &o.max_client_connections) ||
            ds4_cli_str(&c, "--scripted-output", &o.scripted_output) || ds4_cli_str(&c, "--kv-disk-dir", &o.kvdisk.dir) ||
            ds4_cli_int(&c, &opt_min_tokens, &o.kvdisk.min_tokens) ||
            ds4_cli_int(&c, &opt_cold_max, &o.kvdisk.cold_max_tokens) ||
            ds4_cli_int(&c, &opt_continued, &o.kvdisk.continued_interval) ||
            ds4_cli_int(&c, &opt_trim, &o.kvdisk.boundary_trim) || ds4_cli_int(&c, &opt_align, &o.kvdisk.boundary_align))
            continue;
        if (ds4_cli_is(&c, "--cors")) o.cors = true;
        else if (ds4_cli_is(&c, "--disable-exact-dsml-tool-replay")) o.disable_exact_replay = true;
        else if (ds4_cli_is(&c, "--completions-chat")) o.completions_chat = true;
        else if (ds4_cli_is(&c, "--kv-cache-reject-different-quant")) o.kvdisk.reject_different_quant = true;
        else if (ds4_cli_is(&c, "--no-api-key")) o.no_api_key = true;
        else if (ds4_cli_int(&c, &opt_request_timeout, &v)) o.limits.request_timeout_ms = v * 1000;
        else if (ds4_cli_int(&c, &opt_head_timeout, &v)) o.limits.head_timeout_ms = v * 1000;
        else if (ds4_cli_int(&c, &opt_tool_ids, &v)) o.tool_memory_max_ids = (size_t)v;
        else if (ds4_cli_int(&c, &opt_disk_mb, &v)) o.kvdisk.space_bytes = (uint64_t)v << 20;
        else if (ds4_cli_str(&c, "--chdir", &dir)) {
            if (dir && chdir(dir)) { fprintf(stderr, "ds4-server: --chdir %s: %s\n", dir, strerror(errno)); return 2; }
        }
        else ds4_cli_unknown(&c);
    }
    if (c.status) return c.status;
    if (!ds4_cpu_select("ds4-server", o.runtime.isa, o.runtime.cpu_affinity)) return 2;
    if (!ds4_cli_model_usable("ds4-server", o.model_path)) return 1;
    char dist_err[256];
    if (!ds4_dist_finish_options(&o.dist, false, dist_err, sizeof dist_err)) {
        fprintf(stderr, "ds4-server: %s\n", dist_err);
        return 2;
    }
    return ds4_server_run(&o);
}
