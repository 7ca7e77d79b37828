#!/usr/bin/env python3
"""Regenerates tests/fixtures/ds4tiny/<X>/dspark-sidecar/ (X = A, B): a random
DSpark drafter in the layout of DeepSeek's released DSpark sidecar
(general.architecture "deepseek4-dspark": stages mtp.0 .. mtp.S-1 that are full
DeepSeek V4 blocks with hyper-connections and routed experts) and the float32
blocks a reference built from transformers' own DeepSeek V4 modules computes
for it.

No package implements this drafter, so the reference is assembled from
transformers' modules (DeepseekV4DecoderLayer: hyper-connections, top-k routed
MoE with a shared expert; DeepseekV4HyperHead; DeepseekV4RMSNorm; the
attention module's projections, norms, sinks and eager attention) the way
DeepSeek's reference (inference/model.py, DSparkBlock / forward_spec) defines
the draft:

  feature_j  = for each target layer t: the mean of the hyper-connection
               streams entering layer t at position j (its attention input),
               concatenated
  main_x_j   = RMSNorm(main_proj(feature_j); main_norm)
  context    = per stage s: K = V rows RMSNorm(wkv_s(main_x_j); kv_norm_s),
               roped at j, for the last `sliding_window` positions j < n
  block      = rows [token n, noise x (block_size - 1)] at positions
               n .. n + block_size - 1, embedded and copied to every stream
  stage s    = a decoder layer whose attention reads its queries and its
               own K = V rows from the block and attends to the context
               rows and every block row (no mask), sinks, inverse RoPE on
               the output, grouped output projection
  head       = x_k = hc_head(streams_k) (the last stage's), logits_k =
               lm_head(RMSNorm(x_k; norm)) + markov_w2 . markov_w1[prev_k],
               prev_0 = token n, prev_k the greedy draft of row k - 1
  confidence = sigmoid(proj([x_k; markov_w1[prev_k]]))

The draft's token embedding and output head are the main model's; the main
model is transformers' DeepseekV4ForCausalLM on the fixture's tokens.

    /path/to/python-with-torch-transformers-gguf tests/oracles/ds4_dspark_sidecar_oracle.py [A B]

Files (tests/fixtures/ds4tiny/<X>/dspark-sidecar/):
  dspark.gguf  the drafter, f32 (values BF16-representable), tensor names as
               the released sidecar's
  features     raw little-endian float32 [T][targets][E]
  blocks       raw little-endian, per anchor n: i32 n, i32 tokens[B],
               f32 confidence[B], f32 logits[B][V]
The test suite never runs this script; it reads the committed outputs.
"""
import argparse
import copy
import json
import os
import shutil
import sys

import numpy as np
import torch
from torch import nn

from ds4_tiny_oracle import randomise_constants, round_weights

SWA = "sliding_attention"
BLOCK = 5
# per model: seed, stages, target layers, Markov rank, noise token, anchors
SPECS = {
    "A": dict(seed=7411, stages=3, targets=[3, 4, 5], rank=16, noise=509,
              anchors=[1, 2, 7, 8, 9, 20, 41, 63]),
    "B": dict(seed=7412, stages=2, targets=[1, 2], rank=24, noise=3,
              anchors=[1, 3, 64, 127, 128, 129, 200, 299]),
}


class SidecarAttention(nn.Module):
    """The stage's attention: transformers' module's weights, the block's
    queries over the context rows and the block's own rows."""

    def __init__(self, attn):
        super().__init__()
        self.attn = attn

    def forward(self, x, position_embeddings, context, context_pe, **_):
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import (apply_rotary_pos_emb,
                                                                          eager_attention_forward)
        a = self.attn
        cos, sin = position_embeddings["main"]
        n_blk, D = x.shape[1], a.head_dim
        q = a.q_b_proj(a.q_a_norm(a.q_a_proj(x))).view(1, n_blk, -1, D).transpose(1, 2)
        q = apply_rotary_pos_emb(a.q_b_norm(q), cos, sin)
        kv = apply_rotary_pos_emb(a.kv_norm(a.kv_proj(x)).view(1, n_blk, 1, D).transpose(1, 2), cos, sin)
        ccos, csin = context_pe
        ckv = a.kv_norm(a.kv_proj(context)).view(1, context.shape[1], 1, D).transpose(1, 2)
        ckv = apply_rotary_pos_emb(ckv, ccos, csin)
        kv = torch.cat([ckv, kv], dim=2)
        out, _ = eager_attention_forward(a, q, kv, kv, None, scaling=a.scaling)
        out = apply_rotary_pos_emb(out.transpose(1, 2), cos, -sin).transpose(1, 2)
        return a.o_b_proj(a.o_a_proj(out.reshape(1, n_blk, a.config.o_groups, -1)).flatten(2)), None


