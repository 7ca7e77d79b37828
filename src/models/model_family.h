/* model_family.h -- the seam between the engine and a model family: one
 * ops table per family (DeepSeek V4: dsv4_family.c; GLM 5.2:
 * glm_family.c). engine.c holds a family pointer and opaque model and
 * session-state pointers and calls through the table; it never names a
 * family. Front ends reach the family's chat side through chat_spec.h.
 *
 * Contract
 * - ds4_family_detect() picks the family of an opened GGUF whose
 *   general.architecture is the table's arch; a file no family claims goes
 *   to DeepSeek V4, whose bind then names the first thing missing.
 * - ds4_family_refuse() writes the one-line refusal for the first engine
 *   option the family does not support (features, in the order --ssd-streaming,
 *   --numerics ds4, --cuda, --layers, --tensor-parallel, --role) and returns
 *   false; true when every option asked for is supported (DS4_FEAT_TP
 *   includes --role with --tensor-parallel). --layers with
 *   --tensor-parallel is refused for every family (each tensor-parallel
 *   process holds every layer).
 * - bind maps the family's weights and fills the info the engine reports;
 *   backend_new makes its backend (and whatever the family starts with it,
 *   such as the expert cache); report prints the load line (after the
 *   weights are paged in, so resident memory is measured); model_free undoes
 *   bind and backend_new's extras after the engine freed the backend.
 * - A session state is the family's decode state for ctx tokens plus its
 *   rewind strategy. The engine owns the token list and the logits and
 *   passes them in; every op leaves the state unchanged on error. rewind
 *   cuts the state to at most its first keep positions and returns the
 *   position it now holds, from which the engine recomputes the tokens up
 *   to the new end (keep itself when the state still covers it, an earlier
 *   checkpoint, or 0), or -1 with err; reset empties it. stepped runs after
 *   each evaluation (checkpoints).
 * - Payloads (the family's format: kv_payload.h, glm_payload.h) are what the
 *   disk cache stores; snapshots are the in-memory form and need not share
 *   it. Loads validate first and push the rows to the backend afterwards.
 */
#ifndef DS4_MODEL_FAMILY_H
#define DS4_MODEL_FAMILY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "base/byte_stream.h"
#include "models/chat_spec.h"
#include "models/engine_params.h"

struct ds4_gguf;

/* Engine options a family may refuse (ds4_family.features). */
enum {
    DS4_FEAT_SSD_STREAMING = 1 << 0,
    DS4_FEAT_NUMERICS = 1 << 1,     /* --numerics ds4: FP8/FP4 storage simulation */
    DS4_FEAT_CUDA = 1 << 2,
    DS4_FEAT_LAYERS = 1 << 3,
    DS4_FEAT_ROLE = 1 << 4,
    DS4_FEAT_TP = 1 << 5,           /* --tensor-parallel (dist/tp.h) */
};

/* What the engine reports about a bound model. */
typedef struct {
    const char *name;
    int n_vocab, n_layers, n_embd, expert_bits;
    uint64_t train_ctx, file_bytes;
    /* it binds everything its file holds (a whole model, or a layer range
     * file's own range), so reading the whole mapping reads only its weights */
    bool binds_file;
} ds4_family_info;

typedef struct ds4_family_model ds4_family_model;   /* a family's bound model */
typedef struct ds4_family_state ds4_family_state;   /* a family's session state */

