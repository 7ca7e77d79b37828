#!/usr/bin/env python3
"""Regenerates tests/fixtures/gguf/*.gguf with gguf-py (the independent writer).

    pip install gguf==0.19.0 numpy && python3 tests/oracles/gguf_make_fixtures.py

tests/unit/test_gguf.c hard-codes the values written here; keep them in sync.
  all_types.gguf          every scalar type (edge values), strings, arrays of
                          every type, alignment 64, tensors of 11 ggml types
  nested.gguf             nested arrays (our reader validates and skips them)
  split-0000N-of-00003    a 3-shard split written by GGUFWriter's splitter
"""
import os
import numpy as np
import gguf
from gguf import GGUFValueType as VT, GGMLQuantizationType as QT

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gguf")


def raw(n, mul, add):
    """Deterministic byte pattern standing in for quantized blocks."""
    return (np.arange(n, dtype=np.uint64) * mul + add).astype(np.uint8)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def all_types():
    w = gguf.GGUFWriter(os.path.join(OUT, "all_types.gguf"), "fixture")
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 255)
    w.add_int8("t.i8", -128)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -32768)
    w.add_uint32("t.u32", 4294967295)
    w.add_int32("t.i32", -2147483648)
    w.add_float32("t.f32", 3.25)
    w.add_bool("t.bool_true", True)
    w.add_bool("t.bool_false", False)
    w.add_string("t.str", "héllo wörld")
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -2**63)
    w.add_float64("t.f64", -1.5e300)
    arrays = [
        ("a.u8", VT.UINT8, [0, 1, 255]),
        ("a.i8", VT.INT8, [-128, 0, 127]),
        ("a.u16", VT.UINT16, [0, 1, 65535]),
        ("a.i16", VT.INT16, [-32768, 0, 32767]),
        ("a.u32", VT.UINT32, [0, 1, 4294967295]),
        ("a.i32", VT.INT32, [-2147483648, 0, 2147483647]),
        ("a.f32", VT.FLOAT32, [1.5, -2.0, 1e-30]),
        ("a.bool", VT.BOOL, [True, False, True]),
        ("a.str", VT.STRING, ["ab", "", "ünï"]),
        ("a.u64", VT.UINT64, [0, 1, 2**64 - 1]),
        ("a.i64", VT.INT64, [-2**63, 0, 2**63 - 1]),
        ("a.f64", VT.FLOAT64, [0.25, -3.0, 1e300]),
    ]
    for key, sub, val in arrays:
        w.add_key_value(key, val, VT.ARRAY, sub_type=sub)
    f32 = np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1
    w.add_tensor("t.f32", f32)
    w.add_tensor("t.f16", np.array([1, -2, 0.5, 65504], dtype=np.float16))
    w.add_tensor("t.q8_0", raw(2 * 68, 7, 3).reshape(2, 68), raw_dtype=QT.Q8_0)
    w.add_tensor("t.q4_k", raw(144, 5, 1).reshape(1, 144), raw_dtype=QT.Q4_K)
    w.add_tensor("t.q2_k", raw(84, 3, 2).reshape(1, 84), raw_dtype=QT.Q2_K)
    w.add_tensor("t.iq2_xxs", raw(66, 11, 9).reshape(1, 66), raw_dtype=QT.IQ2_XXS)
    w.add_tensor("t.i32", np.array([-1, 0, 1, 2**31 - 1, -2**31], dtype=np.int32))
    w.add_tensor("t.bf16", raw(16, 13, 0).reshape(2, 8), raw_dtype=QT.BF16)
    w.add_tensor("t.i8", np.array([-128, 127, 5], dtype=np.int8))
    w.add_tensor("t.f64", np.array([1.0, -0.5], dtype=np.float64))
    w.add_tensor("blk.0.ffn_gate_exps.weight", raw(3 * 2 * 34, 17, 4).reshape(3, 2, 34),
                 raw_dtype=QT.Q8_0)
    finish(w)


def nested():
    w = gguf.GGUFWriter(os.path.join(OUT, "nested.gguf"), "fixture")
    w.add_key_value("n.ints", [[1, 2], [3]], VT.ARRAY)
    w.add_key_value("n.strs", [["a"], ["b", "c"]], VT.ARRAY)
    w.add_key_value("n.deep", [[[7]]], VT.ARRAY)
    w.add_uint32("n.after", 42)
    w.add_tensor("n.t", np.array([2.5], dtype=np.float32))
    finish(w)


def split():
    w = gguf.GGUFWriter(os.path.join(OUT, "split.gguf"), "fixture", split_max_tensors=2)
    w.add_uint32("s.value", 7)
    for i in range(5):
        w.add_tensor(f"s.t{i}", np.full((2, 4), i, dtype=np.float32))
    finish(w)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    all_types()
    nested()
    split()
