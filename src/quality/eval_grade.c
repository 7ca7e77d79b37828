#include "quality/eval_grade.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const char *s; size_t n; } span;

static bool is_alnum(char c) { return isalnum((unsigned char)c); }
static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* Last case-insensitive occurrence of needle in h[0..n), or NULL. */
static const char *last_ci(const char *h, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = n >= m ? n - m + 1 : 0; i-- > 0;)
        if (!strncasecmp(h + i, needle, m)) return h + i;
    return NULL;
}

static const char *last_exact(const char *h, size_t n, const char *needle) {
    size_t m = strlen(needle);
    for (size_t i = n >= m ? n - m + 1 : 0; i-- > 0;)
        if (!memcmp(h + i, needle, m)) return h + i;
    return NULL;
}

/* The line that starts at p (without its newline) */
static span line_at(const char *p, const char *end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    return (span){p, (size_t)((nl ? nl : end) - p)};
}

static span trim(span x) {
    while (x.n && is_blank(x.s[0])) { x.s++; x.n--; }
    while (x.n && is_blank(x.s[x.n - 1])) x.n--;
    return x;
}

static bool is_fence(span line) { line = trim(line); return line.n >= 3 && !memcmp(line.s, "```", 3); }

/* The first non-empty, non-fence line at or after p; with `last`, the last
 * one in [p, end) instead. */
static span content_line(const char *p, const char *end, bool last) {
    span found = {p, 0};
    while (p < end) {
        span l = line_at(p, end);
        if (trim(l).n && !is_fence(l)) {
            found = l;
            if (!last) break;
        }
        p = l.s + l.n + 1;
    }
    return found;
}

/* Peels wrappers off both ends until none is left: blanks, emphasis,
 * math dollars, matching quotes or backticks, trailing punctuation,
 * \text{...}-style commands. */
static span clean(span x) {
    static const char *const cmds[] = {"\\text{", "\\textbf{", "\\mathrm{", "\\mathbf{", "\\texttt{"};
    for (bool changed = true; changed;) {
        changed = false;
        span t = trim(x);
        if (t.n != x.n) { x = t; changed = true; }
        if (!x.n) break;
        char a = x.s[0], z = x.s[x.n - 1];
        if (a == '*' || a == '$' || a == '_') { x.s++; x.n--; changed = true; continue; }
        if (z == '*' || z == '$' || z == '_' || z == '.' || z == ',' || z == ';' || z == '!') { x.n--; changed = true; continue; }
        if (x.n >= 2 && a == z && (a == '"' || a == '\'' || a == '`')) { x.s++; x.n -= 2; changed = true; continue; }
        for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
            size_t m = strlen(cmds[i]);
            if (x.n > m && !memcmp(x.s, cmds[i], m) && z == '}') { x.s += m; x.n -= m + 1; changed = true; break; }
        }
    }
    return x;
}

/* The answer span of the reply r; *marked tells a boxed or marked answer
 * from a bare last line. */
static span answer_span(span r, bool *marked) {
    const char *end = r.s + r.n;
    const char *box = last_exact(r.s, r.n, "\\boxed{");
    if (box) {
        const char *p = box + 7, *q = p;
        int depth = 1;
        while (q < end && depth) {
            if (*q == '{') depth++;
            else if (*q == '}') depth--;
            if (depth) q++;
        }
        *marked = true;
        return clean((span){p, (size_t)(q - p)});
    }
    static const char *const markers[] = {"answer:", "answer is", "final answer", "output:", "output is", "prints"};
    const char *best = NULL;
    size_t best_len = 0;
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++) {
        const char *m = last_ci(r.s, r.n, markers[i]);
        if (m && (!best || m + strlen(markers[i]) > best + best_len)) { best = m; best_len = strlen(markers[i]); }
    }
    if (best) {
        const char *p = best + best_len;
        while (p < end && (*p == ' ' || *p == '\t' || *p == '*' || *p == ':' || *p == '_')) p++;
        if (end - p >= 3 && !strncasecmp(p, "is ", 3)) p += 3;
        span rest = line_at(p, end);
        *marked = true;
        if (clean(rest).n && !is_fence(rest)) return clean(rest);
        if (rest.s + rest.n < end) return clean(content_line(rest.s + rest.n + 1, end, false));
        return (span){p, 0};
    }
    *marked = false;
    return clean(content_line(r.s, end, true));
}

