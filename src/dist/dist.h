/* dist.h -- pipeline parallelism over hosts (docs/distributed.md): the
 * coordinator's "remote layers" backend and the worker
 * loop, on NNG (request/reply sockets over TCP).
 *
 * Contract
 * - Roles: a coordinator holds layers 0..K (its engine's --layers) and
 *   listens for registrations (--listen HOST PORT); a worker holds a slice
 *   K+1..M or M..output, registers with the coordinator (--coordinator HOST
 *   PORT) and serves WORK frames on its own data socket. Registration carries
 *   the shared secret (--dist-secret or DS4_DIST_SECRET), the model identity,
 *   the quant, the slice and the context; an incompatible worker is refused
 *   with one line, which the worker prints before it exits. The numerics
 *   (exact or the ds4 simulation) must match too: they change the logits.
 *   numerics: -1 default (the simulation where supported), 0 exact, 1 ds4.
 * - ds4_dist_coordinator_new() wraps the local slice's backend. Before the
 *   first step, and whenever the registrations changed, the coordinator
 *   forms the route: it connects to every worker and sends each a ROUTE
 *   frame (the next hop's address, or none for the owner of the output head,
 *   and the coordinator's result address), waiting for every ACK. A step then
 *   runs the local layers chunk by chunk (--dist-prefill-chunk, default the
 *   local batch) and pushes each chunk's hidden states to the first worker;
 *   workers forward straight to the next worker, and the final owner returns
 *   the logits to the coordinator, or an ACK for a non-final prefill chunk.
 *   Up to --dist-prefill-window chunks (default 2) are in flight, so the
 *   coordinator computes chunk i+1 while the workers compute chunk i. The
 *   engine above sees a whole-model backend: logits are the single
 *   process's bit for bit. Until a route covers every layer, a step waits up
 *   to wait_seconds for registrations, then fails with "incomplete route".
 * - A worker whose connection closes (killed, restarted), or a route that
 *   does not answer within reply_seconds, fails the step with one line: the
 *   route is dropped, the coordinator's own slice state is put back where
 *   it was before the step (the engine sees no change), and later steps
 *   report the incomplete route until a compatible worker registers for the
 *   slice (the surviving workers register again within a second).
 * - Along a route request ids only grow, and route ids are never reused
 *   (they start at random): a worker drops a (sealed) WORK or KV frame of a
 *   request it already served and a ROUTE frame of a route it took before,
 *   as recorded frames sent again would be. Frames on a data port are
 *   sealed under the receiver's registration (dist_proto.h link keys), so
 *   frames recorded before a worker restarted fail its seal; a worker given
 *   work for a route other than its own answers WRONG_ROUTE, and the coordinator
 *   forms the route again (a fresh id) and retries the step once.
 * - Receive limits (NNG_OPT_RECVMAXSZ; NNG refuses a message by its length
 *   prefix, before buffering it): registration sockets 64 KiB; a worker's
 *   data port a ROUTE frame's size until a ROUTE sealed for its
 *   registration raises it to the route's largest frame (WORK of a prefill
 *   chunk of hidden states, or KV_PUT of a whole ctx-token session of its
 *   layers); the coordinator's results port an error line's size until a
 *   route forms, then a chunk's every-position logits or the largest hop's
 *   KV state.
 * - Workers keep one KV state per session and check every WORK frame's
 *   position and rolling token-prefix hash: a state further on whose prefix
 *   matches is truncated back (a rewind, within the rings' slack); anything
 *   else (a restarted worker asked for position N) is answered
 *   HASH_MISMATCH, never computed. The coordinator keeps each session's
 *   tokens and then replays them through the route (its own slice
 *   recomputed on a scratch state) before it retries the step once.
 * - Persistent KV (backend.h kv_gather/kv_scatter): saving fetches every
 *   worker's layer state of the session into the host state, so the engine
 *   writes one normal payload; loading sends each worker of the current
 *   route its layers' part. A load without a complete route is not an error:
 *   the next step replays instead.
 * - --dist-activation-bits 32|16|8 (coordinator): the transport format of
 *   the hidden states between hops (dist_proto.h: f32, f16, per-row scaled
 *   int8). Each WORK frame says its format and every hop sends its own
 *   hidden states on in the same one. 32 keeps the single process's logits
 *   bit for bit; 16 and 8 round the hidden states at every cut (the weights,
 *   the KV state, saved payloads and the logits stay f32).
 * - Directional steering (nn/steering.h): every process of the route holds
 *   the whole --dir-steering-file and applies the rows of its own layers.
 *   The engine hands the directions and their SHA-1 over in steer_dir /
 *   steer_sha1; HELLO carries the SHA-1 and the coordinator refuses a worker
 *   whose file differs (or that has one when the coordinator has none, or
 *   none when it has one) with one line. A sequence's scales (backend.h
 *   steer: the engine's, or the session's own) travel in every WORK frame,
 *   so one route serves steered and unsteered sessions, each bit for bit
 *   the single process's; a worker's own --dir-steering-ffn/-attn are not
 *   used. A replay recomputes a session's tokens with the scales of its
 *   latest step.
 * - --debug prints route formation and, per request, every hop's telemetry
 *   (layers, tokens, eval, wait and send time, bytes), gathered from the
 *   result frames.
 * - Binding is the caller's business: loopback by default in the tests;
 *   ports a LAN can reach need the secret (refused without one).
 * - TLS (--dist-tls-cert/--dist-tls-key/--dist-tls-ca, all three or none):
 *   every socket (registration, data ports, results) runs over NNG's
 *   tls+tcp transport (mbedTLS) instead of tcp, and both ends of every
 *   connection present their certificate and require the peer's to be
 *   signed by the CA (mutual TLS); a dialing end also requires the peer's
 *   certificate to name the host it dials (CN or DNS name, as written in
 *   the address). The secret's challenge-response still runs inside.
 */
