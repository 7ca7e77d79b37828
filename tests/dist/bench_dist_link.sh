#!/usr/bin/env bash
# Pipeline-parallel speed over links of different latency
# (docs/distributed.md): ds4-bench prefill and decode tokens/s on the
# Flash-shaped model, single process vs coordinator + 1 or 2 workers, over
#   loopback    127.0.0.1 in this network namespace, no added delay;
#   netns       each process on a host of its own: a network namespace per
#               process (coordinator 10.77.0.1, workers .2 and .3) on one
#               switch (tests/dist/netns_hosts.sh: veth pairs to a kernel
#               bridge in a namespace of its own), made for the link's rows
#               and deleted after them, so no traffic leaves them;
#   delay+D     the same hosts on ./ds4-netdelay, a switch in user space that
#               releases every frame (data and ACKs, both directions) D ms
#               after it came, so a round trip pays 2D: what `tc qdisc ...
#               netem delay D` on each host's link adds, for kernels without
#               netem (delay+0 is that switch's own cost).
# Each link's rows interleave the runs (run r: the single process, then the
# 2-way and 3-way splits in every BITS format), so each split run has a
# single-process run next to it; the table gives tokens/s as min / median /
# max and the split / single ratio of each pair as median (min-max). Then, per link: the TCP round trip between
# the coordinator's host and the first worker's (tests/dist/link_probe.py,
# 20 one-byte round trips), and one --debug run of the 3-way split, its
# per-hop telemetry as a table. A benchmark: prints, asserts nothing. The
# netns and delay rows need root (ip netns); without it only loopback runs.
#   tests/dist/bench_dist_link.sh [MODEL]
#   env: RUNS=3 PROMPT=64 GEN=16 THREADS=1
#        DELAYS="0 0.5 5"   (ms; the delay+D links)
#        LINKS="loopback netns delay+0 delay+0.5 delay+5" (default from DELAYS;
#                            a subset splits a long series over invocations)
#        SPLITS="2 3"       split sizes (2, 3)
#        BITS=32            --dist-activation-bits values, each its own rows
#        TELEMETRY=1        0: no --debug run
# MODEL defaults to the Flash-shaped model (Flash's real per-layer shapes,
# 4 layers, 32 routed experts instead of 256 so three processes fit a shared
# machine), made once under $BUILD/bench/.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
RUNS=${RUNS:-3} PROMPT=${PROMPT:-64} GEN=${GEN:-16} THREADS=${THREADS:-1} DELAYS=${DELAYS:-"0 0.5 5"}
LINKS=${LINKS:-"loopback netns $(for d in $DELAYS; do printf 'delay+%s ' "$d"; done)"}
SPLIT_SIZES=${SPLITS:-"2 3"} BITS=${BITS:-32} TELEMETRY=${TELEMETRY:-1}
MODEL=${1:-$BUILD/bench/flash-4layer-32exp.gguf}
if [ $# -eq 0 ] && [ ! -f "$MODEL" ]; then
    mkdir -p "$(dirname "$MODEL")"
    echo "making $MODEL (once)" >&2
    nice ./ds4-make-model -o "$MODEL" --preset flash --layers 4 --expert_count 32 --no-vocab >/dev/null 2>&1
fi
N_LAYER=$(./ds4-gguf-dump "$MODEL" 2>/dev/null | awk '$1 ~ /\.block_count$/ { print $3 }')
TMP=$(mktemp -d)
. tests/dist/netns_hosts.sh
TAG=ds4b$$
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    netns_hosts_down "$TAG"
    rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# on LINK HOST CMD...: runs CMD on host HOST (0: the coordinator's) of the link
on() { local link=$1 host=$2; shift 2; if [ "$link" = loopback ]; then "$@"; else netns_host "$TAG" "$host" "$@"; fi; }
# addr LINK HOST: the host's address on the link
addr() { if [ "$1" = loopback ]; then echo 127.0.0.1; else netns_host_addr "$2"; fi; }

# run LINK BITS [SLICES...]: one ds4-bench run; prints "prefill_tps gen_tps";
# the coordinator's stderr stays in $TMP/coord.log
run() {
    local link=$1 bits=$2; shift 2
    local coord=() port=$((20000 + RANDOM % 20000)) host=1
    [ "$link" = loopback ] && port=$(free_port)
    if [ $# -gt 0 ]; then
        for s in "${@:2}"; do
            local worker=(nice ./ds4 -t "$THREADS" -m "$MODEL" --role worker --layers "$s"
                          --coordinator "$(addr "$link" 0)" "$port" --dist-secret bench)
            # started as the background job itself, so its pid is the worker's
            if [ "$link" = loopback ]; then
                "${worker[@]}" 2>>"$TMP/workers.log" &
                PIDS+=($!)
            else
                netns_spawn "$TAG" "$host" "${worker[@]}" 2>>"$TMP/workers.log"
                PIDS+=("$NETNS_PID")
            fi
            host=$((host + 1))
        done
        coord=(--role coordinator --layers "$1" --listen "$(addr "$link" 0)" "$port" --dist-secret bench ${DEBUG:+--debug})
        [ "$bits" = 32 ] || coord+=(--dist-activation-bits "$bits")
    fi
    on "$link" 0 nice ./ds4-bench -m "$MODEL" -t "$THREADS" --ctx-start "$PROMPT" --ctx-max "$PROMPT" \
        --gen-tokens "$GEN" "${coord[@]}" 2>"$TMP/coord.log" | awk -F, 'NR == 2 { print $2, $3 }'
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    PIDS=()
}

# stats: min / median / max of the numbers on stdin
stats() { sort -g | awk '{ v[NR] = $1 } END { printf "%.2f / %.2f / %.2f", v[1], v[int((NR + 1) / 2)], v[NR] }'; }
# ratios: median (min-max) of column $2 / column $1 per line
ratios() { awk '{ print $2 / $1 }' | sort -g | awk '{ v[NR] = $1 } END { printf "%.2fx (%.2f-%.2f)", v[int((NR + 1) / 2)], v[1], v[NR] }'; }

# link_up LINK: makes the link's hosts (nothing for loopback); false when it cannot
link_up() {
    case $1 in
        loopback) return 0 ;;
        netns) netns_hosts_up "$TAG" 3 ;;
        delay+*) NETNS_DELAY_LOG=$TMP/switch.log netns_hosts_up "$TAG" 3 "${1#delay+}" ;;
        *) echo "unknown link $1" >&2; return 1 ;;
    esac
}

