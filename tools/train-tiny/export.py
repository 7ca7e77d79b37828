#!/usr/bin/env python3
"""Exports a training checkpoint (train.py's ckpt.pt) as a transformers
DeepSeek V4 checkpoint over the full 129,280-id vocabulary, and checks it.

    python3 tools/train-tiny/export.py CKPT OUT_DIR [EVAL_TEXT]

OUT_DIR gets config.json + model.safetensors (BF16, transformers' save naming,
what ds4-convert reads) with the MTP block added under the official names
mtp.0.* (ignored by transformers' loader). Every weight is rounded to BF16
first; the checks below run on the rounded model in float32:
  1. transformers' DeepseekV4ForCausalLM, loaded from OUT_DIR, gives the same
     logits as train.py's model (its compact rows expanded: a rare id's logit
     is the shared aggregated row's logit), and the same full-vocabulary
     log-softmax as the compact softmax with the log(N_rare) term;
  2. the MTP block reloaded from the file gives the trained MTP's logits.
Also writes OUT_DIR/golden.json: a fixed chat prompt's token ids, and per
position the float32 logits of the kept ids + the aggregated logit (the
engine's logits of every other id must equal it); with EVAL_TEXT (a rendered
document) also golden-eval.json, the same for its first 512 tokens."""
import json
import os
import shutil
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

sys.path.insert(0, os.path.dirname(__file__))
from model import MTP, TinyV4, indexer_ties_lower_first  # noqa: E402
from tok import N_VOCAB, V4Tokenizer  # noqa: E402

GOLDEN_PROMPT = ("<｜begin▁of▁sentence｜>You are a helpful assistant<｜User｜>What does json.dumps do?"
                 "<｜Assistant｜></think>")


def compact_model(ck):
    cfg = DeepseekV4Config(**{k: v for k, v in ck["config"].items() if k not in ("architectures",)})
    cfg._attn_implementation = "eager"
    m = TinyV4(cfg, ck["n_rare"])
    m.load_state_dict(ck["model"])
    with torch.no_grad():
        for p in list(m.parameters()) + [b for n, b in m.named_buffers() if "inv_freq" not in n and "agg_bias" not in n]:
            if p.is_floating_point():
                p.copy_(p.to(torch.bfloat16).float())
    return m.eval()


def full_state(m, remap):
    """transformers module names -> tensors over the full vocabulary."""
    sd = {}
    for k, v in m.state_dict().items():
        if k.startswith("mtp.") or k == "agg_bias":
            continue
        if k == "model.embed_tokens.weight" or k == "lm_head.weight" or k.endswith("gate.tid2eid"):
            v = v[remap]
        sd[k] = v
    return sd


def mtp_tensors(m, cfg_full, tmp):
    """The MTP block under the official names: its decoder layer named as
    transformers saves layer 0 of a model, re-prefixed mtp.0."""
    one = DeepseekV4Config(**{**cfg_full.to_dict(), "num_hidden_layers": 1, "layer_types": ["sliding_attention"],
                              "mlp_layer_types": ["moe"], "vocab_size": 8})
    lm = DeepseekV4ForCausalLM(one)
    lm.model.layers[0].load_state_dict(m.mtp.block.state_dict())
    lm.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
    saved = load_file(os.path.join(tmp, "model.safetensors"))
    out = {}
    for k, v in saved.items():
        if k.startswith("model.layers.0."):
            out["mtp.0." + k[len("model.layers.0."):]] = v
    t = m.mtp
    out["mtp.0.e_proj.weight"] = t.e_proj.weight
    out["mtp.0.h_proj.weight"] = t.h_proj.weight
    out["mtp.0.enorm.weight"] = t.enorm.weight
    out["mtp.0.hnorm.weight"] = t.hnorm.weight
    out["mtp.0.norm.weight"] = t.norm.weight
    out["mtp.0.hc_head_fn"] = t.hc_head.hc_fn
    out["mtp.0.hc_head_base"] = t.hc_head.hc_base
    out["mtp.0.hc_head_scale"] = t.hc_head.hc_scale
    return {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()).contiguous()
            for k, v in out.items()}, saved


def load_mtp(path, m_cfg, saved_names):
    """A fresh MTP module from the mtp.0.* tensors of the exported file."""
    st = load_file(path)
    mt = MTP(m_cfg)
    lm_names = {"mtp.0." + k[len("model.layers.0."):]: k for k in saved_names if k.startswith("model.layers.0.")}
    one = DeepseekV4Config(**{**m_cfg.to_dict(), "num_hidden_layers": 1, "layer_types": ["sliding_attention"],
                              "mlp_layer_types": ["moe"], "vocab_size": 8})
    tmp = tempfile.mkdtemp()
    try:
        layer = {lm_names[k]: v for k, v in st.items() if k in lm_names}
        # through transformers' own loader, so its renaming is exercised both ways
        DeepseekV4ForCausalLM(one).to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        base = load_file(os.path.join(tmp, "model.safetensors"))
        assert set(layer) <= set(base)
        base.update(layer)
        save_file(base, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        lm2 = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.float32)
        mt.block.load_state_dict(lm2.model.layers[0].state_dict())
    finally:
        shutil.rmtree(tmp)
    with torch.no_grad():
        mt.e_proj.weight.copy_(st["mtp.0.e_proj.weight"].float())
        mt.h_proj.weight.copy_(st["mtp.0.h_proj.weight"].float())
        mt.enorm.weight.copy_(st["mtp.0.enorm.weight"].float())
        mt.hnorm.weight.copy_(st["mtp.0.hnorm.weight"].float())
        mt.norm.weight.copy_(st["mtp.0.norm.weight"].float())
        mt.hc_head.hc_fn.copy_(st["mtp.0.hc_head_fn"].float())
        mt.hc_head.hc_base.copy_(st["mtp.0.hc_head_base"].float())
        mt.hc_head.hc_scale.copy_(st["mtp.0.hc_head_scale"].float())
    return mt


