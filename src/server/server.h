/* server.h -- ds4-server: routes, the inference worker, prefix reuse.
 *
 * Contract
 * - ds4_server_run() loads the model, binds host:port, and serves until
 *   SIGINT/SIGTERM. Connections get one thread each (HTTP parsing, JSON
 *   decoding, token counting, errors). Requests run on `batched_sessions`
 *   slots, each a worker thread with its own resident session (all
 *   allocated at start; refused at start when they cannot fit the memory
 *   available), taking jobs in FIFO order, so requests are served fairly and
 *   no session is ever shared. A new job goes to the idle slot whose last
 *   request body shares the longest prefix with it (a conversation's next
 *   turn finds its own KV), ties to the least recently used. With several
 *   slots the engine work of all of them is batched (batcher.h): every
 *   decoding slot advances in one step and a long prompt is prefilled in
 *   bounded chunks between those steps. One slot (the default) is exactly
 *   the single-session server.
 * - While a request waits in the queue its connection thread watches the
 *   socket: a client that disconnects takes its job out of the queue (it
 *   never runs), and a streamed request gets keep-alives every 5 s (the SSE
 *   stream opens early, with the family's no-op events, server-api.md 1.4);
 *   errors found later are then reported in-stream.
 * - The worker writes the response itself (SSE as it generates) and watches
 *   the socket: a client that disconnects stops prefill/generation at the
 *   next chunk or token and frees the worker. A client that stops reading
 *   is treated the same once a write has made no progress for
 *   limits.write_stall_ms; each connection's send buffer is capped at
 *   limits.send_buffer_bytes, so that happens within a few hundred tokens,
 *   and meanwhile the other slots' steps go on without it (batcher.h).
 * - Prefix reuse on the live session, first hit wins: trailing tool results
 *   that answer the live tool-call turn (only the tail is rendered); live
 *   tokens as an exact prefix of the new prompt tokens; the live text (the
 *   decoded live tokens) as a byte prefix of the new rendered prompt (only
 *   the byte suffix is tokenized); else the longest common token prefix.
 *   Usage reports the reused tokens as cached.
 * - Disk KV cache (kvdisk.h; on when opts.kvdisk.dir is set): after the
 *   live-session checks miss, the longest cached rendered prefix is restored
 *   (the live session is saved first, reason evict) and only the text after
 *   it is tokenized; prefill stops at cold / continued save points and saves
 *   there, and at branch points: where the prompt parts from the live
 *   session's prompt (saved once the session is cut back to it) or from one
 *   of the last replaced conversations' prompts (server_state.h), so a
 *   block a client rewrites early in its prompt costs only what follows
 *   it; generation saves on absolute frontiers, a request that replaces
 *   most of the live session saves it first, and exit saves it (shutdown).
 *   Tool ids missing from the replay map are looked up in the cache files.
 * - Access (routes.c): with an api_key every route but /health and CORS
 *   preflights needs it (Authorization: Bearer or x-api-key), else 401 in
 *   the family's shape; start-up refuses a non-loopback host without a key
 *   unless no_api_key. Bound to loopback, a Host header that names another
 *   host is refused (DNS rebinding); POST bodies must be application/json
 *   (a browser cannot send that cross-site without a CORS preflight).
 * - Connections: at most max_connections, at most max_client_connections
 *   per client address, and the last 1/16 of the slots only for addresses
 *   holding fewer than 4, so a crowd from a few addresses cannot lock new
 *   clients out. When every slot is taken, a new client from an address
 *   holding fewer than 4 takes the slot of the connection that has waited
 *   longest for a request head (idle, trickling a head, or closing after an
 *   error), which is closed: connections from many addresses holding
 *   partial heads cannot lock clients out either. A request's head must
 *   arrive within limits.head_timeout_ms of its first byte, the whole
 *   request within limits.request_timeout_ms.
 * - Test only: with DS4_TEST_SLOT_LINGER_GATE naming a file, a slot that
 *   has finished a job stays busy (not yet idle) for as long as that file
 *   exists, so a test can hold open the window in which a
 *   client's next turn arrives before the slot is idle again.
 */
#ifndef DS4_SERVER_H
#define DS4_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/engine.h"
#include "server/http.h"
#include "kvdisk/kvdisk.h"
#include "options/cli_args.h"

/* One thread per connection: this bounds them. */
#define DS4_SERVER_MAX_CONNECTIONS 1024

typedef struct {
    const char *host;            /* default 127.0.0.1; "localhost" = 127.0.0.1 */
    int port;                    /* default 8000 */
    int ctx;                     /* default 32768 */
    int default_max_tokens;      /* -n/--tokens, default 393216 */
    const char *model_path;      /* default ./ds4flash.gguf */
    int threads;                 /* <= 0: all CPUs */
    int prefill_chunk;           /* <= 0: the engine's default */
    int batched_sessions;        /* --batched-session N: resident sessions (slots), default 1 */
    ds4_spec_params spec;        /* --spec-lookup, --mtp*, --quality: drafters (one slot only) */
    int numerics;                /* ds4_engine_params.numerics: -1 default, 0 exact, 1 ds4 */
    const char *layers;          /* --layers A:B | A:output (ds4_engine_params.layers) */
    ds4_dist_params dist;        /* --role coordinator ... (ds4_engine_params.dist) */
    bool cors;
    const char *trace_path;      /* NULL: no trace */
    size_t tool_memory_max_ids;  /* default 100000 */
    bool disable_exact_replay;
    bool completions_chat;       /* wrap /v1/completions prompts as a chat turn */
    const char *scripted_output; /* test only: generation k emits this file's k-th answer (base/turn_script.h) */
    const char *test_linger_gate; /* test only (DS4_TEST_SLOT_LINGER_GATE): while this file exists, a
                                    slot's worker that has finished a job stays busy (checked every
                                    10 ms; ends at shutdown), so a test holds the window between an
                                    answer and the slot's return to idle open as long as it needs */
    const char *test_prefill_gate; /* test only (DS4_TEST_PREFILL_GATE): while this file exists, a
                                      prompt's prefill waits before its first slice, sending the
                                      keep-alives a long prefill sends (checked every 10 ms), so a
                                      test sees them without a prompt that takes that long */
    const char *api_key;         /* NULL: no authentication (DS4_API_KEY in ds4-server) */
    bool no_api_key;             /* allow a non-loopback --host without a key */
    int max_connections;         /* open connections, 1..DS4_SERVER_MAX_CONNECTIONS (default) */
    int max_client_connections;  /* per client address, default 256 */
    ds4_http_limits limits;
    ds4_kvdisk_opts kvdisk;      /* dir NULL: no disk KV cache */
    ds4_ssd_params ssd;             /* --ssd-streaming* (engine.h) */
    ds4_gpu_opts gpu;            /* --cuda/--cpu/--gpu-* (cuda_plan.h) */
    ds4_runtime_opts runtime;    /* --dir-steering-*, --power (cli_args.h) */
} ds4_server_opts;

void ds4_server_opts_default(ds4_server_opts *o);
/* Returns the process exit status. */
int ds4_server_run(const ds4_server_opts *o);

#endif
