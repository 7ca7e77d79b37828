#!/usr/bin/env bash
# The AVX-512 and AMX kernels on machines without them: compiles
# src/kernels/kernels_cpu_avx512.c, src/kernels/kernels_cpu_amx.c and src/kernels/attn_cpu_avx512.c
# against SIMDe (a portable implementation of the x86 intrinsics) plus an
# element-wise emulation of the AMX tile instructions, with
# DS4_KERNELS_EMULATED (no target attributes, the AMX level assumed where the
# CPU has AVX2: the emulated files fall back to the native AVX2 kernels), and
# runs the kernel unit tests on it: test_kernels checks every AVX-512 and AMX
# dot against the scalar reference and the dequantized f64 oracle, the AMX
# Q8_0 dot against the plain-C model of its float order bit for bit, and
# every matmul against the dot of its level bit for bit, and the avx2 level's
# AVX-VNNI kernels (vpdpbusd / vpdpwssd computed element by element by a
# second shim) against its plain ones bit for bit; test_kernels_nonfinite
# and test_attn_cpu check those levels on NaN, infinities and 3e38.
# "Emulated" is checked, not assumed: the binaries must hold no AVX-512 or AMX
# instruction (objdump), and the two that reach every kernel entry point run
# once more under `qemu-x86_64 -cpu Haswell` (AVX2 only), where any such
# instruction would die with SIGILL; under CI=true a missing qemu-user fails
# this test.
# Skips when SIMDe (Debian: libsimde-dev) is absent; on real AVX-512 / AMX
# hardware tests/unit/test_kernels*.c cover the paths natively.
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
typedef simde__mmask32 __mmask32;
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
static inline __m512i _mm512_mask_i32gather_epi32(__m512i src, __mmask16 k, __m512i idx, const void *base, int scale) {
    int32_t v[16], ix[16]; __m512i r;
    memcpy(v, &src, 64), memcpy(ix, &idx, 64);
    for (int i = 0; i < 16; i++) if (k >> i & 1) memcpy(&v[i], (const char *)base + (int64_t)ix[i] * scale, 4);
    memcpy(&r, v, 64);
    return r;
}
static inline __m512i _mm512_i64gather_epi64(__m512i idx, const void *base, int scale) {
    int64_t i[8], o[8]; __m512i r;
    memcpy(i, &idx, 64);
    for (int k = 0; k < 8; k++) memcpy(&o[k], (const char *)base + i[k] * scale, 8);
    memcpy(&r, o, 64);
    return r;
}
/* SIMDe's fallback multiplies, then adds (two roundings); the hardware,
 * and the scalar fmaf of the AMX file's per-row dot, round once (the
 * machine has FMA: the AVX2 level runs natively here). Inlined always, like
 * SIMDe's own, since kernels with extra target attributes call it. */
__attribute__((target("fma"))) static float fma_lane(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#undef _mm512_fmadd_ps
__attribute__((always_inline)) static inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
    float x[16], y[16], z[16]; __m512 r;
    memcpy(x, &a, 64); memcpy(y, &b, 64); memcpy(z, &c, 64);
    for (int i = 0; i < 16; i++) z[i] = fma_lane(x[i], y[i], z[i]);
    memcpy(&r, z, 64);
    return r;
}
/* used by the AMX file only */
static inline __m512i _mm512_shuffle_i64x2(__m512i a, __m512i b, int imm) {
    __m128i la[4], lb[4], r[4]; __m512i o;
    memcpy(la, &a, 64); memcpy(lb, &b, 64);
    r[0] = la[imm & 3]; r[1] = la[imm >> 2 & 3]; r[2] = lb[imm >> 4 & 3]; r[3] = lb[imm >> 6 & 3];
    memcpy(&o, r, 64);
    return o;
}
CONVERT(_mm512_cvtepi32_epi16, __m512i, int32_t, __m256i, int16_t, 16)
static inline void _mm512_mask_storeu_epi32(void *p, __mmask16 m, __m512i v) {
    int32_t a[16];
    memcpy(a, &v, 64);
    for (int i = 0; i < 16; i++) if (m >> i & 1) memcpy((char *)p + 4 * i, &a[i], 4);
}
static inline void _mm512_mask_storeu_ps(void *p, __mmask16 m, __m512 v) {
    _mm512_mask_storeu_epi32(p, m, _mm512_castps_si512(v));
}
/* AMX: eight tile registers per thread, the configuration's rows and bytes
 * per row, and TDPBSSD as the SDM's pseudo-code defines it */
static _Thread_local struct { uint16_t colsb[16]; uint8_t rows[16]; int8_t t[8][16][64]; } amx;
static inline void _tile_loadconfig(const void *cfg) {
    memcpy(amx.colsb, (const char *)cfg + 16, 32);
    memcpy(amx.rows, (const char *)cfg + 48, 16);
    memset(amx.t, 0, sizeof amx.t);
}
#define _tile_zero(dst) memset(amx.t[dst], 0, sizeof amx.t[dst])
#define _tile_loadd(dst, base, stride) \
    for (int r_ = 0; r_ < amx.rows[dst]; r_++) memcpy(amx.t[dst][r_], (const char *)(base) + r_ * (long)(stride), amx.colsb[dst])
#define _tile_stored(src, base, stride) \
    for (int r_ = 0; r_ < amx.rows[src]; r_++) memcpy((char *)(base) + r_ * (long)(stride), amx.t[src][r_], amx.colsb[src])
