"""Directional steering over pipeline slices (src/dist/dist.c, docs/steering.md):
a coordinator and 1 or 2 workers, separate ./ds4 processes each holding its
own layer slice and the same --dir-steering-file, give the single steered
process's output byte for byte:

- prefill, every position's logits (--dump-logits --logits-all), whole and
  pipelined (--dist-prefill-chunk 2 --dist-prefill-window 3), on the oracle
  model (build/ds4tiny/A-f32, with the steering oracle's direction file) for
  a 2-way and a 3-way split, with FFN and attention scales;
- decode: a greedy continuation with logprobs (--dump-logprobs) on the demo
  model with a direction file written here.
The workers are started with --dir-steering-ffn 0 --dir-steering-attn 0: the
coordinator's scales travel with the work, so a worker's own are not used.
The steered output differs from the unsteered one, so a route that dropped
the steering fails.

A worker whose file differs from the coordinator's (one flipped bit), or that
has none, is refused with one line and exits 1; the coordinator's
incomplete-route line names the refusal. --dump-activations stays a
single-process option: a coordinator refuses it with one line."""
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_dist_split as split  # noqa: E402  (the pipeline harness: processes, ports, outputs)
from test_dist_split import (DEMO, ROOT, TINY, check, coordinator, coordinator_args, ds4, exit_of,  # noqa: E402
                             free_port, output_of, splits, start_worker, stop)

TINY_DIR = os.path.join(ROOT, "tests", "fixtures", "steering", "ds4tiny-A", "dir.f32")
SCALES = ("--dir-steering-ffn", "0.7", "--dir-steering-attn", "-0.5")


def worker_flags(path):
    return ("--dir-steering-file", path, "--dir-steering-ffn", "0", "--dir-steering-attn", "0")


def compare(model, n_layer, dirf, cases, tmp):
    """cases: (name, args of every run, extra args of the coordinator)"""
    out = os.path.join(tmp, "out.json")
    for name, args, coord_extra in cases:
        want = output_of(["-m", model, *args(out), "--dir-steering-file", dirf, *SCALES], out)
        plain = output_of(["-m", model, *args(out)], out)
        check(not want.startswith(b"exit") and want != plain,
              "%s %s: the single steered run works and differs from the unsteered one (%s)"
              % (os.path.basename(model), name, want[:200]))
        for parts in splits(n_layer):
            port = free_port()
            workers = [start_worker(model, s, port, extra=worker_flags(dirf)) for s in parts[1:]]
            try:
                got = coordinator(model, parts[0], port,
                                  [*args(out), *coord_extra, "--dir-steering-file", dirf, *SCALES], out)
            finally:
                stop(workers)
            check(got == want, "%s %s split %s: differs from the single steered process (%s)"
                  % (os.path.basename(model), name, "/".join(parts),
                     got[:300] if got.startswith(b"exit") else "output"))


def demo_directions(path):
    """Unit rows, one per layer of the demo model, from its metadata."""
    dump = subprocess.run([os.path.join(ROOT, "ds4-gguf-dump"), DEMO], capture_output=True, text=True).stdout
    dims = dict(re.findall(r"deepseek4\.(embedding_length|block_count)\s+u32\s+(\d+)", dump))
    n_layer, n_embd = int(dims.get("block_count", 0)), int(dims.get("embedding_length", 0))
    rng = random.Random(7)
    with open(path, "wb") as f:
        for _ in range(n_layer):
            row = [rng.gauss(0, 1) for _ in range(n_embd)]
            norm = sum(v * v for v in row) ** 0.5
            f.write(struct.pack("<%df" % n_embd, *(v / norm for v in row)))
    return n_layer


def refusal(model, dirf, worker_extra, needle, tmp):
    """A worker refused for its steering file: rc 1 and one line naming it;
    the coordinator's incomplete route says why."""
    out = os.path.join(tmp, "out.json")
    port = free_port()
    w = start_worker(model, "3:output", port, extra=worker_extra)
    try:
        r = ds4([*coordinator_args(model, "0:2", port, "3"), "--token-ids", "5,6,7", "--dump-logits", out,
                 "--dir-steering-file", dirf])
    finally:
        rc, err = exit_of(w)
    lines = [l for l in err.strip().splitlines() if "no answer from" not in l]
    check(rc == 1 and len(lines) == 1 and needle in lines[0] and "every slice needs the same --dir-steering-file"
          in lines[0], "worker refused in one line (%s): rc %s, %r" % (needle, rc, err.strip()))
    check(r.returncode != 0 and "incomplete route" in r.stderr and "was refused: " + needle in r.stderr,
          "the coordinator names the refusal: %r" % r.stderr.strip()[-400:])


def main():
    if not (os.access(split.DS4, os.X_OK) and os.path.exists(TINY) and os.path.exists(DEMO)):
        print("test_dist_steering: SKIPPED: needs ./ds4, %s and %s (make test builds them)" % (TINY, DEMO))
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        ids = "--token-ids", "5,6,7,8,9,10,11,12,13,14"
        prefill = [("prefill", lambda o: [*ids, "--dump-logits", o, "--logits-all"], ()),
                   ("pipelined prefill", lambda o: [*ids, "--dump-logits", o, "--logits-all"],
                    ("--dist-prefill-chunk", "2", "--dist-prefill-window", "3"))]
        compare(TINY, 6, TINY_DIR, prefill, tmp)
        demo_dir = os.path.join(tmp, "demo.f32")
        n_layer = demo_directions(demo_dir)
        check(n_layer == 6, "the demo model's directions: %d layers" % n_layer)
        decode = [("decode", lambda o: ["-p", "hello there", "--nothink", "--dump-logprobs", o, "-n", "4",
                                        "--prefill-chunk", "2"], ())]
        compare(DEMO, 6, demo_dir, decode, tmp)

        other = os.path.join(tmp, "other.f32")
        data = bytearray(open(TINY_DIR, "rb").read())
        data[100] ^= 1
        open(other, "wb").write(bytes(data))
        refusal(TINY, TINY_DIR, worker_flags(other), "this worker steers with file sha1 ", tmp)
        refusal(TINY, TINY_DIR, (), "this worker steers with no file", tmp)
        r = ds4([*coordinator_args(TINY, "0:2", free_port(), "1"), "--token-ids", "5,6,7", "--dump-activations",
                 os.path.join(tmp, "act.f32")])
        last = r.stderr.strip().splitlines()[-1:] or [""]
        check(r.returncode != 0 and "activation dumps run in one process" in last[0]
              and r.stderr.count("activation dumps") == 1, "--dump-activations on a coordinator: %r" % r.stderr)
    print("test_dist_steering: %d passed, %d failed" % (split.passed, split.failed))
    return 1 if split.failed else 0


if __name__ == "__main__":
    sys.exit(main())
