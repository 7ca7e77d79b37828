#!/usr/bin/env bash
# ds4-agent -p PROMPT (one-shot) and -sys TEXT on the demo model with
# scripted model output: the turn runs its tool calls (an edit, then a bash
# command refused because -p reads no confirmation from a closed stdin and
# --yes is off), prints the answer, saves the session and exits 0; the saved
# transcript holds the -sys text instead of the built-in system prompt; the
# step after the tool round prefilled only its new tokens (--trace). Without
# -sys the built-in prompt is used. /history N lists the last N messages.
set -u
cd "$(dirname "$0")/../.."
MODEL=models/demo.gguf
[ -f "$MODEL" ] || { echo "agent one-shot: $MODEL missing (make demo-model)"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

D='｜DSML｜'
call() {   # call NAME KEY VALUE [KEY VALUE...]
    local name=$1; shift
    printf '\n\n<%stool_calls>\n<%sinvoke name="%s">\n' "$D" "$D" "$name"
    while [ $# -gt 0 ]; do printf '<%sparameter name="%s" string="true">%s</%sparameter>\n' "$D" "$1" "$2" "$D"; shift 2; done
    printf '</%sinvoke>\n</%stool_calls>' "$D" "$D"
}
{
    printf 'Edit it.</think>%s\n@@@\n' "$(call edit_file path notes.txt old_string 'hello world' new_string 'hello agent')"
    printf 'Check it.</think>%s\n@@@\n' "$(call bash command 'touch ran.txt')"
    printf 'Done.</think>The greeting now says hello agent.\n'
} > "$T/script"
mkdir -p "$T/w"
printf 'hello world\n' > "$T/w/notes.txt"
agent() {   # agent NAME [flags]: one run with its own sessions dir and trace
    local name=$1; shift
    HOME=$T ./ds4-agent -m "$MODEL" --ctx 4096 -t 2 --chdir "$T/w" --sessions-dir "$T/s-$name" \
        --scripted-output "$T/script" --trace "$T/trace-$name" "$@" </dev/null >"$T/out-$name" 2>"$T/err-$name"
}

agent sys -p "fix the greeting" -sys "You edit files for the test. Be brief."
rc=$?
check "-p exits 0 after the turn" '[ $rc = 0 ]'
check "the edit ran" '[ "$(cat $T/w/notes.txt)" = "hello agent" ]'
check "the command was refused (no --yes, no terminal to ask)" '[ ! -e $T/w/ran.txt ]'
check "the answer is printed" 'grep -qx "The greeting now says hello agent." $T/out-sys'
check "one session saved" '[ $(ls $T/s-sys | wc -l) = 1 ]'
check "-sys text in the saved transcript" 'grep -aq "You edit files for the test. Be brief." $T/s-sys/*'
check "built-in system prompt replaced" '! grep -aq "You are ds4-agent" $T/s-sys/*'
check "each step after the first prefilled only its new tokens" \
    '[ "$(grep -c "^prefill from=" $T/trace-sys)" = 3 ] && [ "$(grep "^prefill from=" $T/trace-sys | awk -F"n=" "NR>1 && \$2+0 > 100" | wc -l)" = 0 ]'

printf 'hello world\n' > "$T/w/notes.txt"
agent default -p "fix the greeting" --yes
rc=$?
check "-p --yes exits 0" '[ $rc = 0 ]'
check "with --yes the command ran" '[ -e $T/w/ran.txt ]'
check "without -sys the built-in system prompt" 'grep -aq "You are ds4-agent" $T/s-default/*'

# /history N in the interactive loop (lines read from a pipe): the last N
# messages, one line each, reasoning left out, a long prompt cut
printf 'hello world\n' > "$T/w/notes.txt"
long=$(printf 'fix the greeting %.0s' $(seq 20))
printf '%s\n/history 3\n/history 10\n/history zero\n/quit\n' "$long" |
    HOME=$T ./ds4-agent -m "$MODEL" --ctx 4096 -t 2 --chdir "$T/w" --sessions-dir "$T/s-hist" \
        --scripted-output "$T/script" --yes >"$T/out-hist" 2>"$T/err-hist"
grep -E "^(user|assistant|tool):" "$T/out-hist" > "$T/hist"
check "/history 3: the last three messages" '[ "$(head -n 3 $T/hist)" = "$(printf "%s\n" \
    "assistant: [tool calls]" "tool: <tool_result>[exit status 0]</tool_result>" \
    "assistant: The greeting now says hello agent.")" ] ||
    { head -n 3 $T/hist; false; }'
check "/history 10: from the user prompt, cut at 160 bytes" \
    '[ "$(sed -n 4p $T/hist)" = "user: ${long:0:160} ..." ] && [ "$(sed -n 5p $T/hist)" = "assistant: [tool calls]" ]'
check "/history 10 ends with the answer, no reasoning" \
    '[ "$(tail -n 1 $T/hist)" = "assistant: The greeting now says hello agent." ] && ! grep -q "Check it\|</think>" $T/hist'
check "/history with a bad count says so" 'grep -qx "/history N: N is a count of messages" $T/out-hist'

# upstream's defaults: a 100000-token context, 50000 tokens per message
printf '/ctx\n/quit\n' | HOME=$T ./ds4-agent -m "$MODEL" -t 2 --sessions-dir "$T/s-defaults" >"$T/out-defaults" 2>&1
check "default context 100000 tokens" 'grep -q "^context 0/100000 tokens" $T/out-defaults'
check "--help states the defaults" \
    './ds4-agent --help | grep -q "context size in tokens (default 100000)" && ./ds4-agent --help | grep -q "per assistant message (default 50000)"'

agent missing -p
check "-p without a value: one line, exit 2" '[ $? = 2 ] && [ "$(cat $T/err-missing)" = "ds4-agent: -p needs a value" ]'
exit $fail
