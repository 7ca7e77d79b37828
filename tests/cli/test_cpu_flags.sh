#!/usr/bin/env bash
# The process-wide CPU options every binary that loads a model takes.
# --cpu-affinity LIST: a bad list, or a CPU this process may not run on, is
# refused with one line (exit 2); a pinned run gives the same greedy steps
# and logprobs as an unpinned one (tests/unit/test_threadpool.c checks where
# each thread runs).
# --isa LEVEL / $DS4_ISA cap the CPU kernel level: the load line names the
# level in use, a level above the CPU's runs the CPU's best after one warning
# line, a bad value is refused with one line (exit 2); avx2 runs without AVX-VNNI
# and avxvnni with it, bit for bit alike. The cap is real: on the demo model
# `ds4 --isa avx2` dumps the same greedy steps and logprobs, byte for byte, as
# the uncapped binary on an emulated AVX2-only CPU (qemu-x86_64 -cpu
# Haswell), the level the AVX2 kernels' tests run under. That comparison
# needs qemu-user: without it that part says NOT RUN (skip outside CI, fail
# under CI=true, like tests/kernels/test_qemu_cpu_models.sh).
set -u
cd "$(dirname "$0")/../.."
status=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; status=1; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
[ -f models/demo.gguf ] || { echo "FAIL models/demo.gguf missing (make demo-model)"; exit 1; }
run() { ./ds4 -m models/demo.gguf -p "Once upon a time" --nothink -n 8 -t 1 "$@"; }

# the levels this CPU has, from the uncapped load line
best=$(run 2>&1 >/dev/null | sed -n 's/.*cpu kernels \([a-z0-9]*\),.*/\1/p')
[ -n "$best" ] && ok "the load line names the level in use ($best)" || bad "no 'cpu kernels LEVEL' in the load line"
levels="scalar"
case $best in avx2) levels="scalar avx2" ;; avxvnni) levels="scalar avx2 avxvnni" ;;
    avx512) levels="scalar avx2 avx512" ;; amx) levels="scalar avx2 avx512 amx" ;; esac
# avxvnni (AVX2 with AVX-VNNI) is a cap of its own where the CPU has AVX-VNNI
vnni=no
grep -qw avx_vnni /proc/cpuinfo && vnni=yes
case $best in avx512|amx) [ $vnni = yes ] && levels="$levels avxvnni" ;; esac
for l in $levels; do
    line=$(run --isa "$l" 2>&1 >/dev/null | grep "cpu kernels")
    case $line in *"cpu kernels $l,"*) ok "--isa $l: the load line says $l" ;; *) bad "--isa $l: load line '$line'" ;; esac
    line=$(DS4_ISA=$l run 2>&1 >/dev/null | grep "cpu kernels")
    case $line in *"cpu kernels $l,"*) ok "DS4_ISA=$l: the load line says $l" ;; *) bad "DS4_ISA=$l: load line '$line'" ;; esac
done
# avx2 runs without AVX-VNNI, avxvnni with it: the same integers, so the same bits
if [ $vnni = yes ]; then
    run --isa avx2 --dump-logprobs "$d/avx2.json" >/dev/null 2>&1
    run --isa avxvnni --dump-logprobs "$d/avxvnni.json" >/dev/null 2>&1
    [ -s "$d/avx2.json" ] && cmp -s "$d/avx2.json" "$d/avxvnni.json" &&
        ok "--isa avx2 and --isa avxvnni: the same steps and logprobs" || bad "--isa avx2 and avxvnni differ"
else
    run --isa avxvnni >/dev/null 2>"$d/err"; rc=$?
    n=$(grep -c "this CPU has no AVX-VNNI" "$d/err")
    [ $rc = 0 ] && [ "$n" = 1 ] && grep -q "cpu kernels avx2," "$d/err" &&
        ok "--isa avxvnni without AVX-VNNI: one warning line, avx2 runs" || bad "--isa avxvnni: rc $rc, $(cat "$d/err")"
fi
# --isa wins over the environment
line=$(DS4_ISA=$best run --isa scalar 2>&1 >/dev/null | grep "cpu kernels")
case $line in *"cpu kernels scalar,"*) ok "--isa overrides DS4_ISA" ;; *) bad "--isa lost to DS4_ISA: '$line'" ;; esac
# a level above the CPU's: one warning, the CPU's best runs
if [ "$best" != amx ]; then
    run --isa amx >/dev/null 2>"$d/err"; rc=$?
    n=$(grep -c "this CPU has $best at most" "$d/err")
    [ $rc = 0 ] && [ "$n" = 1 ] && grep -q "cpu kernels $best," "$d/err" &&
        ok "--isa amx on a $best CPU: one warning line, $best runs" || bad "--isa amx on $best: rc $rc, $(cat "$d/err")"
