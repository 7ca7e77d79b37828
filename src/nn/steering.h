/* steering.h -- directional steering: one direction per layer, projected out
 * of (or, with a negative scale, added to) a layer's attention and FFN
 * outputs, y = y - scale * d * dot(d, y) (docs/steering.md).
 *
 * Contract
 * - A steering file is a flat little-endian f32 matrix [n_layer][n_embd],
 *   row l the direction of layer l (the tools write unit vectors; rows are
 *   used as given). ds4_steering_read() returns it (malloc'd) or NULL with
 *   one line in err: missing/unreadable file, a size other than
 *   n_layer * n_embd * 4 bytes (the line says what was expected), a
 *   non-finite value.
 * - ds4_steering is what a sequence is evaluated with: the directions and
 *   the two scales. NULL, or both scales zero, is the unsteered path; a
 *   sublayer whose scale is zero is left untouched bit for bit.
 * - ds4_act_probe sums one site's output rows per layer (after any
 *   steering), for --dump-activations: ds4_probe_row() adds a row of layer l
 *   to sum[l] (in double) and counts rows at layer 0; the per-layer mean
 *   is sum / rows. A probe belongs to one sequence at a time.
 * - ds4_steer_row() applies one sublayer's projection to one row of n_embd
 *   floats for layer l (rows outside the file's layers, and zero scales, are
 *   left alone); the dot runs in double in a fixed order over that row only,
 *   so a row's result does not depend on the batch it shares.
 */
#ifndef DS4_STEERING_H
#define DS4_STEERING_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { DS4_STEER_ATTN = 0, DS4_STEER_FFN = 1 } ds4_steer_site;

typedef struct ds4_steering {
    const float *dir;   /* [n_layer][n_embd] */
    int n_layer, n_embd;
    float attn, ffn;    /* scales of the attention and FFN outputs */
} ds4_steering;

float *ds4_steering_read(const char *path, int n_layer, int n_embd, char *err, size_t errlen);

static inline bool ds4_steering_active(const ds4_steering *s) {
    return s && s->dir && (s->attn != 0.0f || s->ffn != 0.0f);
}

/* The scale of one site (0 when s is NULL). */
static inline float ds4_steering_scale(const ds4_steering *s, ds4_steer_site site) {
    return !s || !s->dir ? 0.0f : site == DS4_STEER_ATTN ? s->attn : s->ffn;
}

/* One row: y -= scale * d * dot(d, y) with d layer l's direction. */
void ds4_steer_row(const ds4_steering *s, ds4_steer_site site, int l, float *y);

typedef struct ds4_act_probe {
    ds4_steer_site site;
    int n_layer, n_embd;
    double *sum;        /* [n_layer][n_embd] */
    long rows;          /* rows seen at layer 0 */
} ds4_act_probe;

/* Adds row y of layer l when the probe watches `site` (p NULL: nothing). */
void ds4_probe_row(ds4_act_probe *p, ds4_steer_site site, int l, const float *y);

#endif
