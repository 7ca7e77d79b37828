/* simd_levels.h -- how a kernel test covers the SIMD levels: it runs every
 * level from scalar up to ds4_cpu_best_level() (the CPUID probe; never one
 * the CPU lacks, whose instructions would fault) and reports each level above
 * it as NOT RUN, counting nothing for it, so a missing level is never read
 * as a pass. tests/kernels/test_avx512_emulated.sh runs these tests with
 * the AVX-512 and AMX files emulated; tests/kernels/test_qemu_cpu_models.sh
 * runs them on emulated CPUs without AVX-512 or without AVX2.
 */
#ifndef DS4_TEST_SIMD_LEVELS_H
#define DS4_TEST_SIMD_LEVELS_H

#include <stdio.h>

#include "kernels/kernels_cpu.h"

static inline void report_levels_not_run(const char *suite) {
    static const char *const lacks[] = {
        [DS4_SIMD_AVX2] = "AVX2, FMA and F16C with the OS saving YMM state",
        [DS4_SIMD_AVX512] = "AVX-512 F/BW/DQ/VL with VNNI and the OS saving ZMM state",
        [DS4_SIMD_AMX] = "AMX-TILE/AMX-INT8 with the OS's tile permission",
    };
    const enum ds4_simd_level best = ds4_cpu_best_level();
    printf("%s: levels run: scalar..%s\n", suite, ds4_simd_level_name(best));
    for (int l = (int)best + 1; l <= DS4_SIMD_AMX; l++)
        printf("%s: NOT RUN: the %s level (this CPU lacks %s)\n", suite, ds4_simd_level_name((enum ds4_simd_level)l),
               lacks[l]);
}

#endif
