#include "options/cli_args.h"
#include "backends/cuda/cuda_backend.h"
#include "base/log.h"
#include "base/threadpool.h"
#include "kernels/kernels_cpu.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const ds4_cli_int_opt ds4_opt_ctx = {"-c|--ctx", 16, 1 << 24};
const ds4_cli_int_opt ds4_opt_threads = {"-t|--threads", 0, 4096};
const ds4_cli_int_opt ds4_opt_tokens = {"-n|--tokens", 0, 1 << 30};
const ds4_cli_int_opt ds4_opt_prefill_chunk = {"--prefill-chunk", 1, 1 << 20};

void ds4_cli_begin(ds4_cli *c, const char *prog, int argc, char **argv) {
    *c = (ds4_cli){prog, argc, argv, 0, 0, 0};
}

bool ds4_cli_next(ds4_cli *c) {
    if (c->status || c->i + 1 >= c->argc) return false;
    c->at = ++c->i;
    return true;
}

/* the option being parsed (its values may follow it) */
static const char *cur(const ds4_cli *c) { return c->argv[c->at]; }

bool ds4_cli_is(const ds4_cli *c, const char *names) {
    const char *a = cur(c);
    const size_t n = strlen(a);
    for (const char *s = names; *s;) {
        const size_t len = strcspn(s, "|");
        if (len == n && !memcmp(s, a, n)) return true;
        s += len + (s[len] == '|');
    }
    return false;
}

void ds4_cli_fail(ds4_cli *c, const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ds4_log(DS4_LOG_ERROR, "%s: %s\n", c->prog, line);
    c->status = 2;
}

void ds4_cli_bad_value(ds4_cli *c, const char *value, const char *what) {
    ds4_cli_fail(c, "%s: bad value '%s' (%s)", cur(c), value, what);
}

void ds4_cli_unknown_option(const char *prog, const char *opt) {
    ds4_log(DS4_LOG_ERROR, "%s: unknown option %s (see --help)\n", prog, opt);
}

void ds4_cli_missing_value(const char *prog, const char *opt) {
    ds4_log(DS4_LOG_ERROR, "%s: %s needs a value\n", prog, opt);
}

void ds4_cli_unknown(ds4_cli *c) {
    ds4_cli_unknown_option(c->prog, cur(c));
    c->status = 2;
}

/* The value after the current option (the cursor moves onto it), or NULL
 * after the missing-value line. */
static const char *value(ds4_cli *c) {
    if (c->i + 1 >= c->argc) {
        ds4_cli_missing_value(c->prog, cur(c));
        c->status = 2;
        return NULL;
    }
    return c->argv[++c->i];
}

static void bad(ds4_cli *c, const char *what) { ds4_cli_bad_value(c, c->argv[c->i], what); }

bool ds4_cli_str(ds4_cli *c, const char *names, const char **out) {
    if (!ds4_cli_is(c, names)) return false;
    const char *v = value(c);
    if (v) *out = v;
    return true;
}

bool ds4_cli_int(ds4_cli *c, const ds4_cli_int_opt *opt, int *out) {
    if (!ds4_cli_is(c, opt->names)) return false;
    const char *v = value(c);
    if (v && !ds4_parse_int(v, opt->lo, opt->hi, out)) {
        char what[80];
        snprintf(what, sizeof what, "an integer in [%ld, %ld]", opt->lo, opt->hi);
        bad(c, what);
    }
    return true;
}

bool ds4_cli_model(ds4_cli *c, const char **path) { return ds4_cli_str(c, "-m|--model", path); }
bool ds4_cli_layers(ds4_cli *c, const char **layers) { return ds4_cli_str(c, "--layers", layers); }

bool ds4_parse_numerics(const char *s, int *out) {
    if (!s) return false;
    if (!strcmp(s, "exact")) *out = 0;
    else if (!strcmp(s, "ds4")) *out = 1;
    else return false;
    return true;
}

bool ds4_cli_numerics(ds4_cli *c, int *numerics) {
    if (!ds4_cli_is(c, "--numerics")) return false;
    const char *v = value(c);
    if (v && !ds4_parse_numerics(v, numerics)) bad(c, "exact or ds4");
    return true;
}

static bool float_value(ds4_cli *c, float *out) {
    const char *v = value(c);
    if (v && !ds4_parse_float(v, out)) bad(c, "a number");
    return true;
}

