#!/usr/bin/env python3
"""Regenerates tests/fixtures/ds4tiny/<X>/mtp/: a random one-stage MTP block
for each oracle model X (A, B, C) and the float32 logits a reference built
from transformers' own DeepSeek V4 modules computes for it.

transformers' DeepseekV4ForCausalLM ignores the checkpoint's mtp.0.* tensors,
so the reference is assembled from its modules the way DeepSeek V4's MTP is
specified: for position i of the main model's token sequence,

    x[s]   = e_proj(RMSNorm(embed(token[i+1]); enorm)) + h_proj(RMSNorm(H_i[s]; hnorm))
    y      = DeepseekV4DecoderLayer (one sliding-attention, top-k routed MoE layer,
             the main model's masks and RoPE tables) applied to x over all positions
    logits = lm_head(RMSNorm(DeepseekV4HyperHead_mtp(y); norm))

where H_i are the main model's final hyper-connection streams at position i
(the input of its own hc_head) and embed / lm_head are the main model's.
The test suite never runs this script; it reads the committed outputs.

    /path/to/python-with-transformers tests/oracles/ds4_mtp_oracle.py [A B C]

Files per model (tests/fixtures/ds4tiny/<X>/mtp/):
  config.json        the main model's config (ds4-convert --mtp reads it)
  model.safetensors  the block, BF16, as the official checkpoint names it
                     (mtp.0.attn.wq_a.weight, mtp.0.ffn.experts.1.w1.weight,
                     mtp.0.e_proj.weight, mtp.0.hc_head_fn, ...)
  logits             raw little-endian float32 [T-1][vocab]: row i is the
                     block at position i reading token i+1
"""
import argparse
import copy
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4ForCausalLM

from ds4_tiny_oracle import randomise_constants, round_weights

# The block as tools/train-tiny trains it: transformers' modules only.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train-tiny"))
import hf_trunk  # noqa: E402
from model import MTP  # noqa: E402

SWA = "sliding_attention"
SEEDS = {"A": 4321, "B": 8765, "C": 2109}


@torch.no_grad()
def randomise(mtp, cfg, gen):
    """Random projections (std 0.05), random values where transformers
    initialises a constant (as the main oracle does), BF16 rounding."""
    # modules built outside a PreTrainedModel keep torch.empty contents
    for p in mtp.parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    randomise_constants(mtp, cfg, gen)
    mtp.e_proj.weight.copy_(torch.randn(mtp.e_proj.weight.shape, generator=gen) * 0.05)
    mtp.h_proj.weight.copy_(torch.randn(mtp.h_proj.weight.shape, generator=gen) * 0.05)
    round_weights(mtp)


@torch.no_grad()
def mtp_logits(model, mtp, ids):
    layers, pe, pos, mask = hf_trunk.trunk(model, ids)
    h = layers[-1]
    # the trunk is transformers' forward: its head reproduces the model's logits
    head = model.lm_head(model.model.norm(model.model.hc_head(h)))
    ref = model(input_ids=ids, use_cache=False).logits
    if (head - ref).abs().max().item() != 0.0:
        sys.exit("the trunk does not reproduce transformers' forward")
    nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
    e = mtp.e_proj(mtp.enorm(model.model.embed_tokens(nxt)))
    x = e.unsqueeze(2) + mtp.h_proj(mtp.hnorm(h))
    y = mtp.block(x, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=nxt, cache=None)
    out = model.lm_head(mtp.norm(mtp.hc_head(y)))
    return out[0, :-1]      # the last position has no next token


def official_names(mtp, cfg, tmp):
    """The block's tensors under the names a checkpoint gives them: the
    decoder layer as transformers saves layer 0, re-prefixed mtp.0."""
    one = copy.deepcopy(cfg)
    one.num_hidden_layers = 1
    one.layer_types = [SWA]
    one.mlp_layer_types = ["moe"]
    lm = DeepseekV4ForCausalLM(one)
    lm.model.layers[0].load_state_dict(mtp.block.state_dict())
    lm.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    saved = load_file(os.path.join(tmp, "model.safetensors"))
    out = {"mtp.0." + k[len("model.layers.0."):]: v for k, v in saved.items() if k.startswith("model.layers.0.")}
    bf = lambda t: t.detach().to(torch.bfloat16).contiguous()
    out.update({
        "mtp.0.e_proj.weight": bf(mtp.e_proj.weight), "mtp.0.h_proj.weight": bf(mtp.h_proj.weight),
        "mtp.0.enorm.weight": bf(mtp.enorm.weight), "mtp.0.hnorm.weight": bf(mtp.hnorm.weight),
        "mtp.0.norm.weight": bf(mtp.norm.weight), "mtp.0.hc_head_fn": bf(mtp.hc_head.hc_fn),
        "mtp.0.hc_head_base": bf(mtp.hc_head.hc_base), "mtp.0.hc_head_scale": bf(mtp.hc_head.hc_scale)})
    return out


def build(name, root):
    d = os.path.join(root, name)
    model = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    ids = torch.tensor([json.load(open(os.path.join(d, "tokens")))])
    gen = torch.Generator().manual_seed(SEEDS[name])
    torch.manual_seed(SEEDS[name])
    mtp = MTP(cfg).float().eval()
    randomise(mtp, cfg, gen)
    logits = mtp_logits(model, mtp, ids)
    top2 = torch.topk(logits, 2, dim=-1).values
    gap = (top2[:, 0] - top2[:, 1]).min().item()
    out = os.path.join(d, "mtp")
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tensors = official_names(mtp, cfg, tmp)
    shutil.rmtree(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    save_file(tensors, os.path.join(out, "model.safetensors"))
    shutil.copy(os.path.join(d, "config.json"), os.path.join(out, "config.json"))
    logits.numpy().astype("<f4").tofile(os.path.join(out, "logits"))
    print(f"[{name}] T={ids.shape[1]} window={cfg.sliding_window} max|logit|={logits.abs().max().item():.3f} "
          f"smallest top-2 gap {gap:.3g}; {len(tensors)} tensors -> {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "ds4tiny"))
    ap.add_argument("names", nargs="*", default=sorted(SEEDS))
    a = ap.parse_args()
    torch.set_num_threads(1)
    for n in a.names:
        build(n, os.path.normpath(a.root))


if __name__ == "__main__":
    main()
