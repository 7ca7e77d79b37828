#!/usr/bin/env bash
# Pipeline parallelism between separate hosts: the coordinator and each
# worker run in a network namespace of their own, on one switch
# (tests/dist/netns_hosts.sh: 10.77.0.1 coordinator, .2 and .3 workers), so
# a worker can only listen on and be reached at its own address, and the
# first worker pushes to the second across the switch, as on real machines.
# On the demo model, the 2-way and the 3-way split give the single process's
# output byte for byte: every position's prefill logits (--logits-all) and a
# greedy continuation's logprobs (every decode step through the route);
# --debug names each worker at its own host's address.
# Needs root (ip netns) like tests/ssd's cgroup checks: without it the test
# prints why and exits 77, a skip, which CI (root) counts as a failure.
# Every namespace is deleted at exit; nothing listens outside them.
set -u
cd "$(dirname "$0")/../.." || exit
. tests/dist/netns_hosts.sh
DEMO=models/demo.gguf
SKIPPED=77
if [ ! -x ./ds4 ] || [ ! -f "$DEMO" ]; then
    echo "test_dist_netns: SKIPPED: needs ./ds4 and $DEMO (make test builds them)"
    exit $SKIPPED
fi
netns_test_begin test_dist_netns 3

COORD=$(netns_host_addr 0)
port=7000
# split CASE SLICES...: the coordinator (first slice) on host 0, worker i on
# host i; the output file is $TMP/CASE.<number of slices>, --debug in .log
split() {
    local name=$1 first=$2 i=1 s
    shift 2
    port=$((port + 1))
    for s in "$@"; do
        netns_spawn "$TAG" "$i" ./ds4 -t 1 -m "$DEMO" --role worker --layers "$s" --coordinator "$COORD" "$port" \
            --dist-secret netns-test 2>>"$TMP/workers.log" >/dev/null
        PIDS+=("$NETNS_PID")
        i=$((i + 1))
    done
    local out=$TMP/$name.$i
    netns_host "$TAG" 0 ./ds4 -t 1 -m "$DEMO" --role coordinator --layers "$first" --listen "$COORD" "$port" \
        --dist-secret netns-test --dist-wait 20 --debug "${ARGS[@]/@OUT@/$out}" >/dev/null 2>"$out.log"
    check $? "$name split $first $*: the coordinator failed: $(tail -1 "$out.log")"
    for s in "${PIDS[@]}"; do kill -9 "$s" 2>/dev/null; wait "$s" 2>/dev/null; done
    PIDS=()
    cmp -s "$TMP/$name.1" "$out"
    check $? "$name split $first $*: differs from the single process"
}

for name in prefill decode; do
    case $name in
        prefill) ARGS=(--token-ids "5,6,7,8,9,10,11,12,13,14" --dump-logits @OUT@ --logits-all) ;;
        decode) ARGS=(-p "hello there" --nothink --dump-logprobs @OUT@ -n 4) ;;
    esac
    ./ds4 -t 1 -m "$DEMO" "${ARGS[@]/@OUT@/$TMP/$name.1}" >/dev/null 2>"$TMP/$name.1.log"
    check $? "$name single process: $(tail -1 "$TMP/$name.1.log")"
    split "$name" 0:2 3:output
    split "$name" 0:0 1:4 5:output
done
# the route as the coordinator formed it: each worker at its own host's address
grep -q "layers 1..4 at tcp://$(netns_host_addr 1):[0-9]* -> layers 5..5 + output at tcp://$(netns_host_addr 2):[0-9]* -> results at tcp://$COORD:" \
    "$TMP/decode.3.log"
check $? "3-way route addresses: $(grep -m1 'route' "$TMP/decode.3.log")"
echo "test_dist_netns: $passed passed, $failed failed"
[ "$failed" = 0 ]
