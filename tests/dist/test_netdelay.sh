#!/usr/bin/env bash
# ds4-netdelay, the delaying switch behind bench_dist_link.sh's delayed rows
# (tests/dist/netns_hosts.sh with a DELAY_MS): two hosts in network
# namespaces on a switch that holds every frame 20 ms. Checks what the
# benchmark relies on:
#   - a TCP round trip between the hosts never takes less than 2 x 20 ms
#     (each frame leaves no earlier than its arrival + the delay: a lower
#     bound by construction, so the check cannot flake on a slow machine;
#     the upper side is the machine's scheduling and is only printed);
#   - 4 MiB sent through it come back byte for byte;
#   - 400 numbered UDP datagrams sent back to back arrive all and in order
#     (one FIFO, no reordering; fewer than the 500 frames a TAP device
#     queues, so none is lost before the switch reads them);
#   - bad arguments give one line and exit 1.
# Needs root (ip netns, TAP devices) like test_dist_netns.sh: without it
# prints why and exits 77, a skip CI fails. Every namespace is deleted at exit.
set -u
cd "$(dirname "$0")/../.." || exit
. tests/dist/netns_hosts.sh
SKIPPED=77
DELAY_MS=20
[ -x ./ds4-netdelay ] || { echo "test_netdelay: SKIPPED: needs ./ds4-netdelay (make test builds it)"; exit $SKIPPED; }
[ "$(id -u)" = 0 ] || { echo "test_netdelay: SKIPPED: needs root (ip netns)"; exit $SKIPPED; }
TAG=ds4d$$
TMP=$(mktemp -d)
ECHO=""
cleanup() {
    [ -n "$ECHO" ] && { kill "$ECHO" 2>/dev/null; wait "$ECHO" 2>/dev/null; }
    netns_hosts_down "$TAG"
    rm -rf "$TMP"
}
trap cleanup EXIT
passed=0 failed=0
check() {   # check OK WHAT
    if [ "$1" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2" >&2; fi
}

for args in "--delay" "--delay -1 a b" "--delay 1 onlyone" "--limit 0 --delay 1 a b" "--bogus"; do
    # shellcheck disable=SC2086
    ./ds4-netdelay $args >/dev/null 2>"$TMP/err"
    rc=$?
    [ "$rc" = 1 ] && [ "$(wc -l <"$TMP/err")" = 1 ]
    check $? "ds4-netdelay $args: exit $rc, want 1 and one line: $(cat "$TMP/err")"
done
./ds4-netdelay --delay 1 ds4d-no-such-ns-a ds4d-no-such-ns-b 2>"$TMP/err"
[ $? = 1 ] && grep -q "cannot enter network namespace ds4d-no-such-ns-a" "$TMP/err"
check $? "a missing namespace: $(cat "$TMP/err")"

NETNS_DELAY_LOG=$TMP/switch.log
if ! netns_hosts_up "$TAG" 2 "$DELAY_MS" 2>"$TMP/netns.err"; then
    echo "test_netdelay: SKIPPED: cannot make the hosts: $(tail -1 "$TMP/netns.err")"
    exit $SKIPPED
fi
SERVER=$(netns_host_addr 1)
exec 3< <(exec ip netns exec "${TAG}h1" python3 tests/dist/link_probe.py echo "$SERVER" 7100)
ECHO=$!
read -r -t 20 line <&3
[ "${line:-}" = listening ]
check $? "the echo server did not start"
probe() { netns_host "$TAG" 0 python3 tests/dist/link_probe.py "$@" "$SERVER" 7100 "${PROBE_ARG}"; }

PROBE_ARG=10 probe ping >"$TMP/ping"
read -r _ min avg max <"$TMP/ping"
echo "test_netdelay: ${DELAY_MS} ms each way: TCP round trip min ${min:-?} avg ${avg:-?} max ${max:-?} ms"
awk -v m="${min:-0}" -v d="$DELAY_MS" 'BEGIN { exit !(m >= 2 * d) }'
check $? "round trip ${min:-none} ms is shorter than 2 x $DELAY_MS ms"

PROBE_ARG=$((4 << 20)) probe bulk >"$TMP/bulk"
grep -qx "bulk ok" "$TMP/bulk"
check $? "4 MiB through the switch: $(cat "$TMP/bulk")"

PROBE_ARG=400 probe udp >"$TMP/udp"
grep -qx "in-order 400" "$TMP/udp"
check $? "400 datagrams: $(cat "$TMP/udp")"

echo "test_netdelay: $passed passed, $failed failed"
[ "$failed" = 0 ]
