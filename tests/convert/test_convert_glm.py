#!/usr/bin/env python3
"""ds4-convert on a GLM 5.2 (GlmMoeDsaForCausalLM) checkpoint, checked
against numpy: a tiny checkpoint in transformers' module names (per-expert
and merged experts, an MTP block, indexer weights on one shared layer and
missing on another) is converted with --type f32 and read back with gguf-py.
Every GGUF tensor must equal the source it maps to (GLM sheet section 4.3:
kv_b_proj split per head into attn_k_b transposed and attn_v_b, experts
stacked, e_score_correction_bias -> exp_probs_b, model.layers.<n>.* ->
nextn.*); the metadata must carry config.json's values (indexer_types ->
indexer.types, first_k_dense_replace -> leading_dense_block_count); the
engine must load and run the file; f16 / q8_0 / q2 / q4 give the
documented types; bad configs fail with one line. The same tensor check runs
on transformers' own save_pretrained output (tests/fixtures/glmtiny/A)."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as QT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_np  # noqa: E402
from harness import check, finish  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CONVERT = os.path.join(ROOT, "ds4-convert")
DS4 = os.path.join(ROOT, "ds4")

CFG = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
    "hidden_size": 64, "num_hidden_layers": 4, "num_nextn_predict_layers": 1, "vocab_size": 96,
    "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 32,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "intermediate_size": 96,
    "moe_intermediate_size": 32, "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "rope_parameters": {"rope_theta": 8000000.0, "rope_type": "default"},
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "index_topk": 8, "index_n_heads": 4,
    "index_head_dim": 32, "indexer_types": ["full", "shared", "full", "shared"],
}


def checkpoint(rng, merged):
    c = CFG
    E, V, H = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    nope, rot, dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    LQ, LKV, X, Fe, Fd = c["q_lora_rank"], c["kv_lora_rank"], c["n_routed_experts"], c["moe_intermediate_size"], \
        c["intermediate_size"]
    IH, ID = c["index_n_heads"], c["index_head_dim"]
    t = {}

    def w(name, *shape):
        t[name] = rng.standard_normal(shape).astype(np.float32)

    w("model.embed_tokens.weight", V, E)
    w("model.norm.weight", E)
    w("lm_head.weight", V, E)
    for layer in range(c["num_hidden_layers"] + 1):
        p = f"model.layers.{layer}."
        w(p + "input_layernorm.weight", E)
        w(p + "post_attention_layernorm.weight", E)
        w(p + "self_attn.q_a_proj.weight", LQ, E)
        w(p + "self_attn.q_a_layernorm.weight", LQ)
        w(p + "self_attn.q_b_proj.weight", H * (nope + rot), LQ)
        w(p + "self_attn.kv_a_proj_with_mqa.weight", LKV + rot, E)
        w(p + "self_attn.kv_a_layernorm.weight", LKV)
        w(p + "self_attn.kv_b_proj.weight", H * (nope + dv), LKV)
        w(p + "self_attn.o_proj.weight", E, H * dv)
        if layer != 3:   # layer 3 (shared) has no indexer weights; layer 1 (shared) has them
            w(p + "self_attn.indexer.wq_b.weight", IH * ID, LQ)
            w(p + "self_attn.indexer.wk.weight", ID, E)
            w(p + "self_attn.indexer.k_norm.weight", ID)
            w(p + "self_attn.indexer.k_norm.bias", ID)
            w(p + "self_attn.indexer.weights_proj.weight", IH, E)
        if layer < c["first_k_dense_replace"]:
            w(p + "mlp.gate_proj.weight", Fd, E)
            w(p + "mlp.up_proj.weight", Fd, E)
            w(p + "mlp.down_proj.weight", E, Fd)
        else:
            w(p + "mlp.gate.weight", X, E)
            w(p + "mlp.gate.e_score_correction_bias", X)
            if merged:
                w(p + "mlp.experts.gate_up_proj", X, 2 * Fe, E)
                w(p + "mlp.experts.down_proj", X, E, Fe)
            else:
                for e in range(X):
                    w(p + f"mlp.experts.{e}.gate_proj.weight", Fe, E)
                    w(p + f"mlp.experts.{e}.up_proj.weight", Fe, E)
                    w(p + f"mlp.experts.{e}.down_proj.weight", E, Fe)
            w(p + "mlp.shared_experts.gate_proj.weight", Fe, E)
            w(p + "mlp.shared_experts.up_proj.weight", Fe, E)
            w(p + "mlp.shared_experts.down_proj.weight", E, Fe)
        if layer == c["num_hidden_layers"]:
            w(p + "eh_proj.weight", E, 2 * E)
            w(p + "enorm.weight", E)
            w(p + "hnorm.weight", E)
            w(p + "shared_head.norm.weight", E)
    return t


def expected(src, merged, c):
    """GGUF name -> numpy array (gguf-py's shape: GGUF ne reversed)."""
    H, nope, dv, LKV = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    Fe, X = c["moe_intermediate_size"], c["n_routed_experts"]
    out = {"token_embd.weight": src["model.embed_tokens.weight"], "output_norm.weight": src["model.norm.weight"],
           "output.weight": src["lm_head.weight"]}
    plain = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_a_proj.weight": "attn_q_a.weight", "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
             "self_attn.q_b_proj.weight": "attn_q_b.weight",
             "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
             "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.indexer.wq_b.weight": "indexer.attn_q_b.weight",
             "self_attn.indexer.wk.weight": "indexer.attn_k.weight",
             "self_attn.indexer.k_norm.weight": "indexer.k_norm.weight",
             "self_attn.indexer.k_norm.bias": "indexer.k_norm.bias",
             "self_attn.indexer.weights_proj.weight": "indexer.proj.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight", "mlp.gate.weight": "ffn_gate_inp.weight",
             "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
             "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
             "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
             "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
             "eh_proj.weight": "nextn.eh_proj.weight", "enorm.weight": "nextn.enorm.weight",
             "hnorm.weight": "nextn.hnorm.weight", "shared_head.norm.weight": "nextn.shared_head_norm.weight"}
    n_blocks = c["num_hidden_layers"] + (1 if f"model.layers.{c['num_hidden_layers']}.eh_proj.weight" in src else 0)
    for layer in range(n_blocks):
        p = f"model.layers.{layer}."
        for s, g in plain.items():
            if p + s in src:
                out[f"blk.{layer}.{g}"] = src[p + s]
        kvb = src[p + "self_attn.kv_b_proj.weight"].reshape(H, nope + dv, LKV)
        out[f"blk.{layer}.attn_k_b.weight"] = kvb[:, :nope, :].transpose(0, 2, 1)
        out[f"blk.{layer}.attn_v_b.weight"] = kvb[:, nope:, :]
        if layer >= c["first_k_dense_replace"]:
            if merged:
                gu = src[p + "mlp.experts.gate_up_proj"]
                out[f"blk.{layer}.ffn_gate_exps.weight"] = gu[:, :Fe, :]
                out[f"blk.{layer}.ffn_up_exps.weight"] = gu[:, Fe:, :]
                out[f"blk.{layer}.ffn_down_exps.weight"] = src[p + "mlp.experts.down_proj"]
            else:
                for k, g in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
                    out[f"blk.{layer}.{g}.weight"] = np.stack(
                        [src[p + f"mlp.experts.{e}.{k}.weight"] for e in range(X)])
    return out


