/* test_gguf.c -- GGUF reader/writer.
 *
 * Oracles: fixtures written by gguf-py (tests/oracles/gguf_make_fixtures.py;
 * the offsets below are the ones gguf-py's own reader reports), hand-built
 * hostile headers, and write->read round trips (every prefix of a valid file
 * must be rejected exactly up to the end of its last tensor's data).
 *
 * `test_gguf --copy IN OUT` re-writes IN with our writer (tensors alternate
 * between data pointers and the fill callback); tests/gguf/test_gguf_pyread.py
 * checks the result with gguf-py. */
#include "check.h"
#include "format/gguf.h"
#include "kernels/quant.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define FIX "tests/fixtures/gguf/"

static char err[512];

static bool str_eq(ds4_gguf_str s, const char *c) {
    return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static char *cstr(ds4_gguf_str s) {
    char *p = malloc(s.len + 1);
    memcpy(p, s.ptr, s.len);
    p[s.len] = 0;
    return p;
}

static void *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*len ? *len : 1);
    if (fread(p, 1, *len, f) != *len) { free(p); p = NULL; }
    fclose(f);
    return p;
}

static bool one_line_error(void) {
    return strncmp(err, "gguf: ", 6) == 0 && !strchr(err, '\n');
}

/* ---------------- gguf-py fixture ---------------- */

static void check_int_array(const ds4_gguf *g, const char *key, enum ds4_gguf_vtype t,
                            const int64_t *want) {
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, key);
    CHECK(kv && kv->type == DS4_GGUF_ARRAY && kv->arr_type == t && kv->arr_n == 3, "%s", key);
    if (!kv) return;
    for (int i = 0; i < 3; i++) {
        int64_t v = 0;
        CHECK(ds4_gguf_arr_i64(kv, (uint64_t)i, &v) && v == want[i], "%s[%d] = %lld", key, i, (long long)v);
    }
    int64_t v;
    CHECK(!ds4_gguf_arr_i64(kv, 3, &v), "%s: index past the end", key);
}

