/* engine.h -- the public C API every front end uses (ds4, ds4-server,
 * ds4-bench, ds4-agent). Front ends never reach into kernels,
 * model binding or the forward pass directly.
 *
 * Contract
 * - ds4_engine_load() opens the GGUF (mmapped), binds and validates the
 *   layout of its family by general.architecture (deepseek4: DeepSeek V4;
 *   glm-dsa: GLM 5.2; model_family.h), every dimension from metadata,
 *   loads the tokenizer from the same file, creates the backend (CPU, or CUDA
 *   with gpu.backend; no silent fallback when CUDA was asked for) and thread
 *   pool. On error: NULL and one clear line in err ("not a DeepSeek V4 GGUF:
 *   missing tensor blk.3.ffn...", "not a GLM 5.2 GGUF: ..."). GLM runs on
 *   the CPU in f32 math; the DeepSeek-only options (ssd, numerics ds4, cuda,
 *   layers, dist role) refuse a GLM file with one line naming the option.
 * - A session is one conversation's decode state (DeepSeek V4: KV rings,
 *   compressed rows, indexer rows, compressor frontiers; GLM: glm_kv.h)
 *   sized for `ctx` tokens, plus the checkpoint token list and the logits
 *   for the next token. Every call below works the same for both families.
 * - ds4_session_prefill() appends tokens (chunked by prefill_chunk) and leaves
 *   the next-token logits of the last one; ds4_session_decode() appends one.
 *   Results do not depend on chunking or on batching with other sessions:
 *   they are bit-identical.
 * - ds4_session_rewind() truncates the checkpoint to n tokens (prefix reuse);
 *   it may need to recompute state for the last partial compression window,
 *   which it does itself (GLM keeps every position: only the last kept
 *   token is recomputed, for its logits).
 * - Progress callbacks may request cancellation by returning nonzero; the
 *   session then holds a consistent (shorter) checkpoint.
 * - ssd.enabled (--ssd-streaming): the routed experts are read from the file
 *   into a bounded expert cache (expert_cache.h) instead of being mapped; the
 *   rest of the weights is made resident. Logits equal the mapped path bit
 *   for bit. Load prints one report line (resident bytes, slots, working
 *   set) unless quiet, and refuses with one line when the budget cannot work.
 *   An expert read failure (truncated file, I/O error) fails that call and
 *   every later one of this engine with the same line (the file changed
 *   under it: restart); it is the one failure that does not leave the
 *   engine usable.
 * - Weights in RAM at load: on the CPU backend, a model that binds all its
 *   file holds (a whole model, or a layer range file bound to its own range,
 *   as pipeline processes over split files are; no ssd.enabled) whose files
 *   fit in the memory available (MemAvailable and the cgroup limit) is
 *   paged into the mapping
 *   at load (ds4_gguf_populate), so the first prompt takes no page faults on
 *   the weights; a model that does not fit stays lazily mapped. A kernel that
 *   refuses leaves the mapping lazy with one note (unless quiet). After the
 *   page-in, weights the page cache holds in 4 KiB pages are re-read into
 *   2 MiB ones where a probe piece shows the kernel can
 *   (ds4_gguf_prefer_large_pages): same bytes at the same addresses, and the
 *   load line says what share was in 2 MiB pages before and after.
 *   warm_weights (--warm-weights) pages the file in whatever the backend,
 *   slice or size (not with ssd.enabled); the load line reports the time.
 *   lazy_weights (--inspect) never pages in.
 * - Not thread-safe: one engine serves all its sessions from one thread at a
 *   time (the backend's scratch is shared); ds4_sessions_step() is how
 *   several sessions advance together.
 * - layers (--layers A:B, A:output; model.h): only that slice's tensors are
 *   bound and touched, the embedding with layer 0, the head with "output";
 *   a file holding a layer range loads with its own range by default. An
 *   engine holding less than the whole model loads (CPU backend only) but
 *   refuses prefill/decode with one line unless it is a pipeline coordinator
 *   (dist.role), whose backend runs the other layers on its workers.
 * - ds4_engine_serve_worker() makes the process a pipeline worker over the
 *   slice it loaded (dist.role = worker): the engine's own model and backend
 *   go to the worker loop (dist.h), which registers with the coordinator in
 *   p and serves until refused or killed. Returns a process exit status (1
 *   after one line in the log); a family without pipeline support was
 *   refused at load.
 * - steering (--dir-steering-*, nn/steering.h): every layer's FFN and/or
 *   attention output of every sequence loses (positive scale) or gains
 *   (negative) its component along the file's direction for that layer, in
 *   prefill, decode and batched steps alike; no file or zero scales is the
 *   unsteered computation bit for bit. Every backend: CPU, CUDA, and
 *   each pipeline slice for its own layers' rows, every slice holding the
 *   same file (dist.h). A file of the wrong size is refused
 *   with one line.
 * - power (--power N, power.h): each evaluation and, on the CPU backends,
 *   each layer of it is followed by a sleep in proportion to its compute
 *   time; outputs are unchanged.
 * - Allocation failures are errors (NULL / -1 with err), never crashes; a
 *   failed call leaves the engine and its sessions usable.
 */
