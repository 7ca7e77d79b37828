#!/usr/bin/env python3
"""`./ds4 -m GLM.gguf --token-ids IDS --dump-logits FILE --logits-all
--numerics exact` on the transformers fixture tests/fixtures/glmtiny/A
(converted by make test to $BUILD/glmtiny/A-f32.gguf, no tokenizer in it):
every position's logits agree with transformers' golden float32 logits to
1e-5 of the logit scale with every argmax equal, and the dump without
--logits-all is the last row bit for bit. The DeepSeek-only options refuse
the GLM file with one line naming the option, and a non-zero exit."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "convert"))
from harness import check, finish  # noqa: E402

BUILD = os.environ.get("BUILD", "build")


def ds4(*args):
    return subprocess.run([os.path.join(ROOT, "ds4"), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def main():
    fx = os.path.join(ROOT, "tests", "fixtures", "glmtiny", "A")
    model = os.path.join(ROOT, BUILD, "glmtiny", "A-f32.gguf")
    tokens = json.load(open(os.path.join(fx, "tokens")))
    golden = np.fromfile(os.path.join(fx, "logits"), dtype="<f4").reshape(len(tokens), -1)
    ids = ",".join(map(str, tokens))
    with tempfile.TemporaryDirectory() as d:
        every, last = os.path.join(d, "all.json"), os.path.join(d, "last.json")
        r = ds4("-m", model, "--token-ids", ids, "--dump-logits", every, "--logits-all", "--numerics", "exact")
        check(r.returncode == 0, f"dump every position: {r.stderr.strip()}")
        r2 = ds4("-m", model, "--token-ids", ids, "--dump-logits", last, "--numerics", "exact")
        check(r2.returncode == 0, f"dump the last position: {r2.stderr.strip()}")
        if r.returncode or r2.returncode:
            finish("test_glm_cli")
        a, b = json.load(open(every)), json.load(open(last))
        got = np.array(a["logits"], dtype=np.float64)
        check(a["tokens"] == tokens and a["n_vocab"] == golden.shape[1], "tokens and vocabulary echoed")
        check(got.shape == golden.shape, f"one row per position: {got.shape}")
        scale = np.abs(golden).max()
        diff = np.abs(got - golden).max()
        print(f"ds4 --dump-logits on GLM: max |diff| {diff:.3g} (max |logit| {scale:.3g})")
        check(diff <= 1e-5 * scale, f"logits within 1e-5 of the scale: {diff:.3g}")
        check((got.argmax(1) == golden.argmax(1)).all(), "argmax equal at every position")
        check(len(b["logits"]) == 1 and b["logits"][0] == a["logits"][-1], "last row identical without --logits-all")
    for opt in (["--ssd-streaming"], ["--numerics", "ds4"], ["--layers", "0:1"]):
        r = ds4("-m", model, "--token-ids", "1,2", *opt)
        lines = r.stderr.strip().splitlines()
        check(r.returncode != 0 and len(lines) == 1 and opt[0] in lines[0] and "GLM 5.2" in lines[0],
              f"{opt[0]} refused in one line: {r.stderr.strip()}")
    finish("test_glm_cli")


if __name__ == "__main__":
    main()
