#!/usr/bin/env python3
"""Regenerates tests/fixtures/ds4tiny/{A,B,C}: tiny random DeepSeek V4 models and
the float32 logits transformers computes for them (the golden reference the
engine's forward pass is compared against).

Needs torch + transformers (DeepseekV4ForCausalLM, tested with 5.24); the test
suite itself never runs this script, it only reads the committed outputs.

    python3 tests/oracles/ds4_tiny_oracle.py [--out tests/fixtures/ds4tiny] [A B C]

For each config:
  * build DeepseekV4ForCausalLM from a DeepseekV4Config (fact sheet section 14),
  * overwrite every parameter transformers initialises to a constant (tid2eid,
    router correction bias, sinks, compressor position biases, HC base/scale,
    every RMSNorm weight) with random values so no code path is skipped,
  * round every float weight to bf16 (the model still computes in float32),
  * save_pretrained in bf16 safetensors, reload the saved directory in float32
    and check the reload reproduces the in-memory logits exactly,
  * record the full-sequence logits (use_cache=False) for every position,
  * check transformers' own cached paths (prefill + token by token, uneven
    chunks) against the full forward and print the max differences.
"""
import argparse
import copy
import json
import os
import shutil
import sys

import numpy as np
import torch
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"

COMMON = dict(
    vocab_size=512, hidden_size=256, num_attention_heads=4, num_key_value_heads=1, head_dim=128,
    partial_rotary_factor=0.5, q_lora_rank=64, o_groups=2, o_lora_rank=64,
    # 4 routed experts (the sheet's tiny config has 8): keeps both fixtures inside
    # the 30 MB budget; top-2 of 4 still exercises selection and weighting.
    n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=256,
    scoring_func="sqrtsoftplus", norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=0.25,
    # 16 indexer heads (the sheet has 4): with 4, all four ReLU(q.k) terms of a
    # row are zero often enough that exact score ties at the top-k boundary occur.
    index_n_heads=16, index_head_dim=128, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
    rms_norm_eps=1e-6, rope_theta=10000.0, compress_rope_theta=160000.0,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1,
)


def rope(orig_ctx):
    return {
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "partial_rotary_factor": 0.5,
                     "factor": 16.0, "original_max_position_embeddings": orig_ctx,
                     "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.0},
    }


CONFIGS = {
    # Sheet section 14: ratios 4/16, window 8, top-k 4, 64 tokens.
    "A": dict(cfg=dict(
        num_hidden_layers=6, layer_types=[SWA, SWA, CSA, HCA, CSA, HCA],
        compress_rates={CSA: 4, HCA: 16}, mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 3,
        sliding_window=8, index_topk=4, max_position_embeddings=4096, rope_parameters=rope(256)),
        n_tokens=64, seed=1234),
    # Flash's real ratios 4/128, window 128 and YaRN constants (orig ctx 65536,
    # factor 16): HCA rows at t = 127, 255; the raw window saturates; top-k 8 of
    # up to 75 ratio-4 rows prunes.
    "B": dict(cfg=dict(
        num_hidden_layers=3, layer_types=[SWA, CSA, HCA],
        compress_rates={CSA: 4, HCA: 128}, mlp_layer_types=["hash_moe", "moe", "moe"],
        sliding_window=128, index_topk=8, max_position_embeddings=1048576,
        rope_parameters=rope(65536)),
        n_tokens=300, seed=5678),
    # The layer kind decided by layer_types, not by the ratio: a CSA layer
    # (overlapping compressor + indexer) compressing by 8 and an HCA layer
    # (plain compressor) by 4, the pairing a ratio-only reader gets wrong.
    # Two layers and quarter-width experts keep A+B+C inside the 30 MB budget;
    # top-k 4 of up to 16 ratio-8 rows prunes.
    "C": dict(cfg=dict(
        num_hidden_layers=2, layer_types=[CSA, HCA],
        compress_rates={CSA: 8, HCA: 4}, mlp_layer_types=["hash_moe", "moe"],
        moe_intermediate_size=64, sliding_window=8, index_topk=4, max_position_embeddings=4096,
        rope_parameters=rope(256)),
        n_tokens=128, seed=9012),
}


