#!/usr/bin/env bash
# Drives ds4-eval's split-screen view in a real terminal (tmux, private
# server) on the demo model, as a person would: the question list and the
# live token stream show; p pauses (no token is generated while paused, by
# the trace) and resumes; Down + Enter makes q4 the next question instead
# of q2; Up back to the finished q1 shows its verdict; q stops the run and the report lands on the normal screen with the
# stopped question marked STOP and the never-run ones SKIP.
set -u
cd "$(dirname "$0")/../.."
MODEL=models/demo.gguf
[ -f "$MODEL" ] || { echo "eval tmux: $MODEL missing (make models/demo.gguf)"; exit 1; }
[ -x ./ds4-eval ] || { echo "eval tmux: ./ds4-eval missing (make)"; exit 1; }
command -v tmux >/dev/null || { echo "eval tmux: tmux missing"; exit 77; }
source tests/tmux_lib.sh
key() { tmux send-keys -t "$W" "$@"; }
tokens() { local c; c=$(grep -c '"tok":' "$T/trace" 2>/dev/null); echo "${c:-0}"; }
prompts() { grep -o '^{"q":[0-9]*,"category"' "$T/trace" | grep -o '[0-9]*' | tr '\n' ' '; }

tmux new-session -d -s "$W" -x 160 -y 30 \
    "./ds4-eval -m $MODEL -t 2 --questions 1-6 --tokens 1500 --temp 0 --seed 1 --trace $T/trace; echo EXITED-\$?; sleep 600"
expect "view drawn" 'wait_for "ds4-eval  0/6 done" 1 60'
expect "q1 running" 'wait_for "running q1 (mc)" 1 60'
expect "q1 generating" 'for i in $(seq 100); do [ "$(tokens)" -gt 0 ] && break; sleep 0.1; done; [ "$(tokens)" -gt 0 ]'
key p
expect "paused" 'wait_for "PAUSED" 1 10'
expect "list shows the questions" 'wait_for "^  q6   math" 1 10'
before=$(tokens); sleep 1; after=$(tokens)
expect "no token while paused ($before, $after)" '[ "$before" = "$after" ] && [ "$before" -gt 0 ]'
expect "the stream shows the reply so far" '[ "$(screen | grep -c " | [^ ]")" -gt 0 ]'
key Down; key Down; key Down; key Enter
expect "q4 queued" 'wait_for "^> q4   sec" 1 10'
key p
expect "resumed" 'for i in $(seq 100); do [ "$(tokens)" -gt "$after" ] && break; sleep 0.1; done; [ "$(tokens)" -gt "$after" ]'
expect "q4 runs second" 'wait_for "running q4 (sec)" 1 120'
expect "q1 graded in the list" 'wait_for "^  q1   mc   \(PASS\|FAIL\)" 1 10'
key Up; key Up; key Up
expect "Up selects q1: its reply and verdict" 'wait_for "^ q1 (mc): \(PASS\|FAIL\), answer .*, expected B, [0-9]* tokens" 1 10'
key q
expect "exits 0" 'wait_for "EXITED-0" 1 60'
expect "trace order q1 then q4" '[ "$(prompts)" = "1 4 " ]'
expect "report on the normal screen" 'wait_for "^overall " 1 5 && ! screen | grep -q "p pause  q quit"'
expect "q1 graded, q4 stopped, q2 skipped" 'screen | grep -q "^q1 .* \(PASS\|FAIL\) " && screen | grep -q "^q4 .* STOP " && screen | grep -q "^q2 .* SKIP "'
echo "test_eval_tmux: $((n-fail)) passed, $fail failed"
[ $fail = 0 ]
