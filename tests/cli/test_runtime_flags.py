#!/usr/bin/env python3
"""The runtime-control flags of the binaries, on the demo model (models/demo.gguf)
and the tiny GLM model ($BUILD/glmtiny/A-f32.gguf), both made by make test.

- --power: ds4's greedy answer at --power 40 is byte-identical to --power
  100 on both families, and so are the tokens ds4-eval generates (its
  --trace) (identity only; no timing is asserted); 0, 101 and a non-number
  are refused with one line by ds4, ds4-server, ds4-agent, ds4-bench and
  ds4-eval.
- --warm-weights: a layer-slice load (which the automatic page-in leaves
  lazy) reports "weights paged in" only with the flag.
- --inspect: the tensor mix per storage type equals what ds4-gguf-dump lists,
  and the one-session line is the engine's KV size for --ctx (it grows with
  --ctx); nothing is generated and the weights are not paged in.
- ds4-bench: --csv FILE puts the frontier CSV in FILE (stdout keeps none of
  it); --ctx-alloc N allocates the session for N tokens (2^30 fails with the
  engine's out-of-memory line for that size); --chat-prompt-file runs, and a missing one is
  refused with one line.
- --dump-activations without a prompt, and a bad --activation-component,
  are refused with one line."""
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "convert"))
from harness import check, finish  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
DEMO = os.path.join(ROOT, "models", "demo.gguf")
GLM = os.path.join(ROOT, BUILD, "glmtiny", "A-f32.gguf")