# Indexer score gap required at the top-k boundary, relative to the largest
# visible score: float32 implementations differ by ~1e-6 relative there.
MIN_MARGIN = 2e-5


def bf16_round(t):
    return t.to(torch.bfloat16).to(t.dtype)


@torch.no_grad()
def randomise(model, cfg, gen):
    """Give every constant-initialised parameter random values, then round all
    float weights to bf16."""
    randomise_constants(model, cfg, gen)
    # A wider output head makes the logits (and so argmax comparisons) less flat.
    model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=gen) * 0.1)
    round_weights(model)


@torch.no_grad()
def randomise_constants(model, cfg, gen):
    """Random values for every parameter of model's DeepSeek V4 modules that
    transformers initialises to a constant (the MTP oracle uses it too)."""
    def rnd(shape, lo, hi):
        return torch.rand(shape, generator=gen) * (hi - lo) + lo

    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if cls == "DeepseekV4RMSNorm":
            mod.weight.copy_(rnd(mod.weight.shape, 0.8, 1.2))
        elif cls == "DeepseekV4HyperConnection":
            mod.base.copy_(torch.randn(mod.base.shape, generator=gen) * 0.5)
            mod.scale.copy_(rnd(mod.scale.shape, 0.5, 2.0))
        elif cls == "DeepseekV4HyperHead":
            mod.hc_base.copy_(torch.randn(mod.hc_base.shape, generator=gen) * 0.5)
            mod.hc_scale.copy_(rnd(mod.hc_scale.shape, 0.5, 2.0))
        elif cls == "DeepseekV4Attention":
            mod.sinks.copy_(torch.randn(mod.sinks.shape, generator=gen))
        elif cls in ("DeepseekV4CSACompressor", "DeepseekV4HCACompressor", "DeepseekV4Indexer"):
            mod.position_bias.copy_(torch.randn(mod.position_bias.shape, generator=gen) * 0.5)
        elif cls == "DeepseekV4TopKRouter":
            mod.e_score_correction_bias.copy_(rnd(mod.e_score_correction_bias.shape, -0.1, 0.1))
        elif cls == "DeepseekV4HashRouter":
            n_exp, k = cfg.n_routed_experts, cfg.num_experts_per_tok
            ids = torch.stack([torch.randperm(n_exp, generator=gen)[:k] for _ in range(cfg.vocab_size)])
            mod.tid2eid.copy_(ids)


@torch.no_grad()
def round_weights(model):
    """Every float weight to bf16 and back. Only weights: the rotary inv_freq
    buffers are derived, not stored."""
    weights = list(model.parameters()) + [b for n, b in model.named_buffers() if "inv_freq" not in n]
    for p in weights:
        if p.is_floating_point():
            p.copy_(bf16_round(p))


def cache_of(out):
    return getattr(out, "past_key_values", None) or getattr(out, "cache", None)


@torch.no_grad()
def chunked_logits(model, ids, chunks):
    """Feeds ids in the given chunk sizes through one cache the model creates."""
    cache, pos, parts = None, 0, []
    for n in chunks:
        out = model(input_ids=ids[:, pos:pos + n], cache=cache, use_cache=True)
        cache = cache_of(out)
        parts.append(out.logits)
        pos += n
    assert pos == ids.shape[1]
    return torch.cat(parts, dim=1)


@torch.no_grad()
def indexer_margin(model, ids, cfg):
    """Smallest gap, over every ratio-4 layer and query position that prunes,
    between the k-th and (k+1)-th best visible indexer score, relative to the
    largest visible score. A tie there
    would make the selected rows (and so the golden logits) depend on
    tie-breaking and float rounding, which no other implementation can match."""
    captured = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: captured.append(out.detach()))
             for m in model.modules() if type(m).__name__ == "DeepseekV4IndexerScorer"]
    model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    ratio, k = cfg.compress_rates[CSA], cfg.index_topk
    margin, where = float("inf"), None
    for li, scores in enumerate(captured):
        for t in range(scores.shape[1]):
            visible = (t + 1) // ratio
            if visible <= k:
                continue
            s = torch.sort(scores[0, t, :visible], descending=True).values
            gap = (s[k - 1] - s[k]).item() / max(s.abs().max().item(), 1e-30)
            if gap < margin:
                margin, where = gap, (li, t)
    return margin, where


