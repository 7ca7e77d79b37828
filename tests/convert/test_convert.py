#!/usr/bin/env python3
"""ds4-convert round trips, checked with gguf-py and a numpy safetensors reader:

* tiny oracle model A (transformers save_pretrained naming, BF16) -> f32: the
  exact tensor inventory of the sheet, every tensor equal to the checkpoint
  values, every section-2 metadata key with the right type and value;
* A -> f16 / q8_0: F16 tensors equal numpy's float16 rounding of the source,
  Q8_0 tensors byte-identical to gguf-py's reference Q8_0 quantizer;
* A -> q2 / q4: per-tensor types are the released mixes and every quantized
  tensor decodes (gguf-py) close to the source; an imatrix shifts the q2
  error towards the columns it marks unimportant;
* B -> f32: inventory, metadata, exact values;
* C (CSA compressing by 8, HCA by 4) -> f32: the same, with the compressor
  shapes and the layer_kinds key following layer_types, not the ratio;
* A rewritten in transformers' module names with merged experts gives the
  same tensors;
* a synthetic official-naming checkpoint (FP8 E4M3 + 128x128 UE8M0 block
  scales, FP4 E2M1 experts + per-32 UE8M0 scales, BF16, int64 tid2eid, two
  shards with an index) -> f32 equals the dequantized values.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds4_sheet  # noqa: E402
from harness import check, finish  # noqa: E402
import make_official_checkpoint  # noqa: E402
import st_np  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
CONVERT = os.path.join(ROOT, "ds4-convert")
FIX_A = os.path.join(ROOT, "tests", "fixtures", "ds4tiny", "A")



def convert(src, out, typ, *extra):
    r = subprocess.run([CONVERT, src, out, "--type", typ, *extra], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stderr)
        raise SystemExit(f"ds4-convert {typ} failed")
    check("warning" not in r.stderr, f"{src} {typ}: {r.stderr[:300]}")
    return GGUFReader(out)


def field_value(f):
    return f.contents()


def values_of(t):
    """Float values of a GGUF tensor in numpy order (ne reversed)."""
    shape = tuple(int(x) for x in reversed(t.shape))
    if t.tensor_type in (QT.F32, QT.F16, QT.I32):
        return np.asarray(t.data).reshape(shape)
    return dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)


def expected_type(fam, mix):
    table = {
        "f32": dict(F32=QT.F32, I32=QT.I32, F16=QT.F32, Q8=QT.F32, EXP_GU=QT.F32, EXP_D=QT.F32),
        "f16": dict(F32=QT.F32, I32=QT.I32, F16=QT.F16, Q8=QT.F16, EXP_GU=QT.F16, EXP_D=QT.F16),
        "q8_0": dict(F32=QT.F32, I32=QT.I32, F16=QT.F16, Q8=QT.Q8_0, EXP_GU=QT.Q8_0, EXP_D=QT.Q8_0),
        "q2": dict(F32=QT.F32, I32=QT.I32, F16=QT.F16, Q8=QT.Q8_0, EXP_GU=QT.IQ2_XXS, EXP_D=QT.Q2_K),
        "q4": dict(F32=QT.F32, I32=QT.I32, F16=QT.F16, Q8=QT.Q8_0, EXP_GU=QT.Q4_K, EXP_D=QT.Q4_K),
    }
    return table[mix][fam]


def check_inventory(r, cfg, mix, tag):
    want = ds4_sheet.tensors(cfg)
    got = {t.name: t for t in r.tensors}
    check(sorted(got) == sorted(n for n, *_ in want),
          f"{tag}: tensor set differs: extra {sorted(set(got) - {n for n, *_ in want})[:5]}, "
          f"missing {sorted({n for n, *_ in want} - set(got))[:5]}")
    for name, ne, fam, _ in want:
        t = got.get(name)
        if t is None:
            continue
        check([int(x) for x in t.shape] == ne, f"{tag}: {name} shape {list(t.shape)} != {ne}")
        check(t.tensor_type == expected_type(fam, mix),
              f"{tag}: {name} type {t.tensor_type.name} != {expected_type(fam, mix).name}")
    return want, got


def check_metadata(r, cfg, tag):
    for key, (vtype, val) in ds4_sheet.metadata(cfg).items():
        f = r.fields.get(key)
        if f is None:
            check(False, f"{tag}: missing key {key}")
            continue
        check(f.types[0].name == vtype, f"{tag}: {key} type {f.types[0].name} != {vtype}")
        got = field_value(f)
        if isinstance(val, float) or (isinstance(val, list) and val and isinstance(val[0], float)):
            ok = np.allclose(np.asarray(got, np.float64), np.float32(val), rtol=0, atol=0)
        else:
            ok = got == val
        check(ok, f"{tag}: {key} = {got!r}, expected {val!r}")


def check_exact(r, cfg, st, tag, want, got):
    for name, ne, fam, src in want:
        if name not in got:
            continue
        exp = ds4_sheet.source_values(st, cfg, src)
        val = values_of(got[name])
        exp = exp.reshape(val.shape)
        if fam == "I32":
            check(np.array_equal(val, exp.astype(np.int32)), f"{tag}: {name} values differ")
        else:
            check(np.array_equal(val, exp.astype(np.float32)),
                  f"{tag}: {name} max |diff| {np.abs(val - exp).max():.3g}")


def test_tiny_a(tmp):
    cfg = json.load(open(os.path.join(FIX_A, "config.json")))
    st = st_np.read_dir(FIX_A)

    r = convert(FIX_A, os.path.join(tmp, "A-f32.gguf"), "f32")
    want, got = check_inventory(r, cfg, "f32", "A f32")
    check_metadata(r, cfg, "A f32")
    check_exact(r, cfg, st, "A f32", want, got)
    check("tokenizer.ggml.tokens" not in r.fields, "A f32: tokenizer keys without a tokenizer")

    # F16 / Q8_0 tensors of both mixes: byte-identical to gguf-py's reference
    # conversion of the source values (numpy float16 rounding; ggml's Q8_0).
    for mix in ("f16", "q8_0"):
        r = convert(FIX_A, os.path.join(tmp, f"A-{mix}.gguf"), mix)
        want, got = check_inventory(r, cfg, mix, f"A {mix}")
        for name, ne, fam, src in want:
            t = got.get(name)
            if t is None or t.tensor_type not in (QT.F16, QT.Q8_0):
                continue
            exp = ds4_sheet.source_values(st, cfg, src).reshape(-1, ne[0]).astype(np.float32)
            ref = quantize(exp, t.tensor_type)
            check(np.asarray(t.data).tobytes() == ref.tobytes(),
                  f"A {mix}: {name} differs from gguf-py's {t.tensor_type.name} conversion")

    # Quantized mixes: types as released; decoded values near the source
    # (relative RMS error well below 1, which any mis-ordered or garbage
    # block would exceed).
    for mix, bound in (("q2", 0.6), ("q4", 0.15)):
        r = convert(FIX_A, os.path.join(tmp, f"A-{mix}.gguf"), mix)
        want, got = check_inventory(r, cfg, mix, f"A {mix}")
        for name, ne, fam, src in want:
            t = got.get(name)
            if t is None or fam not in ("EXP_GU", "EXP_D"):
                continue
            exp = ds4_sheet.source_values(st, cfg, src).reshape(-1, ne[0])
            val = values_of(t).reshape(exp.shape)
            rel = np.sqrt(np.mean((val - exp) ** 2) / np.mean(exp ** 2))
            check(rel < bound, f"A {mix}: {name} relative RMS error {rel:.3f} >= {bound}")
        if mix == "q2":
            print(f"A q2: last expert tensor relative RMS error {rel:.3f}")


def test_tiny_bc(tmp):
    """B: the released kinds (CSA at 4, HCA at 128): no layer_kinds key, so
    the file keeps llama.cpp's key set. C: CSA at 8 and HCA at 4, where the
    kind is not the ratio's: the converter takes it from layer_types (the
    compressor shapes follow it) and records it."""
    for name, kinds_key in (("B", False), ("C", True)):
        d = os.path.join(ROOT, "tests", "fixtures", "ds4tiny", name)
        cfg = json.load(open(os.path.join(d, "config.json")))
        r = convert(d, os.path.join(tmp, f"{name}-f32.gguf"), "f32")
        want, got = check_inventory(r, cfg, "f32", f"{name} f32")
        check_metadata(r, cfg, f"{name} f32")
        check_exact(r, cfg, st_np.read_dir(d), f"{name} f32", want, got)
        check(("deepseek4.attention.layer_kinds" in r.fields) == kinds_key,
              f"{name} f32: layer_kinds key {'missing' if kinds_key else 'written for released kinds'}")


# official leaf name -> transformers module parameter name (transformers'
# deepseek_v4 conversion mapping, applied by hand)
MODULE_NAMES = [
    ("attn.indexer.compressor.ape", "self_attn.compressor.indexer.position_bias"),
    ("attn.indexer.compressor.wkv.", "self_attn.compressor.indexer.kv_proj."),
    ("attn.indexer.compressor.wgate.", "self_attn.compressor.indexer.gate_proj."),
    ("attn.indexer.compressor.norm.", "self_attn.compressor.indexer.kv_norm."),
    ("attn.indexer.wq_b.", "self_attn.compressor.indexer.q_b_proj."),
    ("attn.indexer.weights_proj.", "self_attn.compressor.indexer.scorer.weights_proj."),
    ("attn.compressor.ape", "self_attn.compressor.position_bias"),
    ("attn.compressor.wkv.", "self_attn.compressor.kv_proj."),
    ("attn.compressor.wgate.", "self_attn.compressor.gate_proj."),
    ("attn.compressor.norm.", "self_attn.compressor.kv_norm."),
    ("attn.wq_a.", "self_attn.q_a_proj."), ("attn.q_norm.", "self_attn.q_a_norm."),
    ("attn.wq_b.", "self_attn.q_b_proj."), ("attn.wkv.", "self_attn.kv_proj."),
    ("attn.norm.", "self_attn.kv_norm."), ("attn.attn_sink", "self_attn.sinks"),
    ("attn.wo_a.", "self_attn.o_a_proj."), ("attn.wo_b.", "self_attn.o_b_proj."),
    ("attn_norm.", "input_layernorm."), ("ffn_norm.", "post_attention_layernorm."),
    ("hc_attn_fn", "attn_hc.fn"), ("hc_attn_base", "attn_hc.base"), ("hc_attn_scale", "attn_hc.scale"),
    ("hc_ffn_fn", "ffn_hc.fn"), ("hc_ffn_base", "ffn_hc.base"), ("hc_ffn_scale", "ffn_hc.scale"),
    ("ffn.gate.bias", "mlp.gate.e_score_correction_bias"), ("ffn.gate.", "mlp.gate."),
    ("ffn.shared_experts.w1.", "mlp.shared_experts.gate_proj."),
    ("ffn.shared_experts.w3.", "mlp.shared_experts.up_proj."),
    ("ffn.shared_experts.w2.", "mlp.shared_experts.down_proj."),
]


def test_module_naming(tmp):
    """A rewritten into transformers' module parameter names, experts merged
    into gate_up_proj [X, 2F, E] / down_proj [X, E, F], converts to exactly
    the tensors the save_pretrained naming gives."""
    cfg = json.load(open(os.path.join(FIX_A, "config.json")))
    st = st_np.read_dir(FIX_A)
    X = cfg["n_routed_experts"]
    out = {}
    for name, (dtype, _, arr) in st.items():
        if ".experts." in name:
            continue
        new = "lm_head.weight" if name == "head.weight" else name
        if new.startswith("model.layers."):
            pre, rest = new.split(".", 3)[:3], new.split(".", 3)[3]
            for old, repl in MODULE_NAMES:
                if rest.startswith(old):
                    rest = repl + rest[len(old):]
                    break
            new = ".".join(pre) + "." + rest
        out[new] = (dtype, arr)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w = lambda e, k: st[f"{p}ffn.experts.{e}.{k}.weight"][2]  # noqa: E731
        out[p + "mlp.experts.gate_up_proj"] = ("BF16", np.stack([np.concatenate([w(e, "w1"), w(e, "w3")]) for e in range(X)]))
        out[p + "mlp.experts.down_proj"] = ("BF16", np.stack([w(e, "w2") for e in range(X)]))
    d = os.path.join(tmp, "module")
    os.makedirs(d)
    st_np.write(os.path.join(d, "model.safetensors"), out)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    ref = {t.name: np.asarray(t.data) for t in convert(FIX_A, os.path.join(tmp, "ref.gguf"), "q8_0").tensors}
    got = {t.name: np.asarray(t.data) for t in convert(d, os.path.join(tmp, "module.gguf"), "q8_0").tensors}
    check(sorted(ref) == sorted(got), "module naming: tensor sets differ")
    for name in ref:
        check(name in got and np.array_equal(ref[name], got[name]), f"module naming: {name} differs")


def test_imatrix(tmp):
    """An imatrix weighting even columns 1000x must move the q2 error from the
    even to the odd columns of every routed expert tensor (IQ2_XXS and Q2_K),
    compared with the conversion without one; the legacy .dat and the GGUF
    imatrix layouts with the same importance give identical tensors."""
    cfg = json.load(open(os.path.join(FIX_A, "config.json")))
    st = st_np.read_dir(FIX_A)
    experts = [(n, ne, src) for n, ne, fam, src in ds4_sheet.tensors(cfg) if fam in ("EXP_GU", "EXP_D")]
    path = os.path.join(tmp, "im.dat")
    with open(path, "wb") as f:        # llama.cpp imatrix.dat layout
        f.write(struct.pack("<i", len(experts)))
        for name, ne, _ in experts:
            v = np.ones((ne[2], ne[0]), np.float32)
            v[:, 0::2] = 1000
            f.write(struct.pack("<i", len(name)) + name.encode() + struct.pack("<ii", 1, v.size) + v.tobytes())
    # the same importance in llama.cpp's GGUF imatrix layout (in_sum2 / counts)
    gpath = os.path.join(tmp, "im.gguf")
    gw = GGUFWriter(gpath, "imatrix")
    for name, ne, _ in experts:
        v = np.ones((ne[2], ne[0]), np.float32)
        v[:, 0::2] = 1000
        gw.add_tensor(name + ".in_sum2", v * 4)
        gw.add_tensor(name + ".counts", np.full((ne[2], 1), 4, np.float32))
    gw.write_header_to_file()
    gw.write_kv_data_to_file()
    gw.write_tensors_to_file()
    gw.close()
    with_im = {t.name: t for t in convert(FIX_A, os.path.join(tmp, "A-q2-im.gguf"), "q2", "--imatrix", path).tensors}
    with_gim = {t.name: t for t in convert(FIX_A, os.path.join(tmp, "A-q2-gim.gguf"), "q2", "--imatrix", gpath).tensors}
    without = {t.name: t for t in convert(FIX_A, os.path.join(tmp, "A-q2.gguf"), "q2").tensors}
    for name, ne, src in experts:
        exp = ds4_sheet.source_values(st, cfg, src).reshape(-1, ne[0])
        e1 = (values_of(with_im[name]).reshape(exp.shape) - exp) ** 2
        e0 = (values_of(without[name]).reshape(exp.shape) - exp) ** 2
        even, odd = e1[:, 0::2].mean() / e0[:, 0::2].mean(), e1[:, 1::2].mean() / e0[:, 1::2].mean()
        check(even < 0.8 and odd > 1.2, f"imatrix: {name} error ratio even {even:.2f} odd {odd:.2f}")
        check(np.array_equal(np.asarray(with_im[name].data), np.asarray(with_gim[name].data)),
              f"imatrix: {name} differs between the .dat and the GGUF imatrix")


def test_official(tmp):
    d = os.path.join(tmp, "official")
    cfg = make_official_checkpoint.make(d, seed=7)
    st = st_np.read_dir(d)
    dtypes = {e[0] for e in st.values()}
    check({"F8_E4M3", "F8_E8M0", "F4", "I8", "U8", "I64", "BF16"} <= dtypes, f"generator dtypes {dtypes}")
    r = convert(d, os.path.join(tmp, "official-f32.gguf"), "f32")
    want, got = check_inventory(r, cfg, "f32", "official f32")
    check_metadata(r, cfg, "official f32")
    check_exact(r, cfg, st, "official f32", want, got)


def test_errors(tmp):
    """Bad inputs: exit status 1 and one final line naming the problem (after
    any progress lines), and no output file left behind."""
    d = os.path.join(tmp, "bad")
    make_official_checkpoint.make(d, seed=1)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["hidden_size"] = 512
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    cases = [
        ([os.path.join(tmp, "nonexistent"), "--type", "f32"], "config.json"),
        ([d, "--type", "f32"], "expected"),
        ([FIX_A, "--type", "q3"], "unknown --type"),
    ]
    v3 = os.path.join(ROOT, "data", "deepseek-v3-tokenizer.json")
    if os.path.exists(v3):
        added = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "v4-added-tokens.json")
        cases.append(([FIX_A, "--type", "f32", "--vocab", v3, "--vocab-added", added],
                      "129280 tokens but vocab_size is 512"))
    # a NaN code (0x7f) in an FP8 matrix is found while writing
    n = os.path.join(tmp, "nan")
    make_official_checkpoint.make(n, seed=2)
    shard = os.path.join(n, "model-00001-of-00002.safetensors")
    st = st_np.read(shard)
    name = next(k for k, e in st.items() if e[0] == "F8_E4M3")
    tensors = {k: (e[0], e[2].copy()) for k, e in st.items()}
    tensors[name][1].flat[5] = 0x7F
    st_np.write(shard, tensors)
    cases.append(([n, "--type", "q8_0"], "non-finite"))
    for args, want in cases:
        r = subprocess.run([CONVERT, args[0], os.path.join(tmp, "x.gguf"), *args[1:]], capture_output=True, text=True)
        last = (r.stderr.strip().splitlines() or [""])[-1]
        check(r.returncode == 1 and want in last and last.startswith("ds4-convert: "),
              f"error case {args[-1]} {want!r}: rc {r.returncode}, stderr {r.stderr!r}")
    check(not any(f.startswith("x.gguf") for f in os.listdir(tmp)), "a failed conversion left an output file")


def main():
    if not os.path.exists(CONVERT):
        raise SystemExit(f"{CONVERT} not built")
    with tempfile.TemporaryDirectory() as tmp:
        test_tiny_a(tmp)
        test_tiny_bc(tmp)
        test_module_naming(tmp)
        test_imatrix(tmp)
        test_official(tmp)
        test_errors(tmp)
    finish("test_convert")


if __name__ == "__main__":
    main()
