/* gguf.c -- GGUF reader (mmap, fully validated) and writer; contract in gguf.h.
 *
 * Reading is a bounded cursor: every byte the parser consumes goes through
 * take(), which refuses to move past the end, and every count is checked
 * against the bytes that remain *before* it sizes an allocation or a loop. So
 * hostile input can neither read out of bounds nor make us allocate more than
 * a small multiple of the file size, and all parsing is linear in it. */
#include "format/gguf.h"
#include "base/mempages.h"
#include "kernels/quant.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32u
/* Nobody writes alignments above this; a larger one is treated as corruption. */
#define GGUF_MAX_ALIGNMENT (1u << 20)
#define GGUF_MAX_KEY_LEN 65535u
/* ggml keeps names in a 64-byte NUL-terminated field, so longer names are in
 * files no other engine loads either. */
#define GGUF_MAX_NAME_LEN 63u
#define GGUF_MAX_NESTING 8
#define GGUF_MAX_SHARDS 65535u          /* split.count is a UINT16 */
/* Smallest encodings: a kv is key length + 1 key byte + type + 1 value byte;
 * a tensor info is name length + 1 name byte + n_dims + type + offset. */
#define GGUF_MIN_KV_BYTES 14u
#define GGUF_MIN_TENSOR_BYTES 25u

/* The hash index below finds names through a pointer to the item, which
 * works because the name is every indexed struct's first member. */
_Static_assert(offsetof(ds4_gguf_kv, key) == 0, "kv key first");
_Static_assert(offsetof(ds4_gguf_tensor, name) == 0, "tensor name first");

/* ---- errors ---- */

static void vfail(char *err, size_t errlen, const char *file, const char *fmt, va_list ap) {
    if (!err || errlen == 0) return;
    int n = snprintf(err, errlen, "gguf: %s%s", file ? file : "", file ? ": " : "");
    if (n >= 0 && (size_t)n < errlen) vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
}

static bool fail(char *err, size_t errlen, const char *file, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(err, errlen, file, fmt, ap);
    va_end(ap);
    return false;
}

/* Names from a hostile file may hold newlines or be huge; errors stay one
 * short line. */
