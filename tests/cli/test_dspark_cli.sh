#!/usr/bin/env bash
# ds4 --mtp FILE --dspark (the seed's spelling; --dspark FILE too): the greedy
# continuation dumped with every step's top logprobs is byte-identical with
# and without the block drafter on the demo model (at the default confidence
# and with fixed five-token blocks, either spelling), the run prints its
# drafter line, --dspark-strict decodes target-only without loading the
# file, and bad input is refused with one line: --dspark without a support
# file, a DSpark file given to --mtp without --dspark, two support files, a
# confidence outside 0..1, a support file for another model, a truncated
# one, an MTP file given as DSpark file, an incomplete sidecar. The same
# holds for a drafter in the layout of DeepSeek's released sidecar (MoE
# stages with hyper-connections; a random one for the demo model from
# ds4-make-model --support dspark-sidecar).
# (tests/unit/test_spec.c proves losslessness where drafts are accepted;
# tests/unit/test_dspark.c checks the drafter against its reference.)
set -u
cd "$(dirname "$0")/../.."
status=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; status=1; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
for f in models/demo.gguf models/demo-dspark.gguf models/demo-mtp.gguf models/ds4-tiny.gguf models/ds4-tiny-dspark.gguf; do
    [ -f "$f" ] || { echo "FAIL $f missing (make demo-model tiny-model)"; exit 1; }
done
prompt="Write a Python function that reverses a list."
./ds4 -m models/demo.gguf -p "$prompt" --nothink -n 40 -t 2 --dump-logprobs "$d/ref.json" 2>/dev/null
for conf in 0.9 0; do
  for spelling in "--mtp models/demo-dspark.gguf --dspark" "--dspark models/demo-dspark.gguf"; do
    rm -f "$d/spec.json"
    # shellcheck disable=SC2086
    ./ds4 -m models/demo.gguf -p "$prompt" --nothink -n 40 -t 2 $spelling \
        --dspark-confidence $conf --dump-logprobs "$d/spec.json" 2>"$d/err"
    if [ -s "$d/ref.json" ] && cmp -s "$d/ref.json" "$d/spec.json"; then ok "demo: $spelling --dspark-confidence $conf dumps the same 40 steps"
    else bad "demo: $spelling --dspark-confidence $conf changed the greedy continuation or its logprobs: $(tail -2 "$d/err")"; fi
  done
    grep -q "^ds4: spec dspark: [0-9]* passes, proposed" "$d/err" && ok "demo: the DSpark drafter's line is printed" ||
        bad "demo: no drafter line on stderr: $(cat "$d/err")"
done
# fixed blocks propose five tokens on every pass, the time budget aside
grep -q "by position 1:[0-9]*% 2:[0-9]*% 3:[0-9]*% 4:[0-9]*% 5:[0-9]*%; draft model run on \([0-9]*\) of \1 passes$" "$d/err" &&
    ok "--dspark-confidence 0: five-token blocks" || bad "--dspark-confidence 0: $(grep spec "$d/err")"
# --dspark-strict: target-only, the file is not even opened
rm -f "$d/strict.json"
./ds4 -m models/demo.gguf -p "$prompt" --nothink -n 40 -t 2 --dspark "$d/no-such-file" --dspark-strict \
    --dump-logprobs "$d/strict.json" 2>"$d/err"
cmp -s "$d/ref.json" "$d/strict.json" && ! grep -q "spec dspark" "$d/err" && ok "--dspark-strict: target-only" ||
    bad "--dspark-strict drafted or changed the output: $(tail -2 "$d/err")"
# The trained tiny model with its trained drafter (tools/train-tiny/train_dspark.py):
# the same greedy continuation and logprobs as target-only at fixed blocks and at
# the default confidence, and at fixed blocks a real share of first drafts
# accepted (measured 14% on this answer; the random demo drafter gets 0%).
tiny=(./ds4 -m models/ds4-tiny.gguf -p "Explain Redis streams in one paragraph." --nothink -n 100 -t 2)
"${tiny[@]}" --dump-logprobs "$d/tiny-ref.json" 2>/dev/null
for conf in 0 0.9; do
    rm -f "$d/tiny.json"
    "${tiny[@]}" --mtp models/ds4-tiny-dspark.gguf --dspark --dspark-confidence $conf --dump-logprobs "$d/tiny.json" \
        2>"$d/err"
    cmp -s "$d/tiny-ref.json" "$d/tiny.json" && [ -s "$d/tiny.json" ] &&
        ok "tiny model, trained drafter at confidence $conf: the same 100 steps" ||
        bad "tiny model, trained drafter at confidence $conf changed the output: $(tail -2 "$d/err")"
