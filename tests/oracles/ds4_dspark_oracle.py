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
import types

import numpy as np
import torch

SEED = 6113
TARGETS = [1, 3]
BLOCK = 5
ANCHORS = [1, 2, 5, 8, 13, 21, 34, 55, 62]


def bf16_round(t):
    return t.to(torch.bfloat16).to(t.dtype)


def draft_config(cfg):
    """The draft's config: the target's with DSpark's fields and a small
    dense body (nemo derives the draft config from the target's the same way)."""
    c = types.SimpleNamespace()
    c.vocab_size = cfg.vocab_size
    c.hidden_size = cfg.hidden_size
    c.num_hidden_layers = 2
    c.num_attention_heads = 2
    c.head_dim = 64
    c.qk_rope_head_dim = 32
    c.q_lora_rank = 32
    c.o_groups = 2
    c.o_lora_rank = 32
    c.moe_intermediate_size = 64
    c.hidden_act = "silu"
    c.rms_norm_eps = cfg.rms_norm_eps
    c.rope_theta = 10000.0
    c.pad_token_id = None
    c.attention_dropout = 0.0
    c.target_layer_ids = TARGETS
    c.mask_token_id = cfg.vocab_size - 1
    c.num_anchors = 1
    c.block_size = BLOCK
    c.enable_confidence_head = True
    c.confidence_head_with_markov = True
    c.markov_rank = 16
    c.markov_head_type = "vanilla"
    return c


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


@torch.no_grad()
def target_features(model, ids):
    """[T][len(TARGETS)][E]: the mean of each target layer's output streams."""
    from transformers.masking_utils import create_sliding_window_causal_mask
    m, cfg = model.model, model.config
    emb = m.embed_tokens(ids)
    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    mask = create_sliding_window_causal_mask(config=cfg, inputs_embeds=emb, attention_mask=None, cache=None,
                                             position_ids=pos)
    pe = {"main": m.rotary_emb(emb, position_ids=pos, layer_type="main"),
          "compress": m.rotary_emb(emb, position_ids=pos, layer_type="compress")}
    h = emb.unsqueeze(2).expand(-1, -1, cfg.hc_mult, -1).contiguous()
    feats = {}
    for i, layer in enumerate(m.layers):
        h = layer(h, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=ids, cache=None)
        feats[i] = h.mean(dim=2)
    head = model.lm_head(m.norm(m.hc_head(h)))
    if (head - model(input_ids=ids, use_cache=False).logits).abs().max().item() != 0.0:
        sys.exit("the trunk does not reproduce transformers' forward")
    return torch.stack([feats[t][0] for t in TARGETS], dim=1)


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


def write_gguf(path, draft, c, n_layer_target):
    import gguf
    w = gguf.GGUFWriter(path, "dspark")
    w.add_name("dspark-oracle-A")
    k = lambda s: "dspark." + s
    w.add_uint32(k("embedding_length"), c.hidden_size)
    w.add_uint32(k("vocab_size"), c.vocab_size)
    w.add_uint32(k("target_block_count"), n_layer_target)
    w.add_array(k("target_layers"), [int(t) for t in TARGETS])
    w.add_uint32(k("block_count"), c.num_hidden_layers)
    w.add_uint32(k("block_size"), c.block_size)
    w.add_uint32(k("mask_token_id"), c.mask_token_id)
    w.add_uint32(k("head_count"), c.num_attention_heads)
    w.add_uint32(k("key_length"), c.head_dim)
    w.add_uint32(k("rope.dimension_count"), c.qk_rope_head_dim)
    w.add_float32(k("rope.freq_base"), c.rope_theta)
    w.add_uint32(k("q_lora_rank"), c.q_lora_rank)
    w.add_uint32(k("output_group_count"), c.o_groups)
    w.add_uint32(k("output_lora_rank"), c.o_lora_rank)
    w.add_uint32(k("feed_forward_length"), c.moe_intermediate_size)
    w.add_uint32(k("markov_rank"), c.markov_rank)
    w.add_float32(k("layer_norm_rms_epsilon"), c.rms_norm_eps)
    sd = draft.state_dict()
    t = lambda name, src: w.add_tensor(name, sd[src].detach().float().contiguous().numpy())
    t("dspark.fc.weight", "fc.weight")
    t("dspark.hidden_norm.weight", "hidden_norm.weight")
    t("dspark.norm.weight", "norm.weight")
    t("dspark.markov_w1.weight", "markov_head.markov_w1.weight")
    t("dspark.markov_w2.weight", "markov_head.markov_w2.weight")
    t("dspark.confidence.weight", "confidence_head.proj.weight")
    t("dspark.confidence.bias", "confidence_head.proj.bias")
    names = {"attn_norm": "input_layernorm", "attn_q_a": "self_attn.wq_a", "attn_q_a_norm": "self_attn.q_norm",
             "attn_q_b": "self_attn.wq_b", "attn_kv": "self_attn.wkv", "attn_kv_a_norm": "self_attn.kv_norm",
             "attn_sinks": "self_attn.sinks_param", "attn_output_a": "self_attn.wo_a",
             "attn_output_b": "self_attn.wo_b", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for l in range(c.num_hidden_layers):
        for ours, theirs in names.items():
            t(f"dspark.blk.{l}.{ours}.weight", f"layers.{l}.{theirs}.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
    write_gguf(os.path.join(out, "dspark.gguf"), draft, c, model.config.num_hidden_layers)
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
