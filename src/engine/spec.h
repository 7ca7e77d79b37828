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
 * - DSpark (`dspark_path`: --mtp FILE --dspark, or --dspark FILE; it
 *   replaces MTP, so an MTP file beside it is refused, as is --dspark
 *   without a file): the block drafter (engine.h: ds4_session_draft) proposes up
 *   to its block size (five) of tokens, the longest prefix whose product of
 *   confidences is at least `dspark_confidence` (0: the whole block).
 *   With prompt lookup, a lookup match first, as for MTP.
 * - A draft model (MTP or DSpark) costs time whether or not it is right, so
 *   it runs on a budget (ds4_draft_budget below): the loop's time between two
 *   calls is measured, a try's cost is its interval less the decode steps
 *   target-only decoding would have spent on the tokens it committed, and
 *   the model is tried only while its credit (what accepted drafts saved,
 *   plus DS4_SPEC_DRAFT_BUDGET of every decode step, less what tries cost) is
 *   positive. A drafter that never agrees thus costs at most about
 *   DS4_SPEC_DRAFT_BUDGET of the decode time after its first try; one that
 *   pays for itself is tried on every step. DSpark at confidence 0 (fixed
 *   blocks), MTP at margin 0 (every draft proposed), both diagnostics, and
 *   `draft_every_step` try on every step.
 * - ds4_spec_begin() marks the start of a generation (the time since the
 *   last call is no decode step); ds4_spec_draft() is the loop's call once
 *   per pass: the proposal after the session's tokens followed by `last`,
 *   from every drafter that is on, up to max; -1 (err) when the draft model
 *   failed.
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
/* The draft model's budget, in decode steps: a drafter that never pays costs
 * at most this share of the decode time (after its first try, which the
 * starting credit allows), and credit saved by accepted drafts is kept up to
 * a few steps, so a good run does not buy a long bad one. */
#define DS4_SPEC_DRAFT_BUDGET 0.02
#define DS4_SPEC_DRAFT_CREDIT_START 0.25
#define DS4_SPEC_DRAFT_CREDIT_MAX 4.0

/* The budget's accounting, apart from the clock (tests feed it intervals). */
typedef struct {
    double step_ms;     /* running mean of one target-only decode step (0: none measured yet) */
    double credit;      /* decode steps the drafter may still spend */
} ds4_draft_budget;

void ds4_draft_budget_init(ds4_draft_budget *b);
/* Whether the draft model may run now: a step has been measured and credit is left. */
bool ds4_draft_budget_allows(const ds4_draft_budget *b);
/* One pass of the loop took `ms` and committed `advanced` tokens; `tried`:
 * the draft model ran at its start. */
void ds4_draft_budget_note(ds4_draft_budget *b, double ms, int advanced, bool tried);

typedef struct {
    int lookup_max;         /* --spec-lookup N: tokens proposed per pass, 0 = off */
    int lookup_min_ngram;   /* shortest suffix worth matching (default 2) */
    const char *mtp_path;   /* --mtp FILE: the MTP support file (NULL: off) */
    int mtp_draft;          /* --mtp-draft N: MTP tokens per pass (default 1) */
    float mtp_margin;       /* --mtp-margin F: least lead of a drafted token's logit (default 3) */
    const char *dspark_path;/* the DSpark support file (--mtp FILE --dspark, or --dspark FILE; NULL: off) */
    bool dspark;            /* --dspark was given (without a file: refused by ds4_spec_init) */
    float dspark_confidence;/* --dspark-confidence F: least confidence of a proposed block prefix (default 0.9) */
    bool dspark_strict;     /* --dspark-strict: target-only decoding, as --quality */
    bool quality;           /* --quality: target-only decoding, every drafter off */
    bool draft_every_step;  /* tests and measurements: no back-off, the draft model tries every step */
} ds4_spec_params;

typedef struct {
    uint64_t passes;        /* verification passes (a proposal was checked) */
    uint64_t proposed, accepted;
    uint64_t proposed_at[DS4_SPEC_MAX_DRAFT], accepted_at[DS4_SPEC_MAX_DRAFT];
    uint64_t draft_calls, draft_tries;  /* passes that could use the draft model, and those that ran it */
} ds4_spec_stats;

typedef struct {
    ds4_spec_params p;
    ds4_spec_stats stats;
    ds4_draft_budget budget;
    /* the last ds4_spec_draft call: when (ms), the session's length, how far
     * its pass may advance it, and what it did (a pass of the kind measured) */
    double last_ms;
    int last_n, last_span;
    enum { DS4_SPEC_PASS_NONE, DS4_SPEC_PASS_PLAIN, DS4_SPEC_PASS_TRIED } last_pass;
} ds4_spec;

void ds4_spec_params_default(ds4_spec_params *p);
/* false (err filled) when a parameter is out of range */
bool ds4_spec_init(ds4_spec *sp, const ds4_spec_params *p, char *err, size_t errlen);
static inline bool ds4_spec_strict(const ds4_spec_params *p) { return p->quality || p->dspark_strict; }
/* Whether the options ask for a drafter (then the front end initialises one). */
static inline bool ds4_spec_wanted(const ds4_spec_params *p) {
    return !ds4_spec_strict(p) && (p->lookup_max > 0 || p->mtp_path || p->dspark_path || p->dspark);
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
void ds4_spec_begin(ds4_spec *sp);
int ds4_spec_draft(ds4_spec *sp, struct ds4_session *s, int32_t last, int max, int32_t *out, char *err,
                   size_t errlen);
void ds4_spec_record_pass(ds4_spec *sp, int proposed);
void ds4_spec_record_accept(ds4_spec *sp, int position);
size_t ds4_spec_stats_line(const ds4_spec *sp, char *buf, size_t len);

#endif
