#include "options/cli_args.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ds4_parse_spec_option(const char *name, const char *value, ds4_spec_params *p) {
    if (strcmp(name, "--spec-lookup")) return 0;
    return ds4_parse_int(value, 0, DS4_SPEC_MAX_DRAFT, &p->lookup_max) ? 1 : -1;
}

const char ds4_spec_usage[] =
    "      --spec-lookup N     speculative decoding: draft up to N tokens (1..16) from the\n"
    "                          longest earlier match of the context's last tokens; the output\n"
    "                          is the same as without it (default 0 = off)\n";

int ds4_parse_sampling_option(const char *name, const char *value, ds4_sampler_params *p) {
    if (!strcmp(name, "--temp")) return ds4_parse_float(value, &p->temperature) ? 1 : -1;
    if (!strcmp(name, "--top-p")) return ds4_parse_float(value, &p->top_p) ? 1 : -1;
    if (!strcmp(name, "--min-p")) return ds4_parse_float(value, &p->min_p) ? 1 : -1;
    if (!strcmp(name, "--top-k")) return ds4_parse_int(value, 0, INT_MAX, &p->top_k) ? 1 : -1;
    if (strcmp(name, "--seed")) return 0;
    if (!value) return -1;
    char *end;
    errno = 0;
    unsigned long long seed = strtoull(value, &end, 10);
    if (errno || end == value || *end) return -1;
    p->seed = seed;
    return 1;
}

bool ds4_parse_numerics(const char *s, int *out) {
    if (!s) return false;
    if (!strcmp(s, "exact")) *out = 0;
    else if (!strcmp(s, "ds4")) *out = 1;
    else return false;
    return true;
}

void ds4_cli_unknown_option(const char *prog, const char *opt) {
    fprintf(stderr, "%s: unknown option %s (see --help)\n", prog, opt);
}

void ds4_cli_missing_value(const char *prog, const char *opt) {
    fprintf(stderr, "%s: %s needs a value\n", prog, opt);
}

bool ds4_cli_model_usable(const char *prog, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: no model at %s (%s): pass -m models/demo.gguf for the random-weight demo model "
                "that `make demo` builds, or fetch DeepSeek V4 Flash with ./download_model.sh\n",
                prog, path, strerror(errno));
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "%s: %s is not a regular file; -m takes a GGUF file\n", prog, path);
        return false;
    }
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "%s: cannot read %s: %s\n", prog, path, strerror(errno));
        return false;
    }
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

int ds4_ssd_parse_option(ds4_ssd_params *p, int argc, char **argv, int *i, char *err, size_t errlen) {
    const char *a = argv[*i];
    if (strncmp(a, "--ssd-streaming", 15)) return 0;
    if (!strcmp(a, "--ssd-streaming")) { p->enabled = true; return 1; }
    if (!strcmp(a, "--ssd-streaming-cold")) { p->cold = true; return 1; }
    if (!strcmp(a, "--ssd-streaming-stats")) { p->stats = true; return 1; }
    if (!strcmp(a, "--ssd-streaming-lru")) { p->lru = true; return 1; }
    if (!strcmp(a, "--ssd-streaming-no-predict")) { p->no_predict = true; return 1; }
    if (!strcmp(a, "--ssd-streaming-trace")) {
        if (*i + 1 >= argc) { snprintf(err, errlen, "%s needs a file", a); return -1; }
        p->trace_path = argv[++*i];
        return 1;
    }
    const bool cache = !strcmp(a, "--ssd-streaming-cache-experts"), preload = !strcmp(a, "--ssd-streaming-preload-experts");
    if (!cache && !preload) return 0;
    if (*i + 1 >= argc) { snprintf(err, errlen, "%s needs a value", a); return -1; }
    const char *v = argv[++*i];
    if (cache ? !parse_cache_size(v, p) : !ds4_parse_int(v, 0, 1 << 30, &p->preload_experts)) {
        snprintf(err, errlen, "%s: bad value '%s' (%s)", a, v, cache ? "NGB, NMB or a slot count" : "an expert count");
        return -1;
    }
    if (preload && p->preload_experts == 0) p->cold = true;
    return 1;
}

void ds4_runtime_opts_default(ds4_runtime_opts *o) {
    o->steering = (ds4_steering_params){NULL, NAN, NAN};
    o->power = 100;
    o->warm_weights = false;
}

const char ds4_runtime_usage[] =
    "      --dir-steering-file F  per-layer directions (n_layer x n_embd f32) removed from layer outputs\n"
    "      --dir-steering-ffn S   scale on the FFN outputs (default 1 with a file; negative adds)\n"
    "      --dir-steering-attn S  scale on the attention outputs (default 0)\n"
    "      --power N              compute about N% of the time, sleeping the rest (1..100, default 100)\n"
    "      --warm-weights         page every weight in at load and report the time it took\n";

int ds4_runtime_parse_option(ds4_runtime_opts *o, int argc, char **argv, int *i, char *err, size_t errlen) {
    const char *a = argv[*i];
    if (!strcmp(a, "--warm-weights")) { o->warm_weights = true; return 1; }
    const bool file = !strcmp(a, "--dir-steering-file"), ffn = !strcmp(a, "--dir-steering-ffn"),
               attn = !strcmp(a, "--dir-steering-attn"), power = !strcmp(a, "--power");
    if (!file && !ffn && !attn && !power) return 0;
    if (*i + 1 >= argc) { snprintf(err, errlen, "%s needs a value", a); return -1; }
    const char *v = argv[++*i];
    bool ok = true;
    if (file) o->steering.file = v;
    else if (power) ok = ds4_parse_int(v, 1, 100, &o->power);
    else ok = ds4_parse_float(v, ffn ? &o->steering.ffn : &o->steering.attn) && isfinite(ffn ? o->steering.ffn : o->steering.attn);
    if (!ok) {
        snprintf(err, errlen, "%s: bad value '%s' (%s)", a, v, power ? "1..100" : "a finite number");
        return -1;
    }
    return 1;
}

void ds4_runtime_apply(const ds4_runtime_opts *o, ds4_engine_params *ep) {
    ep->steering = o->steering;
    ep->power = o->power;
    ep->warm_weights = o->warm_weights;
}
