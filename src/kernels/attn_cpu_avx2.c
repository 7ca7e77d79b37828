/* attn_cpu_avx2.c -- attn_cpu_accum.h with 256-bit vectors (this file gets the
 * AVX2 compiler flags; attn_cpu.c calls it only at that level). */
#include "kernels/attn_cpu_internal.h"

#define ATTN_VEC_BYTES 32
#define ATTN_ACCUM ds4_attn_accum_avx2
#include "kernels/attn_cpu_accum.h"
