#!/usr/bin/env bash
# What a CI machine without AVX-512 (or without AVX2) will see, proved on any
# x86-64 machine: runs the kernel unit tests ($BUILD/tests/test_kernels,
# test_kernels_nonfinite, test_attn_cpu) under qemu-user's TCG on two CPU
# models, whose CPUID the level probe reads:
#   Haswell      AVX2, FMA, F16C, no AVX-512: the scalar and avx2 levels run;
#                avx512 and amx, the VBMI/GFNI kernels and the AMX model
#                check must each say NOT RUN.
#   SandyBridge  AVX without AVX2/FMA/F16C: only the scalar level may run (the
#                probe must refuse AVX2 kernels on an AVX CPU, and nothing
#                outside them may use AVX2); avx2, avx512, amx NOT RUN.
# Debian 12's qemu (7.2) TCG emulates x86 up to AVX2 and has no AVX-512 or
# AMX: a model such as Icelake-Server or Cooperlake gets those features masked
# off and would only repeat Haswell, SapphireRapids is refused. The AVX-512
# and AMX kernels therefore run emulated through SIMDe in
# test_avx512_emulated.sh, which also runs its binaries under Haswell.
# Each run must pass, report the expected best level and say NOT RUN for
# every level above it: a level the CPU lacks is never executed (TCG would
# raise SIGILL) and never counted as passed. About a minute of CPU.
# Outside CI a missing qemu-x86_64 skips (77); under CI=true it fails.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
if ! command -v qemu-x86_64 >/dev/null; then
    if [ "${CI:-}" = true ]; then
        echo "FAIL: qemu-x86_64 not installed (Debian: qemu-user, scripts/install-deps.sh)"
        exit 1
    fi
    echo "skip: qemu-x86_64 not installed (Debian: qemu-user)"
    exit 77
fi
tests="test_kernels test_kernels_nonfinite test_attn_cpu"
for t in $tests; do
    [ -x "$BUILD/tests/$t" ] || { echo "FAIL: $BUILD/tests/$t not built (make $BUILD/tests/$t)"; exit 1; }
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
failed=0
# model, the best level it must report, the levels that must say NOT RUN
check_model() {
    local model=$1 best=$2 not_run=$3 t l
    for t in $tests; do
        echo "== $t under qemu-x86_64 -cpu $model"
        qemu-x86_64 -cpu "$model" "$BUILD/tests/$t" >"$out" 2>&1
        local status=$?
        grep -v "TCG doesn't support requested feature" "$out" | tail -n 4
        if [ $status != 0 ]; then
            echo "FAIL: $t under $model: exit $status"; failed=1; continue
        fi
        grep -q "^$t: levels run: scalar\.\.$best\$" "$out" ||
            { echo "FAIL: $t under $model: the probe did not report $best as the best level"; failed=1; }
        for l in $not_run; do
            grep -q "^$t: NOT RUN: the $l level" "$out" ||
                { echo "FAIL: $t under $model: the $l level is not reported NOT RUN"; failed=1; }
        done
    done
}
check_model Haswell avx2 "avx512 amx"
check_model SandyBridge scalar "avx2 avx512 amx"
[ $failed = 0 ] && echo "ok: every kernel test passes on Haswell and SandyBridge, the missing levels NOT RUN"
exit $failed
