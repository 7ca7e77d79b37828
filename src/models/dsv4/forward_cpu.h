/* forward_cpu.h -- the CPU backend: the DS4 forward pass over a session state.
 *
 * Contract
 * - ds4_cpu_backend_new() creates a backend (see backend.h) for a bound model:
 *   a thread pool of n_threads (<= 0: all CPUs) and scratch that grows to the
 *   largest batch seen (at most max_batch rows); a grow that fails leaves the
 *   previous scratch in place and the call fails cleanly.
 * - One eval() processes all rows of all its sequences layer-major: every
 *   matrix product over the batch is one ds4_matmul (a single row uses
 *   ds4_matvec); routed experts gather their rows from every sequence, so
 *   each selected expert is read once per call and group of up to 64 of its
 *   rows (a group runs whole on one thread; all groups of a layer share one
 *   pool run, --ssd-streaming splits each expert over the pool instead);
 *   compressors, indexer and
 *   attention read and write each row's own state. Decode is a batch of one
 *   row per session.
 * - Bit-exact as backend.h requires: per-row activation quantization, kernels
 *   whose (row, token) dot does not depend on the batch (kernels_cpu.h),
 *   attention whose per-head arithmetic does not depend on the heads sharing
 *   a call (attn_cpu.h), and compressor windows and frontiers carried across
 *   calls.
 * - numerics = true adds ds4's simulation of the reference graph's storage
 *   precision: FP8 (E4M3) round trip of the non-rotary KV dims in blocks of
 *   64, F16 storage of raw/compressed/indexer rows, Hadamard + FP4 (E2M1)
 *   round trip of indexer queries and rows. false = plain f32 math, matching
 *   transformers. ds4_cpu_numerics_supported() says whether the geometry
 *   allows it (non-rotary dims a multiple of 64, indexer head a power of two
 *   and a multiple of 32).
 * - ds4_cpu_backend_stream_experts() makes the routed experts come from an
 *   expert cache (expert_cache.h) instead of the mapping; an expert read
 *   failure fails the eval with the cache's message. With predict, batches
 *   of fewer than n_expert routed rows also start reading the next layer's
 *   guessed experts (its router on this layer's FFN input; the token's row
 *   on hash layers) before this layer's experts are computed, and a
 *   hash-routed first layer's experts before its attention.
 * - ds4_cpu_backend_split() (tensor parallelism, dist/tp.h) makes this
 *   backend one of two ranks that evaluate the same batch together: rank 0
 *   computes the shared expert and the routed experts [0, mid), rank 1 the
 *   routed experts [mid, n_expert). When ds4_cpu_split_heads() (an even
 *   number of output groups and an even n_embd), attention is split too:
 *   each rank computes the query heads of its half of the output groups
 *   (q_b's rows, the attention itself, out_a's groups) and half of out_b's
 *   rows; the KV row, compressors, indexer, router and hyper-connections
 *   are computed by both. exchange is called three times per layer, gate
 *   3l + k: k = 0 and 1 swap the ranks' halves (the group latents, then the
 *   out_b rows: each sends its own columns of every token and receives the
 *   other's); k = 2 is the FFN: rank 0 sends its partial sum (shared expert
 *   plus its experts, T x n_embd floats) and receives rank 1's slot outputs
 *   (one n_embd row per selected slot of an expert >= mid, in the single
 *   process's expert-major order), rank 1 the other way round, and both add
 *   rank 1's slots in ascending expert order, where the single process's
 *   sum adds them. The output head is split by vocabulary rows, HEAD_CHUNK
 *   token rows per exchange (gates 3 x n_layer + i, i counting the eval's
 *   head exchanges): rank 1 sends its half's logits and writes no logits
 *   (its sequences' logits may be NULL); rank 0 receives them and writes
 *   every logit. So rank 0's logits and both ranks' states and hidden
 *   states are the single process's bit for bit. exchange must fill recv (with anything,
 *   on a failed link: the caller then fails the eval and restores the
 *   states). Requires the per-thread expert path (no --ssd-streaming). A
 *   rank reads only its own experts' and heads' weights.
 * - The round-trip helpers are exposed for unit tests; n is a multiple of the
 *   block (64 for FP8, 32 for FP4), Hadamard needs a power of two.
 * - ds4_rope_inv_freq() is the RoPE (yarn = false) or YaRN inverse-frequency
 *   table (n_rot/2 floats, malloc'd, NULL when out of memory), shared with
 *   the CUDA backend so both rotate by the same angles.
 */
#ifndef DS4_FORWARD_CPU_H
#define DS4_FORWARD_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include "backends/backend.h"
#include "models/dsv4/model.h"
#include "nn/tp_split.h"

/* From now on every matrix product of this backend's evals goes to fn
 * first (NULL: off). */
void ds4_cpu_backend_observe(ds4_backend *be, ds4_matmul_observer fn, void *ud);

/* false when out of memory (no split then) */
bool ds4_cpu_backend_split(ds4_backend *be, const ds4_cpu_split *sp);
bool ds4_cpu_split_heads(const ds4_config *c);

ds4_backend *ds4_cpu_backend_new(const ds4_model *m, int n_threads, int max_batch, bool numerics,
                                 char *err, size_t errlen);
/* A backend for another model (the MTP block) that runs on host's thread
 * pool, one call at a time with host (the engine is single-threaded); host,
 * a CPU backend, must outlive it. */
ds4_backend *ds4_cpu_backend_new_sibling(const ds4_model *m, ds4_backend *host, int max_batch, bool numerics,
                                         char *err, size_t errlen);
bool ds4_cpu_numerics_supported(const ds4_config *c);
int ds4_cpu_backend_threads(const ds4_backend *be);
/* The backend's thread pool, for work another model runs between its evals
 * on the same threads (the DSpark drafter); be must outlive its users. */
struct ds4_pool *ds4_cpu_backend_pool(ds4_backend *be);
struct ds4_expert_cache;
void ds4_cpu_backend_stream_experts(ds4_backend *be, struct ds4_expert_cache *experts, bool predict);

void ds4_fp8_e4m3_roundtrip(float *x, int n);
void ds4_fp4_e2m1_roundtrip(float *x, int n);
void ds4_hadamard(float *x, int n);
float *ds4_rope_inv_freq(const ds4_config *c, bool yarn);

#endif
