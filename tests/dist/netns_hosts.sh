# shellcheck shell=bash
# Sourced by tests/dist/test_dist_netns.sh, test_netdelay.sh and
# bench_dist_link.sh: N "hosts" on one switch, each a network namespace of
# its own, so the pipeline's processes talk as separate machines do (each its
# own addresses, routes and loopback) while no packet leaves the namespaces
# made here.
#   netns_hosts_up TAG N [DELAY_MS]
#                          namespaces ${TAG}h0 .. ${TAG}h<N-1>, host i at
#                          10.77.0.<i+1>/24 on eth0, and a switch namespace
#                          ${TAG}sw. Without DELAY_MS eth0 is a veth whose
#                          other end is a port of a bridge in the switch (it
#                          has no address, so it forwards frames and routes
#                          nothing). With DELAY_MS eth0 is a TAP device of
#                          ./ds4-netdelay, run in the switch namespace, which
#                          switches the frames itself and releases each one
#                          DELAY_MS after it came (a round trip pays 2 x
#                          DELAY_MS): the delay `tc qdisc ... netem` would add,
#                          for kernels without netem; its log is
#                          ${NETNS_DELAY_LOG:-/dev/null}. Returns non-zero
#                          (and leaves what it made for netns_hosts_down)
#                          when the kernel or the user cannot make them
#                          (needs root)
#   netns_host TAG I CMD...  runs CMD on host I and waits for it
#   netns_spawn TAG I CMD... starts CMD on host I in the background; its pid
#                          (what `kill` must be given) in NETNS_PID. Not
#                          `netns_host ... &`: that backgrounds a subshell
#                          running the function, and killing the subshell
#                          leaves CMD running.
#   netns_host_addr I      host I's address
#   netns_test_begin NAME N  for a test script: TAG, TMP (removed at exit),
#                          PIDS (killed at exit), N hosts up (deleted at
#                          exit), passed=0 failed=0 and check OK WHAT; says
#                          why and exits 77 (a skip, which CI as root counts
#                          as a failure) when not root or when the
#                          namespaces cannot be made
#   netns_hosts_down TAG   stops the delaying switch, deletes every
#                          namespace of TAG; deleting a namespace deletes
#                          the veth ends in it, and so the pairs; safe to
#                          call twice and from a trap
NETNS_DELAY_PID="" NETNS_PID=""
netns_host_addr() { echo "10.77.0.$(($1 + 1))"; }

netns_host() { local tag=$1 i=$2; shift 2; ip netns exec "${tag}h$i" "$@"; }

# `ip netns exec` execs CMD, so the background job's pid is CMD's
netns_spawn() { local tag=$1 i=$2; shift 2; ip netns exec "${tag}h$i" "$@" & NETNS_PID=$!; }

# The switch's wake-ups decide how exactly it keeps the delay on a loaded
# machine, so it runs as a real-time process where the kernel allows (it
# sleeps between frames and uses little CPU).
netns_delay_switch() {
    local tag=$1 delay=$2 n=$3 i hosts=() ready=""
    for ((i = 0; i < n; i++)); do hosts+=("${tag}h$i"); done
    local rt=(chrt -f 10)
    chrt -f 10 true 2>/dev/null || rt=()
    exec {NETNS_DELAY_FD}< <(exec ip netns exec "${tag}sw" "${rt[@]}" ./ds4-netdelay --delay "$delay" "${hosts[@]}" \
        2>>"${NETNS_DELAY_LOG:-/dev/null}")
    NETNS_DELAY_PID=$!
    read -r -t 10 ready <&"$NETNS_DELAY_FD" || true
    [ "$ready" = ready ]
}

netns_hosts_up() {
    local tag=$1 n=$2 delay=${3:-} i sw=${1}sw
    ip netns add "$sw" || return 1
    for ((i = 0; i < n; i++)); do ip netns add "${tag}h$i" || return 1; done
    if [ -n "$delay" ]; then
        netns_delay_switch "$tag" "$delay" "$n" || return 1
    else
        ip -n "$sw" link add br0 type bridge || return 1
        ip -n "$sw" link set br0 up || return 1
        for ((i = 0; i < n; i++)); do
            ip link add eth0 netns "${tag}h$i" type veth peer name "port$i" netns "$sw" || return 1
            ip -n "$sw" link set "port$i" master br0 up || return 1
        done
    fi
    for ((i = 0; i < n; i++)); do
        ip -n "${tag}h$i" addr add "$(netns_host_addr "$i")/24" dev eth0 || return 1
        ip -n "${tag}h$i" link set eth0 up || return 1
        ip -n "${tag}h$i" link set lo up || return 1
    done
}

netns_hosts_down() {
    local tag=$1 ns
    if [ -n "$NETNS_DELAY_PID" ]; then
        kill "$NETNS_DELAY_PID" 2>/dev/null || true
        wait "$NETNS_DELAY_PID" 2>/dev/null || true
        exec {NETNS_DELAY_FD}<&-
        NETNS_DELAY_PID="" NETNS_PID=""
    fi
    for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }'); do
        case $ns in "${tag}h"[0-9]* | "${tag}sw") ip netns del "$ns" 2>/dev/null || true ;; esac
    done
}

netns_test_cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    netns_hosts_down "$TAG"
    rm -rf "$TMP"
}

netns_test_begin() {
    TAG=ds4t$$
    TMP=$(mktemp -d)
    PIDS=()
    passed=0 failed=0
    trap netns_test_cleanup EXIT
    if [ "$(id -u)" != 0 ]; then
        echo "$1: SKIPPED: needs root (ip netns)"
        exit 77
    fi
    if ! netns_hosts_up "$TAG" "$2" 2>"$TMP/netns.err"; then
        echo "$1: SKIPPED: cannot make network namespaces: $(tail -1 "$TMP/netns.err")"
        exit 77
    fi
}

check() {   # check OK WHAT
    if [ "$1" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $2" >&2; fi
}
