#!/usr/bin/env bash
# Pipeline-parallel speed over links of different latency (README
# "Distributed inference"): ds4-bench prefill and decode tokens/s on the
# Flash-shaped model, single process vs coordinator + 1 or 2 workers, over
#   loopback    127.0.0.1 in this network namespace, no added delay;
#   netns+D     each process on a host of its own: a network namespace per
#               process (coordinator 10.77.0.1, workers .2 and .3) on one
#               switch (tests/dist/netns_hosts.sh: veth pairs to a bridge in
#               a namespace of its own), made for the run and deleted at
#               exit, so no traffic leaves them; each host's link gets
#               `tc qdisc ... netem delay D`: every packet (data and ACKs,
#               both directions) waits D, so a round trip pays 2D.
# RUNS runs per row; tokens/s as min / median / max and the ratio of medians
# to the single process; then one --debug run per link with the 3-process
# split's per-hop telemetry. A benchmark: prints, asserts nothing. Needs root
# (ip netns, tc) for the netns rows; without it only loopback runs.
#   tests/dist/bench_dist_link.sh [MODEL]
#   env: RUNS=3 PROMPT=64 GEN=16 THREADS=1 DELAYS="0 0.5ms 5ms" (0: the
#   hosts' links without a qdisc; a delay the kernel cannot add is reported
#   and its rows skipped)
# MODEL defaults to the Flash-shaped model (Flash's real per-layer shapes,
# 4 layers, 32 routed experts instead of 256 so three processes fit a shared
# machine), made once under $BUILD/bench/.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
RUNS=${RUNS:-3} PROMPT=${PROMPT:-64} GEN=${GEN:-16} THREADS=${THREADS:-1} DELAYS=${DELAYS:-"0 0.5ms 5ms"}
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

# run LINK [SLICES...]: one ds4-bench run; prints "prefill_tps gen_tps"; the
# coordinator's stderr stays in $TMP/coord.log
run() {
    local link=$1; shift
    local coord=() port=$((20000 + RANDOM % 20000)) host=1
    [ "$link" = loopback ] && port=$(free_port)
    if [ $# -gt 0 ]; then
        for s in "${@:2}"; do
            on "$link" "$host" nice ./ds4 -t "$THREADS" -m "$MODEL" --role worker --layers "$s" \
                --coordinator "$(addr "$link" 0)" "$port" --dist-secret bench 2>>"$TMP/workers.log" &
            PIDS+=($!)
            host=$((host + 1))
        done
        coord=(--role coordinator --layers "$1" --listen "$(addr "$link" 0)" "$port" --dist-secret bench ${DEBUG:+--debug})
    fi
    on "$link" 0 nice ./ds4-bench -m "$MODEL" -t "$THREADS" --ctx-start "$PROMPT" --ctx-max "$PROMPT" \
        --gen-tokens "$GEN" "${coord[@]}" 2>"$TMP/coord.log" | awk -F, 'NR == 2 { print $2, $3 }'
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    PIDS=()
}

stats() { sort -g | awk '{ v[NR] = $1 } END { printf "%.2f %.2f %.2f\n", v[1], v[int((NR + 1) / 2)], v[NR] }'; }

HOSTS=3
# set_delay D: every host's link delays its outgoing packets by D (0: no qdisc)
set_delay() {
    local i
    for ((i = 0; i < HOSTS; i++)); do
        if [ "$1" = 0 ]; then netns_host "$TAG" "$i" tc qdisc del dev eth0 root 2>/dev/null || true
        else netns_host "$TAG" "$i" tc qdisc replace dev eth0 root netem delay "$1" 2>/dev/null || return 1; fi
    done
}

LINKS=(loopback)
NOTE=""
if netns_hosts_up "$TAG" "$HOSTS" 2>/dev/null; then
    for d in $DELAYS; do
        if set_delay "$d"; then
            LINKS+=("netns+$d")
        else
            NOTE="${NOTE:+$NOTE }netns+$d not run: this kernel has no netem qdisc (sch_netem)."
        fi
    done
    set_delay 0
else
    NOTE="netns rows not run: needs root and ip netns."
fi

half=$((N_LAYER / 2 - 1))
declare -A SPLITS=([1]="" [2]="0:$half $((half + 1)):output" [3]="0:0 1:$((N_LAYER - 2)) $((N_LAYER - 1)):output")
echo "model $MODEL ($N_LAYER layers), prompt $PROMPT, gen $GEN, -t $THREADS per process, $RUNS runs per row"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
echo
echo "| link | processes | layers | prefill t/s min / median / max | vs single | decode t/s min / median / max | vs single |"
echo "|---|---|---|---|---|---|---|"
base_p="" base_g=""
for link in "${LINKS[@]}"; do
    [ "$link" = loopback ] || set_delay "${link#netns+}"
    for n in 1 2 3; do
        # the single process uses no link: measured once, on loopback
        [ "$n" = 1 ] && [ "$link" != loopback ] && continue
        : >"$TMP/runs"
        # shellcheck disable=SC2086
        for _ in $(seq "$RUNS"); do run "$link" ${SPLITS[$n]} >>"$TMP/runs"; done
        read -r p_min p_med p_max < <(cut -d' ' -f1 "$TMP/runs" | stats)
        read -r g_min g_med g_max < <(cut -d' ' -f2 "$TMP/runs" | stats)
        [ -z "$base_p" ] && base_p=$p_med base_g=$g_med
        printf "| %s | %d | %s | %s / %s / %s | %.2fx | %s / %s / %s | %.2fx |\n" "$link" "$n" "${SPLITS[$n]:-all}" \
            "$p_min" "$p_med" "$p_max" "$(echo "$p_med / $base_p" | bc -l)" "$g_min" "$g_med" "$g_max" \
            "$(echo "$g_med / $base_g" | bc -l)"
    done
done
echo
# telemetry LINK: the coordinator's --debug request lines of the timed
# prefill (the last one starting at token 0, and its later chunks) and of the
# last decode step, one table row per hop; the last hop's row also carries
# the result frame's bytes and the round trip the coordinator measured
telemetry() {
    grep -E '^ds4 coordinator: request [0-9]+: ' "$TMP/coord.log" | awk -v link="$1" '
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
                printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", link, step, f[2], f[4], f[6], f[9],
                    f[12], f[15], i == n - 1 ? last[2] : "", i == n - 1 ? last[6] : ""
            }
        }
        END {
            for (r = first; r < NR && span(line[r]) > 1; r++) row(line[r], "prefill")
            row(line[NR], "decode")
        }'
}
echo "per-hop telemetry, 3 processes, one --debug run per link: the timed prefill, then the last decode step"
echo
echo "| link | step | layers | tokens | eval ms | wait ms | send ms | bytes in | result bytes | round trip ms |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for link in "${LINKS[@]}"; do
    [ "$link" = loopback ] || set_delay "${link#netns+}"
    # shellcheck disable=SC2086
    DEBUG=1 run "$link" ${SPLITS[3]} >/dev/null
    telemetry "$link"
done
[ -n "$NOTE" ] && echo "$NOTE"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
