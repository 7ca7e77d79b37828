/* safetensors reader: values of every dtype from hand-built files, the FP8 /
 * UE8M0 / FP4 decoders against values worked out from the format definitions,
 * every header validation rule, and sharded directories through an index. */
#include "check.h"
#include "format/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* header JSON + data -> a complete file image in buf; returns its length */
static size_t build(uint8_t *buf, const char *json, const void *data, size_t n_data) {
    size_t h = strlen(json);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, json, h);
    memcpy(buf + 8 + h, data, n_data);
    return 8 + h + n_data;
}

static int rejects(const char *json, const void *data, size_t n, const char *want) {
    static uint8_t buf[8192];
    char err[256] = "";
    size_t len = build(buf, json, data, n);
    ds4_st *st = ds4_st_open_buffer(buf, len, err, sizeof err);
    if (st) { ds4_st_close(st); return 0; }
    if (!strstr(err, want)) { fprintf(stderr, "error '%s' lacks '%s'\n", err, want); return 0; }
    return 1;
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) { fwrite(p, 1, n, f); fclose(f); }
}

int main(void) {
    /* decoders: values computed by hand from the format definitions */
    CHECK(ds4_fp8_e4m3_to_f32(0x38) == 1.0f, "e4m3 1.0");
    CHECK(ds4_fp8_e4m3_to_f32(0x7e) == 448.0f, "e4m3 max 448");
    CHECK(ds4_fp8_e4m3_to_f32(0xfe) == -448.0f, "e4m3 -448");
    CHECK(ds4_fp8_e4m3_to_f32(0x01) == 0x1p-9f, "e4m3 smallest subnormal");
    CHECK(ds4_fp8_e4m3_to_f32(0x08) == 0x1p-6f, "e4m3 smallest normal");
    CHECK(ds4_fp8_e4m3_to_f32(0x3b) == 1.375f, "e4m3 1.375");
    CHECK(isnan(ds4_fp8_e4m3_to_f32(0x7f)) && isnan(ds4_fp8_e4m3_to_f32(0xff)), "e4m3 NaN");
    CHECK(signbit(ds4_fp8_e4m3_to_f32(0x80)) && ds4_fp8_e4m3_to_f32(0x80) == 0.0f, "e4m3 -0");
    CHECK(ds4_e8m0_to_f32(127) == 1.0f && ds4_e8m0_to_f32(130) == 8.0f && ds4_e8m0_to_f32(0) == 0x1p-127f,
          "e8m0");
    CHECK(isnan(ds4_e8m0_to_f32(255)), "e8m0 NaN");
    static const float fp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int i = 0; i < 16; i++) CHECK(ds4_fp4_e2m1_to_f32((uint8_t)i) == fp4[i], "fp4 code %d", i);
    CHECK(ds4_fp4_e2m1_to_f32(0xf7) == 6.0f, "fp4 ignores the high nibble");

    /* one file with every dtype, data offsets deliberately unaligned */
    uint8_t data[64] = {0};
    const float f32[2] = {1.5f, -2.25f};
    memcpy(data + 1, f32, 8);                                 /* F32 [2] at 1..9 */
    const uint16_t bf16[2] = {0x3f80, 0xc040};                /* 1.0, -3.0 */
    memcpy(data + 9, bf16, 4);                                /* BF16 at 9..13 */
    const uint16_t f16[1] = {0x3c00};                         /* 1.0 */
    memcpy(data + 13, f16, 2);                                /* F16 at 13..15 */
    data[15] = 0x38; data[16] = 0xb8;                         /* F8_E4M3: 1, -1 */
    data[17] = 128;                                           /* F8_E8M0: 2 */
    const int64_t i64[2] = {-3, 5000000000LL};
    memcpy(data + 18, i64, 16);                               /* I64 at 18..34 */
    data[34] = 0xfe;                                          /* I8: -2 */
    data[35] = 0xfe;                                          /* U8: 254 */
    data[36] = 0x9f; data[37] = 0x42;                         /* F4 [1,4]: -6, -0.5, 1, 2 */
    const char *json =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"z.f32\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]},"
        "\"b.bf16\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[9,13]},"
        "\"c.f16\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[13,15]},"
        "\"d.fp8\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[15,17]},"
        "\"e.e8m0\":{\"dtype\":\"F8_E8M0\",\"shape\":[1,1],\"data_offsets\":[17,18]},"
        "\"f.i64\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[18,34]},"
        "\"g.i8\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[34,35]},"
        "\"h.u8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[35,36]},"
        "\"i.empty\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[36,36]},"
        "\"j.f4\":{\"dtype\":\"F4\",\"shape\":[1,4],\"data_offsets\":[36,38]}}";
    static uint8_t buf[8192];
    size_t len = build(buf, json, data, 38);
    char err[256];
    ds4_st *st = ds4_st_open_buffer(buf, len, err, sizeof err);
    CHECK(st != NULL, "valid file rejected: %s", err);
    if (st) {
        CHECK(ds4_st_n_tensors(st) == 10, "%zu tensors", ds4_st_n_tensors(st));
        CHECK(!strcmp(ds4_st_tensor_at(st, 0)->name, "b.bf16") && !strcmp(ds4_st_tensor_at(st, 9)->name, "z.f32"),
              "sorted by name");
        float v[4];
        const ds4_st_tensor *t = ds4_st_find(st, "z.f32");
        CHECK(t && t->n_dims == 1 && t->shape[0] == 2 && ds4_st_read_f32(t, 0, 2, v) == 0 && v[0] == 1.5f &&
              v[1] == -2.25f, "F32");
        t = ds4_st_find(st, "b.bf16");
        CHECK(t && t->n_dims == 2 && ds4_st_read_f32(t, 0, 2, v) == 0 && v[0] == 1.0f && v[1] == -3.0f, "BF16");
        t = ds4_st_find(st, "c.f16");
        CHECK(t && t->n_dims == 0 && t->n_elements == 1 && ds4_st_read_f32(t, 0, 1, v) == 0 && v[0] == 1.0f, "F16");
        t = ds4_st_find(st, "d.fp8");
        CHECK(t && ds4_st_read_f32(t, 0, 2, v) == 0 && v[0] == 1.0f && v[1] == -1.0f, "F8_E4M3");
        t = ds4_st_find(st, "e.e8m0");
        CHECK(t && ds4_st_read_f32(t, 0, 1, v) == 0 && v[0] == 2.0f, "F8_E8M0");
        t = ds4_st_find(st, "f.i64");
        CHECK(t && ds4_st_read_f32(t, 1, 1, v) == 0 && v[0] == 5e9f, "I64");
        CHECK(t && ds4_st_read_f32(t, 1, 2, v) == -1, "range past the end refused");
        t = ds4_st_find(st, "g.i8");
        CHECK(t && ds4_st_read_f32(t, 0, 1, v) == 0 && v[0] == -2.0f, "I8");
        t = ds4_st_find(st, "h.u8");
        CHECK(t && ds4_st_read_f32(t, 0, 1, v) == 0 && v[0] == 254.0f, "U8");
        t = ds4_st_find(st, "i.empty");
        CHECK(t && t->n_elements == 0 && t->n_bytes == 0, "empty tensor");
        t = ds4_st_find(st, "j.f4");
        CHECK(t && t->n_elements == 4 && t->n_bytes == 2 && ds4_st_read_f32(t, 1, 3, v) == 0 && v[0] == -0.5f &&
              v[1] == 1.0f && v[2] == 2.0f && ds4_st_read_f32(t, 0, 1, v) == 0 && v[0] == -6.0f, "F4");
        CHECK(ds4_st_find(st, "nope") == NULL, "missing name");
        ds4_st_close(st);
    }

    /* validation: each broken header gets its own one-line reason */
    const uint8_t z[16] = {0};
    CHECK(rejects("", z, 0, "not a JSON object"), "empty header");
    CHECK(rejects("[1,2]", z, 0, "not a JSON object"), "array header");
    CHECK(rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", z, 8, "outside"), "past end");
    CHECK(rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", z, 8, "do not match"),
          "size mismatch");
    CHECK(rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", z, 8, "outside"),
          "reversed offsets");
    CHECK(rejects("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", z, 8, "unsupported dtype"),
          "unknown dtype");
    CHECK(rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", z, 8, "invalid shape"),
          "negative dim");
    CHECK(rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", z, 8, "invalid shape"),
          "fractional dim");
    CHECK(rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", z, 8,
                  "overflows"), "element count overflow");
    CHECK(rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", z, 8, "lacks"), "missing offsets");
    CHECK(rejects("{\"a\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[0,3]}}", z, 8, "odd last"),
          "F4 odd row");
    CHECK(rejects("{\"a\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,4]}}", z, 8, "do not match"),
          "F4 size");
    CHECK(rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                  "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", z, 8, "appears twice"),
          "duplicate name");
    uint8_t tiny[4] = {1, 2, 3, 4};
    CHECK(ds4_st_open_buffer(tiny, sizeof tiny, err, sizeof err) == NULL && strstr(err, "too short"), "short");
    uint8_t big[16] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    CHECK(ds4_st_open_buffer(big, sizeof big, err, sizeof err) == NULL && strstr(err, "exceeds"), "huge header");

    /* a sharded directory read through its index, and a lying index */
    char dir[] = "/tmp/ds4_st_testXXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char p[256];
    const float one = 1.0f, two = 2.0f;
    len = build(buf, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", &one, 4);
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    write_file(p, buf, len);
    len = build(buf, "{\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", &two, 4);
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    write_file(p, buf, len);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    const char *idx = "{\"metadata\":{},\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s2.safetensors\"}}";
    write_file(p, idx, strlen(idx));
    st = ds4_st_open(dir, err, sizeof err);
    CHECK(st != NULL, "sharded open: %s", err);
    if (st) {
        float v;
        const ds4_st_tensor *t = ds4_st_find(st, "y");
        CHECK(ds4_st_n_shards(st) == 2 && t && t->shard == 1 && ds4_st_read_f32(t, 0, 1, &v) == 0 && v == 2.0f,
              "shard 2 value");
        ds4_st_close(st);
    }
    const char *lie = "{\"weight_map\":{\"x\":\"s2.safetensors\",\"y\":\"s2.safetensors\"}}";
    write_file(p, lie, strlen(lie));
    CHECK(ds4_st_open(dir, err, sizeof err) == NULL && strstr(err, "is not in shard"), "lying index: %s", err);
    const char *escape = "{\"weight_map\":{\"x\":\"../s1.safetensors\"}}";
    write_file(p, escape, strlen(escape));
    CHECK(ds4_st_open(dir, err, sizeof err) == NULL && strstr(err, "invalid shard name"), "path escape: %s", err);
    unlink(p);
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    unlink(p);
    rmdir(dir);
    CHECK(ds4_st_open("/nonexistent/dir", err, sizeof err) == NULL && strstr(err, "/nonexistent"), "missing path");
    return check_done("safetensors");
}
