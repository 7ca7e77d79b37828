/* forward_cpu_math.c -- small numeric pieces of the DS4 forward pass:
 * ds4's storage round trips (FP8/FP4/Hadamard/F16). */
#include "models/dsv4/forward_cpu.h"
#include "models/dsv4/forward_cpu_impl.h"
#include "models/dsv4/forward_shared.h"
#include "kernels/quant.h"

#include <math.h>

void ds4_fp8_e4m3_roundtrip(float *x, int n) {
    for (int b = 0; b < n; b += 64) {
        float amax = 0;
        for (int i = 0; i < 64; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        const float scale = ds4_fp8_block_scale(amax);
        for (int i = 0; i < 64; i++) x[b + i] = ds4_fp8_value(x[b + i], scale);
    }
}

void ds4_fp4_e2m1_roundtrip(float *x, int n) {
    for (int b = 0; b < n; b += 32) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        const float scale = ds4_fp4_block_scale(amax);
        for (int i = 0; i < 32; i++) x[b + i] = ds4_fp4_value(x[b + i], scale);
    }
}

void ds4_hadamard(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

void ds4_fwd_f16_round(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = ds4_half_to_f32(ds4_f32_to_half(x[i]));
}
