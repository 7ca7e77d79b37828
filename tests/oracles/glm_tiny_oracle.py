#!/usr/bin/env python3
"""Regenerates tests/fixtures/glmtiny/<name>: a tiny random GLM 5.2 model
(transformers' GlmMoeDsaForCausalLM) and the float32 logits transformers
computes for it, the golden reference a GLM forward pass is compared with.

Needs torch + transformers with glm_moe_dsa (5.24 tested); the test suite
never runs this script, it only reads the committed outputs.

    python3 tests/oracles/glm_tiny_oracle.py [--out tests/fixtures/glmtiny] [A]

For each config:
  * build GlmMoeDsaForCausalLM with every path on: a dense first layer, MoE
    layers with the shared expert, "full" and "shared" indexer layers, an
    indexer top-k far below the sequence length, 16 indexer heads (with few
    heads the ReLU scores tie at zero and torch's tie order is unspecified);
  * give every parameter transformers initialises to a constant (RMSNorm and
    LayerNorm weights and biases, the router's correction bias) random
    values, then round every float weight to bf16 (computation stays f32);
  * save_pretrained in bf16 safetensors, reload in float32 and require the
    reload to reproduce the in-memory logits exactly;
  * require the float64 forward of the same weights to agree with float32
    to 1e-3 of the logit scale: a near-tie in any top-k (indexer or router)
    would flip a selection between the two and break that, so no golden
    logit depends on tie order or rounding;
  * record the full-sequence logits (use_cache=False) at every position and
    print how transformers' own cached paths (prefill + token by token,
    uneven chunks) differ from them.
"""
import argparse
import copy
import json
import os
import shutil
import sys

import torch
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ds4_tiny_oracle import bf16_round, chunked_logits, uneven  # noqa: E402  (shared helpers)

COMMON = dict(
    vocab_size=256, hidden_size=128, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=64, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=32,
    intermediate_size=256, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
    n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    first_k_dense_replace=1, index_n_heads=16, index_head_dim=64, rms_norm_eps=1e-5,
    max_position_embeddings=4096, tie_word_embeddings=False, attention_bias=False,
    bos_token_id=0, eos_token_id=1, pad_token_id=1,
)

CONFIGS = {
    # 4 layers: dense + 3 MoE; indexer full, shared, full, shared; top-16 of up to 300 keys.
    "A": dict(cfg=dict(num_hidden_layers=4, index_topk=16,
                       indexer_types=["full", "shared", "full", "shared"],
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
              n_tokens=300, seed=4321),
}

TIE_TOLERANCE = 1e-3


@torch.no_grad()
def randomise(model, gen):
    def rnd(shape, lo, hi):
        return torch.rand(shape, generator=gen) * (hi - lo) + lo

    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if cls.endswith("RMSNorm") or isinstance(mod, torch.nn.LayerNorm):
            mod.weight.copy_(rnd(mod.weight.shape, 0.8, 1.2))
            if getattr(mod, "bias", None) is not None:
                mod.bias.copy_(rnd(mod.bias.shape, -0.1, 0.1))
        bias = getattr(mod, "e_score_correction_bias", None)
        if isinstance(bias, torch.Tensor):
            bias.copy_(rnd(bias.shape, -0.1, 0.1))
    model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=gen) * 0.1)
    weights = list(model.parameters()) + [b for n, b in model.named_buffers() if "inv_freq" not in n]
    for p in weights:
        if p.is_floating_point():
            p.copy_(bf16_round(p))


@torch.no_grad()
def build(name, spec, out_root):
    gen = torch.Generator().manual_seed(spec["seed"])
    torch.manual_seed(spec["seed"])
    # eager experts: the grouped-mm path has no float64 kernel (the tie check needs one)
    cfg = GlmMoeDsaConfig(**COMMON, **spec["cfg"], attn_implementation="eager", experts_implementation="eager")
    model = GlmMoeDsaForCausalLM(cfg).float().eval()
    randomise(model, gen)

    T = spec["n_tokens"]
    out_dir = os.path.join(out_root, name)
    tmp = out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    reloaded = GlmMoeDsaForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager",
                                                    experts_implementation="eager").eval()
    wide = copy.deepcopy(reloaded).double()

    for attempt in range(100):
        ids = torch.randint(2, cfg.vocab_size, (1, T), generator=gen)
        ids[0, 0] = cfg.bos_token_id
        full = reloaded(input_ids=ids, use_cache=False).logits
        ref64 = wide(input_ids=ids, use_cache=False).logits
        scale = full.abs().max().item()
        d64 = (full.double() - ref64).abs().max().item()
        if d64 <= TIE_TOLERANCE * scale:
            break
        print(f"[{name}] tokens draw {attempt}: f32 vs f64 max |diff| {d64:.3g} (scale {scale:.3g}): near tie")
    else:
        sys.exit(f"[{name}] every token sequence tried has a near-tied top-k selection")
    print(f"[{name}] tokens draw {attempt}: f32 vs f64 max |diff| = {d64:.3g}, max |logit| = {scale:.3f}")

    mem = model(input_ids=ids, use_cache=False).logits
    reload_diff = (mem - full).abs().max().item()
    print(f"[{name}] reload from bf16 safetensors: max |diff| = {reload_diff:.3g}")
    if reload_diff != 0.0:
        sys.exit(f"[{name}] saved model does not reproduce the in-memory logits")

    prefix = T // 2
    incr = chunked_logits(reloaded, ids, [prefix] + [1] * (T - prefix))
    chunks = uneven(T)
    unev = chunked_logits(reloaded, ids, chunks)
    print(f"[{name}] prefill {prefix} + 1-by-1: max |diff| = {(incr - full).abs().max().item():.3g}; "
          f"uneven chunks: max |diff| = {(unev - full).abs().max().item():.3g}")

    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    for f in ("config.json", "model.safetensors"):
        shutil.move(os.path.join(tmp, f), os.path.join(out_dir, f))
    shutil.rmtree(tmp)
    with open(os.path.join(out_dir, "tokens"), "w") as f:
        json.dump(ids[0].tolist(), f)
        f.write("\n")
    full.squeeze(0).numpy().astype("<f4").tofile(os.path.join(out_dir, "logits"))
    size = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"[{name}] wrote {out_dir} ({size / 1e6:.1f} MB)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "glmtiny"))
    ap.add_argument("names", nargs="*", default=sorted(CONFIGS))
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for n in a.names:
        build(n, CONFIGS[n], os.path.normpath(a.out))


if __name__ == "__main__":
    main()
