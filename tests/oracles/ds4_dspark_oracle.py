#!/usr/bin/env python3
"""Regenerates tests/fixtures/ds4tiny/A/dspark/: a random DSpark block drafter
for oracle model A as a DSpark support GGUF (ds4_layout.h's DwarfStar
layout), and what nemo-automodel's own DeepSeek V4 DSpark draft module
(DeepseekV4DSparkModel, components/speculative/dspark/draft_deepseek_v4.py)
computes for it.

The draft reads hidden states of chosen layers of the main model: for each
target layer, the mean of the layer's output hyper-connection streams, as
nemo-automodel's DSpark target wrapper captures them (its
_collapse_hc_streams). The main model's layers are run by transformers'
DeepseekV4ForCausalLM (the oracle of the main model) on the fixture tokens.
The draft's token embedding and output head are the main model's (nemo:
initialize_embeddings_and_head).

For each anchor position a, the block is what speculative decoding asks for:
context = target features of positions 0..a-1, block rows [token a, mask x
(block_size - 1)] at positions a.., the DFlash mask of one anchor; then the
Markov head's greedy block sampling (sample_draft_tokens, temperature 0)
and the confidence head on the same previous tokens.

    /path/to/python-with-torch-transformers tests/oracles/ds4_dspark_oracle.py \
        --nemo /path/containing/nemo_automodel

Files (tests/fixtures/ds4tiny/A/dspark/):
  dspark.gguf  the draft, f32 (values BF16-representable), target layers 1, 3
  features     raw little-endian float32 [T][2][E]: the target features
  blocks       raw little-endian, per anchor: i32 anchor, i32 tokens[5],
               f32 confidence[5] (sigmoid), f32 logits[5][V]
The test suite never runs this script; it reads the committed outputs.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train-tiny"))
import dspark_draft  # noqa: E402

SEED = 6113
TARGETS = [1, 3]
BLOCK = 5
ANCHORS = [1, 2, 5, 8, 13, 21, 34, 55, 62]


def bf16_round(t):
    return t.to(torch.bfloat16).to(t.dtype)


def draft_config(cfg):
    """The oracle draft: two small layers reading TARGETS."""
    return dspark_draft.draft_config(cfg, TARGETS, layers=2, heads=2, head_dim=64, rope_dim=32, q_lora=32, o_groups=2,
                                     o_lora=32, ff=64, markov_rank=16, block_size=BLOCK)


@torch.no_grad()
def randomise(draft, gen):
    def rnd(shape, lo, hi):
        return torch.rand(shape, generator=gen) * (hi - lo) + lo
    for name, p in draft.named_parameters():
        if name.startswith(("embed_tokens", "lm_head")):
            continue
        if name.endswith("norm.weight") or "layernorm" in name:
            p.copy_(rnd(p.shape, 0.8, 1.2))
        elif "sinks" in name:
            p.copy_(torch.randn(p.shape, generator=gen))
        elif "markov_w1" in name:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        p.copy_(bf16_round(p))


def target_features(model, ids):
    """[T][len(TARGETS)][E]: the mean of each target layer's output streams."""
    feats, _ = dspark_draft.target_features(model, ids, TARGETS, check=True)
    return feats[0].reshape(ids.shape[1], len(TARGETS), -1)


@torch.no_grad()
def block(draft, feats, ids, a):
    from nemo_automodel.components.attention.dflash_mask import create_dflash_sdpa_mask
    ctx = feats[:a].reshape(1, a, -1)
    tok = ids[0, a]
    noise_ids = torch.full((1, BLOCK), draft.mask_token_id, dtype=torch.long)
    noise_ids[0, 0] = tok
    noise = draft.embed_tokens(noise_ids)
    pos = torch.cat([torch.arange(a), torch.arange(a, a + BLOCK)]).unsqueeze(0)
    mask = create_dflash_sdpa_mask(torch.tensor([[a]]), torch.tensor([[True]]), a, BLOCK, torch.device("cpu"),
                                   noise.dtype)
    hid = draft._forward_backbone(position_ids=pos, attention_mask=mask, noise_embedding=noise,
                                  target_hidden_states=ctx)
    base = draft.compute_logits(hid)
    toks, logits = draft.sample_draft_tokens(base, first_prev_token_ids=tok.view(1), temperature=0.0,
                                             hidden_states=hid)
    prev = torch.cat([tok.view(1, 1), toks[:, :-1]], dim=1)
    conf = torch.sigmoid(draft.predict_confidence_step(hid, prev_token_ids=prev))
    return toks[0], conf[0], logits[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "ds4tiny"))
    ap.add_argument("--nemo", default=None, help="directory holding the nemo_automodel package")
    a = ap.parse_args()
    if a.nemo:
        sys.path.insert(0, a.nemo)
    from nemo_automodel.components.speculative.dspark.draft_deepseek_v4 import DeepseekV4DSparkModel
    from transformers import DeepseekV4ForCausalLM
    torch.set_num_threads(1)
    d = os.path.join(os.path.normpath(a.root), "A")
    model = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor([json.load(open(os.path.join(d, "tokens")))])
    feats = target_features(model, ids)
    c = draft_config(model.config)
    torch.manual_seed(SEED)
    draft = DeepseekV4DSparkModel(c).float().eval()
    draft.initialize_embeddings_and_head(embed_tokens=model.model.embed_tokens, lm_head=model.lm_head)
    randomise(draft, torch.Generator().manual_seed(SEED))
    out = os.path.join(d, "dspark")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    dspark_draft.write_gguf(os.path.join(out, "dspark.gguf"), draft, c, model.config.num_hidden_layers,
                            "dspark-oracle-A")
    feats.numpy().astype("<f4").tofile(os.path.join(out, "features"))
    gap = float("inf")
    with open(os.path.join(out, "blocks"), "wb") as f:
        for anchor in ANCHORS:
            toks, conf, logits = block(draft, feats, ids, anchor)
            top2 = torch.topk(logits, 2, dim=-1).values
            gap = min(gap, (top2[:, 0] - top2[:, 1]).min().item())
            f.write(np.array([anchor] + toks.tolist(), dtype="<i4").tobytes())
            f.write(conf.numpy().astype("<f4").tobytes())
            f.write(logits.numpy().astype("<f4").tobytes())
            print(f"anchor {anchor}: drafts {toks.tolist()} confidence {[round(x, 3) for x in conf.tolist()]}")
    print(f"T={ids.shape[1]} smallest top-2 gap {gap:.3g} -> {out}")


if __name__ == "__main__":
    main()
