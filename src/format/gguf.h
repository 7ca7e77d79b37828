/* gguf.h -- GGUF container: read (mmap, validated) and write.
 *
 * Contract
 * - ds4_gguf_open() maps a file read-only and validates *every* count, length,
 *   offset and size against the file size before anything is exposed. After a
 *   successful open every pointer handed out (strings, arrays, tensor data) is
 *   in bounds, so callers never re-check. On failure it returns NULL and writes
 *   one human-readable line naming what is wrong into err.
 * - Split models ("NAME-00001-of-0000N.gguf"): opening any shard opens all of
 *   them as one logical model. Metadata comes from the first shard, tensors
 *   from all shards (names must be unique across shards). The shard count
 *   comes from split.count when present, else from the file name; split.no /
 *   split.count / split.tensors.count, where present, must agree with it.
 * - Accepted: versions 2 and 3, little endian; general.alignment a UINT32
 *   power of two up to 1 MiB (default 32); tensor offsets multiples of it and
 *   data inside the file (overlap and gaps are allowed); known ggml types
 *   only, ne[0] a multiple of the block size, 0..8 dims, counts < 2^63.
 * - Key and tensor lookup by name is O(1) expected (hash tables).
 * - Strings in the file are NOT NUL-terminated: ds4_gguf_str is (ptr,len).
 * - The writer (ds4_gguf_writer_*) produces files gguf-py and llama.cpp read:
 *   version 3, little endian, tensor data aligned to general.alignment.
 */
#ifndef DS4_GGUF_H
#define DS4_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

enum ds4_gguf_vtype {
    DS4_GGUF_U8 = 0, DS4_GGUF_I8 = 1, DS4_GGUF_U16 = 2, DS4_GGUF_I16 = 3,
    DS4_GGUF_U32 = 4, DS4_GGUF_I32 = 5, DS4_GGUF_F32 = 6, DS4_GGUF_BOOL = 7,
    DS4_GGUF_STRING = 8, DS4_GGUF_ARRAY = 9, DS4_GGUF_U64 = 10, DS4_GGUF_I64 = 11,
    DS4_GGUF_F64 = 12,
};

typedef struct { const char *ptr; uint64_t len; } ds4_gguf_str;

typedef struct ds4_gguf_kv {
    ds4_gguf_str key;
    enum ds4_gguf_vtype type;
    /* scalars: decoded value (ints widened, floats as double) */
    union ds4_gguf_value { uint64_t u; int64_t i; double f; bool b; } v;
    ds4_gguf_str str;                 /* type == STRING */
    enum ds4_gguf_vtype arr_type;     /* type == ARRAY: element type */
    uint64_t arr_n;                   /* type == ARRAY: element count */
    const uint8_t *arr_data;          /* raw little-endian elements (non-string arrays) */
    const ds4_gguf_str *arr_strs;     /* string arrays: arr_n decoded (ptr,len) pairs */
} ds4_gguf_kv;
/* Nested arrays (arr_type == ARRAY, up to 8 deep) are validated and skipped:
 * arr_data points at the first inner array's raw encoding, arr_i64/arr_f64
 * refuse them. Bool values must be 0 or 1. Keys are 1..65535 bytes without
 * NUL; tensor names 1..63 bytes without NUL (ggml's limit). */

#define DS4_GGUF_MAX_DIMS 8

typedef struct ds4_gguf_tensor {
    ds4_gguf_str name;
    uint32_t type;                    /* ggml type id (see quant.h) */
    uint32_t n_dims;
    uint64_t ne[DS4_GGUF_MAX_DIMS];   /* ne[0] fastest; unused dims = 1 */
    uint64_t n_elements;
    uint64_t n_bytes;
    const void *data;                 /* points into the mapping */
    int shard;                        /* which file of a split model */
    uint64_t file_offset;             /* absolute offset of data in that shard's file */
} ds4_gguf_tensor;