@torch.no_grad()
def main():
    ck_path, out = sys.argv[1], sys.argv[2]
    eval_text = sys.argv[3] if len(sys.argv) > 3 else None
    torch.set_num_threads(1)
    ck = torch.load(ck_path, weights_only=False)
    keep = ck["keep"]
    K = len(keep)
    remap = torch.full((N_VOCAB,), K, dtype=torch.long)
    remap[torch.tensor(keep)] = torch.arange(K)
    m = compact_model(ck)
    cfg_full = DeepseekV4Config(**{**{k: v for k, v in ck["config"].items() if k != "architectures"},
                                   "vocab_size": N_VOCAB})
    cfg_full._attn_implementation = "eager"
    hf = DeepseekV4ForCausalLM(cfg_full).eval()
    missing, unexpected = hf.load_state_dict(full_state(m, remap), strict=False)
    missing = [k for k in missing if "inv_freq" not in k]
    assert not missing and not unexpected, (missing, unexpected)
    shutil.rmtree(out, ignore_errors=True)
    hf.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tmp = tempfile.mkdtemp()
    try:
        mtp, saved_layer = mtp_tensors(m, cfg_full, tmp)
    finally:
        shutil.rmtree(tmp)
    path = os.path.join(out, "model.safetensors")
    st = load_file(path)
    st.update(mtp)
    save_file(st, path, metadata={"format": "pt"})
    for f in os.listdir(out):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(out, f))

    # 1. transformers' forward on the saved file == the training model
    ids = torch.tensor([V4Tokenizer().encode(GOLDEN_PROMPT)])
    ref = DeepseekV4ForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    with indexer_ties_lower_first():  # the engine's tie rule, so golden-eval.json is exact past the ties
        full = ref(input_ids=ids, use_cache=False).logits[0]
    comp, comp_mtp = m(remap[ids])
    comp, comp_mtp = comp[0], comp_mtp[0]
    raw = comp - m.agg_bias                      # the head's own logits
    d_keep = (full[:, keep] - raw[:, :K]).abs().max().item()
    rare = torch.ones(N_VOCAB, dtype=torch.bool)
    rare[keep] = False
    d_rare = (full[:, rare] - raw[:, K:K + 1]).abs().max().item()
    lsm_full = torch.log_softmax(full.double(), -1)  # float64: the 129k-term sum in f32 rounds at ~1e-4
    lsm_comp = torch.log_softmax(comp.double(), -1)
    d_lsm = max((lsm_full[:, keep] - lsm_comp[:, :K]).abs().max().item(),
                (lsm_full[:, rare] - (lsm_comp[:, K:K + 1] - torch.log(torch.tensor(float(rare.sum()))))).abs().max().item())
    print("transformers vs training model, %d positions: max|diff| kept %.3g, rare %.3g, log-softmax %.3g, "
          "max|logit| %.2f" % (ids.shape[1], d_keep, d_rare, d_lsm, full.abs().max().item()))
    assert d_keep < 1e-5 and d_rare < 1e-5 and d_lsm < 1e-5

    # 2. MTP reloaded from the file
    mt = load_mtp(path, cfg_full, saved_layer).eval()
    m.mtp = mt
    _, mtp2 = m(remap[ids])
    d_mtp = (mtp2[0] - comp_mtp).abs().max().item()
    print("MTP reloaded from mtp.0.*: max|diff| %.3g (%d tensors)" % (d_mtp, len(mtp)))
    assert d_mtp < 1e-4

    golden = {"prompt": GOLDEN_PROMPT, "tokens": ids[0].tolist(), "kept_ids": keep,
              "logits_kept": [[round(x, 6) for x in row] for row in full[:, keep].tolist()],
              "logit_rare": [round(x, 6) for x in raw[:, K].tolist()]}
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f)
    if eval_text:
        # a longer held-out sequence for measurements (quantization cost): same format
        eids = torch.tensor([V4Tokenizer().encode(open(eval_text).read())[:512]])
        with indexer_ties_lower_first():
            ef = ref(input_ids=eids, use_cache=False).logits[0]
            er = (m(remap[eids], with_mtp=False)[0][0] - m.agg_bias)[:, K]
        with open(os.path.join(out, "golden-eval.json"), "w") as f:
            json.dump({"tokens": eids[0].tolist(), "kept_ids": keep, "logits_kept": ef[:, keep].tolist(),
                       "logit_rare": er.tolist()}, f)
    print("wrote", out, "(%.1f MB)" % (os.path.getsize(path) / 1e6))


if __name__ == "__main__":
    main()
