#!/usr/bin/env python3
"""Writes the compact float32 form of a trained tiny GGUF (docs/tiny-model.md):

    python3 tools/train-tiny/compact_gguf.py models/ds4-tiny.gguf OUT.gguf [OUT-ids.json]

The trained model keeps a real output row for K ids and writes one shared row
into every other id (the aggregated class). OUT.gguf keeps the K kept rows and
one aggregated row (compact id K), remaps the embedding and the hash-routing
table the same way, drops the tokenizer, and stores every tensor dequantized
to F32. Its logits at compact id i are the original file's weights' logits at
kept id i; the engine's f32 kernels then compute exactly what PyTorch computes
on the same (dequantized) weights, which is what test_tiny_exact checks over a
512-token sequence without dumping 129,280 logits per position.
OUT-ids.json gets the kept ids in compact order (the aggregated row last)."""
import json
import sys

import numpy as np
import gguf
from gguf.quants import dequantize


def kept_ids(out_rows):
    """Ids whose output row differs from the aggregated row, the row that
    occurs most often (found by a random projection of every row, then
    checked bit for bit)."""
    h = out_rows.astype(np.float64) @ np.random.default_rng(0).standard_normal(out_rows.shape[1])
    _, inv, counts = np.unique(h, return_inverse=True, return_counts=True)
    agg = inv.reshape(-1) == int(np.argmax(counts))
    rare = int(np.nonzero(agg)[0][0])
    same = np.all(out_rows == out_rows[rare], axis=1)
    assert np.array_equal(same, agg), "rows with equal projections differ"
    return np.nonzero(~agg)[0], rare


def main():
    src, dst = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(src)
    tensors = {t.name: t for t in r.tensors}

    def deq(t):
        if t.tensor_type == gguf.GGMLQuantizationType.I32:
            a = np.array(t.data)
        else:
            a = dequantize(t.data, t.tensor_type)
        return np.asarray(a).reshape([int(x) for x in reversed(t.shape)])

    out_rows = deq(tensors["output.weight"])
    keep, rare = kept_ids(out_rows)
    rows = np.concatenate([keep, [rare]])
    n = len(rows)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name.startswith("tokenizer.") or name == "general.architecture":
            continue
        if name == "%s.vocab_size" % arch:
            w.add_uint32(name, n)
            continue
        vt = f.types[0]
        w.add_key_value(name, f.contents(), vt, sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        a = deq(t)
        if t.name in ("token_embd.weight", "output.weight") or t.name.endswith("ffn_gate_tid2eid.weight"):
            a = a[rows]
        a = np.ascontiguousarray(a.astype(np.int32 if t.tensor_type == gguf.GGMLQuantizationType.I32 else np.float32))
        w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if len(sys.argv) > 3:
        json.dump({"kept_ids": keep.tolist(), "aggregated_from": rare, "n_aggregated": int(out_rows.shape[0] - len(keep))},
                  open(sys.argv[3], "w"))
    print("%s: %d kept ids + 1 aggregated row, float32" % (dst, len(keep)))


if __name__ == "__main__":
    main()