# ping_row LINK: the link's round trip between hosts 0 and 1, as a table row
ping_row() {
    local link=$1 a0 a1 port=7100 rtt line probe_cmd
    a0=$(addr "$link" 0) a1=$(addr "$link" 1)
    [ "$link" = loopback ] && port=$(free_port)
    probe_cmd=(python3 tests/dist/link_probe.py echo "$a1" "$port")
    [ "$link" = loopback ] || probe_cmd=(ip netns exec "${TAG}h1" "${probe_cmd[@]}")
    exec {probe}< <(exec "${probe_cmd[@]}")
    local echo_pid=$!
    read -r -t 20 line <&"$probe" || true
    rtt=$(on "$link" 0 python3 tests/dist/link_probe.py ping "$a1" "$port" 20 | cut -d' ' -f2-)
    kill "$echo_pid" 2>/dev/null || true
    exec {probe}<&-
    read -r r_min r_avg r_max <<<"$rtt"
    echo "| $link | $a0 -> $a1 | $r_min | $r_avg | $r_max |"
}

half=$((N_LAYER / 2 - 1))
declare -A SPLIT_LAYERS=([1]="" [2]="0:$half $((half + 1)):output" [3]="0:0 1:$((N_LAYER - 2)) $((N_LAYER - 1)):output")
echo "model $MODEL ($N_LAYER layers), prompt $PROMPT, gen $GEN, -t $THREADS per process, $RUNS runs per row"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
echo
ROWS=$TMP/rows PINGS=$TMP/pings HOPS=$TMP/hops
: >"$ROWS"; : >"$PINGS"; : >"$HOPS"
NOTE=""

