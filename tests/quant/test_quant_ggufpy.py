#!/usr/bin/env python3
"""Live cross-check of src/quant*.c against gguf-py 0.19.0 (an independent
implementation of the block formats), through the pipe modes of
$BUILD/tests/test_quant:

1. type traits equal gguf-py's GGML_QUANT_SIZES and names;
2. our dequantizer equals gguf.quants.dequantize bit for bit on random
   payloads of every type both support;
3. gguf-py decodes the blocks *our quantizers* write to exactly the values we
   decode (Gaussian and degenerate rows, with and without importance);
4. where gguf-py can quantize (F16, BF16, Q8_0) our bytes equal its bytes."""
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

BIN = os.path.join(os.environ.get("BUILD", "build"), "tests", "test_quant")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL", msg)


def run(*args, data=b""):
    return subprocess.run([BIN, *args], input=data, stdout=subprocess.PIPE, check=True).stdout


def ours_quantize(t, rows, imp=None):
    n = rows.shape[1]
    if imp is None:
        return run("--quantize", t.name, str(n), data=rows.astype("<f4").tobytes())
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        f.write(imp.astype("<f4").tobytes())
        f.flush()
        return run("--quantize", t.name, str(n), f.name, data=rows.astype("<f4").tobytes())


def ours_dequantize(t, raw, n):
    return np.frombuffer(run("--dequantize", t.name, str(n), data=raw), dtype="<f4").reshape(-1, n)


def theirs_dequantize(t, raw, n):
    row_bytes = n // GGML_QUANT_SIZES[t][0] * GGML_QUANT_SIZES[t][1]
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, row_bytes)
    return dequantize(blocks, t).reshape(-1, n).astype(np.float32)


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# 1. traits ---------------------------------------------------------------
ours = {}
for line in run("--traits").decode().splitlines():
    tid, name, elems, nbytes = line.split()
    ours[int(tid)] = (name, int(elems), int(nbytes))
for t in T:
    check(t.value in ours, f"type {t.name} unknown to us")
    if t.value not in ours:
        continue
    name, elems, nbytes = ours[t.value]
    check(name == t.name, f"type {t.value}: name {name} vs {t.name}")
    # gguf-py lists Q8_1 as 40 bytes; ggml's struct (and ours) is 36
    if t != T.Q8_1:
        check((elems, nbytes) == GGML_QUANT_SIZES[t], f"{t.name}: size {(elems, nbytes)} vs {GGML_QUANT_SIZES[t]}")

# 2. decoder on random payloads -------------------------------------------
rng = np.random.default_rng(1234)
# byte offsets of the f16 scale fields inside a block; they get finite values
# so both decoders stay in the range where IEEE results are defined the same
SCALE_FIELDS = {T.Q8_0: [0], T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2],
                T.Q5_K: [0, 2], T.Q6_K: [208], T.IQ2_XXS: [0]}


def finite_halves(count):
    h = rng.integers(0, 1 << 16, count, dtype=np.uint32)
    exp = rng.integers(0, 31, count, dtype=np.uint32)   # never 31 (inf/NaN)
    return ((h & 0x83ff) | (exp << 10)).astype("<u2")


for t, offs in SCALE_FIELDS.items():
    elems, nbytes = GGML_QUANT_SIZES[t]
    nblocks, n = 512, elems * 16
    raw = rng.integers(0, 256, (nblocks, nbytes), dtype=np.uint8)
    for off in offs:
        raw[:, off:off + 2] = finite_halves(nblocks).view(np.uint8).reshape(nblocks, 2)
    a = ours_dequantize(t, raw.tobytes(), n)
    b = theirs_dequantize(t, raw.tobytes(), n)
    check(same_bits(a, b), f"{t.name}: dequantize differs from gguf-py on random blocks "
          f"({int(np.sum(a.view(np.uint32) != b.view(np.uint32)))} values)")

