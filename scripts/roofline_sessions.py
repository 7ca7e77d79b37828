#!/usr/bin/env python3
"""Bytes-per-step roofline for N sessions decoding together (issue 11).

    python3 scripts/roofline_sessions.py MODEL.gguf [--sessions 1,2,4,8,16]

One batched decode step of N sessions reads every dense weight once (the
attention, shared expert, router, compressor and indexer projections, norms,
hyper-connection mixers), the output head once, one embedding row per
session, and each routed expert that at least one of the N tokens selected,
once. With k of E experts picked per token and routing spread evenly, a layer
reads E * (1 - (1 - k/E)^N) distinct experts on average. If decode were
bound by memory traffic, N sessions would run N * bytes(1) / bytes(N) times
faster in aggregate than one: that is the memory roofline this prints, with
the bytes per step and per generated token. (The engine's own count of bytes
read, `ds4-bench --sessions`, uses the experts actually routed.) Compute does
not shrink with batching: every token still does all its dot products, so on
a machine where one session's decode is already compute-bound the speedup is
capped lower. The routed experts share least: N decode rows land on about
E * (1 - (1 - k/E)^N) experts, so each chosen expert multiplies ~N*k / that
rows (1.08 at 8 sessions of Flash; the table's rows per expert), where a long prefill chunk
gives each several; the prefill rate is therefore no ceiling for batched
decode (docs/performance.md, "Several sessions at once").

--layers L prints the same table for the model with L layers, each layer's
dense and expert bytes those of the file's average layer, the rest (head,
embedding, output norm) unchanged: a small file made with
`ds4-make-model --preset flash --layers 4` then tells the roofline of the
released 43-layer Flash, whose layers have the same shapes. A benchmark
helper: it prints, it never asserts."""
import argparse

from gguf import GGUFReader


def field_value(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]][0]


def weight_bytes(path):
    """(dense bytes outside the layers, dense bytes of the layers, head bytes, embedding bytes per token,
    [(layer, expert bytes)], E, k, vocab)"""
    r = GGUFReader(path)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n_expert = int(field_value(r, f"{arch}.expert_count"))
    n_used = int(field_value(r, f"{arch}.expert_used_count"))
    n_vocab = int(field_value(r, f"{arch}.vocab_size"))
    dense = layer_dense = head = embd_row = 0
    experts = {}
    for t in r.tensors:
        n = int(t.n_bytes)
        if t.name == "token_embd.weight":
            embd_row = n // n_vocab
        elif t.name == "output.weight":
            head = n
        elif "_exps." in t.name:
            layer = int(t.name.split(".")[1])
            experts[layer] = experts.get(layer, 0) + n // n_expert
        elif t.name.startswith("blk."):
            layer_dense += n
        else:
            dense += n
    return dense, layer_dense, head, embd_row, sorted(experts.items()), n_expert, n_used, n_vocab


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--sessions", default="1,2,4,8,16")
    ap.add_argument("--layers", type=int, default=0, help="scale to this many layers like the file's average layer")
    a = ap.parse_args()
    dense, layer_dense, head, embd_row, experts, n_expert, n_used, _ = weight_bytes(a.model)
    per_expert = sum(b for _, b in experts)
    if a.layers:
        scale = a.layers / len(experts)
        layer_dense, per_expert = layer_dense * scale, per_expert * scale
        experts = [(i, per_expert / a.layers) for i in range(a.layers)]
    dense += layer_dense
    print(f"{a.model}{f' scaled to {a.layers} layers' if a.layers else ''}: dense {dense / 2**20:.1f} MiB, "
          f"head {head / 2**20:.1f} MiB, {len(experts)} MoE layers x {n_expert} experts ({n_used} per token), "
          f"one expert of every layer {per_expert / 2**20:.2f} MiB\n")
    print("| sessions | distinct experts per layer | rows per expert | MiB read per step | "
          "MiB per generated token | memory-roofline aggregate vs 1 session |")
    print("|---|---|---|---|---|---|")
    base = None
    for n in (int(x) for x in a.sessions.split(",")):
        distinct = n_expert * (1 - (1 - n_used / n_expert) ** n)
        step = dense + head + n * embd_row + distinct * per_expert
        if base is None:
            base = step / n
        print(f"| {n} | {distinct:.1f} | {n * n_used / distinct:.2f} | {step / 2**20:.1f} | {step / n / 2**20:.1f} | "
              f"{base / (step / n):.2f}x |")


if __name__ == "__main__":
    main()