typedef struct { char s[80]; } shown_name;
static shown_name shown(ds4_gguf_str n) {
    shown_name out;
    size_t k = 0;
    for (uint64_t i = 0; i < n.len && k < 64; i++) {
        unsigned char c = (unsigned char)n.ptr[i];
        out.s[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (n.len > 64) { memcpy(out.s + k, "...", 3); k += 3; }
    out.s[k] = 0;
    return out;
}

/* ---- value types ---- */

static uint64_t load_le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void store_le(uint8_t *p, uint64_t v, unsigned n) {
    for (unsigned i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Byte size of a fixed-size value type; 0 for STRING, ARRAY and unknown ids. */
static unsigned scalar_size(uint32_t t) {
    static const uint8_t size[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof size ? size[t] : 0;
}

static bool is_unsigned_type(uint32_t t) {
    return t == DS4_GGUF_U8 || t == DS4_GGUF_U16 || t == DS4_GGUF_U32 || t == DS4_GGUF_U64;
}
static bool is_signed_type(uint32_t t) {
    return t == DS4_GGUF_I8 || t == DS4_GGUF_I16 || t == DS4_GGUF_I32 || t == DS4_GGUF_I64;
}
static bool is_float_type(uint32_t t) { return t == DS4_GGUF_F32 || t == DS4_GGUF_F64; }

static union ds4_gguf_value decode_scalar(uint32_t t, const uint8_t *p) {
    union ds4_gguf_value v = {0};
    unsigned n = scalar_size(t);
    uint64_t bits = load_le(p, n);
    if (is_unsigned_type(t)) {
        v.u = bits;
    } else if (is_signed_type(t)) {
        unsigned shift = 64 - 8 * n;     /* sign-extend from n bytes */
        v.i = (int64_t)(bits << shift) >> shift;
    } else if (t == DS4_GGUF_F32) {
        uint32_t b32 = (uint32_t)bits;
        float f;
        memcpy(&f, &b32, sizeof f);
        v.f = f;
    } else if (t == DS4_GGUF_F64) {
        memcpy(&v.f, &bits, sizeof v.f);
    } else if (t == DS4_GGUF_BOOL) {
        v.b = bits != 0;
    }
    return v;
}

static bool value_as_u64(uint32_t t, union ds4_gguf_value v, uint64_t *out) {
    if (is_unsigned_type(t)) { *out = v.u; return true; }
    if (is_signed_type(t) && v.i >= 0) { *out = (uint64_t)v.i; return true; }
    return false;
}

static bool value_as_i64(uint32_t t, union ds4_gguf_value v, int64_t *out) {
    if (is_unsigned_type(t) && v.u <= INT64_MAX) { *out = (int64_t)v.u; return true; }
    if (is_signed_type(t)) { *out = v.i; return true; }
    if (is_float_type(t) && v.f >= -0x1p63 && v.f < 0x1p63 && v.f == trunc(v.f)) {
        *out = (int64_t)v.f;
        return true;
    }
    return false;
}

static bool value_as_f64(uint32_t t, union ds4_gguf_value v, double *out) {
    if (is_unsigned_type(t)) *out = (double)v.u;
    else if (is_signed_type(t)) *out = (double)v.i;
    else if (is_float_type(t)) *out = v.f;
    else return false;
    return true;
}

/* ---- name index: open addressing over (ptr,len) names ---- */

typedef struct { size_t *slot; size_t mask; } name_index;   /* slot: item + 1, 0 = empty */

static uint64_t hash_name(const char *p, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull;                        /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
    return h;
}

static const ds4_gguf_str *item_name(const void *items, size_t stride, size_t i) {
    return (const ds4_gguf_str *)((const char *)items + i * stride);
}

static bool same_name(const ds4_gguf_str *a, const char *p, uint64_t n) {
    return a->len == n && memcmp(a->ptr, p, n) == 0;
}

/* Returns 0 when built, 1 when items *dup_a and *dup_b (a < b) share a name,
 * -1 when out of memory. */
static int index_build(name_index *ix, const void *items, size_t stride, size_t n,
                       size_t *dup_a, size_t *dup_b) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    ix->slot = calloc(cap, sizeof *ix->slot);
    ix->mask = cap - 1;
    if (!ix->slot) return -1;
    for (size_t i = 0; i < n; i++) {
        const ds4_gguf_str *name = item_name(items, stride, i);
        size_t h = (size_t)hash_name(name->ptr, name->len) & ix->mask;
        while (ix->slot[h]) {
            size_t j = ix->slot[h] - 1;
            if (same_name(item_name(items, stride, j), name->ptr, name->len)) {
                *dup_a = j;
                *dup_b = i;
                return 1;
            }
            h = (h + 1) & ix->mask;
        }
        ix->slot[h] = i + 1;
    }
    return 0;
}

static const void *index_find(const name_index *ix, const void *items, size_t stride,
                              const char *name) {
    if (!ix->slot || !name) return NULL;
    size_t len = strlen(name);
    for (size_t h = (size_t)hash_name(name, len) & ix->mask; ix->slot[h]; h = (h + 1) & ix->mask) {
        const ds4_gguf_str *cand = item_name(items, stride, ix->slot[h] - 1);
        if (same_name(cand, name, len)) return cand;
    }
    return NULL;
}

/* ---- one file ---- */

typedef struct {
    const uint8_t *base;
    uint64_t size;
    bool mapped;
    char *path;                 /* NULL for buffers */
    dev_t dev;                  /* the mapped file, so a re-read can refuse a replaced one */
    ino_t ino;
    uint32_t version, alignment;
    uint64_t data_offset;
    ds4_gguf_kv *kv;
    size_t n_kv;
    name_index kv_index;
    ds4_gguf_tensor *tensors;   /* moved into ds4_gguf.tensors once all shards are read */
    size_t n_tensors;
} shard;

struct ds4_gguf {
    shard *shards;
    int n_shards;
    ds4_gguf_tensor *tensors;
    size_t n_tensors;
    name_index tensor_index;
};

static void shard_free(shard *sh) {
    for (size_t i = 0; i < sh->n_kv; i++) free((void *)sh->kv[i].arr_strs);
    free(sh->kv);
    free(sh->kv_index.slot);
    free(sh->tensors);
    if (sh->mapped) munmap((void *)sh->base, sh->size);
    free(sh->path);
    memset(sh, 0, sizeof *sh);
}

static const ds4_gguf_kv *shard_find(const shard *sh, const char *key) {
    return index_find(&sh->kv_index, sh->kv, sizeof *sh->kv, key);
}

/* ---- parser ---- */

typedef struct {
    const uint8_t *base;
    uint64_t size, pos;
    const char *file;
    char *err;
    size_t errlen;
} parser;

static bool perr(parser *ps, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(ps->err, ps->errlen, ps->file, fmt, ap);
    va_end(ap);
    return false;
}

static bool take(parser *ps, uint64_t n, const uint8_t **out, const char *what) {
    uint64_t left = ps->size - ps->pos;
    *out = NULL;
    if (n > left)
        return perr(ps, "truncated: %s needs %" PRIu64 " bytes at offset %" PRIu64
                    " but only %" PRIu64 " remain", what, n, ps->pos, left);
    *out = ps->base + ps->pos;
    ps->pos += n;
    return true;
}

static bool rd_u32(parser *ps, uint32_t *v, const char *what) {
    const uint8_t *p;
    if (!take(ps, 4, &p, what)) return false;
    *v = (uint32_t)load_le(p, 4);
    return true;
}

static bool rd_u64(parser *ps, uint64_t *v, const char *what) {
    const uint8_t *p;
    if (!take(ps, 8, &p, what)) return false;
    *v = load_le(p, 8);
    return true;
}

static bool rd_str(parser *ps, ds4_gguf_str *s, const char *what) {
    uint64_t n;
    const uint8_t *p;
    if (!rd_u64(ps, &n, what) || !take(ps, n, &p, what)) return false;
    s->ptr = (const char *)p;
    s->len = n;
    return true;
}

static bool check_count(parser *ps, uint64_t n, uint64_t min_bytes, const char *what) {
    uint64_t left = ps->size - ps->pos;
    if (n > left / min_bytes)
        return perr(ps, "%s count %" PRIu64 " cannot fit in the %" PRIu64
                    " bytes left at offset %" PRIu64, what, n, left, ps->pos);
    return true;
}

static bool check_bools(parser *ps, const uint8_t *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (p[i] > 1)
            return perr(ps, "bool value %u at offset %" PRIu64 " is not 0 or 1",
                        p[i], (uint64_t)(p + i - ps->base));
    return true;
}

/* Validates the n elements of an array of type et at the cursor. strs_out,
 * when not NULL, receives a table of the decoded (ptr,len) of a string array
 * (owned by the caller even on failure). */
static bool array_body(parser *ps, uint32_t et, uint64_t n, const ds4_gguf_str **strs_out,
                       int depth) {
    unsigned es = scalar_size(et);
    if (es) {
        const uint8_t *p;
        if (!check_count(ps, n, es, "array element") || !take(ps, n * es, &p, "array data"))
            return false;
        return et != DS4_GGUF_BOOL || check_bools(ps, p, n);
    }
    if (et == DS4_GGUF_STRING) {
        if (!check_count(ps, n, 8, "string array element")) return false;
        ds4_gguf_str *strs = NULL, s;
        if (strs_out && n) {
            *strs_out = strs = calloc(n, sizeof *strs);
            if (!strs) return perr(ps, "out of memory for a %" PRIu64 "-string array", n);
        }
        for (uint64_t i = 0; i < n; i++)
            if (!rd_str(ps, strs ? &strs[i] : &s, "array string")) return false;
        return true;
    }
    if (et == DS4_GGUF_ARRAY) {
        if (depth >= GGUF_MAX_NESTING)
            return perr(ps, "arrays nested deeper than %d at offset %" PRIu64,
                        GGUF_MAX_NESTING, ps->pos);
        if (!check_count(ps, n, 12, "nested array")) return false;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t inner;
            uint64_t inner_n;
            if (!rd_u32(ps, &inner, "array element type") || !rd_u64(ps, &inner_n, "array length") ||
                !array_body(ps, inner, inner_n, NULL, depth + 1))
                return false;
        }
        return true;
    }
    return perr(ps, "unknown array element type %" PRIu32 " at offset %" PRIu64, et, ps->pos - 12);
}

static bool parse_kv(parser *ps, ds4_gguf_kv *kv, uint64_t i) {
    if (!rd_str(ps, &kv->key, "metadata key")) return false;
    if (kv->key.len == 0) return perr(ps, "metadata entry %" PRIu64 " has an empty key", i);
    if (kv->key.len > GGUF_MAX_KEY_LEN)
        return perr(ps, "metadata key '%s' is %" PRIu64 " bytes (limit %u)",
                    shown(kv->key).s, kv->key.len, GGUF_MAX_KEY_LEN);
    if (memchr(kv->key.ptr, 0, kv->key.len))
        return perr(ps, "metadata key '%s' contains a NUL byte", shown(kv->key).s);
    uint32_t t;
    if (!rd_u32(ps, &t, "metadata value type")) return false;
    kv->type = (enum ds4_gguf_vtype)t;
    unsigned size = scalar_size(t);
    if (size) {
        const uint8_t *p;
        if (!take(ps, size, &p, "metadata value")) return false;
        if (t == DS4_GGUF_BOOL && !check_bools(ps, p, 1)) return false;
        kv->v = decode_scalar(t, p);
        return true;
    }
    if (t == DS4_GGUF_STRING) return rd_str(ps, &kv->str, "metadata string");
    if (t != DS4_GGUF_ARRAY)
        return perr(ps, "metadata '%s' has unknown value type %" PRIu32, shown(kv->key).s, t);
    uint32_t et;
    if (!rd_u32(ps, &et, "array element type") || !rd_u64(ps, &kv->arr_n, "array length"))
        return false;
    kv->arr_type = (enum ds4_gguf_vtype)et;
    kv->arr_data = ps->base + ps->pos;
    return array_body(ps, et, kv->arr_n, &kv->arr_strs, 1);
}

static bool checked_mul(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out) && *out <= INT64_MAX;
}

/* Element and byte counts of a tensor, shared by reader and writer so both
 * accept exactly the same shapes. On failure why gets a phrase that follows
 * the tensor's name in an error message. */
static bool tensor_size(uint32_t type, uint32_t n_dims, const uint64_t *ne, uint64_t *elems,
                        uint64_t *bytes, char *why, size_t whylen) {
    size_t blk = ds4_type_block_elems(type), blk_bytes = ds4_type_block_bytes(type);
    for (uint32_t d = 0; d < n_dims; d++)
        if (ne[d] > INT64_MAX) {
            snprintf(why, whylen, "ne[%" PRIu32 "] = %" PRIu64 " is negative as int64", d, ne[d]);
            return false;
        }
    if (blk == 0 || blk_bytes == 0) {
        snprintf(why, whylen, "has unknown ggml type id %" PRIu32, type);
        return false;
    }
    uint64_t ne0 = n_dims ? ne[0] : 1;
    if (ne0 % blk) {
        snprintf(why, whylen, "row length ne[0] = %" PRIu64 " is not a multiple of the %s block "
                 "size %zu", ne0, ds4_type_name(type), blk);
        return false;
    }
    *elems = ne0;
    bool ok = checked_mul(ne0 / blk, blk_bytes, bytes);
    for (uint32_t d = 1; ok && d < n_dims; d++)
        ok = checked_mul(*elems, ne[d], elems) && checked_mul(*bytes, ne[d], bytes);
    if (!ok) snprintf(why, whylen, "shape overflows 63-bit element or byte counts");
    return ok;
}

static bool parse_tensor_info(parser *ps, ds4_gguf_tensor *t, uint64_t *rel_offset) {
    if (!rd_str(ps, &t->name, "tensor name")) return false;
    shown_name sn = shown(t->name);
    const char *name = sn.s;
    if (t->name.len == 0) return perr(ps, "tensor with an empty name at offset %" PRIu64, ps->pos - 8);
    if (t->name.len > GGUF_MAX_NAME_LEN)
        return perr(ps, "tensor name '%s' is %" PRIu64 " bytes (limit %u)", name, t->name.len,
                    GGUF_MAX_NAME_LEN);
    if (memchr(t->name.ptr, 0, t->name.len))
        return perr(ps, "tensor name '%s' contains a NUL byte", name);
    if (!rd_u32(ps, &t->n_dims, "tensor dimension count")) return false;
    if (t->n_dims > DS4_GGUF_MAX_DIMS)
        return perr(ps, "tensor '%s' has %" PRIu32 " dimensions (limit %d)", name, t->n_dims,
                    DS4_GGUF_MAX_DIMS);
    for (int d = 0; d < DS4_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if (!rd_u64(ps, &t->ne[d], "tensor dimension")) return false;
    if (!rd_u32(ps, &t->type, "tensor type") || !rd_u64(ps, rel_offset, "tensor offset"))
        return false;
    char why[160];
    if (!tensor_size(t->type, t->n_dims, t->ne, &t->n_elements, &t->n_bytes, why, sizeof why))
        return perr(ps, "tensor '%s' %s", name, why);
    return true;
}

/* Sets sh->alignment from general.alignment, which is the only key that
 * changes how the rest of the file is laid out. */
static bool read_alignment(parser *ps, shard *sh) {
    sh->alignment = GGUF_DEFAULT_ALIGNMENT;
    const ds4_gguf_kv *kv = shard_find(sh, "general.alignment");
    if (!kv) return true;
    if (kv->type != DS4_GGUF_U32)
        return perr(ps, "general.alignment has value type %d, expected UINT32 (%d)", kv->type,
                    DS4_GGUF_U32);
    uint64_t a = kv->v.u;
    if (a == 0 || (a & (a - 1)) || a > GGUF_MAX_ALIGNMENT)
        return perr(ps, "general.alignment = %" PRIu64 " is not a power of two in [1, %u]", a,
                    GGUF_MAX_ALIGNMENT);
    sh->alignment = (uint32_t)a;
    return true;
}

static bool parse_header(parser *ps, shard *sh, uint64_t *n_tensors, uint64_t *n_kv) {
    const uint8_t *magic;
    if (!take(ps, 4, &magic, "magic")) return false;
    if (memcmp(magic, "GGUF", 4) != 0)
        return perr(ps, "not a GGUF file (magic bytes %02x %02x %02x %02x)", magic[0], magic[1],
                    magic[2], magic[3]);
    if (!rd_u32(ps, &sh->version, "version")) return false;
    if (sh->version != 2 && sh->version != 3) {
        if ((sh->version & 0xffffu) == 0)
            return perr(ps, "version field 0x%08" PRIx32 " looks byte-swapped: big-endian GGUF "
                        "is not supported", sh->version);
        return perr(ps, "unsupported GGUF version %" PRIu32 " (only 2 and 3 are read)", sh->version);
    }
    return rd_u64(ps, n_tensors, "tensor count") && rd_u64(ps, n_kv, "metadata count");
}

/* Parses and validates one whole file held in sh->base/sh->size. */
static bool parse_shard(shard *sh, char *err, size_t errlen) {
    parser ps = {sh->base, sh->size, 0, sh->path, err, errlen};
    uint64_t n_tensors, n_kv;
    if (!parse_header(&ps, sh, &n_tensors, &n_kv)) return false;
    if (!check_count(&ps, n_kv, GGUF_MIN_KV_BYTES, "metadata")) return false;
    sh->kv = calloc(n_kv ? n_kv : 1, sizeof *sh->kv);
    if (!sh->kv) return perr(&ps, "out of memory for %" PRIu64 " metadata entries", n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        sh->n_kv = i + 1;               /* so shard_free releases a partial entry */
        if (!parse_kv(&ps, &sh->kv[i], i)) return false;
    }
    size_t a, b;
    int r = index_build(&sh->kv_index, sh->kv, sizeof *sh->kv, sh->n_kv, &a, &b);
    if (r < 0) return perr(&ps, "out of memory for the metadata index");
    if (r > 0)
        return perr(&ps, "duplicate metadata key '%s' (entries %zu and %zu)",
                    shown(sh->kv[b].key).s, a, b);
    if (!read_alignment(&ps, sh)) return false;

    if (!check_count(&ps, n_tensors, GGUF_MIN_TENSOR_BYTES, "tensor")) return false;
    sh->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *sh->tensors);
    uint64_t *rel = calloc(n_tensors ? n_tensors : 1, sizeof *rel);
    bool ok = sh->tensors && rel;
    if (!ok) perr(&ps, "out of memory for %" PRIu64 " tensor infos", n_tensors);
    sh->n_tensors = n_tensors;
    for (uint64_t i = 0; ok && i < n_tensors; i++) ok = parse_tensor_info(&ps, &sh->tensors[i], &rel[i]);
    /* The data section starts at the next alignment boundary. It may lie past
     * the end of a file without tensors (ggml does not pad those). */
    if (ok && ps.pos > UINT64_MAX - sh->alignment) ok = perr(&ps, "header size overflows");
    if (ok) sh->data_offset = (ps.pos + sh->alignment - 1) / sh->alignment * sh->alignment;
    if (ok && n_tensors > 0 && sh->data_offset > sh->size)
        ok = perr(&ps, "data section starts at %" PRIu64 ", past the end of the %" PRIu64
                  "-byte file", sh->data_offset, sh->size);
    for (uint64_t i = 0; ok && i < n_tensors; i++) {
        ds4_gguf_tensor *t = &sh->tensors[i];
        uint64_t room = sh->size - sh->data_offset;
        if (rel[i] % sh->alignment)
            ok = perr(&ps, "tensor '%s' offset %" PRIu64 " is not a multiple of the alignment %"
                      PRIu32, shown(t->name).s, rel[i], sh->alignment);
        else if (rel[i] > room || t->n_bytes > room - rel[i])
            ok = perr(&ps, "tensor '%s' data [%" PRIu64 ", +%" PRIu64 ") exceeds file size %"
                      PRIu64, shown(t->name).s, sh->data_offset + (rel[i] > room ? 0 : rel[i]),
                      t->n_bytes, sh->size);
        else {
            t->file_offset = sh->data_offset + rel[i];
            t->data = sh->base + t->file_offset;
        }
    }
    free(rel);
    return ok;
}

/* ---- opening: buffers, files, split models ---- */

static bool map_file(const char *path, shard *sh, char *err, size_t errlen) {
    sh->path = strdup(path);
    if (!sh->path) return fail(err, errlen, path, "out of memory");
    /* O_NONBLOCK: opening a FIFO must not wait for a writer before the
     * regular-file check below can refuse it (mmap ignores the flag). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fail(err, errlen, path, "cannot open: %s", strerror(errno));
    struct stat st;
    bool ok = fstat(fd, &st) == 0;
    if (!ok) fail(err, errlen, path, "cannot stat: %s", strerror(errno));
    else if (!S_ISREG(st.st_mode)) ok = fail(err, errlen, path, "not a regular file");
    else if (st.st_size == 0) ok = fail(err, errlen, path, "file is empty");
    if (ok) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) ok = fail(err, errlen, path, "cannot mmap: %s", strerror(errno));
        else {
            sh->base = p;
            sh->size = (uint64_t)st.st_size;
            sh->mapped = true;
            sh->dev = st.st_dev;
            sh->ino = st.st_ino;
        }
    }
    close(fd);
    return ok;
}

static bool load_shard(const char *path, shard *sh, char *err, size_t errlen) {
    if (map_file(path, sh, err, errlen) && parse_shard(sh, err, errlen)) return true;
    shard_free(sh);
    return false;
}

/* Gathers every shard's tensors into one table and indexes it. */
static bool merge_tensors(ds4_gguf *g, char *err, size_t errlen) {
    size_t n = 0;
    for (int s = 0; s < g->n_shards; s++) n += g->shards[s].n_tensors;
    g->tensors = calloc(n ? n : 1, sizeof *g->tensors);
    if (!g->tensors) return fail(err, errlen, g->shards[0].path, "out of memory");
    for (int s = 0; s < g->n_shards; s++) {
        shard *sh = &g->shards[s];
        for (size_t i = 0; i < sh->n_tensors; i++) {
            g->tensors[g->n_tensors] = sh->tensors[i];
            g->tensors[g->n_tensors++].shard = s;
        }
        free(sh->tensors);
        sh->tensors = NULL;
        sh->n_tensors = 0;
    }
    size_t a, b;
    int r = index_build(&g->tensor_index, g->tensors, sizeof *g->tensors, n, &a, &b);
    if (r < 0) return fail(err, errlen, g->shards[0].path, "out of memory for the tensor index");
    if (r > 0) {
        const ds4_gguf_tensor *ta = &g->tensors[a], *tb = &g->tensors[b];
        return fail(err, errlen, g->shards[tb->shard].path, "duplicate tensor name '%s' "
                    "(tensors %zu and %zu%s)", shown(tb->name).s, a, b,
                    ta->shard != tb->shard ? ", in different shards" : "");
    }
    return true;
}

ds4_gguf *ds4_gguf_open_buffer(const void *buf, size_t len, char *err, size_t errlen) {
    ds4_gguf *g = calloc(1, sizeof *g);
    shard *sh = calloc(1, sizeof *sh);
    if (!g || !sh) {
        free(g);
        free(sh);
        fail(err, errlen, NULL, "out of memory");
        return NULL;
    }
    g->shards = sh;
    g->n_shards = 1;
    sh->base = buf;
    sh->size = len;
    if (!parse_shard(sh, err, errlen) || !merge_tensors(g, err, errlen)) {
        ds4_gguf_close(g);
        return NULL;
    }
    return g;
}

/* "PREFIX-00002-of-00005.gguf": the digit widths are kept so sibling names
 * are spelled the way this one is. */
typedef struct { size_t prefix_len; unsigned no, count; int no_width, count_width; } split_name;

static bool digits_before(const char *s, size_t end, size_t *start, unsigned *value) {
    size_t b = end;
    while (b > 0 && end - b < 6 && isdigit((unsigned char)s[b - 1])) b--;
    if (b == end || (b > 0 && isdigit((unsigned char)s[b - 1]))) return false;
    *value = 0;
    for (size_t i = b; i < end; i++) *value = *value * 10 + (unsigned)(s[i] - '0');
    *start = b;
    return true;
}

static bool parse_split_name(const char *path, split_name *sn) {
    size_t len = strlen(path), c0, n0;
    if (len < 5 || strcmp(path + len - 5, ".gguf") != 0) return false;
    if (!digits_before(path, len - 5, &c0, &sn->count) || c0 < 4 ||
        memcmp(path + c0 - 4, "-of-", 4) != 0 || !digits_before(path, c0 - 4, &n0, &sn->no) ||
        n0 < 1 || path[n0 - 1] != '-')
        return false;
    sn->prefix_len = n0 - 1;
    sn->no_width = (int)(c0 - 4 - n0);
    sn->count_width = (int)(len - 5 - c0);
    return sn->no >= 1 && sn->count >= 1 && sn->no <= sn->count && sn->count <= GGUF_MAX_SHARDS;
}

static char *sibling_path(const char *path, const split_name *sn, unsigned no) {
    size_t n = sn->prefix_len + 32;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%.*s-%0*u-of-%0*u.gguf", (int)sn->prefix_len, path, sn->no_width, no,
                    sn->count_width, sn->count);
    return p;
}

/* Reads an integer split.* key; absent keys leave *out alone. */
static bool split_key(const shard *sh, const char *key, uint64_t *out, char *err, size_t errlen) {
    const ds4_gguf_kv *kv = shard_find(sh, key);
    if (kv && !value_as_u64(kv->type, kv->v, out))
        return fail(err, errlen, sh->path, "%s is not a non-negative integer", key);
    return true;
}

/* Checks that shard s of count carries consistent split.* keys (they are
 * optional: shards named by pattern alone are accepted). */
static bool check_split_keys(const shard *sh, unsigned s, unsigned count, char *err, size_t errlen) {
    uint64_t no = s, n = count;
    if (!split_key(sh, "split.no", &no, err, errlen) || !split_key(sh, "split.count", &n, err, errlen))
        return false;
    if (no != s || n != count)
        return fail(err, errlen, sh->path, "split.no = %" PRIu64 ", split.count = %" PRIu64
                    " but this is shard %u of %u", no, n, s, count);
    return true;
}

ds4_gguf *ds4_gguf_open(const char *path, char *err, size_t errlen) {
    shard first = {0};
    if (!load_shard(path, &first, err, errlen)) return NULL;
    split_name sn;
    bool named = parse_split_name(path, &sn);
    uint64_t count = named ? sn.count : 1, no = named ? sn.no - 1 : 0;
    bool ok = split_key(&first, "split.count", &count, err, errlen) &&
              split_key(&first, "split.no", &no, err, errlen);
    if (ok && (count == 0 || count > GGUF_MAX_SHARDS || no >= count))
        ok = fail(err, errlen, path, "split.no = %" PRIu64 ", split.count = %" PRIu64
                  " is not a valid shard position", no, count);
    if (ok && count > 1 && !named)
        ok = fail(err, errlen, path, "split.count = %" PRIu64 " but the file name does not "
                  "follow NAME-00001-of-%05" PRIu64 ".gguf, so the other shards cannot be found",
                  count, count);
    if (ok && count > 1 && (sn.count != count || sn.no - 1 != no))
        ok = fail(err, errlen, path, "file name says shard %u of %u but split.no = %" PRIu64
                  ", split.count = %" PRIu64, sn.no, sn.count, no, count);
    ds4_gguf *g = ok ? calloc(1, sizeof *g) : NULL;
    if (g) g->shards = calloc(count, sizeof *g->shards);
    if (ok && (!g || !g->shards)) ok = fail(err, errlen, path, "out of memory");
    if (!ok) {
        free(g);
        shard_free(&first);
        return NULL;
    }
    g->n_shards = (int)count;
    g->shards[no] = first;
    for (unsigned s = 0; ok && s < count; s++) {
        if (s != no) {
            char *p = sibling_path(path, &sn, s + 1);
            ok = p ? load_shard(p, &g->shards[s], err, errlen) : fail(err, errlen, path, "out of memory");
            free(p);
        }
        if (ok && count > 1) ok = check_split_keys(&g->shards[s], s, (unsigned)count, err, errlen);
    }
    ok = ok && merge_tensors(g, err, errlen);
    uint64_t want = g->n_tensors;
    ok = ok && split_key(&g->shards[0], "split.tensors.count", &want, err, errlen);
    if (ok && want != g->n_tensors)
        ok = fail(err, errlen, g->shards[0].path, "split.tensors.count = %" PRIu64 " but the %d "
                  "shard(s) hold %zu tensors", want, g->n_shards, g->n_tensors);
    if (!ok) {
        ds4_gguf_close(g);
        return NULL;
    }
    return g;
}

void ds4_gguf_close(ds4_gguf *g) {
    if (!g) return;
    for (int s = 0; s < g->n_shards; s++) shard_free(&g->shards[s]);
    free(g->shards);
    free(g->tensors);
    free(g->tensor_index.slot);
    free(g);
}

/* MADV_POPULATE_READ (Linux 5.14) maps every page of a shard now, in one
 * call per shard, instead of one page fault per 4 KiB page (16 pages with the
 * kernel's fault-around) the first time a weight is read: those faults were
 * the kernel time of a first prefill. Pages not in the page cache are read
 * from the file here; MADV_HUGEPAGE first makes that read-ahead bring them
 * in as 2 MiB folios, which the kernel then maps with 2 MiB entries. */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

bool ds4_gguf_populate(const ds4_gguf *g, char *err, size_t errlen) {
    for (int s = 0; s < g->n_shards; s++) {
        const shard *sh = &g->shards[s];
        if (!sh->mapped) continue;
        /* only a hint: a kernel without THP refuses it and reads 4 KiB pages */
        (void)madvise((void *)sh->base, (size_t)sh->size, MADV_HUGEPAGE);
        if (madvise((void *)sh->base, (size_t)sh->size, MADV_POPULATE_READ) != 0)
            return fail(err, errlen, sh->path, "cannot page in the mapping: %s", strerror(errno));
    }
    return true;
}

/* Above this share of 2 MiB entries a re-read cannot gain much. */
#define LARGE_ENOUGH 0.9
#define PMD_BYTES ((uint64_t)2 << 20)

static bool mapped_sizes(const ds4_gguf *g, ds4_mem_sizes *sum, char *err, size_t errlen) {
    memset(sum, 0, sizeof *sum);
    for (int s = 0; s < g->n_shards; s++) {
        const shard *sh = &g->shards[s];
        ds4_mem_sizes one;
        if (!sh->mapped) continue;
        if (!ds4_mem_range_sizes(sh->base, (size_t)sh->size, &one, err, errlen)) return false;
        sum->rss_kb += one.rss_kb;
        sum->file_pmd_kb += one.file_pmd_kb;
    }
    return true;
}

static double pmd_share(const ds4_mem_sizes *m) {
    return m->rss_kb ? (double)m->file_pmd_kb / (double)m->rss_kb : 0.0;
}

/* Re-reads [from, to) of a shard's mapping through a fresh descriptor of the
 * same file (the mapping's own was closed after mmap). */
static bool reread_shard(const shard *sh, uint64_t from, uint64_t to, char *err, size_t errlen) {
    int fd = open(sh->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fail(err, errlen, sh->path, "cannot open: %s", strerror(errno));
    struct stat st;
    bool ok = fstat(fd, &st) == 0 && st.st_dev == sh->dev && st.st_ino == sh->ino;
    if (!ok) fail(err, errlen, sh->path, "the file was replaced since it was mapped");
    else if (!ds4_file_range_reread(sh->base + from, (size_t)(to - from), fd, from, err, errlen)) ok = false;
    close(fd);
    return ok;
}

static bool pages_note(ds4_gguf_pages *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->note, sizeof r->note, fmt, ap);
    va_end(ap);
    return false;
}

/* Re-reads the small-page parts of a shard's whole 2 MiB pages (the file's
 * tail past the last one never gets a 2 MiB entry), up to `limit` bytes. */
typedef struct {
    const shard *sh;
    uint64_t limit, bytes;  /* bytes re-read so far */
    bool failed;
    char *err;
    size_t errlen;
} small_reread;

static bool reread_small_range(void *ctx, uintptr_t lo, uintptr_t hi) {
    small_reread *w = ctx;
    const uintptr_t base = (uintptr_t)w->sh->base;
    /* a 2 MiB page is mapped whole by one entry or not at all */
    const uint64_t from = (uint64_t)(lo - base) & ~(PMD_BYTES - 1);
    uint64_t to = ((uint64_t)(hi - base) + PMD_BYTES - 1) & ~(PMD_BYTES - 1);
    if (to > (w->sh->size & ~(PMD_BYTES - 1))) to = w->sh->size & ~(PMD_BYTES - 1);
    if (to > from && to - from > w->limit - w->bytes) to = from + (w->limit - w->bytes);
    if (to <= from) return true;
    if (!reread_shard(w->sh, from, to, w->err, w->errlen)) {
        w->failed = true;
        return false;
    }
    w->bytes += to - from;
    return w->bytes < w->limit;
}

/* 1: re-read (or nothing small), 0: a step failed (err), -1: the kernel
 * cannot list the small parts (err) */
static int reread_small_pages(const shard *sh, uint64_t limit, uint64_t *bytes, char *err, size_t errlen) {
    small_reread w = {sh, limit, 0, false, err, errlen};
    if (ds4_mem_small_ranges(sh->base, (size_t)(sh->size & ~(PMD_BYTES - 1)), reread_small_range, &w, err, errlen) < 0)
        return -1;
    *bytes += w.bytes;
    return !w.failed;
}

static bool no_more_ranges(void *ctx, uintptr_t lo, uintptr_t hi) {
    (void)ctx, (void)lo, (void)hi;
    return false;
}

bool ds4_gguf_prefer_large_pages(const ds4_gguf *g, uint64_t probe_bytes, ds4_gguf_pages *r) {
    memset(r, 0, sizeof *r);
    char why[sizeof r->note];
    ds4_mem_sizes before, probed, after;
    const shard *first = &g->shards[0];
    if (!first->mapped) return pages_note(r, "not a file mapping");
    if (!mapped_sizes(g, &before, why, sizeof why))
        return pages_note(r, "%s", why);
    r->before = r->after = pmd_share(&before);
    /* File offset and address must agree modulo 2 MiB for a PMD entry to
     * fit; the kernel aligns large file mappings so, but it need not. */
    if ((uintptr_t)first->base % PMD_BYTES) return pages_note(r, "the mapping is not 2 MiB aligned");
    /* Linux 6.7+ lists the parts in small pages, so only those are read
     * again, however few; otherwise only the share is known, and above
     * LARGE_ENOUGH a whole re-read would gain too little for its cost. */
    const bool listed = ds4_mem_small_ranges(first->base, PMD_BYTES, no_more_ranges, NULL, why, sizeof why) >= 0;
    if (!listed && r->before >= LARGE_ENOUGH) return true;
    if (probe_bytes > first->size / 2) probe_bytes = first->size / 2;
    probe_bytes &= ~(PMD_BYTES - 1);
    if (!probe_bytes) return pages_note(r, "smaller than two 2 MiB pages");
    /* Probe: one piece first, so that a kernel or file system without large
     * folios (or THP "never") costs one small re-read per start, not all.
     * 2 MiB entries already in the mapping prove the kernel makes them: the
     * probe would only say so again, and would say nothing when its own piece
     * is among those already large (part of the cache evicted and read back
     * small). */
    const bool proven = before.file_pmd_kb * 1024 >= PMD_BYTES;
    uint64_t probed_bytes = 0;
    if (!proven) {
        const bool ok = listed ? reread_small_pages(first, probe_bytes, &probed_bytes, why, sizeof why) == 1
                               : reread_shard(first, 0, probe_bytes, why, sizeof why);
        if (!listed) probed_bytes = probe_bytes;
        if (!ok || !mapped_sizes(g, &probed, why, sizeof why)) return pages_note(r, "%s", why);
        const uint64_t gained_kb = probed.file_pmd_kb > before.file_pmd_kb ? probed.file_pmd_kb - before.file_pmd_kb : 0;
        if (gained_kb * 1024 < probed_bytes / 2) {
            r->after = pmd_share(&probed);
            return pages_note(r, "a re-read of %" PRIu64 " MiB came back in small pages", probed_bytes >> 20);
        }
    }
    r->reread_bytes = probed_bytes;
    for (int s = 0; s < g->n_shards; s++) {
        const shard *sh = &g->shards[s];
        if (!sh->mapped) continue;
        if (listed) {
            if (reread_small_pages(sh, UINT64_MAX, &r->reread_bytes, why, sizeof why) != 1)
                return pages_note(r, "%s", why);
        } else {
            const uint64_t from = sh == first && !proven ? probe_bytes : 0;
            if (!reread_shard(sh, from, sh->size, why, sizeof why)) return pages_note(r, "%s", why);
            r->reread_bytes += sh->size - from;
        }
    }
    r->reread = r->reread_bytes > 0;
    if (!mapped_sizes(g, &after, why, sizeof why)) return pages_note(r, "%s", why);
    r->after = pmd_share(&after);
    return true;
}

/* ---- accessors ---- */

uint32_t ds4_gguf_version(const ds4_gguf *g) { return g->shards[0].version; }
uint32_t ds4_gguf_alignment(const ds4_gguf *g) { return g->shards[0].alignment; }
size_t ds4_gguf_n_kv(const ds4_gguf *g) { return g->shards[0].n_kv; }
size_t ds4_gguf_n_tensors(const ds4_gguf *g) { return g->n_tensors; }
int ds4_gguf_n_shards(const ds4_gguf *g) { return g->n_shards; }

const char *ds4_gguf_shard_path(const ds4_gguf *g, int shard) {
    return shard >= 0 && shard < g->n_shards ? g->shards[shard].path : NULL;
}

const ds4_gguf_kv *ds4_gguf_kv_at(const ds4_gguf *g, size_t i) {
    return i < g->shards[0].n_kv ? &g->shards[0].kv[i] : NULL;
}

const ds4_gguf_kv *ds4_gguf_find_kv(const ds4_gguf *g, const char *key) {
    return shard_find(&g->shards[0], key);
}

const ds4_gguf_tensor *ds4_gguf_tensor_at(const ds4_gguf *g, size_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const ds4_gguf_tensor *ds4_gguf_find_tensor(const ds4_gguf *g, const char *name) {
    return index_find(&g->tensor_index, g->tensors, sizeof *g->tensors, name);
}

uint64_t ds4_gguf_file_bytes(const ds4_gguf *g) {
    uint64_t n = 0;
    for (int s = 0; s < g->n_shards; s++) n += g->shards[s].size;
    return n;
}

bool ds4_gguf_get_u64(const ds4_gguf *g, const char *key, uint64_t *out) {
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, key);
    return kv && value_as_u64(kv->type, kv->v, out);
}

bool ds4_gguf_get_u32(const ds4_gguf *g, const char *key, uint32_t *out) {
    uint64_t v;
    if (!ds4_gguf_get_u64(g, key, &v) || v > UINT32_MAX) return false;
    *out = (uint32_t)v;
    return true;
}

bool ds4_gguf_get_f32(const ds4_gguf *g, const char *key, float *out) {
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, key);
    double v;
    if (!kv || !value_as_f64(kv->type, kv->v, &v)) return false;
    *out = (float)v;
    return true;
}

bool ds4_gguf_get_bool(const ds4_gguf *g, const char *key, bool *out) {
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, key);
    if (!kv || kv->type != DS4_GGUF_BOOL) return false;
    *out = kv->v.b;
    return true;
}

