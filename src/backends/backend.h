/* backend.h -- the narrow interface between the engine and a compute backend
 * (the CPU forward pass today; a GPU backend can implement the same calls).
 *
 * Contract
 * - eval() runs one batch made of n_seqs sequences, each a run of n >= 1
 *   tokens appended to its own state (the model family's state type; both
 *   keep n_pos and ctx) at positions kv->n_pos ... kv->n_pos+n-1
 *   (kv->n_pos += n). Decode is a sequence of one token; several sessions'
 *   decode rows and a prefill chunk of another may share one call. The states
 *   must be distinct, the total of n must not exceed max_batch and every
 *   kv->n_pos + n must fit kv->ctx.
 * - Each sequence receives next-token logits: for every token (n x n_vocab)
 *   when all_logits, else for its last token only (n_vocab).
 * - Exactness: a sequence's logits and state are bit-identical to evaluating
 *   that sequence alone, whatever other sequences share the batch, and the
 *   same for any split of a token run into consecutive calls (prefill chunk
 *   sizes, decode one by one). A backend whose kernels cannot promise this
 *   must evaluate sequences separately.
 * - A backend over a layer slice (model.h; pipeline parallelism) evaluates
 *   only its layers: when the slice does not start at layer 0 each sequence
 *   brings the hidden state entering it (hidden_in: n rows of n_hc x n_embd
 *   floats, the hyper-connection streams) instead of the embedding; when it
 *   does not own the output head it leaves the streams after its last layer
 *   in hidden_out (same shape) and writes no logits. Tokens are still given:
 *   hash-routed layers and positions need them. Chaining slices over the
 *   same tokens gives the whole model's logits bit for bit.
 * - An MTP block (a model whose first stage takes a hidden state, model.h)
 *   takes hidden_in at layer 0 too: each row's streams are built from it and
 *   the row's token. Its sequences may be state_only: the rows only extend
 *   the block's window state (their KV rows, bit for bit what a full
 *   evaluation writes) and nothing else is computed (no logits, hc_ring,
 *   probes): a drafter catching up on rows whose outputs it never reads.
 *   A batch is all state_only or none; other models refuse it.
 * - On error (-1, one line in err) no state has changed.
 * - A backend owns its scratch and reuses it across calls; it may serve many
 *   states, one call at a time.
 * - kv_sync (NULL for backends that compute in the host ds4_kv) makes the
 *   host copy of a state current before the engine reads its buffers
 *   (to_host) or the backend's copy current after the engine wrote them
 *   (!to_host). kv_release (may be NULL) drops what the backend keeps for a
 *   state that is being freed.
 * - kv_gather / kv_scatter (NULL for backends that hold every layer's state
 *   in the process): a backend keeping some layers' state elsewhere (dist.h:
 *   the pipeline workers) copies it into the host ds4_kv before the engine
 *   serialises the state (snapshot, payload save), and hands it out after the
 *   engine replaced the state (restore, payload load), toks being the
 *   kv->n_pos tokens the state now holds.
 * - A sequence's steer (nn/steering.h) is applied to its own rows only, on
 *   a slice to the slice's layers; the pipeline coordinator carries it to
 *   its workers (dist.h). Every backend implements it.
 * - power (power.h) only sleeps: outputs and states are the same bit for bit
 *   whatever its percent.
 */
#ifndef DS4_BACKEND_H
#define DS4_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/power.h"

struct ds4_kv;
struct ds4_steering;
struct ds4_act_probe;

typedef struct {
    /* the sequence's state in its family's form: ds4_kv (kv.h) for the
     * DeepSeek V4 backends, glm_kv (glm_kv.h) for the GLM backend */
    union {
        struct ds4_kv *kv;
        struct glm_kv *glm;
    };
    const int32_t *toks;
    int n;
    float *logits;
    bool all_logits;
    bool state_only;            /* MTP blocks: KV rows only (above) */
    const float *hidden_in;     /* slices not starting at layer 0 */
    float *hidden_out;          /* slices without the output head */
    /* NULL: unsteered; else directional steering of every layer's attention
     * and FFN outputs for this sequence's rows (nn/steering.h) */
    const struct ds4_steering *steer;
    /* NULL, or sums this sequence's rows of one sublayer output per layer
     * (after steering) for --dump-activations (nn/steering.h) */
    struct ds4_act_probe *probe;
    /* NULL, or a ring of hc_ring_slots hidden states (n_hc x n_embd floats
     * each): the streams of the row at position p after the last layer
     * (what the output head reads) go to slot p mod hc_ring_slots. The MTP
     * drafter continues from them. */
    float *hc_ring;
    int hc_ring_slots;
    /* NULL, or a ring of layer_ring_slots rows of n_ring_layers x n_embd
     * floats: for the row at position p, the mean of the n_hc streams after
     * layer ring_layers[i] (ascending) goes to slot p mod layer_ring_slots at
     * i x n_embd. The DSpark drafter reads these target features. */
    float *layer_ring;
    const int *ring_layers;
    int n_ring_layers, layer_ring_slots;
} ds4_backend_seq;

typedef struct ds4_backend ds4_backend;
struct ds4_backend {
    const char *name;
    int max_batch;          /* rows (tokens of all sequences) per eval */
    uint64_t weight_bytes;  /* weight bytes the matrix products have streamed so far (benchmarks) */
    int (*eval)(ds4_backend *be, const ds4_backend_seq *seqs, int n_seqs, char *err, size_t errlen);
    void (*free)(ds4_backend *be);
    int (*kv_sync)(ds4_backend *be, struct ds4_kv *kv, bool to_host, char *err, size_t errlen);
    void (*kv_release)(ds4_backend *be, struct ds4_kv *kv);
    int (*kv_gather)(ds4_backend *be, struct ds4_kv *kv, char *err, size_t errlen);
    int (*kv_scatter)(ds4_backend *be, struct ds4_kv *kv, const int32_t *toks, char *err, size_t errlen);
    /* --power: the engine marks each eval's start and pauses after it; a
     * backend that runs its layers one by one on the host also pauses after every
     * layer, so a long prefill is paced in small steps */
    ds4_power power;
};

/* Sees the input rows of one matrix product (imatrix collection): weight is
 * the weight's data pointer (its GGUF tensor's), expert the matrix of an
 * expert stack (0 for a plain one), then T rows of n floats, xstride apart.
 * Called from several threads at once. */
typedef void (*ds4_matmul_observer)(void *ud, const void *weight, int64_t expert, const float *x, int64_t xstride,
                                    int64_t n, int T);

#endif
