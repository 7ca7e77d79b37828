#!/usr/bin/env bash
# Tensor parallelism between two hosts (dist/tp.h): the coordinator and the
# worker each in a network namespace of their own on one switch
# (tests/dist/netns_hosts.sh: 10.77.0.1 and 10.77.0.2), so they talk over a
# veth pair as two machines do.
# - On the transformers oracle models (build/ds4tiny/{A,B,C}-f32.gguf,
#   mk/models.mk; GLM 5.2's build/glmtiny/A-f32.gguf, mk/glm.mk) with
#   --numerics exact, every position's prefill logits (--logits-all) equal
#   the single process's byte for byte, batched and with
#   --tensor-parallel-token-prefill (one token per step, decode's
#   arithmetic). On the demo model (K-quant and IQ2_XXS experts, hash
#   layers; the oracle models have no tokenizer to generate with) and on
#   GLM's glm-demo a 200-token greedy continuation's tokens and logprobs
#   (--dump-logprobs) equal the single process's byte for byte, both ways.
# - Killing the worker (kill -9) in the middle of a generation ends the
#   coordinator with one line naming the lost worker, well before the
#   timeout (no hang); a worker started again serves the next run.
# - One line and a non-zero exit for --layers with --tensor-parallel,
#   --transport rdma (a build without RDMA, or a host without an RDMA
#   device, where --transport auto runs over tcp), --role without
#   --tensor-parallel on a GLM model (GLM has no pipeline), and a worker
#   whose --dist-secret differs.
# Needs root (ip netns): without it the test says why and exits 77, a skip
# that CI (root) counts as a failure. Every namespace is deleted at exit.
set -u
cd "$(dirname "$0")/../.." || exit
. tests/dist/netns_hosts.sh
BUILD=${BUILD:-build}
SKIPPED=77
ORACLES=()
for m in A B C; do [ -f "$BUILD/ds4tiny/$m-f32.gguf" ] && ORACLES+=("$BUILD/ds4tiny/$m-f32.gguf"); done
DEMO=models/demo.gguf
GLM=$BUILD/glmchat/glm-demo.gguf
GLM_ORACLE=$BUILD/glmtiny/A-f32.gguf
if [ ! -x ./ds4 ] || [ "${#ORACLES[@]}" = 0 ] || [ ! -f "$DEMO" ] || [ ! -f "$GLM" ] || [ ! -f "$GLM_ORACLE" ]; then
    echo "test_tp_netns: SKIPPED: needs ./ds4, $BUILD/ds4tiny/*-f32.gguf, $GLM_ORACLE, $GLM and $DEMO" \
        "(make test builds them)"
    exit $SKIPPED
fi
netns_test_begin test_tp_netns 2
COORD=$(netns_host_addr 0)
port=7100
SECRET=(--dist-secret tp-netns-test)

start_worker() {   # start_worker MODEL [ARGS...]: a worker on host 1 for the coordinator on $port
    local model=$1
    shift
    netns_spawn "$TAG" 1 ./ds4 -t 1 -m "$model" --numerics exact --tensor-parallel --role worker \
        --coordinator "$COORD" "$port" "${SECRET[@]}" "$@" 2>>"$TMP/worker.log" >/dev/null
    PIDS+=("$NETNS_PID")
    WORKER=$NETNS_PID
}
stop_workers() {
    local p
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    PIDS=()
}
coordinator() {   # coordinator MODEL LOG ARGS...: on host 0, waits for it
    local model=$1 log=$2
    shift 2
    timeout 120 ip netns exec "${TAG}h0" ./ds4 -t 1 -m "$model" --numerics exact --tensor-parallel \
        --role coordinator --listen "$COORD" "$port" "${SECRET[@]}" --dist-wait 20 "$@" >/dev/null 2>"$log"
}

# same MODEL NAME ARGS...: single process vs tensor parallel (batched prefill,
# then token prefill), @OUT@ the dump file
same() {
    local model=$1 name=$2
    shift 2
    ./ds4 -t 1 -m "$model" --numerics exact "${@/@OUT@/$TMP/$name.single}" >/dev/null 2>"$TMP/$name.single.log"
    check $? "$name: single process: $(tail -1 "$TMP/$name.single.log")"
    local mode
    for mode in batched token; do
        port=$((port + 1))
        local extra=()
        [ "$mode" = token ] && extra=(--tensor-parallel-token-prefill)
        start_worker "$model"
        coordinator "$model" "$TMP/$name.$mode.log" "${extra[@]}" --debug "${@/@OUT@/$TMP/$name.$mode}"
        check $? "$name ($mode): the coordinator failed: $(tail -1 "$TMP/$name.$mode.log")"
        stop_workers
        [ -s "$TMP/$name.single" ] && cmp -s "$TMP/$name.single" "$TMP/$name.$mode"
        check $? "$name ($mode prefill): tensor parallel differs from the single process"
        grep -q 'exchanges, sent' "$TMP/$name.$mode.log"
        check $? "$name ($mode): no exchange in --debug: the worker did not take part"
    done
}

PROMPT_IDS=5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20
for model in "${ORACLES[@]}" "$GLM_ORACLE"; do
    same "$model" "$(basename "$(dirname "$model")")-$(basename "$model" .gguf)-prefill" --token-ids "$PROMPT_IDS" --dump-logits @OUT@ --logits-all
