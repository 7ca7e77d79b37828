/* tokenizer_import.c -- getting a vocabulary in: from GGUF metadata, from a
 * Hugging Face tokenizer.json (plus an optional added-tokens overlay), and
 * writing the tokenizer.* GGUF keys from such a JSON. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer_internal.h"

/* ------------------------------------------------------------- GGUF */

static bool pre_is(ds4_gguf_str pre, const char *name) {
    return pre.len == strlen(name) && !memcmp(pre.ptr, name, pre.len);
}

ds4_tokenizer *ds4_tokenizer_from_gguf(const ds4_gguf *g, char *err, size_t errlen) {
    const ds4_gguf_kv *tk = ds4_gguf_find_kv(g, "tokenizer.ggml.tokens");
    const ds4_gguf_kv *mk = ds4_gguf_find_kv(g, "tokenizer.ggml.merges");
    const ds4_gguf_kv *ty = ds4_gguf_find_kv(g, "tokenizer.ggml.token_type");
    ds4_gguf_str model;
    if (ds4_gguf_get_str(g, "tokenizer.ggml.model", &model) &&
        !(model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0)) {
        snprintf(err, errlen, "tokenizer: tokenizer.ggml.model is \"%.*s\", not byte-level BPE (\"gpt2\")",
                 (int)(model.len > 40 ? 40 : model.len), model.ptr);
        return NULL;
    }
    if (!tk || tk->type != DS4_GGUF_ARRAY || tk->arr_type != DS4_GGUF_STRING) {
        snprintf(err, errlen, "tokenizer: GGUF has no string array tokenizer.ggml.tokens");
        return NULL;
    }
    if (!mk || mk->type != DS4_GGUF_ARRAY || mk->arr_type != DS4_GGUF_STRING) {
        snprintf(err, errlen, "tokenizer: GGUF has no string array tokenizer.ggml.merges");
        return NULL;
    }
    /* tokenizer.ggml.pre names the splitting rules with llama.cpp's names.
     * ds4 implements two: "glm4" (GLM 5.2) and DeepSeek V3/V4's three-regex
     * set, which llama.cpp calls "joyai-llm" (what the released files and
     * ds4 write) or "deepseek-v3"; a file without the key is DeepSeek.
     * Any other name (llama.cpp's converter writes its guess when it does
     * not recognise a tokenizer) is refused by name rather than read with
     * the wrong rules or checked against the wrong family's tokens. */
    ds4_gguf_str pre = {0};
    bool has_pre = ds4_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    bool glm = has_pre && pre_is(pre, "glm4");
    if (has_pre && !glm && !pre_is(pre, "joyai-llm") && !pre_is(pre, "deepseek-v3")) {
        snprintf(err, errlen, "tokenizer: tokenizer.ggml.pre is \"%.*s\", a pre-tokenizer ds4 does not implement "
                 "(it has \"glm4\" for GLM 5.2, \"joyai-llm\" or \"deepseek-v3\" for DeepSeek V4)",
                 (int)(pre.len > 40 ? 40 : pre.len), pre.ptr);
        return NULL;
    }
    ds4_tok_config cfg = { glm ? DS4_TOK_FAMILY_GLM : DS4_TOK_FAMILY_DS4, glm };
    int32_t *types = NULL;
    if (ty) {
        if (ty->type != DS4_GGUF_ARRAY || ty->arr_n != tk->arr_n) {
            snprintf(err, errlen, "tokenizer: tokenizer.ggml.token_type is not an array of %llu integers",
                     (unsigned long long)tk->arr_n);
            return NULL;
        }
        types = malloc((tk->arr_n ? tk->arr_n : 1) * sizeof *types);
        if (!types) { snprintf(err, errlen, "tokenizer: out of memory"); return NULL; }
        for (uint64_t i = 0; i < ty->arr_n; i++) {
            int64_t v;
            if (!ds4_gguf_arr_i64(ty, i, &v) || v < INT32_MIN || v > INT32_MAX) {
                snprintf(err, errlen, "tokenizer: tokenizer.ggml.token_type[%llu] is not an integer",
                         (unsigned long long)i);
                free(types);
                return NULL;
            }
            types[i] = (int32_t)v;
        }
    }
    ds4_tokenizer *t = ds4_tokenizer_build(tk->arr_strs, types, tk->arr_n, mk->arr_strs, mk->arr_n, &cfg, err, errlen);
    free(types);
    return t;
}

/* -------------------------------------------------------- tokenizer.json */

/* The vocabulary of one or two tokenizer.json files, flattened to id order.
 * Strings point into the cJSON trees, or into `joined` for merges stored as
 * ["LEFT", "RIGHT"] pairs (newer tokenizers versions). */
