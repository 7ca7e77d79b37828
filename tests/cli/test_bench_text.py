"""ds4-bench's default input (data/bench/, docs/performance.md): with no
--prompt-file, `ds4-bench -m MODEL` fills the context with the committed
public-domain novel data/bench/persuasion.txt, found next to the binary
whatever the current directory (its stderr names the file and its token
count, which equals `ds4 --dump-tokens` over the same file); a copy of the
binary elsewhere finds it in the current directory, and without it says in
one line that a fixed token sequence is used; --prompt-file still wins. The
committed text is intact (its sha256 is the one data/bench/README.md
records) and the README keeps the licence notice of the package it came
from."""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BENCH = os.path.join(ROOT, "ds4-bench")
DEMO = os.path.join(ROOT, "models", "demo.gguf")
TEXT = os.path.join(ROOT, "data", "bench", "persuasion.txt")
README = os.path.join(ROOT, "data", "bench", "README.md")
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, file=sys.stderr)


def bench(binary, cwd, *extra):
    return subprocess.run([binary, "-m", DEMO, "-t", "1", "--ctx-start", "32", "--ctx-max", "32", "--gen-tokens", "1",
                           *extra], cwd=cwd, capture_output=True, text=True, timeout=300)


def prompt_lines(r):
    return [l for l in r.stderr.splitlines() if l.startswith("ds4-bench: prompt ")]


def main():
    if not (os.access(BENCH, os.X_OK) and os.path.exists(DEMO)):
        print("test_bench_text: SKIPPED: needs ./ds4-bench and %s (make test builds them)" % DEMO)
        return 77
    digest = hashlib.sha256(open(TEXT, "rb").read()).hexdigest()
    readme = open(README).read()
    recorded = re.search(r"sha256: `([0-9a-f]{64})`", readme)
    check(recorded and recorded.group(1) == digest, "persuasion.txt sha256 %s, README records %s"
          % (digest, recorded.group(1) if recorded else None))
    check("Copyright: 2016-2017 Julia Silge" in readme and "Permission is hereby granted" in readme
          and "public domain" in readme, "the README keeps the package's licence notice and the text's status")

    dump = subprocess.run([os.path.join(ROOT, "ds4"), "-m", DEMO, "--dump-tokens", "--prompt-file", TEXT],
                          capture_output=True, text=True, timeout=120)
    n_tokens = len(dump.stdout.splitlines())
    check(dump.returncode == 0 and n_tokens > 50000, "ds4 --dump-tokens over the text: %d tokens" % n_tokens)

    with tempfile.TemporaryDirectory() as tmp:
        r = bench(BENCH, tmp)
        want = "ds4-bench: prompt %s: %d tokens" % (TEXT, n_tokens)   # more than the 33 the run needs
        check(r.returncode == 0 and prompt_lines(r) == [want] and r.stdout.startswith("frontier,"),
              "the default text next to the binary, run from elsewhere: %r (want %r)" % (prompt_lines(r), want))

        # a copy of the binary without the data next to it
        copy = os.path.join(tmp, "bin", "ds4-bench")
        os.makedirs(os.path.dirname(copy))
        shutil.copy2(BENCH, copy)
        r = bench(copy, tmp)
        notes = [l for l in r.stderr.splitlines() if "data/bench/persuasion.txt is neither" in l]
        check(r.returncode == 0 and len(notes) == 1 and "a fixed token sequence" in notes[0] and not prompt_lines(r),
              "no text anywhere: one line says so: %r" % r.stderr.strip()[-400:])
        os.makedirs(os.path.join(tmp, "data", "bench"))
        shutil.copy2(TEXT, os.path.join(tmp, "data", "bench", "persuasion.txt"))
        r = bench(copy, tmp)
        check(r.returncode == 0 and prompt_lines(r) == ["ds4-bench: prompt data/bench/persuasion.txt: %d tokens"
                                                        % n_tokens], "the text in the current directory: %r"
              % prompt_lines(r))

        other = os.path.join(tmp, "other.txt")
        with open(other, "w") as f:
            f.write("Hello world")
        r = bench(BENCH, tmp, "--prompt-file", other)
        check(r.returncode == 0 and prompt_lines(r) == ["ds4-bench: prompt %s: 2 tokens, repeated to fill the context"
                                                        % other], "--prompt-file wins: %r" % prompt_lines(r))
    print("test_bench_text: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
