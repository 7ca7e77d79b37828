/* cli_args.h -- the one command-line parser of the binaries (ds4, ds4-server,
 * ds4-bench, ds4-agent; the tools use its wording): a cursor over argv, the
 * options every binary that loads a model shares, each defined once with its
 * spelling, range and message, and one wording per mistake. The library
 * below takes the structs these fill (ds4_engine_params' parts,
 * ds4_sampler_params, ds4_dist_params), never argv.
 *
 * Contract
 * - A binary walks argv with ds4_cli_next() and offers the current argument
 *   to the option functions in turn. Each returns true when the argument is
 *   its option: it took the value(s) that follow, or refused the option with
 *   one line through the log (base/log.h) and set c->status = 2, which ends
 *   the walk. False: not this option, nothing consumed.
 * - The lines: "PROG: unknown option OPT (see --help)", "PROG: OPT needs a
 *   value", "PROG: OPT: bad value 'V' (WHAT)" where WHAT says what is taken
 *   ("an integer in [LO, HI]", "a number", "exact or ds4", ...); an option
 *   whose value has a shape of its own (--listen HOST PORT) says so instead.
 * - Values are parsed strictly (numparse.h): the whole string is the number,
 *   in its range.
 * - A shared integer option is a ds4_cli_int_opt, one per option, so every
 *   binary gives it the same range; a binary's own integer options use the
 *   same type and so the same message.
 */
#ifndef DS4_CLI_ARGS_H
#define DS4_CLI_ARGS_H

#include <stdbool.h>

#include "backends/cuda/cuda_plan.h"
#include "base/numparse.h"
#include "dist/dist.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/spec.h"

typedef struct {
    const char *prog;   /* the binary's name, each message's first word */
    int argc;
    char **argv;
    int i;              /* the last argument taken: the option or its last value */
    int at;             /* the option being parsed */
    int status;         /* 0 while parsing; 2 once an option was refused */
} ds4_cli;

typedef struct {
    const char *names;  /* "-c|--ctx": the spellings, '|'-separated */
    long lo, hi;
} ds4_cli_int_opt;

/* The shared integer options: -c/--ctx, -t/--threads (0: every CPU),
 * -n/--tokens, --prefill-chunk. */
extern const ds4_cli_int_opt ds4_opt_ctx, ds4_opt_threads, ds4_opt_tokens, ds4_opt_prefill_chunk;

void ds4_cli_begin(ds4_cli *c, const char *prog, int argc, char **argv);
/* Moves to the next argument: false at the end, or once one was refused. */
bool ds4_cli_next(ds4_cli *c);
/* Whether the current argument is one of names ("-h|--help"). */
bool ds4_cli_is(const ds4_cli *c, const char *names);
/* If the current argument is one of names: its value into *out. */
bool ds4_cli_str(ds4_cli *c, const char *names, const char **out);
bool ds4_cli_int(ds4_cli *c, const ds4_cli_int_opt *opt, int *out);
/* Refuses the current option (after its value was taken too):
 * "PROG: OPT: bad value 'V' (WHAT)". */
