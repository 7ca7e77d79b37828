/* cuda_plan.c -- GPU options, upload plan and layer placement (host side of
 * the CUDA backend; no CUDA calls here). */
#include "backends/cuda/cuda_plan.h"
#include "backends/cuda/cuda_backend.h"
#include "models/dsv4/kv.h"
#include "models/dsv4/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ds4_gpu_opts_default(ds4_gpu_opts *o) {
    memset(o, 0, sizeof *o);
    o->backend = DS4_BACKEND_CPU;
    o->vram_auto = true;
}

/* Splits a comma list; calls fn for each item. False on an empty item. */
static bool each_item(const char *s, bool (*fn)(const char *item, size_t len, void *ud), void *ud) {
    if (!*s) return false;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (len == 0 || len > 31 || !fn(s, len, ud)) return false;
        if (!comma) return true;
        s = comma + 1;
    }
}

static bool add_budget(const char *item, size_t len, void *ud) {
    ds4_gpu_opts *o = ud;
    char buf[32];
    memcpy(buf, item, len);
    buf[len] = 0;
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (errno || *end || !(v > 0) || !isfinite(v) || o->n_budgets == DS4_GPU_MAX_DEVICES) return false;
    o->budget_gib[o->n_budgets++] = v;
    return true;
}

bool ds4_gpu_parse_budgets(const char *s, ds4_gpu_opts *o, char *err, size_t errlen) {
    o->n_budgets = 0;
    o->vram_auto = !strcmp(s, "auto");
    if (o->vram_auto) return true;
    if (each_item(s, add_budget, o)) return true;
    snprintf(err, errlen, "--gpu-vram wants auto or GiB budgets N[,N...] (each > 0, at most %d): %s",
             DS4_GPU_MAX_DEVICES, s);
    o->n_budgets = 0;
    return false;
}

static bool add_device(const char *item, size_t len, void *ud) {
    ds4_gpu_opts *o = ud;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (item[i] < '0' || item[i] > '9' || v > 1000) return false;
        v = v * 10 + (item[i] - '0');
    }
    if (o->n_devices == DS4_GPU_MAX_DEVICES) return false;
    for (int i = 0; i < o->n_devices; i++)
        if (o->devices[i] == v) return false;
    o->devices[o->n_devices++] = v;
    return true;
}

bool ds4_gpu_parse_devices(const char *s, ds4_gpu_opts *o, char *err, size_t errlen) {
    o->n_devices = 0;
    if (each_item(s, add_device, o)) return true;
    snprintf(err, errlen, "--gpu-devices wants distinct device ordinals N[,N...] (at most %d): %s",
             DS4_GPU_MAX_DEVICES, s);
    o->n_devices = 0;
    return false;
}

/* ------------------------------------------------------------ upload plan */

static bool add(ds4_upload_plan *p, const void *host, uint64_t bytes, int layer, bool head) {
    if (!host || !bytes) return true;
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        ds4_upload_entry *e = realloc(p->e, (size_t)cap * sizeof *e);
        if (!e) return false;
        p->e = e;
        p->cap = cap;
    }
    p->e[p->n++] = (ds4_upload_entry){host, bytes, layer, head, 0, 0};
    return true;
}

static uint64_t tensor_bytes(const ds4_tensor *t) {
    return (uint64_t)t->row_bytes * (uint64_t)t->ne[1] * (uint64_t)(t->ne[2] > 0 ? t->ne[2] : 1);
}

static bool add_t(ds4_upload_plan *p, const ds4_tensor *t, int layer, bool head) {
    return add(p, t->data, tensor_bytes(t), layer, head);
}

static bool add_f(ds4_upload_plan *p, const float *v, uint64_t n, int layer, bool head) {
    return add(p, v, n * sizeof(float), layer, head);
}

static const ds4_upload_plan *sort_plan;
static int cmp_host(const void *a, const void *b) {
    const char *x = sort_plan->e[*(const int *)a].host, *y = sort_plan->e[*(const int *)b].host;
    return (x > y) - (x < y);
}