static inline void tile_dpbssd(int c, int a, int b) {
    for (int m = 0; m < amx.rows[c]; m++)
        for (int n = 0; n < amx.colsb[c] / 4; n++) {
            int32_t acc;
            memcpy(&acc, &amx.t[c][m][4 * n], 4);
            for (int k = 0; k < amx.colsb[a] / 4; k++)
                for (int j = 0; j < 4; j++) acc += amx.t[a][m][4 * k + j] * amx.t[b][k][4 * n + j];
            memcpy(&amx.t[c][m][4 * n], &acc, 4);
        }
}
#define _tile_dpbssd(c, a, b) tile_dpbssd(c, a, b)
EOF
# AVX-VNNI's two instructions, as Intel defines them (u8 x s8 groups of four,
# and s16 x s16 pairs, added to the lane without saturation), for the avx2
# file, compiled with the native intrinsics otherwise; immintrin.h first, so
# its own definitions keep their names when the macros take them
cat > "$d/shim/avxvnni_emulated.h" <<'EOF'
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
static inline __m256i emulated_dpbusd(__m256i acc, __m256i u, __m256i s) {
    int32_t r[8]; uint8_t a[32]; int8_t b[32];
    memcpy(r, &acc, 32), memcpy(a, &u, 32), memcpy(b, &s, 32);
    for (int i = 0; i < 32; i++) r[i / 4] += (int32_t)a[i] * b[i];
    memcpy(&acc, r, 32);
    return acc;
}
static inline __m256i emulated_dpwssd(__m256i acc, __m256i x, __m256i y) {
    int32_t r[8]; int16_t a[16], b[16];
    memcpy(r, &acc, 32), memcpy(a, &x, 32), memcpy(b, &y, 32);
    for (int i = 0; i < 16; i++) r[i / 2] += (int32_t)a[i] * b[i];
    memcpy(&acc, r, 32);
    return acc;
}
#define _mm256_dpbusd_avx_epi32 emulated_dpbusd
#define _mm256_dpwssd_avx_epi32 emulated_dpwssd
EOF
cf="-std=gnu11 -D_GNU_SOURCE -O1 -w -Wno-psabi -Isrc -DDS4_KERNELS_EMULATED"
avx2="-mavx2 -mfma -mf16c"
gcc $cf -I"$d/shim" -c src/kernels/kernels_cpu_avx512.c -o "$d/avx512.o" &
gcc $cf -I"$d/shim" -c src/kernels/kernels_cpu_amx.c -o "$d/amx.o" &
wait
gcc $cf -c src/kernels/kernels_cpu.c -o "$d/kernels_cpu.o"
gcc $cf $avx2 -include "$d/shim/avxvnni_emulated.h" -c src/kernels/kernels_cpu_avx2.c -o "$d/avx2.o"
# the attention row sum is plain vector code: without the AVX-512 flags gcc
# lowers its 64-byte vectors to SSE2
gcc $cf -c src/kernels/attn_cpu.c -o "$d/attn_cpu.o"
gcc $cf $avx2 -c src/kernels/attn_cpu_avx2.c -o "$d/attn_avx2.o"
gcc $cf -c src/kernels/attn_cpu_avx512.c -o "$d/attn_avx512.o"
tests="test_kernels test_kernels_nonfinite test_attn_cpu"
for t in $tests; do
    gcc $cf -Itests/unit tests/unit/$t.c "$d"/*.o src/kernels/quant*.c src/base/threadpool.c -o "$d/$t" -lm -pthread
done
# no instruction of AVX-512 (zmm registers, opmasks), AMX (tiles) or
# AVX-VNNI (vpdp*, whose EVEX form would be AVX-512 anyway) anywhere: the
# instruction column of the disassembly, symbol names (<...>) cut
for t in $tests; do
    if objdump -d --no-show-raw-insn "$d/$t" | awk -F'\t' 'NF >= 2 { sub(/<[^>]*>/, "", $2); print $2 }' |
            grep -E '%zmm|%k[0-7]|^(ld|st)tilecfg|^tile|^tdpb|vpdp' | head -5 | grep .; then
        echo "FAIL: $t holds AVX-512/AMX/AVX-VNNI instructions (above): the emulation would execute them"
        exit 1
    fi
done
for t in $tests; do "$d/$t"; done
if ! command -v qemu-x86_64 >/dev/null; then
    if [ "${CI:-}" = true ]; then
        echo "FAIL: qemu-x86_64 not installed (qemu-user, scripts/install-deps.sh): CI requires the Haswell run"
        exit 1
    fi
    echo "skip: the emulated tests under qemu-x86_64 -cpu Haswell did NOT RUN (qemu-user not installed)"
    exit 77
fi
# Under qemu the two tests that call every entry point of every type at
# every level (AMX tiles, the VBMI/GFNI kernels on and off) in seconds;
# test_kernels' exhaustive cases would take minutes of TCG there, and the
# disassembly check above already covers its binary.
for t in test_kernels_nonfinite test_attn_cpu; do
    echo "== $t under qemu-x86_64 -cpu Haswell (AVX2, no AVX-512)"
    qemu-x86_64 -cpu Haswell "$d/$t" 2> >(grep -v "TCG doesn't support requested feature" >&2)
done