# telemetry LINK BITS: the coordinator's --debug request lines of the timed
# prefill (the last one starting at token 0, and its later chunks) and of the
# last decode step, one table row per hop; the last hop's row also carries
# the result frame's bytes and the round trip the coordinator measured
telemetry() {
    grep -E '^ds4 coordinator: request [0-9]+: ' "$TMP/coord.log" | awk -v link="$1" -v bits="$2" '
        { line[NR] = $0; if ($0 ~ /: layers [0-9]+\.\.[0-9]+ tokens 0\.\./) first = NR }
        function span(l,    ends) {
            match(l, / tokens [0-9]+\.\.[0-9]+ /)
            split(substr(l, RSTART + 8, RLENGTH - 9), ends, /\.\./)
            return ends[2] - ends[1] + 1
        }
        function row(l, step,    n, hop, i, f, last) {
            sub(/^ds4 coordinator: request [0-9]+: /, "", l)
            n = split(l, hop, / \| /)
            split(hop[n], last, " ")   # result R B, round trip T ms
            for (i = 1; i < n; i++) {
                split(hop[i], f, " ")   # layers A..B tokens C..D eval E ms wait W ms send S ms in N B
                printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", link, bits, step, f[2], f[4], f[6],
                    f[9], f[12], f[15], i == n - 1 ? last[2] : "", i == n - 1 ? last[6] : ""
            }
        }
        END {
            for (r = first; r < NR && span(line[r]) > 1; r++) row(line[r], "prefill")
            row(line[NR], "decode")
        }'
}

for link in $LINKS; do
    if ! link_up "$link" 2>"$TMP/link.err"; then
        NOTE="${NOTE:+$NOTE }$link not run: $(tail -1 "$TMP/link.err")."
        netns_hosts_down "$TAG"
        continue
    fi
    ping_row "$link" >>"$PINGS"
    # run r: the single process, then every format's splits
    : >"$TMP/single"
    for bits in $BITS; do for n in $SPLIT_SIZES; do : >"$TMP/split$bits.$n"; done; done
    for _ in $(seq "$RUNS"); do
        run loopback 32 >>"$TMP/single"
        for bits in $BITS; do
            # shellcheck disable=SC2086
            for n in $SPLIT_SIZES; do run "$link" "$bits" ${SPLIT_LAYERS[$n]} >>"$TMP/split$bits.$n"; done
        done
    done
    printf "| %s | | 1 | all | %s | | %s | |\n" "$link" "$(cut -d' ' -f1 "$TMP/single" | stats)" \
        "$(cut -d' ' -f2 "$TMP/single" | stats)" >>"$ROWS"
    for bits in $BITS; do
        for n in $SPLIT_SIZES; do
            f=$TMP/split$bits.$n
            printf "| %s | %s | %d | %s | %s | %s | %s | %s |\n" "$link" "$bits" "$n" "${SPLIT_LAYERS[$n]}" \
                "$(cut -d' ' -f1 "$f" | stats)" "$(paste -d' ' <(cut -d' ' -f1 "$TMP/single") <(cut -d' ' -f1 "$f") | ratios)" \
                "$(cut -d' ' -f2 "$f" | stats)" "$(paste -d' ' <(cut -d' ' -f2 "$TMP/single") <(cut -d' ' -f2 "$f") | ratios)" \
                >>"$ROWS"
        done
        if [ "$TELEMETRY" = 1 ]; then
            # shellcheck disable=SC2086
            DEBUG=1 run "$link" "$bits" ${SPLIT_LAYERS[3]} >/dev/null
            telemetry "$link" "$bits" >>"$HOPS"
        fi
    done
    netns_hosts_down "$TAG"
done

echo "| link | bits | processes | layers | prefill t/s min / median / max | split / single, per pair | decode t/s min / median / max | split / single, per pair |"
echo "|---|---|---|---|---|---|---|---|"
cat "$ROWS"
echo
echo "TCP round trip, coordinator's host -> first worker's (20 one-byte round trips, ms):"
echo
echo "| link | addresses | min | avg | max |"
echo "|---|---|---|---|---|"
cat "$PINGS"
if [ "$TELEMETRY" = 1 ]; then
    echo
    echo "per-hop telemetry, 3 processes, one --debug run per link: the timed prefill, then the last decode step"
    echo
    echo "| link | bits | step | layers | tokens | eval ms | wait ms | send ms | bytes in | result bytes | round trip ms |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    cat "$HOPS"
fi
[ -f "$TMP/switch.log" ] && sed 's/^/switch: /' "$TMP/switch.log"
[ -n "$NOTE" ] && echo "$NOTE"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