def uneven(total):
    sizes, i = [], 0
    pattern = [5, 7, 1, 13, 3, 9, 2, 17]
    while sum(sizes) < total:
        sizes.append(min(pattern[i % len(pattern)], total - sum(sizes)))
        i += 1
    return sizes


@torch.no_grad()
def build(name, spec, out_root, common=COMMON):
    """common: the config arguments shared by a family of fixtures (the
    PRO-shaped oracle, ds4_pro_oracle.py, passes its own)."""
    gen = torch.Generator().manual_seed(spec["seed"])
    torch.manual_seed(spec["seed"])
    cfg = DeepseekV4Config(**{**common, **spec["cfg"]}, attn_implementation="eager")
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    randomise(model, cfg, gen)

    T = spec["n_tokens"]
    out_dir = os.path.join(out_root, name)
    tmp = out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # A bf16 copy is saved: casting the model itself would also round its
    # derived rotary inv_freq buffers.
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    reloaded = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                                     attn_implementation="eager").eval()

    # Redraw the token sequence until no indexer selection is nearly tied.
    for attempt in range(300):
        ids = torch.randint(2, cfg.vocab_size, (1, T), generator=gen)
        ids[0, 0] = cfg.bos_token_id
        margin, where = indexer_margin(reloaded, ids, cfg)
        if margin >= MIN_MARGIN:
            break
        print(f"[{name}] tokens draw {attempt}: relative indexer margin {margin:.2g} too small")
    else:
        sys.exit(f"[{name}] every token sequence tried has a (nearly) tied indexer selection")
    print(f"[{name}] tokens draw {attempt}: smallest relative indexer top-k margin {margin:.3g} "
          f"at (indexer layer, position) {where}")

    full = model(input_ids=ids, use_cache=False).logits
    full2 = reloaded(input_ids=ids, use_cache=False).logits
    reload_diff = (full - full2).abs().max().item()
    print(f"[{name}] reload from bf16 safetensors: max |diff| = {reload_diff:.3g}")
    if reload_diff != 0.0:
        sys.exit(f"[{name}] saved model does not reproduce the in-memory logits")

    prefix = T // 2
    incr = chunked_logits(reloaded, ids, [prefix] + [1] * (T - prefix))
    chunks = uneven(T)
    unev = chunked_logits(reloaded, ids, chunks)
    d_incr = (incr - full2).abs().max().item()
    d_unev = (unev - full2).abs().max().item()
    scale = full2.abs().max().item()
    print(f"[{name}] T={T} max|logit|={scale:.3f}  prefill {prefix} + 1-by-1: max |diff| = {d_incr:.3g}; "
          f"chunks {chunks}: max |diff| = {d_unev:.3g}")
    argmax_agree = (incr.argmax(-1) == full2.argmax(-1)).float().mean().item()
    print(f"[{name}] argmax agreement incremental vs full: {argmax_agree:.4f}")

    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    for f in ("config.json", "model.safetensors"):
        shutil.move(os.path.join(tmp, f), os.path.join(out_dir, f))
    shutil.rmtree(tmp)
    with open(os.path.join(out_dir, "tokens"), "w") as f:
        json.dump(ids[0].tolist(), f)
        f.write("\n")
    full2.squeeze(0).numpy().astype("<f4").tofile(os.path.join(out_dir, "logits"))
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"[{name}] wrote {out_dir} ({size / 1e6:.1f} MB)")
    return dict(T=T, incr=d_incr, uneven=d_unev, chunks=chunks, scale=scale)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "ds4tiny"))
    ap.add_argument("names", nargs="*", default=sorted(CONFIGS))
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for n in a.names:
        build(n, CONFIGS[n], os.path.normpath(a.out))


if __name__ == "__main__":
    main()
