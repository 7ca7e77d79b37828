/* attn_cpu_avx512.c -- attn_cpu_accum.h with 512-bit vectors (this file gets the
 * AVX512 compiler flags; attn_cpu.c calls it only at that level). */
#include "kernels/attn_cpu_internal.h"

#define ATTN_VEC_BYTES 64
#define ATTN_ACCUM ds4_attn_accum_avx512
#include "kernels/attn_cpu_accum.h"
