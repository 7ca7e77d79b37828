#!/usr/bin/env python3
"""Our GGUF writer checked by gguf-py's reader (an independent implementation).

`$BUILD/tests/test_gguf --copy IN OUT` re-writes a gguf-py-written fixture
with ds4_gguf_writer (half of the tensors through the fill callback). gguf-py
must read back the same keys, value types, values and tensors, and since both
writers pack the same way the files must be byte-identical. Also checks that
./ds4-gguf-dump lists every key and tensor gguf-py sees.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("BUILD", "build")
TEST_BIN = os.path.join(ROOT, BUILD, "tests", "test_gguf")
DUMP_BIN = os.path.join(ROOT, "ds4-gguf-dump")
ALL_TYPES = os.path.join(ROOT, "tests", "fixtures", "gguf", "all_types.gguf")
SPLIT = os.path.join(ROOT, "tests", "fixtures", "gguf", "split-00002-of-00003.gguf")

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


def fields(reader):
    return {k: (f.types, f.contents()) for k, f in reader.fields.items()}


def compare(src_path, out_path):
    a, b = GGUFReader(src_path), GGUFReader(out_path)
    fa, fb = fields(a), fields(b)
    check(list(fa) == list(fb), f"{src_path}: key order {list(fa)} != {list(fb)}")
    for k in fa:
        if k in fb:
            check(fa[k] == fb[k], f"{src_path}: key {k}: {fa[k]} != {fb[k]}")
    check(a.alignment == b.alignment, f"alignment {a.alignment} != {b.alignment}")
    check(len(a.tensors) == len(b.tensors), "tensor count")
    for ta, tb in zip(a.tensors, b.tensors):
        same = (ta.name == tb.name and ta.tensor_type == tb.tensor_type
                and list(ta.shape) == list(tb.shape) and ta.n_bytes == tb.n_bytes
                and ta.data_offset == tb.data_offset
                and np.array_equal(np.asarray(ta.data).view(np.uint8), np.asarray(tb.data).view(np.uint8)))
        check(same, f"{src_path}: tensor {ta.name} differs")
    with open(src_path, "rb") as fa_, open(out_path, "rb") as fb_:
        check(fa_.read() == fb_.read(), f"{src_path}: our copy is not byte-identical to gguf-py's file")


def check_dump(path, first_shard):
    """Metadata comes from the first shard; tensors of `path` must be listed."""
    out = subprocess.run([DUMP_BIN, path], capture_output=True, text=True)
    check(out.returncode == 0, f"ds4-gguf-dump {path}: rc {out.returncode}: {out.stderr}")
    lines = out.stdout.splitlines()
    keys = [k for k in GGUFReader(first_shard).fields if not k.startswith("GGUF.")]
    r = GGUFReader(path)
    listed = [ln.split()[0] for ln in lines if ln.startswith("  ")]
    check(listed[:len(keys)] == keys, f"dump keys {listed[:len(keys)]} != {keys}")
    for t in r.tensors:
        head = f"{t.name} {t.tensor_type.name} {[int(x) for x in t.shape]} {t.n_bytes} bytes"
        tail = f"@ {t.data_offset}"
        check(any(" ".join(ln.split()).startswith(head) and ln.endswith(tail) for ln in lines),
              f"dump of {path} lacks a tensor line '{head} ... {tail}'")


def main():
    for exe in (TEST_BIN, DUMP_BIN):
        if not os.access(exe, os.X_OK):
            print(f"missing {exe} (run make test / make BUILD={BUILD})", file=sys.stderr)
            return 1
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "copy.gguf")
        r = subprocess.run([TEST_BIN, "--copy", ALL_TYPES, out], capture_output=True, text=True)
        check(r.returncode == 0, f"--copy: {r.stderr.strip()}")
        if r.returncode == 0:
            compare(ALL_TYPES, out)
    check_dump(ALL_TYPES, ALL_TYPES)
    check_dump(SPLIT, SPLIT.replace("00002-of", "00001-of"))
    for f in failures:
        print("FAIL", f)
    print(f"test_gguf_pyread: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
