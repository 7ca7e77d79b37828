#!/usr/bin/env python3
"""ds4-convert --layers writes layer-range files (src/models/dsv4/ds4_layout.h), read back
with gguf-py and run through a real route:

- the oracle checkpoint (tests/fixtures/ds4tiny/A, 6 layers) converted whole
  and as the pair 0:2 + 3:output: each piece carries ds4.slice.* keys naming
  its range and the whole model's deepseek4.* keys; every tensor it holds is
  byte-identical to the whole file's, each tensor of the whole file is in
  exactly one piece (embedding with layer 0, output head with "output");
- the pair chained as separate processes (a coordinator on the first file,
  a worker on the second, loopback) gives every position's logits equal to
  the single process on the whole file, byte for byte;
- a piece alone refuses a prompt with one line, and a range past the model's
  layers or a GLM checkpoint is refused by the converter."""
import json
import os
import subprocess
import sys
import tempfile

from gguf import GGUFReader

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "dist"))
from harness import check, finish  # noqa: E402
import test_dist_split as dist  # noqa: E402  (its process helpers: ports, workers, coordinator)

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CONVERT = os.path.join(ROOT, "ds4-convert")
FIX_A = os.path.join(ROOT, "tests", "fixtures", "ds4tiny", "A")
FIX_GLM = os.path.join(ROOT, "tests", "fixtures", "glmtiny", "A")


def convert(out, *extra):
    return subprocess.run([CONVERT, FIX_A, out, "--type", "f32", "--name", "ds4tiny-A", "--threads", "1", *extra],
                          capture_output=True, text=True, cwd=ROOT)


def fields(r, prefix):
    return {k: f.contents() for k, f in r.fields.items() if k.startswith(prefix)}


def layer_of(name):
    return int(name.split(".")[1]) if name.startswith("blk.") else None


def check_piece(whole, piece, first, last, output, tag):
    slice_keys = fields(piece, "ds4.slice.")
    check(slice_keys == {"ds4.slice.first_layer": first, "ds4.slice.last_layer": last, "ds4.slice.output": output},
          f"{tag}: slice keys {slice_keys}")
    check(fields(piece, "deepseek4.") == fields(whole, "deepseek4."), f"{tag}: deepseek4.* keys differ from the whole")
    check("ds4.slice.first_layer" not in whole.fields, "the whole file has no slice keys")
    by_name = {t.name: t for t in whole.tensors}
    names = []
    for t in piece.tensors:
        names.append(t.name)
        w = by_name.get(t.name)
        l = layer_of(t.name)
        inside = (first <= l <= last) if l is not None else (first == 0 if t.name == "token_embd.weight" else output)
        check(inside, f"{tag} holds {t.name}")
        check(w is not None and w.tensor_type == t.tensor_type and list(w.shape) == list(t.shape)
              and bytes(w.data) == bytes(t.data), f"{tag}: {t.name} differs from the whole file's")
    return names


def main():
    for exe in (CONVERT, dist.DS4):
        if not os.access(exe, os.X_OK):
            print(f"test_convert_slices: SKIPPED: {exe} not built")
            return 77
    with tempfile.TemporaryDirectory() as tmp:
        whole_path = os.path.join(tmp, "whole.gguf")
        pieces = [("0:2", 0, 2, False), ("3:output", 3, 5, True)]
        r = convert(whole_path)
        check(r.returncode == 0, f"whole conversion: {r.stderr[-300:]}")
        paths = []
        for arg, *_ in pieces:
            paths.append(os.path.join(tmp, "A-%s.gguf" % arg.replace(":", "-")))
            r = convert(paths[-1], "--layers", arg)
            check(r.returncode == 0, f"--layers {arg}: {r.stderr[-300:]}")
        whole = GGUFReader(whole_path)
        held = []
        for (arg, first, last, output), p in zip(pieces, paths):
            held += check_piece(whole, GGUFReader(p), first, last, output, f"--layers {arg}")
        check(sorted(held) == sorted(t.name for t in whole.tensors),
              "the pieces together hold each tensor of the whole file exactly once")

        # the pair as a route equals the single process on the whole file
        out = os.path.join(tmp, "logits.json")
        with open(os.path.join(FIX_A, "tokens")) as f:
            tokens = json.load(f)[:24]
        args = ["--token-ids", ",".join(map(str, tokens)), "--dump-logits", out, "--logits-all"]
        want = dist.output_of(["-m", whole_path, *args], out)
        check(not want.startswith(b"exit"), f"single process: {want[:200]}")
        port = dist.free_port()
        worker = dist.start_worker(paths[1], "3:output", port)
        try:
            got = dist.coordinator(paths[0], "0:2", port, args, out)
        finally:
            dist.stop([worker])
        check(got == want, "converted pair as a route differs from the whole file (%s)" % got[:200])

        r = dist.ds4(["-m", paths[1], *args])
        check(r.returncode != 0 and "holds layers 3..5 and the output head only" in r.stderr,
              f"a piece alone: rc {r.returncode}, {r.stderr.strip()[-200:]}")
        r = convert(os.path.join(tmp, "bad.gguf"), "--layers", "4:6")
        check(r.returncode == 1 and "--layers 4:6: the model has layers 0..5" in r.stderr,
              f"range past the model: {r.stderr}")
        r = convert(os.path.join(tmp, "bad.gguf"), "--layers", "4")
        check(r.returncode == 1 and "expected A:B" in r.stderr, f"malformed range: {r.stderr}")
        r = subprocess.run([CONVERT, FIX_GLM, os.path.join(tmp, "g.gguf"), "--type", "f32", "--layers", "0:1"],
                           capture_output=True, text=True, cwd=ROOT)
        check(r.returncode == 1 and "GLM files are written whole" in r.stderr, f"GLM range: {r.stderr}")
    finish("test_convert_slices")


if __name__ == "__main__":
    sys.exit(main())