static void test_fixture_all_types(void) {
    ds4_gguf *g = ds4_gguf_open(FIX "all_types.gguf", err, sizeof err);
    CHECK(g != NULL, "open: %s", err);
    if (!g) return;
    CHECK(ds4_gguf_version(g) == 3, "version");
    CHECK(ds4_gguf_alignment(g) == 64, "alignment %u", ds4_gguf_alignment(g));
    CHECK(ds4_gguf_n_kv(g) == 27, "n_kv %zu", ds4_gguf_n_kv(g));
    CHECK(ds4_gguf_n_shards(g) == 1 && strcmp(ds4_gguf_shard_path(g, 0), FIX "all_types.gguf") == 0, "shards");
    CHECK(ds4_gguf_file_bytes(g) == 2688, "file bytes %llu", (unsigned long long)ds4_gguf_file_bytes(g));
    CHECK(str_eq(ds4_gguf_kv_at(g, 0)->key, "general.architecture") &&
          str_eq(ds4_gguf_kv_at(g, 0)->str, "fixture"), "kv 0");
    CHECK(ds4_gguf_kv_at(g, 27) == NULL, "kv_at past the end");

    const ds4_gguf_kv *kv;
    kv = ds4_gguf_find_kv(g, "t.u8");  CHECK(kv && kv->type == DS4_GGUF_U8 && kv->v.u == 255, "u8");
    kv = ds4_gguf_find_kv(g, "t.i8");  CHECK(kv && kv->type == DS4_GGUF_I8 && kv->v.i == -128, "i8");
    kv = ds4_gguf_find_kv(g, "t.u16"); CHECK(kv && kv->type == DS4_GGUF_U16 && kv->v.u == 65535, "u16");
    kv = ds4_gguf_find_kv(g, "t.i16"); CHECK(kv && kv->type == DS4_GGUF_I16 && kv->v.i == -32768, "i16");
    kv = ds4_gguf_find_kv(g, "t.u32"); CHECK(kv && kv->type == DS4_GGUF_U32 && kv->v.u == UINT32_MAX, "u32");
    kv = ds4_gguf_find_kv(g, "t.i32"); CHECK(kv && kv->type == DS4_GGUF_I32 && kv->v.i == INT32_MIN, "i32");
    kv = ds4_gguf_find_kv(g, "t.f32"); CHECK(kv && kv->type == DS4_GGUF_F32 && kv->v.f == 3.25, "f32");
    kv = ds4_gguf_find_kv(g, "t.u64"); CHECK(kv && kv->type == DS4_GGUF_U64 && kv->v.u == UINT64_MAX, "u64");
    kv = ds4_gguf_find_kv(g, "t.i64"); CHECK(kv && kv->type == DS4_GGUF_I64 && kv->v.i == INT64_MIN, "i64");
    kv = ds4_gguf_find_kv(g, "t.f64"); CHECK(kv && kv->type == DS4_GGUF_F64 && kv->v.f == -1.5e300, "f64");
    kv = ds4_gguf_find_kv(g, "t.str");
    CHECK(kv && kv->type == DS4_GGUF_STRING && str_eq(kv->str, "h\xc3\xa9llo w\xc3\xb6rld"), "str");

    uint32_t u32 = 7;
    uint64_t u64 = 0;
    float f = 0;
    bool b = false;
    ds4_gguf_str s = {0};
    CHECK(ds4_gguf_get_u32(g, "t.u8", &u32) && u32 == 255, "get_u32 widens u8");
    CHECK(ds4_gguf_get_u32(g, "general.alignment", &u32) && u32 == 64, "get_u32 alignment");
    u32 = 7;
    CHECK(!ds4_gguf_get_u32(g, "t.i8", &u32) && u32 == 7, "get_u32 rejects negative, leaves *out");
    CHECK(!ds4_gguf_get_u32(g, "t.u64", &u32), "get_u32 rejects values above 2^32");
    CHECK(!ds4_gguf_get_u32(g, "t.f32", &u32), "get_u32 rejects floats");
    CHECK(!ds4_gguf_get_u32(g, "missing.key", &u32), "missing key");
    CHECK(ds4_gguf_get_u64(g, "t.u64", &u64) && u64 == UINT64_MAX, "get_u64");
    CHECK(ds4_gguf_get_f32(g, "t.f32", &f) && f == 3.25f, "get_f32");
    CHECK(ds4_gguf_get_f32(g, "t.i32", &f) && f == -2147483648.0f, "get_f32 from int");
    CHECK(!ds4_gguf_get_f32(g, "t.str", &f), "get_f32 rejects strings");
    CHECK(ds4_gguf_get_bool(g, "t.bool_true", &b) && b, "bool true");
    CHECK(ds4_gguf_get_bool(g, "t.bool_false", &b) && !b, "bool false");
    CHECK(!ds4_gguf_get_bool(g, "t.u8", &b), "get_bool rejects ints");
    CHECK(ds4_gguf_get_str(g, "general.architecture", &s) && str_eq(s, "fixture"), "get_str");
    CHECK(!ds4_gguf_get_str(g, "t.u8", &s), "get_str rejects ints");
    CHECK(ds4_gguf_find_kv(g, "t.u") == NULL && ds4_gguf_find_kv(g, "t.u8x") == NULL, "no prefix matches");

    check_int_array(g, "a.u8", DS4_GGUF_U8, (const int64_t[]){0, 1, 255});
    check_int_array(g, "a.i8", DS4_GGUF_I8, (const int64_t[]){-128, 0, 127});
    uint64_t u64v;
    CHECK(!ds4_gguf_arr_u64(ds4_gguf_find_kv(g, "a.i8"), 0, &u64v), "arr_u64 rejects negative");
    check_int_array(g, "a.u16", DS4_GGUF_U16, (const int64_t[]){0, 1, 65535});
    check_int_array(g, "a.i16", DS4_GGUF_I16, (const int64_t[]){-32768, 0, 32767});
    check_int_array(g, "a.u32", DS4_GGUF_U32, (const int64_t[]){0, 1, 4294967295});
    check_int_array(g, "a.i32", DS4_GGUF_I32, (const int64_t[]){INT32_MIN, 0, INT32_MAX});
    check_int_array(g, "a.i64", DS4_GGUF_I64, (const int64_t[]){INT64_MIN, 0, INT64_MAX});
    int64_t iv;
    double dv;
    kv = ds4_gguf_find_kv(g, "a.u64");
    CHECK(kv && kv->arr_type == DS4_GGUF_U64 && kv->arr_n == 3, "a.u64");
    if (kv) {
        CHECK(ds4_gguf_arr_i64(kv, 1, &iv) && iv == 1, "a.u64[1]");
        CHECK(!ds4_gguf_arr_i64(kv, 2, &iv), "a.u64[2] does not fit int64");
        CHECK(ds4_gguf_arr_f64(kv, 2, &dv) && dv == 18446744073709551615.0, "a.u64[2] as f64");
        uint64_t uv = 0;
        CHECK(ds4_gguf_arr_u64(kv, 2, &uv) && uv == UINT64_MAX, "a.u64[2] as u64");
    }
    kv = ds4_gguf_find_kv(g, "a.f32");
    CHECK(kv && kv->arr_type == DS4_GGUF_F32 && kv->arr_n == 3, "a.f32");
    if (kv) {
        CHECK(ds4_gguf_arr_f64(kv, 0, &dv) && dv == 1.5, "a.f32[0]");
        CHECK(ds4_gguf_arr_f64(kv, 2, &dv) && dv == (double)1e-30f, "a.f32[2]");
        CHECK(!ds4_gguf_arr_i64(kv, 0, &iv), "1.5 is not an integer");
        CHECK(ds4_gguf_arr_i64(kv, 1, &iv) && iv == -2, "-2.0 is");
    }
    kv = ds4_gguf_find_kv(g, "a.f64");
    CHECK(kv && kv->arr_type == DS4_GGUF_F64 && ds4_gguf_arr_f64(kv, 2, &dv) && dv == 1e300, "a.f64");
    kv = ds4_gguf_find_kv(g, "a.bool");
    CHECK(kv && kv->arr_type == DS4_GGUF_BOOL && kv->arr_n == 3 && kv->arr_data[0] == 1 &&
          kv->arr_data[1] == 0 && kv->arr_data[2] == 1, "a.bool");
    CHECK(kv && !ds4_gguf_arr_i64(kv, 0, &iv), "bool arrays are not numeric");
    kv = ds4_gguf_find_kv(g, "a.str");
    CHECK(kv && kv->arr_type == DS4_GGUF_STRING && kv->arr_n == 3 && kv->arr_strs &&
          str_eq(kv->arr_strs[0], "ab") && str_eq(kv->arr_strs[1], "") &&
          str_eq(kv->arr_strs[2], "\xc3\xbcn\xc3\xaf"), "a.str");
    CHECK(kv && !ds4_gguf_arr_f64(kv, 0, &dv), "string arrays are not numeric");

    /* name, type, dims, bytes and absolute data offset as gguf-py reports them */
    static const struct {
        const char *name; uint32_t type, n_dims; uint64_t ne[3], n_bytes, offset;
    } want[] = {
        {"t.f32", DS4_TYPE_F32, 2, {3, 2, 1}, 24, 1408},
        {"t.f16", DS4_TYPE_F16, 1, {4, 1, 1}, 8, 1472},
        {"t.q8_0", DS4_TYPE_Q8_0, 2, {64, 2, 1}, 136, 1536},
        {"t.q4_k", DS4_TYPE_Q4_K, 2, {256, 1, 1}, 144, 1728},
        {"t.q2_k", DS4_TYPE_Q2_K, 2, {256, 1, 1}, 84, 1920},
        {"t.iq2_xxs", DS4_TYPE_IQ2_XXS, 2, {256, 1, 1}, 66, 2048},
        {"t.i32", DS4_TYPE_I32, 1, {5, 1, 1}, 20, 2176},
        {"t.bf16", DS4_TYPE_BF16, 2, {4, 2, 1}, 16, 2240},
        {"t.i8", DS4_TYPE_I8, 1, {3, 1, 1}, 3, 2304},
        {"t.f64", DS4_TYPE_F64, 1, {2, 1, 1}, 16, 2368},
        {"blk.0.ffn_gate_exps.weight", DS4_TYPE_Q8_0, 3, {32, 2, 3}, 204, 2432},
    };
    size_t nt = sizeof want / sizeof want[0];
    CHECK(ds4_gguf_n_tensors(g) == nt, "n_tensors %zu", ds4_gguf_n_tensors(g));
    for (size_t i = 0; i < nt && i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        CHECK(str_eq(t->name, want[i].name) && t->type == want[i].type &&
              t->n_dims == want[i].n_dims && t->ne[0] == want[i].ne[0] && t->ne[1] == want[i].ne[1] &&
              t->ne[2] == want[i].ne[2] && t->ne[3] == 1 && t->n_bytes == want[i].n_bytes &&
              t->file_offset == want[i].offset && t->shard == 0,
              "tensor %zu (%s)", i, want[i].name);
        CHECK(t->n_elements == want[i].ne[0] * want[i].ne[1] * want[i].ne[2], "%s elements", want[i].name);
        CHECK((uintptr_t)t->data % 64 == 0, "%s data aligned", want[i].name);
        CHECK(ds4_gguf_find_tensor(g, want[i].name) == t, "find %s", want[i].name);
    }
    CHECK(ds4_gguf_find_tensor(g, "t.f3") == NULL && ds4_gguf_tensor_at(g, nt) == NULL, "no such tensor");

    const ds4_gguf_tensor *t = ds4_gguf_find_tensor(g, "t.f32");
    if (t) {
        float v[6];
        memcpy(v, t->data, sizeof v);
        for (int i = 0; i < 6; i++) CHECK(v[i] == i * 0.5f - 1, "t.f32[%d] = %g", i, v[i]);
    }
    t = ds4_gguf_find_tensor(g, "t.f16");
    if (t) {
        uint16_t h[4];
        memcpy(h, t->data, sizeof h);
        CHECK(h[0] == 0x3C00 && h[1] == 0xC000 && h[2] == 0x3800 && h[3] == 0x7BFF, "t.f16 bits");
    }
    t = ds4_gguf_find_tensor(g, "t.i32");
    if (t) {
        int32_t v[5];
        memcpy(v, t->data, sizeof v);
        CHECK(v[0] == -1 && v[1] == 0 && v[2] == 1 && v[3] == INT32_MAX && v[4] == INT32_MIN, "t.i32");
    }
    /* raw blocks: byte i of the tensor is (i * mul + add) & 255 in the oracle script */
    static const struct { const char *name; unsigned mul, add; } pattern[] = {
        {"t.q8_0", 7, 3}, {"t.q4_k", 5, 1}, {"t.q2_k", 3, 2}, {"t.iq2_xxs", 11, 9},
        {"t.bf16", 13, 0}, {"blk.0.ffn_gate_exps.weight", 17, 4},
    };
    for (size_t p = 0; p < sizeof pattern / sizeof pattern[0]; p++) {
        t = ds4_gguf_find_tensor(g, pattern[p].name);
        bool ok = t != NULL;
        for (uint64_t i = 0; ok && i < t->n_bytes; i++)
            ok = ((const uint8_t *)t->data)[i] == (uint8_t)(i * pattern[p].mul + pattern[p].add);
        CHECK(ok, "%s bytes", pattern[p].name);
    }
    ds4_gguf_close(g);
}

