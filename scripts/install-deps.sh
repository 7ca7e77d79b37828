#!/usr/bin/env bash
# Installs the system packages that the build, `make demo` and `make test`
# need, on Debian 12 / 13 or Ubuntu 24.04 (as root, or through sudo). Python
# packages are not installed here: the test-only ones go into the repository's
# .venv (`make venv`, which `make test` runs), and nothing else needs any.
#
# libFuzzer (the fuzz smoke of `make test`) ships in compiler-rt, whose
# package is versioned like clang (libclang-rt-14-dev on Debian 12, -18- on
# Ubuntu 24.04, -19- on Debian 13): the one matching the installed clang is
# chosen, falling back to the distribution's unversioned libclang-rt-dev.
#
# --print: only print the packages this machine would get (nothing installed).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
print_only=0
[ "${1:-}" = --print ] && print_only=1
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
# libibverbs-dev: the RDMA transport of --tensor-parallel (the Makefile links
# it when its header is there; a build without it refuses --transport rdma)
base="build-essential clang libcjson-dev libpcre2-dev libedit-dev libnng-dev libsimde-dev libibverbs-dev qemu-user tmux curl xz-utils python3 python3-venv"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
updated=0
install_missing() {
    local missing=""
    for p in "$@"; do installed "$p" || missing="$missing $p"; done
    [ -z "$missing" ] && return 0
    # the package lists are fetched only when something is missing, so a
    # machine that has everything needs no network here
    [ $updated = 1 ] || { as_root apt-get update -qq; updated=1; }
    as_root apt-get install -y -qq $missing >/dev/null
}

runtime_package() {
    local major
    major=$(clang --version 2>/dev/null | sed -n 's/.*clang version \([0-9][0-9]*\).*/\1/p' | head -n1)
    if [ -n "$major" ] && { installed "libclang-rt-$major-dev" ||
                            apt-cache show "libclang-rt-$major-dev" >/dev/null 2>&1; }; then
        echo "libclang-rt-$major-dev"
    else
        echo "libclang-rt-dev"
    fi
}

if [ $print_only = 1 ]; then
    echo "$base $(runtime_package)"
    exit 0
fi
install_missing $base                # clang first: its version picks the runtime
rt=$(runtime_package)
if ! installed "$rt" && [ $updated = 0 ]; then as_root apt-get update -qq; updated=1; rt=$(runtime_package); fi
install_missing "$rt"
echo "system packages present: $base $rt"
