#!/usr/bin/env python3
"""Rebuilds a training checkpoint (train.py's ckpt.pt format) from the
committed model files, so fine-tuning can start from the committed weights
without the original training run's checkpoint (docs/tiny-model.md):

    python3 tools/train-tiny/from_gguf.py models/ds4-tiny.gguf data/ds4-tiny/mtp.safetensors \
        data/ds4-tiny/config.json OUT/ckpt.pt

The GGUF's tensors are dequantized to float32 and renamed to the official
checkpoint names (ds4-convert's src_names, reversed), loaded through
transformers' own DeepseekV4ForCausalLM.from_pretrained (so its renaming is
the one export.py's save relied on), then cut to the compact vocabulary of
model.TinyV4: the kept ids are those whose output row differs from the
aggregated row (compact_gguf.kept_ids), in ascending order as train.py keeps
them, and the aggregated row (embedding, head, hash-routing row) is the row
every other id shares. The MTP block comes from mtp.safetensors (BF16, the
exact trained values). The checkpoint has no optimizer state: train.py
--init starts a fresh optimizer from it. Then compares the rebuilt model's
logits on export.GOLDEN_PROMPT with the engine's (--ds4) on the same GGUF."""
import json
import os
import re
import shutil
import sys
import tempfile

import gguf
import numpy as np
import torch
from gguf.quants import dequantize
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from compact_gguf import kept_ids  # noqa: E402
from export import GOLDEN_PROMPT, load_mtp  # noqa: E402
from model import TinyV4, indexer_ties_lower_first  # noqa: E402
from tok import N_VOCAB, V4Tokenizer  # noqa: E402

# official name (after "layers.N." / the global prefix) -> GGUF name; from
# tools/ds4-convert.c's src_names and src/models/dsv4/ds4_layout.c
# (transformers' save keeps its own names for the globals)
GLOBAL = {"embed_tokens.weight": "token_embd.weight", "hc_head.hc_fn": "output_hc_fn.weight",
          "hc_head.hc_scale": "output_hc_scale.weight", "hc_head.hc_base": "output_hc_base.weight",
          "norm.weight": "output_norm.weight", "head.weight": "output.weight"}
LAYER = {"hc_attn_fn": "hc_attn_fn", "hc_attn_scale": "hc_attn_scale", "hc_attn_base": "hc_attn_base",
         "attn_norm.weight": "attn_norm", "attn.wq_a.weight": "attn_q_a", "attn.q_norm.weight": "attn_q_a_norm",
         "attn.wq_b.weight": "attn_q_b", "attn.wkv.weight": "attn_kv", "attn.kv_norm.weight": "attn_kv_a_norm",
         "attn.norm.weight": "attn_kv_a_norm", "attn.attn_sink": "attn_sinks", "attn.wo_a.weight": "attn_output_a",
         "attn.wo_b.weight": "attn_output_b", "hc_ffn_fn": "hc_ffn_fn", "hc_ffn_scale": "hc_ffn_scale",
         "hc_ffn_base": "hc_ffn_base", "ffn_norm.weight": "ffn_norm", "ffn.gate.weight": "ffn_gate_inp",
         "ffn.shared_experts.w1.weight": "ffn_gate_shexp", "ffn.shared_experts.w3.weight": "ffn_up_shexp",
         "ffn.shared_experts.w2.weight": "ffn_down_shexp", "ffn.gate.tid2eid": "ffn_gate_tid2eid",
         "ffn.gate.bias": "exp_probs_b", "attn.compressor.ape": "attn_compressor_ape",
         "attn.compressor.wkv.weight": "attn_compressor_kv", "attn.compressor.wgate.weight": "attn_compressor_gate",
         "attn.compressor.norm.weight": "attn_compressor_norm", "attn.indexer.wq_b.weight": "indexer.attn_q_b",
         "attn.indexer.weights_proj.weight": "indexer.proj", "attn.indexer.compressor.ape": "indexer_compressor_ape",
         "attn.indexer.compressor.wkv.weight": "indexer_compressor_kv",
         "attn.indexer.compressor.wgate.weight": "indexer_compressor_gate",
         "attn.indexer.compressor.norm.weight": "indexer_compressor_norm"}
EXPERT = {"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}


def gguf_name(saved):
    """The GGUF tensor (and expert index, or None) holding a saved tensor."""
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.*)", saved)
    if not m:
        key = saved[len("model."):] if saved.startswith("model.") else saved
        return GLOBAL[key], None
    layer, rest = m.group(1), m.group(2)
    e = re.fullmatch(r"ffn\.experts\.(\d+)\.(w[123])\.weight", rest)
    if e:
        return "blk.%s.%s.weight" % (layer, EXPERT[e.group(2)]), int(e.group(1))
    g = LAYER[rest]
    return "blk.%s.%s%s" % (layer, g, ".bias" if g == "exp_probs_b" else ".weight"), None


