/* logprobs.h -- token log-probabilities in the OpenAI shapes (server-api.md
 * 4.6 for chat, 5.x for legacy completions).
 *
 * Contract
 * - Values are the raw log-softmax of the logits (temperature 1, before any
 *   sampling filter). Token text is the token's bytes when they are valid
 *   UTF-8, else a lossless "bytes:\xNN..." spelling (never replaced).
 * - ds4_chat_logprob_entry(): {"token","logprob","bytes","top_logprobs"} with
 *   up to 20 alternatives.
 * - cmpl_logprobs: the four parallel arrays of a completions choice; a
 *   position added with NULL logits (the first prompt token has no context,
 *   echo positions before their logits are known) holds nulls until
 *   ds4_cmpl_logprobs_set(). ds4_cmpl_logprobs_object() hands the arrays over.
 */
#ifndef DS4_LOGPROBS_H
#define DS4_LOGPROBS_H

#include <stddef.h>
#include <stdint.h>

struct cJSON;
typedef struct server server;

struct cJSON *ds4_chat_logprob_entry(server *s, const float *logits, int32_t tok, int top_k);

typedef struct {
    struct cJSON *tokens, *token_logprobs, *top_logprobs, *text_offset;
} cmpl_logprobs;

void ds4_cmpl_logprobs_init(cmpl_logprobs *a);
void ds4_cmpl_logprobs_add(server *s, cmpl_logprobs *a, const float *logits, int32_t id, int top_k, size_t offset);
void ds4_cmpl_logprobs_set(server *s, cmpl_logprobs *a, int i, const float *logits, int32_t id, int top_k);
struct cJSON *ds4_cmpl_logprobs_object(cmpl_logprobs *a);

#endif
