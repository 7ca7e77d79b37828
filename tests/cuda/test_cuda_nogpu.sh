#!/usr/bin/env bash
# The CUDA build (make cuda, in $CUDA_BUILD/bin; mk/cuda.mk builds it for
# make test whenever nvcc exists) on a machine or in a process without a GPU:
# --cuda fails fast with one clear line and a non-zero status in ds4,
# ds4-server and ds4-bench (CUDA_VISIBLE_DEVICES= hides any GPU, so this holds
# on GPU machines too), bad GPU options are refused at parse time, and
# without --cuda the CUDA binaries run the CPU backend and print the same
# logits as the CPU-only build.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
BIN=${CUDA_BUILD:-build-cuda}/bin
MODEL=$BUILD/ds4tiny/A-f32.gguf
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

if [ ! -x "$BIN/ds4" ]; then
    echo "FAIL: no CUDA build in $BIN (make test builds it with nvcc; is the CUDA toolkit installed?)"
    exit 1
fi
[ -f "$MODEL" ] || { echo "FAIL: missing $MODEL"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --cuda without a usable GPU: one line, non-zero, no hang (timeout 124 would fail)
for prog in "ds4 --token-ids 1,2" "ds4-server --port 0" "ds4-bench --ctx-start 16 --ctx-max 32"; do
    name=${prog%% *}
    CUDA_VISIBLE_DEVICES= timeout 60 "$BIN"/$prog -m "$MODEL" --cuda >"$tmp/out" 2>"$tmp/err"
    rc=$?
    check "$name --cuda exits non-zero (rc $rc)" '[ $rc -ne 0 ] && [ $rc -ne 124 ]'
    check "$name --cuda says why in one line" '[ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q -- "--cuda: .*CPU backend" "$tmp/err"'
done

# the SSD expert cache feeds the CPU kernels only
"$BIN/ds4" -m "$MODEL" --cuda --ssd-streaming --token-ids 1 >/dev/null 2>"$tmp/err"; rc=$?
check "--cuda with --ssd-streaming refused (rc $rc)" '[ $rc -ne 0 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q -- "--ssd-streaming" "$tmp/err"'

# bad GPU options are refused before loading anything
"$BIN/ds4" -m "$MODEL" --gpu-vram 0 --token-ids 1 >/dev/null 2>"$tmp/err"; rc=$?
check "--gpu-vram 0 refused (rc $rc)" '[ $rc -eq 2 ] && grep -q -- "--gpu-vram" "$tmp/err"'
"$BIN/ds4-server" -m "$MODEL" --gpu-devices 1,1 >/dev/null 2>"$tmp/err"; rc=$?
check "--gpu-devices 1,1 refused (rc $rc)" '[ $rc -eq 2 ] && grep -q -- "--gpu-devices" "$tmp/err"'

# default: the CPU backend, the same logits as the CPU-only build
"$BIN/ds4" -m "$MODEL" --numerics exact --token-ids 5,9,200,31 --dump-logits "$tmp/cuda.json" 2>"$tmp/err"; rc=$?
check "CUDA build without --cuda runs (rc $rc)" '[ $rc -eq 0 ]'
./ds4 -m "$MODEL" --numerics exact --token-ids 5,9,200,31 --dump-logits "$tmp/cpu.json" 2>/dev/null
check "same logits as the CPU build" 'cmp -s "$tmp/cuda.json" "$tmp/cpu.json"'
"$BIN/ds4" -m "$MODEL" --cuda --cpu --numerics exact --token-ids 5,9,200,31 --dump-logits "$tmp/cpu2.json" 2>/dev/null
check "--cpu after --cuda selects the CPU" 'cmp -s "$tmp/cpu2.json" "$tmp/cpu.json"'
exit $fail
