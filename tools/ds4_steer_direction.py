#!/usr/bin/env python3
"""Builds a directional-steering file from two prompt sets (docs/steering.md).

    tools/ds4_steer_direction.py -m MODEL.gguf --good-file G --bad-file B \\
        [--component ffn_out|attn_out] [--out OUT] [--ds4 ./ds4] [-- extra ds4 options]

Runs `ds4 --dump-activations` on each set (one prompt per line, each rendered
as a chat turn), then writes for every layer l the unit vector
normalise(mean_bad[l] - mean_good[l]) as OUT.f32 (n_layer x n_embd
little-endian f32, what --dir-steering-file reads) and OUT.json (the model,
the sets, the component, the shape and each layer's difference norm). A
layer whose two means are equal gets a zero row (steering leaves it alone).
With the result, a positive --dir-steering-ffn (or -attn, for attn_out)
removes the "bad" component, a negative one adds it.

Standard library only, so it runs wherever ds4 does.
"""
import argparse
import array
import json
import math
import os
import re
import subprocess
import sys
import tempfile


def dump(ds4, model, prompts, component, extra, out):
    cmd = [ds4, "-m", model, "--prompt-file", prompts, "--dump-activations", out,
           "--activation-component", component, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        last = r.stderr.strip().splitlines()[-1:] or ["(no message)"]
        sys.exit(f"ds4_steer_direction: {' '.join(cmd)} failed: {last[0]}")
    shape = re.search(r"(\d+) layers x (\d+) ->", r.stderr)
    a = array.array("f")
    with open(out, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    if not shape or int(shape[1]) * int(shape[2]) != len(a):
        sys.exit(f"ds4_steer_direction: {out}: ds4 reported no shape matching {len(a)} values")
    return a, int(shape[1]), int(shape[2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--good-file", required=True, help="prompts showing the behaviour to keep, one per line")
    ap.add_argument("--bad-file", required=True, help="prompts showing the behaviour to steer away from")
    ap.add_argument("--component", choices=("ffn_out", "attn_out"), default="ffn_out")
    ap.add_argument("--out", default="direction", help="writes OUT.f32 and OUT.json (default: direction)")
    ap.add_argument("--ds4", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ds4"))
    ap.add_argument("extra", nargs="*", help="after --: more ds4 options (-t, -c, --numerics ...)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        good, n_layer, n_embd = dump(args.ds4, args.model, args.good_file, args.component, args.extra,
                                     os.path.join(d, "good.f32"))
        bad = dump(args.ds4, args.model, args.bad_file, args.component, args.extra, os.path.join(d, "bad.f32"))[0]
    total = n_layer * n_embd
    out = array.array("f", bytes(4 * total))
    norms = []
    for l in range(n_layer):
        row = [bad[l * n_embd + i] - good[l * n_embd + i] for i in range(n_embd)]
        norm = math.sqrt(math.fsum(x * x for x in row))
        norms.append(norm)
        if norm > 0:
            for i, x in enumerate(row):
                out[l * n_embd + i] = x / norm
    if sys.byteorder != "little":
        out.byteswap()
    with open(args.out + ".f32", "wb") as f:
        out.tofile(f)
    desc = {"model": os.path.basename(args.model), "component": args.component, "good_file": args.good_file,
            "bad_file": args.bad_file, "n_layer": n_layer, "n_embd": n_embd, "difference_norms": norms,
            "use": f"--dir-steering-file {args.out}.f32 --dir-steering-{args.component.split('_')[0]} S "
                   "(S > 0 removes the bad-file direction, S < 0 adds it)"}
    with open(args.out + ".json", "w") as f:
        json.dump(desc, f, indent=1)
        f.write("\n")
    print(f"{args.out}.f32: {n_layer} layers x {n_embd}, {args.component}, bad minus good, unit rows")


if __name__ == "__main__":
    main()