static void set_picked(ds4_eval_verdict *v, const char *s, size_t n) {
    if (n >= sizeof v->picked) n = sizeof v->picked - 1;
    memcpy(v->picked, s, n);
    v->picked[n] = 0;
    /* one report cell: no line breaks */
    for (size_t i = 0; i < n; i++) if (v->picked[i] == '\n' || v->picked[i] == '\r' || v->picked[i] == '\t') v->picked[i] = ' ';
}

/* ------------------------------------------------------------------ MC */

static bool word_at(span x, size_t i, size_t m) {
    return (i == 0 || !is_alnum(x.s[i - 1])) && (i + m == x.n || !is_alnum(x.s[i + m]));
}

static void grade_mc(const ds4_eval_question *q, span x, ds4_eval_verdict *v) {
    char letter = 0, which = 0;
    for (size_t i = 0; i < x.n && !letter; i++)
        if (x.s[i] >= 'A' && x.s[i] <= 'D' && word_at(x, i, 1)) letter = x.s[i];
    /* no letter: the option named by its text; naming two is no answer */
    int named = 0;
    for (int o = 0; o < 4 && !letter; o++) {
        size_t m = strlen(q->options[o]);
        for (size_t i = 0; m && i + m <= x.n; i++)
            if (!strncasecmp(x.s + i, q->options[o], m) && word_at(x, i, m)) {
                named++;
                which = (char)('A' + o);
                break;
            }
    }
    if (named == 1) letter = which;
    if (letter) set_picked(v, &letter, 1);
    v->pass = letter && letter == q->answer[0];
}

/* ---------------------------------------------------------------- MATH */

typedef struct { const char *s; size_t n; double value; } number;

/* A thousands separator: a comma after a digit, then exactly three digits. */
static bool thousands_comma(span x, size_t j, size_t start) {
    if (x.s[j] != ',' || j == start || j + 3 >= x.n) return false;
    for (size_t k = 1; k <= 3; k++) if (!isdigit((unsigned char)x.s[j + k])) return false;
    return j + 4 >= x.n || !isdigit((unsigned char)x.s[j + 4]);
}

/* Digits with optional thousands commas and a decimal part at x.s[*i];
 * advances *i. */
static bool scan_decimal(span x, size_t *i, double *out) {
    char buf[64];
    size_t k = 0, j = *i;
    while (j < x.n && (isdigit((unsigned char)x.s[j]) || thousands_comma(x, j, *i))) {
        if (x.s[j] != ',' && k < sizeof buf - 2) buf[k++] = x.s[j];
        j++;
    }
    if (j + 1 < x.n && x.s[j] == '.' && isdigit((unsigned char)x.s[j + 1])) {
        buf[k++] = x.s[j++];
        while (j < x.n && isdigit((unsigned char)x.s[j])) { if (k < sizeof buf - 1) buf[k++] = x.s[j]; j++; }
    }
    if (!k) return false;
    buf[k] = 0;
    *out = strtod(buf, NULL);
    *i = j;
    return true;
}

/* Every number of x, in order, up to cap. */
static int numbers(span x, number *out, int cap) {
    int n = 0;
    for (size_t i = 0; i < x.n && n < cap;) {
        size_t start = i;
        bool neg = false;
        if (x.n - i >= 6 && !strncmp(x.s + i, "\\frac{", 6)) i += 6;
        else if (x.n - i >= 7 && !strncmp(x.s + i, "\\dfrac{", 7)) i += 7;
        if (i != start) {
            double a, b;
            size_t j = i;
            if (scan_decimal(x, &j, &a) && j + 2 < x.n && x.s[j] == '}' && x.s[j + 1] == '{') {
                j += 2;
                if (scan_decimal(x, &j, &b) && j < x.n && x.s[j] == '}' && b != 0) {
                    out[n++] = (number){x.s + start, j + 1 - start, a / b};
                    i = j + 1;
                    continue;
                }
            }
            continue;
        }
        if (x.s[i] == '-' && i + 1 < x.n && isdigit((unsigned char)x.s[i + 1]) && (i == 0 || !is_alnum(x.s[i - 1]))) {
            neg = true;
            i++;
        }
        double a;
        bool starts = isdigit((unsigned char)x.s[i]) || (x.s[i] == '.' && i + 1 < x.n && isdigit((unsigned char)x.s[i + 1]));
        if (starts && (i == 0 || !is_alnum(x.s[i - 1]) || neg) && scan_decimal(x, &i, &a)) {
            double b;
            size_t j = i + 1;
            if (i < x.n && x.s[i] == '/' && j < x.n && isdigit((unsigned char)x.s[j]) && scan_decimal(x, &j, &b) && b != 0) {
                a /= b;
                i = j;
            }
            out[n++] = (number){x.s + start, i - start, neg ? -a : a};
            continue;
        }
        i = start + 1;
        while (i < x.n && is_alnum(x.s[i - 1]) && isdigit((unsigned char)x.s[i])) i++;   /* x2, 10th: not numbers */
    }
    return n;
}

