# tmux_lib.sh -- sourced by the terminal tests (tests/cli/test_repl_tmux.sh,
# tests/agent/test_agent_tmux.sh): a private tmux server per run ($S, so
# concurrent runs cannot disturb each other), a scratch directory ($T),
# both removed on exit, and the helpers to drive and read the terminal.
# Counts checks in $n and failures in $fail.
S=ds4tmux$$
T=$(mktemp -d)
fail=0; n=0
tmux() { command tmux -L "$S" "$@"; }
cleanup() { tmux kill-server 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
screen() { tmux capture-pane -p -J -S -3000 -t "$S"; }
# wait_for PATTERN COUNT SECONDS: until PATTERN occurs at least COUNT times
wait_for() {
    local i
    for ((i = 0; i < $3 * 10; i++)); do
        [ "$(screen | grep -c -- "$1")" -ge "$2" ] && return 0
        sleep 0.1
    done
    return 1
}
expect() { n=$((n+1)); if ! eval "$2"; then echo "FAIL: $1"; screen | grep -v '^$' | tail -25; fail=$((fail+1)); fi; }
# new_session WIDTH HEIGHT COMMAND: replace the private server's session with
# one running COMMAND. A server whose last session was just killed may still
# be shutting down, and a new-session that reaches it fails: so stop it and
# retry until the new session exists.
new_session() {
    local try
    tmux kill-server 2>/dev/null
    for try in 1 2 3 4 5 6 7 8 9 10; do
        tmux new-session -d -s "$S" -x "$1" -y "$2" "$3" 2>/dev/null && tmux has-session -t "$S" 2>/dev/null && return 0
        sleep 0.5
    done
    echo "tmux: cannot start a session"; return 1
}
send() { tmux send-keys -t "$S" -l -- "$1"; tmux send-keys -t "$S" Enter; }
