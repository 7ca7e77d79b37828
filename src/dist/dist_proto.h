/* dist_proto.h -- the pipeline-parallel wire format (docs/distributed.md):
 * the frames a coordinator and its workers exchange, encoded
 * into and decoded from plain byte buffers. No sockets here: the transport
 * carries whole messages, this module only says what is in them.
 *
 * Contract
 * - Every frame starts with the magic "DS4P", a version (7) and a type;
 *   integers and floats are little endian, strings length-prefixed (u16).
 * - Registration is a challenge-response on the control socket (REQ/REP);
 *   the secret never travels. KNOCK (worker): a fresh random nonce Nw.
 *   CHALLENGE (coordinator): a fresh random nonce Nc and the coordinator's
 *   proof HMAC-SHA1(secret, "ds4 coordinator" Nw Nc), which the worker
 *   checks before it says anything about itself, so a fake coordinator
 *   learns nothing and gets no work. HELLO (worker): Nc again, the worker's
 *   registration nonce Nr (drawn fresh when the worker starts), the model
 *   identity (name, layer count, hidden size, HC streams, vocabulary,
 *   routed-expert bits, numerics), the layer slice, the context capacity,
 *   the worker's data address and the SHA-1 of its steering directions
 *   (all zero without --dir-steering-file), sealed under the handshake key
 *   HMAC-SHA1(secret, "ds4 worker" Nw Nc) (ds4_dist_handshake_key); the
 *   coordinator's WELCOME or REFUSED is sealed under the same key. Each Nc
 *   is answered once, so a recorded HELLO replayed later is refused.
 *   ds4_dist_hello_compatible() says whether a registration fits the
 *   coordinator's model (and steering file) and words the refusal in one
 *   line.
 * - ROUTE (coordinator -> each worker at route formation): the route id, the
 *   most tokens one WORK frame of the route carries (the coordinator's
 *   prefill chunk: the receiver sizes its receive limit by it), the next
 *   hop's data address and registration nonce (empty and zero for the
 *   worker owning the output head) and the coordinator's result address
 *   ("home") and its nonce Nh (drawn when the coordinator starts).
 * - WORK (one pipeline hop, forwarded worker to worker): route id, request
 *   id (seq), session id, first position, token count, the rolling
 *   token-prefix hashes before and after the span, the sequence's steering
 *   scales (attention, FFN: finite f32, zero for unsteered work; every hop
 *   applies them with its own copy of the directions to its own layers,
 *   nn/steering.h), which logits the final
 *   owner returns (ACK: none, for non-final prefill chunks; LAST: the last
 *   token's; ALL: every position's), whether the hops keep a ring checkpoint
 *   of the session after the span (dist.h), the tokens, the hidden-state
 *   payload (n x n_hc x n_embd floats) in the transport format the
 *   coordinator chose (--dist-activation-bits) and the telemetry of the hops
 *   done so far.
 * - Transport formats of the hidden states (enum ds4_dist_act): F32 as is;
 *   F16 IEEE binary16, rounded to nearest even, values beyond +-65504
 *   saturated (relative error <= 2^-11 in the normal range, absolute <=
 *   2^-25 below it); Q8 per row of `row` floats (the coordinator sends
 *   n_embd: one HC stream of one token) an f32 scale s = max|x| / 127 and
 *   int8 q = round(x / s), decoded q x s (absolute error <= max|x| x
 *   (1/254 + 2^-22), the last term the two f32 roundings). Only the hidden
 *   states travel so: logits (RESULT) and layer state (KV_GET / KV_PUT) are
 *   always F32. ds4_dist_work_floats() decodes any of them.
 * - KV_GET / KV_PUT (coordinator -> one worker; persistent KV through the
 *   route) share WORK's layout: KV_GET asks for the worker's layer state of
 *   a session at position pos with prefix hash hash_before (n = 0 tokens);
 *   KV_PUT replaces the session by n tokens (hash_after after them) and the
 *   layer state in floats.
 * - RESULT (to home): route id, request id, session id, status (OK,
 *   HASH_MISMATCH, ERROR, or WRONG_ROUTE: the worker is on another route,
 *   so the coordinator forms its route again), the hash after the span, floats (logits, layer
 *   state, or none for an ACK), an error line and the hops' telemetry.
 * - Telemetry: one ds4_dist_hop per hop that ran (layers, span, eval, wait
 *   and send microseconds, bytes received), at most DS4_DIST_MAX_HOPS, the
 *   last field group of WORK and RESULT frames, so the sender fills in its
 *   own send time after encoding (ds4_dist_set_send_us).
 * - ds4_dist_decode() checks every length against the buffer before reading
 *   (a truncated or oversized frame is an error, never a read past the end)
 *   and leaves pointers into the buffer for the arrays; floats and tokens
 *   are read through ds4_dist_float_at()/ds4_dist_token_at() because the
 *   buffer need not be aligned. Encoders return NULL only when out of memory
 *   (and ds4_dist_encode_work for a format the decoder would refuse).
 * - Sealing: every frame on a data port (ROUTE, WORK, KV_GET/KV_PUT, RESULT)
 *   travels sealed, the frame followed by HMAC-SHA1(key, frame) (sha1.h),
 *   the key being the receiver's link key HMAC-SHA1(secret, "ds4 link" N)
 *   (ds4_dist_link_key), N the receiving worker's registration nonce Nr or,
 *   for results, the coordinator's Nh (the handshake key for HELLO, WELCOME
 *   and REFUSED): ds4_dist_seal() appends the tag, ds4_dist_unseal() checks
 *   it in constant time and gives the frame's length, and a frame that
 *   fails is dropped before it is decoded. Someone who can reach a data port
 *   but does not know the secret cannot send work, results or routes, and a
 *   frame recorded before a worker or the coordinator restarted fails the
 *   seal of the new process. No encryption here: TLS is the transport's
 *   business (dist.h).
 * - ds4_dist_work_frame_max() and ds4_dist_result_frame_max() bound the
 *   sealed size of a legitimate frame, so a receiver can refuse a larger
 *   one by its length before buffering it.
 * - TP_STEP, TP_STATE, TP_PART: the tensor-parallel frames (dist/tp.h),
 *   described at ds4_dist_tp below; sealed like the data-port frames.
 *   TP_RDMA: one side's queue pair for --transport rdma (ds4_dist_rdma).
 * - ds4_dist_hash_tokens() is the rolling 64-bit prefix hash (FNV-1a over
 *   the token ids' little-endian bytes): hash(prefix + span) is
 *   ds4_dist_hash_tokens(hash(prefix), span).
 */
