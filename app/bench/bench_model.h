/* bench_model.h -- the model benchmark behind `ds4-bench -m MODEL`.
 *
 * Contract
 * - Loads the model once and walks one fixed token sequence (the tokenized
 *   prompt file repeated as needed, or, for a model without a tokenizer or
 *   without a prompt file, a fixed pseudo-random sequence) to context
 *   frontiers ctx_start, then +step_incr (or *step_mul) up to ctx_max. The
 *   prompt file's name and token count go to stderr. ds4-bench gives the
 *   committed novel (data/bench/) when no --prompt-file is given.
 * - Before the first row an untimed warm-up prefills up to 128 tokens (fewer
 *   if the session is smaller) and decodes one, then restores the empty
 *   state, so first-touch page faults of the mmapped weights do not land in
 *   the figures.
 * - Prefill is incremental: each row times only the tokens added since the
 *   previous frontier. At each frontier the live state is snapshotted in
 *   memory, gen_tokens greedy tokens are decoded (never EOS: the best non-EOS
 *   token is taken) and timed, and the snapshot is restored before the walk
 *   continues, so generation never perturbs the prefill path.
 * - Output: CSV on `out`, header "frontier,prefill_tps,gen_tps,kvcache_bytes",
 *   one row per frontier; kvcache_bytes is the session state a context of
 *   that many tokens needs. With --ssd-streaming the row adds the expert
 *   cache counters of its generation phase: gen_hit_rate, gen_mib_per_token
 *   (MiB read from disk per generated token), read_mib_s (while reads were in
 *   flight) and gen_stall_s (decode time spent waiting for reads). Never asserts; returns 0, or -1 with a one-line
 *   message on stderr.
 */
#ifndef DS4_BENCH_MODEL_H
#define DS4_BENCH_MODEL_H

#include <stdio.h>
#include "engine/engine.h"
#include "backends/cuda/cuda_plan.h"
#include "options/cli_args.h"

typedef struct {
    const char *model_path, *prompt_file;
    bool chat_prompt;                   /* --chat-prompt-file: the file is one user turn, rendered as chat */
    int ctx_alloc;                      /* --ctx-alloc N: the session's context (0: what the run needs) */
    int threads, prefill_chunk, numerics;
    const char *layers;     /* --layers A:B | A:output */
    ds4_dist_params dist;   /* --role coordinator ... */
    int ctx_start, ctx_max, step_incr, gen_tokens;
    double step_mul;                    /* > 1: geometric frontiers instead of step_incr */
    ds4_ssd_params ssd;                 /* --ssd-streaming*: adds the expert cache columns */
    /* ds4_bench_sessions: the session counts to compare and runs per count */
    int session_counts[16], n_session_counts, repeat, prompt_tokens;
    ds4_gpu_opts gpu;                   /* backend and placement (cuda_plan.h) */
    ds4_runtime_opts runtime;           /* --dir-steering-*, --power (cli_args.h) */
    const char *mtp_path;               /* --mtp FILE: --spec-verify also times the MTP drafter */
    const char *dspark_path;            /* --dspark FILE: the same for the DSpark drafter */
} ds4_bench_model_params;

void ds4_bench_model_defaults(ds4_bench_model_params *p);
int ds4_bench_model(const ds4_bench_model_params *p, FILE *out);

/* `ds4-bench -m MODEL --sessions 1,2,4,8,16`: up to max(counts) sessions,
 * each prefilled with prompt_tokens tokens (session i's prompt starts i tokens
 * into the fixed sequence), then for each count N the first N sessions decode
 * gen_tokens greedy tokens together through ds4_sessions_step() and rewind;
 * counts interleave, `repeat` runs each. Prints a Markdown table: per-session
 * and aggregate decode tokens/s (min / median / max), the median aggregate
 * against one session, and the weight bytes read per generated token. */
int ds4_bench_sessions(const ds4_bench_model_params *p, FILE *out);

/* `ds4-bench -m MODEL --spec-verify`: after prompt_tokens tokens, the time of
 * one pass appending k + 1 = 1..9 tokens with every position's logits (what
 * speculative verification runs) against a 1-token decode, median of
 * `repeat` interleaved runs, with the weight bytes each pass read and the
 * tokens/s a pass gives when every draft is accepted (k + 1 tokens) and when
 * none is (1 token). With mtp_path (or dspark_path) it also times the MTP
 * (or DSpark) drafter proposing the pass's k drafts at that depth (a DSpark
 * block proposes at most its block size) and gives the full-acceptance
 * tokens/s net of that cost. A Markdown table; never asserts. */
int ds4_bench_spec_verify(const ds4_bench_model_params *p, FILE *out);

#endif
