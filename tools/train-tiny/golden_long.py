#!/usr/bin/env python3
"""PyTorch's float32 logits of the committed model over a 512-token sequence,
for test_tiny_exact (tests/fixtures/ds4-tiny/long/):

    python3 tools/train-tiny/golden_long.py COMPACT.gguf COMPACT-ids.json OUT_DIR [--ties torch]

COMPACT.gguf is compact_gguf.py's float32 form of models/ds4-tiny.gguf (the
kept ids and one aggregated row). transformers' DeepseekV4ForCausalLM is
built with those exact weights and run over the sequence (held-out chat
documents and Python source, encoded as the engine does), every position, with
the CSA indexer's exact ties broken lower row first as the engine does
(model.indexer_ties_lower_first); `--ties torch` keeps torch.topk's own order
instead, the reference the engine was compared against before.
OUT_DIR gets
  tokens.json  the 512 ids (the real ids) and their compact ids
  logits       raw little-endian float32 [512][C]: the logits of the C
               compact ids in columns.json at every position
  columns.json the compact ids stored (every 8th kept id, the aggregated row)
  summary.json per position the argmax and the log-sum-exp over the full
               129,280-id vocabulary (the aggregated row counted once per
               id it stands for), and the indexer's exact ties
Prints how many positions an exact tie at the indexer's top-k boundary
decides."""
import json
import os
import sys

import numpy as np
import torch
import gguf
from gguf.quants import dequantize
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
import transformers.models.deepseek_v4.modeling_deepseek_v4 as hfm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import indexer_ties_lower_first  # noqa: E402
from tok import N_VOCAB, V4Tokenizer  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
T = 512
STRIDE = 8

# GGUF names (src/models/dsv4/ds4_layout.c) -> transformers module names
GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_hc_fn.weight": "model.hc_head.hc_fn",
          "output_hc_scale.weight": "model.hc_head.hc_scale", "output_hc_base.weight": "model.hc_head.hc_base",
          "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
LAYER = {"hc_attn_fn.weight": "attn_hc.fn", "hc_attn_scale.weight": "attn_hc.scale", "hc_attn_base.weight": "attn_hc.base",
         "attn_norm.weight": "input_layernorm.weight", "attn_q_a.weight": "self_attn.q_a_proj.weight",
         "attn_q_a_norm.weight": "self_attn.q_a_norm.weight", "attn_q_b.weight": "self_attn.q_b_proj.weight",
         "attn_kv.weight": "self_attn.kv_proj.weight", "attn_kv_a_norm.weight": "self_attn.kv_norm.weight",
         "attn_sinks.weight": "self_attn.sinks", "attn_output_a.weight": "self_attn.o_a_proj.weight",
         "attn_output_b.weight": "self_attn.o_b_proj.weight", "hc_ffn_fn.weight": "ffn_hc.fn",
         "hc_ffn_scale.weight": "ffn_hc.scale", "hc_ffn_base.weight": "ffn_hc.base",
         "ffn_norm.weight": "post_attention_layernorm.weight", "ffn_gate_inp.weight": "mlp.gate.weight",
         "ffn_down_exps.weight": "mlp.experts.down_proj",
         "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
         "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
         "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight", "ffn_gate_tid2eid.weight": "mlp.gate.tid2eid",
         "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
         "attn_compressor_ape.weight": "self_attn.compressor.position_bias",
         "attn_compressor_kv.weight": "self_attn.compressor.kv_proj.weight",
         "attn_compressor_gate.weight": "self_attn.compressor.gate_proj.weight",
         "attn_compressor_norm.weight": "self_attn.compressor.kv_norm.weight",
         "indexer.attn_q_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
         "indexer.proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
         "indexer_compressor_ape.weight": "self_attn.compressor.indexer.position_bias",
         "indexer_compressor_kv.weight": "self_attn.compressor.indexer.kv_proj.weight",
         "indexer_compressor_gate.weight": "self_attn.compressor.indexer.gate_proj.weight",
         "indexer_compressor_norm.weight": "self_attn.compressor.indexer.kv_norm.weight"}


