/* ds4-gguf-dump -- print a GGUF file's header, metadata and tensor table.
 *
 *   ds4-gguf-dump [--kv] [--tensors] FILE.gguf
 *
 * With neither flag both sections are printed. Any shard of a split model
 * opens the whole model. Long strings and arrays are abbreviated; the exit
 * status is 1 when the file does not validate (the reason is printed). */
#include "options/cli_args.h"
#include "format/gguf.h"
#include "kernels/quant.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define MAX_STR_SHOWN 80
#define MAX_ELEMS_SHOWN 8

static const char *vtype_name(uint32_t t) {
    static const char *const names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                        "bool", "str", "arr", "u64", "i64", "f64"};
    return t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* Quoted, with control bytes escaped so every entry stays on one line. */
static void print_str(ds4_gguf_str s) {
    putchar('"');
    for (uint64_t i = 0; i < s.len && i < MAX_STR_SHOWN; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
    if (s.len > MAX_STR_SHOWN) printf("...(%" PRIu64 " bytes)", s.len);
}

static void print_scalar(uint32_t t, union ds4_gguf_value v) {
    if (t == DS4_GGUF_F32 || t == DS4_GGUF_F64) printf("%.9g", v.f);
    else if (t == DS4_GGUF_BOOL) printf("%s", v.b ? "true" : "false");
    else if (t == DS4_GGUF_I8 || t == DS4_GGUF_I16 || t == DS4_GGUF_I32 || t == DS4_GGUF_I64)
        printf("%" PRId64, v.i);
    else printf("%" PRIu64, v.u);
}

static void print_array(const ds4_gguf_kv *kv) {
    printf("[");
    for (uint64_t i = 0; i < kv->arr_n && i < MAX_ELEMS_SHOWN; i++) {
        if (i) printf(", ");
        int64_t iv;
        uint64_t uv;
        double dv;
        if (kv->arr_type == DS4_GGUF_STRING) print_str(kv->arr_strs[i]);
        else if (kv->arr_type == DS4_GGUF_BOOL) printf("%s", kv->arr_data[i] ? "true" : "false");
        else if (kv->arr_type == DS4_GGUF_F32 || kv->arr_type == DS4_GGUF_F64)
            printf("%.9g", ds4_gguf_arr_f64(kv, i, &dv) ? dv : 0.0);
        else if (ds4_gguf_arr_i64(kv, i, &iv)) printf("%" PRId64, iv);
        else if (ds4_gguf_arr_u64(kv, i, &uv)) printf("%" PRIu64, uv);   /* above INT64_MAX */
        else printf("[...]");                                             /* nested array */
    }
    printf(kv->arr_n > MAX_ELEMS_SHOWN ? ", ...]" : "]");
}

static void dump_kv(const ds4_gguf *g) {
    for (size_t i = 0; i < ds4_gguf_n_kv(g); i++) {
        const ds4_gguf_kv *kv = ds4_gguf_kv_at(g, i);
        printf("  %.*s  ", (int)kv->key.len, kv->key.ptr);
        if (kv->type == DS4_GGUF_ARRAY) {
            printf("arr[%s,%" PRIu64 "]  ", vtype_name(kv->arr_type), kv->arr_n);
            print_array(kv);
        } else {
            printf("%s  ", vtype_name(kv->type));
            if (kv->type == DS4_GGUF_STRING) print_str(kv->str);
            else print_scalar(kv->type, kv->v);
        }
        putchar('\n');
    }
}

static void dump_tensors(const ds4_gguf *g) {
    for (size_t i = 0; i < ds4_gguf_n_tensors(g); i++) {
        const ds4_gguf_tensor *t = ds4_gguf_tensor_at(g, i);
        printf("  %.*s  %s  [", (int)t->name.len, t->name.ptr, ds4_type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++) printf(d ? ", %" PRIu64 : "%" PRIu64, t->ne[d]);
        printf("]  %" PRIu64 " bytes  shard %d @ %" PRIu64 "\n", t->n_bytes, t->shard, t->file_offset);
    }
}

int main(int argc, char **argv) {
    bool kv = false, tensors = false;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--kv") == 0) kv = true;
        else if (strcmp(argv[i], "--tensors") == 0) tensors = true;
        else if (argv[i][0] != '-' && !path) path = argv[i];
        else if (argv[i][0] == '-' && strcmp(argv[i], "-h") && strcmp(argv[i], "--help")) {
            ds4_cli_unknown_option("ds4-gguf-dump", argv[i]);
            return 2;
        } else {
            fprintf(stderr, "usage: %s [--kv] [--tensors] FILE.gguf\n", argv[0]);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: %s [--kv] [--tensors] FILE.gguf\n", argv[0]);
        return 2;
    }
    if (!kv && !tensors) kv = tensors = true;
    char err[512];
    ds4_gguf *g = ds4_gguf_open(path, err, sizeof err);
    if (!g) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("%s: GGUF v%" PRIu32 ", alignment %" PRIu32 ", %zu kv, %zu tensors, %d shard(s), %" PRIu64
           " bytes\n", path, ds4_gguf_version(g), ds4_gguf_alignment(g), ds4_gguf_n_kv(g),
           ds4_gguf_n_tensors(g), ds4_gguf_n_shards(g), ds4_gguf_file_bytes(g));
    if (kv) {
        printf("metadata:\n");
        dump_kv(g);
    }
    if (tensors) {
        printf("tensors:\n");
        dump_tensors(g);
    }
    ds4_gguf_close(g);
    return 0;
}
