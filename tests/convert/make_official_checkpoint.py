#!/usr/bin/env python3
"""Writes a tiny random checkpoint in the *official* DeepSeek V4 naming and
encodings (fact sheet 4.5), with numpy only:

* dense attention / shared-expert / head matrices: FP8 E4M3 codes plus a
  "<name>.scale" UE8M0 tensor, one exponent per 128x128 block (partial blocks
  at the edges included);
* routed experts "layers.N.ffn.experts.E.w{1,2,3}.weight": FP4 E2M1 codes
  packed two per byte (low nibble = even element) in I8 (w1), U8 (w2) or
  the F4 dtype (w3, torch's float4_e2m1fn_x2), plus a UE8M0 scale per 32
  consecutive inputs (F8_E8M0, or raw U8 exponents for w2);
* embedding, compressor and indexer projections BF16; norms, HC, sinks, ape,
  router bias F32; tid2eid int64;
* legacy config.json spellings (compress_ratios with the trailing MTP entry,
  num_hash_layers, qk_rope_head_dim, rope_scaling);
* two shards plus model.safetensors.index.json.

    python3 make_official_checkpoint.py OUT_DIR [SEED]

make() returns the config in the normalised form tests/convert/ds4_sheet.py
reads (layer_types, mlp_layer_types, rope_parameters.compress, ...).
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_np  # noqa: E402

RATIOS = [0, 4, 128, 4]
N_HASH = 2


def make(out_dir, seed=0):
    rng = np.random.default_rng(seed)
    E, V, H, D, R = 256, 512, 4, 128, 64
    Rq, G, Ro, X, k, Fe, hc, HI, DI = 64, 2, 64, 4, 2, 256, 4, 4, 128
    n = len(RATIOS)
    mix = (2 + hc) * hc
    t = {}

    def f32(shape, lo=-1.0, hi=1.0):
        return ("F32", rng.uniform(lo, hi, shape).astype(np.float32))

    def bf16(shape):
        v = rng.normal(0, 0.05, shape).astype(np.float32)
        return ("BF16", (v.view(np.uint32) >> 16).astype(np.uint16))

    def fp8(name, rows, cols):
        codes = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
        codes[(codes & 0x7F) == 0x7F] = 0x3C           # no NaN codes
        t[name] = ("F8_E4M3", codes)
        sb = (-(-rows // 128), -(-cols // 128))
        t[name[:-len(".weight")] + ".scale"] = ("F8_E8M0", rng.integers(120, 131, sb, dtype=np.uint8))

    def fp4(name, rows, cols, dtype):
        packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
        t[name] = (dtype, packed.view(np.int8) if dtype == "I8" else packed)   # F4: shape counts values
        # w2 scales as raw U8 exponents (transformers' MXFP convention), others F8_E8M0
        t[name[:-len(".weight")] + ".scale"] = ("U8" if dtype == "U8" else "F8_E8M0",
                                                rng.integers(118, 129, (rows, cols // 32), dtype=np.uint8))

    t["embed.weight"] = bf16((V, E))
    fp8("head.weight", V, E)
    t["norm.weight"] = f32((E,), 0.8, 1.2)
    t["hc_head_fn"] = f32((hc, hc * E), -0.05, 0.05)
    t["hc_head_base"] = f32((hc,))
    t["hc_head_scale"] = f32((1,), 0.5, 2)
    for l, r in enumerate(RATIOS):
        p = f"layers.{l}."
        for s in ("attn", "ffn"):
            t[p + f"hc_{s}_fn"] = f32((mix, hc * E), -0.05, 0.05)
            t[p + f"hc_{s}_base"] = f32((mix,))
            t[p + f"hc_{s}_scale"] = f32((3,), 0.5, 2)
        t[p + "attn_norm.weight"] = f32((E,), 0.8, 1.2)
        t[p + "ffn_norm.weight"] = f32((E,), 0.8, 1.2)
        fp8(p + "attn.wq_a.weight", Rq, E)
        t[p + "attn.q_norm.weight"] = f32((Rq,), 0.8, 1.2)
        fp8(p + "attn.wq_b.weight", H * D, Rq)
        fp8(p + "attn.wkv.weight", D, E)
        t[p + "attn.kv_norm.weight"] = f32((D,), 0.8, 1.2)
        t[p + "attn.attn_sink"] = f32((H,))
        fp8(p + "attn.wo_a.weight", G * Ro, H * D // G)
        fp8(p + "attn.wo_b.weight", E, G * Ro)
        t[p + "ffn.gate.weight"] = bf16((X, E))
        for e in range(X):
            fp4(p + f"ffn.experts.{e}.w1.weight", Fe, E, "I8")
            fp4(p + f"ffn.experts.{e}.w3.weight", Fe, E, "F4")
            fp4(p + f"ffn.experts.{e}.w2.weight", E, Fe, "U8")
        fp8(p + "ffn.shared_experts.w1.weight", Fe, E)
        fp8(p + "ffn.shared_experts.w3.weight", Fe, E)
        fp8(p + "ffn.shared_experts.w2.weight", E, Fe)
        if l < N_HASH:
            t[p + "ffn.gate.tid2eid"] = ("I64", np.stack([rng.permutation(X)[:k] for _ in range(V)]).astype(np.int64))
        else:
            t[p + "ffn.gate.bias"] = f32((X,), -0.1, 0.1)
        if r:
            coff = 2 if r == 4 else 1
            t[p + "attn.compressor.ape"] = f32((r, coff * D))
            t[p + "attn.compressor.wkv.weight"] = bf16((coff * D, E))
            t[p + "attn.compressor.wgate.weight"] = bf16((coff * D, E))
            t[p + "attn.compressor.norm.weight"] = f32((D,), 0.8, 1.2)
        if r == 4:
            t[p + "attn.indexer.wq_b.weight"] = bf16((HI * DI, Rq))
            t[p + "attn.indexer.weights_proj.weight"] = bf16((HI, E))
            t[p + "attn.indexer.compressor.ape"] = f32((r, 2 * DI))
            t[p + "attn.indexer.compressor.wkv.weight"] = bf16((2 * DI, E))
            t[p + "attn.indexer.compressor.wgate.weight"] = bf16((2 * DI, E))
            t[p + "attn.indexer.compressor.norm.weight"] = f32((DI,), 0.8, 1.2)

    os.makedirs(out_dir, exist_ok=True)
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[0::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fname, members in shards.items():
        st_np.write(os.path.join(out_dir, fname), {m: t[m] for m in members})
        weight_map.update({m: fname for m in members})
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)

    yarn = {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
            "beta_fast": 32.0, "beta_slow": 1.0}
    legacy = {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "vocab_size": V, "hidden_size": E, "num_hidden_layers": n, "num_attention_heads": H,
        "num_key_value_heads": 1, "head_dim": D, "qk_rope_head_dim": R, "q_lora_rank": Rq,
        "o_groups": G, "o_lora_rank": Ro, "n_routed_experts": X, "num_experts_per_tok": k,
        "n_shared_experts": 1, "moe_intermediate_size": Fe, "scoring_func": "sqrtsoftplus",
        "norm_topk_prob": True, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
        "sliding_window": 128, "index_n_heads": HI, "index_head_dim": DI, "index_topk": 512,
        "hc_mult": hc, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "compress_rope_theta": 160000.0, "max_position_embeddings": 1048576,
        "rope_scaling": yarn, "compress_ratios": RATIOS + [0], "num_hash_layers": N_HASH,
        "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(legacy, f, indent=1)

    kind = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    norm = dict(legacy)
    norm["layer_types"] = [kind[r] for r in RATIOS]
    norm["compress_rates"] = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    norm["mlp_layer_types"] = ["hash_moe"] * N_HASH + ["moe"] * (n - N_HASH)
    norm["partial_rotary_factor"] = R / D
    norm["rope_parameters"] = {"compress": yarn}
    return norm


if __name__ == "__main__":
    make(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
