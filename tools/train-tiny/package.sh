#!/usr/bin/env bash
# Turns a training checkpoint into the committed model files (docs/tiny-model.md):
#   data/ds4-tiny/ds4-tiny-q8_0.gguf.xz   the GGUF `make demo` unpacks (q8_0 mix)
#   data/ds4-tiny/config.json             the transformers config of the checkpoint
#   data/ds4-tiny/mtp.safetensors         its MTP block (mtp.0.*, BF16), which the GGUF has no place for
#   tests/fixtures/ds4-tiny/golden.json   PyTorch's float32 logits of a fixed prompt
#   tests/fixtures/ds4-tiny/long/         the same over 512 tokens, for the committed weights in f32
# and checks the engine against PyTorch on the way (f32: float tolerance).
#   PY=.train-venv/bin/python tools/train-tiny/package.sh [CKPT] [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.train-venv/bin/python}
CKPT=${1:-build/train-tiny/ckpt.pt}
W=${2:-build/train-tiny}
VOCAB=(--vocab data/deepseek-v3-tokenizer.json --vocab-added tests/fixtures/tokenizer/v4-added-tokens.json)
$PY tools/train-tiny/export.py "$CKPT" "$W/hf" ${EVAL_TEXT:-}
for t in f32 q8_0; do
    ./ds4-convert "$W/hf" "$W/ds4-tiny-$t.gguf" --type $t "${VOCAB[@]}" --name ds4-tiny --threads 1 > "$W/convert-$t.log"
done
$PY tools/train-tiny/check_engine.py "$W/ds4-tiny-f32.gguf" "$W/hf/golden.json" --tol 1e-5
$PY tools/train-tiny/check_engine.py "$W/ds4-tiny-q8_0.gguf" "$W/hf/golden.json" --tol 1
mkdir -p data/ds4-tiny tests/fixtures/ds4-tiny
xz -T1 -9 -c "$W/ds4-tiny-q8_0.gguf" > data/ds4-tiny/ds4-tiny-q8_0.gguf.xz
cp "$W/hf/config.json" data/ds4-tiny/config.json
$PY - "$W/hf/model.safetensors" data/ds4-tiny/mtp.safetensors <<'PY'
import sys
from safetensors.torch import load_file, save_file
st = load_file(sys.argv[1])
save_file({k: v for k, v in st.items() if k.startswith("mtp.")}, sys.argv[2], metadata={"format": "pt"})
PY
cp "$W/hf/golden.json" tests/fixtures/ds4-tiny/golden.json
# the 512-token f32 reference of the committed q8_0 weights (test_tiny_exact.py)
$PY tools/train-tiny/compact_gguf.py "$W/ds4-tiny-q8_0.gguf" "$W/compact-f32.gguf" "$W/compact-ids.json"
$PY tools/train-tiny/golden_long.py "$W/compact-f32.gguf" "$W/compact-ids.json" tests/fixtures/ds4-tiny/long
ls -la data/ds4-tiny tests/fixtures/ds4-tiny
