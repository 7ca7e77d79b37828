/* tp.h -- tensor parallelism over two hosts (docs/distributed.md): both
 * processes evaluate every token together, each computing half of every
 * layer's routed experts, over one NNG pair connection.
 *
 * Contract
 * - Roles (--tensor-parallel with --role): the coordinator (--listen HOST
 *   PORT) runs the engine, owns tokenization, sampling and the sessions,
 *   and computes the shared expert, the routed experts [0, n/2) and the
 *   first half of every layer's query heads (by output group) and out_b
 *   rows; the worker (--coordinator HOST PORT) the routed experts
 *   [n/2, n) and the other halves. The KV row, compressors, indexer,
 *   router, hyper-connections and embedding run on both (replicated); the
 *   vocabulary head is row-sharded, the worker sending its half of the
 *   logits (both bind the whole model). Each process reads only the
 *   weights it uses.
 * - The split arithmetic is forward_cpu.h's (ds4_cpu_backend_split): three
 *   exchanges per layer and one per 16 rows of logits, every value the
 *   single process's, so logits,
 *   states and sampled tokens are the single process's bit for bit, in
 *   batched prefill and token by token alike. token_prefill
 *   (--tensor-parallel-token-prefill) evaluates a prefill one token per
 *   step, as decode does.
 * - Registration: the worker dials and runs the pipeline's challenge-
 *   response (dist_proto.h: KNOCK, CHALLENGE with the coordinator's proof,
 *   HELLO sealed under the handshake key, WELCOME or REFUSED); the HELLO
 *   must name the same model, expert quant and numerics. Afterwards every
 *   frame is sealed, coordinator to worker under the link key of the
 *   coordinator's nonce Nc, worker to coordinator under that of the
 *   worker's nonce Nw (HMAC-SHA1(secret, "ds4 link" N)), and carries its
 *   sender's frame counter: a frame failing its seal, out of order or sent
 *   again ends the connection. A coordinator thread answers registrations
 *   whenever they come; one worker at a time.
 * - Lockstep: a coordinator step sends the worker, before it evaluates,
 *   the whole state (TP_STATE) of every session the worker does not hold as
 *   the coordinator does (new worker, state restored or loaded: the
 *   backend's kv_sync(to device) and kv_scatter mark it), then one TP_STEP
 *   with the batch (session, context, position, tokens) and the sessions
 *   freed since. The worker truncates a session the coordinator rewound
 *   (the same ds4_kv_truncate the engine's rewind made) and refuses, with
 *   a line the coordinator reports, a position it cannot reach.
 * - Faults: a worker that goes away (connection closed) or stays silent
 *   for reply_seconds fails the step with one line; the coordinator puts
 *   its states back where they were before the step (ds4_kv_undo) and waits
 *   up to wait_seconds for a worker at the next step; a new worker gets
 *   every session's state before its first step. A worker whose coordinator
 *   goes away drops its sessions and registers again.
 * - debug: per step, rows, layers exchanged, bytes each way and the time
 *   spent waiting at the exchanges, on the log.
 * - Transport: TCP (or NNG's tls+tcp with --dist-tls-*); --transport rdma
 *   is refused by ds4_tp_check_options() in a build without RDMA support.
 */
#ifndef DS4_TP_H
#define DS4_TP_H

#include <stdbool.h>
#include <stddef.h>

#include "dist/dist.h"

struct ds4_backend;
struct ds4_model;

/* One line in err for a tensor-parallel option this build or role cannot
 * honour (--transport rdma without RDMA support). */
bool ds4_tp_check_options(const ds4_dist_params *p, char *err, size_t errlen);

/* Takes ownership of local, the CPU backend over the whole model. */
struct ds4_backend *ds4_tp_coordinator_new(struct ds4_backend *local, const struct ds4_model *m,
                                           const ds4_dist_params *p, bool numerics, char *err, size_t errlen);

/* The worker loop over m (every layer, no output head) and be, the CPU
 * backend over it; serves until refused or killed, freeing neither. A
 * process exit status (1 after one line on the log). */
int ds4_tp_worker_serve(const struct ds4_model *m, struct ds4_backend *be, bool numerics, int ctx,
                        const ds4_dist_params *p);

#endif
