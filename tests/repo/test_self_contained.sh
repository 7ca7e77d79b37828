#!/usr/bin/env bash
# A clone must stand on its own: no tracked file outside the Markdown docs may
# reach into a checkout's surroundings (the project's ../shared directory is
# not part of a clone), and the committed tokenizer data the build, demo and
# tests read must be intact (its digest is recorded in data/README.md).
set -u
cd "$(dirname "$0")/../.."
self=tests/repo/test_self_contained.sh
status=0
# Three spellings of the same escape: a relative path, an absolute project
# path, and a Python os.path.join(..., "..", "shared", ...).
patterns=('\.\./shared' '/shared/(data|docs|seed|hooks)' '"\.\."[[:space:]]*,[[:space:]]*"shared"')
files=$(git ls-files | grep -v -e '\.md$' -e "^$self\$")
for p in "${patterns[@]}"; do
    hits=$(printf '%s\n' "$files" | tr '\n' '\0' | xargs -0 grep -nIE "$p" 2>/dev/null)
    if [ -n "$hits" ]; then
        echo "FAIL: references outside the repository (pattern $p):"
        echo "$hits"
        status=1
    fi
done
want=$(sed -n 's/^sha256 \([0-9a-f]\{64\}\)$/\1/p' data/README.md)
got=$(sha256sum data/deepseek-v3-tokenizer.json 2>/dev/null | cut -d' ' -f1)
if [ -z "$want" ] || [ "$want" != "$got" ]; then
    echo "FAIL: data/deepseek-v3-tokenizer.json digest '$got' != recorded '$want'"
    status=1
fi
[ $status -eq 0 ] && echo "self-contained: no ../shared references, tokenizer data intact"
exit $status