static bool add_layer(ds4_upload_plan *p, const ds4_model *m, int l) {
    const ds4_config *c = &m->cfg;
    const ds4_layer *W = &m->layers[l];
    const int mixn = (2 + c->n_hc) * c->n_hc, D = c->head_dim, DI = c->idx_head_dim, r = c->compress_ratio[l];
    const int coff = r ? ds4_cfg_coff(c, l) : 0;
    const ds4_tensor *mats[] = {&W->hc_attn_fn, &W->hc_ffn_fn, &W->q_a, &W->q_b, &W->kv, &W->out_a, &W->out_b,
                                &W->comp_kv, &W->comp_gate, &W->idx_q_b, &W->idx_proj, &W->idx_kv, &W->idx_gate,
                                &W->gate_inp, &W->gate_exps, &W->up_exps, &W->down_exps,
                                &W->gate_shexp, &W->up_shexp, &W->down_shexp};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        if (!add_t(p, mats[i], l, false)) return false;
    struct { const float *v; uint64_t n; } vecs[] = {
        {W->hc_attn_scale, 3}, {W->hc_attn_base, (uint64_t)mixn}, {W->hc_ffn_scale, 3}, {W->hc_ffn_base, (uint64_t)mixn},
        {W->attn_norm, (uint64_t)c->n_embd}, {W->q_a_norm, (uint64_t)c->q_lora}, {W->kv_norm, (uint64_t)D},
        {W->sinks, (uint64_t)c->n_head}, {W->ffn_norm, (uint64_t)c->n_embd},
        {W->comp_ape, (uint64_t)r * coff * D}, {W->comp_norm, (uint64_t)D},
        {W->idx_ape, (uint64_t)r * 2 * DI}, {W->idx_norm, (uint64_t)DI},
        {W->exp_probs_b, (uint64_t)c->n_expert},
    };
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
        if (!add_f(p, vecs[i].v, vecs[i].n, l, false)) return false;
    return add(p, W->tid2eid, (uint64_t)c->n_vocab * c->n_expert_used * sizeof(int32_t), l, false);
}

ds4_upload_plan *ds4_upload_plan_new(const ds4_model *m, char *err, size_t errlen) {
    ds4_upload_plan *p = calloc(1, sizeof *p);
    if (!p) goto oom;
    const ds4_config *c = &m->cfg;
    p->n_layer = c->n_layer;
    bool ok = add_t(p, &m->token_embd, -1, false);
    for (int l = 0; ok && l < c->n_layer; l++) ok = add_layer(p, m, l);
    ok = ok && add_t(p, &m->output_hc_fn, -1, true) && add_f(p, m->output_hc_scale, 1, -1, true) &&
         add_f(p, m->output_hc_base, (uint64_t)c->n_hc, -1, true) &&
         add_f(p, m->output_norm, (uint64_t)c->n_embd, -1, true) && add_t(p, &m->output, -1, true);
    if (!ok || !(p->by_host = malloc((size_t)(p->n ? p->n : 1) * sizeof(int)))) goto oom;
    for (int i = 0; i < p->n; i++) p->by_host[i] = i;
    sort_plan = p;   /* qsort has no context argument; planning runs once, at load */
    qsort(p->by_host, (size_t)p->n, sizeof(int), cmp_host);
    return p;
oom:
    snprintf(err, errlen, "out of memory building the GPU upload plan");
    ds4_upload_plan_free(p);
    return NULL;
}

void ds4_upload_plan_free(ds4_upload_plan *p) {
    if (!p) return;
    free(p->e);
    free(p->by_host);
    free(p);
}