bool ds4_gguf_get_str(const ds4_gguf *g, const char *key, ds4_gguf_str *out) {
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, key);
    if (!kv || kv->type != DS4_GGUF_STRING) return false;
    *out = kv->str;
    return true;
}

bool ds4_gguf_arch_is(const ds4_gguf *g, const char *arch) {
    ds4_gguf_str s;
    return ds4_gguf_get_str(g, "general.architecture", &s) && s.len == strlen(arch) && !memcmp(s.ptr, arch, s.len);
}

static bool arr_elem(const ds4_gguf_kv *kv, uint64_t i, union ds4_gguf_value *v) {
    if (kv->type != DS4_GGUF_ARRAY || i >= kv->arr_n || kv->arr_type == DS4_GGUF_BOOL) return false;
    unsigned es = scalar_size(kv->arr_type);
    if (!es) return false;
    *v = decode_scalar(kv->arr_type, kv->arr_data + i * es);
    return true;
}

bool ds4_gguf_arr_i64(const ds4_gguf_kv *kv, uint64_t i, int64_t *out) {
    union ds4_gguf_value v;
    return arr_elem(kv, i, &v) && value_as_i64(kv->arr_type, v, out);
}

bool ds4_gguf_arr_u64(const ds4_gguf_kv *kv, uint64_t i, uint64_t *out) {
    union ds4_gguf_value v;
    return arr_elem(kv, i, &v) && value_as_u64(kv->arr_type, v, out);
}