#ifndef DS4_DIST_PROTO_H
#define DS4_DIST_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DS4_DIST_HASH_EMPTY 0xcbf29ce484222325ull
#define DS4_DIST_MAX_HOPS 16
#define DS4_DIST_NONCE_BYTES 16
#define DS4_DIST_SEAL_BYTES 20
#define DS4_DIST_STEER_ID_BYTES 20   /* SHA-1 of a steering file's directions */

enum ds4_dist_type { DS4_DIST_HELLO = 1, DS4_DIST_WELCOME = 2, DS4_DIST_REFUSED = 3, DS4_DIST_WORK = 4,
                     DS4_DIST_RESULT = 5, DS4_DIST_ROUTE = 6, DS4_DIST_KV_GET = 7, DS4_DIST_KV_PUT = 8,
                     DS4_DIST_KNOCK = 9, DS4_DIST_CHALLENGE = 10, DS4_DIST_TP_STEP = 11, DS4_DIST_TP_STATE = 12,
                     DS4_DIST_TP_PART = 13, DS4_DIST_TP_RDMA = 14 };
enum ds4_dist_status { DS4_DIST_OK = 0, DS4_DIST_HASH_MISMATCH = 1, DS4_DIST_ERROR = 2, DS4_DIST_WRONG_ROUTE = 3 };
enum ds4_dist_logits { DS4_DIST_ACK = 0, DS4_DIST_LAST = 1, DS4_DIST_ALL = 2 };
enum ds4_dist_act { DS4_DIST_ACT_F32 = 0, DS4_DIST_ACT_F16 = 1, DS4_DIST_ACT_Q8 = 2 };