int ds4_upload_find(const ds4_upload_plan *p, const void *host) {
    int lo = 0, hi = p->n - 1;
    const char *h = host;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const char *x = p->e[p->by_host[mid]].host;
        if (x == h) return p->by_host[mid];
        if (x < h) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* -------------------------------------------------------------- placement */

static uint64_t align_up(uint64_t v) { return (v + DS4_GPU_ALIGN - 1) / DS4_GPU_ALIGN * DS4_GPU_ALIGN; }

/* Aligned arena bytes of the entries selected by (layer, head). */
static uint64_t group_bytes(const ds4_upload_plan *p, int layer, bool head) {
    uint64_t n = 0;
    for (int i = 0; i < p->n; i++)
        if (p->e[i].layer == layer && (layer >= 0 || p->e[i].head == head)) n += align_up(p->e[i].bytes);
    return n;
}

static void assign(ds4_upload_plan *p, int layer, bool head, int dev, uint64_t *arena) {
    for (int i = 0; i < p->n; i++)
        if (p->e[i].layer == layer && (layer >= 0 || p->e[i].head == head)) {
            p->e[i].device = dev;
            p->e[i].offset = arena[dev];
            arena[dev] += align_up(p->e[i].bytes);
        }
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

bool ds4_gpu_place(ds4_upload_plan *p, const uint64_t *layer_kv_bytes, uint64_t scratch_bytes,
                   const uint64_t *budgets, int n_budgets, ds4_gpu_placement *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const int L = p->n_layer, maxl = DS4_MAX_LAYERS;
    if (n_budgets < 1 || n_budgets > DS4_GPU_MAX_DEVICES || L > maxl) {
        snprintf(err, errlen, "GPU placement needs 1..%d devices and at most %d layers", DS4_GPU_MAX_DEVICES, maxl);
        return false;
    }
    uint64_t used[DS4_GPU_MAX_DEVICES] = {0}, arena[DS4_GPU_MAX_DEVICES] = {0};
    for (int d = 0; d < n_budgets; d++) { out->budget_bytes[d] = budgets[d]; out->scratch_bytes[d] = 0; }
    const uint64_t embd = group_bytes(p, -1, false), head = group_bytes(p, -1, true);
    int dev = 0;
    used[0] = embd + scratch_bytes;
    out->scratch_bytes[0] = scratch_bytes;
    if (used[0] > budgets[0]) {
        snprintf(err, errlen, "the embedding and scratch need %.2f GiB, device budget 1 is %.2f GiB", gib(used[0]),
                 gib(budgets[0]));
        return false;
    }
    assign(p, -1, false, 0, arena);
    for (int l = 0; l < L; l++) {
        const uint64_t need = group_bytes(p, l, false) + layer_kv_bytes[l];
        while (used[dev] + need > budgets[dev]) {
            if (dev + 1 == n_budgets) {
                snprintf(err, errlen, "layer %d does not fit: it needs %.2f GiB, %.2f GiB left on the last device "
                         "(layers would spill; raise --gpu-vram or add devices)", l, gib(need),
                         gib(budgets[dev] - used[dev]));
                return false;
            }
            dev++;
            used[dev] = scratch_bytes;   /* every device runs its layers with its own scratch */
            out->scratch_bytes[dev] = scratch_bytes;
        }
        used[dev] += need;
        out->kv_bytes[dev] += layer_kv_bytes[l];
        out->layer_device[l] = dev;
        assign(p, l, false, dev, arena);
    }
    if (used[dev] + head > budgets[dev]) {
        snprintf(err, errlen, "the output head (%.2f GiB) does not fit beside the last layer (%.2f GiB left)",
                 gib(head), gib(budgets[dev] - used[dev]));
        return false;
    }
    assign(p, -1, true, dev, arena);
    out->n_devices = dev + 1;
    for (int d = 0; d < out->n_devices; d++) out->weight_bytes[d] = arena[d];
    return true;
}

void ds4_gpu_layer_kv_bytes(const ds4_model *m, int ctx, int slack, uint64_t *out) {
    for (int l = 0; l < m->cfg.n_layer; l++) {
        ds4_config one = m->cfg;   /* kv.h accounts whole configs: view layer l as a one-layer model */
        one.n_layer = 1;
        one.compress_ratio = m->cfg.compress_ratio + l;
        one.attn_kind = m->cfg.attn_kind + l;
        out[l] = ds4_kv_bytes_for(&one, ctx, slack);
    }
}
