#!/usr/bin/env bash
# Drives ds4-agent in a real terminal (tmux, private server) on the demo
# model with scripted model output (--scripted-output): the model reads a
# file, edits it, runs a command and answers. Checks the file on disk, the
# saved transcript bytes, that each step after the first prefilled only its
# new tokens (--trace), that /save + restart + /switch continues with the
# same next-token logits as never stopping (--dump-logits, compared bit for
# bit), /list with a damaged file, /strip, the refusals (paths outside the
# tree, a command past its timeout, a 10 MB read), a tool output over the
# context, the end of a command's jobs and Ctrl+C during a tool.
set -u
cd "$(dirname "$0")/../.."
MODEL=models/demo.gguf
[ -f "$MODEL" ] || { echo "agent: $MODEL missing (make demo-model)"; exit 1; }
[ -x ./ds4-agent ] || { echo "agent: ./ds4-agent missing (make)"; exit 1; }
command -v tmux >/dev/null || { echo "agent: tmux missing"; exit 1; }
source tests/tmux_lib.sh
run_in_new_session() {   # run_in_new_session NAME COMMAND: a fresh screen, then the old one goes
    local old=$W
    W=$S-$1
    tmux new-session -d -s "$W" -x 220 -y 60 "$2; echo EXITED-\$?; sleep 600"
    [ "$old" = "$S" ] || tmux kill-session -t "$old"
    expect "$1 starts" 'wait_for "^agent> " 1 60'
}
start() {   # start NAME WORKDIR SCRIPT [extra flags]
    local name=$1 work=$2 script=$3; shift 3
    run_in_new_session "$name" "HOME=$T ./ds4-agent -m $MODEL --ctx 4096 -t 2 --chdir $work \
        --sessions-dir $T/sessions --scripted-output $script --trace $T/trace-$name $*"
}

