/* json_util.c -- see json_util.h. A small recursive-descent reader over raw
 * JSON text; the writers re-emit spans of it so that spelling survives. */
#include "base/json_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffer ------------------------------------------------------------ */

static bool buf_reserve(ds4_buf *b, size_t extra) {
    if (b->oom) return false;
    if (extra > SIZE_MAX - b->len - 1) { b->oom = true; return false; }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    char *d = realloc(b->data, cap);
    if (!d) { b->oom = true; return false; }
    b->data = d;
    b->cap = cap;
    return true;
}

void ds4_buf_put(ds4_buf *b, const void *p, size_t n) {
    if (!buf_reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void ds4_buf_puts(ds4_buf *b, const char *s) { ds4_buf_put(b, s, strlen(s)); }
void ds4_buf_putc(ds4_buf *b, char c) { ds4_buf_put(b, &c, 1); }

void ds4_buf_clear(ds4_buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

void ds4_buf_free(ds4_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

void ds4_buf_put_replaced(ds4_buf *b, const char *s, size_t n, const char *needle, const char *with) {
    size_t nl = strlen(needle);
    for (;;) {
        const char *h = nl ? memmem(s, n, needle, nl) : NULL;
        if (!h) { ds4_buf_put(b, s, n); return; }
        ds4_buf_put(b, s, (size_t)(h - s));
        ds4_buf_puts(b, with);
        n -= (size_t)(h - s) + nl;
        s = h + nl;
    }
}

char *ds4_buf_take(ds4_buf *b) {
    if (b->oom) { ds4_buf_free(b); return NULL; }
    if (!buf_reserve(b, 0)) return NULL;
    b->data[b->len] = 0;
    char *s = b->data;
    memset(b, 0, sizeof *b);
    return s;
}

char *ds4_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    ds4_buf b = {0};
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) ds4_buf_put(&b, tmp, n);
    bool bad = ferror(f) || b.oom;
    fclose(f);
    if (bad) { ds4_buf_free(&b); return NULL; }
    if (len) *len = b.len;
    return ds4_buf_take(&b);
}

/* ---- reader ------------------------------------------------------------ */

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && is_ws(s[i])) i++;
    return i;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* s[i] == '"'; returns the offset after the closing quote or 0. */
static size_t string_end(const char *s, size_t n, size_t i) {
    for (i++; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') return i + 1;
        if (c < 0x20) return 0;
        if (c != '\\') continue;
        if (++i >= n) return 0;
        switch (s[i]) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            break;
        case 'u':
            if (n - i < 5) return 0;
            for (int k = 1; k <= 4; k++) if (hexval(s[i + k]) < 0) return 0;
            i += 4;
            break;
        default:
            return 0;
        }
    }
    return 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static size_t number_end(const char *s, size_t n, size_t i) {
    if (i < n && s[i] == '-') i++;
    if (i >= n || !is_digit(s[i])) return 0;
    if (s[i] == '0') i++;
    else while (i < n && is_digit(s[i])) i++;
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || !is_digit(s[i])) return 0;
        while (i < n && is_digit(s[i])) i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || !is_digit(s[i])) return 0;
        while (i < n && is_digit(s[i])) i++;
    }
    return i;
}

static size_t literal_end(const char *s, size_t n, size_t i, const char *lit) {
    size_t l = strlen(lit);
    return n - i >= l && memcmp(s + i, lit, l) == 0 ? i + l : 0;
}

static size_t value_end(const char *s, size_t n, size_t i, int depth) {
    i = skip_ws(s, n, i);
    if (i >= n) return 0;
    switch (s[i]) {
    case '"': return string_end(s, n, i);
    case 't': return literal_end(s, n, i, "true");
    case 'f': return literal_end(s, n, i, "false");
    case 'n': return literal_end(s, n, i, "null");
    case '{': case '[': {
        if (depth >= DS4_JSON_MAX_DEPTH) return 0;
        bool obj = s[i] == '{';
        char close = obj ? '}' : ']';
        i = skip_ws(s, n, i + 1);
        if (i < n && s[i] == close) return i + 1;
        for (;;) {
            if (obj) {
                i = skip_ws(s, n, i);
                if (i >= n || s[i] != '"' || !(i = string_end(s, n, i))) return 0;
                i = skip_ws(s, n, i);
                if (i >= n || s[i] != ':') return 0;
                i++;
            }
            if (!(i = value_end(s, n, i, depth + 1))) return 0;
            i = skip_ws(s, n, i);
            if (i >= n) return 0;
            if (s[i] == close) return i + 1;
            if (s[i] != ',') return 0;
            i++;
        }
    }
    default: return number_end(s, n, i);
    }
}

