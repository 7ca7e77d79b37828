#!/usr/bin/env python3
"""Compares the engine's logits on a converted GGUF with the PyTorch logits
export.py recorded (golden.json), every position and every id.

    python3 tools/train-tiny/check_engine.py MODEL.gguf GOLDEN.json [--numerics exact|ds4]

Prints max |diff| over all 129,280 ids (kept ids against their own logit,
every other id against the aggregated logit), the relative error
max|diff| / max|logit|, the greedy (argmax) agreement per position and the mean KL divergence
of the engine's distribution from PyTorch's.
Exits 1 when the relative error exceeds --tol."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def engine_logits(ds4, model, tokens, numerics):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.json")
        subprocess.run([ds4, "-m", model, "--numerics", numerics, "-t", "1", "--token-ids",
                        ",".join(map(str, tokens)), "--dump-logits", out, "--logits-all"],
                       check=True, capture_output=True)
        with open(out) as f:
            return np.array(json.load(f)["logits"], dtype=np.float64)


def compare(got, golden):
    keep = np.array(golden["kept_ids"])
    want_k = np.array(golden["logits_kept"], dtype=np.float64)
    want_r = np.array(golden["logit_rare"], dtype=np.float64)
    rare = np.ones(got.shape[1], bool)
    rare[keep] = False
    d = max(np.abs(got[:, keep] - want_k).max(), np.abs(got[:, rare] - want_r[:, None]).max())
    scale = max(np.abs(want_k).max(), np.abs(want_r).max())
    want_arg = np.where(want_k.max(1) >= want_r, keep[want_k.argmax(1)], -1)
    got_arg = got.argmax(1)
    agree = float(np.mean([(w == g) or (w == -1 and rare[g]) for w, g in zip(want_arg, got_arg)]))
    # mean KL(PyTorch || engine) over positions, full vocabulary
    full = np.empty_like(got)
    full[:, keep] = want_k
    full[:, rare] = want_r[:, None]
    lp = full - np.logaddexp.reduce(full, axis=1, keepdims=True)
    lq = got - np.logaddexp.reduce(got, axis=1, keepdims=True)
    kl = float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=1)))
    return d, d / scale, agree, kl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("golden")
    ap.add_argument("--numerics", default="exact")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--ds4", default="./ds4")
    a = ap.parse_args()
    golden = json.load(open(a.golden))
    got = engine_logits(a.ds4, a.model, golden["tokens"], a.numerics)
    d, rel, agree, kl = compare(got, golden)
    print("%s (%s): %d positions x %d ids: max|diff| %.3g, relative %.3g, argmax agreement %.1f%%, mean KL %.3g"
          % (os.path.basename(a.model), a.numerics, got.shape[0], got.shape[1], d, rel, 100 * agree, kl))
    sys.exit(0 if rel <= a.tol else 1)


if __name__ == "__main__":
    main()
