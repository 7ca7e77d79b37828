"""Disk KV cache files whose CRC is valid but whose payload no session may
hold are refused, on the demo model.

A server saves the cache of a first turn and stops (shutdown snapshot). A
server without a cache answers the second turn: the reference. An intact
copy of the cache gives a disk hit and the reference's logprobs (the hit path
is live). Then every file of a copy is rewritten, CRC recomputed as the KVC
layout says (tests/server/test_kv_restart.py reads it the same way), with
one of: NaN in the logits, +Inf in the first layer row, 3e38 in the middle of
the rows, a token id changed to another id inside the vocabulary, a token id
equal to the vocabulary size. Each time the server stays up, logs why it
refused the file, serves no disk hit and answers with the reference's
logprobs (a normal prefill)."""
import glob
import json
import math
import os
import shutil
import struct
import tempfile
import zlib

from server_helper import Results, Server, demo_model_or_skip

NAME = "test_kv_refused"
FLAGS = ["--kv-cache-min-tokens", "16", "--kv-cache-boundary-trim-tokens", "4", "--kv-cache-boundary-align-tokens",
         "16", "--kv-disk-space-mb", "64"]
SYSTEM = "You are a careful assistant. Answer in one short sentence and never invent facts. " * 4
TURN1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour of the sky."}]


def ask(srv, messages):
    st, _, body = srv.request("POST", "/v1/chat/completions", {
        "model": "m", "messages": messages, "thinking": False, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2})
    assert st == 200, f"status {st}: {body[:300]!r}"
    return json.loads(body)


def lps(r):
    return [(c["token"], c["logprob"]) for c in r["choices"][0]["logprobs"]["content"]]


def rewrite(path, kind):
    """Alters the payload of one KVC file and recomputes its CRC trailer."""
    b = bytearray(open(path, "rb").read())
    (tlen,) = struct.unpack_from("<I", b, 48)
    off = 52 + tlen
    assert b[off:off + 4] == b"DSV4"
    f = struct.unpack_from("<13I", b, off)
    n_tok, n_layer, n_vocab = f[7], f[8], f[11]
    (payload,) = struct.unpack_from("<Q", b, 40)
    toks = off + 52
    logits = toks + 4 * n_tok
    rows = logits + 4 * (n_vocab + 2 * n_layer)
    end = off + payload
    if kind == "nan-logits":
        struct.pack_into("<f", b, logits + 4 * 3, math.nan)
    elif kind == "inf-rows":
        struct.pack_into("<f", b, rows, math.inf)
    elif kind == "3e38-rows":
        struct.pack_into("<f", b, rows + (end - rows) // 8 * 4, 3e38)
    elif kind == "token-other":
        (t,) = struct.unpack_from("<I", b, toks + 4 * 5)
        struct.pack_into("<I", b, toks + 4 * 5, 100 if t != 100 else 101)
    elif kind == "token-range":
        struct.pack_into("<I", b, toks + 4 * 5, n_vocab)
    trailer = len(b) - 8
    assert b[trailer:trailer + 4] == b"KCK\x01"
    z = bytearray(b[:trailer])
    z[12:16] = bytes(4)
    z[32:40] = bytes(8)
    struct.pack_into("<I", b, trailer + 4, zlib.crc32(bytes(z)))
    open(path, "wb").write(bytes(b))


WHY = {"nan-logits": "logit", "inf-rows": "rows hold", "3e38-rows": "rows hold",
       "token-other": "do not decode to its key text", "token-range": "outside the vocabulary"}


def main():
    demo_model_or_skip(NAME)
    t = Results(NAME)
    tmp = tempfile.mkdtemp(prefix="ds4-kvrefused-")
    saved = os.path.join(tmp, "saved")
    try:
        s = Server("--kv-disk-dir", saved, *FLAGS)
        try:
            first = ask(s, TURN1)
        finally:
            s.stop()
        turn2 = TURN1 + [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                         {"role": "user", "content": "And the colour of grass?"}]
        t.check(len(glob.glob(os.path.join(saved, "*.kv"))) > 0, "the first server saved cache files")
        ref_srv = Server()
        try:
            ref = lps(ask(ref_srv, turn2))
        finally:
            ref_srv.stop()
        t.check(len(ref) > 0, "reference logprobs")

        for kind in ["intact"] + list(WHY):
            d = os.path.join(tmp, kind)
            shutil.copytree(saved, d)
            if kind != "intact":
                for p in glob.glob(os.path.join(d, "*.kv")):
                    rewrite(p, kind)
            srv = Server("--kv-disk-dir", d, *FLAGS)
            try:
                got = ask(srv, turn2)
                again = ask(srv, turn2)
            except (OSError, AssertionError) as e:
                t.check(False, f"{kind}: request failed ({e!r}), server {'up' if srv.alive() else 'gone'}")
                srv.stop()
                continue
            try:
                t.check(srv.alive(), f"{kind}: the server stays up")
                trace = srv.trace_text()
                log = open(srv.log.name, encoding="utf-8", errors="replace").read()
            finally:
                srv.stop()
            t.check(lps(got) == ref, f"{kind}: answer differs from the uncached one:\n{lps(got)}\n{ref}")
            t.check(lps(again) == ref, f"{kind}: second answer differs from the uncached one")
            if kind == "intact":
                t.check("kv-disk: hit" in trace, "intact copy: the disk hit path is exercised")
                continue
            t.check("kv-disk: hit" not in trace, f"{kind}: a refused file was used")
            lines = [ln for ln in log.splitlines() if "kv-disk:" in ln and WHY[kind] in ln]
            t.check(len(lines) > 0, f"{kind}: no log line saying why the file was refused:\n{log[-1500:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    t.done()


if __name__ == "__main__":
    main()
