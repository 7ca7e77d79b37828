#!/usr/bin/env bash
# Drives the interactive CLI as a person would, in a real terminal (tmux):
# help, mode switches, two turns of a conversation on the live KV, Ctrl+C in
# the middle of a long generation (must return to the prompt, and the next
# turn must still work), /read, /ctx, and /quit. Uses the random-weight demo
# model, so only the behaviour is checked, never the text.
set -u
cd "$(dirname "$0")/../.."
MODEL=models/demo.gguf
[ -f "$MODEL" ] || { echo "repl: $MODEL missing (make demo-model)"; exit 1; }
command -v tmux >/dev/null || { echo "repl: tmux missing"; exit 1; }
source tests/tmux_lib.sh

printf 'Summarise this file.\n' > "$T/note.txt"
# Short answers for the conversation turns (random weights rarely emit EOS).
tmux new-session -d -s "$S" -x 200 -y 50 "HOME=$T ./ds4 -m $MODEL --ctx 4096 -n 24 -t 2 --temp 0; echo EXITED-\$?; sleep 30"
expect "banner and prompt" 'wait_for "^ds4> " 1 60'
send "/help"
expect "help lists commands" 'wait_for "/think-max" 1 10'
send "/nothink"
expect "nothink acknowledged" 'wait_for "non-thinking mode" 1 10'
send "hello there"
expect "first turn generates and reports speed" 'wait_for "generation: 24 tokens" 1 60'
send "and a second question"
expect "second turn reuses the session" 'wait_for "generation: 24 tokens" 2 60'
send "/ctx 8192"
expect "ctx switch" 'wait_for "context 8192 tokens" 1 20'
send "/read $T/note.txt"
expect "/read runs a turn" 'wait_for "generation: 24 tokens" 3 60'
send "/think"
expect "think acknowledged" 'wait_for "^thinking mode" 1 10'
send "/quit"
expect "quit exits cleanly" 'wait_for "EXITED-0" 1 20'
expect "history saved" 'grep -q "second" "$T/.ds4_history"'

# Ctrl+C in the middle of an unbounded generation returns to the prompt and
# the conversation goes on. --ignore-eos keeps it unbounded: the random
# demo model samples its end-of-sequence token now and then, and a turn that
# ended before the Ctrl+C would leave nothing to interrupt. The Ctrl+C goes
# as soon as the answer has begun, and the context (64k tokens) is far more
# than any machine generates in that moment: a fixed wait would assume the
# machine's speed (4 s filled a 4096-token context at 1000 tokens/s). The
# second run gets its own session, created before the first one is killed
# (tmux_lib: the server must not run out of sessions in between).
W=$S-second
tmux new-session -d -s "$W" -x 200 -y 50 "HOME=$T ./ds4 -m $MODEL --ctx 65536 -n 100000 --ignore-eos -t 2 --nothink; echo EXITED-\$?; sleep 30"
tmux kill-session -t "$S"
expect "second run prompt" 'wait_for "^ds4> " 1 60'
send "write a very long story"
expect "the story begins" 'wait_for_output_after "ds4> write a very long story" 60'
tmux send-keys -t "$W" C-c
expect "Ctrl+C interrupts generation" 'wait_for "^\[interrupted\]" 1 20'
expect "prompt returns after Ctrl+C" 'wait_for "^ds4> " 2 15'
tmux send-keys -t "$W" C-c
# still there: the REPL answers a command after it (an event, not a pause)
send "/nothink"
expect "Ctrl+C at the prompt keeps the REPL" 'wait_for "^non-thinking mode" 1 20 && ! screen | grep -q EXITED'
send "/quit"
expect "quit after interrupt" 'wait_for "EXITED-0" 1 20'
echo "repl_tmux: $((n-fail)) passed, $fail failed"
[ $fail = 0 ]
