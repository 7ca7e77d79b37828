/* engine.h -- the public C API every front end uses (ds4, ds4-server,
 * ds4-bench). Front ends never reach into kernels,
 * model binding or the forward pass directly.
 *
 * Contract
 * - ds4_engine_load() opens the GGUF (mmapped), binds and validates the DS4
 *   layout (every dimension from metadata), loads the tokenizer from the same
 *   file, creates the backend (CPU, or CUDA with gpu.backend; no silent
 *   fallback when CUDA was asked for) and thread pool. On error: NULL and one
 *   clear line in err ("not a DeepSeek V4 GGUF: missing tensor blk.3.ffn...").
 * - A session is one conversation's decode state (KV rings, compressed rows,
 *   indexer rows, compressor frontiers) sized for `ctx` tokens, plus the
 *   checkpoint token list and the logits for the next token.
 * - ds4_session_prefill() appends tokens (chunked by prefill_chunk) and leaves
 *   the next-token logits of the last one; ds4_session_decode() appends one.
 *   Results do not depend on chunking beyond float rounding.
 * - ds4_session_rewind() truncates the checkpoint to n tokens (prefix reuse);
 *   it may need to recompute state for the last partial compression window,
 *   which it does itself.
 * - Progress callbacks may request cancellation by returning nonzero; the
 *   session then holds a consistent (shorter) checkpoint.
 * - Not thread-safe per session; one engine may serve several sessions from
 *   one thread at a time (the backend's scratch is shared).
 */
#ifndef DS4_ENGINE_H
#define DS4_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "cuda_plan.h"

struct ds4_tokenizer;

typedef struct ds4_engine ds4_engine;
typedef struct ds4_session ds4_session;

typedef struct {
    const char *model_path;
    int n_threads;          /* <= 0: all online CPUs */
    int prefill_chunk;      /* <= 0: 4096 */
    int numerics;           /* -1: default (ds4 simulation on for real models), 0: exact f32, 1: ds4 simulation */
    bool quiet;             /* no load report on stderr */
    ds4_gpu_opts gpu;       /* backend choice and GPU placement (cuda_plan.h) */
    int gpu_ctx;            /* context the GPU placement reserves KV for (<= 0: 32768) */
} ds4_engine_params;

void ds4_engine_params_default(ds4_engine_params *p);
ds4_engine *ds4_engine_load(const ds4_engine_params *p, char *err, size_t errlen);
void ds4_engine_free(ds4_engine *e);

const struct ds4_tokenizer *ds4_engine_tokenizer(const ds4_engine *e);
int ds4_engine_n_vocab(const ds4_engine *e);
int ds4_engine_n_layers(const ds4_engine *e);
int ds4_engine_train_ctx(const ds4_engine *e);
/* routed-expert quant bits of this file (2 or 4; 8/16/32 for test models) */
int ds4_engine_expert_bits(const ds4_engine *e);
const char *ds4_engine_model_name(const ds4_engine *e);
uint64_t ds4_engine_model_bytes(const ds4_engine *e);
/* KV/session bytes per token of context and fixed bytes, for reporting */
uint64_t ds4_engine_kv_bytes(const ds4_engine *e, int ctx);

typedef int (*ds4_progress_fn)(void *ud, int done, int total);

ds4_session *ds4_session_new(ds4_engine *e, int ctx, char *err, size_t errlen);
void ds4_session_free(ds4_session *s);
int ds4_session_ctx(const ds4_session *s);
int ds4_session_n_tokens(const ds4_session *s);
const int32_t *ds4_session_tokens(const ds4_session *s);
/* next-token logits after the checkpoint (n_vocab floats); NULL when empty */
const float *ds4_session_logits(const ds4_session *s);

/* Append n tokens. If all_logits is non-NULL it receives n x n_vocab logits
 * (position i's next-token logits), for eval/echo/oracle tests.
 * Returns 0, -1 on error (err), 1 if cancelled by progress. */
int ds4_session_prefill(ds4_session *s, const int32_t *toks, int n, float *all_logits,
                        ds4_progress_fn progress, void *ud, char *err, size_t errlen);
int ds4_session_decode(ds4_session *s, int32_t tok, char *err, size_t errlen);
int ds4_session_rewind(ds4_session *s, int n_tokens, char *err, size_t errlen);

/* In-memory snapshot of the full decode state (exact; restore is bit-identical). */
typedef struct ds4_snapshot ds4_snapshot;
ds4_snapshot *ds4_session_snapshot(const ds4_session *s);
int ds4_session_restore(ds4_session *s, const ds4_snapshot *snap, char *err, size_t errlen);
void ds4_snapshot_free(ds4_snapshot *snap);

/* The DSV4 session payload (kv_payload.h): the same exact state as bytes, for
 * the disk KV cache. Loading validates everything first and leaves the
 * session unchanged on error; it accepts payloads saved for a context no
 * larger than this session's. */
size_t ds4_session_payload_bytes(const ds4_session *s);
void ds4_session_save_payload(const ds4_session *s, void *dst);
int ds4_session_load_payload(ds4_session *s, const void *src, size_t n, char *err, size_t errlen);

#endif