void ds4_cli_bad_value(ds4_cli *c, const char *value, const char *what);
/* Refuses with "PROG: " and the formatted line (an option's own wording). */
void ds4_cli_fail(ds4_cli *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The current argument is no option of this binary. */
void ds4_cli_unknown(ds4_cli *c);

/* --model/-m, --layers, --numerics exact|ds4 (0 | 1, ds4_engine_params.numerics:
 * exact f32, or the FP8 KV / FP4 indexer simulation) */
bool ds4_cli_model(ds4_cli *c, const char **path);
bool ds4_cli_layers(ds4_cli *c, const char **layers);
bool ds4_cli_numerics(ds4_cli *c, int *numerics);
bool ds4_parse_numerics(const char *s, int *out);
/* --temp, --top-p, --min-p, --top-k, --seed */
bool ds4_cli_sampling(ds4_cli *c, ds4_sampler_params *p);
/* --spec-lookup N, 0..DS4_SPEC_MAX_DRAFT (0 = off) */
bool ds4_cli_spec(ds4_cli *c, ds4_spec_params *p);
/* --cuda, --cpu, --gpu-vram N[,N..]|auto, --gpu-devices N[,N..] */
bool ds4_cli_gpu(ds4_cli *c, ds4_gpu_opts *o);
/* --ssd-streaming and its --ssd-streaming-* options */
bool ds4_cli_ssd(ds4_cli *c, ds4_ssd_params *p);
/* --role, --listen/--coordinator HOST PORT, --dist-*, --debug */
bool ds4_cli_dist(ds4_cli *c, ds4_dist_params *p);

/* The option groups' help lines, for usage texts. */
extern const char ds4_spec_usage[], ds4_ssd_usage[], ds4_gpu_usage[], ds4_dist_usage[];

/* For the tools' hand-written loops: the same lines as above. */
void ds4_cli_unknown_option(const char *prog, const char *opt);
void ds4_cli_missing_value(const char *prog, const char *opt);

/* Whether `path` is a regular file this process can read. If not, prints one
 * line that says what to do instead (the demo model `make demo` builds, or
 * ./download_model.sh) and returns false. Checked before the engine opens
 * the file, so a FIFO or a directory is refused instead of blocking. */
bool ds4_cli_model_usable(const char *prog, const char *path);

/* The engine's runtime controls every model-loading binary takes the same
 * way: --dir-steering-file FILE, --dir-steering-ffn F, --dir-steering-attn F
 * (docs/steering.md), --power N (1..100; docs/performance.md) and
 * --warm-weights (page the weights in at load and report the time).
 * ds4_cli_runtime() takes them from the cursor like the other groups;
 * ds4_runtime_apply() copies them into the engine's parameters. */
typedef struct {
    ds4_steering_params steering;
    int power;
    bool warm_weights;      /* --warm-weights */
    int isa;                /* --isa: a ds4_isa_cap, or -1 ($DS4_ISA, else the CPU's best) */
    const char *cpu_affinity; /* --cpu-affinity LIST, checked for its shape; NULL: not given */
} ds4_runtime_opts;
void ds4_runtime_opts_default(ds4_runtime_opts *o);
bool ds4_cli_runtime(ds4_cli *c, ds4_runtime_opts *o);
void ds4_runtime_apply(const ds4_runtime_opts *o, ds4_engine_params *ep);
extern const char ds4_runtime_usage[];

/* The process-wide CPU settings, which ds4_cli_runtime() takes too
 * (ds4-eval, which has no runtime group, takes them alone):
 * --isa scalar|avx2|avxvnni|avx512|amx: the highest CPU kernel level to run
 *   (kernels/kernels_cpu.h; avx2 without AVX-VNNI, avxvnni with it), for
 *   measuring and testing a lower level on a better CPU; *isa: a ds4_isa_cap.
 * --cpu-affinity LIST: pin the thread pools' threads in order to the CPUs of
 *   LIST ("0-3,8": numbers and ascending ranges, each CPU once;
 *   base/threadpool.h says which thread gets which). */
bool ds4_cli_cpu(ds4_cli *c, int *isa, const char **cpu_affinity);
extern const char ds4_cpu_usage[]; /* their help lines, also in ds4_runtime_usage */
/* Applies them once, after parsing and before any kernel runs or pool is
 * made. The level: `isa` when >= 0, else $DS4_ISA when set and not empty; a
 * level above the CPU's (avxvnni on a CPU without AVX-VNNI: avx2) runs the
 * best the CPU has below it, after one warning line. A bad
 * $DS4_ISA, or a CPU list naming a CPU this process may not run on, is
 * refused with one line ("PROG: DS4_ISA: bad value ...", "PROG:
 * --cpu-affinity 0,7: CPU 7 is not one ...") and false (the binary exits 2). */
bool ds4_cpu_select(const char *prog, int isa, const char *cpu_affinity);

#endif