class Sidecar(nn.Module):
    def __init__(self, cfg, spec):
        super().__init__()
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import (DeepseekV4DecoderLayer,
                                                                          DeepseekV4HyperHead, DeepseekV4RMSNorm)
        S, E, V = spec["stages"], cfg.hidden_size, cfg.vocab_size
        dc = copy.deepcopy(cfg)
        dc.num_hidden_layers = S
        dc.layer_types = [SWA] * S
        dc.mlp_layer_types = ["moe"] * S
        self.cfg, self.spec = dc, spec
        self.stages = nn.ModuleList(DeepseekV4DecoderLayer(dc, i) for i in range(S))
        for st in self.stages:
            st.self_attn = SidecarAttention(st.self_attn)
        self.main_proj = nn.Linear(len(spec["targets"]) * E, E, bias=False)
        self.main_norm = DeepseekV4RMSNorm(E, eps=cfg.rms_norm_eps)
        self.hc_head = DeepseekV4HyperHead(dc)
        self.norm = DeepseekV4RMSNorm(E, eps=cfg.rms_norm_eps)
        self.markov_w1 = nn.Parameter(torch.empty(V, spec["rank"]))
        self.markov_w2 = nn.Parameter(torch.empty(V, spec["rank"]))
        self.confidence = nn.Linear(E + spec["rank"], 1, bias=False)


@torch.no_grad()
def randomise(sc, cfg, gen):
    for p in sc.parameters():
        p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    randomise_constants(sc, cfg, gen)
    sc.markov_w1.copy_(torch.randn(sc.markov_w1.shape, generator=gen) * 0.5)
    for st in sc.stages:   # buffers randomise_constants leaves alone on modules built outside a model
        st.mlp.gate.e_score_correction_bias.copy_(torch.rand(cfg.n_routed_experts, generator=gen) * 0.2 - 0.1)
    round_weights(sc)


