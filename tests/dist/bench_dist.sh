#!/usr/bin/env bash
# Loopback pipeline benchmark (docs/distributed.md): ds4-bench on
# one process, then as the coordinator of 2 and 3 processes (workers on
# 127.0.0.1 ports, forwarding to the next hop), RUNS runs each; prints
# prefill and decode tokens/s as min / median / max and the ratio of the
# medians to the single process, then one --debug run's per-hop telemetry
# for the 3-way split. A benchmark, not a test: it asserts nothing.
#   tests/dist/bench_dist.sh [MODEL] (env: RUNS=3 PROMPT=512 GEN=32 THREADS=1
#                                      CHUNK=128 WINDOW=2)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${1:-models/demo.gguf}
RUNS=${RUNS:-3} PROMPT=${PROMPT:-512} GEN=${GEN:-32} THREADS=${THREADS:-1} CHUNK=${CHUNK:-128} WINDOW=${WINDOW:-2}
N_LAYER=$(./ds4-gguf-dump "$MODEL" 2>/dev/null | awk '$1 ~ /\.block_count$/ { print $3 }')
N_LAYER=${N_LAYER:-6}
TMP=$(mktemp -d)
WORKERS=()
cleanup() { for p in "${WORKERS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$TMP"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run SLICES... : one ds4-bench run; prints "prefill_tps gen_tps"; the
# coordinator's stderr is left in $TMP/coord.log
run() {
    local coord=() port
    if [ $# -gt 0 ]; then
        port=$(free_port)
        for s in "${@:2}"; do
            ./ds4 -t "$THREADS" -m "$MODEL" --role worker --layers "$s" --coordinator 127.0.0.1 "$port" \
                --dist-secret bench 2>>"$TMP/workers.log" &
            WORKERS+=($!)
        done
        coord=(--role coordinator --layers "$1" --listen 127.0.0.1 "$port" --dist-secret bench
               --dist-prefill-chunk "$CHUNK" --dist-prefill-window "$WINDOW" ${DEBUG:+--debug})
    fi
    ./ds4-bench -m "$MODEL" -t "$THREADS" --ctx-start "$PROMPT" --ctx-max "$PROMPT" --gen-tokens "$GEN" \
        --prefill-chunk "$CHUNK" "${coord[@]}" 2>"$TMP/coord.log" | awk -F, 'NR == 2 { print $2, $3 }'
    for p in "${WORKERS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    WORKERS=()
}

stats() { sort -g | awk '{ v[NR] = $1 } END { printf "%.1f %.1f %.1f\n", v[1], v[int((NR + 1) / 2)], v[NR] }'; }

half=$((N_LAYER / 2 - 1))
declare -A SPLITS=([1]="" [2]="0:$half $((half + 1)):output" [3]="0:0 1:$((N_LAYER - 2)) $((N_LAYER - 1)):output")
echo "model $MODEL ($N_LAYER layers), prompt $PROMPT, gen $GEN, -t $THREADS per process, chunk $CHUNK, window $WINDOW, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| processes | layers | prefill t/s min / median / max | vs single | decode t/s min / median / max | vs single |"
echo "|---|---|---|---|---|---|"
base_p="" base_g=""
for n in 1 2 3; do
    : >"$TMP/runs"
    # shellcheck disable=SC2086
    for _ in $(seq "$RUNS"); do run ${SPLITS[$n]} >>"$TMP/runs"; done
    read -r p_min p_med p_max < <(cut -d' ' -f1 "$TMP/runs" | stats)
    read -r g_min g_med g_max < <(cut -d' ' -f2 "$TMP/runs" | stats)
    [ -z "$base_p" ] && base_p=$p_med base_g=$g_med
    printf "| %d | %s | %s / %s / %s | %.2fx | %s / %s / %s | %.2fx |\n" "$n" "${SPLITS[$n]:-all}" \
        "$p_min" "$p_med" "$p_max" "$(echo "$p_med / $base_p" | bc -l)" "$g_min" "$g_med" "$g_max" \
        "$(echo "$g_med / $base_g" | bc -l)"
done
echo
echo "per-hop telemetry, 3 processes (--debug; first prefill requests and the last decode step):"
# shellcheck disable=SC2086
DEBUG=1 run ${SPLITS[3]} >/dev/null
grep "request " "$TMP/coord.log" | head -3 | sed 's/^ds4 coordinator: /  /'
grep "request " "$TMP/coord.log" | tail -1 | sed 's/^ds4 coordinator: /  /'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