def read_gguf(path):
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            a = np.array(t.data, dtype=np.int64).reshape(shape)
        else:
            a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        out[t.name] = torch.from_numpy(np.ascontiguousarray(a))
    return out


@torch.no_grad()
def main():
    src, mtp_path, cfg_path, out = sys.argv[1:5]
    ds4 = sys.argv[5] if len(sys.argv) > 5 else "./ds4"
    torch.set_num_threads(1)
    g = read_gguf(src)
    cfg_dict = {k: v for k, v in json.load(open(cfg_path)).items() if k != "architectures"}
    cfg_full = DeepseekV4Config(**cfg_dict)
    cfg_full._attn_implementation = "eager"
    tmp = tempfile.mkdtemp()
    try:
        # the names (and shapes) transformers' save gives this architecture
        DeepseekV4ForCausalLM(DeepseekV4Config(**{**cfg_dict, "vocab_size": 8})).save_pretrained(tmp)
        saved = load_file(os.path.join(tmp, "model.safetensors"))
        names = list(saved)
        st = {}
        for k, v in saved.items():
            gname, expert = gguf_name(k)
            t = g[gname] if expert is None else g[gname][expert]
            if k.endswith("tid2eid") or k in ("head.weight", "model.embed_tokens.weight"):
                assert t.shape[1:] == v.shape[1:] and t.shape[0] == N_VOCAB, (k, t.shape, v.shape)
            else:
                assert t.shape == v.shape, (k, gname, t.shape, v.shape)
            st[k] = t.to(v.dtype) if not v.is_floating_point() else t.float()
        save_file(st, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump({**json.load(open(cfg_path)), "dtype": "float32"}, f)
        hf = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").eval()
    finally:
        shutil.rmtree(tmp)
    keep, rare = kept_ids(g["output.weight"].numpy())
    keep = keep.tolist()
    K = len(keep)
    rows = torch.tensor(keep + [int(rare)])
    # every aggregated id must share the embedding and hash-routing rows too
    agg = torch.ones(N_VOCAB, dtype=torch.bool)
    agg[keep] = False
    sd = hf.state_dict()
    for k in ("model.embed_tokens.weight",) + tuple(x for x in sd if x.endswith("tid2eid")):
        assert bool((sd[k][agg] == sd[k][rare]).all()), k
    cfg = DeepseekV4Config(**{**cfg_dict, "vocab_size": K + 1})
    cfg._attn_implementation = "banded"
    m = TinyV4(cfg, N_VOCAB - K)
    comp = {}
    for k, v in sd.items():
        if "inv_freq" in k:
            continue
        comp[k] = v[rows] if k in ("model.embed_tokens.weight", "lm_head.weight") or k.endswith("tid2eid") else v
    missing, unexpected = m.load_state_dict(comp, strict=False)
    assert not unexpected and all(x.startswith("mtp.") or "inv_freq" in x for x in missing), (missing, unexpected)
    m.mtp = load_mtp(mtp_path, cfg_full, names)
    state = m.state_dict()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    torch.save({"model": state, "step": 0, "seen": 0, "keep": keep, "n_rare": N_VOCAB - K,
                "config": cfg.to_dict()}, out)
    print("rebuilt %s: %d kept ids + 1 aggregated row, %.2fM trained parameters"
          % (out, K, sum(p.numel() for p in m.parameters()) / 1e6))

    # the rebuilt model against the engine on the same (dequantized) weights
    ids = V4Tokenizer().encode(GOLDEN_PROMPT)
    remap = torch.full((N_VOCAB,), K, dtype=torch.long)
    remap[torch.tensor(keep)] = torch.arange(K)
    m.cfg._attn_implementation = "eager"
    with indexer_ties_lower_first():
        lo = (m.eval()(remap[torch.tensor([ids])], with_mtp=False)[0][0] - m.agg_bias).double()
    sys.path.insert(0, os.path.dirname(__file__))
    from check_engine import engine_logits
    got = engine_logits(ds4, src, ids, "exact")
    d = max((got[:, keep] - lo[:, :K].numpy()).__abs__().max(), (got[:, agg.numpy()] - lo[:, K:].numpy()).__abs__().max())
    scale = np.abs(lo.numpy()).max()
    same = (got.argmax(1) == np.array(keep + [-1])[lo.argmax(1).numpy()]).mean()
    print("engine vs rebuilt model, %d positions x %d ids: max|diff| %.3g (%.3g of max|logit|), argmax agreement %.0f%%"
          % (len(ids), got.shape[1], d, d / scale, 100 * same))


if __name__ == "__main__":
    main()
