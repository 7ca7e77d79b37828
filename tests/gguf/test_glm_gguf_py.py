#!/usr/bin/env python3
"""GLM 5.2 files from ds4-make-model, read back with gguf-py (the library
llama.cpp's converter writes GGUFs with) as the independent oracle:
- general.architecture is gguf-py's name for MODEL_ARCH.GLM_DSA;
- every tensor name is one gguf-py allows for GLM_DSA (MODEL_TENSORS), with
  blocks 0..N-1 the trunk and block N the MTP (nextn) block;
- every glm-dsa.* key is a gguf-py key template for that architecture, with
  the value type gguf-py's writer uses for it (UINT32 counts, FLOAT32
  eps/scale/base, BOOL expert_weights_norm);
- the q2 mix has the released GLM type classes: routed experts Q2_K, norms /
  router / router bias / indexer head weights F32, every other matrix Q8_0."""
import os
import subprocess
import sys
import tempfile

import gguf.constants as C
from gguf import GGUFReader, GGMLQuantizationType as QT, GGUFValueType as VT

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "convert"))
from harness import check, finish  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MAKE = os.path.join(ROOT, "ds4-make-model")
ARCH = C.MODEL_ARCH.GLM_DSA


def key_templates():
    """Every '{arch}.…' key string gguf-py defines, for GLM_DSA's name."""
    out = set()

    def walk(cls):
        for v in vars(cls).values():
            if isinstance(v, str) and v.startswith("{arch}.") and v.count("{") == 1:
                out.add(v.format(arch=C.MODEL_ARCH_NAMES[ARCH]))
            elif isinstance(v, type):
                walk(v)
    walk(C.Keys)
    return out


def main():
    arch_name = C.MODEL_ARCH_NAMES[ARCH]
    allowed = [C.TENSOR_NAMES[t] for t in C.MODEL_TENSORS[ARCH]]
    templates = key_templates()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "glm.gguf")
        r = subprocess.run([MAKE, "-o", out, "--preset", "glm-demo", "--layers", "4", "--type", "q2"],
                           capture_output=True, text=True, cwd=ROOT)
        check(r.returncode == 0, f"ds4-make-model glm-demo: {r.stderr[-300:]}")
        if r.returncode:
            finish("test_glm_gguf_py")
        rd = GGUFReader(out)
        f = rd.fields
        check(f["general.architecture"].contents() == arch_name, "architecture")
        n_block = f[arch_name + ".block_count"].contents()
        n_nextn = f[arch_name + ".nextn_predict_layers"].contents()
        check(n_block == 5 and n_nextn == 1, f"blocks {n_block}, nextn {n_nextn}")
        for k, field in f.items():
            if not k.startswith(arch_name + "."):
                continue
            check(k in templates, f"key {k} is not a gguf-py key")
            want = VT.BOOL if k.endswith("expert_weights_norm") else \
                VT.FLOAT32 if k.endswith(("epsilon", "freq_base", "weights_scale")) else VT.UINT32
            check(field.types == [want], f"key {k} type {field.types}, gguf-py writes {want}")
        for k in ("context_length", "embedding_length", "attention.q_lora_rank", "attention.kv_lora_rank",
                  "attention.key_length_mla", "attention.value_length_mla", "attention.indexer.top_k",
                  "leading_dense_block_count", "expert_shared_count", "expert_gating_func"):
            check(f"{arch_name}.{k}" in f, f"key {k} written")
        check(f[arch_name + ".expert_gating_func"].contents() == int(C.ExpertGatingFuncType.SIGMOID), "sigmoid")

        f32_suffixes = ("_norm.weight", "norm.weight", "k_norm.bias", "ffn_gate_inp.weight", "exp_probs_b.bias",
                        "indexer.proj.weight")
        names = set()
        for t in rd.tensors:
            names.add(t.name)
            base = t.name.rsplit(".", 1)[0]
            blk = int(t.name.split(".")[1]) if t.name.startswith("blk.") else None
            ok = any(base == a.format(bid=blk) for a in allowed) if blk is not None else base in allowed
            check(ok, f"{t.name} is not a gguf-py GLM_DSA tensor")
            if "nextn." in t.name:
                check(blk == n_block - n_nextn, f"{t.name} outside the MTP block")
            if "_exps." in t.name:
                want = QT.Q2_K
            elif t.name.endswith(f32_suffixes):
                want = QT.F32
            else:
                want = QT.Q8_0
            check(t.tensor_type == want, f"{t.name} type {t.tensor_type.name}, want {want.name}")
        for b in range(n_block):
            for s in ("attn_k_b", "attn_v_b", "attn_kv_a_mqa", "indexer.attn_k"):
                check(f"blk.{b}.{s}.weight" in names, f"blk.{b}.{s} present")
        check("blk.0.ffn_gate.weight" in names and "blk.1.ffn_gate.weight" not in names, "one dense block")
        check("blk.1.ffn_gate_exps.weight" in names and "blk.4.ffn_gate_exps.weight" in names, "MoE blocks")
    finish("test_glm_gguf_py")


if __name__ == "__main__":
    main()
