#!/usr/bin/env python3
"""Importance matrix of the routed experts for ds4-convert --imatrix
(docs/tiny-model.md): per layer and expert, the mean squared input of every
column of its gate/up matrices (the FFN input of the tokens routed to it) and
of its down matrix (the gated activation), over calibration tokens from the
training documents. Written as llama.cpp's legacy imatrix.dat (i32 entry
count; per entry i32 name length, name, i32 calls, i32 value count, f32
values), names as in the GGUF (blk.N.ffn_{gate,up,down}_exps.weight), values
expert-major; an expert that saw no token gets 1.0 (neutral).

    python3 tools/train-tiny/imatrix.py CKPT OUT.dat [--data build/train-tiny] [--tokens 16384]"""
import argparse
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from export import compact_model  # noqa: E402
from tok import N_VOCAB  # noqa: E402
from train import load, pack  # noqa: E402
import random  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("--data", default="build/train-tiny")
    ap.add_argument("--tokens", type=int, default=16384)
    a = ap.parse_args()
    torch.set_num_threads(1)
    ck = torch.load(a.ckpt, weights_only=False)
    keep = ck["keep"]
    remap = torch.full((N_VOCAB,), len(keep), dtype=torch.long)
    remap[torch.tensor(keep)] = torch.arange(len(keep))
    m = compact_model(ck)
    acc = {}

    def hook(layer):
        def f(mod, args, out):
            hs, idx, _ = args
            for e in range(mod.num_experts):
                tok = (idx == e).any(-1).nonzero()[:, 0]
                if not len(tok):
                    continue
                x = hs[tok]
                act = mod._apply_gate(F.linear(x, mod.gate_up_proj[e]))
                s = acc.setdefault(layer, {"gu": torch.zeros(mod.num_experts, x.shape[1], dtype=torch.float64),
                                           "d": torch.zeros(mod.num_experts, act.shape[1], dtype=torch.float64),
                                           "n": torch.zeros(mod.num_experts, dtype=torch.float64)})
                s["gu"][e] += (x.double() ** 2).sum(0)
                s["d"][e] += (act.double() ** 2).sum(0)
                s["n"][e] += len(tok)
        return f

    for li, layer in enumerate(m.model.layers):
        layer.mlp.experts.register_forward_hook(hook(li))
    train, _ = load(a.data, 50, ck["args"].get("max_agent", 3000))
    seqs = pack(train, ck["args"]["seq"], random.Random(7))
    random.Random(7).shuffle(seqs)
    done = 0
    with torch.no_grad():
        for ids, _ in seqs:
            m(remap[torch.tensor([ids])], with_mtp=False)
            done += len(ids)
            if done >= a.tokens:
                break
    entries = []
    for li in sorted(acc):
        s = acc[li]
        n = s["n"].clamp(min=1)[:, None]
        hit = (s["n"] > 0)[:, None]
        gu = torch.where(hit, s["gu"] / n, torch.ones_like(s["gu"]))
        d = torch.where(hit, s["d"] / n, torch.ones_like(s["d"]))
        for kind, v in (("gate", gu), ("up", gu), ("down", d)):
            entries.append(("blk.%d.ffn_%s_exps.weight" % (li, kind), int(s["n"].sum()), v.flatten().float()))
    with open(a.out, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, calls, v in entries:
            b = name.encode()
            f.write(struct.pack("<i", len(b)) + b + struct.pack("<ii", calls, v.numel()))
            f.write(v.numpy().astype("<f4").tobytes())
    print("wrote %s: %d entries from %d tokens" % (a.out, len(entries), done))


if __name__ == "__main__":
    main()
