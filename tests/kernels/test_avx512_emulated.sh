#!/usr/bin/env bash
# The AVX-512 kernels on machines without AVX-512: compiles
# src/kernels_cpu_avx512.c against SIMDe (a portable implementation of the
# x86 intrinsics), forces the AVX-512 level, and runs the kernel unit test,
# which then checks every AVX-512 dot against the scalar reference and the
# dequantized f64 oracle. Skips when SIMDe (Debian: libsimde-dev) is absent;
# on real AVX-512 hardware tests/unit/test_kernels.c covers the path natively.
set -eu
cd "$(dirname "$0")/../.."
if [ ! -f /usr/include/simde/x86/avx512.h ]; then
    echo "skip: SIMDe not installed (libsimde-dev)"
    exit 77
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
mkdir "$d/shim"
# SIMDe 0.7 lacks a few of the intrinsics used; these element-wise versions
# follow Intel's definitions (masked loads read only the selected elements).
cat > "$d/shim/immintrin.h" <<'EOF'
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <simde/x86/gfni.h>
#include <stdint.h>
#include <string.h>
typedef simde__mmask16 __mmask16;
typedef simde__mmask64 __mmask64;
static inline float _cvtsh_ss(unsigned short h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline __m512 _mm512_cvtph_ps(__m256i v) {
    uint16_t h[16]; float f[16]; __m512 r;
    memcpy(h, &v, 32);
    for (int i = 0; i < 16; i++) f[i] = _cvtsh_ss(h[i]);
    memcpy(&r, f, 64);
    return r;
}
static inline __m256i _mm256_maskz_loadu_epi16(__mmask16 m, const void *p) {
    uint16_t h[16] = {0}; __m256i r;
    for (int i = 0; i < 16; i++) if (m >> i & 1) memcpy(&h[i], (const char *)p + 2 * i, 2);
    memcpy(&r, h, 32);
    return r;
}
static inline __m512i _mm512_maskz_loadu_epi8(simde__mmask64 m, const void *p) {
    uint8_t b[64] = {0}; __m512i r;
    for (int i = 0; i < 64; i++) if (m >> i & 1) b[i] = ((const uint8_t *)p)[i];
    memcpy(&r, b, 64);
    return r;
}
static inline __m512i _mm512_maskz_loadu_epi16(simde__mmask32 m, const void *p) {
    uint16_t h[32] = {0}; __m512i r;
    for (int i = 0; i < 32; i++) if (m >> i & 1) memcpy(&h[i], (const char *)p + 2 * i, 2);
    memcpy(&r, h, 64);
    return r;
}
/* lane-wise conversion of the first n lanes of an input vector */
#define CONVERT(name, in_vec, in_t, out_vec, out_t, n)                \
    static inline out_vec name(in_vec v) {                           \
        in_t a[sizeof(in_vec) / sizeof(in_t)]; out_t o[n]; out_vec r; \
        memcpy(a, &v, sizeof a);                                      \
        for (int i = 0; i < n; i++) o[i] = (out_t)a[i];               \
        memcpy(&r, o, sizeof r);                                      \
        return r;                                                     \
    }
CONVERT(_mm512_cvtepu16_epi32, __m256i, uint16_t, __m512i, int32_t, 16)
CONVERT(_mm512_cvtepu8_epi64, __m128i, uint8_t, __m512i, int64_t, 8)
CONVERT(_mm512_cvtepu8_epi32, __m128i, uint8_t, __m512i, int32_t, 16)
static inline __m512i _mm512_zextsi256_si512(__m256i v) {
    __m512i r;
    memset(&r, 0, sizeof r);
    memcpy(&r, &v, sizeof v);
    return r;
}
CONVERT(_mm512_cvtepi32_ps, __m512i, int32_t, __m512, float, 16)
static inline __m512 _mm512_maskz_loadu_ps(__mmask16 m, const void *p) {
    float f[16] = {0}; __m512 r;
    for (int i = 0; i < 16; i++) if (m >> i & 1) memcpy(&f[i], (const char *)p + 4 * i, 4);
    memcpy(&r, f, 64);
    return r;
}
static inline float _mm512_reduce_add_ps(__m512 v) {
    float f[16], s = 0;
    memcpy(f, &v, 64);
    for (int i = 0; i < 16; i++) s += f[i];
    return s;
}
static inline __m512i _mm512_i64gather_epi64(__m512i idx, const void *base, int scale) {
    int64_t i[8], o[8]; __m512i r;
    memcpy(i, &idx, 64);
    for (int k = 0; k < 8; k++) memcpy(&o[k], (const char *)base + i[k] * scale, 8);
    memcpy(&r, o, 64);
    return r;
}
EOF
cf="-std=gnu11 -D_GNU_SOURCE -O1 -w -Wno-psabi -Isrc"
gcc $cf -I"$d/shim" -c src/kernels_cpu_avx512.c -o "$d/avx512.o"
gcc $cf -DDS4_KERNELS_ASSUME_AVX512 -c src/kernels_cpu.c -o "$d/kernels_cpu.o"
gcc $cf -mavx2 -mfma -mf16c -c src/kernels_cpu_avx2.c -o "$d/avx2.o"
gcc $cf -Itests/unit tests/unit/test_kernels.c "$d"/*.o src/quant*.c src/threadpool.c -o "$d/test_kernels" -lm -pthread
"$d/test_kernels"
