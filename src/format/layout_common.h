/* layout_common.h -- what every family's GGUF layout (ds4_layout.h,
 * glm_layout.h) shares: the metadata key table with its walkers, and the
 * file type mixes.
 *
 * Contract
 * - A layout lists its metadata keys as ds4_hparam_key entries whose offsets
 *   point into its own hyperparameter struct (`fields`); per-layer arrays
 *   have n_layer entries.
 * - ds4_hparam_table_write() writes every key with the GGUF type of its kind
 *   (UINT32, FLOAT32, BOOL, arrays of UINT32 / FLOAT32, constant strings).
 * - ds4_hparam_table_read() accepts any integer/float type whose value fits
 *   the field and fails with one line naming the first missing
 *   non-optional key or the first value of the wrong type.
 * - A mix names the weight types of a converted or generated file
 *   ("f32", "f16", "q8_0", "q2", "q4"); each layout maps it to per-tensor
 *   types. ds4_mix_file_type() is its general.file_type: the llama_ftype
 *   named after the routed experts' type (most of the bytes), the way
 *   llama-quantize labels such mixes.
 */
#ifndef DS4_LAYOUT_COMMON_H
#define DS4_LAYOUT_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ds4_gguf;
struct ds4_gguf_writer;

/* GGUF value kinds of the metadata table. */
enum ds4_hp_kind { DS4_HP_U32, DS4_HP_F32, DS4_HP_BOOL,
                   DS4_HP_U32_PER_LAYER, DS4_HP_F32_PER_LAYER, DS4_HP_STR_CONST };

typedef struct ds4_hparam_key {
    const char *key;               /* full key, e.g. "deepseek4.block_count" */
    enum ds4_hp_kind kind;
    size_t offset;                 /* offsetof(the layout's struct, field); unused for STR_CONST */
    const char *str_value;         /* STR_CONST: the value written */
    bool optional;                 /* reading tolerates its absence */
} ds4_hparam_key;

void ds4_hparam_table_write(struct ds4_gguf_writer *w, const ds4_hparam_key *keys, size_t n_keys,
                            const void *fields, uint32_t n_layer);
int ds4_hparam_table_read(const struct ds4_gguf *g, const ds4_hparam_key *keys, size_t n_keys,
                          void *fields, uint32_t n_layer, char *err, size_t errlen);

enum ds4_mix { DS4_MIX_F32, DS4_MIX_F16, DS4_MIX_Q8_0, DS4_MIX_Q2, DS4_MIX_Q4 };
int ds4_mix_from_name(const char *s);          /* "f32","f16","q8_0","q2","q4"; -1 if unknown */
const char *ds4_mix_name(enum ds4_mix m);
uint32_t ds4_mix_file_type(enum ds4_mix m);

#endif
