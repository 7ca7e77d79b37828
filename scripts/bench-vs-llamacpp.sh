#!/usr/bin/env bash
# bench-vs-llamacpp.sh -- DwarfStar and llama.cpp side by side on the identical
# GGUF, interleaved (A B A B ...), printing min/median/max per engine and the
# per-pair ratio. A benchmark: it prints and always exits 0 (a failed step is
# reported as a line, never as a CI failure).
#
# llama.cpp comes from PyPI: the llama-cpp-python source distribution vendors a
# pinned llama.cpp tree (with the deepseek4 architecture). Only llama-bench is
# built, once, into a cache directory outside the repository. The model is the
# Flash-shaped random file (ds4-make-model --preset flash --layers 4: Flash's
# real per-layer shapes, random valid quantized blocks), made once and reused.
#
# Environment (defaults in brackets):
#   ISA              one instruction-set level for both engines [empty: each
#                    engine's best on this CPU]: scalar, avx2, avxvnni, avx512
#                    or amx. ds4-bench runs with --isa ISA; llama-bench is
#                    built once per level into its own build directory, with
#                    GGML_NATIVE off and the GGML_* options of that level
#                    (avx2: AVX, AVX2, FMA, F16C; avxvnni: those and AVX-VNNI;
#                    avx512: those plus AVX-512 F/BW/DQ/VL, VNNI and VBMI, and
#                    AVX-VNNI where the CPU has it; amx: native); a build
#                    whose recorded options differ is made again
#   DS4_BENCH_CACHE  cache dir [~/.cache/dwarfstar/bench-vs-llamacpp]
#   MODEL            GGUF to use [$DS4_BENCH_CACHE/flash-4l-q2.gguf, made if missing]
#   PAIRS            interleaved pairs per case [3]
#   THREADS          thread counts [1 and all CPUs]
#   DECODE_DEPTHS    decode cases: context depth before decoding [512 4096]; empty: none
#   PREFILLS         prefill cases: prompt lengths [512 2048]; empty: none
#   GEN              tokens decoded per decode run [32]
#   POLLS            llama-bench --poll values, each a column of llama.cpp runs
#                    against the same ds4 run of a pair [50 0]: 50 is llama.cpp's
#                    default (workers busy-poll up to 50 units between graph
#                    nodes), 0 makes them sleep at once as DwarfStar's pool
#                    does after a short spin; on a machine with no free core the
#                    polling takes time slices from llama.cpp's own other thread
#   BENCH_LOCK       a file to hold with flock(1) around every single timed
#                    run (a shared machine: one benchmark at a time, the lock
#                    never held between runs); each run's load average is printed
#   ONLY             "check": only build llama-bench and check it loads MODEL
#   LLAMA_ARGS       extra llama-bench arguments [--repack 0]: with its CPU
#                    repack buffers on (the default), this llama.cpp aborts in
#                    ggml_backend_sched_split_graph on the deepseek4 graph
#                    (attn_output_a: a repacked Q8_0 weight against a permuted
#                    activation, which no buffer type supports), so it runs
#                    on the plain CPU buffer, as DwarfStar does
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${DS4_BENCH_CACHE:-$HOME/.cache/dwarfstar/bench-vs-llamacpp}
MODEL=${MODEL:-$CACHE/flash-4l-q2.gguf}
PAIRS=${PAIRS:-3}
NCPU=$(nproc)
THREADS=${THREADS:-$( [ "$NCPU" -gt 1 ] && echo "1 $NCPU" || echo 1 )}
DECODE_DEPTHS=${DECODE_DEPTHS-512 4096}
PREFILLS=${PREFILLS-512 2048}
GEN=${GEN:-32}
read -r -a POLL_VALUES <<< "${POLLS-50 0}"
ISA=${ISA:-}
case $ISA in ""|scalar|avx2|avxvnni|avx512|amx) ;; *) echo "# SKIPPED: ISA=$ISA: not scalar, avx2, avxvnni, avx512 or amx"; exit 0 ;; esac
if [ "$ISA" = avxvnni ] && ! grep -qw avx_vnni /proc/cpuinfo; then echo "# SKIPPED: ISA=avxvnni: this CPU has no AVX-VNNI"; exit 0; fi
LLAMA_BUILD=$CACHE/llama.cpp-build${ISA:+-$ISA}
LLAMA_BENCH=$LLAMA_BUILD/bin/llama-bench
DS4_ISA_ARGS=()
[ -n "$ISA" ] && DS4_ISA_ARGS=(--isa "$ISA")
read -r -a LLAMA_EXTRA <<< "${LLAMA_ARGS---repack 0}"

