#!/usr/bin/env bash
# Pipeline-parallel speed over links of different latency (README
# "Distributed inference"): ds4-bench prefill and decode tokens/s on the
# Flash-shaped model, single process vs coordinator + 1 or 2 workers, over
#   loopback    127.0.0.1 in this network namespace, no added delay;
#   netns+D     all processes inside a private network namespace made for the
#               run (ip netns add), talking over its own loopback, which gets
#               `tc qdisc ... netem delay D`: every packet (data and ACKs,
#               both directions) waits D, so a round trip pays 2D. No traffic
#               leaves the namespace; the namespace is deleted at exit.
# RUNS runs per row; tokens/s as min / median / max and the ratio of medians
# to the single process; then one --debug run per link with the 3-process
# split's per-hop telemetry. A benchmark: prints, asserts nothing. Needs root
# (ip netns, tc) for the netns rows; without it only loopback runs.
#   tests/dist/bench_dist_link.sh [MODEL]
#   env: RUNS=3 PROMPT=64 GEN=16 THREADS=1 DELAYS="0 0.5ms 5ms" (0: the
#   namespace without a qdisc; a delay the kernel cannot add is reported and
#   its rows skipped)
# MODEL defaults to the Flash-shaped model (Flash's real per-layer shapes,
# 4 layers, 32 routed experts instead of 256 so three processes fit a shared
# machine), made once under $BUILD/bench/.
#
# Why one namespace and not one per process joined by veth pairs: a worker's
# data socket listens on the address it was given for the coordinator
# (src/dist.c, "tcp://<coordinator host>:0"), which only exists on the
# coordinator's host, so a worker in another namespace fails with "cannot
# listen on tcp://<coordinator>:0: Address invalid" (the same on two real
# hosts). Once workers listen on an address of their own, each process can
# move into its own namespace here.
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
NS=ds4bench$$
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$NS" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# in LINK CMD...: runs CMD on the link's side (inside the namespace for netns links)
in_link() { local link=$1; shift; if [ "$link" = loopback ]; then "$@"; else ip netns exec "$NS" "$@"; fi; }

# run LINK [SLICES...]: one ds4-bench run; prints "prefill_tps gen_tps"; the
# coordinator's stderr stays in $TMP/coord.log
run() {
    local link=$1; shift
    local coord=() port=$((20000 + RANDOM % 20000))
    [ "$link" = loopback ] && port=$(free_port)
    if [ $# -gt 0 ]; then
        for s in "${@:2}"; do
            in_link "$link" nice ./ds4 -t "$THREADS" -m "$MODEL" --role worker --layers "$s" \
                --coordinator 127.0.0.1 "$port" --dist-secret bench 2>>"$TMP/workers.log" &
            PIDS+=($!)
        done
        coord=(--role coordinator --layers "$1" --listen 127.0.0.1 "$port" --dist-secret bench ${DEBUG:+--debug})
    fi
    in_link "$link" nice ./ds4-bench -m "$MODEL" -t "$THREADS" --ctx-start "$PROMPT" --ctx-max "$PROMPT" \
        --gen-tokens "$GEN" "${coord[@]}" 2>"$TMP/coord.log" | awk -F, 'NR == 2 { print $2, $3 }'
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    PIDS=()
}

stats() { sort -g | awk '{ v[NR] = $1 } END { printf "%.2f %.2f %.2f\n", v[1], v[int((NR + 1) / 2)], v[NR] }'; }

LINKS=(loopback)
NOTE=""
if ip netns add "$NS" 2>/dev/null; then
    ip -n "$NS" link set lo up
    for d in $DELAYS; do
        if [ "$d" = 0 ] || ip netns exec "$NS" tc qdisc replace dev lo root netem delay "$d" 2>/dev/null; then
            LINKS+=("netns+$d")
        else
            NOTE="$NOTE netns+$d not run: this kernel has no netem qdisc (sch_netem)."
        fi
    done
    ip netns exec "$NS" tc qdisc del dev lo root 2>/dev/null || true
else
    NOTE="netns rows not run: needs root and ip netns."
fi
set_delay() {   # the namespace's loopback delay for LINK (netns+0: none)
    case $1 in
        netns+0) ip netns exec "$NS" tc qdisc del dev lo root 2>/dev/null || true ;;
        netns+*) ip netns exec "$NS" tc qdisc replace dev lo root netem delay "${1#netns+}" ;;
    esac
}

half=$((N_LAYER / 2 - 1))
declare -A SPLITS=([1]="" [2]="0:$half $((half + 1)):output" [3]="0:0 1:$((N_LAYER - 2)) $((N_LAYER - 1)):output")
echo "model $MODEL ($N_LAYER layers), prompt $PROMPT, gen $GEN, -t $THREADS per process, $RUNS runs per row"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
echo
echo "| link | processes | layers | prefill t/s min / median / max | vs single | decode t/s min / median / max | vs single |"
echo "|---|---|---|---|---|---|---|"
base_p="" base_g=""
for link in "${LINKS[@]}"; do
    set_delay "$link"
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
echo "per-hop telemetry, 3 processes, one --debug run per link (prefill hops, then the last decode step):"
for link in "${LINKS[@]}"; do
    set_delay "$link"
    # shellcheck disable=SC2086
    DEBUG=1 run "$link" ${SPLITS[3]} >/dev/null
    echo "  $link:"
    grep " hop .*tokens 0\.\.$((PROMPT - 1))," "$TMP/coord.log" | tail -2 | sed 's/^ds4 coordinator: /    /' || true
    grep " hop " "$TMP/coord.log" | tail -2 | sed 's/^ds4 coordinator: /    /' || true
done
[ -n "$NOTE" ] && echo "$NOTE"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
