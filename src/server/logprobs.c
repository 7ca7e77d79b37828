#include "server/logprobs.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "server/server_state.h"

/* OpenAI's cap on top_logprobs. */
#define MAX_TOP_LOGPROBS 20

static char *token_text(server *s, int32_t id) {
    size_t n = 0;
    const char *b = ds4_tokenizer_token_bytes(s->tok, id, &n);
    if (!b) return strdup("");
    if (ds4_utf8_valid(b, n)) return strndup(b, n);
    char *out = malloc(6 + 4 * n + 1);
    if (!out) return NULL;
    size_t o = (size_t)sprintf(out, "bytes:");
    for (size_t i = 0; i < n; i++) o += (size_t)sprintf(out + o, "\\x%02x", (unsigned char)b[i]);
    return out;
}

static cJSON *token_lp(server *s, int32_t id, float lp) {
    cJSON *o = cJSON_CreateObject();
    char *t = token_text(s, id);
    cJSON_AddStringToObject(o, "token", t ? t : "");
    free(t);
    cJSON_AddNumberToObject(o, "logprob", lp);
    size_t n = 0;
    const char *b = ds4_tokenizer_token_bytes(s->tok, id, &n);
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; b && i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)b[i]));
    return o;
}

cJSON *ds4_chat_logprob_entry(server *s, const float *logits, int32_t tok, int top_k) {
    cJSON *o = token_lp(s, tok, ds4_logprob(logits, s->n_vocab, tok));
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    int ids[MAX_TOP_LOGPROBS];
    float lps[MAX_TOP_LOGPROBS];
    int n = top_k > 0 ? ds4_top_logprobs(logits, s->n_vocab, top_k > MAX_TOP_LOGPROBS ? MAX_TOP_LOGPROBS : top_k,
                                         ids, lps) : 0;
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(top, token_lp(s, ids[i], lps[i]));
    return o;
}

void ds4_cmpl_logprobs_init(cmpl_logprobs *a) {
    a->tokens = cJSON_CreateArray();
    a->token_logprobs = cJSON_CreateArray();
    a->top_logprobs = cJSON_CreateArray();
    a->text_offset = cJSON_CreateArray();
}

/* {token_text: logprob} of the k most likely tokens plus the actual one;
 * on a text collision the higher logprob (listed first) is kept. */
static cJSON *top_object(server *s, const float *logits, int32_t id, int k) {
    int ids[MAX_TOP_LOGPROBS + 1];
    float lps[MAX_TOP_LOGPROBS + 1];
    int kk = ds4_top_logprobs(logits, s->n_vocab, k < 1 ? 1 : k > MAX_TOP_LOGPROBS ? MAX_TOP_LOGPROBS : k, ids, lps);
    ids[kk] = id;
    lps[kk] = ds4_logprob(logits, s->n_vocab, id);
    cJSON *top = cJSON_CreateObject();
    for (int i = 0; i <= kk; i++) {
        char *tt = token_text(s, ids[i]);
        if (tt && !cJSON_GetObjectItemCaseSensitive(top, tt)) cJSON_AddNumberToObject(top, tt, lps[i]);
        free(tt);
    }
    return top;
}

void ds4_cmpl_logprobs_add(server *s, cmpl_logprobs *a, const float *logits, int32_t id, int top_k, size_t offset) {
    char *t = token_text(s, id);
    cJSON_AddItemToArray(a->tokens, cJSON_CreateString(t ? t : ""));
    free(t);
    cJSON_AddItemToArray(a->text_offset, cJSON_CreateNumber((double)offset));
    cJSON_AddItemToArray(a->token_logprobs, logits ? cJSON_CreateNumber(ds4_logprob(logits, s->n_vocab, id))
                                                   : cJSON_CreateNull());
    cJSON_AddItemToArray(a->top_logprobs, logits ? top_object(s, logits, id, top_k) : cJSON_CreateNull());
}

void ds4_cmpl_logprobs_set(server *s, cmpl_logprobs *a, int i, const float *logits, int32_t id, int top_k) {
    cJSON_ReplaceItemInArray(a->token_logprobs, i, cJSON_CreateNumber(ds4_logprob(logits, s->n_vocab, id)));
    cJSON_ReplaceItemInArray(a->top_logprobs, i, top_object(s, logits, id, top_k));
}

cJSON *ds4_cmpl_logprobs_object(cmpl_logprobs *a) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "tokens", a->tokens);
    cJSON_AddItemToObject(o, "token_logprobs", a->token_logprobs);
    cJSON_AddItemToObject(o, "top_logprobs", a->top_logprobs);
    cJSON_AddItemToObject(o, "text_offset", a->text_offset);
    return o;
}