# every f16/bf16 bit pattern, NaNs included
all16 = np.arange(1 << 16, dtype="<u2").tobytes()
for t in (T.F16, T.BF16):
    a = ours_dequantize(t, all16, 256)
    b = theirs_dequantize(t, all16, 256)
    check(same_bits(a, b), f"{t.name}: dequantize differs from gguf-py over all 65536 patterns")

# 3. gguf-py decodes our quantizers' blocks as we do ------------------------
n = 1024
gauss = rng.standard_normal((24, n)).astype(np.float32)
special = np.zeros((6, n), np.float32)
special[1] = -0.75
special[2, 300] = 5.0
special[3] = 1e-20 * rng.standard_normal(n)
special[4] = rng.standard_normal(n) * np.where(rng.random(n) < 0.01, 50.0, 1.0)
special[5] = np.abs(rng.standard_normal(n)) + 3.0
rows = np.concatenate([gauss, 1e-3 * gauss[:4], 1e4 * gauss[:4], special])
imp = np.exp(2.0 * rng.standard_normal(n)).astype(np.float32)
for t in (T.Q8_0, T.Q2_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ2_XXS):
    for w in (None, imp):
        raw = ours_quantize(t, rows, w)
        a = ours_dequantize(t, raw, n)
        b = theirs_dequantize(t, raw, n)
        tag = "imatrix" if w is not None else "plain"
        check(same_bits(a, b), f"{t.name} ({tag}): gguf-py decodes our blocks differently")
        check(bool(np.all(np.isfinite(a))), f"{t.name} ({tag}): non-finite output")
        rel = np.sqrt(np.sum((a[:24] - gauss) ** 2) / np.sum(gauss ** 2))
        print(f"  {t.name:8s} {tag:8s} rel.rmse on N(0,1): {rel:.5f}")

# 4. byte-identical quantization where gguf-py has a quantizer ---------------
# Q8_0 blocks whose maximum is 127 (so d = 1) and whose other values sit
# exactly halfway between integers: round-away vs round-even would differ
tie_block = np.concatenate([[127.0], np.arange(-15.5, 15.0, 1.0)]).astype(np.float32)
ties = np.tile(tie_block, n // 32)
q8rows = np.concatenate([rows, ties[None, :], -ties[None, :], 1e-30 * gauss[:2]])
for t in (T.F16, T.BF16, T.Q8_0):
    ours_raw = ours_quantize(t, q8rows)
    with np.errstate(over="ignore"):   # 1e4-scaled rows overflow f16 on purpose
        theirs_raw = quantize(q8rows, t).tobytes()
    check(ours_raw == theirs_raw, f"{t.name}: our blocks differ from gguf-py's quantize")

# float conversions on awkward values: ties, overflow, subnormals, inf, NaN
bits = np.concatenate([
    rng.integers(0, 1 << 32, 4096 * 8, dtype=np.uint64).astype(np.uint32),
    (np.arange(0x33000000, 0x33000000 + 4096 * 4, 1, dtype=np.uint32)),
    np.array([0x477fefff, 0x477ff000, 0x477ff001, 0x7f800000, 0xff800000,
              0x7fc00000, 0x7f800001, 0xffffffff, 0x3f808000, 0x3f818000] * 128, dtype=np.uint32),
]).astype("<u4")
vals = bits.view(np.float32).reshape(-1, 256)
for t in (T.F16, T.BF16):
    ours_raw = np.frombuffer(ours_quantize(t, vals), dtype="<u2")
    with np.errstate(over="ignore", invalid="ignore"):
        theirs_raw = quantize(vals, t).view("<u2").reshape(-1)
    nan_in = np.isnan(vals.reshape(-1))
    # NaN payload propagation is not part of the contract, only NaN-ness
    same = (ours_raw == theirs_raw) | (nan_in & ((ours_raw & 0x7fff) > (0x7c00 if t == T.F16 else 0x7f80)))
    check(bool(np.all(same)), f"{t.name}: conversion differs from gguf-py on {int(np.sum(~same))} values")

print(f"test_quant_ggufpy: {len(failures)} failures")
sys.exit(1 if failures else 0)
