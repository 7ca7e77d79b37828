#!/usr/bin/env bash
# ds4-agent as the coordinator of a tensor-parallel pair (dist/tp.h): one
# non-interactive turn (-p, greedy, no thinking) with a worker on 127.0.0.1
# prints the answer one process prints, byte for byte (the prefill's timing
# line aside), on the DeepSeek V4 demo model and on GLM's glm-demo; the
# coordinator's --debug shows the worker's steps, so the pair did the work.
set -u
cd "$(dirname "$0")/../.." || exit
BUILD=${BUILD:-build}
MODELS=(models/demo.gguf "$BUILD/glmchat/glm-demo.gguf")
for m in "${MODELS[@]}"; do
    if [ ! -f "$m" ] || [ ! -x ./ds4-agent ] || [ ! -x ./ds4 ]; then
        echo "test_tp_agent: SKIPPED: needs ./ds4, ./ds4-agent and ${MODELS[*]} (make test builds them)"
        exit 77
    fi
done
T=$(mktemp -d)
WORKER=
trap '[ -n "$WORKER" ] && kill -9 "$WORKER" 2>/dev/null; rm -rf "$T"' EXIT
passed=0 failed=0
check() { if [ "$1" = 0 ]; then passed=$((passed + 1)); else echo "FAIL: $2"; failed=$((failed + 1)); fi; }
export DS4_DIST_SECRET=tp-agent-test
port=$((7600 + $$ % 200))

agent() {   # agent MODEL NAME [ARGS...]: one -p turn, its stdout without the timing line in $T/NAME
    local model=$1 name=$2
    shift 2
    mkdir -p "$T/w"
    HOME=$T timeout 120 ./ds4-agent -m "$model" --ctx 4096 -t 1 --chdir "$T/w" --sessions-dir "$T/s-$name" \
        --nothink --temp 0 -n 40 -p "say hello" "$@" </dev/null 2>"$T/$name.log" | grep -v '^\[prefill ' >"$T/$name"
    return "${PIPESTATUS[0]}"
}

for model in "${MODELS[@]}"; do
    name=$(basename "$model" .gguf)
    agent "$model" "$name.single"
    check $? "$name: one process: $(tail -1 "$T/$name.single.log")"
    port=$((port + 1))
    ./ds4 -t 1 -m "$model" --tensor-parallel --role worker --coordinator 127.0.0.1 "$port" 2>"$T/$name.worker.log" \
        >/dev/null &
    WORKER=$!
    agent "$model" "$name.tp" --tensor-parallel --role coordinator --listen 127.0.0.1 "$port" --dist-wait 30 --debug
    check $? "$name: the coordinator agent failed: $(tail -1 "$T/$name.tp.log")"
    kill -9 "$WORKER" 2>/dev/null
    wait "$WORKER" 2>/dev/null
    WORKER=
    [ -s "$T/$name.single" ] && cmp -s "$T/$name.single" "$T/$name.tp"
    check $? "$name: the pair's answer differs from one process's"
    grep -q 'tp step .* exchanges, sent' "$T/$name.tp.log"
    check $? "$name: no exchange in --debug: the worker did not take part"
done
echo "test_tp_agent: $passed passed, $failed failed"
[ "$failed" = 0 ]
