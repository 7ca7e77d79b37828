/* json_util.h -- a growable byte buffer and the JSON *text* transforms that
 * prompt rendering and DSML parsing need.
 *
 * Contract
 * - ds4_buf is a plain growable byte string, always NUL-terminated after a
 *   successful append (data may contain NUL bytes; len is authoritative).
 *   Allocation failure is sticky: the buffer sets `oom`, drops further
 *   appends, and the caller checks `oom` once at the end. A zeroed ds4_buf is
 *   a valid empty buffer.
 * - The JSON functions work on raw JSON text (RFC 8259; no NaN/Infinity, no
 *   comments, nesting limited to DS4_JSON_MAX_DEPTH), never on a DOM, because
 *   the exact spelling matters: member order, duplicate keys and number
 *   spelling decide the rendered prompt bytes. Every function validates what
 *   it reads and returns false (appending nothing guaranteed only where
 *   stated) on invalid input; none reads outside [s, s+n).
 * - Two serialisation styles exist, both bytewise specified by
 *   deepseek-v4-prompt-format.md:
 *     DS4_JSON_PY:      Python json.dumps(json.loads(x), ensure_ascii=False):
 *                       ", " / ": " separators, duplicate keys collapse to
 *                       first position + last value, strings re-escaped,
 *                       floats in Python repr, integers as written.
 *     DS4_JSON_COMPACT: the minified text of x: white space outside string
 *                       literals removed, everything else byte for byte.
 */
#ifndef DS4_JSON_UTIL_H
#define DS4_JSON_UTIL_H

#include <stddef.h>
#include <stdbool.h>

#define DS4_JSON_MAX_DEPTH 256

typedef struct {
    char *data;
    size_t len, cap;
    bool oom;
} ds4_buf;

void ds4_buf_put(ds4_buf *b, const void *p, size_t n);
void ds4_buf_puts(ds4_buf *b, const char *s);
void ds4_buf_putc(ds4_buf *b, char c);
/* Appends s[0..n) with every occurrence of needle replaced by `with`. */
void ds4_buf_put_replaced(ds4_buf *b, const char *s, size_t n, const char *needle, const char *with);
void ds4_buf_clear(ds4_buf *b);               /* len = 0, keeps memory */
void ds4_buf_free(ds4_buf *b);
/* Moves the bytes out: returns a malloc'ed NUL-terminated string (an empty
 * one for an empty buffer, NULL on oom) and leaves b empty. */
char *ds4_buf_take(ds4_buf *b);
/* The whole file as a malloc'ed NUL-terminated string (*len bytes, len may
 * be NULL), or NULL when it cannot be opened or read, or memory runs out. */
char *ds4_read_file(const char *path, size_t *len);

typedef enum { DS4_JSON_PY, DS4_JSON_COMPACT } ds4_json_style;

/* End offset of the JSON value starting at s[pos] (leading white space
 * allowed, trailing not consumed), or 0 when it is not a valid value. */
size_t ds4_json_value_end(const char *s, size_t n, size_t pos);
/* True when s[0..n) is exactly one JSON value with optional white space. */
bool ds4_json_valid(const char *s, size_t n);

/* Re-serialises one JSON value (surrounding white space allowed) in the
 * given style. On false, out may hold a partial result. */
bool ds4_json_reformat(const char *s, size_t n, ds4_json_style style, ds4_buf *out);

/* Writes raw bytes as a JSON string literal, quotes included. DS4_JSON_PY
 * escapes " \ \n \r \t \b \f and other bytes < 0x20 as \u00XX (Python);
 * DS4_JSON_COMPACT does the same except \b and \f become \u0008/\u000c (ds4).
 * Non-ASCII bytes are copied as they are. */
void ds4_json_quote(const char *s, size_t n, ds4_json_style style, ds4_buf *out);

/* Decodes the JSON string literal at s[0..n) (quotes included) into raw UTF-8
 * bytes (surrogate pairs combined; a lone surrogate becomes U+FFFD). */
bool ds4_json_unquote(const char *s, size_t n, ds4_buf *out);

/* One member of a JSON object, as spans into the source text. */
typedef struct {
    const char *key;   size_t key_len;    /* the key literal, quotes included */
    const char *value; size_t value_len;  /* the value text, no outer space */
} ds4_json_member;

/* Calls fn for every member of the object s[0..n) in source order
 * (duplicates included). False when s is not exactly one JSON object or fn
 * returns false. */
bool ds4_json_object_each(const char *s, size_t n,
                          bool (*fn)(void *ud, const ds4_json_member *m), void *ud);
/* The same for the elements of an array (value spans without outer space). */
bool ds4_json_array_each(const char *s, size_t n,
                         bool (*fn)(void *ud, const char *v, size_t len), void *ud);

#endif
