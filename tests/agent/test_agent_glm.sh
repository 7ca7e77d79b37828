#!/usr/bin/env bash
# ds4-agent on a GLM 5.2 file (the glm-demo test model: GLM architecture,
# random weights, the GLM tokenizer) with scripted model output in GLM's
# own tool-call syntax: the agent renders GLM's chat format (tools block,
# <|user|>, <|assistant|>, <|observation|> + <tool_response>), parses the
# <tool_call> blocks and runs them (an edit, a command), and answers; the
# saved transcript is GLM's format, each step after the first prefilled only
# its new tokens, and /history reads GLM's turns.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
MODEL=$BUILD/glmchat/glm-demo.gguf
[ -f "$MODEL" ] || make -s BUILD="$BUILD" "$MODEL" >/dev/null 2>&1
[ -f "$MODEL" ] || { echo "agent glm: $MODEL missing and could not be built"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

call() {   # call NAME KEY VALUE [KEY VALUE...]: GLM's syntax
    local name=$1; shift
    printf '<tool_call>%s' "$name"
    while [ $# -gt 0 ]; do printf '<arg_key>%s</arg_key><arg_value>%s</arg_value>' "$1" "$2"; shift 2; done
    printf '</tool_call>'
}
{
    printf 'Edit it.</think>%s\n@@@\n' "$(call edit_file path notes.txt old_string 'hello world' new_string 'hello glm')"
    printf 'Check it.</think>%s\n@@@\n' "$(call bash command 'cat notes.txt; echo checked > ran.txt')"
    printf 'Done.</think>The greeting now says hello glm.\n'
} > "$T/script"
mkdir -p "$T/w"
printf 'hello world\n' > "$T/w/notes.txt"
printf 'fix the greeting\n/history 4\n/quit\n' |
    HOME=$T ./ds4-agent -m "$MODEL" --ctx 4096 -t 2 --chdir "$T/w" --sessions-dir "$T/s" --yes \
        --scripted-output "$T/script" --trace "$T/trace" >"$T/out" 2>"$T/err"
rc=$?
check "exits 0 (a GLM file is not refused)" '[ $rc = 0 ] || { tail -3 $T/err; false; }'
check "the GLM edit_file call ran" '[ "$(cat $T/w/notes.txt)" = "hello glm" ]'
check "the GLM bash call ran" '[ "$(cat $T/w/ran.txt 2>/dev/null)" = checked ]'
check "tool lines shown" 'grep -q "^-> edit_file {\"path\":\"notes.txt\"" $T/out && grep -q "^-> bash " $T/out'
check "the answer is printed" 'grep -qx "The greeting now says hello glm." $T/out'
kv=$(ls "$T"/s/*.kv 2>/dev/null | head -1)
check "the saved transcript is GLM's format: tools block, turns, calls as sampled, results as observations" \
    'grep -aq "\[gMASK\]<sop><|system|>" "$kv" && grep -aq "<tools>" "$kv" && grep -aq "<|user|>fix the greeting<|assistant|><think>Edit it.</think><tool_call>edit_file<arg_key>path</arg_key>" "$kv" &&
     grep -aq "</tool_call><|observation|><tool_response>edited notes.txt" "$kv"'
check "no DeepSeek markers in it" '! grep -aq "｜DSML｜\|<｜User｜>\|<tool_result>" "$kv"'
check "each step after the first prefilled only its new tokens" \
    '[ "$(grep -c "^prefill from=" $T/trace)" = 3 ] && [ "$(grep "^prefill from=" $T/trace | awk -F"n=" "NR>1 && \$2+0 > 100" | wc -l)" = 0 ]'
grep -E "^(user|assistant|tool):" "$T/out" > "$T/hist"
check "/history reads GLM turns: a tool result, the call marker, the answer" \
    '[ "$(cat $T/hist)" = "$(printf "%s\n" "tool: <tool_response>edited notes.txt at line 1: replaced 1 lines with 1 lines</tool_response>" \
        "assistant: [tool calls]" "tool: <tool_response>hello glm  [exit status 0]</tool_response>" \
        "assistant: The greeting now says hello glm.")" ] || { cat $T/hist; false; }'
exit $fail