size_t ds4_json_value_end(const char *s, size_t n, size_t pos) { return value_end(s, n, pos, 0); }

bool ds4_json_valid(const char *s, size_t n) {
    size_t e = value_end(s, n, 0, 0);
    return e && skip_ws(s, n, e) == n;
}

/* ---- strings ----------------------------------------------------------- */

static void put_utf8(ds4_buf *b, uint32_t cp) {
    char u[4];
    size_t k;
    if (cp < 0x80) { u[0] = (char)cp; k = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xC0 | cp >> 6); u[1] = (char)(0x80 | (cp & 0x3F)); k = 2; }
    else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F)); k = 3;
    } else {
        u[0] = (char)(0xF0 | cp >> 18); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); k = 4;
    }
    ds4_buf_put(b, u, k);
}

static uint32_t hex4(const char *p) {
    return (uint32_t)(hexval(p[0]) << 12 | hexval(p[1]) << 8 | hexval(p[2]) << 4 | hexval(p[3]));
}

bool ds4_json_unquote(const char *s, size_t n, ds4_buf *out) {
    if (n < 2 || s[0] != '"' || string_end(s, n, 0) != n) return false;
    size_t i = 1, end = n - 1;
    while (i < end) {
        size_t j = i;
        while (j < end && s[j] != '\\') j++;
        ds4_buf_put(out, s + i, j - i);
        if (j >= end) break;
        char e = s[j + 1];
        i = j + 2;
        switch (e) {
        case 'b': ds4_buf_putc(out, '\b'); break;
        case 'f': ds4_buf_putc(out, '\f'); break;
        case 'n': ds4_buf_putc(out, '\n'); break;
        case 'r': ds4_buf_putc(out, '\r'); break;
        case 't': ds4_buf_putc(out, '\t'); break;
        case 'u': {
            uint32_t cp = hex4(s + i);
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && end - i >= 6 && s[i] == '\\' && s[i + 1] == 'u') {
                uint32_t lo = hex4(s + i + 2);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
            put_utf8(out, cp);
            break;
        }
        default: ds4_buf_putc(out, e); break;   /* " \ / */
        }
    }
    return true;
}

void ds4_json_quote(const char *s, size_t n, ds4_json_style style, ds4_buf *out) {
    static const char hex[] = "0123456789abcdef";
    ds4_buf_putc(out, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[7];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c == '\b' && style == DS4_JSON_PY) esc = "\\b";
        else if (c == '\f' && style == DS4_JSON_PY) esc = "\\f";
        else if (c < 0x20) {
            memcpy(u, "\\u00", 4);
            u[4] = hex[c >> 4]; u[5] = hex[c & 15]; u[6] = 0;
            esc = u;
        }
        if (!esc) continue;
        ds4_buf_put(out, s + run, i - run);
        ds4_buf_puts(out, esc);
        run = i + 1;
    }
    ds4_buf_put(out, s + run, n - run);
    ds4_buf_putc(out, '"');
}

/* ---- objects ----------------------------------------------------------- */

bool ds4_json_object_each(const char *s, size_t n,
                          bool (*fn)(void *ud, const ds4_json_member *m), void *ud) {
    if (!ds4_json_valid(s, n)) return false;
    size_t i = skip_ws(s, n, 0);
    if (s[i] != '{') return false;
    i = skip_ws(s, n, i + 1);
    if (s[i] == '}') return true;
    for (;;) {
        ds4_json_member m;
        size_t ke = string_end(s, n, i);
        m.key = s + i; m.key_len = ke - i;
        size_t vs = skip_ws(s, n, skip_ws(s, n, ke) + 1);
        size_t ve = value_end(s, n, vs, 1);
        m.value = s + vs; m.value_len = ve - vs;
        if (!fn(ud, &m)) return false;
        i = skip_ws(s, n, ve);
        if (s[i] == '}') return true;
        i = skip_ws(s, n, i + 1);
    }
}