#ifndef DS4_ENGINE_H
#define DS4_ENGINE_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdbool.h>
#include "backends/backend.h"
#include "base/byte_stream.h"

struct ds4_tokenizer;

typedef struct ds4_engine ds4_engine;
typedef struct ds4_session ds4_session;

#include "models/engine_params.h"

/* false when the engine does not stream experts */
bool ds4_engine_ssd_stats(const ds4_engine *e, ds4_ssd_stats *out);


void ds4_engine_params_default(ds4_engine_params *p);
ds4_engine *ds4_engine_load(const ds4_engine_params *p, char *err, size_t errlen);
void ds4_engine_free(ds4_engine *e);
int ds4_engine_serve_worker(ds4_engine *e, int ctx, const ds4_dist_params *p);

/* The chat side of the loaded file's family (chat_spec.h): front ends take
 * the chat format, tool-call parser and protocol strings from it;
 * everything else in this API works the same for every family. */
struct ds4_chat_spec;
const struct ds4_chat_spec *ds4_engine_chat(const ds4_engine *e);
const struct ds4_tokenizer *ds4_engine_tokenizer(const ds4_engine *e);
/* The model file as mapped: its tensors' data pointers are the weights the
 * backend reads. */
const struct ds4_gguf *ds4_engine_gguf(const ds4_engine *e);
/* Every matrix product's input rows go to fn from now on (fn NULL: off).
 * Only a family whose backend computes where it can watch offers it (today
 * DeepSeek V4's CPU backend without --ssd-streaming or pipeline
 * parallelism): false with one line in err otherwise. */
bool ds4_engine_observe_matmuls(ds4_engine *e, ds4_matmul_observer fn, void *ud, char *err, size_t errlen);
int ds4_engine_n_vocab(const ds4_engine *e);
int ds4_engine_n_layers(const ds4_engine *e);
int ds4_engine_n_embd(const ds4_engine *e);     /* the hidden width (a steering file's row) */
/* --inspect: the model's metadata (scalar keys; arrays by element type and
 * count), its tensor mix (count, bytes and share per storage type) and the
 * memory plan (weights, resident now, one session of ctx tokens, the
 * backend) as plain text. */
void ds4_engine_inspect(const ds4_engine *e, int ctx, FILE *out);
int ds4_engine_train_ctx(const ds4_engine *e);
/* routed-expert quant bits of this file (2 or 4; 8/16/32 for test models) */
int ds4_engine_expert_bits(const ds4_engine *e);
const char *ds4_engine_model_name(const ds4_engine *e);
uint64_t ds4_engine_model_bytes(const ds4_engine *e);
/* Bytes one session of ctx tokens allocates (KV state, its rewind
 * checkpoint slots, token list, logits): what ds4_session_new() needs. */
uint64_t ds4_engine_kv_bytes(const ds4_engine *e, int ctx);
/* Most tokens one ds4_sessions_step() evaluates (the prefill chunk). */
int ds4_engine_max_batch(const ds4_engine *e);
/* Weight bytes the backend's matrix products have read since load: a batch
 * reads each weight once for all its rows (benchmarks report it per token). */
uint64_t ds4_engine_weight_bytes_read(const ds4_engine *e);

typedef int (*ds4_progress_fn)(void *ud, int done, int total);

ds4_session *ds4_session_new(ds4_engine *e, int ctx, char *err, size_t errlen);
void ds4_session_free(ds4_session *s);
int ds4_session_ctx(const ds4_session *s);
/* TEST-ONLY: DS4_TEST_FAIL_DECODE_AFTER=N in the environment (read once by
 * ds4_engine_load) makes every ds4_generate() on this engine's sessions fail
 * its decode after N generated tokens, so tests can drive the decode-error
 * answers of the front ends end to end. -1 when unset; never set it in use. */
int ds4_session_test_fail_decode_after(const ds4_session *s);
int ds4_session_n_tokens(const ds4_session *s);
int ds4_session_n_vocab(const ds4_session *s);
const int32_t *ds4_session_tokens(const ds4_session *s);
/* next-token logits after the checkpoint (n_vocab floats); NULL when empty */
const float *ds4_session_logits(const ds4_session *s);

/* Directional steering (docs/steering.md): a session starts with the
 * engine's --dir-steering-* scales; ds4_session_set_steering() gives it its
 * own scales over the engine's file (0, 0: unsteered) for the tokens it
 * evaluates from then on. The state it already holds is not recomputed, so
 * change scales only on an empty session (or one whose tokens were computed
 * with the same scales). -1 with err when the engine has no file or a scale
 * is not finite. */
bool ds4_engine_has_steering(const ds4_engine *e);
/* The scales new sessions start with (0, 0 without a file), and a session's. */
void ds4_engine_steering(const ds4_engine *e, float *ffn, float *attn);
void ds4_session_steering(const ds4_session *s, float *ffn, float *attn);
int ds4_session_set_steering(ds4_session *s, float ffn, float attn, char *err, size_t errlen);

