#!/usr/bin/env bash
# Benchmark (prints a table, never asserts; not run by `make test`):
# --ssd-streaming against plain mmap inside a cgroup v1 memory limit, for a
# model larger than the limit (e.g. ds4-make-model --preset flash --layers 8).
#
#   tests/ssd/bench_ssd_cgroup.sh MODEL LIMIT_GIB [GEN_TOKENS] [PROMPT_TOKENS] [REPS]
#
# Needs root and the cgroup v1 memory controller: the runs go into a child of
# this shell's memory cgroup. Before every run the model's page cache is
# dropped, so page cache charged elsewhere never helps a run. Rows: plain
# mmap, the automatic budget (with the default preload), exact slot counts of
# 25/50/75% of all experts (cold), and the fully resident ceiling (no limit,
# page cache warm), plus the 50% row without next-layer guesses
# (--ssd-streaming-no-predict). RSS is the peak resident set (GNU time %M);
# cgroup peak is memory.max_usage_in_bytes (RSS + page cache charged to the
# run). The decode hit rate counts experts present when their layer's router
# ran, guessed ones included; "guesses right" is the share of guessed
# experts the router then chose (whole run, from --ssd-streaming-stats).
# REPS sweeps run the rows in turn, so a change in machine load hits every
# row. First, when fio is installed, the disk's figures on the model file
# (O_DIRECT: sequential 1 MiB reads; random reads of one expert matrix by 8
# threads, as the cache's readers issue them).
set -eu
model=$1; limit_gib=$2; gen=${3:-16}; prompt=${4:-32}; reps=${5:-1}
cd "$(dirname "$0")/../.."
own=$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)
cg=/sys/fs/cgroup/memory${own}/ds4-ssd-bench-$$
mkdir "$cg"
trap 'rmdir "$cg" 2>/dev/null || true' EXIT
echo $((limit_gib << 30)) > "$cg/memory.limit_in_bytes"

experts=$(./ds4-gguf-dump "$model" | awk '/deepseek4.expert_count /{print $3}')
layers=$(./ds4-gguf-dump "$model" | awk '/deepseek4.block_count /{print $3}')
all=$((experts * layers))

drop_cache() { python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$model"; }

# run NAME LIMITED(0|1) ds4-bench options...
run() {
    local name=$1 limited=$2; shift 2
    local out=/tmp/ds4-ssd-bench-$$.out err=/tmp/ds4-ssd-bench-$$.err
    local enter=()
    if [ "$limited" = 1 ]; then
        drop_cache
        echo 0 > "$cg/memory.max_usage_in_bytes"
        enter=(sh -c "echo \$\$ > $cg/cgroup.procs && exec \"\$@\"" sh)
    else
        cat "$model" > /dev/null
    fi
    if ! "${enter[@]}" /usr/bin/time -f 'maxrss_kb %M' ./ds4-bench -m "$model" -t 2 --ctx-start "$prompt" \
            --ctx-max "$prompt" --gen-tokens "$gen" "$@" > "$out" 2> "$err"; then
        echo "| $name | failed: $(grep -v -e maxrss -e 'Command exited' "$err" | tail -1) |"
        return
    fi
    local row rss peak=-
    row=$(tail -1 "$out")
    rss=$(awk '/maxrss_kb/{printf "%.2f", $2 / 1048576}' "$err")
    [ "$limited" = 1 ] && peak=$(awk '{printf "%.2f", $1 / 1073741824}' "$cg/memory.max_usage_in_bytes")
    IFS=, read -r _ pre gen_tps _ hit mib rd stall <<< "$row"
    local guess
    guess=$(sed -n 's/.*next-layer guesses \([0-9.]*%\) right.*/\1/p' "$err")
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$pre" "$gen_tps" "${hit:--}" "${mib:--}" \
        "${rd:--}" "${stall:--}" "${guess:--}" "$rss" "$peak"
    rm -f "$out" "$err"
}

printf 'model %s: %s layers x %s experts, %.2f GiB file; limit %s GiB; %s prompt + %s generated tokens; load %s\n' \
    "$model" "$layers" "$experts" "$(stat -c %s "$model" | awk '{print $1 / 1073741824}')" "$limit_gib" "$prompt" "$gen" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
if command -v fio > /dev/null; then
    fio_mib() {
        fio --name=d --filename="$model" --readonly --direct=1 --time_based --runtime=10 --group_reporting \
            --output-format=json "$@" 2> /dev/null |
            python3 -c 'import json, sys; print("%.0f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"] / 2**20))'
    }
    echo "disk (fio, O_DIRECT, model file): sequential 1 MiB reads $(fio_mib --rw=read --bs=1M --ioengine=psync) MiB/s;" \
         "random 2304 KiB reads, 8 threads $(fio_mib --rw=randread --bs=2304k --ioengine=psync --numjobs=8 --thread) MiB/s;" \
         "load $(cut -d' ' -f1-3 /proc/loadavg)"
fi
echo '| run | prefill t/s | decode t/s | decode hit rate | MiB read / token | read MiB/s | decode stall s | guesses right | peak RSS GiB | cgroup peak GiB |'
echo '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|'
for rep in $(seq "$reps"); do
    echo "| sweep $rep, load $(cut -d' ' -f1-3 /proc/loadavg) | | | | | | | | | |"
    run "plain mmap, limit ${limit_gib} GiB" 1
    run "--ssd-streaming (auto budget, preload)" 1 --ssd-streaming --ssd-streaming-stats
    for pct in 25 50 75; do
        run "--ssd-streaming, ${pct}% of experts ($((all * pct / 100)) slots), cold" 1 --ssd-streaming \
            --ssd-streaming-cache-experts $((all * pct / 100)) --ssd-streaming-cold --ssd-streaming-stats
    done
    run "--ssd-streaming, 50% of experts, cold, no next-layer guesses" 1 --ssd-streaming \
        --ssd-streaming-cache-experts $((all / 2)) --ssd-streaming-cold --ssd-streaming-no-predict
    run "fully resident (no limit, warm page cache)" 0
done
