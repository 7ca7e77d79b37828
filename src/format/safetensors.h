/* safetensors.h -- read-only access to safetensors checkpoints (the
 * converter's input).
 *
 * Contract
 * - ds4_st_open() takes a .safetensors file or a directory. A directory is
 *   read through model.safetensors.index.json when present (every shard its
 *   weight_map names, and every mapped tensor must be in the shard named),
 *   else through model.safetensors.
 * - Every file is mmapped read-only and its header validated before anything
 *   is exposed: header length within the file, JSON parsed with cJSON, every
 *   entry has a known dtype, a shape of non-negative integers, and
 *   data_offsets [begin, end] inside the data section with end - begin equal
 *   to the shape's element count times the dtype size (F4: half a byte, the
 *   last dimension even) without overflow. Tensor
 *   names are unique across shards. On failure: NULL and one line in err.
 * - Tensor data pointers point into the mappings; nothing is copied, so a
 *   converter can stream tensor by tensor with bounded memory.
 * - Element decoding: ds4_st_read_f32() converts any numeric dtype (F64, F32,
 *   F16, BF16, F8_E4M3 (the "fn" variant: no infinities), F8_E8M0 (2^(e-127)),
 *   I8, U8, I16, I32, I64, F4) to float for a range of elements. FP4 (E2M1)
 *   values come either as dtype F4 (what torch's float4_e2m1fn_x2 saves) or,
 *   in the official DeepSeek checkpoint, packed two per byte in I8/U8 tensors
 *   whose shape counts bytes (low nibble = even element); decode those with
 *   ds4_fp4_e2m1_to_f32().
 */
#ifndef DS4_SAFETENSORS_H
#define DS4_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

enum ds4_st_dtype {
    DS4_ST_F64, DS4_ST_F32, DS4_ST_F16, DS4_ST_BF16, DS4_ST_F8_E4M3, DS4_ST_F8_E8M0,
    DS4_ST_I8, DS4_ST_U8, DS4_ST_I16, DS4_ST_I32, DS4_ST_I64, DS4_ST_BOOL,
    DS4_ST_F4,   /* E2M1, two per byte, low nibble first; shape counts elements */
};

#define DS4_ST_MAX_DIMS 8

typedef struct ds4_st_tensor {
    const char *name;
    enum ds4_st_dtype dtype;
    int n_dims;
    uint64_t shape[DS4_ST_MAX_DIMS];   /* row-major, slowest first (PyTorch order) */
    uint64_t n_elements;
    uint64_t n_bytes;
    const void *data;                  /* into the mapping */
    int shard;
} ds4_st_tensor;

typedef struct ds4_st ds4_st;

ds4_st *ds4_st_open(const char *path, char *err, size_t errlen);
/* One in-memory file (fuzzing, tests); the buffer must outlive the handle. */
ds4_st *ds4_st_open_buffer(const void *buf, size_t len, char *err, size_t errlen);
void ds4_st_close(ds4_st *st);

size_t ds4_st_n_tensors(const ds4_st *st);
const ds4_st_tensor *ds4_st_tensor_at(const ds4_st *st, size_t i);   /* sorted by name */
const ds4_st_tensor *ds4_st_find(const ds4_st *st, const char *name);
int ds4_st_n_shards(const ds4_st *st);

const char *ds4_st_dtype_name(enum ds4_st_dtype t);
size_t ds4_st_dtype_size(enum ds4_st_dtype t);   /* bytes per element; 0 for F4 */

/* Converts elements [first, first + n) of t to float. Returns 0, or -1 when
 * the range is outside the tensor. */
int ds4_st_read_f32(const ds4_st_tensor *t, uint64_t first, uint64_t n, float *out);

float ds4_fp8_e4m3_to_f32(uint8_t v);
float ds4_e8m0_to_f32(uint8_t v);
float ds4_fp4_e2m1_to_f32(uint8_t nibble);    /* low 4 bits used */

#endif