static void test_fixture_nested(void) {
    ds4_gguf *g = ds4_gguf_open(FIX "nested.gguf", err, sizeof err);
    CHECK(g != NULL, "open nested: %s", err);
    if (!g) return;
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, "n.ints");
    int64_t v;
    CHECK(kv && kv->type == DS4_GGUF_ARRAY && kv->arr_type == DS4_GGUF_ARRAY && kv->arr_n == 2, "n.ints");
    CHECK(kv && !ds4_gguf_arr_i64(kv, 0, &v), "nested arrays are not numeric");
    kv = ds4_gguf_find_kv(g, "n.strs");
    CHECK(kv && kv->arr_type == DS4_GGUF_ARRAY && kv->arr_n == 2 && kv->arr_strs == NULL, "n.strs");
    kv = ds4_gguf_find_kv(g, "n.deep");
    CHECK(kv && kv->arr_type == DS4_GGUF_ARRAY && kv->arr_n == 1, "n.deep");
    uint32_t after = 0;
    CHECK(ds4_gguf_get_u32(g, "n.after", &after) && after == 42, "key after nested arrays");
    const ds4_gguf_tensor *t = ds4_gguf_find_tensor(g, "n.t");
    float f = 0;
    if (t) memcpy(&f, t->data, 4);
    CHECK(t && f == 2.5f, "tensor after nested arrays");
    ds4_gguf_close(g);
}

/* ---------------- split models ---------------- */

static char tmpdir[] = "/tmp/test_gguf_XXXXXX";

static char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

static void copy_file(const char *from, const char *to) {
    size_t len = 0;
    void *p = read_all(from, &len);
    FILE *f = fopen(to, "wb");
    if (p && f) fwrite(p, 1, len, f);
    if (f) fclose(f);
    free(p);
}

static void check_split_model(const char *path) {
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "open %s: %s", path, err);
    if (!g) return;
    CHECK(ds4_gguf_n_shards(g) == 3 && ds4_gguf_n_tensors(g) == 5, "3 shards, 5 tensors");
    CHECK(ds4_gguf_file_bytes(g) == 352 + 288 + 192, "bytes of all shards");
    uint32_t v = 0, no = 9;
    CHECK(ds4_gguf_get_u32(g, "s.value", &v) && v == 7, "metadata from the first shard");
    CHECK(ds4_gguf_get_u32(g, "split.no", &no) && no == 0, "split.no of the first shard");
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "s.t%d", i);
        const ds4_gguf_tensor *t = ds4_gguf_find_tensor(g, name);
        CHECK(t && t == ds4_gguf_tensor_at(g, (size_t)i) && t->shard == i / 2, "%s shard", name);
        if (!t) continue;
        const char *sp = ds4_gguf_shard_path(g, t->shard);
        char want[32];
        snprintf(want, sizeof want, "split-%05d-of-00003.gguf", i / 2 + 1);
        CHECK(sp && strstr(sp, want), "%s path %s", name, sp ? sp : "?");
        float d[8];
        memcpy(d, t->data, sizeof d);
        bool ok = t->n_bytes == sizeof d;
        for (int k = 0; k < 8; k++) ok = ok && d[k] == (float)i;
        CHECK(ok, "%s data", name);
    }
    ds4_gguf_close(g);
}

static int fill_pattern(void *ctx, size_t idx, void *dst, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)(idx * 31 + i);
    return 0;
}

/* A file with one F32 tensor of ne0 x 2 elements */
static int write_small(const char *path, const char *tensor, bool with_split_keys, uint16_t no, uint64_t ne0) {
    ds4_gguf_writer *w = ds4_gguf_writer_new(0);
    ds4_gguf_w_u32(w, "p.value", 5);
    if (with_split_keys) {
        ds4_gguf_w_u16(w, "split.no", no);
        ds4_gguf_w_u16(w, "split.count", 2);
    }
    uint64_t ne[2] = {ne0, 2};
    ds4_gguf_w_tensor(w, tensor, DS4_TYPE_F32, 2, ne, NULL);
    int r = ds4_gguf_writer_write_file(w, path, fill_pattern, NULL, err, sizeof err);
    ds4_gguf_writer_free(w);
    return r;
}

static long minor_faults(void) {
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return r.ru_minflt;
}

/* ds4_gguf_populate maps every page of every shard: afterwards, reading
 * every page of both tensors of a split model takes no page fault (without
 * it, 16 here: the kernel maps many cached pages per fault, never all of
 * them), and the data reads back as written. A buffer has nothing to map. */
static void test_populate(void) {
    const uint64_t ne0 = 1 << 20;   /* 8 MiB of F32 per shard */
    CHECK(write_small(tmp_path("big-00001-of-00002.gguf"), "p.a", false, 0, ne0) == 0, "write: %s", err);
    CHECK(write_small(tmp_path("big-00002-of-00002.gguf"), "p.b", false, 0, ne0) == 0, "write: %s", err);
    ds4_gguf *g = ds4_gguf_open(tmp_path("big-00001-of-00002.gguf"), err, sizeof err);
    CHECK(g != NULL, "%s", err);
    if (!g) return;
    CHECK(ds4_gguf_populate(g, err, sizeof err), "populate: %s", err);
    const ds4_gguf_tensor *t[2] = {ds4_gguf_find_tensor(g, "p.a"), ds4_gguf_find_tensor(g, "p.b")};
    CHECK(t[0] && t[1] && t[0]->shard != t[1]->shard, "one tensor in each shard");
    bool same = t[0] && t[1];
    const long before = minor_faults();
    for (int i = 0; same && i < 2; i++)
        for (size_t at = 0; same && at < t[i]->n_bytes; at += 4096)
            same = ((const uint8_t *)t[i]->data)[at] == (uint8_t)at;
    const long faults = minor_faults() - before;
    CHECK(same, "the tensors read back as written");
    CHECK(faults == 0, "%ld page faults reading 16 MiB of populated mapping", faults);
    ds4_gguf_close(g);

    size_t len = 0;
    void *img = read_all(tmp_path("big-00002-of-00002.gguf"), &len);
    g = img ? ds4_gguf_open_buffer(img, len, err, sizeof err) : NULL;
    CHECK(g != NULL, "buffer: %s", err);
    CHECK(g && ds4_gguf_populate(g, err, sizeof err), "populate of a buffer: %s", err);
    ds4_gguf_close(g);
    free(img);
}

