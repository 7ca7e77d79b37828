/* test_cuda_plan.c -- the CUDA backend's host side, on the CPU: option
 * value parsing (budgets, device lists; the options themselves: test_cli_args), the upload plan
 * against the GGUF's own tensor inventory (every tensor of the converted
 * tiny model goes up exactly once, in its stored bytes), and placement
 * invariants (contiguous layers in device order, aligned non-overlapping
 * arenas within budget, the first spilling layer named) with the spill point
 * computed independently from the plan's per-layer sums. */
#include "check.h"
#include "backends/cuda/cuda_plan.h"
#include "format/gguf.h"
#include "models/dsv4/kv.h"
#include "models/dsv4/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_options(void) {
    char err[256];
    ds4_gpu_opts o;
    ds4_gpu_opts_default(&o);
    CHECK(o.backend == DS4_BACKEND_CPU && o.vram_auto, "default is CPU, auto budgets");
    CHECK(ds4_gpu_parse_budgets("24,40.5", &o, err, sizeof err) && o.n_budgets == 2 && !o.vram_auto &&
          o.budget_gib[0] == 24 && o.budget_gib[1] == 40.5, "two budgets");
    CHECK(ds4_gpu_parse_budgets("auto", &o, err, sizeof err) && o.vram_auto && o.n_budgets == 0, "auto");
    const char *bad_budgets[] = {"", "0", "-1", "1,,2", "abc", "1,", "nan", "inf", "1e999",
                                 "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1"};
    for (size_t i = 0; i < sizeof bad_budgets / sizeof bad_budgets[0]; i++) {
        err[0] = 0;
        CHECK(!ds4_gpu_parse_budgets(bad_budgets[i], &o, err, sizeof err) && strstr(err, "--gpu-vram"),
              "budget '%s' refused with a message", bad_budgets[i]);
    }
    CHECK(ds4_gpu_parse_devices("0,2,4,6,1", &o, err, sizeof err) && o.n_devices == 5 && o.devices[1] == 2 &&
          o.devices[4] == 1, "device order kept");
    const char *bad_devices[] = {"", "0,0", "a", "-1", "1,", ",1", "99999"};
    for (size_t i = 0; i < sizeof bad_devices / sizeof bad_devices[0]; i++)
        CHECK(!ds4_gpu_parse_devices(bad_devices[i], &o, err, sizeof err), "devices '%s' refused", bad_devices[i]);
}

static const char *model_path(const char *name) {
    static char p[512];
    const char *b = getenv("BUILD");
    snprintf(p, sizeof p, "%s/ds4tiny/%s", b ? b : "build", name);
    return p;
}

static uint64_t align256(uint64_t v) { return (v + 255) / 256 * 256; }

/* The plan against the file: same count, same bytes, each file tensor's
 * data (matrices) or an f32 copy of it (small vectors) appears once. */
static void test_upload_plan(const ds4_gguf *g, const ds4_model *m, ds4_upload_plan *p) {
    const size_t nt = ds4_gguf_n_tensors(g);
    uint64_t file_bytes = 0, plan_bytes = 0;
    for (size_t i = 0; i < nt; i++) file_bytes += ds4_gguf_tensor_at(g, i)->n_bytes;
    for (int i = 0; i < p->n; i++) plan_bytes += p->e[i].bytes;
    CHECK(p->n == (int)nt, "plan has %d entries, the file %zu tensors", p->n, nt);
    CHECK(plan_bytes == file_bytes, "plan %llu bytes, file %llu", (unsigned long long)plan_bytes,
          (unsigned long long)file_bytes);
    for (int i = 0; i < p->n; i++) {
        CHECK(ds4_upload_find(p, p->e[i].host) == i, "entry %d found by its host address", i);
        /* an entry read from the mapping (matrices, the hash table) is one whole file tensor */
        for (size_t t = 0; t < nt; t++)
            if (ds4_gguf_tensor_at(g, t)->data == p->e[i].host)
                CHECK(ds4_gguf_tensor_at(g, t)->n_bytes == p->e[i].bytes, "entry %d is all of its tensor", i);
    }
    CHECK(ds4_upload_find(p, (const char *)m->output.data + 1) == -1, "an interior address is no entry");
    CHECK(ds4_upload_find(p, m) == -1, "an unrelated address is no entry");
}

