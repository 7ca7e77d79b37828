#!/usr/bin/env bash
# The library tells people things only through its log hook (base/log.h):
# no file under src/ but base/log.c writes to stderr or stdout itself
# (fprintf/fputs/fputc/fwrite/vfprintf on stderr or stdout, printf, puts,
# putchar, perror, write(1|2, ...)). The binaries in app/ and tools/ print
# their own output. Each offending line is printed; comments and string
# literals (help texts that mention stderr) are not code and are skipped.
set -u
cd "$(dirname "$0")/../.."
files=$(find src -name '*.c' -o -name '*.h' -o -name '*.cu' | grep -v '^src/base/log\.c$' | sort)
[ -n "$files" ] || { echo "FAIL: no library sources found"; exit 1; }
pattern='\b(stderr|stdout)\b|\b(printf|vprintf|puts|putchar|perror)[[:space:]]*\(|\bwrite[[:space:]]*\([[:space:]]*(1|2|STDERR_FILENO|STDOUT_FILENO)[[:space:]]*,'
# a line matches on its code: string literals, // and /* comments and comment lines removed
hits=$(grep -nE "$pattern" $files | grep -vE '^[^:]+:[0-9]+:[[:space:]]*(/?\*|//)' |
       awk '{ line = $0; sub(/^[^:]+:[0-9]+:/, "", line); gsub(/"([^"\\]|\\.)*"/, "\"\"", line);
                  sub(/\/\/.*$/, "", line); sub(/\/\*.*$/, "", line);
                  if (line ~ /(^|[^a-zA-Z0-9_])(stderr|stdout)([^a-zA-Z0-9_]|$)|(^|[^a-zA-Z0-9_])(printf|vprintf|puts|putchar|perror)[ \t]*\(|(^|[^a-zA-Z0-9_])write[ \t]*\([ \t]*(1|2|STDERR_FILENO|STDOUT_FILENO)[ \t]*,/) print $0 }')
if [ -n "$hits" ]; then
    echo "FAIL: library code prints directly instead of through ds4_log (base/log.h):"
    echo "$hits"
    exit 1
fi
echo "library stdio: $(echo "$files" | wc -l) files under src/ print only through base/log.c"