bool ds4_cli_sampling(ds4_cli *c, ds4_sampler_params *p) {
    if (ds4_cli_is(c, "--temp")) return float_value(c, &p->temperature);
    if (ds4_cli_is(c, "--top-p")) return float_value(c, &p->top_p);
    if (ds4_cli_is(c, "--min-p")) return float_value(c, &p->min_p);
    static const ds4_cli_int_opt top_k = {"--top-k", 0, INT_MAX};
    if (ds4_cli_int(c, &top_k, &p->top_k)) return true;
    if (!ds4_cli_is(c, "--seed")) return false;
    const char *v = value(c);
    if (!v) return true;
    char *end;
    errno = 0;
    const unsigned long long seed = strtoull(v, &end, 10);
    if (errno || end == v || *end || *v == '-') bad(c, "an unsigned 64-bit integer");
    else p->seed = seed;
    return true;
}

bool ds4_cli_spec(ds4_cli *c, ds4_spec_params *p) {
    static const ds4_cli_int_opt lookup = {"--spec-lookup", 0, DS4_SPEC_MAX_DRAFT};
    static const ds4_cli_int_opt mtp_draft = {"--mtp-draft", 1, DS4_SPEC_MAX_DRAFT};
    if (ds4_cli_is(c, "--quality")) { p->quality = true; return true; }
    if (ds4_cli_is(c, "--dspark-strict")) { p->dspark_strict = true; return true; }
    if (ds4_cli_is(c, "--dspark-confidence")) {
        const char *v = value(c);
        float f;
        if (v && (!ds4_parse_float(v, &f) || !(f >= 0 && f <= 1))) bad(c, "a number from 0 to 1");
        else if (v) p->dspark_confidence = f;
        return true;
    }
    if (ds4_cli_is(c, "--mtp-margin")) {
        const char *v = value(c);
        float f;
        if (v && (!ds4_parse_float(v, &f) || !isfinite(f) || f < 0)) bad(c, "a finite number >= 0");
        else if (v) p->mtp_margin = f;
        return true;
    }
    /* DSpark as the seed spells it: --dspark selects the runtime and --mtp
     * FILE gives its support file, in either order; --dspark FILE names the
     * file itself (no binary takes a bare word, so a value cannot be taken
     * for anything else). */
    const char *file = NULL;
    if (ds4_cli_is(c, "--dspark")) {
        p->dspark = true;
        if (c->i + 1 < c->argc && c->argv[c->i + 1][0] != '-') file = c->argv[++c->i];
        else if (p->mtp_path) file = p->mtp_path, p->mtp_path = NULL;
    } else if (ds4_cli_str(c, "--mtp", &file)) {
        if (!file) return true;
        if (!p->dspark) { p->mtp_path = file; return true; }
    } else {
        return ds4_cli_int(c, &mtp_draft, &p->mtp_draft) || ds4_cli_int(c, &lookup, &p->lookup_max);
    }
    if (file && p->dspark_path && strcmp(file, p->dspark_path))
        ds4_cli_fail(c, "--dspark takes one support file (--mtp %s or --dspark %s), not both", file, p->dspark_path);
    else if (file)
        p->dspark_path = file;
    return true;
}

const char ds4_spec_usage[] =
    "      --spec-lookup N     speculative decoding: draft up to N tokens (1..16) from the\n"
    "                          longest earlier match of the context's last tokens; the output\n"
    "                          is the same as without it (default 0 = off)\n"
    "      --mtp FILE          speculative decoding with the model's MTP support file (DeepSeek V4):\n"
    "                          its block drafts the next tokens; the output is the same as without it\n"
    "      --mtp-draft N       MTP tokens drafted per verification pass (1..16, default 1)\n"
    "      --mtp-margin F      draft a token only while its logit leads the runner-up by F (default 3)\n"
    "      --dspark            speculative decoding with DSpark (DeepSeek V4): the support file\n"
    "                          given by --mtp FILE (or --dspark FILE) is a block drafter that\n"
    "                          proposes up to five tokens per pass; replaces the MTP block\n"
    "      --dspark-confidence F  propose the longest block prefix whose confidence is >= F\n"
    "                          (0..1, default 0.9; 0 = always the whole block)\n"
    "      --dspark-strict     target-only decoding, as --quality\n"
    "      --quality           target-only decoding: no drafter runs, whatever else asks for one\n";

