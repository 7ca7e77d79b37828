#!/usr/bin/env python3
"""What --dist-activation-bits does to the logits (docs/distributed.md,
transport format): every position's logits of a prompt through
a 2-way and a 3-way split at 16 and 8 bits, against the single process; prints
max |logit - single process| per row, with the single process's largest
|logit| and standard deviation for scale. A measurement: prints, asserts
nothing (test_dist_route checks that the route rounds at the cuts and nowhere
else).
  tests/dist/bench_dist_bits.py [MODEL...]   (default: the oracle model
  build/ds4tiny/A-f32.gguf and models/demo.gguf; env PROMPT=24 tokens)"""
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DS4 = os.path.join(ROOT, "ds4")
PROMPT = int(os.environ.get("PROMPT", "24"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def n_layer(model):
    dump = subprocess.run([os.path.join(ROOT, "ds4-gguf-dump"), model], capture_output=True, text=True).stdout
    return int(next(l.split()[2] for l in dump.splitlines() if l.split()[:1] == ["deepseek4.block_count"]))


def logits(model, out, slices=(), bits="32"):
    """every position's logits, single process (no slices) or split"""
    port, workers = free_port(), []
    for layers in slices[1:]:
        workers.append(subprocess.Popen([DS4, "-t", "1", "-m", model, "--role", "worker", "--layers", layers,
                                         "--coordinator", "127.0.0.1", str(port), "--dist-secret", "bits"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    cmd = [DS4, "-t", "1", "-m", model, "--token-ids", ",".join(str(5 + 7 * i) for i in range(PROMPT)),
           "--dump-logits", out, "--logits-all"]
    if slices:
        cmd += ["--role", "coordinator", "--layers", slices[0], "--listen", "127.0.0.1", str(port),
                "--dist-secret", "bits", "--dist-wait", "30", "--dist-activation-bits", bits]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    finally:
        for w in workers:
            w.kill()
            w.wait()
    if r.returncode:
        sys.exit("bench_dist_bits: %s" % r.stderr.strip()[-300:])
    with open(out) as f:
        return [x for row in json.load(f)["logits"] for x in row]


def main():
    models = sys.argv[1:] or [os.path.join(ROOT, "build", "ds4tiny", "A-f32.gguf"), os.path.join(ROOT, "models", "demo.gguf")]
    print("prompt %d tokens, every position's logits" % PROMPT)
    print()
    print("| model | bits | processes | layers | max abs logit difference | largest abs logit | logit std |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.json")
        for model in models:
            L = n_layer(model)
            base = logits(model, out)
            largest, spread = max(abs(x) for x in base), statistics.pstdev(base)
            for bits in ("16", "8"):
                for slices in (("0:%d" % (L // 2 - 1), "%d:output" % (L // 2)),
                               ("0:0", "1:%d" % (L - 2), "%d:output" % (L - 1))):
                    got = logits(model, out, slices, bits)
                    diff = max(abs(a - b) for a, b in zip(base, got))
                    print("| %s | %s | %d | %s | %.3g | %.3g | %.3g |" % (os.path.basename(model), bits, len(slices),
                                                                         " ".join(slices), diff, largest, spread))


if __name__ == "__main__":
    main()
