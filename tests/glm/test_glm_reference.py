#!/usr/bin/env python3
"""The numpy GLM forward pass (tests/oracles/glm_reference.py, written from
the fact sheet's formulas) against transformers' golden logits of
tests/fixtures/glmtiny/A: every position's logits agree to 1e-5 of the logit
scale (float64 numpy vs float32 torch; the oracle's own f32/f64 gap is
2.6e-6), and at least one indexer row prunes (top-k below the visible keys),
so the sparse path is part of what agrees."""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "oracles"))
sys.path.insert(0, os.path.join(ROOT, "tests", "convert"))
import glm_reference  # noqa: E402
import st_np  # noqa: E402
from harness import check, finish  # noqa: E402


def main():
    fx = os.path.join(ROOT, "tests", "fixtures", "glmtiny", "A")
    with open(os.path.join(fx, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(fx, "tokens")) as f:
        tokens = json.load(f)
    W = {k: st_np.to_f32(v) for k, v in st_np.read(os.path.join(fx, "model.safetensors")).items()}
    golden = np.fromfile(os.path.join(fx, "logits"), dtype="<f4").reshape(len(tokens), cfg["vocab_size"])
    check(len(tokens) > cfg["index_topk"], "the sequence is longer than the indexer's top-k")
    got = glm_reference.forward(cfg, W, tokens)
    scale = np.abs(golden).max()
    diff = np.abs(got - golden).max(axis=1)
    worst = int(diff.argmax())
    print(f"max |numpy - transformers| = {diff.max():.3g} at position {worst} (max |logit| {scale:.3g})")
    check(diff.max() <= 1e-5 * scale, f"position {worst} differs by {diff.max():.3g}")
    check((got.argmax(1) == golden.argmax(1)).all(), "argmax agrees at every position")
    finish("test_glm_reference")


if __name__ == "__main__":
    main()
