#include "quality/eval_trace.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

void ds4_eval_trace_str(ds4_buf *b, const char *key, const char *s, size_t n) {
    if (b->len) ds4_buf_putc(b, ',');
    ds4_buf_putc(b, '"');
    ds4_buf_puts(b, key);
    ds4_buf_puts(b, "\":");
    ds4_json_quote(s ? s : "", s ? n : 0, DS4_JSON_COMPACT, b);
}

void ds4_eval_trace_emit(FILE *f, ds4_buf *b) {
    if (!f) return;
    fputc('{', f);
    if (b->data) fwrite(b->data, 1, b->len, f);
    fputs("}\n", f);
    fflush(f);
}

void ds4_eval_trace_free(ds4_eval_trace *t) {
    for (int i = 0; i < t->n; i++) { free(t->cases[i].picked); free(t->cases[i].output); }
    free(t->cases);
    memset(t, 0, sizeof *t);
}

static bool get_int(const cJSON *o, const char *k, int lo, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > INT_MAX || v->valuedouble != (int)v->valuedouble) return false;
    *out = (int)v->valuedouble;
    return true;
}

static const char *get_str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* One verdict record into t; false = malformed (why in err). */
static bool add_case(ds4_eval_trace *t, const cJSON *o, int *cap, char *err, size_t errlen) {
    ds4_eval_trace_case c = {0};
    const char *verdict = get_str(o, "verdict"), *picked = get_str(o, "picked"), *output = get_str(o, "output");
    if (!get_int(o, "q", 1, &c.q) || !verdict || (strcmp(verdict, "PASS") && strcmp(verdict, "FAIL")) || !picked || !output ||
        !get_int(o, "gen_tokens", 0, &c.gen_tokens)) {
        snprintf(err, errlen, "verdict record without q, verdict PASS|FAIL, picked, output or gen_tokens");
        return false;
    }
    if (!get_int(o, "prompt_tokens", 0, &c.prompt_tokens)) c.prompt_tokens = 0;
    c.pass = !strcmp(verdict, "PASS");
    c.output_len = strlen(output);
    c.picked = strdup(picked);
    c.output = strdup(output);
    if (t->n == *cap) {
        int nc = *cap ? *cap * 2 : 16;
        ds4_eval_trace_case *nv = realloc(t->cases, (size_t)nc * sizeof *nv);
        if (!nv) { free(c.picked); free(c.output); snprintf(err, errlen, "out of memory"); return false; }
        t->cases = nv;
        *cap = nc;
    }
    t->cases[t->n++] = c;
    if (!c.picked || !c.output) { snprintf(err, errlen, "out of memory"); return false; }
    return true;
}

int ds4_eval_trace_read(const char *text, size_t len, ds4_eval_trace *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    int cap = 0, line_no = 0;
    bool header = false;
    char why[160];
    for (const char *p = text, *end = text + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl ? nl : end) - p);
        line_no++;
        const char *line = p;
        p += n + (nl != NULL);
        size_t k = 0;
        while (k < n && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
        if (k == n) continue;
        cJSON *o = cJSON_ParseWithLength(line, n);
        why[0] = 0;
        bool ok = cJSON_IsObject(o);
        if (!ok) snprintf(why, sizeof why, "not a JSON object");
        else if (!header) {
            const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "ds4_eval_trace");
            ok = cJSON_IsNumber(h) && h->valuedouble == 1;
            if (!ok) snprintf(why, sizeof why, "not a ds4-eval trace (no version 1 header)");
            header = true;
            out->thinking = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "thinking"));
        } else if (cJSON_GetObjectItemCaseSensitive(o, "verdict")) {
            ok = add_case(out, o, &cap, why, sizeof why);
        } else {
            int q;
            ok = get_int(o, "q", 1, &q);
            if (!ok) snprintf(why, sizeof why, "record without a question id");
        }
        cJSON_Delete(o);
        if (!ok) {
            snprintf(err, errlen, "line %d: %s", line_no, why);
            ds4_eval_trace_free(out);
            return -1;
        }
    }
    if (!header) { snprintf(err, errlen, "empty trace"); return -1; }
    return 0;
}