/* One hop's telemetry: wait is the time the hop sat idle before the frame
 * came (upstream compute and transfer), send the time it took to serialise
 * and hand its outgoing frame to the transport. */
typedef struct {
    uint32_t first, last, pos, n;
    uint32_t eval_us, wait_us, send_us, bytes_in;
} ds4_dist_hop;

typedef struct {
    const uint8_t *challenge;  /* DS4_DIST_NONCE_BYTES: the coordinator's nonce Nc */
    const uint8_t *nonce;      /* DS4_DIST_NONCE_BYTES: the worker's registration nonce Nr */
    const char *model; size_t model_len;
    uint32_t n_layer, n_embd, n_hc, n_vocab, expert_bits;
    uint32_t first, last;
    bool output;
    uint32_t ctx;
    const char *data_url; size_t data_url_len;
    bool numerics;             /* the ds4 FP8/FP4 simulation (changes logits) */
    uint8_t steering[DS4_DIST_STEER_ID_BYTES];  /* SHA-1 of the steering directions; zeros: none */
} ds4_dist_hello;

typedef struct {
    uint64_t route;
    uint32_t seq;
    uint64_t session;
    uint32_t pos, n;
    uint64_t hash_before, hash_after;
    uint8_t logits;            /* enum ds4_dist_logits */
    bool checkpoint;           /* keep a ring checkpoint after the span (WORK) */
    const uint8_t *tokens;     /* n little-endian i32 */
    uint32_t n_floats;
    const uint8_t *floats;     /* n_floats encoded as `act` says (ds4_dist_work_floats) */
    uint32_t n_hops;
    const uint8_t *hops;       /* n_hops encoded ds4_dist_hop (ds4_dist_hop_at) */
    uint8_t act;               /* enum ds4_dist_act: how floats travel (zero: F32) */
    uint32_t row;              /* Q8: floats per scaled row, dividing n_floats; 0 otherwise */
    float steer_attn, steer_ffn;    /* the sequence's steering scales (0, 0: unsteered) */
} ds4_dist_work;

typedef struct {
    uint64_t route;
    uint32_t seq;
    uint64_t session;
    uint8_t status;
    uint64_t hash_after;
    uint32_t n_floats;
    const uint8_t *floats;
    uint32_t n_hops;
    const uint8_t *hops;
    const char *text; size_t text_len;    /* ERROR / REFUSED line, WELCOME note */
} ds4_dist_result;

typedef struct {
    uint64_t route;
    uint32_t max_tokens;                 /* tokens per WORK frame at most */
    const char *next; size_t next_len;   /* empty: this worker owns the output head */
    const uint8_t *next_nonce;           /* NONCE_BYTES: the next hop's Nr (zeros when none) */
    const char *home; size_t home_len;
    const uint8_t *home_nonce;           /* NONCE_BYTES: the coordinator's Nh */
} ds4_dist_route;

/* Tensor parallelism (dist/tp.h). Every frame carries the sender's
 * counter on the link (frames it sent before on it), so a receiver refuses
 * one out of order or sent again. STEP: the sessions the coordinator freed
 * (u64 ids), then one record per sequence of the batch (ds4_dist_tp_seq_at)
 * and every sequence's tokens in batch order. STATE: one session's whole
 * state (ds4_kv_save's bytes) for a context of ctx. PART: one layer's
 * floats of one step, or status ERROR and a line instead. */
typedef struct {
    uint64_t session;
    uint32_t ctx, pos, n;      /* the session's context, first position and token count */
    bool all_logits;           /* every position's logits (else the last one's) */
} ds4_dist_tp_seq;

typedef struct {
    uint64_t counter;
    uint32_t n_drop; const uint8_t *drop;       /* STEP: u64 session ids (ds4_dist_u64_at) */
    uint32_t n_seqs; const uint8_t *seqs;       /* STEP: records (ds4_dist_tp_seq_at) */
    uint32_t n_tokens; const uint8_t *tokens;   /* STEP: the sum of the records' n */
    uint64_t session; uint32_t ctx;             /* STATE */
    uint32_t n_bytes; const uint8_t *bytes;     /* STATE */
    uint64_t step; uint32_t layer;              /* PART: the coordinator's step (STEP frames sent before it) and layer */
    uint8_t status;                             /* PART: DS4_DIST_OK or DS4_DIST_ERROR */
    uint32_t n_floats; const uint8_t *floats;   /* PART */
    const char *text; size_t text_len;          /* PART: the ERROR line */
} ds4_dist_tp;