static void expect_open_fails(const char *path, const char *substr) {
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g == NULL && strstr(err, substr) && one_line_error(), "%s: want '%s', got '%s'", path, substr,
          g ? "success" : err);
    ds4_gguf_close(g);
}

static void test_split(void) {
    check_split_model(FIX "split-00001-of-00003.gguf");
    check_split_model(FIX "split-00002-of-00003.gguf");
    check_split_model(FIX "split-00003-of-00003.gguf");

    /* by file name alone (no split.* keys) */
    CHECK(write_small(tmp_path("p-00001-of-00002.gguf"), "p.a", false, 0, 8) == 0, "write: %s", err);
    CHECK(write_small(tmp_path("p-00002-of-00002.gguf"), "p.b", false, 0, 8) == 0, "write: %s", err);
    ds4_gguf *g = ds4_gguf_open(tmp_path("p-00002-of-00002.gguf"), err, sizeof err);
    CHECK(g && ds4_gguf_n_shards(g) == 2 && ds4_gguf_n_tensors(g) == 2, "pattern split: %s", g ? "" : err);
    if (g) {
        const ds4_gguf_tensor *b = ds4_gguf_find_tensor(g, "p.b");
        CHECK(b && b->shard == 1 && ((const uint8_t *)b->data)[3] == 3, "p.b from shard 2");
    }
    ds4_gguf_close(g);

    CHECK(write_small(tmp_path("d-00001-of-00002.gguf"), "p.a", true, 0, 8) == 0, "write: %s", err);
    CHECK(write_small(tmp_path("d-00002-of-00002.gguf"), "p.a", true, 1, 8) == 0, "write: %s", err);
    expect_open_fails(tmp_path("d-00001-of-00002.gguf"), "duplicate tensor name 'p.a'");

    CHECK(write_small(tmp_path("k-00001-of-00002.gguf"), "p.a", true, 0, 8) == 0, "write: %s", err);
    CHECK(write_small(tmp_path("k-00002-of-00002.gguf"), "p.b", true, 0, 8) == 0, "write: %s", err);
    expect_open_fails(tmp_path("k-00001-of-00002.gguf"), "this is shard 1 of 2");

    copy_file(FIX "split-00001-of-00003.gguf", tmp_path("m-00001-of-00003.gguf"));
    copy_file(FIX "split-00002-of-00003.gguf", tmp_path("m-00002-of-00003.gguf"));
    expect_open_fails(tmp_path("m-00002-of-00003.gguf"), "m-00003-of-00003.gguf: cannot open");
    copy_file(FIX "split-00001-of-00003.gguf", tmp_path("r-00001-of-00002.gguf"));
    expect_open_fails(tmp_path("r-00001-of-00002.gguf"), "file name says shard 1 of 2");
    copy_file(FIX "split-00002-of-00003.gguf", tmp_path("lonely.gguf"));
    expect_open_fails(tmp_path("lonely.gguf"), "does not follow NAME-00001-of-00003.gguf");
    expect_open_fails(tmp_path("absent.gguf"), "cannot open");
    expect_open_fails(tmpdir, "not a regular file");
}

/* ---------------- writer round trip + truncation ---------------- */

typedef struct { int calls; bool fail; } fill_ctx;

static int fill_counted(void *ctx, size_t idx, void *dst, size_t n) {
    fill_ctx *c = ctx;
    c->calls++;
    if (c->fail) return -1;
    return fill_pattern(NULL, idx, dst, n);
}

static void write_everything(ds4_gguf_writer *w, const float *f32_data, const int32_t *i32_data) {
    ds4_gguf_w_str(w, "general.architecture", "roundtrip");
    ds4_gguf_w_u8(w, "s.u8", 200);
    ds4_gguf_w_i8(w, "s.i8", -100);
    ds4_gguf_w_u16(w, "s.u16", 60000);
    ds4_gguf_w_i16(w, "s.i16", -30000);
    ds4_gguf_w_u32(w, "s.u32", 4000000000u);
    ds4_gguf_w_i32(w, "s.i32", -2000000000);
    ds4_gguf_w_u64(w, "s.u64", 0x8000000000000001ull);
    ds4_gguf_w_i64(w, "s.i64", -0x7000000000000000ll);
    ds4_gguf_w_f32(w, "s.f32", -0.1f);
    ds4_gguf_w_f64(w, "s.f64", 0.1);
    ds4_gguf_w_bool(w, "s.bool", true);
    ds4_gguf_w_str(w, "s.str", "text");
    ds4_gguf_w_str(w, "s.empty", "");
    static const uint8_t u8[] = {1, 2, 3};
    static const int8_t i8[] = {-1, 2, -3};
    static const uint16_t u16[] = {1, 65535};
    static const int16_t i16[] = {-2, 32767};
    static const uint32_t u32[] = {7, 4294967295u};
    static const int32_t i32[] = {-7, 2147483647};
    static const uint64_t u64[] = {9};
    static const int64_t i64[] = {-9, INT64_MAX};
    static const float f32[] = {0.5f, -1e10f};
    static const double f64[] = {0.25, -1e-300};
    static const uint8_t bools[] = {0, 1, 1, 0};
    ds4_gguf_w_arr(w, "a.u8", DS4_GGUF_U8, u8, 3);
    ds4_gguf_w_arr(w, "a.i8", DS4_GGUF_I8, i8, 3);
    ds4_gguf_w_arr(w, "a.u16", DS4_GGUF_U16, u16, 2);
    ds4_gguf_w_arr(w, "a.i16", DS4_GGUF_I16, i16, 2);
    ds4_gguf_w_arr(w, "a.u32", DS4_GGUF_U32, u32, 2);
    ds4_gguf_w_arr(w, "a.i32", DS4_GGUF_I32, i32, 2);
    ds4_gguf_w_arr(w, "a.u64", DS4_GGUF_U64, u64, 1);
    ds4_gguf_w_arr(w, "a.i64", DS4_GGUF_I64, i64, 2);
    ds4_gguf_w_arr(w, "a.f32", DS4_GGUF_F32, f32, 2);
    ds4_gguf_w_arr(w, "a.f64", DS4_GGUF_F64, f64, 2);
    ds4_gguf_w_arr(w, "a.bool", DS4_GGUF_BOOL, bools, 4);
    ds4_gguf_w_arr(w, "a.empty", DS4_GGUF_U32, NULL, 0);
    static const char *const strs[] = {"x", "", "yz"};
    ds4_gguf_w_arr_str(w, "a.str", strs, 3);
    ds4_gguf_w_arr_str(w, "a.str_empty", NULL, 0);
    uint64_t ne_f32[2] = {3, 2}, ne_q8[3] = {64, 3, 2}, ne_q4k[2] = {512, 1}, ne_i32[1] = {4}, ne0[1] = {0};
    CHECK(ds4_gguf_w_tensor(w, "w.f32", DS4_TYPE_F32, 2, ne_f32, f32_data) == 0, "tensor index 0");
    CHECK(ds4_gguf_w_tensor(w, "w.q8", DS4_TYPE_Q8_0, 3, ne_q8, NULL) == 1, "tensor index 1");
    ds4_gguf_w_tensor(w, "w.q4k", DS4_TYPE_Q4_K, 2, ne_q4k, NULL);
    ds4_gguf_w_tensor(w, "w.empty", DS4_TYPE_F32, 1, ne0, NULL);
    ds4_gguf_w_tensor(w, "w.i32", DS4_TYPE_I32, 1, ne_i32, i32_data);
}

