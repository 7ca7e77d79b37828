/* cuda_plan.h -- the host side of the CUDA backend, in plain C so it is built
 * into every library and unit-tested on machines without a GPU: the GPU
 * options (which options/cli_args fills from --cuda/--cpu/--gpu-*), the upload plan (which bytes go to the device,
 * where), layer placement over per-device VRAM budgets and its accounting.
 *
 * Contract
 * - ds4_gpu_parse_budgets(): "auto" (budgets from the devices' free memory,
 *   filled in later) or "N[,N...]" GiB per device, decimals allowed, each > 0.
 *   ds4_gpu_parse_devices(): "N[,N...]" distinct non-negative ordinals.
 * - ds4_upload_plan_new() lists every tensor the forward pass reads from the
 *   model (quantized matrices as stored, no dequantized copies; the f32
 *   vectors the binding made; the hash routing table) with its host pointer,
 *   bytes and layer (-1: embedding/head). Entries keep model order; the plan
 *   owns no tensor data.
 * - ds4_gpu_place() assigns layers to devices in list order, contiguously,
 *   each device holding its layers' weights and KV for `ctx` tokens plus a
 *   fixed scratch reserve; the embedding goes to the first device and the
 *   output head to the device of the last layer. Within a device tensors get
 *   DS4_GPU_ALIGN-aligned offsets (entry.offset) in one arena. When a layer
 *   (or the head) would spill past the last budget it returns false with one
 *   line naming the first layer that does not fit and the shortfall.
 * - ds4_upload_find() maps a host pointer that starts an entry to its index
 *   (binary search over the entries sorted by host address), -1 otherwise.
 */
#ifndef DS4_CUDA_PLAN_H
#define DS4_CUDA_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "models/dsv4/ds4_layout.h"

struct ds4_model;

enum { DS4_GPU_MAX_DEVICES = 16 };
#define DS4_GPU_ALIGN 256u

typedef enum { DS4_BACKEND_CPU = 0, DS4_BACKEND_CUDA = 1 } ds4_backend_kind;

typedef struct {
    ds4_backend_kind backend;            /* CPU unless --cuda */
    int n_budgets;                       /* 0 with auto */
    bool vram_auto;
    double budget_gib[DS4_GPU_MAX_DEVICES];
    int n_devices;                       /* 0: device 0 (or as many as budgets) */
    int devices[DS4_GPU_MAX_DEVICES];
    bool placement_given;                /* --gpu-vram or --gpu-devices was passed */
} ds4_gpu_opts;

void ds4_gpu_opts_default(ds4_gpu_opts *o);

bool ds4_gpu_parse_budgets(const char *s, ds4_gpu_opts *o, char *err, size_t errlen);
bool ds4_gpu_parse_devices(const char *s, ds4_gpu_opts *o, char *err, size_t errlen);

typedef struct {
    const void *host;
    uint64_t bytes;
    int layer;                           /* -1: not a layer tensor */
    bool head;                           /* output head (else embedding when layer < 0) */
    int device;                          /* index into the placement's device list */
    uint64_t offset;                     /* in that device's arena */
} ds4_upload_entry;

typedef struct {
    ds4_upload_entry *e;
    int n, cap;
    int *by_host;                        /* entry indices sorted by host address */
    int n_layer;
} ds4_upload_plan;

ds4_upload_plan *ds4_upload_plan_new(const struct ds4_model *m, char *err, size_t errlen);
void ds4_upload_plan_free(ds4_upload_plan *p);
int ds4_upload_find(const ds4_upload_plan *p, const void *host);

typedef struct {
    int n_devices;                       /* devices the model uses (<= budgets given) */
    int layer_device[DS4_MAX_LAYERS];
    uint64_t weight_bytes[DS4_GPU_MAX_DEVICES];   /* arena size incl. alignment */
    uint64_t kv_bytes[DS4_GPU_MAX_DEVICES];
    uint64_t scratch_bytes[DS4_GPU_MAX_DEVICES];
    uint64_t budget_bytes[DS4_GPU_MAX_DEVICES];
} ds4_gpu_placement;

/* layer_kv_bytes[l]: KV bytes layer l needs for the planned context. */
bool ds4_gpu_place(ds4_upload_plan *p, const uint64_t *layer_kv_bytes, uint64_t scratch_bytes,
                   const uint64_t *budgets, int n_budgets, ds4_gpu_placement *out, char *err, size_t errlen);

/* KV bytes of each layer for ctx tokens (the same accounting as kv.h). */
void ds4_gpu_layer_kv_bytes(const struct ds4_model *m, int ctx, int slack, uint64_t *out);

#endif
