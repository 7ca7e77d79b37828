"""Minimal numpy safetensors reader/writer for the converter tests (an
independent implementation of the format: 8-byte little-endian header length,
JSON header, raw little-endian data)."""
import json
import os
import struct

import numpy as np

# dtype name -> (numpy storage dtype, decoder to float32 or None for ints)
_STORAGE = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "F8_E4M3": np.uint8, "F8_E8M0": np.uint8, "I8": np.int8, "U8": np.uint8,
    "I16": np.int16, "I32": np.int32, "I64": np.int64,
    "F4": np.uint8,  # two E2M1 values per byte; the header shape counts values
}


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def e4m3_to_f32(codes):
    """FP8 E4M3 ("fn": no infinities, 0x7f/0xff NaN), written from the format
    definition: bias 7, 3 mantissa bits, subnormals at exponent 0."""
    c = codes.astype(np.int64)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 15
    m = c & 7
    val = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7))
    val = np.where((e == 15) & (m == 7), np.nan, val)
    return (sign * val).astype(np.float32)


def e8m0_to_f32(codes):
    return np.where(codes == 255, np.nan, 2.0 ** (codes.astype(np.float64) - 127)).astype(np.float32)


FP4_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def read(path):
    """Returns {name: (dtype_name, shape, raw numpy array in storage dtype)}."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    data = memoryview(buf)[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        shape = list(e["shape"])
        if e["dtype"] == "F4":
            shape[-1] //= 2
        arr = np.frombuffer(data[b:end], dtype=_STORAGE[e["dtype"]]).reshape(shape)
        out[name] = (e["dtype"], tuple(e["shape"]), arr)
    return out


def read_dir(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        files = sorted(set(json.load(open(idx))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for f in files:
        out.update(read(os.path.join(d, f)))
    return out


def to_f32(entry):
    dtype, _, arr = entry
    if dtype == "BF16":
        return bf16_to_f32(arr)
    if dtype == "F8_E4M3":
        return e4m3_to_f32(arr)
    if dtype == "F8_E8M0":
        return e8m0_to_f32(arr)
    return arr.astype(np.float32)


def write(path, tensors):
    """tensors: {name: (dtype_name, numpy array already in storage dtype)};
    F4 arrays hold the packed bytes (the header shape doubles the last dim)."""
    header, blobs, off = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        shape = list(arr.shape)
        if dtype == "F4":
            shape[-1] *= 2
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
