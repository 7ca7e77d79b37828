#!/usr/bin/env bash
# The quality cost of quantizing the tiny model (docs/tiny-model.md): each mix
# of ds4-convert, without and with an imatrix (imatrix.py), against PyTorch's
# float32 logits of a held-out sequence (export.py's golden-eval.json):
# relative max logit error, argmax agreement, mean KL divergence.
#   PY=.train-venv/bin/python tools/train-tiny/quant.sh [WORK_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.train-venv/bin/python}
W=${1:-build/train-tiny}
VOCAB=(--vocab data/deepseek-v3-tokenizer.json --vocab-added tests/fixtures/tokenizer/v4-added-tokens.json)
for t in f32 q8_0 q4 q2; do
    for im in "" imatrix; do
        [ -n "$im" ] && { [ "$t" = f32 ] || [ "$t" = q8_0 ]; } && continue
        out="$W/quant-$t${im:+-imatrix}.gguf"
        ./ds4-convert "$W/hf" "$out" --type $t "${VOCAB[@]}" --threads 1 ${im:+--imatrix "$W/imatrix.dat"} > "$out.log" 2>&1
        printf '%-14s %5.1f MB  ' "$t${im:+ +imatrix}" "$(echo "$(stat -c %s "$out") / 1000000" | bc -l)"
        $PY tools/train-tiny/check_engine.py "$out" "$W/hf/golden-eval.json" --tol 1 | sed 's/^[^:]*: //'
        rm -f "$out"
    done
done
