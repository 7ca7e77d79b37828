#!/usr/bin/env python3
"""How far the GLM oracle itself moves when its weights are rounded to Q8_0,
the bound tests/unit/test_glm_engine.c allows a q8_0 model.

The numpy forward pass (glm_reference.py, independent of the engine and
matching transformers to 2.4e-6) is run on tests/fixtures/glmtiny/A twice:
with the fixture's weights, and with every tensor that `ds4-convert --type
q8_0` stores as Q8_0 rounded to Q8_0 (blocks of 32 along the GGUF row: the
input dimension of a linear layer; kv_b_proj's key half along qk_nope, its
value half along kv_lora, as attn_k_b / attn_v_b are stored). Norms, the
router, its bias and the indexer's head weights stay float (F32 in the q8_0
mix). Prints the largest logit change relative to the largest golden logit
and the largest change of any position's top-2 gap's sign margin; the
engine's q8_0 bound in test_glm_engine.c is derived from these numbers
(numpy only, no torch)."""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "convert"))
import glm_reference  # noqa: E402
import st_np  # noqa: E402

FLOAT_KEPT = ("layernorm", "norm.weight", "norm.bias", "mlp.gate.weight", "e_score_correction_bias",
              "weights_proj", "k_norm")


def q8_0_rows(w):
    """Q8_0 round trip along the last axis (blocks of 32, f16 scale)."""
    shape = w.shape
    b = w.reshape(-1, 32).astype(np.float32)
    d = (np.abs(b).max(1) / 127).astype(np.float16).astype(np.float32)
    inv = np.where(d > 0, 1 / np.where(d > 0, d, 1), 0)
    q = np.clip(np.round(b * inv[:, None]), -127, 127)
    return (q * d[:, None]).reshape(shape)


def rounded(cfg, W):
    out = {}
    H, nope, dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    for name, w in W.items():
        if w.ndim < 2 or any(k in name for k in FLOAT_KEPT):
            out[name] = w
        elif name.endswith("kv_b_proj.weight"):
            kvb = w.reshape(H, nope + dv, -1)
            k = q8_0_rows(np.swapaxes(kvb[:, :nope], 1, 2))   # rows along qk_nope
            v = q8_0_rows(kvb[:, nope:])                       # rows along kv_lora
            out[name] = np.concatenate([np.swapaxes(k, 1, 2), v], 1).reshape(w.shape)
        else:
            out[name] = q8_0_rows(w)
    return out


def main():
    fx = os.path.join(ROOT, "tests", "fixtures", "glmtiny", "A")
    cfg = json.load(open(os.path.join(fx, "config.json")))
    tokens = json.load(open(os.path.join(fx, "tokens")))
    W = {k: st_np.to_f32(v) for k, v in st_np.read(os.path.join(fx, "model.safetensors")).items()}
    golden = np.fromfile(os.path.join(fx, "logits"), dtype="<f4").reshape(len(tokens), cfg["vocab_size"])
    q8 = glm_reference.forward(cfg, rounded(cfg, W), tokens)
    scale = np.abs(golden).max()
    diff = np.abs(q8 - golden).max(axis=1)
    top2 = np.sort(golden, 1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    flipped = q8.argmax(1) != golden.argmax(1)
    print(f"oracle with Q8_0 weights: max |logit change| {diff.max():.3g} at position {int(diff.argmax())} "
          f"= {diff.max() / scale:.3g} of max |logit| {scale:.3g}")
    print(f"argmax flips at {int(flipped.sum())}/{len(tokens)} positions; largest golden top-2 gap among them "
          f"{gap[flipped].max() if flipped.any() else 0:.3g}")


if __name__ == "__main__":
    main()