typedef struct ds4_gguf ds4_gguf;

ds4_gguf *ds4_gguf_open(const char *path, char *err, size_t errlen);
/* Same validation, over a caller-owned buffer (fuzzing, tests). The buffer must
 * outlive the returned handle. Split detection is not done. */
ds4_gguf *ds4_gguf_open_buffer(const void *buf, size_t len, char *err, size_t errlen);
void ds4_gguf_close(ds4_gguf *g);

uint32_t ds4_gguf_version(const ds4_gguf *g);
uint32_t ds4_gguf_alignment(const ds4_gguf *g);
size_t ds4_gguf_n_kv(const ds4_gguf *g);
const ds4_gguf_kv *ds4_gguf_kv_at(const ds4_gguf *g, size_t i);
const ds4_gguf_kv *ds4_gguf_find_kv(const ds4_gguf *g, const char *key);
size_t ds4_gguf_n_tensors(const ds4_gguf *g);
const ds4_gguf_tensor *ds4_gguf_tensor_at(const ds4_gguf *g, size_t i);
const ds4_gguf_tensor *ds4_gguf_find_tensor(const ds4_gguf *g, const char *name);
uint64_t ds4_gguf_file_bytes(const ds4_gguf *g);   /* all shards together */
int ds4_gguf_n_shards(const ds4_gguf *g);
const char *ds4_gguf_shard_path(const ds4_gguf *g, int shard);  /* NULL for buffers */
/* Maps every page of every shard's file mapping now (MADV_POPULATE_READ),
 * reading the file where it is not in the page cache, so that first reads
 * of the weights take no page faults. Buffers: nothing to do. False with
 * one line in err when the kernel refuses (older than 5.14: EINVAL; an I/O
 * error on the file: EFAULT); the mapping stays usable either way. */
bool ds4_gguf_populate(const ds4_gguf *g, char *err, size_t errlen);

/* After ds4_gguf_populate: makes the mapped weights sit in 2 MiB pages where
 * the kernel can, because a weight stream reads about twice as fast from them
 * (docs/performance.md). Where the kernel lists which parts of a mapping are
 * in small pages (ds4_mem_small_ranges, Linux 6.7+), re-reads exactly those
 * parts of each shard's whole 2 MiB pages with ds4_file_range_reread,
 * whatever their share; elsewhere reads this process's share of 2 MiB
 * entries (FilePmdMapped / Rss in /proc/self/smaps) and, below 90%,
 * re-reads every shard whole. When no 2 MiB entry exists yet, a probe
 * piece comes first (the first probe_bytes of the first shard's small parts,
 * at most half the shard, rounded down to 2 MiB), and the rest only when that
 * piece came back in 2 MiB entries (at least half of it). Tensor pointers and
 * bytes never change. True when the weights are in large pages or were
 * re-read; false with the reason in r->note otherwise (no smaps, a buffer, an
 * unaligned mapping, a probe in small pages, a failed step: the mapping is
 * usable in every case). r->before / r->after: the shares; r->reread_bytes:
 * how much was read again. */
typedef struct {
    double before, after;   /* share of the resident weights in 2 MiB entries */
    bool reread;            /* some of the page cache was dropped and read again */
    uint64_t reread_bytes;
    char note[256];
} ds4_gguf_pages;
bool ds4_gguf_prefer_large_pages(const ds4_gguf *g, uint64_t probe_bytes, ds4_gguf_pages *r);

/* Typed getters: return false (and leave *out alone) when the key is missing
 * or has an incompatible type. Integer getters accept any integer type whose
 * value fits; float getters accept f32/f64 and integers. */
bool ds4_gguf_get_u32(const ds4_gguf *g, const char *key, uint32_t *out);
bool ds4_gguf_get_u64(const ds4_gguf *g, const char *key, uint64_t *out);
bool ds4_gguf_get_f32(const ds4_gguf *g, const char *key, float *out);
bool ds4_gguf_get_bool(const ds4_gguf *g, const char *key, bool *out);
bool ds4_gguf_get_str(const ds4_gguf *g, const char *key, ds4_gguf_str *out);
/* general.architecture is present and equals arch (what every binder and
 * the family detection first ask of a file). */
