#!/usr/bin/env python3
"""Directional steering against transformers: `ds4 --numerics exact
--dir-steering-file F --dir-steering-ffn S --dir-steering-attn S` on the tiny
DeepSeek V4 and GLM 5.2 models ($BUILD/ds4tiny/A-f32.gguf,
$BUILD/glmtiny/A-f32.gguf, made by make test) gives, at every position, the
logits transformers computes with forward hooks applying the same projection
(tests/fixtures/steering, written by tests/oracles/steering_oracle.py): within
1e-5 of the logit scale, every argmax equal, for FFN only, attention only and
both, positive and negative scales. Each golden case differs from the
unsteered logits by far more than that tolerance, so an engine ignoring the
file fails.

`ds4 --dump-activations --token-ids ... --activation-component ffn_out|attn_out`
(unsteered) writes, per layer, the mean over the positions of the mlp /
self_attn output transformers computes, within 1e-5 of the largest mean.

Also: a prefill split into chunks of 7, and (DeepSeek V4) --ssd-streaming,
give the same steered logits bit for bit; zero scales with a file are the unsteered run bit for bit; a file of the
wrong size, a scale without a file and a bad scale are refused with one line
and a non-zero exit."""
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
FX = os.path.join(ROOT, "tests", "fixtures", "steering")


def ds4(*args):
    return subprocess.run([os.path.join(ROOT, "ds4"), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def logits(model, ids, out, *extra):
    r = ds4("-m", model, "--token-ids", ids, "--dump-logits", out, "--logits-all", "--numerics", "exact", *extra)
    check(r.returncode == 0, f"ds4 {' '.join(extra)}: {r.stderr.strip()}")
    return np.array(json.load(open(out))["logits"], dtype=np.float64) if r.returncode == 0 else None


def one_line_refusal(r, needle, what):
    lines = r.stderr.strip().splitlines()
    check(r.returncode != 0 and len(lines) == 1 and needle in lines[0], f"{what} refused in one line: {r.stderr.strip()}")


def main():
    spec = json.load(open(os.path.join(FX, "cases.json")))
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "l.json")
        for name, m in spec["models"].items():
            family, variant = name.split("-")
            model = os.path.join(ROOT, BUILD, family, f"{variant}-f32.gguf")
            if not os.path.exists(model):
                print(f"{model} missing (make test builds it)")
                sys.exit(1)
            ids = ",".join(map(str, m["tokens"]))
            dirf = os.path.join(FX, name, "dir.f32")
            plain = logits(model, ids, out)
            for case in spec["cases"]:
                flags = ["--dir-steering-file", dirf, "--dir-steering-ffn", str(case["ffn"]),
                         "--dir-steering-attn", str(case["attn"])]
                got = logits(model, ids, out, *flags)
                gold = np.fromfile(os.path.join(FX, name, case["name"] + ".logits"), dtype="<f4")
                if got is None or plain is None:
                    continue
                gold = gold.reshape(got.shape).astype(np.float64)
                tol = 1e-5 * np.abs(gold).max()
                diff = np.abs(got - gold).max()
                print(f"{name} {case['name']}: max |diff| {diff:.3g} (tolerance {tol:.3g}); "
                      f"moved {np.abs(gold - plain).max():.3g} from unsteered")
                check(diff <= tol, f"{name} {case['name']}: logits within 1e-5 of the scale ({diff:.3g})")
                check((got.argmax(1) == gold.argmax(1)).all(), f"{name} {case['name']}: argmax equal everywhere")
                check(np.abs(gold - plain).max() > 100 * tol, f"{name} {case['name']}: the case steers at all")
                if case["name"] == "both":
                    chunked = logits(model, ids, out, "--prefill-chunk", "7", *flags)
                    check(chunked is not None and (chunked == got).all(), f"{name}: chunked prefill bit-identical")
                    if family == "ds4tiny":
                        streamed = logits(model, ids, out, "--ssd-streaming", *flags)
                        check(streamed is not None and (streamed == got).all(),
                              f"{name}: --ssd-streaming (experts read from the file) bit-identical")
            for comp in ("ffn_out", "attn_out"):
                act = os.path.join(d, "act.f32")
                r = ds4("-m", model, "--numerics", "exact", "--token-ids", ids, "--dump-activations", act,
                        "--activation-component", comp)
                check(r.returncode == 0, f"{name} --dump-activations {comp}: {r.stderr.strip()[-200:]}")
                if r.returncode == 0:
                    got = np.fromfile(act, dtype="<f4").astype(np.float64)
                    gold = np.fromfile(os.path.join(FX, name, f"mean_{comp}.f32"), dtype="<f4").astype(np.float64)
                    diff = np.abs(got - gold).max() if got.shape == gold.shape else float("inf")
                    print(f"{name} mean {comp}: max |diff| {diff:.3g} (max |mean| {np.abs(gold).max():.3g})")
                    check(diff <= 1e-5 * np.abs(gold).max(), f"{name} mean {comp} within 1e-5 of the scale")
            zero = logits(model, ids, out, "--dir-steering-file", dirf, "--dir-steering-ffn", "0",
                          "--dir-steering-attn", "0")
            check(zero is not None and plain is not None and (zero == plain).all(),
                  f"{name}: zero scales are the unsteered run bit for bit")
            short = os.path.join(d, "short.f32")
            with open(dirf, "rb") as f, open(short, "wb") as g:
                g.write(f.read()[:-4])
            r = ds4("-m", model, "--token-ids", "1,2", "--dir-steering-file", short)
            one_line_refusal(r, f"{m['n_layer']} layers x {m['n_embd']} floats", f"{name}: a short steering file")
        model = os.path.join(ROOT, BUILD, "glmtiny", "A-f32.gguf")
        one_line_refusal(ds4("-m", model, "--token-ids", "1,2", "--dir-steering-attn", "1"), "--dir-steering-file",
                         "a scale without a file")
        one_line_refusal(ds4("-m", model, "--token-ids", "1,2", "--dir-steering-ffn", "nan"), "--dir-steering-ffn",
                         "a NaN scale")
        one_line_refusal(ds4("-m", model, "--token-ids", "1,2", "--dir-steering-file", os.path.join(d, "none")),
                         "steering file", "a missing steering file")
    finish("test_steering_oracle")


if __name__ == "__main__":
    main()
