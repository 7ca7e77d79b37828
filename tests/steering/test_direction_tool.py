#!/usr/bin/env python3
"""tools/ds4_steer_direction.py on the demo model (models/demo.gguf, made by
make test) with the example pair set data/steering/{terse,verbose}.txt, for
both components: its .f32 equals a numpy computation from `ds4
--dump-activations` run here on each set (normalise(mean_bad - mean_good) per
layer; float32 rounding apart), every row has unit length, the .json
describes it (shape, component, files, per-layer difference norms), and ds4
accepts the file as --dir-steering-file. A missing prompt file fails with one
line."""
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

MODEL = os.path.join(ROOT, "models", "demo.gguf")
GOOD = os.path.join(ROOT, "data", "steering", "terse.txt")
BAD = os.path.join(ROOT, "data", "steering", "verbose.txt")
TOOL = os.path.join(ROOT, "tools", "ds4_steer_direction.py")


def run(*cmd):
    return subprocess.run(list(cmd), cwd=ROOT, capture_output=True, text=True, timeout=300)


def main():
    if not os.path.exists(MODEL):
        print(f"{MODEL} missing (make test builds it)")
        sys.exit(1)
    with tempfile.TemporaryDirectory() as d:
        for comp in ("ffn_out", "attn_out"):
            out = os.path.join(d, comp)
            r = run(sys.executable, TOOL, "-m", MODEL, "--good-file", GOOD, "--bad-file", BAD, "--component", comp,
                    "--out", out, "--", "-c", "1024")
            check(r.returncode == 0, f"tool {comp}: {r.stderr.strip()}")
            if r.returncode:
                continue
            means = {}
            for name, path in (("good", GOOD), ("bad", BAD)):
                f = os.path.join(d, name + ".f32")
                r = run(os.path.join(ROOT, "ds4"), "-m", MODEL, "--prompt-file", path, "--dump-activations", f,
                        "--activation-component", comp, "-c", "1024")
                check(r.returncode == 0, f"dump {name}: {r.stderr.strip()}")
                means[name] = np.fromfile(f, dtype="<f4").astype(np.float64)
            desc = json.load(open(out + ".json"))
            L, E = desc["n_layer"], desc["n_embd"]
            diff = (means["bad"] - means["good"]).reshape(L, E)
            want = diff / np.linalg.norm(diff, axis=1, keepdims=True)
            got = np.fromfile(out + ".f32", dtype="<f4").astype(np.float64)
            check(got.size == L * E, f"{comp}: {L} x {E} floats")
            got = got.reshape(L, E)
            err = np.abs(got - want).max()
            print(f"{comp}: {L} layers x {E}, max |tool - numpy| {err:.3g}")
            check(err < 1e-6, f"{comp}: the tool's rows equal numpy's normalised difference ({err:.3g})")
            check(np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6), f"{comp}: unit rows")
            check(desc["component"] == comp and desc["good_file"] == GOOD and desc["bad_file"] == BAD,
                  f"{comp}: the description names the component and the sets")
            check(np.allclose(desc["difference_norms"], np.linalg.norm(diff, axis=1), rtol=1e-9),
                  f"{comp}: per-layer difference norms")
            r = run(os.path.join(ROOT, "ds4"), "-m", MODEL, "--token-ids", "1,2,3", "--dir-steering-file", out + ".f32",
                    f"--dir-steering-{comp.split('_')[0]}", "1")
            check(r.returncode == 0, f"{comp}: ds4 takes the tool's file: {r.stderr.strip()[-200:]}")
        r = run(sys.executable, TOOL, "-m", MODEL, "--good-file", os.path.join(d, "none.txt"), "--bad-file", BAD,
                "--out", os.path.join(d, "x"))
        lines = r.stderr.strip().splitlines()
        check(r.returncode != 0 and len(lines) == 1 and "none.txt" in lines[0], f"missing set: {r.stderr.strip()}")
    finish("test_direction_tool")


if __name__ == "__main__":
    main()