/* --dump-activations: while a probe (nn/steering.h, n_layers x the model's
 * width) is attached, every row the session evaluates adds its chosen
 * sublayer output of each layer into the probe's sums. NULL detaches it.
 * CPU backends only; -1 with err otherwise or on a shape mismatch. */
struct ds4_act_probe;
int ds4_session_probe(ds4_session *s, struct ds4_act_probe *probe, char *err, size_t errlen);

/* Append n tokens. If all_logits is non-NULL it receives n x n_vocab logits
 * (position i's next-token logits), for eval/echo/oracle tests.
 * Returns 0, -1 on error (err), 1 if cancelled by progress. */
int ds4_session_prefill(ds4_session *s, const int32_t *toks, int n, float *all_logits,
                        ds4_progress_fn progress, void *ud, char *err, size_t errlen);
int ds4_session_decode(ds4_session *s, int32_t tok, char *err, size_t errlen);
int ds4_session_rewind(ds4_session *s, int n_tokens, char *err, size_t errlen);
/* Drops the last tokens without recomputing: the state goes back to n_tokens
 * and `logits` (n_vocab floats, the next-token logits after token
 * n_tokens - 1, which the caller kept from the pass that computed them)
 * become the session's. The state then equals having appended only the first
 * n_tokens. A drop deeper than the state keeps (DeepSeek V4's rings hold 256
 * positions of slack; speculative verification drops at most its draft)
 * recomputes from a checkpoint like ds4_session_rewind(). Returns 0, or -1
 * (err). */
int ds4_session_truncate(ds4_session *s, int n_tokens, const float *logits, char *err, size_t errlen);

/* --mtp FILE / --mtp FILE --dspark (engine params mtp_path / dspark_path, never
 * both): a draft model bound from a support file made for this model
 * (DeepSeek V4: the one-stage MTP block or the DSpark block drafter, CPU
 * backend only); a file for another model, or one that does not bind, fails
 * the load with one line. ds4_session_draft() proposes up to max tokens the
 * draft model expects after the session's tokens and `last` (the token about
 * to be appended), greedily, stopping at the first whose logit leads the
 * runner-up by less than margin (MTP) or where the block prefix's confidence
 * falls below margin (DSpark); returns how many, 0 without a draft model
 * (or a DSpark drafter that lost the context after a restore), -1 with err. It never changes the session: tokens, logits and state stay
 * as they were (the draft model keeps its own state, rebuilt from the
 * session's evaluations and never saved with it). */
bool ds4_engine_has_draft(const ds4_engine *e);
int ds4_session_draft(ds4_session *s, int32_t last, int max, float margin, int32_t *out, char *err, size_t errlen);
/* The draft model's logits for the token after `last` (n_vocab floats):
 * what ds4_session_draft() picks its first proposal from (oracle tests,
 * --dump-mtp-logits). -1 with err without a draft model or on an empty
 * session; after a restore, before a window of tokens was evaluated again,
 * MTP's come from the rows it has, and DSpark has none (-1). */
int ds4_session_draft_logits(ds4_session *s, int32_t last, float *logits, char *err, size_t errlen);

/* Several sessions advanced by one batched pass: each step appends its n >= 1
 * tokens (1 = a decode step, more = a prefill chunk) to its own session and
 * leaves that session's next-token logits. Sessions must be distinct and
 * belong to this engine; the tokens of all steps together must not exceed
 * ds4_engine_max_batch(). Every session's logits and state are bit-identical
 * to advancing it alone (backend.h), so batching never changes an answer.
 * Returns 0, or -1 (err) with no session changed. */
typedef struct {
    ds4_session *session;
    const int32_t *toks;
    int n;
} ds4_step;
int ds4_sessions_step(ds4_engine *e, const ds4_step *steps, int n_steps, char *err, size_t errlen);

/* In-memory snapshot of the full decode state (exact; restore is bit-identical). */
typedef struct ds4_snapshot ds4_snapshot;
ds4_snapshot *ds4_session_snapshot(const ds4_session *s);
int ds4_session_restore(ds4_session *s, const ds4_snapshot *snap, char *err, size_t errlen);
void ds4_snapshot_free(ds4_snapshot *snap);

/* The session payload of the model's family (DSV4, kv_payload.h; GLM,
 * glm_payload.h): the same exact state as bytes, for the disk KV cache; a
 * payload of the other family is refused with one line. Loading validates everything first and leaves the
 * session unchanged on error; it accepts payloads saved for a context no
 * larger than this session's. */
size_t ds4_session_payload_bytes(const ds4_session *s);
void ds4_session_save_payload(const ds4_session *s, void *dst);
int ds4_session_load_payload(ds4_session *s, const void *src, size_t n, char *err, size_t errlen);
/* Streaming forms (byte_stream.h) for files: save returns false when the sink
 * failed; load reads exactly n bytes and leaves the session unchanged on a
 * validation error, empty when src fails part-way through the rows. */
bool ds4_session_save_payload_to(const ds4_session *s, const ds4_sink *sink);
int ds4_session_load_payload_from(ds4_session *s, const ds4_source *src, size_t n, char *err, size_t errlen);

#endif
