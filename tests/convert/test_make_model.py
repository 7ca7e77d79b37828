#!/usr/bin/env python3
"""ds4-make-model, read back with gguf-py: the demo preset with overrides has
exactly the sheet's tensor inventory for its metadata, the q2 mix types,
finite values of the intended scale, the overrides applied; with the default
vocabulary it carries the DeepSeek tokenizer (129280 ids, the seven chat
protocol tokens), checked with ds4-vocab."""
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as QT
from gguf.quants import dequantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds4_sheet  # noqa: E402
from harness import check, finish  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MAKE = os.path.join(ROOT, "ds4-make-model")


def run(*args):
    r = subprocess.run([MAKE, *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        print(r.stderr)
        raise SystemExit("ds4-make-model failed")


def cfg_from_metadata(r):
    m = {k: f.contents() for k, f in r.fields.items() if k.startswith("deepseek4.")}
    g = lambda k: m["deepseek4." + k]  # noqa: E731
    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention"}
    ratios = g("attention.compress_ratios")
    return {
        "hidden_size": g("embedding_length"), "vocab_size": g("vocab_size"),
        "num_attention_heads": g("attention.head_count"), "head_dim": g("attention.key_length"),
        "hc_mult": g("hyper_connection.count"), "n_routed_experts": g("expert_count"),
        "moe_intermediate_size": g("expert_feed_forward_length"), "num_experts_per_tok": g("expert_used_count"),
        "q_lora_rank": g("attention.q_lora_rank"), "o_groups": g("attention.output_group_count"),
        "o_lora_rank": g("attention.output_lora_rank"), "index_n_heads": g("attention.indexer.head_count"),
        "index_head_dim": g("attention.indexer.key_length"),
        "layer_types": [kinds.get(x, f"hca{x}") for x in ratios],
        "compress_rates": {"compressed_sparse_attention": 4, **{f"hca{x}": x for x in ratios if x not in kinds}},
        "mlp_layer_types": ["hash_moe"] * g("hash_layer_count") + ["moe"] * (len(ratios) - g("hash_layer_count")),
    }, m


def main():
    q2 = dict(F32=QT.F32, I32=QT.I32, F16=QT.F16, Q8=QT.Q8_0, EXP_GU=QT.IQ2_XXS, EXP_D=QT.Q2_K)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "m.gguf")
        run("-o", out, "--preset", "demo", "--no-vocab", "--layers", "5", "--expert_count", "4",
            "--attention.indexer.top_k", "3", "--swiglu_clamp_exp", "7.5", "--seed", "3")
        r = GGUFReader(out)
        cfg, m = cfg_from_metadata(r)
        check(m["deepseek4.expert_count"] == 4 and m["deepseek4.attention.indexer.top_k"] == 3, "overrides")
        check(m["deepseek4.attention.compress_ratios"] == [0, 0, 4, 128, 4], "schedule for 5 layers")
        check(m["deepseek4.hash_layer_count"] == 3, "hash layers")
        check(m["deepseek4.swiglu_clamp_exp"] == [7.5] * 5, "per-layer override broadcast")
        check("tokenizer.ggml.tokens" not in r.fields, "--no-vocab")
        got = {t.name: t for t in r.tensors}
        want = ds4_sheet.tensors(cfg)
        check(sorted(got) == sorted(n for n, *_ in want), "inventory differs from the sheet")
        for name, ne, fam, _ in want:
            t = got.get(name)
            if t is None:
                continue
            check([int(x) for x in t.shape] == ne, f"{name}: shape {list(t.shape)} != {ne}")
            check(t.tensor_type == q2[fam], f"{name}: type {t.tensor_type.name} != {q2[fam].name}")
            if fam == "I32":
                ids = np.asarray(t.data).reshape(-1, ne[0])
                check(ids.min() >= 0 and ids.max() < cfg["n_routed_experts"] and
                      all(len(set(row)) == ne[0] for row in ids), f"{name}: invalid expert ids")
                continue
            raw = np.asarray(t.data)
            v = raw if t.tensor_type in (QT.F32, QT.F16) else dequantize(raw, t.tensor_type)
            v = v.astype(np.float64).ravel()
            check(np.all(np.isfinite(v)), f"{name}: non-finite values")
            if name.endswith("norm.weight"):
                check(v.min() >= 0.8 and v.max() <= 1.2, f"{name}: norm weights outside [0.8, 1.2]")
            elif fam in ("Q8", "EXP_GU", "EXP_D"):
                want_std = 1 / np.sqrt(ne[0]) * (2 if name == "output.weight" else 1)
                std = v.std()
                check(want_std / 3 < std < want_std * 3 and abs(v.mean()) < std / 4,
                      f"{name}: std {std:.3g} mean {v.mean():.3g}, intended std {want_std:.3g}")

        # The tokenizer part is checked with the engine's own loader (ds4-vocab):
        # it refuses a vocabulary that lacks any of the seven chat-protocol
        # tokens, and gguf-py needs ~15 s CPU to parse 129280 tokens + merges.
        out = os.path.join(tmp, "demo.gguf")
        run("-o", out, "--preset", "demo", "--layers", "2")
        info = subprocess.run([os.path.join(ROOT, "ds4-vocab"), out, "--info"], capture_output=True, text=True)
        check(info.returncode == 0, f"demo tokenizer does not load: {info.stderr.strip()}")
        lines = dict(line.split(None, 1) for line in info.stdout.splitlines() if " " in line)
        check(lines.get("n_vocab", "").strip() == "129280", f"demo n_vocab {lines.get('n_vocab')}")
    finish("test_make_model")


if __name__ == "__main__":
    main()
