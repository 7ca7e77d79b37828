/* mtp.h -- DeepSeek V4's MTP drafter (--mtp FILE): the one-stage
 * multi-token-prediction block of a support file (ds4_layout.h) run beside
 * the main model to propose the tokens after the one just chosen.
 *
 * Contract
 * - ds4_mtp_load() opens and binds the support file for main (model.h:
 *   ds4_model_bind_mtp) and makes its backend on host's threads (a CPU
 *   backend; anything else is refused with one line). The drafter reads only
 *   the main model's mapping and its own; it never changes the main state.
 * - A session's ds4_mtp_state follows the main state through four calls:
 *   ds4_mtp_bind() before each main evaluation (the backend then writes the
 *   final hidden streams of every evaluated row into the state's ring, see
 *   backend.h), ds4_mtp_evaluated() after it, ds4_mtp_rewound() after the
 *   main state went back to n_pos, and ds4_mtp_forget() when it was replaced
 *   (snapshot or payload: the draft state is rebuilt, never persisted).
 * - The block's row at position i reads the main model's final streams at i
 *   and token i+1 (the training objective: it predicts token i+2). Its
 *   window rows depend on those inputs only (one window-only layer), so
 *   ds4_mtp_draft() recomputes whichever rows of the last window it lacks
 *   from the ring; after a restore, until a window of hidden states has been
 *   seen again, it drafts from the rows it has.
 * - ds4_mtp_draft(): after the session's n tokens and `last` (chosen, about to
 *   be appended) it proposes up to max tokens greedily: the first from
 *   (streams at n - 1, last), each further one from the block's own output
 *   streams and the previous draft. Drafting stops at the first token whose
 *   logit leads the runner-up by less than `margin`; first_logits (NULL or
 *   n_vocab floats) receives the logits the first draft is chosen from.
 *   Returns how many (0 also when the window's hidden states are gone), or -1
 *   (err) when the block's evaluation failed; the main state is untouched
 *   and the drafter's state keeps only rows of committed tokens.
 */
#ifndef DS4_MTP_H
#define DS4_MTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "models/dsv4/model.h"

struct ds4_gguf;
typedef struct ds4_mtp ds4_mtp;
typedef struct ds4_mtp_state ds4_mtp_state;

ds4_mtp *ds4_mtp_load(const char *path, const ds4_model *main_model, ds4_backend *host, bool numerics, char *err,
                      size_t errlen);
/* The same from an opened support file, which the drafter then owns (closed
 * on failure too); `what` names it in the error line (fuzzing: a buffer). */
ds4_mtp *ds4_mtp_from_gguf(struct ds4_gguf *g, const char *what, const ds4_model *main_model, ds4_backend *host,
                           bool numerics, char *err, size_t errlen);
void ds4_mtp_free(ds4_mtp *d);
const char *ds4_mtp_name(const ds4_mtp *d);
uint64_t ds4_mtp_file_bytes(const ds4_mtp *d);
uint64_t ds4_mtp_state_bytes(const ds4_mtp *d, int ctx);

ds4_mtp_state *ds4_mtp_state_new(ds4_mtp *d, int ctx);   /* NULL: out of memory */
void ds4_mtp_state_free(ds4_mtp_state *st);
void ds4_mtp_bind(ds4_mtp_state *st, ds4_backend_seq *q);
void ds4_mtp_evaluated(ds4_mtp_state *st, int n_pos);
void ds4_mtp_rewound(ds4_mtp_state *st, int n_pos);
void ds4_mtp_forget(ds4_mtp_state *st, int n_pos);
int ds4_mtp_draft(ds4_mtp_state *st, const int32_t *toks, int n, int32_t last, int max, float margin, int32_t *out,
                  float *first_logits, char *err, size_t errlen);

#endif