typedef struct ds4_family {
    const char *arch;                   /* its general.architecture */
    unsigned features;                  /* DS4_FEAT_* it supports */
    const char *refusal;                /* the rest of the refusal line: "works with ..." */
    const ds4_chat_spec *chat;

    ds4_family_model *(*bind)(const struct ds4_gguf *g, const ds4_engine_params *p, ds4_family_info *info,
                              char *err, size_t errlen);
    ds4_backend *(*backend_new)(ds4_family_model *m, const ds4_engine_params *p, int prefill_chunk, char *err,
                                size_t errlen);
    void (*report)(const ds4_family_model *m, const ds4_backend *be, const ds4_engine_params *p,
                   uint64_t rss_bytes);
    void (*model_free)(ds4_family_model *m);
    /* false with err when this process cannot compute logits (a layer slice) */
    bool (*can_eval)(const ds4_family_model *m, const ds4_backend *be, char *err, size_t errlen);
    /* the pipeline worker loop (dist.h) over this slice and its backend until
     * refused or killed: a process exit status; NULL without DS4_FEAT_ROLE */
    int (*serve_worker)(ds4_family_model *m, ds4_backend *be, int ctx, const ds4_dist_params *p);
    bool (*ssd_stats)(const ds4_family_model *m, ds4_ssd_stats *out);   /* NULL: never streams */
    /* every matrix product's input rows to fn (imatrix collection); false
     * with one line when this model's backend cannot; NULL: never offered */
    bool (*observe_matmuls)(ds4_family_model *m, ds4_backend *be, ds4_matmul_observer fn, void *ud, char *err,
                            size_t errlen);
    uint64_t (*state_bytes)(const ds4_family_model *m, int ctx);
    /* --mtp FILE / --mtp FILE --dspark (dspark true): binds a draft model from a
     * support file made for this model, beside backend be; false with one
     * line. NULL: the family has none (the engine refuses the option).
     * draft_name: the bound drafter's name, NULL without one. */
    bool (*draft_load)(ds4_family_model *m, ds4_backend *be, const char *path, bool dspark, char *err,
                       size_t errlen);
    const char *(*draft_name)(const ds4_family_model *m);

    ds4_family_state *(*state_new)(ds4_family_model *m, ds4_backend *be, int ctx, int prefill_chunk);
    void (*state_free)(ds4_family_state *st);
    int (*n_pos)(const ds4_family_state *st);
    void (*seq_bind)(ds4_family_state *st, ds4_backend_seq *q);
    void (*stepped)(ds4_family_state *st);
    int (*rewind)(ds4_family_state *st, int keep, char *err, size_t errlen);
    /* Up to max tokens the draft model expects after toks[0..n) (the
     * session's) and last (chosen, not yet appended), greedily, stopping at
     * the first whose logit leads the runner-up by less than margin (MTP)
     * or whose block prefix's confidence falls below margin (DSpark): how
     * many it wrote to out, or -1 with err; first_logits (NULL or n_vocab
     * floats) gets the logits of the first. The session's state is not
     * touched; the draft model's state is rebuilt, never persisted. */
    int (*draft)(ds4_family_state *st, const int32_t *toks, int n, int32_t last, int max, float margin,
                 int32_t *out, float *first_logits, char *err, size_t errlen);
    void (*reset)(ds4_family_state *st);

    size_t (*snapshot_bytes)(const ds4_family_state *st, int n_vocab);
    bool (*snapshot_save)(const ds4_family_state *st, const int32_t *toks, const float *logits, int n_vocab,
                          void *dst);
    /* toks/logits: the session's; snap_toks/snap_logits: the snapshot's copies */
    int (*snapshot_load)(ds4_family_state *st, int32_t *toks, float *logits, int n_vocab, const void *src,
                         size_t n, const int32_t *snap_toks, int n_toks, const float *snap_logits, char *err,
                         size_t errlen);

    size_t (*payload_bytes)(const ds4_family_state *st, int n_vocab);
    void (*payload_save)(const ds4_family_state *st, const int32_t *toks, const float *logits, int n_vocab,
                         void *dst);
    bool (*payload_save_to)(const ds4_family_state *st, const int32_t *toks, const float *logits, int n_vocab,
                            const ds4_sink *sink);
    int (*payload_load)(ds4_family_state *st, int32_t *toks, float *logits, int n_vocab, const void *src,
                        size_t n, char *err, size_t errlen);
    int (*payload_load_from)(ds4_family_state *st, int32_t *toks, float *logits, int n_vocab,
                             const ds4_source *src, size_t n, char *err, size_t errlen);
} ds4_family;

extern const ds4_family ds4_family_dsv4, ds4_family_glm;

const ds4_family *ds4_family_detect(const struct ds4_gguf *g);
bool ds4_family_refuse(const ds4_family *f, const ds4_engine_params *p, char *err, size_t errlen);

#endif
