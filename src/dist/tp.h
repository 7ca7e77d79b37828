/* tp.h -- tensor parallelism over two hosts (docs/distributed.md): both
 * processes evaluate every token together, each computing half of every
 * layer's routed experts, over one NNG pair connection.
 *
 * Contract
 * - Roles (--tensor-parallel with --role): the coordinator (--listen HOST
 *   PORT) runs the engine, owns tokenization, sampling and the sessions,
 *   and computes the routed experts [0, n/2) and the first half of every
 *   layer's query heads, attention output rows and shared expert rows
 *   (its activation's, then its output's); the worker (--coordinator HOST
 *   PORT) the routed experts [n/2, n) and the other halves. What is left (the KV rows, indexers, router, ...)
 *   runs on both (replicated); the vocabulary head is row-sharded, the
 *   worker sending its half of the logits (both bind the whole model).
 *   Each process reads only the weights it uses.
 * - The split arithmetic is the family's (ds4_tp_family.split: DeepSeek
 *   V4's forward_cpu.h ds4_cpu_backend_split, GLM 5.2's glm_forward.h
 *   ds4_glm_forward_split): up to four exchanges per layer (tp_split.h's
 *   gates; the shared expert's goes out before the routed experts run and
 *   is taken after, so its transfer overlaps them) and one per 16
 *   rows of logits, every value the single process's, so logits,
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
#include "nn/tp_split.h"

struct ds4_backend;

/* What tensor parallelism needs of a model family (its bound model, its
 * CPU backend's split, its session states), so this module names none:
 * dsv4_family.c and glm_family.c fill it. The state functions act on the
 * family's state (what ds4_backend_seq carries); state_save writes
 * state_bytes() bytes that state_load restores bit for bit into a state of
 * the same context (false, the state empty or unchanged, on bytes that do
 * not fit); undo_save records what an evaluation of n more rows changes,
 * undo_apply puts it back. */
typedef struct ds4_tp_family {
    const void *m;
    const char *backend;        /* the name of its CPU backend (backend.h name) */
    const char *name;           /* the model's, for the HELLO */
    int n_layer, n_embd, n_hc, n_vocab, n_expert, expert_bits;
    bool whole;                 /* it binds every layer and the output head */
    size_t row_floats;          /* the most floats a layer exchange carries per row */
    bool (*split)(struct ds4_backend *be, const ds4_cpu_split *sp);
    size_t (*state_max)(const void *m, int ctx);    /* state_bytes() of a full ctx-token state at most */
    void *(*state_new)(const void *m, int ctx);     /* NULL: out of memory */
    void (*state_free)(void *st);
    int (*state_pos)(const void *st);
    int (*state_ctx)(const void *st);
    void (*state_reset)(void *st);
    bool (*state_truncate)(void *st, int n);        /* false: not reachable (then reset) */
    size_t (*state_bytes)(const void *m, const void *st);
    void (*state_save)(const void *m, const void *st, void *dst);
    bool (*state_load)(const void *m, void *st, const void *src, size_t n);
    void *(*undo_save)(const void *st, int n);      /* NULL: out of memory */
    void (*undo_apply)(const void *u, void *st);
    void (*undo_free)(void *u);
} ds4_tp_family;

/* One line in err for a tensor-parallel option this build, host or role
 * cannot honour (--transport rdma without RDMA support or without an
 * active device: rdma.h's line); --transport auto becomes rdma when a
 * device is active (the named one with --rdma-device), else tcp. */
bool ds4_tp_check_options(ds4_dist_params *p, char *err, size_t errlen);

/* Takes ownership of local, the family's CPU backend over the whole model;
 * fam is copied. */
struct ds4_backend *ds4_tp_coordinator_new(struct ds4_backend *local, const ds4_tp_family *fam,
                                           const ds4_dist_params *p, bool numerics, char *err, size_t errlen);

/* The worker loop over the family's model and be, its CPU backend over it;
 * serves until refused or killed, freeing neither. A process exit status
 * (1 after one line on the log). */
int ds4_tp_worker_serve(const ds4_tp_family *fam, struct ds4_backend *be, bool numerics, int ctx,
                        const ds4_dist_params *p);

#endif