const char ds4_gpu_usage[] =
    "      --cuda              run on the CUDA backend (CUDA builds; exits if no GPU)\n"
    "      --cpu               run on the CPU reference backend (default)\n"
    "      --gpu-vram N[,N..]  per-device VRAM budget in GiB, or auto (free memory)\n"
    "      --gpu-devices N[,N..] CUDA device ordinals in placement order (default 0)\n"
    "      --backend cpu|cuda  the same as --cpu / --cuda\n";

/* Other engines' backend flags (--metal, --backend NAME) are recognised so a
 * command line written for them gets one line naming the backends this build
 * has; --backend cpu|cuda selects as --cpu / --cuda do. */
bool ds4_cli_gpu(ds4_cli *c, ds4_gpu_opts *o) {
    if (ds4_cli_is(c, "--cuda")) { o->backend = DS4_BACKEND_CUDA; return true; }
    if (ds4_cli_is(c, "--cpu")) { o->backend = DS4_BACKEND_CPU; return true; }
    if (ds4_cli_is(c, "--metal")) {
        ds4_cli_fail(c, "--metal: no Metal backend here; this build has: %s", ds4_backends_built());
        return true;
    }
    if (ds4_cli_is(c, "--backend")) {
        const char *v = value(c);
        if (v && (!strcmp(v, "cpu") || !strcmp(v, "cuda")))
            o->backend = !strcmp(v, "cuda") ? DS4_BACKEND_CUDA : DS4_BACKEND_CPU;
        else if (v)
            ds4_cli_fail(c, "--backend %.32s: no such backend here; this build has: %s", v, ds4_backends_built());
        return true;
    }
    const bool vram = ds4_cli_is(c, "--gpu-vram");
    if (!vram && !ds4_cli_is(c, "--gpu-devices")) return false;
    const char *v = value(c);
    char err[256];
    o->placement_given = true;
    if (v && !(vram ? ds4_gpu_parse_budgets(v, o, err, sizeof err) : ds4_gpu_parse_devices(v, o, err, sizeof err)))
        ds4_cli_fail(c, "%s", err);
    return true;
}

const char ds4_ssd_usage[] =
    "      --ssd-streaming           keep non-routed weights resident, stream routed experts from the file\n"
    "      --ssd-streaming-cache-experts B  expert cache: NGB/NMB bytes, or a plain number of slots (default: auto)\n"
    "      --ssd-streaming-preload-experts N  hot experts read at start (default: half the slots)\n"
    "      --ssd-streaming-cold      no preload (measurements)\n"
    "      --ssd-streaming-stats     print hit rate, bytes read per token, read throughput and stall time at exit\n";

/* "32GB", "1.5GiB", "512MB" (binary units) -> bytes; a plain integer -> slots. */
static bool parse_cache_size(const char *v, ds4_ssd_params *p) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || !isfinite(x) || x <= 0) return false;
    static const struct { const char *unit; double scale; } units[] = {
        {"KB", 1 << 10}, {"KiB", 1 << 10}, {"MB", 1 << 20}, {"MiB", 1 << 20},
        {"GB", 1 << 30}, {"GiB", 1 << 30}, {"TB", 1099511627776.0}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcmp(end, units[i].unit) && x * units[i].scale < 1.8e19) {
            p->cache_bytes = (uint64_t)(x * units[i].scale);
            p->cache_slots = 0;
            return true;
        }
    int slots;
    if (!ds4_parse_int(v, 1, 1 << 30, &slots)) return false;
    p->cache_slots = slots;
    p->cache_bytes = 0;
    return true;
}

bool ds4_cli_ssd(ds4_cli *c, ds4_ssd_params *p) {
    if (strncmp(cur(c), "--ssd-streaming", 15)) return false;
    if (ds4_cli_is(c, "--ssd-streaming")) { p->enabled = true; return true; }
    if (ds4_cli_is(c, "--ssd-streaming-cold")) { p->cold = true; return true; }
    if (ds4_cli_is(c, "--ssd-streaming-stats")) { p->stats = true; return true; }
    if (ds4_cli_is(c, "--ssd-streaming-lru")) { p->lru = true; return true; }
    if (ds4_cli_is(c, "--ssd-streaming-no-predict")) { p->no_predict = true; return true; }
    if (ds4_cli_str(c, "--ssd-streaming-trace", &p->trace_path)) return true;
    if (ds4_cli_is(c, "--ssd-streaming-cache-experts")) {
        const char *v = value(c);
        if (v && !parse_cache_size(v, p)) bad(c, "NGB, NMB or a slot count");
        return true;
    }
    static const ds4_cli_int_opt preload = {"--ssd-streaming-preload-experts", 0, 1 << 30};
    if (!ds4_cli_int(c, &preload, &p->preload_experts)) return false;
    if (!c->status && p->preload_experts == 0) p->cold = true;
    return true;
}

