#!/usr/bin/env bash
# gpu-check.sh -- the CUDA backend's whole check on a GPU machine, as one call
# (under 8 minutes on one H200; every step has its own time limit, so the
# script always finishes and says which steps did not). Writes to $OUT:
#   gpu-check.log   everything printed
#   gpu-check.csv   step,status,seconds,detail  (one row per step and per bench frontier)
#   ops.txt         cuda-ops: per-op errors and tolerances
# Steps: machine facts; CPU build + the converted oracle models; make cuda
# (CUDA_ARCH, default sm_90a: Hopper's own instructions; a fat build would
# only cost time here); the per-op check; whole-model checks on the
# transformers fixtures (--numerics exact, f32 against the golden logits,
# f16/q8_0 CUDA against CPU) and with ds4 numerics; a Flash-shaped model
# (4 of 43 layers, Flash's per-layer shapes and q2 mix, random weights) made
# with ds4-make-model; CPU-vs-CUDA logits on it; ds4-bench decode at ctx
# 512/8k/32k and prefill of 512 and 4096-token chunks.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/ds4-gpu-check}
JOBS=${JOBS:-16}
ARCH=${CUDA_ARCH:-sm_90a}
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

step machine 30 bash -c 'nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv; nvcc --version | tail -1; nproc'
step build-cpu 120 make -j"$JOBS" all
step build-cuda 180 make -j"$JOBS" cuda CUDA_ARCH="$ARCH" CUDA_PTX= BIN=build-cuda/bin/ || { echo "no CUDA build: stopping"; exit 1; }
step oracle-models 60 make -j"$JOBS" build/ds4tiny/A-f32.gguf build/ds4tiny/A-f16.gguf build/ds4tiny/A-q8_0.gguf \
    build/ds4tiny/B-f32.gguf build/ds4tiny/B-f16.gguf build/ds4tiny/B-q8_0.gguf

step ops 120 bash -c "build-cuda/cuda-ops | tee '$OUT/ops.txt'"

for m in A B; do
    step "oracle-$m-f32-exact" 60 build-cuda/cuda-ops --numerics exact --tol 2e-5 \
        --gold "tests/fixtures/ds4tiny/$m" --model "build/ds4tiny/$m-f32.gguf"
    step "oracle-$m-f16-exact" 60 build-cuda/cuda-ops --numerics exact --tol 2e-5 --model "build/ds4tiny/$m-f16.gguf"
    step "oracle-$m-q8_0-exact" 60 build-cuda/cuda-ops --numerics exact --tol 1e-3 --model "build/ds4tiny/$m-q8_0.gguf"
    step "oracle-$m-f32-ds4numerics" 60 build-cuda/cuda-ops --numerics ds4 --model "build/ds4tiny/$m-f32.gguf"
done

FLASH=$MODEL_DIR/flash4.gguf
if [ ! -f "$FLASH" ]; then
    # ds4-make-model's random-blocks mode writes valid random quantized blocks
    # directly (fast); without it the tool quantizes random floats (slow).
    if ./ds4-make-model --help 2>&1 | grep -q -- "--random-blocks"; then
        step flash-model 120 ./ds4-make-model --preset flash --layers 4 --random-blocks -o "$FLASH.part"
    else
        echo "ds4-make-model has no --random-blocks mode here: quantizing random floats (--preset flash --layers 4)"
        step flash-model 240 ./ds4-make-model --preset flash --layers 4 -o "$FLASH.part"
    fi && mv "$FLASH.part" "$FLASH"
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
        step "bench-$f" "$lim" bash -c "build-cuda/bin/ds4-bench -m '$FLASH' --cuda --ctx-start $f --ctx-max $f \
            --gen-tokens 32 --prefill-chunk $chunk | tee '$OUT/bench-$f.csv'"
        row=$(tail -1 "$OUT/bench-$f.csv" 2>/dev/null | grep -E '^[0-9]')
        [ -n "$row" ] && echo "bench-row-$f,ok,0,$row" >> "$CSV"
    done
fi
echo "total $((SECONDS - t_start))s; results in $CSV"
