#!/usr/bin/env bash
# Benchmark (prints a table, never asserts; not run by `make test`):
# --ssd-streaming against plain mmap inside a cgroup v1 memory limit, for a
# model larger than the limit (e.g. ds4-make-model --preset flash --layers 8).
#
#   [ROWS="mmap 50 ..."] [DS4_BENCH=other/ds4-bench] \
#     tests/ssd/bench_ssd_cgroup.sh MODEL LIMIT_GIB [GEN_TOKENS] [PROMPT_TOKENS] [REPS]
#
# Needs root and the cgroup v1 memory controller: the runs go into a child of
# this shell's memory cgroup. Before every run the model's page cache is
# dropped, so page cache charged elsewhere never helps a run. Rows: plain
# mmap, the automatic budget (with the default preload), exact slot counts of
# 25/50/75% of all experts (cold), the 50% row without next-layer guesses
# (--ssd-streaming-no-predict); then two unlimited ceilings: the mapped
# model with its page cache filled first (other processes' memory pressure
# can evict part of it again: the major faults column shows how much), and
# a really resident run, every expert in a slot, all read at start (it needs
# the whole model in anonymous memory, so it is skipped with a line when
# MemAvailable is short). RSS is the peak resident set (GNU time %M); wall
# is the whole process, start-up and warm-up included; cgroup peak is memory.max_usage_in_bytes (RSS + page cache charged to the
# run). The decode hit rate counts experts present when their layer's router
# ran, guessed ones included; "guesses right" is the share of guessed
# experts the router then chose (whole run, from --ssd-streaming-stats).
# REPS sweeps run the rows in turn, so a change in machine load hits every
# row. First, when fio is installed, the disk's figures on the model file
# (O_DIRECT: sequential 1 MiB reads; random reads of one expert matrix by 8
# threads, as the cache's readers issue them).
set -eu
model=$1; limit_gib=$2; gen=${3:-16}; prompt=${4:-32}; reps=${5:-1}
bench=${DS4_BENCH:-./ds4-bench}   # another build's ds4-bench, for A/B runs
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

# run NAME MODE ds4-bench options... MODE: limit (inside the cgroup, model
# dropped from the page cache), warm (no limit, page cache filled with cat)
# or cold (no limit, model dropped from the page cache)
run() {
    local name=$1 mode=$2; shift 2
    local out=/tmp/ds4-ssd-bench-$$.out err=/tmp/ds4-ssd-bench-$$.err
    local enter=()
    case $mode in
        limit)
            drop_cache
            echo 0 > "$cg/memory.max_usage_in_bytes"
            enter=(sh -c "echo \$\$ > $cg/cgroup.procs && exec \"\$@\"" sh) ;;
        warm) cat "$model" > /dev/null ;;
        cold) drop_cache ;;
    esac
    if ! "${enter[@]}" /usr/bin/time -f 'maxrss_kb %M majflt %F wall %e' "$bench" -m "$model" -t 2 --ctx-start "$prompt" \
            --ctx-max "$prompt" --gen-tokens "$gen" "$@" > "$out" 2> "$err"; then
        echo "| $name | failed: $(grep -v -e maxrss -e 'Command exited' "$err" | tail -1) |"
        return
    fi
    local row rss majflt wall peak=-
    row=$(tail -1 "$out")
    rss=$(awk '/maxrss_kb/{printf "%.2f", $2 / 1048576}' "$err")
    majflt=$(awk '/maxrss_kb/{print $4}' "$err") wall=$(awk '/maxrss_kb/{print $6}' "$err")
    [ "$mode" = limit ] && peak=$(awk '{printf "%.2f", $1 / 1073741824}' "$cg/memory.max_usage_in_bytes")
    IFS=, read -r _ pre gen_tps _ hit mib rd stall <<< "$row"
    local guess
    guess=$(sed -n 's/.*next-layer guesses \([0-9.]*%\) right.*/\1/p' "$err")
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$name" "$pre" "$gen_tps" "${hit:--}" \
        "${mib:--}" "${rd:--}" "${stall:--}" "${guess:--}" "$majflt" "$rss" "$peak" "$wall"
    rm -f "$out" "$err"
}

printf 'model %s: %s layers x %s experts, %.2f GiB file; limit %s GiB; %s prompt + %s generated tokens; load %s\n' \
    "$model" "$layers" "$experts" "$(stat -c %s "$model" | awk '{print $1 / 1073741824}')" "$limit_gib" "$prompt" "$gen" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${FIO:-1}" != 0 ] && command -v fio > /dev/null; then   # FIO=0: skip (measured once is enough)
    fio_mib() {
        fio --name=d --filename="$model" --readonly --direct=1 --time_based --runtime=10 --group_reporting \
            --output-format=json "$@" 2> /dev/null |
            python3 -c 'import json, sys; print("%.0f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"] / 2**20))'
    }
    echo "disk (fio, O_DIRECT, model file): sequential 1 MiB reads $(fio_mib --rw=read --bs=1M --ioengine=psync) MiB/s;" \
         "random 2304 KiB reads, 8 threads $(fio_mib --rw=randread --bs=2304k --ioengine=psync --numjobs=8 --thread) MiB/s;" \
         "load $(cut -d' ' -f1-3 /proc/loadavg)"
fi
echo '| run | prefill t/s | decode t/s | decode hit rate | MiB read / token | read MiB/s | decode stall s | guesses right | major faults | peak RSS GiB | cgroup peak GiB | wall s |'
echo '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|'
# ROWS="mmap auto 25 50 75 nopredict warm resident" (the default) picks rows,
# so a series can be split into runs short enough for a shared machine
want() { case " ${ROWS:-mmap auto 25 50 75 nopredict warm resident} " in *" $1 "*) return 0 ;; esac; return 1; }
for rep in $(seq "$reps"); do
    echo "| sweep $rep, load $(cut -d' ' -f1-3 /proc/loadavg) | | | | | | | | | | | |"
    want mmap && run "plain mmap, limit ${limit_gib} GiB" limit
    want auto && run "--ssd-streaming (auto budget, preload)" limit --ssd-streaming --ssd-streaming-stats
    for pct in 25 50 75; do
        want $pct && run "--ssd-streaming, ${pct}% of experts ($((all * pct / 100)) slots), cold" limit --ssd-streaming \
            --ssd-streaming-cache-experts $((all * pct / 100)) --ssd-streaming-cold --ssd-streaming-stats
    done
    want nopredict && run "--ssd-streaming, 50% of experts, cold, no next-layer guesses" limit --ssd-streaming \
        --ssd-streaming-cache-experts $((all / 2)) --ssd-streaming-cold --ssd-streaming-no-predict
    want warm && run "mapped, no limit, warm page cache" warm
    if want resident; then
        avail_kib=$(awk '/MemAvailable/{print $2}' /proc/meminfo)
        need_kib=$(( $(stat -c %s "$model") / 1024 + (1 << 20) ))
        if [ "$avail_kib" -gt "$need_kib" ]; then
            run "resident: every expert in a slot, read at start, no limit" cold --ssd-streaming \
                --ssd-streaming-cache-experts "$all" --ssd-streaming-preload-experts "$all"
        else
            echo "| resident (every expert in a slot) | skipped: MemAvailable $((avail_kib >> 20)) GiB < $((need_kib >> 20)) GiB |"
        fi
    fi
done
echo "end: load $(cut -d' ' -f1-3 /proc/loadavg)"
