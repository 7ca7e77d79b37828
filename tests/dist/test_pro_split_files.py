#!/usr/bin/env python3
"""The released V4 Pro Q4 halves, as download_model.sh names them, load and
run as docs/distributed.md's two-host commands do (tiny stand-ins, loopback).

The file names come from `./download_model.sh --dry-run pro-q4-split`. The
stand-ins: a random 61-layer model with Pro's structure at tiny sizes
(ds4-make-model --preset pro, q4 mix) cut into layers 0..30 (with the
embedding) and 31..60 plus the output head by gguf-py, copying every
metadata key and tensor byte for byte and adding no ds4.slice.* keys, as a
split made by a tool that knows nothing of DwarfStar's keys would be. The
engine then finds each file's range from the tensors it holds (model.h):

- coordinator `-m ...Layers00-30.gguf --layers 0:30` and worker
  `-m ...Layers-31-output.gguf --layers 31:output` give every position's
  logits equal, byte for byte, to the single process on the uncut file;
- each half alone refuses a prompt with one line naming its range; a worker
  asking a half for layers it does not hold is refused with one line."""
import os
import re
import subprocess
import sys
import tempfile

from gguf import GGUFReader, GGUFValueType, GGUFWriter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_dist_split as dist  # noqa: E402  (its process helpers: ports, workers, coordinator)

MAKE = os.path.join(dist.ROOT, "ds4-make-model")
TINY_PRO = ["--preset", "pro", "--type", "q4", "--no-vocab", "--vocab_size", "512", "--embedding_length", "256",
            "--attention.head_count", "16", "--attention.key_length", "128", "--attention.value_length", "128",
            "--attention.q_lora_rank", "96", "--attention.output_lora_rank", "64",
            "--attention.output_group_count", "2", "--attention.indexer.head_count", "4",
            "--attention.indexer.top_k", "8", "--expert_count", "6", "--expert_feed_forward_length", "256"]
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)


def release_names():
    r = subprocess.run([os.path.join(dist.ROOT, "download_model.sh"), "--dry-run", "pro-q4-split"],
                       capture_output=True, text=True, cwd=dist.ROOT, env={**os.environ, "HF_TOKEN": "",
                                                                           "HOME": "/nonexistent"})
    return re.findall(r"-> gguf/(\S+\.gguf)", r.stdout)


def cut(src, dst, keep):
    """Copies the metadata and the tensors whose name passes keep()."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch="deepseek4")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = GGUFValueType(f.types[0])
        sub = GGUFValueType(f.types[1]) if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub)
    for t in r.tensors:
        if keep(t.name):
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def layer_of(name):
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def main():
    if not all(os.access(x, os.X_OK) for x in (dist.DS4, MAKE)):
        print("test_pro_split_files: SKIPPED: needs ./ds4 and ./ds4-make-model")
        return 77
    names = release_names()
    check(len(names) == 2 and "Layers00-30" in names[0] and "31-output" in names[1],
          "download_model.sh pro-q4-split names %s" % names)
    if len(names) != 2:
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        whole = os.path.join(tmp, "whole.gguf")
        r = subprocess.run([MAKE, "-o", whole, *TINY_PRO], capture_output=True, text=True, cwd=dist.ROOT)
        check(r.returncode == 0, "ds4-make-model: %s" % r.stderr[-300:])
        first, second = (os.path.join(tmp, n) for n in names)
        cut(whole, first, lambda n: (layer_of(n) is not None and layer_of(n) <= 30) or n == "token_embd.weight")
        cut(whole, second, lambda n: (layer_of(n) or 0) >= 31 or (layer_of(n) is None and n != "token_embd.weight"))
        for f in (first, second):
            check(not any(k.startswith("ds4.") for k in GGUFReader(f).fields), "%s has no ds4.* keys" % f)

        out = os.path.join(tmp, "logits.json")
        args = ["--token-ids", "5,6,7,8,9,10,11,12", "--dump-logits", out, "--logits-all"]
        want = dist.output_of(["-m", whole, *args], out)
        check(not want.startswith(b"exit"), "single process: %s" % want[:200])
        port = dist.free_port()
        worker = dist.start_worker(second, "31:output", port)
        try:
            got = dist.coordinator(first, "0:30", port, args, out)
        finally:
            dist.stop([worker])
        check(got == want, "the halves as a route differ from the uncut file (%s)" % got[:200])

        for f, held in ((first, "holds layers 0..30 only"), (second, "holds layers 31..60 and the output head only")):
            r = dist.ds4(["-m", f, *args])
            check(r.returncode != 0 and held in r.stderr, "%s alone: %s" % (os.path.basename(f), r.stderr.strip()))
        rc, err = dist.exit_of(dist.start_worker(second, "30:output", dist.free_port()))
        check(rc == 1 and "this file holds layers 31..60 and the output head" in err,
              "a wider --layers on the second half: rc %s, %s" % (rc, err.strip()))
    print("test_pro_split_files: %s" % ("ok" if not failures else "%d failed" % failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