typedef struct {
    cJSON *root, *overlay;
    ds4_tok_config cfg;
    size_t n;
    const char **tok;
    int32_t *type;
    size_t n_merges;
    const char **merge;
    char **joined;
} hf_vocab;

static void hf_free(hf_vocab *v) {
    for (size_t i = 0; v->joined && i < v->n_merges; i++) free(v->joined[i]);
    free(v->joined); free(v->merge); free(v->tok); free(v->type);
    cJSON_Delete(v->root); cJSON_Delete(v->overlay);
}

static cJSON *read_json(const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, errlen, "tokenizer: cannot open %s", path); return NULL; }
    char *buf = NULL;
    long len = -1;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1)) &&
        fread(buf, 1, (size_t)len, f) != (size_t)len) { free(buf); buf = NULL; }
    fclose(f);
    if (!buf) { snprintf(err, errlen, "tokenizer: cannot read %s", path); return NULL; }
    cJSON *j = cJSON_ParseWithLength(buf, (size_t)len);
    free(buf);
    if (!j) snprintf(err, errlen, "tokenizer: %s is not valid JSON", path);
    return j;
}

static bool id_ok(const cJSON *x) {
    return cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < (1 << 24) &&
           x->valuedouble == (double)(int)x->valuedouble;
}

/* Sets tok/type for every added token of `list`; sizes `n` on the first pass
 * (tok == NULL) and fills on the second. */
static int hf_added(hf_vocab *v, const cJSON *list, const char *path, char *err, size_t errlen) {
    const cJSON *a;
    cJSON_ArrayForEach(a, list) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!id_ok(id) || !cJSON_IsString(c) || !c->valuestring[0]) {
            snprintf(err, errlen, "tokenizer: %s: an added token lacks an id or content", path);
            return -1;
        }
        size_t i = (size_t)id->valuedouble;
        if (!v->tok) { if (i >= v->n) v->n = i + 1; continue; }
        v->tok[i] = c->valuestring;
        v->type[i] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special"))
                   ? DS4_TT_CONTROL : DS4_TT_USER_DEFINED;
    }
    return 0;
}

/* GLM's Split regex exactly as its tokenizer.json spells it (sheet 8). */
static const char GLM4_SPLIT[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* True when the pre-tokenizer (or one step of a Sequence) is GLM's Split. */
static bool has_glm4_split(const cJSON *pt) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (!cJSON_IsString(type)) return false;
    if (!strcmp(type->valuestring, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers"))
            if (has_glm4_split(e)) return true;
        return false;
    }
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pt, "pattern"), "Regex");
    return !strcmp(type->valuestring, "Split") && cJSON_IsString(re) && !strcmp(re->valuestring, GLM4_SPLIT);
}

