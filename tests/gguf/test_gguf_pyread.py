#!/usr/bin/env python3
"""Our GGUF writer checked by gguf-py's reader (an independent implementation).

`$BUILD/tests/test_gguf --copy IN OUT` reads a gguf-py-written file with our
reader and re-writes it with ds4_gguf_writer (half of the tensors through the
fill callback). gguf-py must read back the same keys, value types, values and
tensors, and since both writers pack the same way the files must be
byte-identical. Inputs: the committed fixture plus files gguf-py writes here
from a seeded RNG (random value types, arrays, alignments, tensor types and
shapes). Also checks that ./ds4-gguf-dump lists every key and tensor gguf-py
sees.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGUFReader, GGUFValueType as VT, GGMLQuantizationType as QT

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


INT_RANGES = {VT.UINT8: (0, 2**8), VT.INT8: (-2**7, 2**7), VT.UINT16: (0, 2**16),
              VT.INT16: (-2**15, 2**15), VT.UINT32: (0, 2**32), VT.INT32: (-2**31, 2**31),
              VT.UINT64: (0, 2**64), VT.INT64: (-2**63, 2**63)}
# raw-byte tensor types: (elements per block, bytes per block)
RAW_TYPES = {QT.Q8_0: (32, 34), QT.Q4_K: (256, 144), QT.Q2_K: (256, 84), QT.IQ2_XXS: (256, 66),
             QT.BF16: (1, 2), QT.Q6_K: (256, 210)}
NUMPY_TYPES = [np.float32, np.float16, np.int32, np.int8, np.int16, np.int64, np.float64]


def random_value(rng, vt):
    if vt in INT_RANGES:
        lo, hi = INT_RANGES[vt]
        return int(rng.integers(lo, hi, dtype=np.int64 if hi <= 2**63 else np.uint64))
    if vt == VT.FLOAT32:
        return float(np.float32(rng.normal() * 10.0 ** rng.integers(-30, 30)))
    if vt == VT.FLOAT64:
        return float(rng.normal() * 10.0 ** rng.integers(-300, 300))
    if vt == VT.BOOL:
        return bool(rng.integers(0, 2))
    # strings: any non-NUL code points, including empty ones
    return "".join(chr(int(c)) for c in rng.integers(1, 0x2FF, size=int(rng.integers(0, 12))))


def random_file(rng, path):
    w = gguf.GGUFWriter(path, "rand")
    align = int(2 ** rng.integers(0, 9))
    if align != 32:
        w.add_custom_alignment(align)
    scalar_types = list(INT_RANGES) + [VT.FLOAT32, VT.FLOAT64, VT.BOOL, VT.STRING]
    for k in range(int(rng.integers(0, 25))):
        vt = scalar_types[int(rng.integers(len(scalar_types)))]
        if rng.integers(0, 2):
            vals = [random_value(rng, vt) for _ in range(int(rng.integers(1, 40)))]
            w.add_key_value(f"r.k{k}.arr", vals, VT.ARRAY, sub_type=vt)
        else:
            w.add_key_value(f"r.k{k}", random_value(rng, vt), vt)
    for t in range(int(rng.integers(0, 8))):
        n_dims = int(rng.integers(1, 5))
        outer = [int(x) for x in rng.integers(1, 4, size=n_dims - 1)]
        if rng.integers(0, 2):
            qt = list(RAW_TYPES)[int(rng.integers(len(RAW_TYPES)))]
            blk, nbytes = RAW_TYPES[qt]
            row = int(rng.integers(1, 3)) * nbytes
            data = rng.integers(0, 256, size=outer[::-1] + [row], dtype=np.uint8)
            w.add_tensor(f"r.t{t}", data, raw_dtype=qt)
        else:
            dt = NUMPY_TYPES[int(rng.integers(len(NUMPY_TYPES)))]
            data = (rng.normal(size=outer[::-1] + [int(rng.integers(1, 9))]) * 100).astype(dt)
            w.add_tensor(f"r.t{t}", data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def check_copy(src, out):
    r = subprocess.run([TEST_BIN, "--copy", src, out], capture_output=True, text=True)
    check(r.returncode == 0, f"--copy {src}: {r.stderr.strip()}")
    if r.returncode == 0:
        compare(src, out)


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
        check_copy(ALL_TYPES, os.path.join(tmp, "copy.gguf"))
        rng = np.random.default_rng(1234)
        for i in range(30):
            src = os.path.join(tmp, f"rand{i}.gguf")
            random_file(rng, src)
            check_copy(src, os.path.join(tmp, f"rand{i}.copy.gguf"))
    check_dump(ALL_TYPES, ALL_TYPES)
    check_dump(SPLIT, SPLIT.replace("00002-of", "00001-of"))
    for f in failures:
        print("FAIL", f)
    print(f"test_gguf_pyread: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