static void check_everything(const ds4_gguf *g, uint32_t alignment, const float *f32_data,
                             const int32_t *i32_data) {
    CHECK(ds4_gguf_version(g) == 3 && ds4_gguf_alignment(g) == alignment, "version/alignment");
    CHECK(ds4_gguf_n_kv(g) == 28 + (alignment != 32), "n_kv %zu", ds4_gguf_n_kv(g));
    const ds4_gguf_kv *kv;
    kv = ds4_gguf_find_kv(g, "s.u8");  CHECK(kv && kv->type == DS4_GGUF_U8 && kv->v.u == 200, "u8");
    kv = ds4_gguf_find_kv(g, "s.i8");  CHECK(kv && kv->type == DS4_GGUF_I8 && kv->v.i == -100, "i8");
    kv = ds4_gguf_find_kv(g, "s.u16"); CHECK(kv && kv->type == DS4_GGUF_U16 && kv->v.u == 60000, "u16");
    kv = ds4_gguf_find_kv(g, "s.i16"); CHECK(kv && kv->type == DS4_GGUF_I16 && kv->v.i == -30000, "i16");
    kv = ds4_gguf_find_kv(g, "s.u32"); CHECK(kv && kv->type == DS4_GGUF_U32 && kv->v.u == 4000000000u, "u32");
    kv = ds4_gguf_find_kv(g, "s.i32"); CHECK(kv && kv->type == DS4_GGUF_I32 && kv->v.i == -2000000000, "i32");
    kv = ds4_gguf_find_kv(g, "s.u64"); CHECK(kv && kv->type == DS4_GGUF_U64 && kv->v.u == 0x8000000000000001ull, "u64");
    kv = ds4_gguf_find_kv(g, "s.i64"); CHECK(kv && kv->type == DS4_GGUF_I64 && kv->v.i == -0x7000000000000000ll, "i64");
    kv = ds4_gguf_find_kv(g, "s.f32"); CHECK(kv && kv->type == DS4_GGUF_F32 && kv->v.f == (double)-0.1f, "f32");
    kv = ds4_gguf_find_kv(g, "s.f64"); CHECK(kv && kv->type == DS4_GGUF_F64 && kv->v.f == 0.1, "f64");
    kv = ds4_gguf_find_kv(g, "s.bool"); CHECK(kv && kv->type == DS4_GGUF_BOOL && kv->v.b, "bool");
    kv = ds4_gguf_find_kv(g, "s.str"); CHECK(kv && kv->type == DS4_GGUF_STRING && str_eq(kv->str, "text"), "str");
    kv = ds4_gguf_find_kv(g, "s.empty"); CHECK(kv && kv->type == DS4_GGUF_STRING && kv->str.len == 0, "empty str");
    static const struct { const char *key; enum ds4_gguf_vtype t; uint64_t n; int64_t last; } ints[] = {
        {"a.u8", DS4_GGUF_U8, 3, 3}, {"a.i8", DS4_GGUF_I8, 3, -3}, {"a.u16", DS4_GGUF_U16, 2, 65535},
        {"a.i16", DS4_GGUF_I16, 2, 32767}, {"a.u32", DS4_GGUF_U32, 2, 4294967295},
        {"a.i32", DS4_GGUF_I32, 2, 2147483647}, {"a.u64", DS4_GGUF_U64, 1, 9},
        {"a.i64", DS4_GGUF_I64, 2, INT64_MAX}, {"a.f32", DS4_GGUF_F32, 2, -10000000000},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        kv = ds4_gguf_find_kv(g, ints[i].key);
        int64_t v = 0;
        CHECK(kv && kv->type == DS4_GGUF_ARRAY && kv->arr_type == ints[i].t && kv->arr_n == ints[i].n &&
              ds4_gguf_arr_i64(kv, ints[i].n - 1, &v) && v == ints[i].last, "%s last = %lld",
              ints[i].key, (long long)v);
    }
    double d = 0;
    kv = ds4_gguf_find_kv(g, "a.f64");
    CHECK(kv && ds4_gguf_arr_f64(kv, 1, &d) && d == -1e-300, "a.f64");
    kv = ds4_gguf_find_kv(g, "a.bool");
    CHECK(kv && kv->arr_n == 4 && memcmp(kv->arr_data, "\0\1\1\0", 4) == 0, "a.bool");
    kv = ds4_gguf_find_kv(g, "a.empty");
    CHECK(kv && kv->arr_type == DS4_GGUF_U32 && kv->arr_n == 0, "a.empty");
    kv = ds4_gguf_find_kv(g, "a.str");
    CHECK(kv && kv->arr_n == 3 && str_eq(kv->arr_strs[0], "x") && str_eq(kv->arr_strs[1], "") &&
          str_eq(kv->arr_strs[2], "yz"), "a.str");
    kv = ds4_gguf_find_kv(g, "a.str_empty");
    CHECK(kv && kv->arr_type == DS4_GGUF_STRING && kv->arr_n == 0, "a.str_empty");

    CHECK(ds4_gguf_n_tensors(g) == 5, "n_tensors");
    const ds4_gguf_tensor *t = ds4_gguf_find_tensor(g, "w.f32");
    CHECK(t && t->n_bytes == 24 && memcmp(t->data, f32_data, 24) == 0, "w.f32");
    t = ds4_gguf_find_tensor(g, "w.i32");
    CHECK(t && t->n_bytes == 16 && memcmp(t->data, i32_data, 16) == 0, "w.i32");
    t = ds4_gguf_find_tensor(g, "w.empty");
    CHECK(t && t->n_bytes == 0 && t->n_elements == 0, "w.empty");
    static const struct { const char *name; size_t idx; uint64_t bytes; } filled[] = {
        {"w.q8", 1, 2 * 34 * 3 * 2}, {"w.q4k", 2, 2 * 144},
    };
    for (int k = 0; k < 2; k++) {
        t = ds4_gguf_find_tensor(g, filled[k].name);
        bool ok = t && t->n_bytes == filled[k].bytes;
        for (uint64_t i = 0; ok && i < t->n_bytes; i++)
            ok = ((const uint8_t *)t->data)[i] == (uint8_t)(filled[k].idx * 31 + i);
        CHECK(ok, "%s filled bytes", filled[k].name);
    }
    for (size_t i = 0; i < ds4_gguf_n_tensors(g); i++)
        CHECK(ds4_gguf_tensor_at(g, i)->file_offset % alignment == 0, "tensor %zu aligned", i);
}