/* DS4_RDMA: the Makefile's RDMA (1: libibverbs linked, dist/rdma.h) */
#if defined(DS4_RDMA) && DS4_RDMA
#define RDMA_BUILD "has RDMA: libibverbs"
#else
#define RDMA_BUILD "has no RDMA: built without libibverbs"
#endif
const char ds4_dist_usage[] =
    "      --role coordinator|worker  pipeline parallelism over hosts (docs/distributed.md)\n"
    "      --listen HOST PORT    coordinator: where workers register\n"
    "      --coordinator HOST PORT  worker: the coordinator to register with\n"
    "      --dist-secret S       shared secret checked at registration (else $DS4_DIST_SECRET)\n"
    "      --dist-wait SECONDS   coordinator: wait this long for a complete route (default 30)\n"
    "      --dist-reply-timeout SECONDS  coordinator: a hop silent this long is gone (default 120)\n"
    "      --dist-prefill-chunk N  coordinator: tokens per pipelined prefill chunk (default: --prefill-chunk)\n"
    "      --dist-prefill-window W  coordinator: prefill chunks in flight along the route (default 2)\n"
    "      --dist-activation-bits 32|16|8  coordinator: hidden states between hops as f32, f16 or\n"
    "                            per-row scaled int8 (default 32; 16 and 8 change the logits slightly)\n"
    "      --dist-tls-cert FILE  TLS for every pipeline connection: this host's certificate (PEM)\n"
    "      --dist-tls-key FILE   its private key (PEM)\n"
    "      --dist-tls-ca FILE    the CA that signs every host's certificate (PEM); peers must present one\n"
    "      --tensor-parallel     with --role: two hosts evaluate every token together, each computing half\n"
    "                            of every layer's routed experts (docs/distributed.md)\n"
    "      --transport tcp|rdma|auto  tensor parallelism's link (default tcp; auto: rdma when a device is\n"
    "                            active; this build " RDMA_BUILD ")\n"
    "      --rdma-device D       --transport rdma: the verbs device (default: the active one)\n"
    "      --rdma-gid-index N    --transport rdma: the GID (default: the IPv4-mapped one)\n"
    "      --tensor-parallel-token-prefill  prefill one token per exchange, as decode runs\n"
    "      --debug               route formation and per-hop telemetry on stderr\n";

static bool seconds_value(ds4_cli *c, double *out) {
    const char *v = value(c);
    if (!v) return true;
    char *end;
    const double x = strtod(v, &end);
    if (end == v || *end || !(x > 0 && x < 1e6)) bad(c, "seconds, more than 0");
    else *out = x;
    return true;
}