done
"${tiny[@]}" --mtp models/ds4-tiny-dspark.gguf --dspark --dspark-confidence 0 2>"$d/err" >/dev/null
line=$(grep "spec dspark:" "$d/err")
first=$(printf '%s' "$line" | sed -n 's/.*by position 1:\([0-9]*\)%.*/\1/p')
[ -n "$first" ] && [ "$first" -ge 10 ] && ok "tiny model, fixed blocks: $line" ||
    bad "tiny model, fixed blocks: first drafts accepted ${first:-?}% (want >= 10%): $line"
one_line() {   # what, expected text, command...
    local what=$1 want=$2; shift 2
    local out rc
    out=$("$@" 2>&1); rc=$?
    if [ $rc != 0 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && printf '%s' "$out" | grep -q -- "$want"; then
        ok "$what refused in one line"
    else bad "$what: rc $rc, output: $out"; fi
}
one_line "--dspark with --mtp" "one support file" \
    ./ds4 -m models/demo.gguf -p hi -n 2 --dspark models/demo-dspark.gguf --mtp models/demo-mtp.gguf
one_line "an MTP file beside --dspark FILE" "replaces --mtp" \
    ./ds4 -m models/demo.gguf -p hi -n 2 --mtp models/demo-mtp.gguf --dspark models/demo-dspark.gguf
one_line "--dspark without a support file" "needs the DSpark support file" \
    ./ds4 -m models/demo.gguf -p hi -n 2 --dspark
one_line "a DSpark file to --mtp without --dspark" "add --dspark" \
    ./ds4 -m models/demo.gguf -p hi -n 2 --mtp models/demo-dspark.gguf
for v in 1.5 -0.1 x nan; do
    one_line "--dspark-confidence '$v'" "dspark-confidence" \
        ./ds4 -m models/demo.gguf -p hi -n 2 --dspark models/demo-dspark.gguf --dspark-confidence "$v"
done
one_line "a DSpark file for another model" "not a DSpark file for this model" \
    ./ds4 -m models/demo.gguf -p hi -n 2 --dspark tests/fixtures/ds4tiny/A/dspark/dspark.gguf
one_line "an MTP file as DSpark file" "not a DSpark file for this model" \
    ./ds4 -m models/demo.gguf -p hi -n 2 --dspark models/demo-mtp.gguf
# the released DeepSeek sidecar's layout: the same output, its line, and
# refusals in one line
./ds4-make-model --preset demo --support dspark-sidecar -o "$d/sidecar.gguf" 2>/dev/null
for conf in 0.9 0; do
    rm -f "$d/spec.json"
    ./ds4 -m models/demo.gguf -p "$prompt" --nothink -n 40 -t 2 --mtp "$d/sidecar.gguf" --dspark \
        --dspark-confidence $conf --dump-logprobs "$d/spec.json" 2>"$d/err"
    if [ -s "$d/ref.json" ] && cmp -s "$d/ref.json" "$d/spec.json" && grep -q "^ds4: spec dspark: [0-9]* passes" "$d/err"
    then ok "demo, sidecar layout at --dspark-confidence $conf: the same 40 steps, the drafter's line"
    else bad "demo, sidecar layout at --dspark-confidence $conf: $(tail -2 "$d/err")"; fi
done
one_line "a sidecar to --mtp without --dspark" "add --dspark" \
    ./ds4 -m models/demo.gguf -p hi -n 2 --mtp "$d/sidecar.gguf"
head -c 3000000 "$d/sidecar.gguf" > "$d/sidecar-cut.gguf"
one_line "a truncated sidecar" "--dspark $d/sidecar-cut.gguf" \
    ./ds4 -m models/demo.gguf -p hi -n 2 --dspark "$d/sidecar-cut.gguf"
# arch, keys and a few of its names only (written by gguf-py)
python3 - "$d/released.gguf" <<'PY'
import sys, numpy as np, gguf
w = gguf.GGUFWriter(sys.argv[1], "deepseek4-dspark")
for key, value in (("block_size", 5), ("markov_rank", 8), ("n_layers", 3), ("noise_token_id", 1), ("stage_count", 3)):
    w.add_uint32("dspark." + key, value)
w.add_array("dspark.target_layer_ids", [1, 2, 3])
for name in ("mtp.0.main_proj.weight", "mtp.0.hc_attn_fn.weight", "mtp.2.markov_head.markov_w1.weight",
             "mtp.2.confidence_head.proj.weight"):
    w.add_tensor(name, np.zeros((4, 32), dtype=np.float32))
w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
PY
one_line "an incomplete sidecar" "not a DSpark file for this model" \
    ./ds4 -m models/demo.gguf -p hi -n 2 --mtp "$d/released.gguf" --dspark
head -c 100000 models/demo-dspark.gguf > "$d/cut.gguf"
one_line "a truncated DSpark file" "--dspark $d/cut.gguf" \
    ./ds4 -m models/demo.gguf -p hi -n 2 --dspark "$d/cut.gguf"
exit $status