def compare(rd, want, label):
    """Every F32 tensor of the converted file equals its expected source array."""
    got = {t.name: t for t in rd.tensors}
    check(set(got) == set(want), f"{label}: tensor set: extra {sorted(set(got) - set(want))[:4]}, "
                                 f"missing {sorted(set(want) - set(got))[:4]}")
    for name, arr in want.items():
        t = got.get(name)
        ok = t is not None and t.tensor_type == QT.F32 and t.data.size == arr.size and \
            np.array_equal(np.asarray(t.data).reshape(arr.shape), arr.astype(np.float32))
        check(ok, f"{label}: {name}: values differ from the source mapping")


def convert(d, out, typ):
    return subprocess.run([CONVERT, d, out, "--type", typ, "--threads", "2"], capture_output=True, text=True, cwd=ROOT)


def main():
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        for merged in (False, True):
            d = os.path.join(tmp, f"glm-{int(merged)}")
            os.makedirs(d)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(CFG, f)
            src = checkpoint(rng, merged)
            st_np.write(os.path.join(d, "model.safetensors"), {k: ("F32", v) for k, v in src.items()})
            out = os.path.join(tmp, "glm.gguf")
            r = convert(d, out, "f32")
            check(r.returncode == 0, f"convert merged={merged}: {r.stderr[-400:]}")
            if r.returncode:
                continue
            rd = GGUFReader(out)
            f = rd.fields
            check(f["general.architecture"].contents() == "glm-dsa", "architecture")
            check(f["glm-dsa.block_count"].contents() == 5 and f["glm-dsa.nextn_predict_layers"].contents() == 1,
                  "4 trunk layers + MTP")
            check(f["glm-dsa.leading_dense_block_count"].contents() == 1, "first_k_dense_replace")
            check(f["glm-dsa.attention.key_length_mla"].contents() == 48 and
                  f["glm-dsa.attention.key_length"].contents() == 48, "key lengths")
            check(f["glm-dsa.attention.head_count_kv"].contents() == 1, "MQA head")
            check([bool(x) for x in f["glm-dsa.attention.indexer.types"].contents()] == [True, False, True, False],
                  "indexer.types")
            check(abs(f["glm-dsa.rope.freq_base"].contents() - 8e6) < 1, "rope base")
            compare(rd, expected(src, merged, CFG), f"merged={merged}")
            r = subprocess.run([DS4, "-m", out, "--token-ids", "1,2"], capture_output=True, text=True, cwd=ROOT)
            check(r.returncode == 0 and "GLM 5.2, 4 layers" in r.stderr and "next token:" in r.stdout,
                  f"the engine loads and runs the converted GLM file: {r.stderr.strip()}")

        # transformers' own save_pretrained output (tests/fixtures/glmtiny/A, BF16 sources)
        fx = os.path.join(ROOT, "tests", "fixtures", "glmtiny", "A")
        with open(os.path.join(fx, "config.json")) as f:
            fcfg = json.load(f)
        src = {k: st_np.to_f32(v) for k, v in st_np.read(os.path.join(fx, "model.safetensors")).items()}
        out = os.path.join(tmp, "fixture.gguf")
        r = convert(fx, out, "f32")
        check(r.returncode == 0 and "warning" not in r.stderr, f"convert the oracle fixture: {r.stderr[-400:]}")
        if r.returncode == 0:
            rd = GGUFReader(out)
            compare(rd, expected(src, False, fcfg), "fixture")
            types_f = [bool(x) for x in rd.fields["glm-dsa.attention.indexer.types"].contents()]
            check(types_f == [x == "full" for x in fcfg["indexer_types"]], "fixture indexer.types")

        d = os.path.join(tmp, "glm-0")
        types = {"f16": (QT.F16, QT.F16), "q8_0": (QT.Q8_0, QT.Q8_0), "q2": (QT.Q8_0, QT.Q2_K),
                 "q4": (QT.Q8_0, QT.Q4_K)}
        for typ, (mat, exp) in types.items():
            out = os.path.join(tmp, f"glm-{typ}.gguf")
            r = convert(d, out, typ)
            if typ in ("q2", "q4"):
                # K-quant rows are 256 wide: this checkpoint's 32/64-wide rows cannot be, and it says which
                check(r.returncode != 0 and "not a multiple of the" in r.stderr and r.stderr.count("\n") == 1,
                      f"{typ}: {r.stderr.strip()}")
                continue
            check(r.returncode == 0, f"convert {typ}: {r.stderr[-300:]}")
            if r.returncode:
                continue
            for t in GGUFReader(out).tensors:
                f32 = t.name.endswith(("norm.weight", "norm.bias", "ffn_gate_inp.weight", "exp_probs_b.bias",
                                       "indexer.proj.weight"))
                w = QT.F32 if f32 else exp if "_exps." in t.name else mat
                check(t.tensor_type == w, f"{typ}: {t.name} is {t.tensor_type.name}, want {w.name}")

        bad = [({"rope_parameters": {"rope_theta": 8e6, "rope_type": "yarn", "factor": 4}}, "rope_type"),
               ({"indexer_types": ["shared", "full", "full", "full"]}, "trunk layer 0 is a shared"),
               ({"scoring_func": "softmax"}, "scoring_func"),
               ({"kv_lora_rank": None}, "kv_lora_rank"),
               ({"mlp_layer_types": ["dense", "sparse", "dense", "sparse"]}, "mlp_layer_types[2]")]
        for change, want in bad:
            cfg = dict(CFG)
            for k, v in change.items():
                if v is None:
                    cfg.pop(k)
                else:
                    cfg[k] = v
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
            r = convert(d, os.path.join(tmp, "bad.gguf"), "f32")
            check(r.returncode != 0 and want in r.stderr and r.stderr.strip().count("\n") == 0,
                  f"bad config {change}: {r.stderr.strip()}")
    finish("test_convert_glm")


if __name__ == "__main__":
    main()