bool ds4_json_array_each(const char *s, size_t n,
                         bool (*fn)(void *ud, const char *v, size_t len), void *ud) {
    if (!ds4_json_valid(s, n)) return false;
    size_t i = skip_ws(s, n, 0);
    if (s[i] != '[') return false;
    i = skip_ws(s, n, i + 1);
    if (s[i] == ']') return true;
    for (;;) {
        size_t ve = value_end(s, n, i, 1);
        if (!fn(ud, s + i, ve - i)) return false;
        i = skip_ws(s, n, ve);
        if (s[i] == ']') return true;
        i = skip_ws(s, n, i + 1);
    }
}

/* ---- writers ----------------------------------------------------------- */

/* Python float repr: shortest round-trip digits, fixed notation for
 * decimal exponents -4 < e <= 16, else d.ddde+XX; ".0" added to integers. */
static void put_py_float(const char *s, size_t n, ds4_buf *out) {
    char tmp[512];
    if (n >= sizeof tmp) n = sizeof tmp - 1;   /* digits past 500 cannot matter for a double */
    memcpy(tmp, s, n);
    tmp[n] = 0;
    double v = strtod(tmp, NULL);
    if (v != v || v - v != 0) {                 /* overflowed to inf */
        ds4_buf_puts(out, v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    char digits[24];
    int nd = 0;
    const char *p = e;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++) if (*p != '.') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = exp10 + 1;          /* value = 0.digits * 10^decpt */
    if (neg) ds4_buf_putc(out, '-');
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            ds4_buf_puts(out, "0.");
            for (int k = 0; k < -decpt; k++) ds4_buf_putc(out, '0');
            ds4_buf_put(out, digits, (size_t)nd);
        } else if (decpt >= nd) {
            ds4_buf_put(out, digits, (size_t)nd);
            for (int k = nd; k < decpt; k++) ds4_buf_putc(out, '0');
            ds4_buf_puts(out, ".0");
        } else {
            ds4_buf_put(out, digits, (size_t)decpt);
            ds4_buf_putc(out, '.');
            ds4_buf_put(out, digits + decpt, (size_t)(nd - decpt));
        }
    } else {
        ds4_buf_putc(out, digits[0]);
        if (nd > 1) {
            ds4_buf_putc(out, '.');
            ds4_buf_put(out, digits + 1, (size_t)(nd - 1));
        }
        char x[16];
        snprintf(x, sizeof x, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        ds4_buf_puts(out, x);
    }
}

static void put_py_number(const char *s, size_t n, ds4_buf *out) {
    if (memchr(s, '.', n) || memchr(s, 'e', n) || memchr(s, 'E', n)) {
        put_py_float(s, n, out);
        return;
    }
    if (n == 2 && s[0] == '-' && s[1] == '0') { ds4_buf_putc(out, '0'); return; }  /* int(-0) */
    ds4_buf_put(out, s, n);
}

static void put_py_string(const char *s, size_t n, ds4_buf *out) {
    ds4_buf raw = {0};
    ds4_json_unquote(s, n, &raw);
    ds4_json_quote(raw.data ? raw.data : "", raw.len, DS4_JSON_PY, out);
    ds4_buf_free(&raw);
}

typedef struct {
    const char *key; size_t key_len;      /* decoded key bytes (in keys buffer) */
    size_t key_off;
    const char *val; size_t val_len;
    size_t pos;
    size_t last;                           /* index of the member whose value wins */
    bool first;
} py_member;

typedef struct { py_member *m; size_t n, cap; ds4_buf keys; bool oom; } py_members;

static bool collect_member(void *ud, const ds4_json_member *jm) {
    py_members *pm = ud;
    if (pm->n == pm->cap) {
        size_t cap = pm->cap ? pm->cap * 2 : 16;
        py_member *m = realloc(pm->m, cap * sizeof *m);
        if (!m) { pm->oom = true; return false; }
        pm->m = m; pm->cap = cap;
    }
    py_member *m = &pm->m[pm->n];
    m->key_off = pm->keys.len;
    ds4_json_unquote(jm->key, jm->key_len, &pm->keys);
    m->key_len = pm->keys.len - m->key_off;
    m->val = jm->value; m->val_len = jm->value_len;
    m->pos = pm->n++;
    return true;
}