bool ds4_gguf_arr_f64(const ds4_gguf_kv *kv, uint64_t i, double *out) {
    union ds4_gguf_value v;
    return arr_elem(kv, i, &v) && value_as_f64(kv->arr_type, v, out);
}

/* ---- writer ---- */

/* Entries keep the name first so the name index works on them too. */
typedef struct { ds4_gguf_str key; uint32_t type; uint8_t *val; size_t val_len; } wkv;
typedef struct {
    ds4_gguf_str name;
    uint32_t type, n_dims;
    uint64_t ne[DS4_GGUF_MAX_DIMS];
    uint64_t n_bytes;
    const void *data;
} wtensor;

struct ds4_gguf_writer {
    uint32_t alignment;
    wkv *kv;
    size_t n_kv, cap_kv;
    wtensor *t;
    size_t n_t, cap_t;
    char err[256];              /* first recorded error, reported by write_file */
};

static void wfail(ds4_gguf_writer *w, const char *fmt, ...) {
    if (w->err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
}

static bool grow(void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t nc = *cap ? *cap * 2 : 16;
    void *p = realloc(*arr, nc * elem);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

ds4_gguf_writer *ds4_gguf_writer_new(uint32_t alignment) {
    ds4_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->alignment = alignment ? alignment : GGUF_DEFAULT_ALIGNMENT;
    if ((w->alignment & (w->alignment - 1)) || w->alignment > GGUF_MAX_ALIGNMENT)
        wfail(w, "writer alignment %" PRIu32 " is not a power of two in [1, %u]", alignment,
              GGUF_MAX_ALIGNMENT);
    return w;
}

void ds4_gguf_writer_free(ds4_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free((void *)w->kv[i].key.ptr);
        free(w->kv[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) free((void *)w->t[i].name.ptr);
    free(w->kv);
    free(w->t);
    free(w);
}

static bool owned_str(ds4_gguf_str *s, const char *src) {
    s->len = strlen(src);
    s->ptr = strdup(src);
    return s->ptr != NULL;
}

/* Adds key with the encoded value val (ownership taken; NULL means the
 * caller ran out of memory building it). */
static void add_kv(ds4_gguf_writer *w, const char *k, uint32_t type, uint8_t *val, size_t len) {
    wkv e = {{NULL, 0}, type, val, len};
    if (!k || !*k || strlen(k) > GGUF_MAX_KEY_LEN) {
        wfail(w, "metadata key '%s' is empty or longer than %u bytes", k ? k : "(null)",
              GGUF_MAX_KEY_LEN);
    } else if (!val || !grow((void **)&w->kv, &w->cap_kv, w->n_kv, sizeof *w->kv) ||
               !owned_str(&e.key, k)) {
        wfail(w, "out of memory adding metadata '%s'", k);
    } else {
        w->kv[w->n_kv++] = e;
        return;
    }
    free((void *)e.key.ptr);
    free(val);
}

static void add_scalar(ds4_gguf_writer *w, const char *k, uint32_t type, uint64_t bits) {
    unsigned n = scalar_size(type);
    uint8_t *val = malloc(n);
    if (val) store_le(val, bits, n);
    add_kv(w, k, type, val, n);
}

void ds4_gguf_w_u8(ds4_gguf_writer *w, const char *k, uint8_t v) { add_scalar(w, k, DS4_GGUF_U8, v); }
void ds4_gguf_w_i8(ds4_gguf_writer *w, const char *k, int8_t v) { add_scalar(w, k, DS4_GGUF_I8, (uint64_t)v); }
void ds4_gguf_w_u16(ds4_gguf_writer *w, const char *k, uint16_t v) { add_scalar(w, k, DS4_GGUF_U16, v); }
void ds4_gguf_w_i16(ds4_gguf_writer *w, const char *k, int16_t v) { add_scalar(w, k, DS4_GGUF_I16, (uint64_t)v); }
void ds4_gguf_w_u32(ds4_gguf_writer *w, const char *k, uint32_t v) { add_scalar(w, k, DS4_GGUF_U32, v); }
void ds4_gguf_w_i32(ds4_gguf_writer *w, const char *k, int32_t v) { add_scalar(w, k, DS4_GGUF_I32, (uint64_t)v); }
void ds4_gguf_w_u64(ds4_gguf_writer *w, const char *k, uint64_t v) { add_scalar(w, k, DS4_GGUF_U64, v); }
void ds4_gguf_w_i64(ds4_gguf_writer *w, const char *k, int64_t v) { add_scalar(w, k, DS4_GGUF_I64, (uint64_t)v); }
void ds4_gguf_w_bool(ds4_gguf_writer *w, const char *k, bool v) { add_scalar(w, k, DS4_GGUF_BOOL, v); }

void ds4_gguf_w_f32(ds4_gguf_writer *w, const char *k, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    add_scalar(w, k, DS4_GGUF_F32, bits);
}

void ds4_gguf_w_f64(ds4_gguf_writer *w, const char *k, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    add_scalar(w, k, DS4_GGUF_F64, bits);
}

/* Encodes GGUF strings (u64 length + bytes) back to back. */
static size_t put_strs(uint8_t *dst, const char *const *v, uint64_t n) {
    size_t pos = 0;
    for (uint64_t i = 0; i < n; i++) {
        size_t len = strlen(v[i]);
        store_le(dst + pos, len, 8);
        memcpy(dst + pos + 8, v[i], len);
        pos += 8 + len;
    }
    return pos;
}

static size_t strs_bytes(const char *const *v, uint64_t n) {
    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) total += 8 + strlen(v[i]);
    return total;
}

void ds4_gguf_w_str(ds4_gguf_writer *w, const char *k, const char *v) {
    if (!v) {
        wfail(w, "string '%s' is NULL", k ? k : "(null)");
        return;
    }
    size_t len = strs_bytes(&v, 1);
    uint8_t *val = malloc(len);
    if (val) put_strs(val, &v, 1);
    add_kv(w, k, DS4_GGUF_STRING, val, len);
}

/* Array values: element type, count, then the elements. */
static uint8_t *array_val(uint32_t et, uint64_t n, size_t body) {
    uint8_t *val = malloc(12 + body);
    if (val) {
        store_le(val, et, 4);
        store_le(val + 4, n, 8);
    }
    return val;
}

void ds4_gguf_w_arr(ds4_gguf_writer *w, const char *k, enum ds4_gguf_vtype elem_type,
                    const void *data, uint64_t n) {
    unsigned es = scalar_size(elem_type);
    if (!es || (n && !data) || n > (SIZE_MAX - 12) / es) {
        wfail(w, "array '%s': element type %d is not a fixed-size type, or data/count invalid",
              k ? k : "(null)", (int)elem_type);
        return;
    }
    uint8_t *val = array_val(elem_type, n, n * es);
    if (val && n) memcpy(val + 12, data, n * es);
    add_kv(w, k, DS4_GGUF_ARRAY, val, 12 + n * es);
}

void ds4_gguf_w_arr_str(ds4_gguf_writer *w, const char *k, const char *const *v, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (!v || !v[i]) {
            wfail(w, "string array '%s' has a NULL element", k ? k : "(null)");
            return;
        }
    size_t body = strs_bytes(v, n);
    uint8_t *val = array_val(DS4_GGUF_STRING, n, body);
    if (val) put_strs(val + 12, v, n);
    add_kv(w, k, DS4_GGUF_ARRAY, val, 12 + body);
}

size_t ds4_gguf_w_tensor(ds4_gguf_writer *w, const char *name, uint32_t type,
                         uint32_t n_dims, const uint64_t *ne, const void *data) {
    wtensor t = {{NULL, 0}, type, n_dims, {0}, 0, data};
    const char *shown_name = name ? name : "(null)";
    if (!name || !*name || strlen(name) > GGUF_MAX_NAME_LEN) {
        wfail(w, "tensor name '%s' is empty or longer than %u bytes", shown_name, GGUF_MAX_NAME_LEN);
        return SIZE_MAX;
    }
    if (n_dims > DS4_GGUF_MAX_DIMS || (n_dims && !ne)) {
        wfail(w, "tensor '%s' has %" PRIu32 " dimensions (limit %d)", name, n_dims, DS4_GGUF_MAX_DIMS);
        return SIZE_MAX;
    }
    for (int d = 0; d < DS4_GGUF_MAX_DIMS; d++) t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
    uint64_t elems;
    char why[160];
    if (!tensor_size(type, n_dims, t.ne, &elems, &t.n_bytes, why, sizeof why)) {
        wfail(w, "tensor '%s' %s", name, why);
        return SIZE_MAX;
    }
    if (!grow((void **)&w->t, &w->cap_t, w->n_t, sizeof *w->t) || !owned_str(&t.name, name)) {
        wfail(w, "out of memory adding tensor '%s'", shown_name);
        return SIZE_MAX;
    }
    w->t[w->n_t] = t;
    return w->n_t++;
}

/* Checks names and general.alignment before anything touches the disk.
 * *add_alignment tells whether the writer must emit general.alignment. */
static bool writer_check(ds4_gguf_writer *w, bool *add_alignment) {
    if (w->err[0]) return false;
    name_index kix = {0}, tix = {0};
    size_t a, b;
    int r = index_build(&kix, w->kv, sizeof *w->kv, w->n_kv, &a, &b);
    const wkv *al = r == 0 ? index_find(&kix, w->kv, sizeof *w->kv, "general.alignment") : NULL;
    if (r == 0) r = 2 * index_build(&tix, w->t, sizeof *w->t, w->n_t, &a, &b);
    free(kix.slot);
    free(tix.slot);
    if (r < 0) wfail(w, "out of memory checking names");
    else if (r == 1) wfail(w, "duplicate metadata key '%s'", w->kv[b].key.ptr);
    else if (r == 2) wfail(w, "duplicate tensor name '%s'", w->t[b].name.ptr);
    else if (al && (al->type != DS4_GGUF_U32 || load_le(al->val, 4) != w->alignment))
        wfail(w, "general.alignment was added but is not the UINT32 %" PRIu32 " the writer was "
              "created with", w->alignment);
    *add_alignment = !al && w->alignment != GGUF_DEFAULT_ALIGNMENT;
    return !w->err[0];
}

static bool put(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n; }

static bool put_le(FILE *f, uint64_t v, unsigned n) {
    uint8_t b[8];
    store_le(b, v, n);
    return put(f, b, n);
}

static bool put_gguf_str(FILE *f, ds4_gguf_str s) { return put_le(f, s.len, 8) && put(f, s.ptr, s.len); }

/* Zero bytes up to the next multiple of the alignment; *pos tracks the file offset. */
static bool put_padding(FILE *f, uint64_t *pos, uint32_t alignment) {
    static const uint8_t zeros[4096];
    uint64_t pad = (alignment - *pos % alignment) % alignment;
    *pos += pad;
    for (; pad > 0; pad -= pad < sizeof zeros ? pad : sizeof zeros)
        if (!put(f, zeros, pad < sizeof zeros ? pad : sizeof zeros)) return false;
    return true;
}

static bool write_header(ds4_gguf_writer *w, FILE *f, bool add_alignment, uint64_t *pos) {
    bool ok = put(f, "GGUF", 4) && put_le(f, 3, 4) && put_le(f, w->n_t, 8) &&
              put_le(f, w->n_kv + add_alignment, 8);
    *pos = 24;
    for (size_t i = 0; ok && i < w->n_kv; i++) {
        ok = put_gguf_str(f, w->kv[i].key) && put_le(f, w->kv[i].type, 4) &&
             put(f, w->kv[i].val, w->kv[i].val_len);
        *pos += 12 + w->kv[i].key.len + w->kv[i].val_len;
    }
    if (ok && add_alignment) {
        static const char key[] = "general.alignment";
        ds4_gguf_str ks = {key, sizeof key - 1};
        ok = put_gguf_str(f, ks) && put_le(f, DS4_GGUF_U32, 4) && put_le(f, w->alignment, 4);
        *pos += 8 + ks.len + 8;
    }
    uint64_t offset = 0;
    for (size_t i = 0; ok && i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        ok = put_gguf_str(f, t->name) && put_le(f, t->n_dims, 4);
        for (uint32_t d = 0; ok && d < t->n_dims; d++) ok = put_le(f, t->ne[d], 8);
        ok = ok && put_le(f, t->type, 4) && put_le(f, offset, 8);
        *pos += 8 + t->name.len + 4 + 8 * (uint64_t)t->n_dims + 12;
        offset += (t->n_bytes + w->alignment - 1) / w->alignment * w->alignment;
    }
    /* gguf-py pads here even without tensors; matching it keeps files byte-identical. */
    return ok && put_padding(f, pos, w->alignment);
}

static bool write_tensors(ds4_gguf_writer *w, FILE *f, uint64_t pos, ds4_gguf_fill_fn fill,
                          void *ctx) {
    void *scratch = NULL;
    size_t scratch_len = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        const void *src = t->data;
        if (!src && t->n_bytes) {
            if (t->n_bytes > scratch_len) {
                free(scratch);
                scratch_len = t->n_bytes;
                scratch = malloc(scratch_len);
            }
            if (!scratch) {
                scratch_len = 0;
                wfail(w, "out of memory for %" PRIu64 " bytes of tensor '%s'", t->n_bytes, t->name.ptr);
                ok = false;
            } else if (!fill || fill(ctx, i, scratch, t->n_bytes) != 0) {
                wfail(w, "no data for tensor '%s': %s", t->name.ptr,
                      fill ? "the fill callback failed" : "it was added without data and no fill callback was given");
                ok = false;
            }
            src = scratch;
        }
        pos += t->n_bytes;
        if (ok && !(put(f, src, t->n_bytes) && put_padding(f, &pos, w->alignment))) {
            wfail(w, "write error: %s", strerror(errno));
            ok = false;
        }
    }
    free(scratch);
    return ok;
}

int ds4_gguf_writer_write_file(ds4_gguf_writer *w, const char *path,
                               ds4_gguf_fill_fn fill, void *ctx, char *err, size_t errlen) {
    bool add_alignment;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    FILE *f = NULL;
    bool ok = writer_check(w, &add_alignment);
    if (ok && !tmp) wfail(w, "out of memory");
    if (ok && tmp) {
        memcpy(tmp, path, plen);
        memcpy(tmp + plen, ".tmp", 5);
        f = fopen(tmp, "wb");
        if (!f) wfail(w, "cannot create %s: %s", tmp, strerror(errno));
    }
    if (f) {
        uint64_t pos;
        ok = write_header(w, f, add_alignment, &pos);
        if (!ok) wfail(w, "write error: %s", strerror(errno));
        ok = ok && write_tensors(w, f, pos, fill, ctx);
        if (fclose(f) != 0 && ok) wfail(w, "write error: %s", strerror(errno));
        if (!w->err[0] && rename(tmp, path) != 0)
            wfail(w, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        if (w->err[0]) unlink(tmp);
    }
    free(tmp);
    if (w->err[0]) return fail(err, errlen, path, "%s", w->err), -1;
    return 0;
}
