/* test_cli_args.c -- option parsing: what strtol/strtof accept as a whole
 * string is taken, everything else (empty, partial, out of range) is refused
 * without touching the output; the option groups (sampling, GPU, pipeline,
 * SSD streaming) and a shared integer option take exactly their arguments
 * and refuse a bad or missing value with the one line of their kind. */
#include "check.h"
#include "base/log.h"
#include "options/cli_args.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

/* what the options said through the log hook, last call only */
static char said[512];
static void hear(void *ud, ds4_log_level level, const char *text, size_t len) {
    (void)ud;
    (void)level;
    snprintf(said, sizeof said, "%.*s", (int)len, text);
}

typedef bool (*group_fn)(ds4_cli *, void *);
static bool sampling(ds4_cli *c, void *p) { return ds4_cli_sampling(c, p); }
static bool ctx(ds4_cli *c, void *p) { return ds4_cli_int(c, &ds4_opt_ctx, p); }
static bool gpu(ds4_cli *c, void *p) { return ds4_cli_gpu(c, p); }
static bool dist(ds4_cli *c, void *p) { return ds4_cli_dist(c, p); }
static bool ssd_opt(ds4_cli *c, void *p) { return ds4_cli_ssd(c, p); }

/* The drafter options of a whole command line: the walk's status (0 taken,
 * 2 refused) and the params it left. */
static int parse_spec(int argc, char **argv, ds4_spec_params *p) {
    ds4_cli c;
    ds4_cli_begin(&c, "t", argc, argv);
    ds4_spec_params_default(p);
    said[0] = 0;
    while (ds4_cli_next(&c))
        if (!ds4_cli_spec(&c, p)) return -1;
    return c.status;
}

/* DSpark as the seed spells it (--mtp FILE --dspark, either order) and as
 * --dspark FILE; the mistakes refused in one line each. */
static void spec_case(void) {
    ds4_spec_params p;
    ds4_spec sp;
    char err[160];
    char *seed[] = {"t", "--mtp", "d.gguf", "--dspark", "--temp-is-not-ours"};
    CHECK(parse_spec(4, seed, &p) == 0 && p.dspark && p.dspark_path && !strcmp(p.dspark_path, "d.gguf") &&
          !p.mtp_path && ds4_spec_init(&sp, &p, err, sizeof err), "--mtp FILE --dspark");
    char *flag_first[] = {"t", "--dspark", "--mtp", "d.gguf", "--dspark-confidence", "0"};
    CHECK(parse_spec(6, flag_first, &p) == 0 && p.dspark_path && !strcmp(p.dspark_path, "d.gguf") && !p.mtp_path &&
          p.dspark_confidence == 0, "--dspark --mtp FILE");
    char *own[] = {"t", "--dspark", "d.gguf", "--spec-lookup", "4"};
    CHECK(parse_spec(5, own, &p) == 0 && p.dspark_path && !strcmp(p.dspark_path, "d.gguf") && p.lookup_max == 4,
          "--dspark FILE");
    char *mtp[] = {"t", "--mtp", "m.gguf", "--mtp-draft", "3"};
    CHECK(parse_spec(5, mtp, &p) == 0 && !p.dspark && !p.dspark_path && !strcmp(p.mtp_path, "m.gguf") &&
          p.mtp_draft == 3, "--mtp FILE alone is MTP");
    char *alone[] = {"t", "--dspark"};
    CHECK(parse_spec(2, alone, &p) == 0 && ds4_spec_wanted(&p) && !ds4_spec_init(&sp, &p, err, sizeof err) &&
          strstr(err, "needs the DSpark support file"), "--dspark without a file: %s", err);
    char *two[] = {"t", "--dspark", "d.gguf", "--mtp", "m.gguf"};
    CHECK(parse_spec(5, two, &p) == 2 && strstr(said, "one support file"), "two support files: %s", said);
    char *strict[] = {"t", "--dspark", "--quality"};
    CHECK(parse_spec(3, strict, &p) == 0 && !ds4_spec_wanted(&p), "--quality with --dspark: no drafter");
}

/* Offers "opt [value]" to one option group: 0 not its option, 1 taken (and
 * nothing left over), 2 refused with one line (in `said`). */
static int parse1(group_fn fn, void *p, const char *opt, const char *value) {
    char *argv[] = {"t", (char *)opt, (char *)value, NULL};
    ds4_cli c;
    ds4_cli_begin(&c, "t", value ? 3 : 2, argv);
    said[0] = 0;
    if (!ds4_cli_next(&c) || !fn(&c, p)) return 0;
    if (c.status) return c.status;
    return ds4_cli_next(&c) ? -1 : 1;
}