/* Every prefix shorter than the end of the last tensor's data must fail
 * cleanly; longer prefixes only drop trailing padding and must open. */
static void check_truncations(const uint8_t *img, size_t len, uint64_t data_end) {
    int wrong = 0;
    for (size_t n = 0; n < len; n++) {
        uint8_t *copy = malloc(n ? n : 1);   /* exact size, so ASan sees any overread */
        memcpy(copy, img, n);
        err[0] = 0;
        ds4_gguf *g = ds4_gguf_open_buffer(copy, n, err, sizeof err);
        bool want_ok = n >= data_end;
        if ((g != NULL) != want_ok || (!g && !one_line_error())) {
            if (wrong++ < 5) CHECK(0, "prefix %zu/%zu: %s", n, len, g ? "opened" : err);
        }
        ds4_gguf_close(g);
        free(copy);
    }
    CHECK(wrong == 0, "%d of %zu prefixes misjudged", wrong, len);
}

static void test_roundtrip(uint32_t alignment) {
    float f32_data[6] = {1, 2, 3, -4, 5e-8f, 6};
    int32_t i32_data[4] = {-1, 1, INT32_MIN, INT32_MAX};
    ds4_gguf_writer *w = ds4_gguf_writer_new(alignment == 32 ? 0 : alignment);
    write_everything(w, f32_data, i32_data);
    fill_ctx fc = {0, false};
    char *path = tmp_path("rt.gguf");
    CHECK(ds4_gguf_writer_write_file(w, path, fill_counted, &fc, err, sizeof err) == 0, "write: %s", err);
    CHECK(fc.calls == 2, "fill called %d times (tensors without data, size > 0)", fc.calls);
    CHECK(access(tmp_path("rt.gguf.tmp"), F_OK) != 0, "temporary file renamed away");
    ds4_gguf_writer_free(w);

    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    CHECK(g != NULL, "reopen: %s", err);
    if (g) {
        check_everything(g, alignment, f32_data, i32_data);
        ds4_gguf_close(g);
    }
    size_t len = 0;
    uint8_t *img = read_all(path, &len);
    g = img ? ds4_gguf_open_buffer(img, len, err, sizeof err) : NULL;
    CHECK(g != NULL, "open_buffer: %s", err);
    if (g) {
        check_everything(g, alignment, f32_data, i32_data);
        CHECK(ds4_gguf_n_shards(g) == 1 && ds4_gguf_shard_path(g, 0) == NULL, "buffers have no path");
        uint64_t data_end = 0;
        for (size_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
            const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
            if (t->file_offset + t->n_bytes > data_end) data_end = t->file_offset + t->n_bytes;
        }
        CHECK(len % alignment == 0 && data_end < len, "file padded after the last tensor");
        ds4_gguf_close(g);
        check_truncations(img, len, data_end);
    }
    free(img);
}

static void test_writer_errors(void) {
    char *path = tmp_path("bad.gguf");
    uint64_t ne[2] = {33, 1}, ne_ok[1] = {32};
    struct { const char *want; } cases[] = {
        {"duplicate metadata key 'k'"}, {"duplicate tensor name 't'"}, {"not a multiple of the Q8_0"},
        {"not a power of two"}, {"general.alignment was added"}, {"the fill callback failed"},
        {"no fill callback was given"}, {"unknown ggml type id 4"}, {"string array 'k2' has a NULL element"},
    };
    for (int c = 0; c < 9; c++) {
        ds4_gguf_writer *w = ds4_gguf_writer_new(c == 3 ? 48 : c == 4 ? 64 : 0);
        fill_ctx fc = {0, c == 5};
        ds4_gguf_w_u32(w, "k", 1);
        if (c == 0) ds4_gguf_w_str(w, "k", "again");
        if (c == 1) {
            ds4_gguf_w_tensor(w, "t", DS4_TYPE_F32, 1, ne_ok, NULL);
            ds4_gguf_w_tensor(w, "t", DS4_TYPE_F32, 1, ne_ok, NULL);
        }
        if (c == 2) CHECK(ds4_gguf_w_tensor(w, "t", DS4_TYPE_Q8_0, 2, ne, NULL) == SIZE_MAX, "bad tensor index");
        if (c == 4) ds4_gguf_w_u32(w, "general.alignment", 32);
        if (c == 5 || c == 6) ds4_gguf_w_tensor(w, "t", DS4_TYPE_F32, 1, ne_ok, NULL);
        if (c == 7) ds4_gguf_w_tensor(w, "t", 4, 1, ne_ok, NULL);
        if (c == 8) ds4_gguf_w_arr_str(w, "k2", (const char *const[]){"a", NULL}, 2);
        int r = ds4_gguf_writer_write_file(w, path, c == 6 ? NULL : fill_counted, &fc, err, sizeof err);
        CHECK(r == -1 && strstr(err, cases[c].want) && one_line_error(), "writer case %d: want '%s', got '%s'",
              c, cases[c].want, r ? err : "success");
        CHECK(access(path, F_OK) != 0 && access(tmp_path("bad.gguf.tmp"), F_OK) != 0,
              "case %d left no file behind", c);
        ds4_gguf_writer_free(w);
    }
    ds4_gguf_writer *w = ds4_gguf_writer_new(0);
    CHECK(ds4_gguf_writer_write_file(w, "/nonexistent-dir/x.gguf", NULL, NULL, err, sizeof err) == -1 &&
          strstr(err, "cannot create"), "unwritable path: %s", err);
    ds4_gguf_writer_free(w);
}

/* ---------------- hostile headers ---------------- */

typedef struct { uint8_t b[4096]; size_t n; } image;

static void put_u32(image *m, uint32_t v) { for (int i = 0; i < 4; i++) m->b[m->n++] = (uint8_t)(v >> 8 * i); }
static void put_u64(image *m, uint64_t v) { for (int i = 0; i < 8; i++) m->b[m->n++] = (uint8_t)(v >> 8 * i); }
static void put_bytes(image *m, const void *p, size_t n) { memcpy(m->b + m->n, p, n); m->n += n; }
static void put_str(image *m, const char *s) { put_u64(m, strlen(s)); put_bytes(m, s, strlen(s)); }
static void put_header(image *m, uint32_t version, uint64_t nt, uint64_t nkv) {
    m->n = 0;
    put_bytes(m, "GGUF", 4);
    put_u32(m, version);
    put_u64(m, nt);
    put_u64(m, nkv);
}
static void put_kv_u32(image *m, const char *k, uint32_t v) { put_str(m, k); put_u32(m, DS4_GGUF_U32); put_u32(m, v); }
static void put_tensor_info(image *m, const char *name, uint32_t n_dims, const uint64_t *ne,
                            uint32_t type, uint64_t offset) {
    put_str(m, name);
    put_u32(m, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) put_u64(m, ne[d]);
    put_u32(m, type);
    put_u64(m, offset);
}
static void pad_and_data(image *m, uint32_t alignment, size_t data) {
    while (m->n % alignment) m->b[m->n++] = 0;
    memset(m->b + m->n, 0, data);
    m->n += data;
}

