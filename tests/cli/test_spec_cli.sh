#!/usr/bin/env bash
# ds4 --spec-lookup: the greedy continuation dumped with every step's top
# logprobs is byte-identical with and without the drafter on the demo model,
# the run prints its drafter line, and bad values are refused with one line.
# (tests/unit/test_spec.c proves losslessness where drafts are accepted.)
set -u
cd "$(dirname "$0")/../.."
status=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; status=1; }
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
[ -f models/demo.gguf ] || { echo "FAIL models/demo.gguf missing (make demo-model)"; exit 1; }
prompt="def f(x):\n    return x + 1\n\ndef g(x):\n    return x + 1\n\ndef f(x):\n    return"
for draft in 3 8; do
    rm -f "$d/ref.json" "$d/spec.json"
    ./ds4 -m models/demo.gguf -p "$prompt" --nothink -n 60 -t 2 --dump-logprobs "$d/ref.json" 2>/dev/null
    ./ds4 -m models/demo.gguf -p "$prompt" --nothink -n 60 -t 2 --spec-lookup $draft --dump-logprobs "$d/spec.json" 2>"$d/err"
    if [ -s "$d/ref.json" ] && cmp -s "$d/ref.json" "$d/spec.json"; then ok "demo: --spec-lookup $draft dumps the same 60 steps"
    else bad "demo: --spec-lookup $draft changed the greedy continuation or its logprobs"; fi
    grep -q "^ds4: spec lookup: [0-9]* passes, proposed" "$d/err" && ok "demo: the drafter's line is printed" ||
        bad "demo: no drafter line on stderr: $(cat "$d/err")"
done
# --quality wins over a drafter: the same output and no drafter line
rm -f "$d/q.json"
./ds4 -m models/demo.gguf -p "$prompt" --nothink -n 60 -t 2 --spec-lookup 8 --quality --dump-logprobs "$d/q.json" 2>"$d/err"
cmp -s "$d/ref.json" "$d/q.json" && ! grep -q "spec lookup" "$d/err" && ok "--quality: target-only, no drafter line" ||
    bad "--quality still drafted or changed the output: $(grep spec "$d/err")"
for v in 17 -1 x ""; do
    out=$(./ds4 -m models/demo.gguf -p hi --spec-lookup "$v" 2>&1); rc=$?
    [ $rc = 2 ] && [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] && ok "--spec-lookup '$v' refused in one line" ||
        bad "--spec-lookup '$v': rc $rc, output: $out"
done
exit $status
