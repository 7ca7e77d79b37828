#!/usr/bin/env bash
# Every symbol the library exports starts with ds4_, so it links into any
# program without claiming a name the program might use (static functions and
# the binaries' own modules are free to name themselves).
set -u
cd "$(dirname "$0")/../.."
lib=${BUILD:-build}/libds4.a
[ -f "$lib" ] || { echo "FAIL $lib not built (make all)"; exit 1; }
syms=$(nm -g --defined-only "$lib" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TDBRCV]$/ {print $3}' | sort -u)
[ -n "$syms" ] || { echo "FAIL no exported symbols read from $lib"; exit 1; }
bad=$(printf '%s\n' "$syms" | grep -v '^ds4_')
if [ -n "$bad" ]; then
    echo "FAIL exported without the ds4_ prefix:"; printf '  %s\n' $bad; exit 1
fi
echo "ok   $(printf '%s\n' "$syms" | wc -l) exported symbols, every one ds4_*"