/* TP_RDMA: a host's reliable-connected queue pair and its receive slots,
 * sent once each way after the WELCOME over the sealed link (dist/rdma.h):
 * the queue pair number and first packet sequence number (24 bits each),
 * the port's LID (InfiniBand; 0 on RoCE), the GID (16 bytes), the path MTU
 * (the verbs enumeration, 1 = 256 .. 5 = 4096 bytes), and the receive slots
 * it posted: how many, and the bytes each holds (a message is at most one
 * slot). No memory key: the hosts only send and receive, neither writes
 * into the other's memory. */
typedef struct {
    uint64_t counter;
    uint32_t qpn, psn;
    uint16_t lid;
    const uint8_t *gid;
    uint8_t mtu;
    uint32_t slots, slot_bytes;
} ds4_dist_rdma;

/* KNOCK: nonce (Nw), proof NULL; CHALLENGE: nonce (Nc) and proof (SEAL_BYTES) */
typedef struct {
    const uint8_t *nonce, *proof;
} ds4_dist_challenge;

typedef struct {
    enum ds4_dist_type type;
    ds4_dist_hello hello;      /* HELLO */
    ds4_dist_challenge challenge;   /* KNOCK, CHALLENGE */
    ds4_dist_work work;        /* WORK, KV_GET, KV_PUT */
    ds4_dist_result result;    /* RESULT, WELCOME, REFUSED (text only) */
    ds4_dist_route route;      /* ROUTE */
    ds4_dist_tp tp;            /* TP_STEP, TP_STATE, TP_PART */
    ds4_dist_rdma rdma;        /* TP_RDMA */
} ds4_dist_frame;

uint64_t ds4_dist_hash_tokens(uint64_t h, const int32_t *toks, int n);

/* Appends the seal HMAC-SHA1(key, frame) to a malloc'd frame of *len bytes
 * (growing it; *len grows by DS4_DIST_SEAL_BYTES). NULL when out of memory
 * or msg is NULL (msg is freed then). */
uint8_t *ds4_dist_seal(uint8_t *msg, size_t *len, const void *key, size_t key_len);
/* True when buf[0..n) ends in the right seal; *frame_len is then the frame's
 * length without it. */
bool ds4_dist_unseal(const void *buf, size_t n, const void *key, size_t key_len, size_t *frame_len);
/* HMAC-SHA1(secret, label Nw Nc): the coordinator's proof (label
 * "ds4 coordinator") or the handshake key (label "ds4 worker"). */
enum ds4_dist_key { DS4_DIST_COORDINATOR_PROOF = 0, DS4_DIST_HANDSHAKE_KEY = 1 };
void ds4_dist_handshake_key(const char *secret, enum ds4_dist_key which, const uint8_t *nonce_w,
                            const uint8_t *nonce_c, uint8_t out[DS4_DIST_SEAL_BYTES]);
/* HMAC-SHA1(secret, "ds4 link" nonce): the key frames to the data port of
 * the process that drew nonce are sealed with. */
void ds4_dist_link_key(const char *secret, const uint8_t *nonce, uint8_t out[DS4_DIST_SEAL_BYTES]);
/* Equal in time independent of where a and b differ. */
bool ds4_dist_same(const uint8_t *a, const uint8_t *b, size_t n);
/* n fresh random bytes from the kernel (getrandom); false when it fails. */
bool ds4_dist_random(uint8_t *out, size_t n);

/* Encoders: a malloc'd buffer (caller frees) and its size in *len. */
uint8_t *ds4_dist_encode_hello(const ds4_dist_hello *h, size_t *len);
uint8_t *ds4_dist_encode_text(enum ds4_dist_type type, const char *text, size_t *len);
/* KNOCK (proof NULL) or CHALLENGE */
uint8_t *ds4_dist_encode_challenge(const uint8_t *nonce, const uint8_t *proof, size_t *len);
/* type: WORK, KV_GET or KV_PUT; w->n_hops entries of hops are written (their
 * encoded form in w->hops is ignored). The payload: floats encoded as w->act
 * says, or, when w->floats is set (a decoded frame's), those bytes as they
 * are. */
