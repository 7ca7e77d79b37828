#!/usr/bin/env bash
# Runs every unit-test binary (one per tests/unit/test_*.c, from $BUILD/tests),
# then every script test (tests/**/test_*.sh and tests/**/test_*.py), then the
# fuzz smoke, from the repository root. Each is one suite with one outcome:
#   ok       exit status 0
#   SKIP     exit status 77 (the automake convention): the suite cannot run
#            here (a tool or input is missing) and printed why. Never counted
#            as passed.
#   FAIL     any other status, or a unit-test binary that was never built
#   TIMEOUT  still running after TEST_TIMEOUT seconds (default 900): the
#            suite's whole process group is killed and it counts as failed,
#            so a hung test cannot hang CI.
# With CI=true every suite is required (.ci/run installs what each needs), so
# a skip there, the fuzz smoke's included, is a failure.
# The last line is the summary CI reads: "N passed, N failed, N skipped".
set -u
BUILD=${BUILD:-build}
TEST_TIMEOUT=${TEST_TIMEOUT:-900}
SKIPPED=77
in_ci=0; [ "${CI:-}" = true ] && in_ci=1
cd "$(dirname "$0")/.."
passed=0; failed=0; skipped=0; failed_names=(); skipped_names=()
fail() { failed=$((failed+1)); failed_names+=("$1"); echo "$2 $1${3:+ ($3)}"; }
skip() {
    if [ $in_ci = 1 ]; then fail "$1" "FAIL" "skipped, and CI requires it${2:+: $2}"
    else skipped=$((skipped+1)); skipped_names+=("$1"); echo "SKIP $1${2:+ ($2)}"; fi
}
run() {
    local name=$1; shift
    local t0=$SECONDS status
    timeout -k 10 "$TEST_TIMEOUT" "$@"
    status=$?
    local took="$((SECONDS-t0))s"
    case $status in
        0) passed=$((passed+1)); echo "ok   $name ($took)" ;;
        "$SKIPPED") skip "$name" "exit $SKIPPED, $took" ;;
        124|137) fail "$name" "TIMEOUT" "killed after ${TEST_TIMEOUT}s" ;;
        *) fail "$name" "FAIL" "exit $status, $took" ;;
    esac
}
# Driven by the sources, not by what happens to be in $BUILD: an empty or
# stale build directory fails here instead of passing with nothing run.
n_unit=0
for src in tests/unit/test_*.c; do
    [ -e "$src" ] || continue
    n_unit=$((n_unit+1))
    t=$BUILD/tests/$(basename "$src" .c)
    if [ -x "$t" ]; then run "$(basename "$t")" "$t"
    else fail "$(basename "$t")" "FAIL" "$t not built (make $t)"; fi
done
[ $n_unit = 0 ] && fail "unit tests" "FAIL" "no tests/unit/test_*.c found"
if [ "${UNIT_ONLY:-0}" = 1 ]; then
    echo "(unit-only run: script tests and the fuzz smoke are not part of it)"
else
    while IFS= read -r s; do
        case $s in
            *.sh) run "$s" env BUILD="$BUILD" bash "$s" ;;
            *.py) run "$s" env BUILD="$BUILD" python3 "$s" ;;
        esac
    done < <(find tests -path tests/unit -prune -o \( -name 'test_*.sh' -o -name 'test_*.py' \) -print | sort)
    # The fuzz targets need clang with libFuzzer (the clang runtime package);
    # without it the smoke cannot run, and says so.
    if ! ls fuzz/fuzz_*.c >/dev/null 2>&1; then
        skip fuzz-smoke "no fuzz targets in fuzz/"
    elif ! command -v clang >/dev/null; then
        skip fuzz-smoke "clang not installed"
    elif ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
            clang -x c -fsanitize=fuzzer - -o /dev/null >/dev/null 2>&1; then
        skip fuzz-smoke "clang cannot link -fsanitize=fuzzer (install the clang runtime package, see README)"
    else
        run fuzz-smoke make -s BUILD="$BUILD" fuzz-smoke
    fi
fi
[ ${#skipped_names[@]} -gt 0 ] && echo "skipped: ${skipped_names[*]}"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