def run(binary, *args, timeout=300):
    return subprocess.run([os.path.join(ROOT, binary), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def one_line(r, needle, what):
    lines = r.stderr.strip().splitlines()
    check(r.returncode != 0 and len(lines) == 1 and needle in lines[0], f"{what} refused in one line: {r.stderr!r}")


def after_load(r, needle, what):
    """an error found after the model loaded: its one line comes last, after the load report"""
    lines = r.stderr.strip().splitlines()
    check(r.returncode != 0 and lines and needle in lines[-1] and not any(needle in x for x in lines[:-1]),
          f"{what} refused with one line: {r.stderr!r}")


def main():
    for m in (DEMO, GLM):
        if not os.path.exists(m):
            print(f"{m} missing (make test builds it)")
            sys.exit(1)
    # --power: identity
    outs = {}
    for p in ("100", "40"):
        r = run("ds4", "-m", DEMO, "-p", "Count to ten.", "-n", "24", "--temp", "0", "--nothink", "-c", "512",
                "--power", p)
        check(r.returncode == 0, f"ds4 --power {p}: {r.stderr.strip()[-200:]}")
        outs[p] = r.stdout
        g = run("ds4", "-m", GLM, "--token-ids", "1,5,9,33,70", "--dump-logits", os.devnull, "--power", p)
        check(g.returncode == 0, f"GLM --power {p}: {g.stderr.strip()[-200:]}")
        outs["glm" + p] = run("ds4", "-m", GLM, "--token-ids", "1,5,9,33,70", "--power", p).stdout
    check(outs["100"] == outs["40"] and outs["100"], "ds4 --power 40 prints the same answer as --power 100")
    check(outs["glm100"] == outs["glm40"] and outs["glm100"], "GLM --power 40 gives the same next token")
    with tempfile.TemporaryDirectory() as d:
        traces = {}
        for p in ("100", "40"):
            trace = os.path.join(d, f"trace{p}.jsonl")
            r = run("ds4-eval", "-m", DEMO, "--plain", "--questions", "2", "--tokens", "8", "--temp", "0", "--seed", "1",
                    "--trace", trace, "--power", p)
            check(r.returncode == 0, f"ds4-eval --power {p}: {r.stderr.strip()[-200:]}")
            traces[p] = [x for x in open(trace) if '"tok"' in x] if r.returncode == 0 else None
        check(traces["100"] and traces["100"] == traces["40"], "ds4-eval --power 40 generates the same tokens")
    for binary in ("ds4", "ds4-server", "ds4-agent", "ds4-bench", "ds4-eval"):
        for bad in ("0", "101", "x"):
            one_line(run(binary, "-m", DEMO, "--power", bad), "--power", f"{binary} --power {bad}")
    # --warm-weights
    # a slice of a bigger file maps the other layers too, so it is not paged in
    # unless asked (a slice covering the whole file binds all of it and is)
    plain = run("ds4", "-m", DEMO, "--layers", "3:output", "--token-ids", "1,2")
    warm = run("ds4", "-m", DEMO, "--layers", "3:output", "--token-ids", "1,2", "--warm-weights")
    whole = run("ds4", "-m", DEMO, "--layers", "0:output", "--token-ids", "1,2")
    check("layers 3..5" in plain.stderr and "layers 3..5" in warm.stderr and whole.returncode == 0,
          f"slices load: {plain.stderr[-200:]} {warm.stderr[-200:]} {whole.stderr[-200:]}")
    check("weights paged in" not in plain.stderr, "a slice stays lazy without --warm-weights")
    check("weights paged in" in warm.stderr, "--warm-weights pages a slice in and says how long it took")
    check("weights paged in" in whole.stderr, "a slice covering the whole file is paged in like the whole model")
    # --inspect
    sizes = {}
    for ctx in ("1024", "4096"):
        r = run("ds4", "-m", DEMO, "--inspect", "-c", ctx)
        check(r.returncode == 0 and "memory plan" in r.stdout, f"--inspect -c {ctx}: {r.stderr[-200:]}")
        check("weights paged in" not in r.stderr, "--inspect leaves the weights unread")
        mix = {t: int(n) for t, n in re.findall(r"^  (\S+)\s+(\d+) tensors", r.stdout, re.M)}
        sess = re.search(r"one session\s+([\d.]+) MiB for (\d+) tokens", r.stdout)
        check(sess is not None and sess.group(2) == ctx, f"--inspect -c {ctx}: one session line for {ctx} tokens")
        sizes[ctx] = float(sess.group(1)) if sess else 0
    dump = run("ds4-gguf-dump", "--tensors", DEMO)
    want = Counter(re.findall(r"^  \S+  (\S+)  \[", dump.stdout, re.M))
    check(mix == dict(want) and mix, f"--inspect tensor mix {mix} equals ds4-gguf-dump's {dict(want)}")
    check(sizes["4096"] > sizes["1024"] > 0, f"the session grows with --ctx: {sizes}")
    # ds4-bench flags
    with tempfile.TemporaryDirectory() as d:
        csv = os.path.join(d, "b.csv")
        base = ["-m", DEMO, "--ctx-start", "32", "--ctx-max", "64", "--step-incr", "32", "--gen-tokens", "2", "-t", "1"]
        r = run("ds4-bench", *base, "--csv", csv)
        rows = open(csv).read().splitlines() if os.path.exists(csv) else []
        check(r.returncode == 0 and rows[:1] == ["frontier,prefill_tps,gen_tps,kvcache_bytes"] and len(rows) == 3,
              f"--csv writes the table: {rows} {r.stderr[-200:]}")
        check("frontier," not in r.stdout, "--csv leaves stdout without the table")
        r2 = run("ds4-bench", *base, "--ctx-alloc", "4096")
        check(r2.returncode == 0 and len(r2.stdout.splitlines()) == 3, f"--ctx-alloc 4096 runs: {r2.stderr[-200:]}")
        after_load(run("ds4-bench", *base, "--ctx-alloc", "1073741824"), "1073741824-token session",
                   "a session of --ctx-alloc 2^30 tokens (so the allocation follows the flag)")
        r3 = run("ds4-bench", *base, "--chat-prompt-file", os.path.join(ROOT, "data", "steering", "terse.txt"))
        check(r3.returncode == 0 and len(r3.stdout.splitlines()) == 3, f"--chat-prompt-file runs: {r3.stderr[-200:]}")
        after_load(run("ds4-bench", *base, "--chat-prompt-file", os.path.join(d, "none.txt")), "none.txt",
                 "a missing --chat-prompt-file")
    after_load(run("ds4", "-m", GLM, "--dump-activations", os.devnull), "--dump-activations",
             "--dump-activations without a prompt on a model without a tokenizer")
    one_line(run("ds4", "-m", GLM, "--dump-activations", os.devnull, "--activation-component", "x"),
             "--activation-component", "a bad --activation-component")
    finish("test_runtime_flags")


if __name__ == "__main__":
    main()
