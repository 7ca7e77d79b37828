/* cli_args.h -- what the command-line mains (ds4, ds4-server, ds4-bench and
 * the tools) share: option values parsed strictly, the flags every binary
 * that loads a model spells the same way, and one wording per mistake.
 *
 * Contract
 * - Values are parsed strictly (numparse.h).
 * - ds4_parse_sampling_option() recognises the sampling options every
 *   generating binary shares (--temp, --top-p, --min-p, --top-k, --seed):
 *   0 when name is not one of them, 1 when it is and the value was stored,
 *   -1 when it is but the value is missing or bad (p untouched).
 * - ds4_parse_spec_option() does the same for the speculative-decoding
 *   options (--spec-lookup N, 0..DS4_SPEC_MAX_DRAFT; 0 = off).
 */
#ifndef DS4_CLI_ARGS_H
#define DS4_CLI_ARGS_H

#include <stdbool.h>

#include "base/numparse.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/spec.h"

int ds4_parse_sampling_option(const char *name, const char *value, ds4_sampler_params *p);
int ds4_parse_spec_option(const char *name, const char *value, ds4_spec_params *p);
/* the --spec-lookup line of every generating binary's --help */
extern const char ds4_spec_usage[];

/* `--numerics exact|ds4` -> 0 | 1, the values of ds4_engine_params.numerics
 * (exact f32, or the FP8 KV / FP4 indexer simulation). */
bool ds4_parse_numerics(const char *s, int *out);

/* One line on stderr, "PROG: unknown option OPT (see --help)" and
 * "PROG: OPT needs a value", so every binary words these mistakes alike. */
void ds4_cli_unknown_option(const char *prog, const char *opt);
void ds4_cli_missing_value(const char *prog, const char *opt);

/* Whether `path` is a regular file this process can read. If not, prints one
 * line that says what to do instead (the demo model `make demo` builds, or
 * ./download_model.sh) and returns false. Checked before the engine opens
 * the file, so a FIFO or a directory is refused instead of blocking. */
bool ds4_cli_model_usable(const char *prog, const char *path);

/* Parses argv[*i] if it is an --ssd-streaming* option (advancing *i past a
 * value it takes) into the engine's parameters. Returns 1 if consumed, 0 if
 * not one of them, -1 with a line in err for a bad or missing value. */
int ds4_ssd_parse_option(ds4_ssd_params *p, int argc, char **argv, int *i, char *err, size_t errlen);
/* The options' help lines, for usage texts. */
extern const char ds4_ssd_usage[];

/* The engine's runtime controls every model-loading binary takes the same
 * way: --dir-steering-file FILE, --dir-steering-ffn F, --dir-steering-attn F
 * (docs/steering.md), --power N (1..100; docs/performance.md) and
 * --warm-weights (page the weights in at load and report the time).
 * ds4_runtime_parse_option() consumes argv[*i] (and its value) like
 * ds4_ssd_parse_option(); ds4_runtime_apply() copies them into the engine's
 * parameters. */
typedef struct {
    ds4_steering_params steering;
    int power;
    bool warm_weights;      /* --warm-weights */
} ds4_runtime_opts;
void ds4_runtime_opts_default(ds4_runtime_opts *o);
int ds4_runtime_parse_option(ds4_runtime_opts *o, int argc, char **argv, int *i, char *err, size_t errlen);
void ds4_runtime_apply(const ds4_runtime_opts *o, ds4_engine_params *ep);
extern const char ds4_runtime_usage[];

#endif