bool ds4_gguf_arch_is(const ds4_gguf *g, const char *arch);
/* Array element i as integer / float (any numeric element type). */
bool ds4_gguf_arr_i64(const ds4_gguf_kv *kv, uint64_t i, int64_t *out);
bool ds4_gguf_arr_u64(const ds4_gguf_kv *kv, uint64_t i, uint64_t *out);
bool ds4_gguf_arr_f64(const ds4_gguf_kv *kv, uint64_t i, double *out);

/* ---- writer ----
 * Usage: w = ds4_gguf_writer_new(); add kvs; add tensor infos (name, type,
 * dims, data pointer or NULL for streamed data); ds4_gguf_writer_write_file()
 * writes header+infos, then each tensor's bytes (calling the fill callback for
 * tensors added without data, so a converter can stream tensor by tensor). */
typedef struct ds4_gguf_writer ds4_gguf_writer;
typedef int (*ds4_gguf_fill_fn)(void *ctx, size_t tensor_index, void *dst, size_t n_bytes);

ds4_gguf_writer *ds4_gguf_writer_new(uint32_t alignment);
void ds4_gguf_writer_free(ds4_gguf_writer *w);
void ds4_gguf_w_u8(ds4_gguf_writer *w, const char *k, uint8_t v);
void ds4_gguf_w_i8(ds4_gguf_writer *w, const char *k, int8_t v);
void ds4_gguf_w_u16(ds4_gguf_writer *w, const char *k, uint16_t v);
void ds4_gguf_w_i16(ds4_gguf_writer *w, const char *k, int16_t v);
void ds4_gguf_w_u32(ds4_gguf_writer *w, const char *k, uint32_t v);
void ds4_gguf_w_i32(ds4_gguf_writer *w, const char *k, int32_t v);
void ds4_gguf_w_u64(ds4_gguf_writer *w, const char *k, uint64_t v);
void ds4_gguf_w_i64(ds4_gguf_writer *w, const char *k, int64_t v);
void ds4_gguf_w_f32(ds4_gguf_writer *w, const char *k, float v);
void ds4_gguf_w_f64(ds4_gguf_writer *w, const char *k, double v);
void ds4_gguf_w_bool(ds4_gguf_writer *w, const char *k, bool v);
void ds4_gguf_w_str(ds4_gguf_writer *w, const char *k, const char *v);
/* numeric array: elem_type is a scalar vtype, data holds n little-endian elements */
void ds4_gguf_w_arr(ds4_gguf_writer *w, const char *k, enum ds4_gguf_vtype elem_type,
                    const void *data, uint64_t n);
void ds4_gguf_w_arr_str(ds4_gguf_writer *w, const char *k, const char *const *v, uint64_t n);
/* Returns the tensor index (SIZE_MAX if the tensor is invalid; the error is
 * then reported by write_file). data may be NULL: then fill() provides it at
 * write time; otherwise it must stay valid until write_file returns.
 * Invalid keys/values are likewise reported by write_file. alignment 0 means
 * 32; general.alignment is written automatically when it differs from 32 (a
 * caller-added general.alignment must be a UINT32 equal to it). The file is
 * written to PATH.tmp and renamed, so a failed write leaves no partial PATH. */
size_t ds4_gguf_w_tensor(ds4_gguf_writer *w, const char *name, uint32_t type,
                         uint32_t n_dims, const uint64_t *ne, const void *data);
/* Returns 0 on success, -1 with err filled. */
int ds4_gguf_writer_write_file(ds4_gguf_writer *w, const char *path,
                               ds4_gguf_fill_fn fill, void *ctx, char *err, size_t errlen);

#endif
