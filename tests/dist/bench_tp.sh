#!/usr/bin/env bash
# Tensor-parallel benchmark (docs/distributed.md): ds4-bench as one process
# with 1 and with 2 threads, and as the coordinator of a tensor-parallel
# pair with 1 thread per process, RUNS rounds (each round runs all three);
# prints prefill and decode tokens/s (min / median / max), each process's
# peak RSS, and from the pair's --debug lines the bytes sent and received
# and the time waited at the exchanges per decode step (median). A
# benchmark, not a test: it asserts nothing.
#   tests/dist/bench_tp.sh MODEL [DELAY_MS...]
#     no DELAY_MS: loopback (127.0.0.1); each DELAY_MS (0 included): the two
#     processes in network namespaces joined by ./ds4-netdelay with that
#     one-way delay (tests/dist/netns_hosts.sh; needs root)
#   env: RUNS=3 PROMPT=64 GEN=16
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/dist/netns_hosts.sh
MODEL=$1
shift
RUNS=${RUNS:-3} PROMPT=${PROMPT:-64} GEN=${GEN:-16}
TMP=$(mktemp -d)
TAG=ds4tb$$
WORKER=""
cleanup() {
    [ -n "$WORKER" ] && kill -9 "$WORKER" 2>/dev/null
    netns_hosts_down "$TAG" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
BENCH=(-m "$MODEL" --ctx-start "$PROMPT" --ctx-max "$PROMPT" --gen-tokens "$GEN" --prefill-chunk "$PROMPT")

# single THREADS: prints "prefill decode rss_kb"
single() {
    /usr/bin/time -f "%M" -o "$TMP/rss" ./ds4-bench "${BENCH[@]}" -t "$1" 2>/dev/null |
        awk -F, 'NR == 2 { printf "%s %s ", $2, $3 }'
    cat "$TMP/rss"
}

# pair HOST_PREFIX ADDR: prints "prefill decode coord_rss_kb worker_rss_kb"; --debug in $TMP/pair.log
pair() {
    local run=("${@:3}") port=$((7800 + RANDOM % 100))
    "${run[@]/@H@/1}" ./ds4 -t 1 -m "$MODEL" --tensor-parallel --role worker --coordinator "$2" "$port" \
        --dist-secret bench 2>"$TMP/worker.log" >/dev/null &
    WORKER=$!
    "${run[@]/@H@/0}" /usr/bin/time -f "%M" -o "$TMP/rss" ./ds4-bench "${BENCH[@]}" -t 1 --tensor-parallel \
        --role coordinator --listen "$2" "$port" --dist-secret bench --debug 2>"$TMP/pair.log" |
        awk -F, 'NR == 2 { printf "%s %s ", $2, $3 }'
    # a worker that died (its coordinator's run then failed) has no peak to report
    printf "%s %s\n" "$(cat "$TMP/rss")" "$(awk '/VmHWM/ { print $2 }' "/proc/$WORKER/status" 2>/dev/null || echo 0)"
    kill -9 "$WORKER" 2>/dev/null
    wait "$WORKER" 2>/dev/null || true
    WORKER=""
}

stats() { sort -g | awk '{ v[NR] = $1 } END { printf "%.2f / %.2f / %.2f", v[1], v[int((NR + 1) / 2)], v[NR] }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { printf "%s", v[int((NR + 1) / 2)] }'; }

bench_link() {   # bench_link NAME ADDR RUN-PREFIX...
    local name=$1 addr=$2
    shift 2
    : >"$TMP/s1"; : >"$TMP/s2"; : >"$TMP/tp"; : >"$TMP/steps"
    for _ in $(seq "$RUNS"); do
        single 1 >>"$TMP/s1"
        single 2 >>"$TMP/s2"
        pair x "$addr" "$@" >>"$TMP/tp"
        # decode steps: one row each
        awk '/tp step .*: 1 rows,/ { for (i = 1; i <= NF; i++) { if ($i == "sent") s = $(i + 1); if ($i == "received") r = $(i + 1); if ($i == "waited") w = $(i + 1) } print s, r, w }' \
            "$TMP/pair.log" >>"$TMP/steps"
    done
    local f
    for f in s1 s2 tp; do
        local what
        case $f in s1) what="1 process, 1 thread" ;; s2) what="1 process, 2 threads" ;; tp) what="TP2, 1 thread each" ;; esac
        local rss
        if [ "$f" = tp ]; then
            rss="coordinator $(cut -d' ' -f3 "$TMP/tp" | median | awk '{ printf "%.2f", $1 / 1048576 }') GiB, worker $(cut -d' ' -f4 "$TMP/tp" | median | awk '{ printf "%.2f", $1 / 1048576 }') GiB"
        else
            rss="$(cut -d' ' -f3 "$TMP/$f" | median | awk '{ printf "%.2f", $1 / 1048576 }') GiB"
        fi
        printf "| %s | %s | %s | %s | %s |\n" "$name" "$what" "$(cut -d' ' -f1 "$TMP/$f" | stats)" \
            "$(cut -d' ' -f2 "$TMP/$f" | stats)" "$rss"
    done
    printf "| %s | TP2 per decode step (median) | sent %s B, received %s B | waited %s ms at the exchanges | |\n" "$name" \
        "$(cut -d' ' -f1 "$TMP/steps" | median)" "$(cut -d' ' -f2 "$TMP/steps" | median)" \
        "$(cut -d' ' -f3 "$TMP/steps" | median)"
}

echo "model $MODEL, prompt $PROMPT, gen $GEN, $RUNS rounds, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%F)"
echo
echo "| link | run | prefill t/s min / median / max | decode t/s min / median / max | peak RSS (median) |"
echo "|---|---|---|---|---|"
if [ $# = 0 ]; then
    bench_link loopback 127.0.0.1 env
else
    for d in "$@"; do
        netns_hosts_up "$TAG" 2 "$d"
        bench_link "delay+$d" "$(netns_host_addr 0)" ip netns exec "${TAG}h@H@"
        netns_hosts_down "$TAG"
    done
fi
