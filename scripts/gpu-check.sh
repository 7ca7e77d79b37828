#!/usr/bin/env bash
# gpu-check.sh -- the CUDA backend's whole check on a GPU machine, as one call
# (under 8 minutes on one H200; every step has its own time limit, so the
# script always finishes and says which steps did not). Writes to $OUT:
#   gpu-check.log   everything printed
#   gpu-check.csv   step,status,seconds,detail  (one row per step and per bench frontier)
#   ops.txt         cuda-ops: per-op errors and tolerances
#
#   scripts/gpu-check.sh --prepare   on a build machine: make cuda for Hopper
#       (CUDA_ARCH, default sm_90a) and copy the binaries' non-core shared
#       libraries (cJSON, PCRE2, libedit and theirs) into build-cuda/lib, so
#       a GPU machine whose image lacks them (nothing can be installed there)
#       can run the build as carried.
#   scripts/gpu-check.sh             on the GPU machine: uses build-cuda as
#       carried when its binaries start there, else builds (make -j16 cuda).
#       Carry build-cuda/bin, build-cuda/cuda-ops and build-cuda/lib (~20 MB
#       for sm_90a); the fixtures and data/ travel with the working tree.
#
# Steps: machine facts; the build; the per-op check; the transformers oracle
# models converted there (tests/fixtures/ds4tiny) and checked with --numerics
# exact (f32 against the golden logits, f16/q8_0 CUDA against CPU) and with
# ds4 numerics; a Flash-shaped model (4 of 43 layers, Flash's per-layer
# shapes and q2 mix, random weights) made with ds4-make-model; CPU-vs-CUDA
# logits on it; ds4-bench decode at ctx 512/8k/32k and prefill of 512 and
# 4096-token chunks.
set -u
cd "$(dirname "$0")/.."
ARCH=${CUDA_ARCH:-sm_90a}
B=build-cuda/bin
if [ "${1:-}" = --prepare ]; then
    make -j"${JOBS:-2}" cuda CUDA_ARCH="$ARCH" CUDA_PTX= BIN=$B/ || exit 1
    mkdir -p build-cuda/lib
    ldd $B/ds4 build-cuda/cuda-ops | awk '/=> \// {print $3}' | sort -u |
        grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' |
        xargs -r cp -L -t build-cuda/lib
    ls build-cuda/lib
    exit 0
fi
export LD_LIBRARY_PATH=$PWD/build-cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
OUT=${OUT:-/tmp/ds4-gpu-check}
JOBS=${JOBS:-16}
MODEL_DIR=${MODEL_DIR:-/tmp/ds4-gpu-check-models}
mkdir -p "$OUT" "$MODEL_DIR"
LOG=$OUT/gpu-check.log
CSV=$OUT/gpu-check.csv
exec > >(tee "$LOG") 2>&1
echo "step,status,seconds,detail" > "$CSV"
t_start=$SECONDS

# step NAME LIMIT_S CMD...: runs CMD under a time limit, records the outcome.
step() {
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "== $name (limit ${limit}s): $*"
    timeout "$limit" "$@"
    local rc=$? status=ok
    [ $rc -eq 124 ] && status=timeout
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && status="failed($rc)"
    echo "$name,$status,$((SECONDS - t0))," >> "$CSV"
    echo "== $name: $status in $((SECONDS - t0))s"
    return $rc
}

step machine 30 bash -c 'nproc; nvcc --version | tail -1; nvidia-smi -L &&
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv'
if [ -x $B/ds4 ] && [ -x build-cuda/cuda-ops ] && $B/ds4 --help >/dev/null 2>&1; then
    echo "using the carried build in build-cuda"
    echo "build-cuda,carried,0," >> "$CSV"
else
    step build-cuda 240 make -j"$JOBS" cuda CUDA_ARCH="$ARCH" CUDA_PTX= BIN=$B/ || { echo "no CUDA build: stopping"; exit 1; }
fi
TINY=$MODEL_DIR/ds4tiny
mkdir -p "$TINY"
for m in A B; do
    for t in f32 f16 q8_0; do
        [ -f "$TINY/$m-$t.gguf" ] || step "convert-$m-$t" 60 $B/ds4-convert "tests/fixtures/ds4tiny/$m" \
            "$TINY/$m-$t.gguf" --type $t --name "ds4tiny-$m"
    done
done

step ops 120 bash -o pipefail -c "build-cuda/cuda-ops | tee '$OUT/ops.txt'"

for m in A B; do
    step "oracle-$m-f32-exact" 60 build-cuda/cuda-ops --numerics exact --tol 2e-5 \
        --gold "tests/fixtures/ds4tiny/$m" --model "$TINY/$m-f32.gguf"
    step "oracle-$m-f16-exact" 60 build-cuda/cuda-ops --numerics exact --tol 2e-5 --model "$TINY/$m-f16.gguf"
    step "oracle-$m-q8_0-exact" 60 build-cuda/cuda-ops --numerics exact --tol 1e-3 --model "$TINY/$m-q8_0.gguf"
    step "oracle-$m-f32-ds4numerics" 60 build-cuda/cuda-ops --numerics ds4 --model "$TINY/$m-f32.gguf"
done

FLASH=$MODEL_DIR/flash4.gguf
if [ ! -f "$FLASH" ]; then
    # ds4-make-model fills quantized tensors with random valid blocks (seconds for GBs)
    step flash-model 120 $B/ds4-make-model --preset flash --layers 4 -o "$FLASH.part" &&
        mv "$FLASH.part" "$FLASH"
fi
if [ -f "$FLASH" ]; then
    step flash-cpu-vs-cuda 120 build-cuda/cuda-ops --tokens 24 --model "$FLASH"
    # bench: one frontier per run; decode tokens/s at the frontier, prefill
    # tokens/s with the frontier as one chunk (512, 4096)
    for f in 512 4096 8192 32768; do
        left=$((470 - (SECONDS - t_start)))
        [ $left -lt 20 ] && { echo "bench-$f,skipped(time),0," >> "$CSV"; continue; }
        lim=$((left < 150 ? left : 150))
        chunk=$((f < 4096 ? f : 4096))
        step "bench-$f" "$lim" bash -o pipefail -c "$B/ds4-bench -m '$FLASH' --cuda --ctx-start $f --ctx-max $f \
            --gen-tokens 32 --prefill-chunk $chunk | tee '$OUT/bench-$f.csv'"
        row=$(tail -1 "$OUT/bench-$f.csv" 2>/dev/null | grep -E '^[0-9]')
        [ -n "$row" ] && echo "bench-row-$f,ok,0,$row" >> "$CSV"
    done
fi
echo "total $((SECONDS - t_start))s; results in $CSV"