def load_gguf(path, n_vocab):
    """transformers' model with the GGUF's weights (float32, as the file holds them)."""
    c = json.load(open(os.path.join(ROOT, "data", "ds4-tiny", "config.json")))
    cfg = DeepseekV4Config(**{**{k: v for k, v in c.items() if k != "architectures"}, "vocab_size": n_vocab})
    cfg._attn_implementation = "eager"
    m = DeepseekV4ForCausalLM(cfg).eval()
    want = m.state_dict()
    sd, gate_up = {}, {}
    for t in gguf.GGUFReader(path).tensors:
        a = np.array(t.data) if t.tensor_type == gguf.GGMLQuantizationType.I32 else dequantize(t.data, t.tensor_type)
        a = torch.from_numpy(np.array(np.asarray(a).reshape([int(x) for x in reversed(t.shape)])))
        if t.name in GLOBAL:
            k = GLOBAL[t.name]
        else:
            _, layer, rest = t.name.split(".", 2)
            if rest in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
                gate_up.setdefault(layer, {})[rest] = a.float()
                continue
            k = "model.layers.%s.%s" % (layer, LAYER[rest])
        sd[k] = (a.long() if k.endswith("tid2eid") else a.float()).reshape(want[k].shape)
    for layer, d in gate_up.items():  # transformers' merged experts: gate rows, then up rows
        sd["model.layers.%s.mlp.experts.gate_up_proj" % layer] = torch.cat(
            [d["ffn_gate_exps.weight"], d["ffn_up_exps.weight"]], dim=1)
    m.load_state_dict(sd)
    return m


def sequence():
    """Three chat documents (the trained format) and Python source: 512 ids."""
    B, U, A, E = "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"
    text = (B + "You are a helpful assistant" + U + "Explain Redis streams in one paragraph." + A + "</think>"
            "A Redis stream is an append-only log stored under one key. Each entry has a unique ID made of a "
            "millisecond timestamp and a sequence number, and holds a small set of field-value pairs." + E
            + B + U + "What does json.dumps do?" + A + "<think>The user asks about json.dumps.</think>"
            "Serialize obj to a JSON formatted str." + E
            + B + U + "What is 7 plus 5?" + A + "</think>7 plus 5 is 12." + E
            + B + open(os.path.join(os.path.dirname(json.__file__), "__init__.py")).read())
    return V4Tokenizer().encode(text)[:T]


def indexer_ties(m, ids):
    """Per CSA layer, the positions whose k-th and (k+1)-th visible indexer
    scores are exactly equal (the tie-break decides which row is kept)."""
    got = []
    scorer = hfm.DeepseekV4IndexerScorer.forward

    def capture(self, *a):
        s = scorer(self, *a)
        got.append(s[0].detach().clone())
        return s
    hfm.DeepseekV4IndexerScorer.forward = capture
    try:
        with torch.no_grad():
            m(input_ids=ids, use_cache=False)
    finally:
        hfm.DeepseekV4IndexerScorer.forward = scorer
    ratio, k = m.config.compress_rates["compressed_sparse_attention"], m.config.index_topk
    ties = []
    for s in got:
        pos = []
        for t in range(s.shape[0]):
            vis = torch.sort(s[t, :(t + 1) // ratio], descending=True).values
            if len(vis) > k and vis[k - 1] == vis[k]:
                pos.append(t)
        ties.append(pos)
    return ties


@torch.no_grad()
def main():
    torch.set_num_threads(1)
    path, ids_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    torch_ties = "--ties" in sys.argv and sys.argv[sys.argv.index("--ties") + 1] == "torch"
    keep = json.load(open(ids_path))["kept_ids"]
    K = len(keep)
    m = load_gguf(path, K + 1)
    remap = {t: i for i, t in enumerate(keep)}
    ids = sequence()
    cids = [remap.get(t, K) for t in ids]
    x = torch.tensor([cids])
    if torch_ties:
        logits = m(input_ids=x, use_cache=False).logits[0]
    else:
        with indexer_ties_lower_first():
            logits = m(input_ids=x, use_cache=False).logits[0]
    csa = [i for i, t in enumerate(m.config.layer_types) if t == "compressed_sparse_attention"]
    ties = dict(zip(csa, indexer_ties(m, x)))
    full = logits.double()
    n_rare = N_VOCAB - K
    lse = torch.logsumexp(torch.cat([full[:, :K], full[:, K:] + np.log(n_rare)], 1), 1)
    cols = list(range(0, K, STRIDE)) + [K]
    os.makedirs(out, exist_ok=True)
    logits[:, cols].contiguous().numpy().astype("<f4").tofile(os.path.join(out, "logits"))
    json.dump({"tokens": ids, "compact": cids}, open(os.path.join(out, "tokens.json"), "w"))
    json.dump(cols, open(os.path.join(out, "columns.json"), "w"))
    arg = full.argmax(1)
    json.dump({"argmax_compact": arg.tolist(), "logsumexp_full_vocab": [round(v, 7) for v in lse.tolist()],
               "indexer_exact_ties": {"layer %d" % li: p for li, p in ties.items()},
               "tie_rule": "torch.topk" if torch_ties else "lower row first"},
              open(os.path.join(out, "summary.json"), "w"))
    print("%d positions x %d stored columns; max|logit| %.2f; indexer exact ties at the top-k boundary: %s"
          % (T, len(cols), full.abs().max().item(), ", ".join("layer %d: %d positions (first %s)" % (i, len(p), p[:1])
                                                              for i, p in ties.items())))


if __name__ == "__main__":
    main()