bool ds4_cli_dist(ds4_cli *c, ds4_dist_params *p) {
    if (ds4_cli_is(c, "--debug")) { p->debug = true; return true; }
    if (ds4_cli_is(c, "--listen|--coordinator")) {
        int port;
        if (c->i + 2 >= c->argc || !ds4_parse_int(c->argv[c->i + 2], 1, 65535, &port)) {
            ds4_cli_fail(c, "%s needs HOST PORT (port 1..65535)", cur(c));
            return true;
        }
        p->host = c->argv[c->i + 1];
        p->port = port;
        c->i += 2;
        return true;
    }
    static const ds4_cli_int_opt chunk = {"--dist-prefill-chunk", 1, 1 << 20},
                                 window = {"--dist-prefill-window", 1, DS4_DIST_MAX_WINDOW};
    if (ds4_cli_str(c, "--dist-secret", &p->secret) || ds4_cli_str(c, "--dist-tls-cert", &p->tls_cert) ||
        ds4_cli_str(c, "--dist-tls-key", &p->tls_key) || ds4_cli_str(c, "--dist-tls-ca", &p->tls_ca) ||
        ds4_cli_int(c, &chunk, &p->prefill_chunk) || ds4_cli_int(c, &window, &p->prefill_window))
        return true;
    if (ds4_cli_is(c, "--dist-wait")) return seconds_value(c, &p->wait_seconds);
    if (ds4_cli_is(c, "--dist-reply-timeout")) return seconds_value(c, &p->reply_seconds);
    if (ds4_cli_is(c, "--dist-activation-bits")) {
        const char *v = value(c);
        if (v && strcmp(v, "32") && strcmp(v, "16") && strcmp(v, "8"))
            ds4_cli_fail(c, "--dist-activation-bits takes 32, 16 or 8, not '%s'", v);
        else if (v)
            p->activation_bits = atoi(v);
        return true;
    }
    if (ds4_cli_is(c, "--tensor-parallel")) { p->tp = true; return true; }
    if (ds4_cli_is(c, "--tensor-parallel-token-prefill")) { p->tp_token_prefill = true; return true; }
    if (ds4_cli_str(c, "--rdma-device", &p->rdma_device)) return true;
    static const ds4_cli_int_opt gid = {"--rdma-gid-index", 0, 255};
    if (ds4_cli_int(c, &gid, &p->rdma_gid_index)) { p->rdma_gid_set = true; return true; }
    if (ds4_cli_is(c, "--transport")) {
        const char *v = value(c);
        if (v && strcmp(v, "tcp") && strcmp(v, "rdma") && strcmp(v, "auto"))
            ds4_cli_fail(c, "--transport takes tcp, rdma or auto, not '%s'", v);
        else if (v) {
            p->transport_set = true;
            p->transport_rdma = !strcmp(v, "rdma");
            p->transport_auto = !strcmp(v, "auto");
        }
        return true;
    }
    if (!ds4_cli_is(c, "--role")) return false;
    const char *v = value(c);
    if (!v) return true;
    if (!strcmp(v, "coordinator")) p->role = DS4_DIST_COORDINATOR;
    else if (!strcmp(v, "worker")) p->role = DS4_DIST_WORKER;
    else ds4_cli_fail(c, "--role takes coordinator or worker, not '%s'", v);
    return true;
}

bool ds4_cli_model_usable(const char *prog, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        ds4_log(DS4_LOG_ERROR, "%s: no model at %s (%s): pass -m models/ds4-tiny.gguf for the trained tiny model "
                "that `make demo` unpacks, or fetch DeepSeek V4 Flash with ./download_model.sh\n",
                prog, path, strerror(errno));
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        ds4_log(DS4_LOG_ERROR, "%s: %s is not a regular file; -m takes a GGUF file\n", prog, path);
        return false;
    }
    if (access(path, R_OK) != 0) {
        ds4_log(DS4_LOG_ERROR, "%s: cannot read %s: %s\n", prog, path, strerror(errno));
        return false;
    }
    return true;
}

void ds4_runtime_opts_default(ds4_runtime_opts *o) {
    o->steering = (ds4_steering_params){NULL, NAN, NAN};
    o->power = 100;
    o->warm_weights = false;
    o->isa = -1;
    o->cpu_affinity = NULL;
}

#define CPU_USAGE                                                                                  \
    "      --isa LEVEL            highest CPU kernel level: scalar, avx2 (without AVX-VNNI), avxvnni,\n" \
    "                             avx512 or amx (default: the CPU's best, or $DS4_ISA; a level the\n"   \
    "                             CPU lacks runs its best)\n"                                          \
    "      --cpu-affinity LIST    pin compute thread i to the i-th CPU of LIST, e.g. 0-3 or 0,2,4,6\n"  \
    "                             (the thread that loads the model is thread 0; default: unpinned)\n"

const char ds4_runtime_usage[] =
    "      --dir-steering-file F  per-layer directions (n_layer x n_embd f32) removed from layer outputs\n"
    "      --dir-steering-ffn S   scale on the FFN outputs (default 1 with a file; negative adds)\n"
    "      --dir-steering-attn S  scale on the attention outputs (default 0)\n"
    "      --power N              compute about N% of the time, sleeping the rest (1..100, default 100)\n"
    "      --warm-weights         page every weight in at load and report the time it took\n" CPU_USAGE;
const char ds4_cpu_usage[] = CPU_USAGE;

static const char isa_values[] = "scalar, avx2, avxvnni, avx512 or amx";

/* "0-3,8" into cpus[0..*n): numbers and ascending ranges, in order; the
 * shape only (ds4_pool_set_affinity checks the CPUs themselves) */
