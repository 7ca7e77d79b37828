#!/usr/bin/env bash
# README and docs/architecture.md claim only what the tests and code assert:
# - "bit-for-bit" / "bit-identical" only where a test compares with memcmp:
#   ds4-numerics prefill vs decode is checked against a tolerance, and the
#   README must quote the tolerance tests/unit/test_forward.c uses;
# - the disk cache's eviction weighs hits (src/kvdisk.h), so no "LRU" or
#   "least-recently-used", and the score the README gives is the header's;
# - rewinds allocate ring checkpoints (src/engine.c), so the session is not
#   called "one allocation" without them.
set -u
cd "$(dirname "$0")/../.."
status=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; status=1; }

bound=$(grep -oE 'CHECK\(r\.rel < [0-9.e-]+ && r\.argmax_bad == 0, "numerics: decode vs prefill' tests/unit/test_forward.c |
        sed -E 's/CHECK\(r\.rel < ([0-9.e-]+).*/\1/')
if [ -z "$bound" ]; then bad "test_forward.c no longer has the numerics decode-vs-prefill check"
elif grep -q "below $bound" README.md && ! grep -qiE 'decode agree bit-for-bit|bit-for-bit with the ds4' README.md; then
    ok "README quotes the numerics prefill/decode bound ($bound), no bit-for-bit claim"
else bad "README's prefill/decode claim does not match test_forward.c's bound $bound"; fi
grep -q 'memcmp(out, again' tests/unit/test_forward.c && grep -q 'restore + continue is bit-identical' README.md &&
    ok "bit-identical restore: claimed and compared with memcmp" || bad "restore claim vs test_forward.c"
grep -qiE 'bit-for-bit against decode' docs/architecture.md && bad "architecture.md claims bit-for-bit chunking" ||
    ok "architecture.md: no bit-for-bit chunking claim"

formula=$(grep -oE '6 h \* log2\(1 \+ hits\)' src/kvdisk.h)
if [ -z "$formula" ]; then bad "src/kvdisk.h no longer states the eviction score"
elif grep -qF "$formula" README.md && ! grep -qiE 'least-recently-used|\bLRU\b' README.md docs/architecture.md; then
    ok "eviction described by its score ($formula), not as LRU"
else bad "README/architecture eviction wording does not match src/kvdisk.h ($formula)"; fi

if grep -q 'malloc(ds4_kv_ring_bytes' src/engine.c; then
    grep -qE 'Session state is one allocation|one allocation\)' docs/architecture.md README.md &&
        bad "docs call session state one allocation while rewind checkpoints allocate" ||
        ok "one-allocation claim names the rewind checkpoints"
else ok "rewind checkpoints no longer allocate lazily (claim unchecked)"; fi
exit $status
