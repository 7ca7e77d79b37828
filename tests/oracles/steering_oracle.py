#!/usr/bin/env python3
"""Regenerates tests/fixtures/steering/: transformers' logits for the tiny
DeepSeek V4 (tests/fixtures/ds4tiny/A) and GLM 5.2 (tests/fixtures/glmtiny/A)
models with directional steering applied by forward hooks, the independent
reference for `ds4 --dir-steering-file` (tests/steering/test_steering_oracle.py).

Needs torch + transformers (DeepseekV4ForCausalLM, GlmMoeDsaForCausalLM); the
test suite never runs it, it only reads the committed outputs.

    python3 tests/oracles/steering_oracle.py [--out tests/fixtures/steering]

For each model:
  * one random unit direction per layer (normal, seeded, normalised in
    float64, stored as float32: `<model>/dir.f32`, [n_layer][hidden]);
  * for each case of cases.json, forward hooks on every decoder layer's
    self_attn (its first output) and mlp replace the output y by
    y - scale * d * (y . d) with that layer's d, and the full-sequence
    float32 logits of the first T fixture tokens (use_cache=False) are
    written as `<model>/<case>.logits` ([T][vocab] little-endian f32);
  * unsteered, the mean over the T positions of every layer's mlp output
    and self_attn output (`<model>/mean_ffn_out.f32`, `mean_attn_out.f32`,
    [n_layer][hidden] f32): what `ds4 --dump-activations` writes;
  * the same in float64 must agree to 1e-3 of the logit scale, so no golden
    logit depends on a near-tie in a top-k (indexer or router) that the
    steering moved; the script stops if not.
"""
import argparse
import json
import os

import numpy as np
import torch
from transformers import DeepseekV4ForCausalLM, GlmMoeDsaForCausalLM

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODELS = {
    # name: (class, fixture dir, tokens used, seed)
    "ds4tiny-A": (DeepseekV4ForCausalLM, "tests/fixtures/ds4tiny/A", 40, 11),
    "glmtiny-A": (GlmMoeDsaForCausalLM, "tests/fixtures/glmtiny/A", 40, 12),
}
# (name, ffn scale, attention scale): FFN only, attention only and both, each sign
CASES = [("ffn_pos", 1.0, 0.0), ("ffn_neg", -2.0, 0.0), ("attn_pos", 0.0, 1.0), ("attn_neg", 0.0, -2.0),
         ("both", 0.75, -1.5)]


def steered_logits(model, dirs, ffn, attn, ids, dtype):
    hooks = []
    for l, layer in enumerate(model.model.layers[:dirs.shape[0]]):
        d = torch.tensor(dirs[l], dtype=dtype)

        def project(y, scale, d=d):
            return y - scale * d * (y * d).sum(-1, keepdim=True)

        if attn:
            hooks.append(layer.self_attn.register_forward_hook(
                lambda m, i, out, s=attn, f=project: (f(out[0], s),) + tuple(out[1:])))
        if ffn:
            hooks.append(layer.mlp.register_forward_hook(lambda m, i, out, s=ffn, f=project: f(out, s)))
    try:
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False).logits[0].to(torch.float64).numpy()
    finally:
        for h in hooks:
            h.remove()


def mean_outputs(model, n_layer, ids):
    sums = {"ffn_out": [None] * n_layer, "attn_out": [None] * n_layer}
    hooks = []
    for l, layer in enumerate(model.model.layers[:n_layer]):
        hooks.append(layer.mlp.register_forward_hook(
            lambda m, i, out, l=l: sums["ffn_out"].__setitem__(l, out[0].to(torch.float64).mean(0).numpy())))
        hooks.append(layer.self_attn.register_forward_hook(
            lambda m, i, out, l=l: sums["attn_out"].__setitem__(l, out[0][0].to(torch.float64).mean(0).numpy())))
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return {k: np.stack(v) for k, v in sums.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "steering"))
    args = ap.parse_args()
    cases = {"cases": [{"name": n, "ffn": f, "attn": a} for n, f, a in CASES], "models": {}}
    for name, (cls, fx, T, seed) in MODELS.items():
        path = os.path.join(ROOT, fx)
        m32 = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                   experts_implementation="eager").eval()
        m64 = cls.from_pretrained(path, dtype=torch.float64, attn_implementation="eager",
                                   experts_implementation="eager").eval()
        cfg = m32.config
        n_layer, hidden = cfg.num_hidden_layers, cfg.hidden_size
        rng = np.random.default_rng(seed)
        d = rng.standard_normal((n_layer, hidden))
        d /= np.linalg.norm(d, axis=1, keepdims=True)
        d32 = d.astype("<f4")
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        d32.tofile(os.path.join(out, "dir.f32"))
        tokens = json.load(open(os.path.join(path, "tokens")))[:T]
        ids = torch.tensor([tokens])
        cases["models"][name] = {"fixture": fx, "tokens": tokens, "n_layer": n_layer, "n_embd": hidden}
        plain = steered_logits(m32, d32, 0, 0, ids, torch.float32)
        for comp, mean in mean_outputs(m32, n_layer, ids).items():
            mean.astype("<f4").tofile(os.path.join(out, f"mean_{comp}.f32"))
        for cname, ffn, attn in CASES:
            l32 = steered_logits(m32, d32, ffn, attn, ids, torch.float32)
            l64 = steered_logits(m64, d32.astype(np.float64), ffn, attn, ids, torch.float64)
            scale = np.abs(l32).max()
            gap = np.abs(l32 - l64).max()
            moved = np.abs(l32 - plain).max()
            print(f"{name} {cname}: max|logit| {scale:.3g}, f32 vs f64 {gap:.3g}, moved from unsteered {moved:.3g}")
            if gap > 1e-3 * scale:
                raise SystemExit(f"{name} {cname}: float32 and float64 disagree ({gap:.3g}); pick another seed")
            l32.astype("<f4").tofile(os.path.join(out, cname + ".logits"))
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
