#include "engine/spec.h"
#include "engine/engine.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

void ds4_spec_params_default(ds4_spec_params *p) {
    *p = (ds4_spec_params){.lookup_max = 0, .lookup_min_ngram = 2, .mtp_draft = 1, .mtp_margin = 3.0f,
                           .dspark_confidence = 0.9f};
}

bool ds4_spec_init(ds4_spec *sp, const ds4_spec_params *p, char *err, size_t errlen) {
    if (p->lookup_max < 0 || p->lookup_max > DS4_SPEC_MAX_DRAFT) {
        snprintf(err, errlen, "--spec-lookup %d: draft length must be 0..%d", p->lookup_max, DS4_SPEC_MAX_DRAFT);
        return false;
    }
    if (p->lookup_min_ngram < 1 || p->lookup_min_ngram > DS4_SPEC_LOOKUP_NGRAM_MAX) {
        snprintf(err, errlen, "lookup n-gram %d: must be 1..%d", p->lookup_min_ngram, DS4_SPEC_LOOKUP_NGRAM_MAX);
        return false;
    }
    if (p->mtp_draft < 1 || p->mtp_draft > DS4_SPEC_MAX_DRAFT) {
        snprintf(err, errlen, "--mtp-draft %d: draft length must be 1..%d", p->mtp_draft, DS4_SPEC_MAX_DRAFT);
        return false;
    }
    if (!isfinite(p->mtp_margin) || p->mtp_margin < 0) {
        snprintf(err, errlen, "--mtp-margin %g: must be a finite number >= 0", (double)p->mtp_margin);
        return false;
    }
    if (!(p->dspark_confidence >= 0 && p->dspark_confidence <= 1)) {
        snprintf(err, errlen, "--dspark-confidence %g: must be 0..1", (double)p->dspark_confidence);
        return false;
    }
    if (p->dspark && !p->dspark_path) {
        snprintf(err, errlen, "--dspark needs the DSpark support file: --mtp FILE --dspark");
        return false;
    }
    if (p->dspark_path && p->mtp_path) {
        snprintf(err, errlen, "--dspark replaces --mtp: give one of them");
        return false;
    }
    memset(sp, 0, sizeof *sp);
    sp->p = *p;
    ds4_draft_budget_init(&sp->budget);
    return true;
}

/* The context with the chosen token appended, read without copying it. */
typedef struct {
    const int32_t *ctx;
    int n;          /* tokens in ctx; position n is `last` */
    int32_t last;
} seq;
static int32_t at(const seq *q, int i) { return i < q->n ? q->ctx[i] : q->last; }

static bool same(const seq *q, int a, int b, int len) {
    for (int i = 0; i < len; i++)
        if (at(q, a + i) != at(q, b + i)) return false;
    return true;
}

/* Longest suffix first, most recent earlier occurrence first: the longer the
 * match, the likelier the continuation repeats; the most recent copy is the
 * one an edit or a quote is most likely continuing. */
static int lookup(const ds4_spec_params *p, const seq *q, int max, int32_t *out) {
    const int len = q->n + 1;
    int longest = len - 1 < DS4_SPEC_LOOKUP_NGRAM_MAX ? len - 1 : DS4_SPEC_LOOKUP_NGRAM_MAX;
    for (int g = longest; g >= p->lookup_min_ngram; g--) {
        const int suffix = len - g;
        for (int start = suffix - 1; start >= 0; start--) {
            if (at(q, start + g - 1) != q->last || !same(q, start, suffix, g)) continue;
            int follow = start + g, k = 0;
            while (k < max && follow + k < len) { out[k] = at(q, follow + k); k++; }
            if (k) return k;
        }
    }
    return 0;
}

int ds4_spec_propose(const ds4_spec *sp, const int32_t *ctx, int n, int32_t last, int max, int32_t *out) {
    if (!ds4_spec_enabled(sp) || sp->p.lookup_max <= 0 || n < 1 || max <= 0) return 0;
    if (max > sp->p.lookup_max) max = sp->p.lookup_max;
    const seq q = {ctx, n, last};
    return lookup(&sp->p, &q, max, out);
}

void ds4_draft_budget_init(ds4_draft_budget *b) {
    *b = (ds4_draft_budget){.step_ms = 0, .credit = DS4_SPEC_DRAFT_CREDIT_START};
}

bool ds4_draft_budget_allows(const ds4_draft_budget *b) { return b->step_ms > 0 && b->credit > 0; }