static void check_placement(const ds4_upload_plan *p, const ds4_gpu_placement *pl, const uint64_t *budgets) {
    for (int l = 1; l < p->n_layer; l++)
        CHECK(pl->layer_device[l] == pl->layer_device[l - 1] || pl->layer_device[l] == pl->layer_device[l - 1] + 1,
              "layer %d continues its predecessor's device or the next", l);
    for (int d = 0; d < pl->n_devices; d++) {
        uint64_t end = 0;
        for (int i = 0; i < p->n; i++) {
            if (p->e[i].device != d) continue;
            CHECK(p->e[i].offset % DS4_GPU_ALIGN == 0, "aligned offset");
            if (p->e[i].offset + p->e[i].bytes > end) end = p->e[i].offset + p->e[i].bytes;
            for (int j = i + 1; j < p->n; j++)
                if (p->e[j].device == d)
                    CHECK(p->e[j].offset >= p->e[i].offset + p->e[i].bytes ||
                          p->e[i].offset >= p->e[j].offset + p->e[j].bytes, "entries %d and %d do not overlap", i, j);
        }
        CHECK(end <= pl->weight_bytes[d], "arena covers its entries");
        CHECK(pl->weight_bytes[d] + pl->kv_bytes[d] + pl->scratch_bytes[d] <= budgets[d], "device %d within budget", d);
    }
    for (int i = 0; i < p->n; i++)
        if (p->e[i].layer >= 0) CHECK(p->e[i].device == pl->layer_device[p->e[i].layer], "tensor on its layer's device");
}

static void test_placement(const ds4_model *m, ds4_upload_plan *p) {
    char err[256];
    const int L = m->cfg.n_layer, ctx = 4096;
    uint64_t kv[DS4_MAX_LAYERS], kv_sum = 0, layer[DS4_MAX_LAYERS], embd = 0, head = 0, total = 0;
    ds4_gpu_layer_kv_bytes(m, ctx, 256, kv);
    for (int l = 0; l < L; l++) kv_sum += kv[l];
    CHECK(kv_sum == ds4_kv_bytes_for(&m->cfg, ctx, 256), "per-layer KV sums to the session size");
    for (int l = 0; l < L; l++) layer[l] = kv[l];
    for (int i = 0; i < p->n; i++) {
        uint64_t b = align256(p->e[i].bytes);
        if (p->e[i].layer >= 0) layer[p->e[i].layer] += b;
        else if (p->e[i].head) head += b;
        else embd += b;
    }
    for (int l = 0; l < L; l++) total += layer[l];
    const uint64_t scratch = 1 << 20;
    ds4_gpu_placement pl;

    uint64_t one[1] = {embd + head + total + scratch};
    CHECK(ds4_gpu_place(p, kv, scratch, one, 1, &pl, err, sizeof err), "exact fit on one device: %s", err);
    CHECK(pl.n_devices == 1, "one device used");
    check_placement(p, &pl, one);

    /* two devices: the first holds the embedding and the first half of the layers */
    uint64_t first = embd + scratch;
    int split = 0;
    while (split < L / 2) first += layer[split++];
    uint64_t rest = scratch + head;
    for (int l = split; l < L; l++) rest += layer[l];
    uint64_t two[2] = {first, rest};
    CHECK(ds4_gpu_place(p, kv, scratch, two, 2, &pl, err, sizeof err), "two-device fit: %s", err);
    CHECK(pl.n_devices == 2 && pl.layer_device[split - 1] == 0 && pl.layer_device[split] == 1, "split after layer %d",
          split - 1);
    check_placement(p, &pl, two);

    /* one byte short on the second device: the last layer spills... */
    uint64_t short2[2] = {first, rest - head - 1};
    CHECK(!ds4_gpu_place(p, kv, scratch, short2, 2, &pl, err, sizeof err), "spill refused");
    char want[64];
    snprintf(want, sizeof want, "layer %d does not fit", L - 1);
    CHECK(strstr(err, want) && strstr(err, "spill"), "names the first spilling layer: %s", err);
    /* ...or only the head does */
    uint64_t nohead[2] = {first, rest - 1};
    CHECK(!ds4_gpu_place(p, kv, scratch, nohead, 2, &pl, err, sizeof err) && strstr(err, "output head"),
          "head spill refused: %s", err);
    uint64_t tiny[1] = {embd};
    CHECK(!ds4_gpu_place(p, kv, scratch, tiny, 1, &pl, err, sizeof err) && strstr(err, "embedding"),
          "embedding spill refused: %s", err);
    CHECK(!ds4_gpu_place(p, kv, scratch, one, 0, &pl, err, sizeof err), "no devices refused");
}

int main(void) {
    test_options();
    const char *names[] = {"A-f32.gguf", "A-q8_0.gguf", "B-f16.gguf"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char err[256];
        ds4_gguf *g = ds4_gguf_open(model_path(names[k]), err, sizeof err);
        CHECK(g != NULL, "%s: %s", names[k], err);
        if (!g) continue;
        ds4_model *m = ds4_model_bind(g, err, sizeof err);
        CHECK(m != NULL, "%s: %s", names[k], err);
        ds4_upload_plan *p = m ? ds4_upload_plan_new(m, err, sizeof err) : NULL;
        if (p) {
            /* f32 vectors are converted copies in the q8_0/f16 files: bytes differ there */
            if (strstr(names[k], "f32")) test_upload_plan(g, m, p);
            test_placement(m, p);
        }
        ds4_upload_plan_free(p);
        ds4_model_free(m);
        ds4_gguf_close(g);
    }
    return check_done("test_cuda_plan");
}