fi
# bad values: one line, exit 2, for every binary that loads a model
for bin in ds4 ds4-server ds4-agent ds4-bench ds4-eval; do
    out=$(./$bin -m models/demo.gguf --isa sse4 2>&1); rc=$?
    [ $rc = 2 ] && [ "$out" = "$bin: --isa: bad value 'sse4' (scalar, avx2, avxvnni, avx512 or amx)" ] &&
        ok "$bin --isa sse4: one line, exit 2" || bad "$bin --isa sse4: rc $rc, '$out'"
done
out=$(DS4_ISA=avx3 ./ds4 -m models/demo.gguf -p hi 2>&1); rc=$?
[ $rc = 2 ] && [ "$out" = "ds4: DS4_ISA: bad value 'avx3' (scalar, avx2, avxvnni, avx512 or amx)" ] &&
    ok "DS4_ISA=avx3: one line, exit 2" || bad "DS4_ISA=avx3: rc $rc, '$out'"
out=$(./ds4-bench --kernels --isa 2>&1); rc=$?
[ $rc = 2 ] && [ "$out" = "ds4-bench: --isa needs a value" ] && ok "--isa without a value: one line" ||
    bad "--isa without a value: rc $rc, '$out'"

# --cpu-affinity
first=$(taskset -pc $$ 2>/dev/null | sed 's/.*: *//; s/[-,].*//')
first=${first:-0}
run -t 2 --dump-logprobs "$d/free.json" >/dev/null 2>&1
run -t 2 --cpu-affinity "$first" --dump-logprobs "$d/pinned.json" >/dev/null 2>"$d/err"; rc=$?
[ $rc = 0 ] && [ -s "$d/free.json" ] && cmp -s "$d/free.json" "$d/pinned.json" &&
    ok "--cpu-affinity $first: runs, the same steps and logprobs as unpinned" ||
    bad "--cpu-affinity $first: rc $rc, $(head -c 300 "$d/err")"
for v in x 3-1 0,,1 -1 1- 0-2-3 " 1" 1024; do
    for bin in ds4 ds4-bench; do
        out=$(./$bin -m models/demo.gguf --cpu-affinity "$v" 2>&1); rc=$?
        [ $rc = 2 ] && [ "$out" = "$bin: --cpu-affinity: bad value '$v' (CPU numbers and ascending ranges, e.g. 0-3,8)" ] &&
            ok "$bin --cpu-affinity '$v': one line, exit 2" || bad "$bin --cpu-affinity '$v': rc $rc, '$out'"
    done
done
# a CPU outside this process's mask: run under a mask of the first CPU alone
if command -v taskset >/dev/null && [ "$(nproc)" -gt 1 ]; then
    other=$(taskset -pc $$ | sed 's/.*: *//' | tr ',' '\n' | sed -n 2p | sed 's/-.*//')
    [ -n "$other" ] || other=$((first + 1))
    out=$(taskset -c "$first" ./ds4 -m models/demo.gguf -p hi --cpu-affinity "$first,$other" 2>&1); rc=$?
    case $out in
        "ds4: --cpu-affinity $first,$other: CPU $other is not one this process may run on (1 CPUs allowed)")
            [ $rc = 2 ] && ok "a CPU outside the process's mask: one line, exit 2" || bad "outside the mask: rc $rc" ;;
        *) bad "a CPU outside the process's mask: rc $rc, '$out'" ;;
    esac
    out=$(./ds4 -m models/demo.gguf -p hi --cpu-affinity "$first,$first" 2>&1); rc=$?
    [ $rc = 2 ] && [ "$out" = "ds4: --cpu-affinity $first,$first: CPU $first is listed twice" ] &&
        ok "a CPU listed twice: one line, exit 2" || bad "a CPU listed twice: rc $rc, '$out'"
else
    echo "NOT RUN: a CPU outside the process's mask (needs taskset and 2 CPUs)"
fi

# the cap runs what an AVX2-only CPU runs
if ! command -v qemu-x86_64 >/dev/null; then
    if [ "${CI:-}" = true ]; then bad "qemu-x86_64 not installed (Debian: qemu-user, scripts/install-deps.sh)"
    else echo "NOT RUN: --isa avx2 against qemu-x86_64 -cpu Haswell (no qemu-x86_64)"; [ $status = 0 ] && exit 77; fi
elif [ "$best" = scalar ]; then
    echo "NOT RUN: --isa avx2 against qemu Haswell: this CPU has no AVX2 level to cap"
else
    run --isa avx2 --dump-logprobs "$d/capped.json" >/dev/null 2>&1
    qemu-x86_64 -cpu Haswell ./ds4 -m models/demo.gguf -p "Once upon a time" --nothink -n 8 -t 1 \
        --dump-logprobs "$d/haswell.json" >/dev/null 2>"$d/qemu.err"
    grep -q "cpu kernels avx2," "$d/qemu.err" || bad "under qemu Haswell the load line does not say avx2"
    if [ -s "$d/capped.json" ] && cmp -s "$d/capped.json" "$d/haswell.json"; then
        ok "--isa avx2: the same 8 greedy steps and logprobs as qemu -cpu Haswell, byte for byte"
    else bad "--isa avx2 differs from the uncapped run on qemu -cpu Haswell"; fi
fi
exit $status