static int cmp_member(const void *a, const void *b) {
    const py_member *x = a, *y = b;
    size_t l = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, l);
    if (c) return c;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static bool same_key(const py_member *x, const py_member *y) {
    return x->key_len == y->key_len && memcmp(x->key, y->key, x->key_len) == 0;
}

static bool reformat(const char *s, size_t n, ds4_json_style style, ds4_buf *out);

/* Python dict semantics for duplicate keys: the key keeps its first
 * position and takes its last value. Sorting keeps this O(n log n). */
static bool reformat_py_object(const char *s, size_t n, ds4_buf *out) {
    py_members pm = {0};
    bool ok = ds4_json_object_each(s, n, collect_member, &pm) && !pm.keys.oom;
    if (ok && pm.n) {
        const char *keys = pm.keys.data ? pm.keys.data : "";   /* all keys may be empty */
        for (size_t i = 0; i < pm.n; i++) pm.m[i].key = keys + pm.m[i].key_off;
        py_member *sorted = malloc(pm.n * sizeof *sorted);
        if (!sorted) ok = false;
        else {
            memcpy(sorted, pm.m, pm.n * sizeof *sorted);
            qsort(sorted, pm.n, sizeof *sorted, cmp_member);
            for (size_t i = 0; i < pm.n; i++) pm.m[i].first = false;
            for (size_t i = 0; i < pm.n;) {
                size_t j = i;
                while (j + 1 < pm.n && same_key(&sorted[i], &sorted[j + 1])) j++;
                pm.m[sorted[i].pos].first = true;
                pm.m[sorted[i].pos].last = sorted[j].pos;
                i = j + 1;
            }
            free(sorted);
        }
    }
    if (ok) {
        ds4_buf_putc(out, '{');
        bool sep = false;
        for (size_t i = 0; ok && i < pm.n; i++) {
            if (!pm.m[i].first) continue;
            if (sep) ds4_buf_puts(out, ", ");
            sep = true;
            ds4_json_quote(pm.m[i].key, pm.m[i].key_len, DS4_JSON_PY, out);
            ds4_buf_puts(out, ": ");
            const py_member *v = &pm.m[pm.m[i].last];
            ok = reformat(v->val, v->val_len, DS4_JSON_PY, out);
        }
        ds4_buf_putc(out, '}');
    }
    free(pm.m);
    ds4_buf_free(&pm.keys);
    return ok && !pm.oom;
}

typedef struct { ds4_buf *out; bool sep; } py_array;

static bool put_py_element(void *ud, const char *v, size_t len) {
    py_array *pa = ud;
    if (pa->sep) ds4_buf_puts(pa->out, ", ");
    pa->sep = true;
    return reformat(v, len, DS4_JSON_PY, pa->out);
}

static void minify(const char *s, size_t n, ds4_buf *out) {
    size_t run = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (is_ws(c)) {
            ds4_buf_put(out, s + run, i - run);
            run = i + 1;
        }
    }
    ds4_buf_put(out, s + run, n - run);
}

static bool reformat(const char *s, size_t n, ds4_json_style style, ds4_buf *out) {
    if (!ds4_json_valid(s, n)) return false;
    size_t b = skip_ws(s, n, 0), e = n;
    while (e > b && is_ws(s[e - 1])) e--;
    s += b; n = e - b;
    if (style == DS4_JSON_COMPACT) { minify(s, n, out); return true; }
    switch (s[0]) {
    case '"': put_py_string(s, n, out); return true;
    case '{': return reformat_py_object(s, n, out);
    case '[': {
        py_array pa = { out, false };
        ds4_buf_putc(out, '[');
        bool ok = ds4_json_array_each(s, n, put_py_element, &pa);
        ds4_buf_putc(out, ']');
        return ok;
    }
    case 't': case 'f': case 'n': ds4_buf_put(out, s, n); return true;
    default: put_py_number(s, n, out); return true;
    }
}

bool ds4_json_reformat(const char *s, size_t n, ds4_json_style style, ds4_buf *out) {
    return reformat(s, n, style, out) && !out->oom;
}
