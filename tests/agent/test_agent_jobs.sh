#!/usr/bin/env bash
# Background shell jobs in ds4-agent, driven in a real terminal (tmux) on the
# demo model with scripted model output: the model starts an output-producing
# job and a quiet one (bash with background true; each asks first, as a
# command does), waits for the first to write, lists them (job_list), reads
# the first one's output tail (job_output), stops the second (job_stop); /jobs
# shows their states; the stopped job's processes are gone at once, and the
# running one's when the agent exits.
set -u
cd "$(dirname "$0")/../.."
MODEL=models/demo.gguf
[ -f "$MODEL" ] || { echo "agent jobs: $MODEL missing (make demo-model)"; exit 1; }
[ -x ./ds4-agent ] || { echo "agent jobs: ./ds4-agent missing (make)"; exit 1; }
command -v tmux >/dev/null || { echo "agent jobs: tmux missing"; exit 1; }
source tests/tmux_lib.sh

D='｜DSML｜'
call() {   # call NAME KEY VALUE [KEY VALUE...]: string parameters
    local name=$1; shift
    printf '\n\n<%stool_calls>\n<%sinvoke name="%s">\n' "$D" "$D" "$name"
    while [ $# -gt 0 ]; do printf '<%sparameter name="%s" string="true">%s</%sparameter>\n' "$D" "$1" "$2" "$D"; shift 2; done
    printf '</%sinvoke>\n</%stool_calls>' "$D" "$D"
}
bg_call() {   # bg_call COMMAND: bash with background true (a JSON parameter)
    printf '\n\n<%stool_calls>\n<%sinvoke name="bash">\n' "$D" "$D"
    printf '<%sparameter name="command" string="true">%s</%sparameter>\n' "$D" "$1" "$D"
    printf '<%sparameter name="background" string="false">true</%sparameter>\n' "$D" "$D"
    printf '</%sinvoke>\n</%stool_calls>' "$D" "$D"
}
# sleep arguments no other process has: how the test finds the jobs' processes
A=7$$1 B=7$$2
{
    printf 'Start the ticker.</think>%s\n@@@\n' "$(bg_call "for i in 1 2 3; do echo tick-\$i; done; touch ready.flag; sleep $A")"
    printf 'And a quiet one.</think>%s\n@@@\n' "$(bg_call "sleep $B")"
    printf 'Wait for it.</think>%s\n@@@\n' "$(call bash command 'while [ ! -e ready.flag ]; do sleep 0.05; done; echo flag-seen')"
    printf 'List.</think>%s\n@@@\n' "$(call job_list)"
    printf 'Its output.</think>%s\n@@@\n' "$(call job_output id 1 lines 2)"
    printf 'Stop the quiet one.</think>%s\n@@@\n' "$(call job_stop id 2)"
    printf 'Done.</think>The ticker runs; the quiet job is stopped.\n@@@\n'
} > "$T/script"
mkdir -p "$T/w"
tmux new-session -d -s "$W" -x 220 -y 60 "HOME=$T ./ds4-agent -m $MODEL --ctx 8192 -t 2 --chdir $T/w \
    --sessions-dir $T/s --scripted-output $T/script; echo EXITED-\$?; sleep 600"
expect "starts" 'wait_for "^agent> " 1 60'
send "start the jobs"
expect "asks before starting the first job" 'wait_for "run in the background .for i in 1 2 3" 1 90'
send "y"
expect "first job started" 'wait_for "background job 1 started (pid [0-9]*)" 1 90'
expect "asks before the second" 'wait_for "run in the background .sleep $B.?" 1 90'
send "y"
expect "second job started" 'wait_for "background job 2 started" 1 90'
expect "asks before the wait command" 'wait_for "run .while" 1 90'
send "y"
expect "the turn ends" 'wait_for "^The ticker runs; the quiet job is stopped." 1 90'
expect "job_list, job_output and job_stop ran" \
    'wait_for "^-> job_list .*2 background jobs" 1 5 && wait_for "^-> job_output .*job 1 running" 1 5 && wait_for "^-> job_stop .*job 2 stopped" 1 5'
expect "the stopped job's process is gone" '! pgrep -f "sleep $B" >/dev/null'
expect "the running job's process is alive" 'pgrep -f "sleep $A" >/dev/null'
send "/jobs"
expect "/jobs: job 1 running" 'wait_for "^job 1: running for [0-9]* s, pid [0-9]*: for i in 1 2 3" 1 30'
expect "/jobs: job 2 ended by SIGTERM" 'wait_for "^job 2: killed by signal 15 after [0-9]* s, pid [0-9]*: sleep $B" 1 30'
send "/save"
expect "saved" 'wait_for "^\[saved session" 1 30'
# what the model was told, from the saved transcript
expect "job_list told the model both jobs run" \
    'grep -aq "job 1: running for [0-9]* s, pid [0-9]*: for i in 1 2 3" $T/s/*.kv && grep -aq "job 2: running for [0-9]* s, pid [0-9]*: sleep $B" $T/s/*.kv'
expect "job_output gave the last 2 lines of job 1's output" \
    'grep -aqz "its last lines (at most 2):\].tick-2.tick-3.</tool_result>" $T/s/*.kv'
expect "job_stop reported the end" 'grep -aq "job 2: killed by signal 15 after" $T/s/*.kv'
send "/quit"
expect "exits" 'wait_for "EXITED-0" 1 60'
expect "no job process left after the agent exits" '! pgrep -f "sleep $A" >/dev/null && ! pgrep -f "sleep $B" >/dev/null'
echo "agent_jobs: $((n - fail)) passed, $fail failed"
[ $fail = 0 ]
