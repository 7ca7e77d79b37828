#!/usr/bin/env bash
# tests/run_tests.sh on a throw-away tree of fake suites: a hung suite fails
# as TIMEOUT, a skipping suite (exit 77) is listed as skipped and never as
# passed, CI=true turns a skip into a failure, a unit test that was never
# built fails, and a missing fuzz toolchain or corpus is reported, not hidden.
set -u
cd "$(dirname "$0")/../.."
runner=$PWD/tests/run_tests.sh
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
status=0
expect() {  # expect WHAT OUTPUT_FILE PATTERN
    if grep -qE -- "$3" "$2"; then echo "ok   $1"
    else echo "FAIL $1: no line matching '$3' in:"; sed 's/^/    /' "$2"; status=1; fi
}
expect_rc() {  # expect_rc WHAT GOT WANT
    if [ "$2" = "$3" ]; then echo "ok   $1"; else echo "FAIL $1: exit $2, want $3"; status=1; fi
}

mkdir -p "$tree/tests/unit" "$tree/tests/fake" "$tree/build/tests"
cp "$runner" "$tree/tests/run_tests.sh"
printf 'int main(void) { return 0; }\n' > "$tree/tests/unit/test_built.c"
printf 'int main(void) { return 0; }\n' > "$tree/tests/unit/test_unbuilt.c"
printf '#!/bin/sh\nexit 0\n' > "$tree/build/tests/test_built"
chmod +x "$tree/build/tests/test_built"
printf 'exit 0\n' > "$tree/tests/fake/test_pass.sh"
printf 'echo "needs a tool that is absent"; exit 77\n' > "$tree/tests/fake/test_skip.sh"
printf 'import sys\nsys.exit(3)\n' > "$tree/tests/fake/test_fail.py"
# No fuzz/ directory in the fake tree: the fuzz smoke cannot run.

out=$tree/out.txt
(cd "$tree" && env -u CI bash tests/run_tests.sh) > "$out" 2>&1
expect_rc "local run with failures exits non-zero" $? 1
expect "passing suites pass" "$out" '^ok   test_built '
expect "script suites pass" "$out" '^ok   tests/fake/test_pass.sh '
expect "unbuilt unit test fails" "$out" '^FAIL test_unbuilt \(build/tests/test_unbuilt not built'
expect "exit 77 is a skip" "$out" '^SKIP tests/fake/test_skip.sh '
expect "failing suite fails" "$out" '^FAIL tests/fake/test_fail.py \(exit 3'
expect "fuzz smoke says it did not run" "$out" '^SKIP fuzz-smoke \(no fuzz targets'
expect "skips listed apart" "$out" '^skipped: tests/fake/test_skip.sh fuzz-smoke$'
expect "summary counts" "$out" '^2 passed, 2 failed, 2 skipped$'
rm "$tree/tests/fake/test_fail.py" "$tree/tests/unit/test_unbuilt.c"

# A hung suite, alone with a short limit (so a slow machine cannot turn the
# other suites into timeouts too).
printf 'sleep 600\n' > "$tree/tests/fake/test_hang.sh"
(cd "$tree" && env -u CI TEST_TIMEOUT=3 bash tests/run_tests.sh) > "$out" 2>&1
expect_rc "a hung suite fails the run" $? 1
expect "hung suite is a TIMEOUT" "$out" '^TIMEOUT tests/fake/test_hang.sh \(killed after 3s\)'
rm "$tree/tests/fake/test_hang.sh"

# Skips alone: not a failure locally, a failure in CI.
(cd "$tree" && env -u CI bash tests/run_tests.sh) > "$out" 2>&1
expect_rc "skips alone pass locally" $? 0
expect "local summary" "$out" '^2 passed, 0 failed, 2 skipped$'
(cd "$tree" && CI=true bash tests/run_tests.sh) > "$out" 2>&1
expect_rc "skips fail in CI" $? 1
expect "CI names the skipped suite" "$out" '^FAIL tests/fake/test_skip.sh \(skipped, and CI requires it'
expect "CI fails a fuzz smoke that cannot run" "$out" '^FAIL fuzz-smoke \(skipped, and CI requires it'
expect "CI summary" "$out" '^2 passed, 2 failed, 0 skipped$'

# An empty build directory is a failure, not "0 failed".
rm "$tree/build/tests/test_built"
(cd "$tree" && env -u CI bash tests/run_tests.sh) > "$out" 2>&1
expect_rc "empty build directory fails" $? 1
expect "empty build directory names the binary" "$out" '^FAIL test_built \(build/tests/test_built not built'
exit $status