#ifndef DS4_DIST_H
#define DS4_DIST_H

#include <stdbool.h>
#include <stddef.h>

struct ds4_backend;
struct ds4_model;

enum ds4_dist_role { DS4_DIST_NONE, DS4_DIST_COORDINATOR, DS4_DIST_WORKER };

typedef struct {
    enum ds4_dist_role role;
    const char *host;           /* coordinator: --listen HOST; worker: --coordinator HOST */
    int port;
    const char *secret;         /* --dist-secret, else $DS4_DIST_SECRET, else "" */
    double wait_seconds;        /* coordinator: how long eval waits for a complete route (<= 0: 30) */
    double reply_seconds;       /* --dist-reply-timeout: how long the route may stay silent (<= 0: 120) */
    int prefill_chunk;          /* --dist-prefill-chunk: tokens per pipelined chunk (<= 0: the local batch) */
    int prefill_window;         /* --dist-prefill-window: chunks in flight (<= 0: 2) */
    int activation_bits;        /* --dist-activation-bits: 32, 16 or 8 (<= 0: 32); coordinator only */
    bool debug;                 /* --debug: route formation and per-hop telemetry on stderr */
    const char *tls_cert, *tls_key, *tls_ca;   /* PEM files (--dist-tls-*); NULL: plain TCP */
    /* set by the engine from --dir-steering-file, not by options: the
     * directions ([n_layer][n_embd], NULL: none) and their SHA-1 */
    const float *steer_dir;
    unsigned char steer_sha1[20];
    /* --tensor-parallel (tp.h) instead of the layer pipeline, and its options */
    bool tp, tp_token_prefill;                   /* --tensor-parallel-token-prefill */
    bool transport_set, transport_rdma;          /* --transport given; rdma chosen */
    bool transport_auto;                         /* --transport auto: rdma when a device is active */
    const char *rdma_device;                     /* --rdma-device (NULL: automatic) */
    int rdma_gid_index;                          /* --rdma-gid-index, when rdma_gid_set */
    bool rdma_gid_set;
} ds4_dist_params;

/* the most prefill chunks in flight along a route (--dist-prefill-window) */
#define DS4_DIST_MAX_WINDOW 32

/* After the options were read (options/cli_args.h): the secret from the environment when not given, and one
 * line in err for an inconsistent set (a role without its address, a worker
 * role where the binary runs no worker loop: !worker_ok, activation bits
 * given to a worker: the coordinator chooses them for the route, some of
 * the TLS files without the others, a tensor-parallel option without
 * --tensor-parallel or the RDMA options without --transport rdma, and
 * --transport rdma in a build without RDMA or on a host without an active
 * RDMA device: tp.h); --transport auto becomes rdma or tcp here. */
bool ds4_dist_finish_options(ds4_dist_params *p, bool worker_ok, char *err, size_t errlen);

/* Takes ownership of `local` (the backend over the coordinator's slice). */
struct ds4_backend *ds4_dist_coordinator_new(struct ds4_backend *local, const struct ds4_model *m,
                                             const ds4_dist_params *p, bool numerics, char *err, size_t errlen);

/* The worker loop over a layer slice that is already loaded: m (bound with
 * --layers K:..., K > 0) and be, a backend over it that takes and leaves
 * hidden states (backend.h), with the numerics it was built with. Registers
 * with the coordinator in p and serves until refused or killed; frees
 * neither m nor be. The engine hands its own over
 * (ds4_engine_serve_worker), so a worker's slice is loaded, paged and run
 * as any other engine's. Returns a process exit status (1 after one line in
 * the log when it cannot start or is refused). */
int ds4_dist_worker_serve(const struct ds4_model *m, struct ds4_backend *be, bool numerics, int ctx,
                          const ds4_dist_params *p);

#endif
