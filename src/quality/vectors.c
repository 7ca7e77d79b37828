#include "quality/vectors.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ds4_vectors_free(ds4_vectors *v) {
    for (int i = 0; i < v->n; i++) {
        ds4_vec_prompt *p = &v->p[i];
        for (int s = 0; s < p->n_steps; s++) { free(p->steps[s].top_id); free(p->steps[s].top_lp); }
        free(p->steps);
        free(p->prompt);
        free(p->name);
    }
    free(v->p);
    memset(v, 0, sizeof *v);
}

static bool get_id(const cJSON *j, int n_vocab, int32_t *out) {
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0 && j->valuedouble <= INT32_MAX) ||
        j->valuedouble != (int32_t)j->valuedouble)
        return false;
    if (n_vocab > 0 && j->valuedouble >= n_vocab) return false;
    *out = (int32_t)j->valuedouble;
    return true;
}

static bool parse_step(const cJSON *js, int n_vocab, ds4_vec_step *st, char *why, size_t whylen) {
    const cJSON *top = cJSON_GetObjectItemCaseSensitive(js, "top");
    if (!cJSON_IsObject(js) || !get_id(cJSON_GetObjectItemCaseSensitive(js, "id"), n_vocab, &st->id)) {
        snprintf(why, whylen, "needs an \"id\" inside the vocabulary");
        return false;
    }
    int n = cJSON_IsArray(top) ? cJSON_GetArraySize(top) : 0;
    if (n < 1) { snprintf(why, whylen, "needs a non-empty \"top\" array"); return false; }
    st->top_id = malloc((size_t)n * sizeof *st->top_id);
    st->top_lp = malloc((size_t)n * sizeof *st->top_lp);
    if (!st->top_id || !st->top_lp) { snprintf(why, whylen, "out of memory"); return false; }
    const cJSON *e;
    cJSON_ArrayForEach(e, top) {
        const cJSON *lp = cJSON_GetObjectItemCaseSensitive(e, "logprob");
        int k = st->n_top;
        if (!get_id(cJSON_GetObjectItemCaseSensitive(e, "id"), n_vocab, &st->top_id[k]) || !cJSON_IsNumber(lp) ||
            !(lp->valuedouble <= 0) || !isfinite(lp->valuedouble)) {
            snprintf(why, whylen, "top entry %d needs an \"id\" inside the vocabulary and a finite \"logprob\" <= 0", k);
            return false;
        }
        for (int j = 0; j < k; j++)
            if (st->top_id[j] == st->top_id[k]) { snprintf(why, whylen, "top entry %d repeats id %d", k, st->top_id[k]); return false; }
        if (k && lp->valuedouble > st->top_lp[k - 1]) { snprintf(why, whylen, "top entry %d is more likely than the one before it", k); return false; }
        st->top_lp[k] = lp->valuedouble;
        st->n_top++;
    }
    return true;
}

static bool parse_prompt(const cJSON *jp, int n_vocab, ds4_vec_prompt *p, char *why, size_t whylen) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(jp, "name");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(jp, "prompt_ids");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(jp, "steps");
    p->name = strdup(cJSON_IsString(name) ? name->valuestring : "");
    /* the name is printed in one-line reports and errors */
    for (char *c = p->name; c && *c; c++) if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    int n_ids = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
    int n_steps = cJSON_IsArray(steps) ? cJSON_GetArraySize(steps) : 0;
    if (!p->name) { snprintf(why, whylen, "out of memory"); return false; }
    if (n_ids < 1 || n_steps < 1) { snprintf(why, whylen, "needs non-empty \"prompt_ids\" and \"steps\" arrays"); return false; }
    p->prompt = malloc((size_t)n_ids * sizeof *p->prompt);
    p->steps = calloc((size_t)n_steps, sizeof *p->steps);
    if (!p->prompt || !p->steps) { snprintf(why, whylen, "out of memory"); return false; }
    const cJSON *e;
    cJSON_ArrayForEach(e, ids) {
        if (!get_id(e, n_vocab, &p->prompt[p->n_prompt])) { snprintf(why, whylen, "prompt id %d is not a token id of this model", p->n_prompt); return false; }
        p->n_prompt++;
    }
    cJSON_ArrayForEach(e, steps) {
        char sw[160];
        bool ok = parse_step(e, n_vocab, &p->steps[p->n_steps], sw, sizeof sw);
        p->n_steps++;
        if (!ok) { snprintf(why, whylen, "step %d %s", p->n_steps - 1, sw); return false; }
    }
    return true;
}

bool ds4_vectors_parse(const char *text, size_t len, int n_vocab, ds4_vectors *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "ds4_vectors");
    const cJSON *prompts = cJSON_GetObjectItemCaseSensitive(root, "prompts");
    bool ok = false;
    if (!cJSON_IsObject(root)) snprintf(err, errlen, "not a JSON object");
    else if (!cJSON_IsNumber(ver) || ver->valuedouble != 1) snprintf(err, errlen, "not a vector file (\"ds4_vectors\": 1 missing)");
    else if (!cJSON_IsArray(prompts) || cJSON_GetArraySize(prompts) < 1) snprintf(err, errlen, "no \"prompts\"");
    else if (!(out->p = calloc((size_t)cJSON_GetArraySize(prompts), sizeof *out->p))) snprintf(err, errlen, "out of memory");
    else {
        ok = true;
        const cJSON *jp;
        cJSON_ArrayForEach(jp, prompts) {
            char why[200];
            ds4_vec_prompt *p = &out->p[out->n++];
            if (!parse_prompt(jp, n_vocab, p, why, sizeof why)) {
                snprintf(err, errlen, "prompt %d (%s): %s", out->n - 1, p->name ? p->name : "", why);
                ok = false;
                break;
            }
        }
    }
    cJSON_Delete(root);
    if (!ok) ds4_vectors_free(out);
    return ok;
}

void ds4_vectors_score_step(const ds4_vec_step *st, const float *logits, int n_vocab, ds4_vec_score *out) {
    float mx = logits[0];
    int best = 0;
    for (int j = 1; j < n_vocab; j++) if (logits[j] > mx) { mx = logits[j]; best = j; }
    double z = 0;
    for (int j = 0; j < n_vocab; j++) z += exp((double)logits[j] - mx);
    const double lse = log(z) + mx;
    const int32_t ref = st->top_id[0];
    out->top1 = best == ref;
    out->rank = 0;
    for (int j = 0; j < n_vocab; j++) out->rank += logits[j] > logits[ref];
    out->gap = st->top_lp[0] - (logits[ref] - lse);
    /* both sides renormalised over the reference's top-k (log-sum-exp of each) */
    double pm = st->top_lp[0], qm = logits[st->top_id[0]];
    for (int k = 1; k < st->n_top; k++) {
        if (st->top_lp[k] > pm) pm = st->top_lp[k];
        if (logits[st->top_id[k]] > qm) qm = logits[st->top_id[k]];
    }
    double ps = 0, qs = 0;
    for (int k = 0; k < st->n_top; k++) { ps += exp(st->top_lp[k] - pm); qs += exp((double)logits[st->top_id[k]] - qm); }
    const double plse = log(ps) + pm, qlse = log(qs) + qm;
    out->kl = 0;
    for (int k = 0; k < st->n_top; k++) {
        double lp = st->top_lp[k] - plse, lq = (double)logits[st->top_id[k]] - qlse;
        out->kl += exp(lp) * (lp - lq);
    }
}