def features(model, ids, targets):
    """[T][targets][E]: the mean of the streams entering each target layer."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train-tiny"))
    import hf_trunk
    layers, _, _, _ = hf_trunk.trunk(model, ids)
    return torch.stack([layers[t - 1][0].mean(dim=1) for t in targets], dim=1)


@torch.no_grad()
def block(model, sc, feats, ids, n):
    cfg, spec = sc.cfg, sc.spec
    m = model.model
    W = cfg.sliding_window
    lo = max(0, n - W)
    main_x = sc.main_norm(sc.main_proj(feats[lo:n].reshape(1, n - lo, -1)))
    blk = torch.full((1, BLOCK), spec["noise"], dtype=torch.long)
    blk[0, 0] = ids[0, n]
    x = m.embed_tokens(blk)
    pos = torch.arange(n, n + BLOCK).unsqueeze(0)
    pe = {"main": m.rotary_emb(x, position_ids=pos, layer_type="main")}
    cpe = m.rotary_emb(main_x, position_ids=torch.arange(lo, n).unsqueeze(0), layer_type="main")
    h = x.unsqueeze(2).expand(-1, -1, cfg.hc_mult, -1).contiguous()
    for st in sc.stages:
        h = st(h, position_embeddings=pe, position_ids=pos, attention_mask=None, context=main_x, context_pe=cpe)
    xk = sc.hc_head(h)[0]
    base = model.lm_head(sc.norm(xk))
    prev, toks, confs, logits = int(ids[0, n]), [], [], []
    for k in range(BLOCK):
        emb = sc.markov_w1[prev]
        row = base[k] + sc.markov_w2 @ emb
        confs.append(torch.sigmoid(sc.confidence(torch.cat([xk[k], emb]))).item())
        logits.append(row)
        prev = int(row.argmax())
        toks.append(prev)
    return toks, np.array(confs, dtype="<f4"), torch.stack(logits)


def write_gguf(path, sc, spec, name):
    import gguf
    w = gguf.GGUFWriter(path, "deepseek4-dspark")
    w.add_name(name)
    for key, value in (("block_size", BLOCK), ("markov_rank", spec["rank"]), ("n_layers", spec["stages"]),
                       ("noise_token_id", spec["noise"]), ("stage_count", spec["stages"])):
        w.add_uint32("dspark." + key, value)
    w.add_array("dspark.target_layer_ids", [int(t) for t in spec["targets"]])
    f = lambda t: t.detach().float().contiguous().numpy()
    F = sc.cfg.moe_intermediate_size
    for s, st in enumerate(sc.stages):
        p, a, mlp = f"mtp.{s}.", st.self_attn.attn, st.mlp
        for gname, t in (("attn_norm.weight", st.input_layernorm.weight), ("attn_q_a.weight", a.q_a_proj.weight),
                         ("attn_q_a_norm.weight", a.q_a_norm.weight), ("attn_q_b.weight", a.q_b_proj.weight),
                         ("attn_kv.weight", a.kv_proj.weight), ("attn_kv_a_norm.weight", a.kv_norm.weight),
                         ("attn_sinks.weight", a.sinks), ("attn_output_a.weight", a.o_a_proj.weight),
                         ("attn_output_b.weight", a.o_b_proj.weight), ("ffn_norm.weight", st.post_attention_layernorm.weight),
                         ("ffn_gate_inp.weight", mlp.gate.weight), ("exp_probs_b.bias", mlp.gate.e_score_correction_bias),
                         ("ffn_gate_exps.weight", mlp.experts.gate_up_proj[:, :F]),
                         ("ffn_up_exps.weight", mlp.experts.gate_up_proj[:, F:]),
                         ("ffn_down_exps.weight", mlp.experts.down_proj),
                         ("ffn_gate_shexp.weight", mlp.shared_experts.gate_proj.weight),
                         ("ffn_up_shexp.weight", mlp.shared_experts.up_proj.weight),
                         ("ffn_down_shexp.weight", mlp.shared_experts.down_proj.weight),
                         ("hc_attn_fn.weight", st.attn_hc.fn), ("hc_attn_base.weight", st.attn_hc.base),
                         ("hc_attn_scale.weight", st.attn_hc.scale), ("hc_ffn_fn.weight", st.ffn_hc.fn),
                         ("hc_ffn_base.weight", st.ffn_hc.base), ("hc_ffn_scale.weight", st.ffn_hc.scale)):
            w.add_tensor(p + gname, f(t))
    w.add_tensor("mtp.0.main_proj.weight", f(sc.main_proj.weight))
    w.add_tensor("mtp.0.main_norm.weight", f(sc.main_norm.weight))
    last = f"mtp.{spec['stages'] - 1}."
    for gname, t in (("hc_head_fn.weight", sc.hc_head.hc_fn), ("hc_head_base.weight", sc.hc_head.hc_base),
                     ("hc_head_scale.weight", sc.hc_head.hc_scale), ("norm.weight", sc.norm.weight),
                     ("markov_head.markov_w1.weight", sc.markov_w1), ("markov_head.markov_w2.weight", sc.markov_w2),
                     ("confidence_head.proj.weight", sc.confidence.weight)):
        w.add_tensor(last + gname, f(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build(name, root):
    from transformers import DeepseekV4ForCausalLM
    spec = SPECS[name]
    d = os.path.join(root, name)
    model = DeepseekV4ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor([json.load(open(os.path.join(d, "tokens")))])
    torch.manual_seed(spec["seed"])
    sc = Sidecar(model.config, spec).float().eval()
    randomise(sc, model.config, torch.Generator().manual_seed(spec["seed"]))
    feats = features(model, ids, spec["targets"])
    out = os.path.join(d, "dspark-sidecar")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    write_gguf(os.path.join(out, "dspark.gguf"), sc, spec, f"dspark-sidecar-oracle-{name}")
    feats.numpy().astype("<f4").tofile(os.path.join(out, "features"))
    gap = float("inf")
    with open(os.path.join(out, "blocks"), "wb") as fo:
        for n in spec["anchors"]:
            toks, conf, logits = block(model, sc, feats, ids, n)
            top2 = torch.topk(logits, 2, dim=-1).values
            gap = min(gap, (top2[:, 0] - top2[:, 1]).min().item())
            fo.write(np.array([n] + toks, dtype="<i4").tobytes())
            fo.write(conf.tobytes())
            fo.write(logits.numpy().astype("<f4").tobytes())
            print(f"[{name}] anchor {n}: drafts {toks} confidence {[round(float(c), 3) for c in conf]}")
    print(f"[{name}] T={ids.shape[1]} window={model.config.sliding_window} smallest top-2 gap {gap:.3g} -> {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "ds4tiny"))
    ap.add_argument("names", nargs="*", default=sorted(SPECS))
    a = ap.parse_args()
    torch.set_num_threads(1)
    for n in a.names:
        build(n, os.path.normpath(a.root))


if __name__ == "__main__":
    main()
