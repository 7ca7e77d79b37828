/* safetensors.c -- validated mmap reader for safetensors checkpoints. */
#include "format/safetensors.h"
#include "kernels/quant.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Headers are JSON text; anything near this size is not a checkpoint. */
#define MAX_HEADER_BYTES (100u << 20)
#define MAX_SHARDS 4096

typedef struct { void *map; size_t size; } shard;

struct ds4_st {
    shard *shards;
    int n_shards;
    ds4_st_tensor *tensors;
    size_t n, cap;
};

static const struct { const char *name; size_t size; } dtypes[] = {
    [DS4_ST_F64] = {"F64", 8}, [DS4_ST_F32] = {"F32", 4}, [DS4_ST_F16] = {"F16", 2},
    [DS4_ST_BF16] = {"BF16", 2}, [DS4_ST_F8_E4M3] = {"F8_E4M3", 1}, [DS4_ST_F8_E8M0] = {"F8_E8M0", 1},
    [DS4_ST_I8] = {"I8", 1}, [DS4_ST_U8] = {"U8", 1}, [DS4_ST_I16] = {"I16", 2},
    [DS4_ST_I32] = {"I32", 4}, [DS4_ST_I64] = {"I64", 8}, [DS4_ST_BOOL] = {"BOOL", 1},
    [DS4_ST_F4] = {"F4", 0},
};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

const char *ds4_st_dtype_name(enum ds4_st_dtype t) { return (int)t < N_DTYPES ? dtypes[t].name : "?"; }
size_t ds4_st_dtype_size(enum ds4_st_dtype t) { return (int)t < N_DTYPES ? dtypes[t].size : 0; }

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* A JSON number that is an exact non-negative integer below 2^53. */
static int json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double v = j->valuedouble;
    if (!(v >= 0) || v > 9007199254740992.0 || v != floor(v)) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int add_tensor(ds4_st *st, const char *path, int shard_ix, const cJSON *e,
                      const uint8_t *data, uint64_t data_size, char *err, size_t errlen) {
    const char *name = e->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
        return fail(err, errlen, "%s: tensor '%s' lacks dtype/shape/data_offsets", path, name);
    ds4_st_tensor t = {0};
    t.shard = shard_ix;
    int d;
    for (d = 0; d < N_DTYPES && strcmp(dt->valuestring, dtypes[d].name); d++) {}
    if (d == N_DTYPES)
        return fail(err, errlen, "%s: tensor '%s' has unsupported dtype %s", path, name, dt->valuestring);
    t.dtype = (enum ds4_st_dtype)d;
    int nd = cJSON_GetArraySize(shape);
    if (nd > DS4_ST_MAX_DIMS)
        return fail(err, errlen, "%s: tensor '%s' has %d dims", path, name, nd);
    t.n_dims = nd;
    t.n_elements = 1;
    const cJSON *s;
    int i = 0;
    cJSON_ArrayForEach(s, shape) {
        if (json_u64(s, &t.shape[i]))
            return fail(err, errlen, "%s: tensor '%s' has an invalid shape", path, name);
        if (t.shape[i] && t.n_elements > UINT64_MAX / t.shape[i])
            return fail(err, errlen, "%s: tensor '%s' shape overflows", path, name);
        t.n_elements *= t.shape[i++];
    }
    uint64_t b, end;
    if (cJSON_GetArraySize(offs) != 2 || json_u64(cJSON_GetArrayItem(offs, 0), &b) ||
        json_u64(cJSON_GetArrayItem(offs, 1), &end) || b > end || end > data_size)
        return fail(err, errlen, "%s: tensor '%s' has data_offsets outside the file", path, name);
    /* F4 packs two elements per byte, pairs never straddling rows */
    bool f4 = t.dtype == DS4_ST_F4;
    if (f4 && nd > 0 && t.shape[nd - 1] % 2)
        return fail(err, errlen, "%s: F4 tensor '%s' has an odd last dimension", path, name);
    uint64_t want = f4 ? (t.n_elements + 1) / 2 : t.n_elements * dtypes[d].size;
    if ((!f4 && t.n_elements > UINT64_MAX / dtypes[d].size) || end - b != want)
        return fail(err, errlen, "%s: tensor '%s': %llu bytes do not match shape x %s", path, name,
                    (unsigned long long)(end - b), dtypes[d].name);
    t.n_bytes = end - b;
    t.data = data + b;
    if (!(t.name = strdup(name))) return fail(err, errlen, "out of memory");
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 256;
        ds4_st_tensor *nt = realloc(st->tensors, cap * sizeof *nt);
        if (!nt) { free((char *)t.name); return fail(err, errlen, "out of memory"); }
        st->tensors = nt;
        st->cap = cap;
    }
    st->tensors[st->n++] = t;
    return 0;
}

