/* spec.h -- speculative decoding's drafters and their statistics.
 *
 * A drafter proposes the tokens it expects to follow a context; the
 * generation loop (generate.h) appends them after the token it has just
 * chosen in one multi-token pass and keeps each proposal only while the token
 * the loop chooses next, from exactly the logits target-only decoding would
 * have seen, equals it. So the drafter changes how many passes a run takes,
 * never which tokens, logits or state it produces.
 *
 * Contract
 * - Prompt lookup (`lookup_max` > 0): the longest suffix of the context, at
 *   most DS4_SPEC_LOOKUP_NGRAM_MAX and at least `lookup_min_ngram` tokens,
 *   that occurred earlier in the context is matched at its most recent
 *   earlier occurrence, and the tokens that followed it there are proposed,
 *   up to `lookup_max` and never past the context's end. No match, no
 *   proposal.
 * - ds4_spec_propose() drafts after the context `ctx[0..n)` followed by
 *   `last` (the token the loop has just chosen, not yet in the session): it
 *   writes at most `max` ids to `out` and returns how many. It reads the
 *   context only; it never allocates.
 * - ds4_spec_record_pass() counts one verification pass of `proposed` drafts;
 *   ds4_spec_record_accept() counts the draft at `position` (0-based) kept.
 * - MTP (`mtp_path`, --mtp FILE; the front end loads the engine with it):
 *   the model's own draft block (engine.h: ds4_session_draft) proposes up to
 *   `mtp_draft` tokens, each only while its logit leads the runner-up by at
 *   least `mtp_margin`. With both drafters, a prompt-lookup match is proposed
 *   when there is one, else the MTP draft.
 * - DSpark (`dspark_path`, --dspark FILE; replaces MTP, both given is
 *   refused): the block drafter (engine.h: ds4_session_draft) proposes up
 *   to its block size (five) of tokens, the longest prefix whose product of
 *   confidences is at least `dspark_confidence` (0: the whole block).
 *   With prompt lookup, a lookup match first, as for MTP.
 * - A draft model (MTP or DSpark) costs a pass whether or not it is
 *   confident, so after a try that proposed nothing, or whose drafts were
 *   all rejected, the drafter skips the next 1, 2, 4, ... up to
 *   DS4_SPEC_DRAFT_BACKOFF_MAX decode steps; an accepted draft resets the
 *   wait. A model that never agrees with its draft then pays for about one
 *   try in DS4_SPEC_DRAFT_BACKOFF_MAX steps. DSpark at confidence 0 (fixed
 *   blocks, a diagnostic) drafts on every step.
 * - ds4_spec_draft() is the loop's call: the proposal after the session's
 *   tokens followed by `last`, from every drafter that is on, up to max; -1
 *   (err) when the draft model failed.
 * - `quality` (--quality) and `dspark_strict` (--dspark-strict) turn every drafter off: the loop decodes one token
 *   per pass, as the seed's strict mode does.
 * - ds4_spec_stats_line() formats the run's line: passes, proposed, accepted,
 *   acceptance by draft position, committed tokens per verification pass.
 */
#ifndef DS4_SPEC_H
#define DS4_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DS4_SPEC_MAX_DRAFT 16
#define DS4_SPEC_LOOKUP_NGRAM_MAX 8
/* A failed try costs about a step on a memory-bound model (the draft plus a
 * wider pass): one try in 32 steps keeps a draft that never agrees within
 * about 3% of target-only decoding. */
#define DS4_SPEC_DRAFT_BACKOFF_MAX 32

typedef struct {
    int lookup_max;         /* --spec-lookup N: tokens proposed per pass, 0 = off */
    int lookup_min_ngram;   /* shortest suffix worth matching (default 2) */
    const char *mtp_path;   /* --mtp FILE: the MTP support file (NULL: off) */
    int mtp_draft;          /* --mtp-draft N: MTP tokens per pass (default 1) */
    float mtp_margin;       /* --mtp-margin F: least lead of a drafted token's logit (default 3) */
    const char *dspark_path;/* --dspark FILE: the DSpark support file (NULL: off; replaces --mtp) */
    float dspark_confidence;/* --dspark-confidence F: least confidence of a proposed block prefix (default 0.9) */
    bool dspark_strict;     /* --dspark-strict: target-only decoding, as --quality */
    bool quality;           /* --quality: target-only decoding, every drafter off */
    bool draft_every_step;  /* tests and measurements: no back-off, the draft model tries every step */
} ds4_spec_params;

typedef struct {
    uint64_t passes;        /* verification passes (a proposal was checked) */
    uint64_t proposed, accepted;
    uint64_t proposed_at[DS4_SPEC_MAX_DRAFT], accepted_at[DS4_SPEC_MAX_DRAFT];
} ds4_spec_stats;

typedef struct {
    ds4_spec_params p;
    ds4_spec_stats stats;
    /* draft-model back-off: steps still to skip, the current wait, and the accepted
     * count when the draft model last drafted (-1: it has not) */
    int draft_skip, draft_wait;
    int64_t draft_accepted_then;
} ds4_spec;

void ds4_spec_params_default(ds4_spec_params *p);
/* false (err filled) when a parameter is out of range */
bool ds4_spec_init(ds4_spec *sp, const ds4_spec_params *p, char *err, size_t errlen);
static inline bool ds4_spec_strict(const ds4_spec_params *p) { return p->quality || p->dspark_strict; }
/* Whether the options ask for a drafter (then the front end initialises one). */
static inline bool ds4_spec_wanted(const ds4_spec_params *p) {
    return !ds4_spec_strict(p) && (p->lookup_max > 0 || p->mtp_path || p->dspark_path);
}
static inline bool ds4_spec_enabled(const ds4_spec *sp) {
    return sp && !ds4_spec_strict(&sp->p) && (sp->p.lookup_max > 0 || sp->p.mtp_path || sp->p.dspark_path);
}
/* What the front ends load the engine with: the support files unless
 * target-only decoding was asked for. */
static inline const char *ds4_spec_engine_mtp(const ds4_spec_params *p) {
    return ds4_spec_strict(p) ? NULL : p->mtp_path;
}
static inline const char *ds4_spec_engine_dspark(const ds4_spec_params *p) {
    return ds4_spec_strict(p) ? NULL : p->dspark_path;
}

/* prompt lookup alone (tests) */
int ds4_spec_propose(const ds4_spec *sp, const int32_t *ctx, int n, int32_t last, int max, int32_t *out);
struct ds4_session;
int ds4_spec_draft(ds4_spec *sp, struct ds4_session *s, int32_t last, int max, int32_t *out, char *err,
                   size_t errlen);
void ds4_spec_record_pass(ds4_spec *sp, int proposed);
void ds4_spec_record_accept(ds4_spec *sp, int position);
size_t ds4_spec_stats_line(const ds4_spec *sp, char *buf, size_t len);

#endif
