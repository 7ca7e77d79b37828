#!/usr/bin/env bash
# Short libFuzzer run of every target over its committed corpus: catches
# regressions on known-tricky inputs in `make test`. Long runs are manual:
#   build/fuzz/fuzz_NAME fuzz/corpus/NAME -max_total_time=1800
set -euo pipefail
BUILD=${1:-build}
for f in "$BUILD"/fuzz/fuzz_*; do
    name=${f##*/fuzz_}
    mkdir -p "fuzz/corpus/$name"
    work=$(mktemp -d)
    "$f" "$work" "fuzz/corpus/$name" -max_total_time=${FUZZ_SECONDS:-10} -rss_limit_mb=2048 \
        -print_final_stats=1 2>&1 | grep -E "stat::number_of_executed_units|ERROR|SUMMARY" | sed "s/^/$name: /"
    rm -rf "$work"
done