static bool pick_number(span x, bool marked, bool after_eq, number *out) {
    if (after_eq) {
        const char *eq = NULL;
        for (size_t i = 0; i < x.n; i++) if (x.s[i] == '=') eq = x.s + i;
        if (eq) { x.n -= (size_t)(eq + 1 - x.s); x.s = eq + 1; marked = true; }
    }
    number nums[64];
    int n = numbers(x, nums, 64);
    if (!n) return false;
    *out = nums[marked ? 0 : n - 1];
    return true;
}

static void grade_math(const ds4_eval_question *q, span x, bool marked, ds4_eval_verdict *v) {
    number got, key;
    span k = {q->answer, strlen(q->answer)};
    if (!pick_number(x, marked, true, &got) || !pick_number(k, true, false, &key)) { v->pass = false; return; }
    char buf[DS4_EVAL_PICKED_MAX];
    size_t m = 0;
    for (size_t i = 0; i < got.n && m < sizeof buf - 1; i++) if (got.s[i] != ',') buf[m++] = got.s[i];
    set_picked(v, buf, m);
    v->pass = fabs(got.value - key.value) <= 1e-9 * fmax(1.0, fabs(key.value));
}

/* ---------------------------------------------------------------- CODE */

static bool hugs(char c) { return strchr(",[](){}:", c) != NULL; }

/* White space collapsed to one blank, none next to brackets and commas. */
static size_t norm_code(span x, char *out, size_t cap) {
    size_t n = 0;
    bool pend = false;
    for (size_t i = 0; i < x.n && n + 1 < cap; i++) {
        char c = x.s[i];
        if (is_blank(c)) { pend = n > 0; continue; }
        if (pend && !hugs(c) && !hugs(out[n - 1]) && n + 2 < cap) out[n++] = ' ';
        pend = false;
        out[n++] = c;
    }
    out[n] = 0;
    return n;
}

static void grade_code(const ds4_eval_question *q, span x, ds4_eval_verdict *v) {
    char a[512], b[512];
    size_t na = norm_code(x, a, sizeof a), nb = norm_code((span){q->answer, strlen(q->answer)}, b, sizeof b);
    set_picked(v, a, na);
    v->pass = na && na == nb && !memcmp(a, b, na) && x.n < sizeof a;
}

/* ----------------------------------------------------------------- SEC */

static void grade_sec(const ds4_eval_question *q, span x, bool marked, ds4_eval_verdict *v) {
    long got = -1;
    for (size_t i = 0; i < x.n; i++) {
        if (!isdigit((unsigned char)x.s[i]) || (i && is_alnum(x.s[i - 1]) && x.s[i - 1] != 'L')) continue;
        long val = 0;
        size_t j = i;
        while (j < x.n && isdigit((unsigned char)x.s[j]) && val < 100000) val = val * 10 + (x.s[j++] - '0');
        got = val;
        if (marked) break;
        i = j;
    }
    if (got < 0) { v->pass = false; return; }
    char buf[24];
    set_picked(v, buf, (size_t)snprintf(buf, sizeof buf, "%ld", got));
    v->pass = false;
    for (const char *p = q->answer; *p;) {
        char *e;
        long line = strtol(p, &e, 10);
        if (e == p) break;
        if (line == got) v->pass = true;
        p = *e == ',' ? e + 1 : e;
    }
}

void ds4_eval_grade(const ds4_eval_question *q, const char *text, size_t len, bool thinking, ds4_eval_verdict *out) {
    memset(out, 0, sizeof *out);
    span r = {text, len};
    const char *close = last_exact(text, len, "</think>");
    if (close) { r.s = close + 8; r.n = (size_t)(text + len - r.s); }
    else if (thinking) return;
    bool marked;
    span x = answer_span(r, &marked);
    switch (q->cat) {
    case DS4_EVAL_MC: grade_mc(q, x, out); break;
    case DS4_EVAL_MATH: grade_math(q, x, marked, out); break;
    case DS4_EVAL_CODE: grade_code(q, x, out); break;
    case DS4_EVAL_SEC: grade_sec(q, x, marked, out); break;
    default: break;
    }
}
