#!/usr/bin/env bash
# The live prefill progress bar of ds4-agent, in a real terminal (tmux) on
# the demo model with scripted output: everything the agent writes to the
# terminal is logged (tmux pipe-pane), so the bar's redraws are seen even
# though it is erased when the prefill ends. With --prefill-chunk 64 a long
# prompt is prefilled in many chunks: the bar shows a partial count after the
# first chunk and the full count at the end, then one summary line. -p with
# stdout going to a file draws no bar (stderr is still the terminal); -p on
# the terminal draws it.
set -u
cd "$(dirname "$0")/../.."
MODEL=models/demo.gguf
[ -f "$MODEL" ] || { echo "agent progress: $MODEL missing (make demo-model)"; exit 1; }
[ -x ./ds4-agent ] || { echo "agent progress: ./ds4-agent missing (make)"; exit 1; }
command -v tmux >/dev/null || { echo "agent progress: tmux missing"; exit 1; }
source tests/tmux_lib.sh

printf 'Read.</think>A long prompt indeed.\n' > "$T/script"
mkdir -p "$T/w"
long="please consider this: $(printf 'alpha beta gamma delta %.0s' $(seq 100))"
run() {   # run NAME LOG COMMAND: COMMAND in a fresh session whose output is logged to LOG
    local old=$W
    W=$S-$1
    tmux new-session -d -s "$W" -x 220 -y 50 "sleep 0.5; $3; echo EXITED-\$?; sleep 600"
    tmux pipe-pane -t "$W" -o "cat >> $2"
    [ "$old" = "$S" ] || tmux kill-session -t "$old"
}
AGENT="HOME=$T ./ds4-agent -m $MODEL --ctx 4096 -t 2 --prefill-chunk 64 --chdir $T/w --sessions-dir $T/s --scripted-output $T/script"
# the bar as drawn: "prefill [####....] DONE/TOTAL tokens  R t/s  ETA Ss"
bar='prefill \[[#.]*\] [0-9]*/[0-9]* tokens'

run tui "$T/tui.log" "$AGENT"
expect "starts" 'wait_for "^agent> " 1 60'
send "$long"
expect "answered" 'wait_for "^A long prompt indeed." 1 90'
send "/quit"
expect "exits" 'wait_for "EXITED-0" 1 60'
grep -ao "$bar" "$T/tui.log" > "$T/bars"
expect "the bar was drawn while prefilling (a partial count)" \
    'awk -F"[ /]" "{ split(\$0, a, \"] \"); split(a[2], c, \"[/ ]\"); if (c[1] + 0 < c[2] + 0) ok = 1 } END { exit !ok }" $T/bars'
expect "and at the end (the full count)" \
    'awk "{ split(\$0, a, \"] \"); split(a[2], c, \"[/ ]\"); if (c[1] == c[2] && c[1] > 64) ok = 1 } END { exit !ok }" $T/bars'
expect "then the summary line" 'wait_for "^\[prefill [0-9]* tokens, .* t/s\]" 1 5'
expect "the bar is erased from the screen" '! screen | grep -q "prefill \[[#.]"'

run file "$T/file.log" "$AGENT -p '$long' > $T/answer.txt"
expect "-p to a file exits 0" 'wait_for "EXITED-0" 1 90'
expect "-p to a file: the answer is in the file" 'grep -q "^A long prompt indeed." $T/answer.txt'
expect "-p to a file: no bar on the terminal" '! grep -aq "$bar" $T/file.log'

run tty "$T/tty.log" "$AGENT -p '$long'"
expect "-p on the terminal exits 0" 'wait_for "EXITED-0" 1 90'
expect "-p on the terminal: the bar is drawn" 'grep -aq "$bar" $T/tty.log'
echo "agent_progress: $((n - fail)) passed, $fail failed"
[ $fail = 0 ]