done
same "$DEMO" demo-greedy -p "hello there" --nothink --temp 0 -n 200 --dump-logprobs @OUT@
same "$GLM" glm-greedy -p "hello there" --nothink --temp 0 -n 200 --dump-logprobs @OUT@
# the token-by-token run went one token per step: one per prompt token and
# one per generated token but the last (sampled, never evaluated)
prompt=$(sed -n 's/^{"prompt_tokens":\([0-9]*\),.*/\1/p' "$TMP/demo-greedy.single")
steps=$(grep -c 'tp step' "$TMP/demo-greedy.token.log")
[ -n "$prompt" ] && [ "$steps" -ge $((prompt + 199)) ]
check $? "token prefill took $steps steps for a ${prompt:-?}-token prompt and 200 tokens"

# kill the worker in the middle of a long generation
port=$((port + 1))
start_worker "$DEMO"
ip netns exec "${TAG}h0" timeout 120 ./ds4 -t 1 -m "$DEMO" --numerics exact --tensor-parallel --role coordinator \
    --listen "$COORD" "$port" "${SECRET[@]}" --dist-wait 5 --dist-reply-timeout 60 --debug \
    -p "hello there" --nothink -n 100000 >/dev/null 2>"$TMP/kill.log" &
CPID=$!
for _ in $(seq 1 600); do
    [ "$(grep -c 'tp step' "$TMP/kill.log")" -ge 12 ] && break
    sleep 0.1
done
t0=$(date +%s)
kill -9 "$WORKER"
wait "$WORKER" 2>/dev/null
wait "$CPID"
rc=$?
t1=$(date +%s)
[ "$rc" != 0 ] && [ "$rc" != 124 ]
check $? "coordinator after the worker was killed: exit $rc (124: it hung)"
[ $((t1 - t0)) -lt 30 ]
check $? "the coordinator took $((t1 - t0)) s to notice the lost worker"
grep -q "tensor-parallel worker's connection closed" "$TMP/kill.log"
check $? "no line about the lost worker: $(tail -2 "$TMP/kill.log")"
stop_workers
# a worker started again serves the next run
start_worker "$DEMO"
coordinator "$DEMO" "$TMP/again.log" -p "hello there" --nothink --temp 0 -n 200 --dump-logprobs "$TMP/again"
check $? "after a new worker: $(tail -1 "$TMP/again.log")"
cmp -s "$TMP/demo-greedy.single" "$TMP/again"
check $? "after a new worker: differs from the single process"
stop_workers

# refusals: one line, exit non-zero, before anything runs
refused() {   # refused WHAT PATTERN CMD...
    local what=$1 pattern=$2
    shift 2
    timeout 30 "$@" >/dev/null 2>"$TMP/refused.log"
    local rc=$?
    [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$(wc -l <"$TMP/refused.log")" = 1 ] && grep -q -- "$pattern" "$TMP/refused.log"
    check $? "$what: exit $rc, said: $(cat "$TMP/refused.log")"
}
refused "--layers" "--layers does not go with --tensor-parallel" \
    ./ds4 -m "$DEMO" --tensor-parallel --role coordinator --listen 127.0.0.1 7199 --layers 0:2 -p hi
# --transport rdma: a build without libibverbs says so; a build with it on a
# host without an RDMA device says that (and --transport auto runs over tcp)
if ! ./ds4 --help 2>&1 | grep -q "this build has RDMA"; then
    refused "--transport rdma" "no RDMA transport" \
        ./ds4 -m "$DEMO" --tensor-parallel --role coordinator --listen 127.0.0.1 7199 --transport rdma -p hi
elif [ -z "$(ls /sys/class/infiniband 2>/dev/null)" ]; then
    refused "--transport rdma without a device" "no active RDMA device" \
        ./ds4 -m "$DEMO" --tensor-parallel --role worker --coordinator 127.0.0.1 7199 --transport rdma
    port=$((port + 1))
    start_worker "$GLM_ORACLE" --transport auto
    coordinator "$GLM_ORACLE" "$TMP/auto.log" --transport auto --token-ids "$PROMPT_IDS" --dump-logits "$TMP/auto" \
        --logits-all
    check $? "--transport auto without a device: $(tail -1 "$TMP/auto.log")"
    cmp -s "$TMP/glmtiny-A-f32-prefill.single" "$TMP/auto"
    check $? "--transport auto (tcp here): differs from the single process"
    stop_workers
fi
refused "--rdma-device without rdma" "goes with --transport rdma" \
    ./ds4 -m "$DEMO" --tensor-parallel --role coordinator --listen 127.0.0.1 7199 --rdma-device mlx5_0 -p hi
refused "--tensor-parallel without a role" "needs --role" ./ds4 -m "$DEMO" --tensor-parallel -p hi
refused "GLM --role without --tensor-parallel" "--role works with DeepSeek V4" \
    ./ds4 -m "$GLM" --role coordinator --listen 127.0.0.1 7199 -p hi
port=$((port + 1))
netns_spawn "$TAG" 0 ./ds4 -t 1 -m "$DEMO" --tensor-parallel --role coordinator --listen "$COORD" "$port" \
    "${SECRET[@]}" --dist-wait 60 -p hi -n 1 2>/dev/null >/dev/null
PIDS+=("$NETNS_PID")
refused "a worker with another secret" "does not prove it holds this secret" \
    ip netns exec "${TAG}h1" ./ds4 -t 1 -m "$DEMO" --tensor-parallel --role worker --coordinator "$COORD" "$port" \
    --dist-secret wrong
stop_workers

echo "test_tp_netns: $passed passed, $failed failed"
[ "$failed" = 0 ]