static void expect(const image *m, const char *want, int line) {
    uint8_t *copy = malloc(m->n ? m->n : 1);
    memcpy(copy, m->b, m->n);
    err[0] = 0;
    ds4_gguf *g = ds4_gguf_open_buffer(copy, m->n, err, sizeof err);
    if (want) {
        CHECK(!g && strstr(err, want) && one_line_error(), "line %d: want '%s', got '%s'", line, want,
              g ? "success" : err);
    } else {
        CHECK(g != NULL, "line %d: want success, got '%s'", line, err);
    }
    ds4_gguf_close(g);
    free(copy);
}
#define EXPECT(m, want) expect(m, want, __LINE__)

/* One F32 tensor info record with the given fields, then its data. */
static void tensor_file(image *m, const char *name, uint32_t n_dims, const uint64_t *ne,
                        uint32_t type, uint64_t offset, size_t data) {
    put_header(m, 3, 1, 0);
    put_tensor_info(m, name, n_dims, ne, type, offset);
    pad_and_data(m, 32, data);
}

static void nested_file(image *m, int levels) {
    put_header(m, 3, 0, 1);
    put_str(m, "n");
    put_u32(m, DS4_GGUF_ARRAY);
    for (int l = 1; l < levels; l++) { put_u32(m, DS4_GGUF_ARRAY); put_u64(m, 1); }
    put_u32(m, DS4_GGUF_U8);
    put_u64(m, 1);
    m->b[m->n++] = 9;
}

static void test_hostile(void) {
    static image m;
    m.n = 0;
    EXPECT(&m, "truncated: magic");
    put_header(&m, 3, 0, 0); m.b[3] = 'X';
    EXPECT(&m, "not a GGUF file");
    put_header(&m, 3, 0, 0); EXPECT(&m, NULL);
    put_header(&m, 2, 0, 0); EXPECT(&m, NULL);
    put_header(&m, 1, 0, 0); EXPECT(&m, "unsupported GGUF version 1");
    put_header(&m, 4, 0, 0); EXPECT(&m, "unsupported GGUF version 4");
    put_header(&m, 0x03000000, 0, 0); EXPECT(&m, "byte-swapped");
    put_header(&m, 3, 0, 0); m.n = 20; EXPECT(&m, "truncated: metadata count");
    put_header(&m, 3, 0, UINT64_MAX); EXPECT(&m, "metadata count 18446744073709551615 cannot fit");
    put_header(&m, 3, 1ull << 62, 0); EXPECT(&m, "tensor count 4611686018427387904 cannot fit");

    put_header(&m, 3, 0, 1); put_u64(&m, UINT64_MAX); put_bytes(&m, "0123456789abcdef", 16);
    EXPECT(&m, "truncated: metadata key");
    put_header(&m, 3, 0, 1); put_str(&m, "k"); put_u32(&m, DS4_GGUF_STRING); put_u64(&m, 1ull << 63);
    EXPECT(&m, "truncated: metadata string");
    put_header(&m, 3, 0, 1); put_str(&m, "k"); put_u32(&m, DS4_GGUF_ARRAY); put_u32(&m, DS4_GGUF_U64);
    put_u64(&m, 1ull << 61);   /* count * 8 wraps to 0 without the count check */
    EXPECT(&m, "array element count 2305843009213693952 cannot fit");
    put_header(&m, 3, 0, 1); put_str(&m, "k"); put_u32(&m, DS4_GGUF_ARRAY); put_u32(&m, DS4_GGUF_STRING);
    put_u64(&m, 1ull << 60); EXPECT(&m, "string array element count");
    put_header(&m, 3, 0, 1); put_str(&m, "k"); put_u32(&m, DS4_GGUF_ARRAY); put_u32(&m, DS4_GGUF_STRING);
    put_u64(&m, 2); put_str(&m, "a"); put_u64(&m, 1000); put_bytes(&m, "xx", 2);
    EXPECT(&m, "truncated: array string");
    put_header(&m, 3, 0, 1); put_str(&m, "k"); put_u32(&m, 13); put_u32(&m, 0);
    EXPECT(&m, "metadata 'k' has unknown value type 13");
    put_header(&m, 3, 0, 1); put_str(&m, "k"); put_u32(&m, DS4_GGUF_ARRAY); put_u32(&m, 99); put_u64(&m, 0);
    EXPECT(&m, "unknown array element type 99");
    nested_file(&m, 8); EXPECT(&m, NULL);
    nested_file(&m, 9); EXPECT(&m, "arrays nested deeper than 8");
    put_header(&m, 3, 0, 1); put_str(&m, "k"); put_u32(&m, DS4_GGUF_BOOL); m.b[m.n++] = 2;
    EXPECT(&m, "bool value 2");
    put_header(&m, 3, 0, 1); put_str(&m, "k"); put_u32(&m, DS4_GGUF_ARRAY); put_u32(&m, DS4_GGUF_BOOL);
    put_u64(&m, 2); m.b[m.n++] = 1; m.b[m.n++] = 255;
    EXPECT(&m, "bool value 255");
    put_header(&m, 3, 0, 1); put_kv_u32(&m, "", 1); EXPECT(&m, "empty key");
    put_header(&m, 3, 0, 1); put_u64(&m, 3); put_bytes(&m, "a\0b", 3); put_u32(&m, DS4_GGUF_U8);
    m.b[m.n++] = 0; EXPECT(&m, "contains a NUL byte");
    put_header(&m, 3, 0, 2); put_kv_u32(&m, "a\nb", 1); put_kv_u32(&m, "a\nb", 2);
    EXPECT(&m, "duplicate metadata key 'a?b' (entries 0 and 1)");

    static const uint32_t bad_align[] = {0, 48, 1u << 21};
    for (int i = 0; i < 3; i++) {
        put_header(&m, 3, 0, 1); put_kv_u32(&m, "general.alignment", bad_align[i]);
        EXPECT(&m, "is not a power of two");
    }
    put_header(&m, 3, 0, 1); put_str(&m, "general.alignment"); put_u32(&m, DS4_GGUF_U64); put_u64(&m, 32);
    EXPECT(&m, "expected UINT32");

    uint64_t ne1[1] = {8}, ne_q8[1] = {33}, ne_big[2] = {1ull << 40, 1ull << 40}, ne_neg[1] = {1ull << 63};
    uint64_t ne9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    tensor_file(&m, "t", 1, ne1, DS4_TYPE_F32, 0, 32); EXPECT(&m, NULL);
    tensor_file(&m, "t", 0, ne1, DS4_TYPE_F32, 0, 4); EXPECT(&m, NULL);
    tensor_file(&m, "t", 1, ne1, DS4_TYPE_F32, 0, 31);
    EXPECT(&m, "tensor 't' data [64, +32) exceeds file size 95");
    tensor_file(&m, "t", 1, ne1, DS4_TYPE_F32, 0, 0);
    m.n -= 4;                                                 /* data section past EOF */
    EXPECT(&m, "data section starts at 64");
    tensor_file(&m, "t", 1, ne1, DS4_TYPE_F32, UINT64_MAX - 31, 32); EXPECT(&m, "exceeds file size");
    tensor_file(&m, "t", 1, ne1, DS4_TYPE_F32, 16, 64); EXPECT(&m, "offset 16 is not a multiple of the alignment 32");
    tensor_file(&m, "t", 9, ne9, DS4_TYPE_F32, 0, 32); EXPECT(&m, "has 9 dimensions");
    uint64_t ne_iq[2] = {256, 1ull << 56};   /* 2^64 elements but only 66 * 2^56 bytes */
    tensor_file(&m, "t", 2, ne_iq, DS4_TYPE_IQ2_XXS, 0, 32); EXPECT(&m, "shape overflows");
    tensor_file(&m, "t", 1, ne1, 4, 0, 32); EXPECT(&m, "unknown ggml type id 4");
    tensor_file(&m, "t", 1, ne1, 1000, 0, 32); EXPECT(&m, "unknown ggml type id 1000");
    tensor_file(&m, "t", 1, ne_q8, DS4_TYPE_Q8_0, 0, 64); EXPECT(&m, "ne[0] = 33 is not a multiple of the Q8_0 block size 32");
    tensor_file(&m, "t", 2, ne_big, DS4_TYPE_F32, 0, 32); EXPECT(&m, "shape overflows");
    tensor_file(&m, "t", 1, ne_neg, DS4_TYPE_F32, 0, 32); EXPECT(&m, "negative as int64");
    tensor_file(&m, "", 1, ne1, DS4_TYPE_F32, 0, 32); EXPECT(&m, "tensor with an empty name");
    char long_name[65];
    memset(long_name, 'n', 64);
    long_name[64] = 0;
    tensor_file(&m, long_name, 1, ne1, DS4_TYPE_F32, 0, 32); EXPECT(&m, "is 64 bytes (limit 63)");
    long_name[63] = 0;
    tensor_file(&m, long_name, 1, ne1, DS4_TYPE_F32, 0, 32); EXPECT(&m, NULL);

    put_header(&m, 3, 2, 0);
    put_tensor_info(&m, "blk.3.attn_q_a.weight", 1, ne1, DS4_TYPE_F32, 0);
    put_tensor_info(&m, "blk.3.attn_q_a.weight", 1, ne1, DS4_TYPE_F32, 32);
    pad_and_data(&m, 32, 64);
    EXPECT(&m, "duplicate tensor name 'blk.3.attn_q_a.weight' (tensors 0 and 1)");
    /* tensors may overlap (only bounds are required) and need not be packed */
    put_header(&m, 3, 2, 1);
    put_kv_u32(&m, "general.alignment", 8);
    put_tensor_info(&m, "a", 1, ne1, DS4_TYPE_F32, 8);
    put_tensor_info(&m, "b", 1, ne1, DS4_TYPE_F32, 0);
    pad_and_data(&m, 8, 40);
    EXPECT(&m, NULL);
}