D='｜DSML｜'
call() {   # call NAME KEY VALUE [KEY VALUE...]
    local name=$1; shift
    printf '\n\n<%stool_calls>\n<%sinvoke name="%s">\n' "$D" "$D" "$name"
    while [ $# -gt 0 ]; do printf '<%sparameter name="%s" string="true">%s</%sparameter>\n' "$D" "$1" "$2" "$D"; shift 2; done
    printf '</%sinvoke>\n</%stool_calls>' "$D" "$D"
}
turn1() {
    printf 'I should read the file.</think>%s\n@@@\n' "$(call read_file path notes.txt)"
    printf 'Now the edit.</think>%s\n@@@\n' "$(call edit_file path notes.txt old_string 'hello world' new_string 'hello agent')"
    printf 'Check it.</think>%s\n@@@\n' "$(call bash command 'cat notes.txt; echo done')"
    printf 'Done.</think>The greeting now says hello agent.\n@@@\n'
}
turn2() { printf 'Polite.</think>You are welcome.\n@@@\n'; }
turn3() { printf 'More.</think>Here is one more.\n@@@\n'; }
{ turn1; turn2; turn3; } > "$T/script-a"
{ turn1; turn2; } > "$T/script-b"
turn3 > "$T/script-c"
# B and C work in A's directory (reset): the system prompt names it.
mkdir -p "$T/wa"; printf 'hello world\nsecond line\n' > "$T/wa/notes.txt"

# A: three turns in one process
start a "$T/wa" "$T/script-a" --yes --dump-logits "$T/logits-a"
send "fix the greeting"
expect "tool lines" 'wait_for "^-> read_file" 1 90 && wait_for "^-> edit_file" 1 90 && wait_for "^-> bash" 1 90'
expect "diff shown" 'wait_for "^+hello agent" 1 90'
expect "answer streamed" 'wait_for "^The greeting now says hello agent." 1 90'
expect "prefill line" 'wait_for "^\[prefill [0-9]* tokens, .* t/s\]" 4 90'
expect "file edited on disk" '[ "$(cat $T/wa/notes.txt)" = "$(printf "hello agent\nsecond line")" ]'
send "thanks"
expect "turn 2" 'wait_for "^You are welcome." 1 90'
send "/ctx"
expect "/ctx counters" 'wait_for "^context [0-9]*/4096 tokens | restored 0, prefilled" 1 90'
send "one more"
expect "turn 3" 'wait_for "^Here is one more." 1 90'
send "/quit"
expect "A exits" 'wait_for "EXITED-0" 1 90'
expect "autosaved; session, trace and history private" '[ "$(stat -c %a $T/sessions/*.kv $T/trace-a $T/.ds4_agent_history | sort -u)" = 600 ]'
# Every prefill starts where the session ended: nothing is prefilled twice.
expect "each step prefills only new tokens" 'python3 - "$T/trace-a" <<"PY"
import sys
end = 0; steps = 0
for line in open(sys.argv[1]):
    kind, frm, cnt = line.split()
    frm = int(frm.split("=")[1]); cnt = int(cnt.split("=")[1])
    assert frm == end, (line, end)
    end = frm + cnt; steps += 1
assert steps == 12, steps   # turn 1: 4 x (prefill, generate); turns 2, 3: 1 x each
PY'
# The saved text is the exact transcript: user text, sampled DSML, tool results.
expect "transcript bytes" 'python3 - "$T"/sessions/*.kv "$T/script-a" <<"PY"
import struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack_from("<I", raw, 48)[0]
text = raw[52:52 + n].decode()
entries = open(sys.argv[2]).read().split("\n@@@\n")
U, A, E = "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"
body = text[text.index(U):]
want = (U + "fix the greeting" + A + "<think>" + entries[0] + E + U + "<tool_result>hello world\nsecond line\n</tool_result>"
        + A + "<think>" + entries[1] + E)
assert body.startswith(want), body[:len(want)]
rest = body[len(want):]
assert rest.startswith(U + "<tool_result>edited notes.txt at line 1"), rest[:80]
rest = rest[rest.index(A):]
want = A + "<think>" + entries[2] + E + U + "<tool_result>hello agent\nsecond line\ndone\n\n[exit status 0]</tool_result>" + A + "<think>" + entries[3] + E
want += U + "thanks" + A + "<think>" + entries[4] + E + U + "one more" + A + "<think>" + entries[5]
assert rest == want, (rest, want)
PY'
rm -f "$T"/sessions/*.kv

# B: two turns, /save, quit; C: restart, /switch, third turn: same logits as A.
printf 'hello world\nsecond line\n' > "$T/wa/notes.txt"
start b "$T/wa" "$T/script-b" --yes --no-autosave
send "fix the greeting"
expect "B turn 1" 'wait_for "^The greeting now says" 1 90'
send "thanks"
expect "B turn 2" 'wait_for "^You are welcome." 1 90'
send "/save"
expect "/save" 'wait_for "^\[saved session" 1 90'
send "/quit"
expect "B exits" 'wait_for "EXITED-0" 1 90'
ID=$(basename "$T"/sessions/*.kv .kv)
printf 'garbage' > "$T/sessions/0000000000000000000000000000000000000000.kv"
start c "$T/wa" "$T/script-c" --yes --dump-logits "$T/logits-c"
send "/list"
expect "/list: title, tokens" 'wait_for "${ID:0:12}  .* tokens .*fix the greeting" 1 90'
expect "/list: damaged file unreadable" 'wait_for "000000000000  unreadable: " 1 90'
send "/switch ${ID:0:8}"
expect "/switch restores without prefill" 'wait_for "^switched to ${ID:0:12}: [0-9]* tokens, restored from its KV payload" 1 90'
send "one more"
expect "C turn 3" 'wait_for "^Here is one more." 1 90'
send "/quit"
expect "C exits" 'wait_for "EXITED-0" 1 90'
expect "logits after /save + restart + /switch are bit-identical" 'cmp -s "$T/logits-a" "$T/logits-c" && [ -s "$T/logits-a" ]'
expect "C prefilled only the third turn" '[ "$(head -1 $T/trace-c | cut -d" " -f2)" != "from=0" ]'

# /strip, then switching re-prefills the saved text (progress line).
start d "$T/wa" "$T/script-c" --yes
send "/strip ${ID:0:8}"
expect "/strip" 'wait_for "^stripped ${ID:0:12}" 1 90'
send "/list"
expect "/list marks stripped" 'wait_for "(stripped)  fix the greeting" 1 90'
send "/switch ${ID:0:8}"
expect "stripped switch prefills" 'wait_for "^switched to ${ID:0:12}: [0-9]* tokens, rebuilt by prefilling" 1 90 && [ "$(head -1 $T/trace-d | cut -d" " -f1-2)" = "prefill from=0" ]'
send "/del ${ID:0:8}"
expect "/del" 'wait_for "^deleted ${ID:0:12}" 1 90'
send "/quit"
expect "D exits" 'wait_for "EXITED-0" 1 90'

# Refusals: paths outside the tree (absolute, "..", a symlink), a command
# past its (1 s) timeout with a job that left its process group, a 10 MB
# read; a 64 KiB output of NULs (65k tokens, over the 4096 context) is cut
# to fit and the next turn works; jobs a command left running end with the
# agent. The sleeps are named by a length that is this run's own.
M=$((400000 + $$ % 100000))
mkdir -p "$T/we" "$T/outside"
echo secret > "$T/outside.txt"
ln -s "$T/outside" "$T/we/escape"
head -c 10485760 /dev/zero | tr '\0' 'a' > "$T/we/big.txt"
{
    printf 'Outside.</think>%s\n@@@\n' "$(call read_file path /etc/passwd)"
    printf 'Up.</think>%s\n@@@\n' "$(call read_file path ../outside.txt)"
    printf 'Link.</think>%s\n@@@\n' "$(call write_file path escape/x.txt content pwned)"
    printf 'Slow.</think>%s\n@@@\n' "$(call bash command "setsid sleep $M &amp; sleep 30")"
    printf 'Big.</think>%s\n@@@\n' "$(call read_file path big.txt)"
    printf 'Zeros.</think>%s\n@@@\n' "$(call bash command 'head -c 65536 /dev/zero')"
    printf 'Jobs.</think>%s\n@@@\n' "$(call bash command "setsid sleep $((M + 1)) &amp; sleep $((M + 2)) &amp; echo started")"
    printf 'Gave up.</think>Nothing worked.\n@@@\n'
    printf 'Still.</think>Still here.\n@@@\n'
} > "$T/script-e"
start e "$T/we" "$T/script-e" --yes --bash-timeout 1 --no-autosave
send "try things"
expect "outside paths refused without asking" 'wait_for "^-> read_file .*outside the working directory .*(refused" 2 90 &&
    wait_for "^-> write_file .*outside the working directory .*(refused" 1 90 && ! screen | grep -q "Allow?"'
expect "nothing written outside" '[ ! -e "$T/outside/x.txt" ]'
expect "timeout kills the command" 'wait_for "^-> bash .*timed out after 1 s (killed)" 1 90'
expect "10 MB read refused" 'wait_for "^-> read_file .*10485760 bytes, over the" 1 90'
expect "64 KiB of NULs cut to fit" 'wait_for "^-> bash .*65552 bytes of output (cut to [0-9]* tokens to fit the context)" 1 90'
expect "answer after refusals" 'wait_for "^Nothing worked." 1 90'
expect "the setsid job of the timed-out command is gone" '! pgrep -f "sleep $M\$" >/dev/null'
# (a loaded machine may take a while to exec them: look for up to 10 s)
jobs_up() { pgrep -f "sleep $((M + 1))\$" >/dev/null && pgrep -f "sleep $((M + 2))\$" >/dev/null; }
expect "jobs of a finished command run on" 'for i in $(seq 100); do jobs_up && break; sleep 0.1; done; jobs_up'
send "and now?"
expect "the turn after the big output works" 'wait_for "^Still here." 1 90'
send "/quit"
expect "E exits" 'wait_for "EXITED-0" 1 90'
expect "no job outlives the agent" '! pgrep -f "sleep $((M + 1))\$" >/dev/null && ! pgrep -f "sleep $((M + 2))\$" >/dev/null'

# Ctrl+C during a tool, in a session of its own: under E's 1 s timeout the
# Ctrl+C had to arrive within a second of the tool line showing, or the
# timeout killed the command first. Here no timeout can end it: only the
# Ctrl+C does. The command is named after this run, so another run's (a
# parallel make test) is not taken for ours.
{
    printf 'Again.</think>%s\n@@@\n' "$(call bash command "sleep 300; echo late-$S")"
    printf 'Ok.</think>Stopped.\n@@@\n'
} > "$T/script-g"
start g "$T/we" "$T/script-g" --yes --bash-timeout 86400 --no-autosave
send "again"
expect "slow command runs" 'wait_for "^-> bash {\"command\":\"sleep 300" 1 20'
tmux send-keys -t "$W" C-c
expect "Ctrl+C kills the tool" 'wait_for "interrupted (killed)" 1 90'
expect "prompt back after Ctrl+C" 'wait_for "^agent> " 2 90'
send "go on"
expect "session consistent after Ctrl+C" 'wait_for "^Stopped." 1 90'
send "/quit"
expect "G exits" 'wait_for "EXITED-0" 1 90'
expect "no sleeping child left" '! pgrep -f "sleep 300; echo late-$S" >/dev/null'

# Ctrl+C during sampling (the demo model's random text never ends): the
# message keeps what was written and the next one follows it. The Ctrl+C
# goes once sampled text is on the screen; the context (64k tokens) is far
# more than any machine samples in that moment, where a fixed pause assumed
# the machine's speed (it must not fill the context first).
run_in_new_session f "HOME=$T ./ds4-agent -m $MODEL --ctx 65536 -t 2 --chdir $T/we --nothink \
    --sessions-dir $T/sessions --no-autosave -n 100000 --trace $T/trace-f"
send "write forever"
expect "F prefills" 'wait_for "^\[prefill" 1 90'
expect "F samples" 'wait_for_output_after "[prefill" 60'
tmux send-keys -t "$W" C-c
expect "Ctrl+C stops generation" 'wait_for "^\[interrupted\]" 1 60'
expect "prompt back" 'wait_for "^agent> " 2 30'
send "/ctx"
expect "counters consistent after Ctrl+C" 'wait_for "^context [0-9]*/65536 tokens" 1 30 && screen | python3 -c "
import re, sys
m = [l for l in sys.stdin if l.startswith(\"context \")][-1]
n, restored, pre, gen = map(int, re.search(r\"context (\\d+)/.*restored (\\d+), prefilled (\\d+), generated (\\d+)\", m).groups())
assert gen > 0 and n == restored + pre + gen, m"'
send "/quit"
expect "F exits" 'wait_for "EXITED-0" 1 60'
echo "agent_tmux: $((n-fail)) passed, $fail failed"
[ $fail = 0 ]