note() { echo "# $*"; }
fail() { echo "# SKIPPED: $*"; exit 0; }
mkdir -p "$CACHE" || fail "cannot create $CACHE"

# the GGML_* options of $ISA, one per line
isa_flags() {
    local vnni=OFF x86=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_AVX512_BF16=OFF)
    grep -qw avx_vnni /proc/cpuinfo && vnni=ON
    local avx2=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON) no512=(-DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF)
    case $ISA in
    "" | amx) printf '%s\n' -DGGML_NATIVE=ON ;;
    scalar) printf '%s\n' "${x86[@]}" -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_AVX_VNNI=OFF "${no512[@]}" ;;
    avx2) printf '%s\n' "${x86[@]}" "${avx2[@]}" -DGGML_AVX_VNNI=OFF "${no512[@]}" ;;
    avxvnni) printf '%s\n' "${x86[@]}" "${avx2[@]}" -DGGML_AVX_VNNI=ON "${no512[@]}" ;;
    avx512) printf '%s\n' "${x86[@]}" "${avx2[@]}" -DGGML_AVX_VNNI=$vnni -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON \
        -DGGML_AVX512_VBMI=ON ;;
    esac
}

build_llamacpp() {
    local flags stamp=$LLAMA_BUILD/ds4-isa-flags
    flags=$(isa_flags)
    [ -x "$LLAMA_BENCH" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$flags" ] && return 0
    local src
    src=$(ls -d "$CACHE"/llama_cpp_python-*/vendor/llama.cpp 2>/dev/null | head -1)
    if [ -z "$src" ]; then
        note "downloading the llama-cpp-python source distribution (vendored llama.cpp)"
        (cd "$CACHE" && pip download --no-deps --no-binary :all: llama-cpp-python -d . >/dev/null) ||
            return 1
        (cd "$CACHE" && tar xzf llama_cpp_python-*.tar.gz) || return 1
        src=$(ls -d "$CACHE"/llama_cpp_python-*/vendor/llama.cpp | head -1)
    fi
    # cmake from PyPI goes into the repository's venv, never the system Python
    command -v cmake >/dev/null || { (cd "$ROOT" && make -s venv) &&
        "$ROOT/.venv/bin/python3" -m pip install -q cmake >/dev/null && PATH="$ROOT/.venv/bin:$PATH"; } || return 1
    local isa_flags
    mapfile -t isa_flags <<< "$flags"
    note "building llama-bench from $src (CPU backend, ISA ${ISA:-native}) into $LLAMA_BUILD"
    cmake -S "$src" -B "$LLAMA_BUILD" -DCMAKE_BUILD_TYPE=Release "${isa_flags[@]}" \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >"$CACHE/cmake${ISA:+-$ISA}.log" 2>&1 || return 1
    nice cmake --build "$LLAMA_BUILD" --target llama-bench -j "$NCPU" \
        >"$CACHE/build${ISA:+-$ISA}.log" 2>&1 || return 1
    [ -x "$LLAMA_BENCH" ] && printf '%s\n' "$flags" >"$stamp"
}

make_model() {
    [ -s "$MODEL" ] && return 0
    note "making $MODEL (Flash shapes, 4 layers, q2 mix, random blocks)"
    [ -x "$ROOT/ds4-make-model" ] || (cd "$ROOT" && make -j"$NCPU" ds4-make-model >/dev/null) || return 1
    # with the repository's DeepSeek vocabulary: llama.cpp refuses a file without one
    (cd "$ROOT" && ./ds4-make-model -o "$MODEL.tmp" --preset flash --layers 4 2>/dev/null) &&
        mv "$MODEL.tmp" "$MODEL"
}

build_llamacpp || fail "could not build llama-bench (see $CACHE/*.log)"
make_model || fail "could not make the model"
[ -x "$ROOT/ds4-bench" ] || (cd "$ROOT" && make -j"$NCPU" ds4-bench >/dev/null) || fail "no ds4-bench"

# Acceptance check: llama.cpp loads the ds4-make-model file and decodes with it
# (a few tokens: the context it builds for one token alone takes another path).
if ! "$LLAMA_BENCH" -m "$MODEL" -p 0 -n 4 -r 1 -t "$NCPU" "${LLAMA_EXTRA[@]}" -o csv \
        >"$CACHE/load-check.csv" 2>"$CACHE/load-check.log"; then
    tail -3 "$CACHE/load-check.log" | sed 's/^/# llama.cpp: /'
    fail "llama.cpp does not load $MODEL"
fi
note "llama.cpp loads $(basename "$MODEL") and decodes with it: ok (llama-bench ${LLAMA_EXTRA[*]})"
[ "${ONLY:-}" = check ] && exit 0

# One timed run; prints tokens/s. kind: pp (prefill N tokens from empty) or
# tg (decode GEN tokens after a context of N tokens).
run_ds4() {  # kind n threads
    local start=$2 gen=0 col=2
    [ "$1" = tg ] && { gen=$GEN; col=3; }
    "$ROOT/ds4-bench" -m "$MODEL" -t "$3" --ctx-start "$start" --ctx-max "$start" --gen-tokens "$gen" \
        "${DS4_ISA_ARGS[@]}" 2>/dev/null | awk -F, -v c=$col 'NR == 2 { print $c }'
}
run_llama() {  # kind n threads poll
    local args
    if [ "$1" = pp ]; then args=(-p "$2" -n 0 -b "$2"); else args=(-p 0 -n "$GEN" -d "$2"); fi
    "$LLAMA_BENCH" -m "$MODEL" "${args[@]}" -t "$3" --poll "$4" -r 1 "${LLAMA_EXTRA[@]}" -o csv 2>/dev/null |
        python3 -c 'import csv, sys; r = list(csv.DictReader(sys.stdin)); print((r[-1].get("avg_ts") or "") if r else "")'
}
# One timed run, holding BENCH_LOCK when set; prints "t/s load" ("-" for a
# failed run; load: the 1-minute load average when the run ended).
[ -n "${BENCH_LOCK:-}" ] && { exec {LOCK_FD}>>"$BENCH_LOCK" || fail "cannot open $BENCH_LOCK"; }
timed() {
    [ -n "${BENCH_LOCK:-}" ] && flock "$LOCK_FD"
    local v
    v=$("$@")
    echo "${v:--} $(cut -d' ' -f1 /proc/loadavg)"
    [ -n "${BENCH_LOCK:-}" ] && flock -u "$LOCK_FD"
}

stats() { python3 -c '
import statistics, sys
v = [float(x) for x in sys.argv[1:] if x]
print("%7.2f %7.2f %7.2f" % (min(v), statistics.median(v), max(v)) if v else "    n/a     n/a     n/a")' "$@"; }

echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(lscpu | sed -n 's/^Model name: *//p'), $NCPU CPUs; model $(basename "$MODEL"); ISA ${ISA:-native}"
echo "# llama.cpp: $(basename "$(ls -d "$CACHE"/llama_cpp_python-*/ | head -1)") vendored tree; pairs: $PAIRS, run order ds4, then llama.cpp with each --poll of (${POLL_VALUES[*]}), ds4, ..."
printf "%-24s %3s %4s | %-23s | %-23s | %-23s\n" case thr poll "ds4 t/s min/med/max" "llama.cpp min/med/max" "ratio ds4/llama min/med/max"
cases=()
for d in $DECODE_DEPTHS; do cases+=("tg $d"); done
for p in $PREFILLS; do cases+=("pp $p"); done
for c in "${cases[@]}"; do
    set -- $c
    kind=$1 n=$2
    for t in $THREADS; do
        # a[i]: ds4 run of pair i; b[k*PAIRS + i]: llama.cpp with POLL_VALUES[k] in pair i
        a=() b=() LOADS=()
        for ((i = 0; i < PAIRS; i++)); do
            read -r v l <<< "$(timed run_ds4 "$kind" "$n" "$t")"
            a[i]=${v#-} LOADS+=("$l")
            for k in "${!POLL_VALUES[@]}"; do
                read -r v l <<< "$(timed run_llama "$kind" "$n" "$t" "${POLL_VALUES[k]}")"
                b[k * PAIRS + i]=${v#-} LOADS+=("$l")
            done
        done
        label=$([ "$kind" = tg ] && echo "decode @ depth $n" || echo "prefill $n")
        for k in "${!POLL_VALUES[@]}"; do
            y=() r=()
            for ((i = 0; i < PAIRS; i++)); do
                y+=("${b[k * PAIRS + i]}")
                [ -n "${a[i]}" ] && [ -n "${b[k * PAIRS + i]}" ] &&
                    r+=("$(python3 -c "print(${a[i]} / ${b[k * PAIRS + i]})")")
            done
            printf "%-24s %3s %4s | %s | %s | %s\n" "$label" "$t" "${POLL_VALUES[k]}" "$(stats "${a[@]}")" \
                "$(stats "${y[@]}")" "$(stats "${r[@]}")"
            note "pairs (ds4 llama.cpp): $(for ((i = 0; i < PAIRS; i++)); do printf '%s/%s ' "${a[i]:-?}" "${y[i]:-?}"; done)"
        done
        note "$(date -u +%H:%MZ) load average (1 min) at the end of each run, in run order: ${LOADS[*]}"
    done
done
exit 0