/* ---------------- --copy mode ---------------- */

static int copy_fill(void *ctx, size_t idx, void *dst, size_t n) {
    const ds4_gguf_tensor *t = ds4_gguf_tensor_at(ctx, idx);
    if (!t || t->n_bytes != n) return -1;
    memcpy(dst, t->data, n);
    return 0;
}

static int copy_kv(ds4_gguf_writer *w, const ds4_gguf_kv *kv) {
    char *k = cstr(kv->key);
    int rc = 0;
    switch (kv->type) {
    case DS4_GGUF_U8: ds4_gguf_w_u8(w, k, (uint8_t)kv->v.u); break;
    case DS4_GGUF_I8: ds4_gguf_w_i8(w, k, (int8_t)kv->v.i); break;
    case DS4_GGUF_U16: ds4_gguf_w_u16(w, k, (uint16_t)kv->v.u); break;
    case DS4_GGUF_I16: ds4_gguf_w_i16(w, k, (int16_t)kv->v.i); break;
    case DS4_GGUF_U32: ds4_gguf_w_u32(w, k, (uint32_t)kv->v.u); break;
    case DS4_GGUF_I32: ds4_gguf_w_i32(w, k, (int32_t)kv->v.i); break;
    case DS4_GGUF_U64: ds4_gguf_w_u64(w, k, kv->v.u); break;
    case DS4_GGUF_I64: ds4_gguf_w_i64(w, k, kv->v.i); break;
    case DS4_GGUF_F32: ds4_gguf_w_f32(w, k, (float)kv->v.f); break;
    case DS4_GGUF_F64: ds4_gguf_w_f64(w, k, kv->v.f); break;
    case DS4_GGUF_BOOL: ds4_gguf_w_bool(w, k, kv->v.b); break;
    case DS4_GGUF_STRING: {
        char *v = cstr(kv->str);
        ds4_gguf_w_str(w, k, v);
        free(v);
        break;
    }
    case DS4_GGUF_ARRAY:
        if (kv->arr_type == DS4_GGUF_STRING) {
            char **v = calloc(kv->arr_n + 1, sizeof *v);
            for (uint64_t i = 0; i < kv->arr_n; i++) v[i] = cstr(kv->arr_strs[i]);
            ds4_gguf_w_arr_str(w, k, (const char *const *)v, kv->arr_n);
            for (uint64_t i = 0; i < kv->arr_n; i++) free(v[i]);
            free(v);
        } else if (kv->arr_type == DS4_GGUF_ARRAY) {
            fprintf(stderr, "copy: nested array '%s' cannot be re-written\n", k);
            rc = -1;
        } else {
            ds4_gguf_w_arr(w, k, kv->arr_type, kv->arr_data, kv->arr_n);
        }
        break;
    }
    free(k);
    return rc;
}

static int copy_mode(const char *in, const char *out) {
    ds4_gguf *g = ds4_gguf_open(in, err, sizeof err);
    if (!g) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    ds4_gguf_writer *w = ds4_gguf_writer_new(ds4_gguf_alignment(g));
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < ds4_gguf_n_kv(g); i++) rc = copy_kv(w, ds4_gguf_kv_at(g, i));
    for (size_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        char *name = cstr(t->name);
        ds4_gguf_w_tensor(w, name, t->type, t->n_dims, t->ne, i % 2 ? NULL : t->data);
        free(name);
    }
    if (rc == 0 && ds4_gguf_writer_write_file(w, out, copy_fill, g, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        rc = 1;
    }
    ds4_gguf_writer_free(w);
    ds4_gguf_close(g);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "--copy") == 0) return copy_mode(argv[2], argv[3]);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_fixture_all_types();
    test_fixture_nested();
    test_split();
    test_populate();
    test_roundtrip(32);
    test_roundtrip(128);
    test_writer_errors();
    test_hostile();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return check_done("test_gguf");
}
