# tmux_lib.sh -- sourced by the terminal tests (tests/cli/test_repl_tmux.sh,
# tests/agent/test_agent_tmux.sh): a private tmux server per run ($S, so
# concurrent runs cannot disturb each other), a scratch directory ($T),
# both removed on exit, and the helpers to drive and read the terminal.
# Counts checks in $n and failures in $fail. The helpers act on session $W
# (default: the session named like the server); a test that runs several
# programs can start each in a new session and point W at it before it
# kills the previous one, so the server never runs out of sessions (a
# server that exits while the next session is created takes it along).
S=ds4tmux$$
W=$S
T=$(mktemp -d)
fail=0; n=0
tmux() { command tmux -L "$S" "$@"; }
cleanup() { tmux kill-server 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
screen() { tmux capture-pane -p -J -S -3000 -t "$W"; }
# wait_for PATTERN COUNT SECONDS: until PATTERN occurs at least COUNT times
wait_for() {
    local i
    for ((i = 0; i < $3 * 10; i++)); do
        [ "$(screen | grep -c -- "$1")" -ge "$2" ] && return 0
        # the session is gone (its program and the trailing sleep ended): no point waiting
        tmux has-session -t "$W" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
# wait_for_output_after LINE SECONDS: until a non-empty line follows the last
# line that starts with LINE (the program has begun answering that input; an
# event to act on, where a fixed sleep would assume the machine's speed)
wait_for_output_after() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        screen | awk -v l="$1" 'index($0, l) == 1 { seen = 1; got = 0; next } seen && NF { got = 1 } END { exit !got }' &&
            return 0
        tmux has-session -t "$W" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
expect() { n=$((n+1)); if ! eval "$2"; then echo "FAIL: $1"; screen | grep -v '^$' | tail -25; fail=$((fail+1)); fi; }
send() { tmux send-keys -t "$W" -l -- "$1"; tmux send-keys -t "$W" Enter; }