uint8_t *ds4_dist_encode_work(enum ds4_dist_type type, const ds4_dist_work *w, const int32_t *toks,
                              const float *floats, const ds4_dist_hop *hops, size_t *len);
uint8_t *ds4_dist_encode_result(const ds4_dist_result *r, const float *floats, const ds4_dist_hop *hops, size_t *len);
uint8_t *ds4_dist_encode_route(const ds4_dist_route *r, size_t *len);
uint8_t *ds4_dist_encode_tp_step(uint64_t counter, const uint64_t *drop, uint32_t n_drop, const ds4_dist_tp_seq *seqs,
                                 uint32_t n_seqs, const int32_t *toks, size_t *len);
uint8_t *ds4_dist_encode_tp_state(uint64_t counter, uint64_t session, uint32_t ctx, const void *bytes, size_t n_bytes,
                                  size_t *len);
/* status OK: n floats; ERROR: text (floats ignored) */
uint8_t *ds4_dist_encode_tp_part(uint64_t counter, uint64_t step, uint32_t layer, uint8_t status, const float *floats, size_t n,
                                 const char *text, size_t *len);
uint8_t *ds4_dist_encode_tp_rdma(const ds4_dist_rdma *r, size_t *len);
/* The largest sealed TP frames: a STEP of at most `tokens` tokens in at
 * most `seqs` sequences and `drops` freed sessions; a STATE of `bytes`; a
 * PART of `floats` floats or an error line. */
size_t ds4_dist_tp_step_frame_max(size_t tokens, size_t seqs, size_t drops);
size_t ds4_dist_tp_state_frame_max(size_t bytes);
size_t ds4_dist_tp_part_frame_max(size_t floats);
ds4_dist_tp_seq ds4_dist_tp_seq_at(const uint8_t *seqs, size_t i);
uint64_t ds4_dist_u64_at(const uint8_t *p, size_t i);

/* Writes send_us into the last hop of an encoded WORK or RESULT frame with
 * at least one hop (the sender's own, whose send time is known only after
 * the frame was encoded). */
void ds4_dist_set_send_us(uint8_t *frame, size_t len, uint32_t send_us);

/* The largest sealed WORK, KV_GET or KV_PUT frame with at most `tokens`
 * tokens and `floats` f32 values (hidden states or layer state) and every
 * hop's telemetry. */
size_t ds4_dist_work_frame_max(size_t tokens, size_t floats);
/* The largest sealed RESULT with at most `floats` floats (logits or layer
 * state), every hop's telemetry and an error line. */
size_t ds4_dist_result_frame_max(size_t floats);
/* The largest sealed ROUTE (URLs of at most url_max bytes). */
size_t ds4_dist_route_frame_max(size_t url_max);

/* false (and one line in err) for anything but one whole valid frame */
bool ds4_dist_decode(const uint8_t *buf, size_t len, ds4_dist_frame *out, char *err, size_t errlen);
float ds4_dist_float_at(const uint8_t *floats, size_t i);
/* n f32 values of an encoded payload decoded into place (the frame's bytes
 * need not be aligned). */
void ds4_dist_floats(const uint8_t *floats, size_t n, float *out);
/* The payload's n_floats values, decoded from its transport format into out. */
void ds4_dist_work_floats(const ds4_dist_work *w, float *out);
/* Bytes of n floats in format act (row: Q8's row length). */
size_t ds4_dist_act_bytes(uint8_t act, uint32_t row, size_t n);
int32_t ds4_dist_token_at(const uint8_t *tokens, size_t i);
ds4_dist_hop ds4_dist_hop_at(const uint8_t *hops, size_t i);

/* Whether a worker's HELLO fits: same model, a non-empty slice
 * inside the model. On false, one line in err naming the first difference. */
bool ds4_dist_hello_compatible(const ds4_dist_hello *mine, const ds4_dist_hello *theirs, char *err, size_t errlen);

#endif