static int hf_load(hf_vocab *v, const char *path, const char *added_path, char *err, size_t errlen) {
    memset(v, 0, sizeof *v);
    v->root = read_json(path, err, errlen);
    if (!v->root) return -1;
    if (added_path && !(v->overlay = read_json(added_path, err, errlen))) return -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(v->root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(v->root, "added_tokens");
    const cJSON *added2 = cJSON_GetObjectItemCaseSensitive(v->overlay, "added_tokens");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0 ||
        !cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        snprintf(err, errlen, "tokenizer: %s is not a BPE tokenizer.json (model.type/vocab/merges)", path);
        return -1;
    }
    if ((added && !cJSON_IsArray(added)) || (v->overlay && !cJSON_IsArray(added2))) {
        snprintf(err, errlen, "tokenizer: \"added_tokens\" is not an array");
        return -1;
    }
    v->cfg.family = has_glm4_split(cJSON_GetObjectItemCaseSensitive(v->root, "pre_tokenizer"))
                  ? DS4_TOK_FAMILY_GLM : DS4_TOK_FAMILY_DS4;
    v->cfg.ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!id_ok(e)) { snprintf(err, errlen, "tokenizer: %s: bad id for \"%.40s\"", path, e->string); return -1; }
        if ((size_t)e->valuedouble >= v->n) v->n = (size_t)e->valuedouble + 1;
    }
    if (hf_added(v, added, path, err, errlen) < 0 || hf_added(v, added2, added_path, err, errlen) < 0)
        return -1;
    v->tok = calloc(v->n ? v->n : 1, sizeof *v->tok);
    v->type = calloc(v->n ? v->n : 1, sizeof *v->type);
    if (!v->tok || !v->type) { snprintf(err, errlen, "tokenizer: out of memory"); return -1; }
    cJSON_ArrayForEach(e, vocab) {
        size_t i = (size_t)e->valuedouble;
        if (v->tok[i]) { snprintf(err, errlen, "tokenizer: %s: id %zu appears twice in the vocabulary", path, i); return -1; }
        v->tok[i] = e->string;
        v->type[i] = DS4_TT_NORMAL;
    }
    if (hf_added(v, added, path, err, errlen) < 0 || hf_added(v, added2, added_path, err, errlen) < 0)
        return -1;
    for (size_t i = 0; i < v->n; i++)
        if (!v->tok[i]) { snprintf(err, errlen, "tokenizer: %s: no token has id %zu", path, i); return -1; }

    v->n_merges = (size_t)cJSON_GetArraySize(merges);
    v->merge = calloc(v->n_merges + 1, sizeof *v->merge);
    v->joined = calloc(v->n_merges + 1, sizeof *v->joined);
    if (!v->merge || !v->joined) { snprintf(err, errlen, "tokenizer: out of memory"); return -1; }
    size_t r = 0;
    cJSON_ArrayForEach(e, merges) {
        const cJSON *l = cJSON_GetArrayItem(e, 0), *rt = cJSON_GetArrayItem(e, 1);
        if (cJSON_IsString(e)) v->merge[r] = e->valuestring;
        else if (cJSON_GetArraySize(e) == 2 && cJSON_IsString(l) && cJSON_IsString(rt)) {
            size_t ll = strlen(l->valuestring), lr = strlen(rt->valuestring);
            if (!(v->joined[r] = malloc(ll + lr + 2))) { snprintf(err, errlen, "tokenizer: out of memory"); return -1; }
            memcpy(v->joined[r], l->valuestring, ll);
            v->joined[r][ll] = ' ';
            memcpy(v->joined[r] + ll + 1, rt->valuestring, lr + 1);
            v->merge[r] = v->joined[r];
        } else {
            snprintf(err, errlen, "tokenizer: %s: merge %zu is neither \"A B\" nor [\"A\", \"B\"]", path, r);
            return -1;
        }
        r++;
    }
    return 0;
}

static ds4_gguf_str *to_strs(const char **s, size_t n) {
    ds4_gguf_str *o = malloc((n ? n : 1) * sizeof *o);
    for (size_t i = 0; o && i < n; i++) o[i] = (ds4_gguf_str){ s[i], strlen(s[i]) };
    return o;
}

static ds4_tokenizer *hf_build(const hf_vocab *v, char *err, size_t errlen) {
    ds4_tokenizer *t = NULL;
    ds4_gguf_str *toks = to_strs(v->tok, v->n), *merges = to_strs(v->merge, v->n_merges);
    if (toks && merges) t = ds4_tokenizer_build(toks, v->type, v->n, merges, v->n_merges, &v->cfg, err, errlen);
    else snprintf(err, errlen, "tokenizer: out of memory");
    free(toks); free(merges);
    return t;
}

ds4_tokenizer *ds4_tokenizer_from_hf_json(const char *path, const char *added_path,
                                          char *err, size_t errlen) {
    hf_vocab v;
    ds4_tokenizer *t = hf_load(&v, path, added_path, err, errlen) == 0 ? hf_build(&v, err, errlen) : NULL;
    hf_free(&v);
    return t;
}

int ds4_tokenizer_gguf_from_hf_json(ds4_gguf_writer *w, const char *path,
                                    const char *added_path, char *err, size_t errlen) {
    hf_vocab v;
    int rc = -1;
    /* Building the tokenizer refuses here any vocabulary this engine would
     * refuse to load, and finds BOS/EOS by string. */
    ds4_tokenizer *t = hf_load(&v, path, added_path, err, errlen) == 0 ? hf_build(&v, err, errlen) : NULL;
    if (!t) goto done;
    const ds4_special_ids *sp = ds4_tokenizer_specials(t);
    ds4_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    ds4_gguf_w_str(w, "tokenizer.ggml.pre", v.cfg.family == DS4_TOK_FAMILY_GLM ? "glm4" : "joyai-llm");
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", v.tok, v.n);
    ds4_gguf_w_arr(w, "tokenizer.ggml.token_type", DS4_GGUF_I32, v.type, v.n);
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.merges", v.merge, v.n_merges);
    ds4_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)sp->bos);
    ds4_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)sp->eos);
    ds4_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
    ds4_gguf_w_bool(w, "tokenizer.ggml.add_eos_token", false);
    ds4_tokenizer_free(t);
    rc = 0;
done:
    hf_free(&v);
    return rc;
}
