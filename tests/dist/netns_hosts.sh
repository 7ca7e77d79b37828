# shellcheck shell=bash
# Sourced by tests/dist/test_dist_netns.sh and bench_dist_link.sh: N "hosts"
# on one switch, each a network namespace of its own, so the pipeline's
# processes talk as separate machines do (each its own addresses, routes and
# loopback) while no packet leaves the namespaces made here.
#   netns_hosts_up TAG N   namespaces ${TAG}h0 .. ${TAG}h<N-1>, host i at
#                          10.77.0.<i+1>/24 on eth0, a veth whose other end
#                          is a port of a bridge in namespace ${TAG}sw (the
#                          switch; it has no address, so it forwards frames
#                          and routes nothing); returns non-zero (and leaves
#                          what it made for netns_hosts_down) when the kernel
#                          or the user cannot make them (needs root)
#   netns_host TAG I CMD...  runs CMD on host I (exec: $! is CMD's pid)
#   netns_host_addr I      host I's address
#   netns_hosts_down TAG   deletes every namespace of TAG; deleting a
#                          namespace deletes the veth ends in it, and so
#                          the pairs; safe to call twice and from a trap
netns_host_addr() { echo "10.77.0.$(($1 + 1))"; }

netns_host() { local tag=$1 i=$2; shift 2; ip netns exec "${tag}h$i" "$@"; }

netns_hosts_up() {
    local tag=$1 n=$2 i sw=${1}sw
    ip netns add "$sw" || return 1
    ip -n "$sw" link add br0 type bridge || return 1
    ip -n "$sw" link set br0 up || return 1
    for ((i = 0; i < n; i++)); do
        ip netns add "${tag}h$i" || return 1
        ip link add eth0 netns "${tag}h$i" type veth peer name "port$i" netns "$sw" || return 1
        ip -n "$sw" link set "port$i" master br0 up || return 1
        ip -n "${tag}h$i" addr add "$(netns_host_addr "$i")/24" dev eth0 || return 1
        ip -n "${tag}h$i" link set eth0 up || return 1
        ip -n "${tag}h$i" link set lo up || return 1
    done
}

netns_hosts_down() {
    local tag=$1 ns
    for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }'); do
        case $ns in "${tag}h"[0-9]* | "${tag}sw") ip netns del "$ns" 2>/dev/null || true ;; esac
    done
}
