#!/usr/bin/env bash
# Benchmark (prints a table, never asserts; not run by `make test`): the
# expert cache's reader design against io_uring, with fio on one file.
#
#   tests/ssd/bench_fio_readers.sh FILE [REPS] [SECONDS]
#
# Random O_DIRECT reads of one expert matrix (2304 KiB, the size of a
# Flash q2 gate/up matrix) and of 4 KiB, by N threads each issuing one
# pread at a time (what src/models/dsv4/expert_cache.c does with its 8 readers) against
# one thread keeping N reads in flight through io_uring (fio's own io_uring
# engine, no liburing needed), N = 8, 16, 32; then sequential 1 MiB reads.
# FILE must exist and be at least a few GiB (a model file will do; it is only
# read). REPS sweeps run the rows in turn, so a change in machine load hits
# every row; the load average is printed with each sweep.
set -eu
file=$1; reps=${2:-3}; secs=${3:-8}
command -v fio > /dev/null || { echo "fio is not installed (apt-get install fio)"; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# row LABEL fio-options...
row() {
    local label=$1; shift
    if ! fio --name=r --filename="$file" --readonly --direct=1 --time_based --runtime="$secs" --group_reporting \
            --output-format=json "$@" > "$out" 2> /dev/null; then
        echo "| $label | fio failed | | | |"
        return
    fi
    python3 - "$label" "$out" <<'PY'
import json, sys
job = json.load(open(sys.argv[2]))["jobs"][0]
r = job["read"]
print("| %s | %.0f | %.0f | %.2f | %.1f |" % (sys.argv[1], r["bw_bytes"] / 2**20, r["iops"], r["clat_ns"]["mean"] / 1e6,
                                            job["usr_cpu"] + job["sys_cpu"]))
PY
}

echo "file $file ($(stat -c %s "$file" | awk '{printf "%.2f GiB", $1 / 1073741824}')), ${secs} s per row"
echo '| reads | MiB/s | IOPS | mean latency ms | CPU % |'
echo '|---|---:|---:|---:|---:|'
for rep in $(seq "$reps"); do
    echo "| sweep $rep, load $(cut -d' ' -f1-3 /proc/loadavg) | | | | |"
    for bs in 2304k 4k; do
        for n in 8 16 32; do
            row "random $bs, $n threads x pread" --rw=randread --bs=$bs --ioengine=psync --numjobs=$n --thread
            row "random $bs, io_uring depth $n" --rw=randread --bs=$bs --ioengine=io_uring --iodepth=$n
        done
    done
    row "sequential 1 MiB, 1 thread x pread" --rw=read --bs=1M --ioengine=psync
    row "sequential 1 MiB, io_uring depth 8" --rw=read --bs=1M --ioengine=io_uring --iodepth=8
done