/* Registers a shard (map == NULL: caller-owned buffer, never unmapped). */
static int add_shard(ds4_st *st, void *map, size_t size, char *err, size_t errlen) {
    shard *ns = realloc(st->shards, (size_t)(st->n_shards + 1) * sizeof *ns);
    if (!ns) {
        if (map) munmap((void *)map, size);
        return fail(err, errlen, "out of memory");
    }
    st->shards = ns;
    st->shards[st->n_shards++] = (shard){map, size};
    return 0;
}

static int parse_shard(ds4_st *st, const char *label, const uint8_t *p, size_t size, int ix,
                       char *err, size_t errlen) {
    if (size < 8) return fail(err, errlen, "%s: not a safetensors file (too short)", label);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > size - 8 || hlen > MAX_HEADER_BYTES)
        return fail(err, errlen, "%s: header length %llu exceeds the file", label, (unsigned long long)hlen);
    cJSON *root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fail(err, errlen, "%s: header is not a JSON object", label);
    }
    const uint8_t *data = p + 8 + hlen;
    uint64_t data_size = size - 8 - hlen;
    const cJSON *e;
    int rc = 0;
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__")) continue;
        if ((rc = add_tensor(st, label, ix, e, data, data_size, err, errlen))) break;
    }
    cJSON_Delete(root);
    return rc;
}

static int open_shard(ds4_st *st, const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return fail(err, errlen, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || sb.st_size < 8) {
        close(fd);
        return fail(err, errlen, "%s: not a safetensors file (too short)", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return fail(err, errlen, "%s: mmap: %s", path, strerror(errno));
    int ix = st->n_shards;
    if (add_shard(st, map, size, err, errlen)) return -1;
    return parse_shard(st, path, map, size, ix, err, errlen);
}

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); fclose(f); return NULL; }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    fclose(f);
    *len = n;
    return buf;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const ds4_st_tensor *)a)->name, ((const ds4_st_tensor *)b)->name);
}

/* Opens every shard an index names; each mapped tensor must be in its shard. */
static int open_index(ds4_st *st, const char *dir, const char *index_path, char *err, size_t errlen) {
    size_t len;
    char *text = read_text(index_path, &len);
    if (!text) return fail(err, errlen, "%s: cannot read", index_path);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return fail(err, errlen, "%s: no weight_map object", index_path);
    }
    /* Distinct shard file names, in first-seen order. */
    const char **files = NULL;
    int n_files = 0, rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !strcmp(e->valuestring, "..")) {
            rc = fail(err, errlen, "%s: invalid shard name for '%s'", index_path, e->string);
            break;
        }
        int f;
        for (f = 0; f < n_files && strcmp(files[f], e->valuestring); f++) {}
        if (f < n_files) continue;
        if (n_files == MAX_SHARDS) { rc = fail(err, errlen, "%s: too many shards", index_path); break; }
        const char **nf = realloc(files, (size_t)(n_files + 1) * sizeof *nf);
        if (!nf) { rc = fail(err, errlen, "out of memory"); break; }
        files = nf;
        files[n_files++] = e->valuestring;
    }
    for (int f = 0; !rc && f < n_files; f++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, files[f]) >= sizeof path)
            rc = fail(err, errlen, "%s: path too long", files[f]);
        else
            rc = open_shard(st, path, err, errlen);
    }
    if (!rc) {
        if (st->n > 1) qsort(st->tensors, st->n, sizeof *st->tensors, by_name);
        cJSON_ArrayForEach(e, map) {
            const ds4_st_tensor *t = ds4_st_find(st, e->string);
            int f;
            for (f = 0; f < n_files && strcmp(files[f], e->valuestring); f++) {}
            if (!t || t->shard != f) {
                rc = fail(err, errlen, "%s: tensor '%s' is not in shard %s", index_path, e->string,
                          e->valuestring);
                break;
            }
        }
    }
    free(files);
    cJSON_Delete(root);
    return rc;
}

/* Sorts by name and rejects duplicates; frees st on any failure. */
static ds4_st *finish(ds4_st *st, int rc, char *err, size_t errlen) {
    if (!rc && st->n > 1) {   /* qsort's pointer must not be NULL, even for n = 0 */
        qsort(st->tensors, st->n, sizeof *st->tensors, by_name);
        for (size_t i = 1; i < st->n; i++)
            if (!strcmp(st->tensors[i - 1].name, st->tensors[i].name)) {
                rc = fail(err, errlen, "tensor '%s' appears twice", st->tensors[i].name);
                break;
            }
    }
    if (rc) { ds4_st_close(st); return NULL; }
    return st;
}

