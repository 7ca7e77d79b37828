#!/usr/bin/env bash
# Comments and messages in the build and the sources name only binaries that
# exist: every "ds4-NAME" word in Makefile, mk/, src/, app/ and tools/ must
# be built from app/NAME.c or tools/NAME.c. (Paths such as /tmp/ds4-kv or
# models/ds4-x.gguf are file names, not binaries, and are left out.)
set -u
cd "$(dirname "$0")/../.."
built=" $(ls app/*.c tools/*.c | sed 's|.*/||; s|\.c$||' | tr '\n' ' ') "
status=0
while IFS=: read -r file line word; do
    case $built in *" $word "*) continue ;; esac
    echo "FAIL: $file:$line names $word, which is not a binary (app/*.c, tools/*.c)"
    status=1
done < <(grep -noE '(^|[^/A-Za-z0-9_.-])ds4-[a-z][a-z0-9-]*' Makefile mk/* $(find src app tools -name "*.[ch]" -o -name "*.cu" | sort) |
         sed -E 's/^([^:]*:[0-9]+:)[^d]*/\1/' | sed -E 's/-+$//')
[ $status = 0 ] && echo "binary names: every ds4-NAME in the build and sources is built"
exit $status