static bool parse_cpu_list(const char *s, int *cpus, int max, int *n) {
    *n = 0;
    for (;;) {
        char item[32];
        const size_t len = strcspn(s, ",");
        if (len == 0 || len >= sizeof item) return false;
        memcpy(item, s, len);
        item[len] = 0;
        char *dash = strchr(item, '-');
        int lo, hi;
        if (dash) *dash = 0;
        /* digits first: ds4_parse_int also takes a sign and white space */
        if (!isdigit((unsigned char)item[0]) || !ds4_parse_int(item, 0, DS4_POOL_MAX_CPUS - 1, &lo)) return false;
        hi = lo;
        if (dash && (!isdigit((unsigned char)dash[1]) || !ds4_parse_int(dash + 1, lo, DS4_POOL_MAX_CPUS - 1, &hi)))
            return false;
        for (int cpu = lo; cpu <= hi; cpu++) {
            if (*n == max) return false;
            cpus[(*n)++] = cpu;
        }
        if (!s[len]) return true;
        s += len + 1;
    }
}

bool ds4_cli_cpu(ds4_cli *c, int *isa, const char **cpu_affinity) {
    if (ds4_cli_is(c, "--cpu-affinity")) {
        const char *v = value(c);
        int cpus[DS4_POOL_MAX_CPUS], n;
        if (v && !parse_cpu_list(v, cpus, DS4_POOL_MAX_CPUS, &n))
            bad(c, "CPU numbers and ascending ranges, e.g. 0-3,8");
        else if (v)
            *cpu_affinity = v;
        return true;
    }
    if (!ds4_cli_is(c, "--isa")) return false;
    const char *v = value(c);
    enum ds4_isa_cap cap;
    if (v && !ds4_isa_cap_parse(v, &cap)) bad(c, isa_values);
    else if (v) *isa = (int)cap;
    return true;
}

static bool select_affinity(const char *prog, const char *list) {
    if (!list) return true;
    int cpus[DS4_POOL_MAX_CPUS], n;
    char err[160];
    if (!parse_cpu_list(list, cpus, DS4_POOL_MAX_CPUS, &n)) snprintf(err, sizeof err, "not a CPU list");
    else if (ds4_pool_set_affinity(cpus, n, err, sizeof err)) return true;
    ds4_log(DS4_LOG_ERROR, "%s: --cpu-affinity %.64s: %s\n", prog, list, err);
    return false;
}

bool ds4_cpu_select(const char *prog, int isa, const char *cpu_affinity) {
    if (!select_affinity(prog, cpu_affinity)) return false;
    const char *from = "--isa";
    enum ds4_isa_cap want = (enum ds4_isa_cap)isa;
    if (isa < 0) {
        const char *env = getenv("DS4_ISA");
        if (!env || !*env) return true;
        if (!ds4_isa_cap_parse(env, &want)) {
            ds4_log(DS4_LOG_ERROR, "%s: DS4_ISA: bad value '%.32s' (%s)\n", prog, env, isa_values);
            return false;
        }
        from = "DS4_ISA";
    }
    ds4_kernels_set_isa(want);
    const enum ds4_isa_cap got = ds4_kernels_isa();
    if (got < want && want == DS4_ISA_AVXVNNI)
        ds4_log(DS4_LOG_WARN, "%s: %s avxvnni: this CPU has no AVX-VNNI, so %s runs instead\n", prog, from,
                ds4_isa_cap_name(got));
    else if (got < want)
        ds4_log(DS4_LOG_WARN, "%s: %s %s: this CPU has %s at most, which runs instead\n", prog, from,
                ds4_isa_cap_name(want), ds4_isa_cap_name(got));
    return true;
}

bool ds4_cli_runtime(ds4_cli *c, ds4_runtime_opts *o) {
    static const ds4_cli_int_opt power = {"--power", 1, 100};
    if (ds4_cli_is(c, "--warm-weights")) { o->warm_weights = true; return true; }
    if (ds4_cli_cpu(c, &o->isa, &o->cpu_affinity)) return true;
    if (ds4_cli_int(c, &power, &o->power) || ds4_cli_str(c, "--dir-steering-file", &o->steering.file)) return true;
    const bool ffn = ds4_cli_is(c, "--dir-steering-ffn");
    if (!ffn && !ds4_cli_is(c, "--dir-steering-attn")) return false;
    const char *v = value(c);
    float *scale = ffn ? &o->steering.ffn : &o->steering.attn;
    if (v && !(ds4_parse_float(v, scale) && isfinite(*scale))) bad(c, "a finite number");
    return true;
}

void ds4_runtime_apply(const ds4_runtime_opts *o, ds4_engine_params *ep) {
    ep->steering = o->steering;
    ep->power = o->power;
    ep->warm_weights = o->warm_weights;
}
