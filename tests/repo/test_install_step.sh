#!/usr/bin/env bash
# The install path a newcomer and CI share works on current Debian/Ubuntu:
# - no clang-runtime package is pinned to one LLVM version (Debian 13 and
#   Ubuntu 24.04 have no libclang-rt-14-dev): scripts/install-deps.sh picks
#   the one matching the installed clang;
# - no bare `pip install` into the system Python (refused there as an
#   "externally-managed-environment"): `make venv` makes .venv, `make test`
#   depends on it, and the venv it makes imports every test oracle package;
# - .ci/run uses exactly that path, and the README's first block stays the
#   two commands for a fresh machine: `scripts/install-deps.sh && make demo`
#   (set up, build, run the demo) and `make test`.
set -u
cd "$(dirname "$0")/../.."
status=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; status=1; }

pinned=$(grep -nE 'libclang-rt-[0-9]+-dev' .ci/run README.md Makefile mk/*.mk scripts/*.sh | grep -vE '^[^:]+:[0-9]+:[[:space:]]*#')
[ -z "$pinned" ] && ok "no version-pinned clang runtime outside comments" || bad "pinned clang runtime: $pinned"

bare_pip=$(grep -nE '(^|[^/])pip3? install|-m pip install' .ci/run README.md scripts/*.sh | grep -v 'VENV\|\.venv')
[ -z "$bare_pip" ] && ok "no pip install outside the venv" || bad "pip outside the venv: $bare_pip"

if command -v clang >/dev/null; then
    major=$(clang --version | sed -n 's/.*clang version \([0-9][0-9]*\).*/\1/p' | head -n1)
    pkgs=$(bash scripts/install-deps.sh --print)
    case " $pkgs " in
        *" libclang-rt-$major-dev "*|*" libclang-rt-dev "*) ok "runtime package follows clang $major" ;;
        *) bad "install-deps.sh --print gives '$pkgs' for clang $major" ;;
    esac
else
    bad "clang is not installed (scripts/install-deps.sh installs it)"
fi

grep -qx 'bash scripts/install-deps.sh' .ci/run && grep -qx 'make test' .ci/run &&
    ! grep -qE 'pip3? install' .ci/run && ok ".ci/run = install-deps.sh + make test" || bad ".ci/run does not follow the README's path"

first_block=$(awk '/^```/{n++; next} n==1' README.md | sed 's/[[:space:]]*#.*//; s/[[:space:]]*$//' | grep -v '^$')
[ "$first_block" = "$(printf 'scripts/install-deps.sh && make demo\nmake test')" ] &&
    ok "README's first block: scripts/install-deps.sh && make demo, make test" ||
    bad "README's first block is: $first_block"

make -n test 2>/dev/null | grep -q '\.venv/bin' && ok "make test runs with .venv first on PATH" || bad "make test does not use .venv"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if make -s venv VENV="$tmp/venv" >"$tmp/log" 2>&1 &&
   "$tmp/venv/bin/python3" -c 'import numpy, gguf, tokenizers, openai, anthropic, lm_eval, claude_agent_sdk, codex_cli_bin' 2>>"$tmp/log"; then
    ok "make venv gives a venv with every test oracle package"
else
    bad "make venv: $(tail -n 3 "$tmp/log")"
fi
exit $status