ds4_st *ds4_st_open(const char *path, char *err, size_t errlen) {
    ds4_st *st = calloc(1, sizeof *st);
    if (!st) { fail(err, errlen, "out of memory"); return NULL; }
    struct stat sb;
    int rc;
    if (stat(path, &sb)) {
        rc = fail(err, errlen, "%s: %s", path, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        char p[4096];
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", path);
        if (!access(p, R_OK)) {
            rc = open_index(st, path, p, err, errlen);
        } else {
            snprintf(p, sizeof p, "%s/model.safetensors", path);
            rc = open_shard(st, p, err, errlen);
        }
    } else {
        rc = open_shard(st, path, err, errlen);
    }
    return finish(st, rc, err, errlen);
}

ds4_st *ds4_st_open_buffer(const void *buf, size_t len, char *err, size_t errlen) {
    ds4_st *st = calloc(1, sizeof *st);
    if (!st) { fail(err, errlen, "out of memory"); return NULL; }
    int rc = add_shard(st, NULL, len, err, errlen);
    if (!rc) rc = parse_shard(st, "buffer", buf, len, 0, err, errlen);
    return finish(st, rc, err, errlen);
}

void ds4_st_close(ds4_st *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n; i++) free((char *)st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_shards; i++)
        if (st->shards[i].map) munmap(st->shards[i].map, st->shards[i].size);
    free(st->shards);
    free(st);
}

size_t ds4_st_n_tensors(const ds4_st *st) { return st->n; }
const ds4_st_tensor *ds4_st_tensor_at(const ds4_st *st, size_t i) { return i < st->n ? &st->tensors[i] : NULL; }
int ds4_st_n_shards(const ds4_st *st) { return st->n_shards; }

const ds4_st_tensor *ds4_st_find(const ds4_st *st, const char *name) {
    if (st->n == 0) return NULL;   /* bsearch's base must not be NULL */
    ds4_st_tensor key = {.name = name};
    return bsearch(&key, st->tensors, st->n, sizeof key, by_name);
}

float ds4_fp8_e4m3_to_f32(uint8_t v) {
    int sign = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float r;
    if (e == 15 && m == 7) r = NAN;                /* the only NaN; no infinities */
    else if (e == 0) r = ldexpf((float)m, -9);     /* subnormal: m/8 * 2^-6 */
    else r = ldexpf((float)(8 + m), e - 10);       /* (1 + m/8) * 2^(e-7) */
    return sign ? -r : r;
}

float ds4_e8m0_to_f32(uint8_t v) { return v == 255 ? NAN : ldexpf(1.0f, (int)v - 127); }

float ds4_fp4_e2m1_to_f32(uint8_t nibble) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float r = mag[nibble & 7];
    return nibble & 8 ? -r : r;
}

int ds4_st_read_f32(const ds4_st_tensor *t, uint64_t first, uint64_t n, float *out) {
    if (first > t->n_elements || n > t->n_elements - first) return -1;
    if (t->dtype == DS4_ST_F4) {
        const uint8_t *q = t->data;
        for (uint64_t i = first; i < first + n; i++)
            out[i - first] = ds4_fp4_e2m1_to_f32(i % 2 ? q[i / 2] >> 4 : q[i / 2] & 15);
        return 0;
    }
    const uint8_t *p = (const uint8_t *)t->data + first * ds4_st_dtype_size(t->dtype);
    /* The mapping gives no alignment guarantee for odd offsets: copy each element. */
#define LOOP(T, EXPR) for (uint64_t i = 0; i < n; i++) { T v; memcpy(&v, p + i * sizeof v, sizeof v); out[i] = (EXPR); } break
    switch (t->dtype) {
    case DS4_ST_F64: LOOP(double, (float)v);
    case DS4_ST_F32: LOOP(float, v);
    case DS4_ST_F16: LOOP(uint16_t, ds4_half_to_f32(v));
    case DS4_ST_BF16: LOOP(uint16_t, ds4_bf16_to_f32(v));
    case DS4_ST_F8_E4M3: LOOP(uint8_t, ds4_fp8_e4m3_to_f32(v));
    case DS4_ST_F8_E8M0: LOOP(uint8_t, ds4_e8m0_to_f32(v));
    case DS4_ST_I8: LOOP(int8_t, (float)v);
    case DS4_ST_U8: case DS4_ST_BOOL: LOOP(uint8_t, (float)v);
    case DS4_ST_I16: LOOP(int16_t, (float)v);
    case DS4_ST_I32: LOOP(int32_t, (float)v);
    case DS4_ST_I64: LOOP(int64_t, (float)v);
    case DS4_ST_F4: break;
    }
#undef LOOP
    return 0;
}
