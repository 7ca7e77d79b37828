/* generate.h -- the one token-generation loop, shared by the CLI and every
 * server endpoint.
 *
 * Contract
 * - ds4_generate() continues a prefilled session: it samples from the
 *   session's current logits, appends each sampled token with
 *   ds4_session_decode(), and hands every token and its text to the caller's
 *   hooks. It never prefills, rewinds or allocates per token.
 * - Each step, in this order: `cancelled` (true ends CANCELLED); the
 *   max_tokens limit (ends LENGTH); the token is chosen (`forced` when it
 *   returns >= 0, else the sampler, greedy while `greedy` says so);
 *   `on_token` sees it with the logits it came from (EOS included, so
 *   logprob writers can record it); EOS ends EOS without decoding; `on_text`
 *   gets its text (complete UTF-8 only, ds4_detok) and returns true to stop;
 *   a full context ends CTX_FULL with that token shown but not decoded;
 *   decode (failure ends ERROR with `err` filled); `after_decode`; a stop
 *   request ends STOPPED (the stopping token is part of the session, so the
 *   live KV matches the text the client saw up to it).
 * - At every end the detokenizer's held-back tail goes through `on_text`
 *   (its return value is ignored then).
 * - n_decoded counts the tokens appended to the session (EOS never is).
 * - Every hook is optional; `ud` is passed to each. `tok` may be NULL (a
 *   model file without a vocabulary): no stop ids, and on_text sees nothing.
 * - Speculation (`spec` with a drafter enabled): where the loop would decode
 *   its chosen token it may instead append that token and the drafter's
 *   proposal in one pass (ds4_session_prefill with every position's logits).
 *   Each later step still chooses its token from the logits target-only
 *   decoding would have given it (the pass's rows are bit-identical to
 *   decode's, engine.h) with the same hooks and sampler; a chosen token equal
 *   to the next drafted one is already appended, so its decode is skipped;
 *   the first that differs, and every end of the loop, drops the drafted
 *   rest (ds4_session_truncate). So tokens, hooks, logits, the session's
 *   state and n_decoded are those of target-only decoding, whatever the
 *   drafter proposes and whatever the sampler; only the number of backend
 *   passes changes. Drafts never reach past max_tokens or the context.
 */
#ifndef DS4_GENERATE_H
#define DS4_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "text/tokenizer.h"

typedef enum {
    DS4_GEN_EOS,
    DS4_GEN_LENGTH,
    DS4_GEN_CTX_FULL,
    DS4_GEN_STOPPED,
    DS4_GEN_CANCELLED,
    DS4_GEN_ERROR,
} ds4_gen_end;

typedef struct {
    bool (*cancelled)(void *ud);
    int (*forced)(void *ud, int step);
    bool (*greedy)(void *ud);
    void (*on_token)(void *ud, int32_t tok, const float *logits);
    bool (*on_text)(void *ud, const char *text, size_t len);
    void (*after_decode)(void *ud);
    /* appends the token to the session instead of ds4_session_decode() (the
     * server batches it with other sessions); same contract. Not used while
     * `spec` drafts: speculation appends through the session itself, so a
     * caller that must route its appends elsewhere leaves `spec` NULL. */
    int (*decode)(void *ud, int32_t tok, char *err, size_t errlen);
    void *ud;
    /* not a hook: a stop id is generated like any token and the loop runs to
     * max_tokens (ds4 --ignore-eos: long runs on random-weight models) */
    bool ignore_stop;
    /* not a hook: the drafter of speculative decoding and its stats (NULL or
     * disabled: every token is decoded alone) */
    ds4_spec *spec;
} ds4_gen_hooks;

typedef struct {
    ds4_gen_end end;
    int n_decoded;
} ds4_gen_result;

ds4_gen_result ds4_generate(ds4_session *s, const ds4_tokenizer *tok, ds4_sampler *smp, int max_tokens,
                            const ds4_gen_hooks *h, char *err, size_t errlen);

#endif
