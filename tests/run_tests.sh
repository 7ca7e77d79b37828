#!/usr/bin/env bash
# Runs every unit-test binary, then every script test (tests/**/test_*.sh and
# tests/**/test_*.py), from the repository root. Each is one suite; the last
# line is the summary CI reads: "N passed, N failed".
set -u
BUILD=${BUILD:-build}
cd "$(dirname "$0")/.."
passed=0; failed=0; failed_names=()
run() {
    local name=$1; shift
    local t0=$SECONDS
    if "$@"; then passed=$((passed+1)); echo "ok   $name ($((SECONDS-t0))s)"
    else failed=$((failed+1)); failed_names+=("$name"); echo "FAIL $name ($((SECONDS-t0))s)"; fi
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run "$(basename "$t")" "$t"
done
[ "${UNIT_ONLY:-0}" = 1 ] || while IFS= read -r s; do
    case $s in
        *.sh) run "$s" env BUILD="$BUILD" bash "$s" ;;
        *.py) run "$s" env BUILD="$BUILD" python3 "$s" ;;
    esac
done < <(find tests -path tests/unit -prune -o \( -name 'test_*.sh' -o -name 'test_*.py' \) -print | sort)
if [ "${UNIT_ONLY:-0}" != 1 ] && [ "$BUILD" = build ] && [ -d fuzz ] && ls fuzz/fuzz_*.c >/dev/null 2>&1 && command -v clang >/dev/null; then
    run fuzz-smoke make -s fuzz-smoke
fi
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
