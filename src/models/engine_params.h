/* engine_params.h -- what a model is loaded with: the engine's parameters
 * (engine.h's ds4_engine_load) and the expert-streaming counters. They sit
 * below the engine because the family seam (model_family.h) binds a family
 * from them and reports through them.
 *
 * Contract
 * - Plain data; ds4_engine_params_default() (engine.h) fills the defaults.
 */
#ifndef DS4_ENGINE_PARAMS_H
#define DS4_ENGINE_PARAMS_H

#include <stdbool.h>
#include <stdint.h>

#include "backends/cuda/cuda_plan.h"
#include "dist/dist.h"

/* --ssd-streaming* options (docs/ssd-streaming.md). */
typedef struct {
    bool enabled;
    uint64_t cache_bytes;   /* --ssd-streaming-cache-experts NGB (0: automatic) */
    int cache_slots;        /* --ssd-streaming-cache-experts N: exactly N slots */
    int preload_experts;    /* hot experts read at load; 0: half the slots */
    bool cold;              /* --ssd-streaming-cold: no preload */
    bool stats;             /* --ssd-streaming-stats: counters on stderr when the engine is freed */
    bool lru;               /* plain LRU eviction instead of aged LFU (for measurements) */
    bool no_predict;        /* no early reads of the next layer's guessed experts (for measurements) */
    int ctx;                /* context the front end will use: KV reserved by the automatic budget */
    const char *trace_path; /* record every layer's routing here (policy measurements) */
} ds4_ssd_params;


typedef struct {
    uint64_t hits, misses, bytes_read, tokens, preloaded, prefetched;
    uint64_t predicted, predicted_right, predicted_read;   /* next-layer guesses (expert_cache.h) */
    double read_seconds, stall_seconds;
} ds4_ssd_stats;

/* --dir-steering-* (docs/steering.md): the file's directions, projected out
 * of every layer's FFN and attention outputs with these scales. NAN: not
 * given (the FFN then defaults to 1 and the attention to 0 when a file is
 * given; a scale without a file is refused). */
typedef struct {
    const char *file;
    float ffn, attn;
} ds4_steering_params;

typedef struct {
    const char *model_path;
    int n_threads;          /* <= 0: the physical cores we may run on */
    int prefill_chunk;      /* <= 0: 4096 */
    int numerics;           /* -1: default (ds4 simulation on for real models), 0: exact f32, 1: ds4 simulation */
    bool quiet;             /* no load report on stderr */
    ds4_ssd_params ssd;
    ds4_gpu_opts gpu;       /* backend choice and GPU placement (cuda_plan.h) */
    int gpu_ctx;            /* context the GPU placement reserves KV for (<= 0: 32768) */
    const char *layers;     /* --layers A:B | A:output: bind only that slice (NULL: what the file holds) */
    ds4_dist_params dist;   /* --role coordinator: the other layers run on registered workers (dist.h) */
    ds4_steering_params steering;
    int power;              /* --power N: pace compute to N% of the time (1..100; 100 or 0: never pause) */
    bool warm_weights;      /* --warm-weights: page the weights in at load even where the automatic rule would not */
    bool lazy_weights;      /* never page in at load (--inspect computes nothing) */
    const char *mtp_path;   /* --mtp FILE: the draft model's support file (NULL: none) */
    const char *dspark_path;/* --mtp FILE --dspark: the DSpark block drafter's support file (NULL: none; not with mtp_path) */
} ds4_engine_params;

#endif
