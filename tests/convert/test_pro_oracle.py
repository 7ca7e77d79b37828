#!/usr/bin/env python3
"""The engine against transformers on a V4 Pro-shaped model.

tests/fixtures/ds4pro/P (tests/oracles/ds4_pro_oracle.py: Pro's schedule with
HCA first layers and hash-routed HCA, 8 heads per output group, 64 experts of
which 2 are used, routed scale 2.5, BF16-exact random weights) holds 300 token
ids and the float32 logits transformers computes at every position. make test
converts it to $BUILD/ds4pro/P-<f32|f16>.gguf (mk/pro.mk); ./ds4 with
--numerics exact must match every position's logits:

- f32 and f16 files (BF16 weights are exact in both), one prefill and prefill
  in chunks of 7: max |diff| <= 2e-5 of the largest |logit| (the bound of
  tests/unit/test_forward.c on the Flash-shaped oracles; transformers' own
  cached and uncached paths differ by 7e-7 of it here) and the same argmax at
  every position;
- the f32 file split over two processes (coordinator 0:2, worker 3:output)
  gives the single process's logits byte for byte."""
import json
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "dist"))
from harness import check, finish  # noqa: E402
import test_dist_split as dist  # noqa: E402  (its process helpers: ports, workers, coordinator)

FIX = os.path.join(dist.ROOT, "tests", "fixtures", "ds4pro", "P")
GGUF = os.path.join(dist.ROOT, dist.BUILD, "ds4pro", "P-%s.gguf")
REL_TOL = 2e-5


def engine_logits(path, tokens, tmp, *extra):
    out = os.path.join(tmp, "logits.json")
    r = dist.ds4(["-m", path, "--numerics", "exact", "--ctx", "512", "--token-ids", ",".join(map(str, tokens)),
                  "--dump-logits", out, "--logits-all", *extra], timeout=300)
    if r.returncode != 0:
        return None, r.stderr.strip()[-300:]
    with open(out) as f:
        return np.array(json.load(f)["logits"], dtype=np.float32), ""


def main():
    if not all(os.path.exists(GGUF % t) for t in ("f32", "f16")) or not os.access(dist.DS4, os.X_OK):
        print("test_pro_oracle: SKIPPED: needs ./ds4 and %s (make test builds them)" % (GGUF % "f32|f16"))
        return 77
    with open(os.path.join(FIX, "tokens")) as f:
        tokens = json.load(f)
    gold = np.fromfile(os.path.join(FIX, "logits"), dtype="<f4")
    gold = gold.reshape(len(tokens), -1)
    scale = float(np.abs(gold).max())
    with tempfile.TemporaryDirectory() as tmp:
        for t in ("f32", "f16"):
            for what, extra in (("one prefill", ()), ("chunks of 7", ("--prefill-chunk", "7"))):
                got, err = engine_logits(GGUF % t, tokens, tmp, *extra)
                check(got is not None and got.shape == gold.shape, f"{t} {what}: {err or got.shape}")
                if got is None or got.shape != gold.shape:
                    continue
                diff = float(np.abs(got.astype(np.float64) - gold).max())
                argmax_bad = int((got.argmax(axis=1) != gold.argmax(axis=1)).sum())
                print(f"  P {t:4} {what:12} max|diff| {diff:.3g}  rel {diff / scale:.3g}  argmax mismatches {argmax_bad}")
                check(diff <= REL_TOL * scale, f"{t} {what}: max |diff| {diff:.3g} > {REL_TOL} x {scale:.3g}")
                check(argmax_bad == 0, f"{t} {what}: {argmax_bad} argmax mismatches")

        out = os.path.join(tmp, "route.json")
        args = ["--numerics", "exact", "--token-ids", ",".join(map(str, tokens)), "--dump-logits", out, "--logits-all"]
        want = dist.output_of(["-m", GGUF % "f32", *args], out)
        port = dist.free_port()
        worker = dist.start_worker(GGUF % "f32", "3:output", port, extra=("--numerics", "exact"))
        try:
            got = dist.coordinator(GGUF % "f32", "0:2", port, args, out)
        finally:
            dist.stop([worker])
        check(not want.startswith(b"exit") and got == want, "split 0:2 + 3:output differs from the single process (%s)"
              % (got[:200] if got.startswith(b"exit") else "output"))
    finish("test_pro_oracle")


if __name__ == "__main__":
    sys.exit(main())
