#!/usr/bin/env bash
# ds4-agent compaction on the demo model with scripted model output, in a
# small context (--ctx 2048): a message that would take the session past 85%
# of the context first makes the model summarise the conversation (the
# script's summary entry), the agent continues in a new session holding the
# summary and the last messages, says so in one line, and the old session
# stays on disk as it was; /compact does the same by hand. Without
# compaction the long message is refused ("context full").
set -u
cd "$(dirname "$0")/../.."
MODEL=models/demo.gguf
[ -f "$MODEL" ] || { echo "agent compact: $MODEL missing (make demo-model)"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }

D='｜DSML｜'
# Turn 1 runs a command and answers; turn 2's long message triggers the
# automatic compaction (the summary is written with thinking off: no
# </think>), then answers; /compact summarises again.
{
    printf 'Count.</think>\n\n<%stool_calls>\n<%sinvoke name="bash">\n' "$D" "$D"
    printf '<%sparameter name="command" string="true">seq 1 250</%sparameter>\n</%sinvoke>\n</%stool_calls>\n@@@\n' "$D" "$D" "$D" "$D"
    printf 'Done.</think>Counted to 250.\n@@@\n'
    printf 'SUMMARY-XYZZY: the user had the agent count to 250 with seq.\n@@@\n'
    printf 'Read.</think>Read your long note.\n@@@\n'
    printf 'SUMMARY-BY-HAND: counted, then read a long note.\n@@@\n'
} > "$T/script"
mkdir -p "$T/w"
long="please read this note: $(printf 'alpha beta gamma delta %.0s' $(seq 150))"
printf 'count for me\n/list\n%s\n/ctx\n/list\n/compact\n/ctx\n/quit\n' "$long" |
    HOME=$T ./ds4-agent -m "$MODEL" --ctx 2048 -t 2 --chdir "$T/w" --sessions-dir "$T/s" \
        --scripted-output "$T/script" --trace "$T/trace" --yes >"$T/out" 2>"$T/err"
rc=$?
check "the agent exits 0" '[ $rc = 0 ] || { tail -5 $T/err; false; }'
first=$(grep -m1 -o '^\* [0-9a-f]\{12\}' "$T/out" | cut -c3-)
check "turn 1 saved a session" '[ -n "$first" ] && [ -f $T/s/$first*.kv ]'
check "one-line notice of the automatic compaction, naming the old session" \
    'grep -q "^\[compacted: [0-9]* tokens -> [0-9]* .*new session [0-9a-f]\{12\}, the old one is saved as $first\]" $T/out'
check "the long message was answered after it" 'grep -q "^Read your long note.$" $T/out'
check "no context-full refusal" '! grep -q "context full" $T/out'
second=$(grep -m1 -o 'new session [0-9a-f]\{12\}' "$T/out" | cut -d" " -f3)
check "the new session is on disk, its prompt starts with the summary" \
    'grep -aqz "Summary of the earlier conversation (compacted from session $first):..SUMMARY-XYZZY: the user had the agent count to 250 with seq." $T/s/$second*.kv'
check "the new session keeps the last messages as they were, then the long message" \
    'grep -aq "Counted to 250\." $T/s/$second*.kv && grep -aq "alpha beta gamma delta" $T/s/$second*.kv'
check "the new session no longer holds the first prompt" '! grep -aq "count for me" $T/s/$second*.kv'
check "the old session is still on disk with the first turn" \
    'grep -aq "count for me" $T/s/$first*.kv && grep -aq "Counted to 250\." $T/s/$first*.kv && ! grep -aq SUMMARY-XYZZY $T/s/$first*.kv'
check "the new session was prefilled from 0" \
    '[ "$(grep -c "^prefill from=0 " $T/trace)" -ge 2 ]'
check "/compact by hand: a second compaction from the new session" \
    'grep -q "^\[compacted: .*the old one is saved as $second\]" $T/out'
third=$(grep -o 'new session [0-9a-f]\{12\}' "$T/out" | sed -n 2p | cut -d" " -f3)
check "/compact: its summary starts the third session" \
    'grep -aqz "compacted from session $second):..SUMMARY-BY-HAND" $T/s/$third*.kv'
check "three sessions saved" '[ "$(ls $T/s/*.kv | wc -l)" = 3 ]'
check "/ctx after /compact names the third session" 'grep -q "session $third" $T/out'

# In the middle of a turn (-p, -n 100: tool results may fill up to the
# answer's room): after the third call the session is past 85%, so it is
# compacted before the call runs, and the call's result gets the new
# session's room instead of being dropped for lack of it.
count() {
    printf 'Count.</think>\n\n<%stool_calls>\n<%sinvoke name="bash">\n' "$D" "$D"
    printf '<%sparameter name="command" string="true">seq 1 400</%sparameter>\n</%sinvoke>\n</%stool_calls>\n@@@\n' "$D" "$D" "$D" "$D"
}
{ count; count; count; printf 'SUMMARY-MID: counted twice, a third count is running.\n@@@\n'
  printf 'Done.</think>All counted.\n'; } > "$T/script-mid"
HOME=$T ./ds4-agent -m "$MODEL" --ctx 2048 -n 100 -t 2 --chdir "$T/w" --sessions-dir "$T/s-mid" --yes \
    --scripted-output "$T/script-mid" -p "count a lot" >"$T/out-mid" 2>"$T/err-mid"
rc=$?
check "mid-turn: -p exits 0 with the answer" '[ $rc = 0 ] && grep -qx "All counted." $T/out-mid'
check "mid-turn: compacted after the third call was written, before it ran" \
    'awk "/^-> bash/ { n++ } /^\[compacted: / { at = n } END { exit !(n == 3 && at == 2) }" $T/out-mid'
check "mid-turn: every result got room (none dropped)" \
    '[ "$(grep -c "^-> bash .*exit 0" $T/out-mid)" = 3 ] && ! grep -q "output dropped" $T/out-mid'
check "mid-turn: old and new session saved" '[ "$(ls $T/s-mid/*.kv | wc -l)" = 2 ]'
exit $fail
