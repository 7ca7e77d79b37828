#!/usr/bin/env bash
# The documentation's shape: README.md is a short product page and the
# topics live in docs/*.md. Checked here:
# - README.md has at most 450 lines;
# - no document carries lab-notebook narration: clock times ("UTC"), machine
#   load ("load average"), the tree's history ("main at <sha>"), work
#   sessions, issue or ticket numbers, or the people who did the work;
# - every docs/*.md is linked from README.md;
# - every relative link in README.md and docs/*.md names an existing file.
set -u
cd "$(dirname "$0")/../.."
status=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; status=1; }

lines=$(wc -l < README.md)
[ "$lines" -le 450 ] && ok "README.md has $lines lines (at most 450)" || bad "README.md has $lines lines (more than 450)"

docs=(README.md docs/*.md)
narration='UTC|load average|main at [0-9a-f]{7}|(^|[ (])session [0-9]+\b|\bsessions? ago\b|\bthis session'"'"'s\b|\bin this session\b|\bissues? [0-9]+|\bissue-[0-9]+|\btickets?\b|\bengineers?\b|\bthe lead\b'
hits=$(grep -nEi "$narration" "${docs[@]}")
[ -z "$hits" ] && ok "no dated narration, load, sessions, issues or people in the docs" ||
    bad "narration in the docs:
$hits"

for d in docs/*.md; do
    grep -qF "($d)" README.md && ok "README.md links $d" || bad "README.md does not link $d"
done

# Markdown links [text](target): relative targets (no scheme, no anchor-only)
# resolved against the linking file's directory; an anchor suffix is dropped.
for f in "${docs[@]}"; do
    dir=$(dirname "$f")
    while IFS= read -r target; do
        case $target in http://*|https://*|mailto:*|'#'*) continue ;; esac
        path=${target%%#*}
        [ -e "$dir/$path" ] || bad "$f links $target, which does not exist"
    done < <(grep -oE '\]\([^) ]+\)' "$f" | sed -E 's/^\]\((.*)\)$/\1/')
done
[ $status = 0 ] && ok "every relative link in README.md and docs/*.md resolves"

# Source paths the docs name (src/..., a glob like src/text/tokenizer*) exist,
# so a file move cannot leave the docs pointing at the old place.
before=$status
for f in "${docs[@]}" DEVELOPERS.md; do
    while IFS= read -r p; do
        p=${p%[.,:;)]}
        compgen -G "$p" >/dev/null || bad "$f names $p, which does not exist"
    done < <(grep -oE '(^|[^A-Za-z0-9_/~.-])src/[A-Za-z0-9_./*-]+' "$f" | sed -E 's#^[^s]*##')
done
[ $status = $before ] && ok "every src/ path in README.md, docs/*.md and DEVELOPERS.md exists"
exit $status