int main(void) {
    ds4_log_set_hook(hear, NULL);
    spec_case();
    int v = -7;
    CHECK(ds4_parse_int("42", 0, 100, &v) && v == 42, "42 -> %d", v);
    CHECK(ds4_parse_int("-3", -5, 5, &v) && v == -3, "-3 -> %d", v);
    CHECK(ds4_parse_int(" 8", 0, 10, &v) && v == 8, "leading space -> %d", v);
    CHECK(ds4_parse_int("2147483647", 0, INT_MAX, &v) && v == INT_MAX, "INT_MAX -> %d", v);
    v = -7;
    const char *bad[] = {"", "x", "12x", "1.5", "0x10", " ", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(!ds4_parse_int(bad[i], INT_MIN, INT_MAX, &v) && v == -7, "'%s' refused", bad[i]);
    CHECK(!ds4_parse_int(NULL, 0, 10, &v) && v == -7, "missing value refused");
    CHECK(!ds4_parse_int("16", 17, 100, &v) && !ds4_parse_int("101", 17, 100, &v) && v == -7, "range ends");
    CHECK(ds4_parse_int("17", 17, 100, &v) && v == 17 && ds4_parse_int("100", 17, 100, &v) && v == 100,
          "range ends inclusive");

    float f = -1.0f;
    CHECK(ds4_parse_float("0.25", &f) && f == 0.25f, "0.25 -> %g", f);
    CHECK(ds4_parse_float("1e-2", &f) && f == 1e-2f, "1e-2 -> %g", f);
    CHECK(ds4_parse_float("3", &f) && f == 3.0f, "3 -> %g", f);
    f = -1.0f;
    const char *badf[] = {"", "abc", "0.5x", "1e99", " "};
    for (size_t i = 0; i < sizeof badf / sizeof *badf; i++)
        CHECK(!ds4_parse_float(badf[i], &f) && f == -1.0f, "'%s' refused", badf[i]);
    CHECK(!ds4_parse_float(NULL, &f), "missing value refused");

    ds4_sampler_params sp, before;
    ds4_sampler_params_default(&sp);
    CHECK(parse1(sampling, &sp, "--temp", "0.5") == 1 && sp.temperature == 0.5f, "--temp");
    CHECK(parse1(sampling, &sp, "--top-k", "40") == 1 && sp.top_k == 40, "--top-k");
    CHECK(parse1(sampling, &sp, "--seed", "18446744073709551615") == 1 && sp.seed == UINT64_MAX, "--seed max");
    before = sp;
    CHECK(parse1(sampling, &sp, "--top-p", "x") == 2 && !strcmp(said, "t: --top-p: bad value 'x' (a number)\n"),
          "bad float: %s", said);
    CHECK(parse1(sampling, &sp, "--seed", NULL) == 2 && !strcmp(said, "t: --seed needs a value\n"), "missing: %s",
          said);
    CHECK(parse1(sampling, &sp, "--seed", "12x") == 2 && parse1(sampling, &sp, "--seed", "-1") == 2 &&
          !memcmp(&sp, &before, sizeof sp), "bad values refused, nothing stored");
    CHECK(parse1(sampling, &sp, "--ctx", "5") == 0, "not a sampling option");

    /* one range and one line per shared integer option */
    int n = -7;
    CHECK(parse1(ctx, &n, "-c", "4096") == 1 && n == 4096 && parse1(ctx, &n, "--ctx", "16") == 1 && n == 16, "--ctx");
    CHECK(parse1(ctx, &n, "--ctx", "15") == 2 && n == 16 &&
          !strcmp(said, "t: --ctx: bad value '15' (an integer in [16, 16777216])\n"), "--ctx range: %s", said);
    CHECK(parse1(ctx, &n, "--ctxx", "15") == 0, "a longer spelling is another option");

    ds4_gpu_opts o;
    ds4_gpu_opts_default(&o);
    CHECK(parse1(gpu, &o, "--cuda", NULL) == 1 && o.backend == DS4_BACKEND_CUDA, "--cuda");
    CHECK(parse1(gpu, &o, "--cpu", NULL) == 1 && o.backend == DS4_BACKEND_CPU, "--cpu");
    CHECK(parse1(gpu, &o, "--gpu-vram", "8,8") == 1 && o.n_budgets == 2, "--gpu-vram");
    CHECK(parse1(gpu, &o, "--gpu-devices", NULL) == 2 && strstr(said, "needs a value"), "missing value");
    CHECK(parse1(gpu, &o, "--gpu-devices", "x") == 2 && !strncmp(said, "t: --gpu-devices wants", 22), "bad: %s",
          said);
    CHECK(parse1(gpu, &o, "--ctx", "5") == 0, "other options are not ours");

    ds4_dist_params d = {0};
    CHECK(parse1(dist, &d, "--role", "worker") == 1 && d.role == DS4_DIST_WORKER, "--role");
    CHECK(parse1(dist, &d, "--dist-prefill-window", "99") == 2 &&
          !strcmp(said, "t: --dist-prefill-window: bad value '99' (an integer in [1, 32])\n"), "window: %s", said);
    CHECK(parse1(dist, &d, "--listen", "h") == 2 && !strcmp(said, "t: --listen needs HOST PORT (port 1..65535)\n"),
          "--listen without a port: %s", said);
    char *argv[] = {"t", "--listen", "10.0.0.1", "7000", "--debug"};
    ds4_cli c;
    ds4_cli_begin(&c, "t", 5, argv);
    CHECK(ds4_cli_next(&c) && ds4_cli_dist(&c, &d) && ds4_cli_next(&c) && ds4_cli_dist(&c, &d) && !ds4_cli_next(&c) &&
          !c.status && d.port == 7000 && !strcmp(d.host, "10.0.0.1") && d.debug, "--listen HOST PORT --debug");

    /* tensor parallelism: its flags, and the one-line refusals of ds4_dist_finish_options */
    ds4_dist_params t = {0};
    CHECK(parse1(dist, &t, "--tensor-parallel", NULL) == 1 && t.tp, "--tensor-parallel");
    CHECK(parse1(dist, &t, "--tensor-parallel-token-prefill", NULL) == 1 && t.tp_token_prefill, "token prefill");
    CHECK(parse1(dist, &t, "--transport", "udp") == 2 &&
              !strcmp(said, "t: --transport takes tcp, rdma or auto, not 'udp'\n"), "--transport udp: %s", said);
    CHECK(parse1(dist, &t, "--transport", "auto") == 1 && t.transport_auto && !t.transport_rdma, "--transport auto");
    CHECK(parse1(dist, &t, "--rdma-gid-index", "256") == 2 && strstr(said, "[0, 255]"), "gid range: %s", said);
    CHECK(parse1(dist, &t, "--transport", "tcp") == 1 && t.transport_set && !t.transport_rdma, "--transport tcp");
    char err[256];
    ds4_dist_params fo = {.role = DS4_DIST_COORDINATOR, .host = "127.0.0.1", .port = 1, .tp = true};
    CHECK(ds4_dist_finish_options(&fo, true, err, sizeof err), "tensor parallel coordinator: %s", err);
    fo = (ds4_dist_params){.role = DS4_DIST_COORDINATOR, .host = "127.0.0.1", .port = 1, .tp = true, .rdma_device = "d"};
    CHECK(!ds4_dist_finish_options(&fo, true, err, sizeof err) && !strcmp(err, "--rdma-device goes with --transport rdma"),
          "rdma device over tcp: %s", err);
    fo = (ds4_dist_params){.tp = true};
    CHECK(!ds4_dist_finish_options(&fo, true, err, sizeof err) && strstr(err, "needs --role"), "no role: %s", err);
    fo = (ds4_dist_params){.role = DS4_DIST_COORDINATOR, .host = "h", .port = 1, .tp_token_prefill = true};
    CHECK(!ds4_dist_finish_options(&fo, true, err, sizeof err) &&
              !strcmp(err, "--tensor-parallel-token-prefill goes with --tensor-parallel"), "token prefill alone: %s", err);

    ds4_ssd_params ssd = {0};
    CHECK(parse1(ssd_opt, &ssd, "--ssd-streaming-cache-experts", "2GiB") == 1 && ssd.cache_bytes == 2ull << 30,
          "cache size");
    CHECK(parse1(ssd_opt, &ssd, "--ssd-streaming-cache-experts", "12XB") == 2 &&
          !strcmp(said, "t: --ssd-streaming-cache-experts: bad value '12XB' (NGB, NMB or a slot count)\n"),
          "bad cache size: %s", said);
    CHECK(parse1(ssd_opt, &ssd, "--ssd-streaming-preload-experts", "0") == 1 && ssd.cold, "preload 0 is cold");
    return check_done("test_cli_args");
}