void ds4_draft_budget_note(ds4_draft_budget *b, double ms, int advanced, bool tried) {
    if (!(ms >= 0) || advanced < 1) return;
    if (!tried) {
        /* a plain step: the running mean moves a quarter of the way, so one
         * stall of the machine cannot make tries look cheap for long */
        b->step_ms = b->step_ms > 0 ? 0.75 * b->step_ms + 0.25 * ms : ms;
    } else if (b->step_ms > 0) {
        /* the try's cost: its pass and draft against the steps target-only
         * decoding would have taken for the same tokens (negative: a gain) */
        b->credit -= ms / b->step_ms - advanced;
    }
    b->credit += DS4_SPEC_DRAFT_BUDGET * advanced;
    if (b->credit > DS4_SPEC_DRAFT_CREDIT_MAX) b->credit = DS4_SPEC_DRAFT_CREDIT_MAX;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

void ds4_spec_begin(ds4_spec *sp) {
    if (sp) sp->last_pass = DS4_SPEC_PASS_NONE;
}

/* Books the interval since the last call to the pass it timed: only a plain
 * step or a try, and only when the session moved on by what that pass could
 * commit (anything else, a rewind or a new prompt, is not a pass's time). */
static void note_last_pass(ds4_spec *sp, double now, int n) {
    const int advanced = n - sp->last_n;
    if (sp->last_pass != DS4_SPEC_PASS_NONE && advanced >= 1 && advanced <= sp->last_span)
        ds4_draft_budget_note(&sp->budget, now - sp->last_ms, advanced, sp->last_pass == DS4_SPEC_PASS_TRIED);
    sp->last_pass = DS4_SPEC_PASS_NONE;
    sp->last_ms = now;
    sp->last_n = n;
}

int ds4_spec_draft(ds4_spec *sp, ds4_session *s, int32_t last, int max, int32_t *out, char *err,
                   size_t errlen) {
    if (!ds4_spec_enabled(sp) || max <= 0) return 0;
    const int n = ds4_session_n_tokens(s);
    const bool model = sp->p.mtp_path || sp->p.dspark_path;
    if (model) note_last_pass(sp, now_ms(), n);
    int k = ds4_spec_propose(sp, ds4_session_tokens(s), n, last, max, out);
    if (k || !model) return k;
    sp->stats.draft_calls++;
    /* --dspark-confidence 0 and --mtp-margin 0 are the diagnostics: a draft every step */
    const bool always = sp->p.draft_every_step || (sp->p.dspark_path ? sp->p.dspark_confidence == 0
                                                                      : sp->p.mtp_margin == 0);
    if (!always && !ds4_draft_budget_allows(&sp->budget)) {
        sp->last_pass = DS4_SPEC_PASS_PLAIN;
        sp->last_span = 1;
        return 0;
    }
    sp->stats.draft_tries++;
    if (sp->p.dspark_path) k = ds4_session_draft(s, last, max, sp->p.dspark_confidence, out, err, errlen);
    else k = ds4_session_draft(s, last, max < sp->p.mtp_draft ? max : sp->p.mtp_draft, sp->p.mtp_margin, out, err,
                               errlen);
    sp->last_pass = DS4_SPEC_PASS_TRIED;
    sp->last_span = 1 + (k > 0 ? k : 0);
    return k;
}

void ds4_spec_record_pass(ds4_spec *sp, int proposed) {
    ds4_spec_stats *st = &sp->stats;
    st->passes++;
    st->proposed += (uint64_t)proposed;
    for (int i = 0; i < proposed && i < DS4_SPEC_MAX_DRAFT; i++) st->proposed_at[i]++;
}

void ds4_spec_record_accept(ds4_spec *sp, int position) {
    sp->stats.accepted++;
    if (position >= 0 && position < DS4_SPEC_MAX_DRAFT) sp->stats.accepted_at[position]++;
}

static const char *kind_name(const ds4_spec_params *p) {
    const char *model = p->dspark_path ? "dspark" : p->mtp_path ? "mtp" : NULL;
    if (p->lookup_max <= 0) return model ? model : "off";
    return !model ? "lookup" : p->dspark_path ? "lookup+dspark" : "lookup+mtp";
}

size_t ds4_spec_stats_line(const ds4_spec *sp, char *buf, size_t len) {
    const ds4_spec_stats *st = &sp->stats;
    size_t o = 0;
    /* each pass commits its accepted drafts plus the token the pass decoded */
    double per_pass = st->passes ? (double)(st->accepted + st->passes) / (double)st->passes : 0.0;
    o += (size_t)snprintf(buf + o, len - o,
                          "spec %s: %llu passes, proposed %llu, accepted %llu (%.1f%%), %.2f tokens/pass, by position",
                          kind_name(&sp->p),
                          (unsigned long long)st->passes, (unsigned long long)st->proposed,
                          (unsigned long long)st->accepted, st->proposed ? 100.0 * st->accepted / st->proposed : 0.0,
                          per_pass);
    for (int i = 0; i < DS4_SPEC_MAX_DRAFT && st->proposed_at[i] && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, " %d:%.0f%%", i + 1,
                              100.0 * st->accepted_at[i] / st->proposed_at[i]);
    if (st->draft_calls && o < len)
        o += (size_t)snprintf(buf + o, len - o, "; draft model run on %llu of %llu passes",
                              (unsigned long long)st->draft_tries, (unsigned long long)st->draft_calls);
    return o < len ? o : len - 1;
}
