#!/usr/bin/env python3
"""A GLM 5.2 GGUF written by llama.cpp's convert_hf_to_gguf.py, tokenizer
included (tests/fixtures/glm_llamacpp, made by
tests/oracles/glm_llamacpp_oracle.py from llama-cpp-python 0.3.36's llama.cpp):

* ds4 loads it with the tokenizer it carries (tokenizer.ggml.pre "glm4")
  and its logits for the fixture's tokens agree with transformers'
  (GlmMoeDsaForCausalLM) at every position to 1e-5 of the logit scale, every
  argmax equal;
* ds4-vocab encodes every case text from that file's tokenizer exactly as
  Hugging Face `tokenizers` does (added tokens matched);
* the same file with tokenizer.ggml.pre "gpt-2" (what a converter that does
  not recognise a tokenizer may write) is refused by ds4 and ds4-vocab with
  one line naming "gpt-2", not read with the wrong splitting rules or
  checked against the DeepSeek vocabulary."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader, GGUFValueType as VT, GGUFWriter

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "convert"))
from harness import check, finish  # noqa: E402

FX = os.path.join(ROOT, "tests", "fixtures", "glm_llamacpp")
MODEL = os.path.join(FX, "model.gguf")


def run(tool, *args):
    return subprocess.run([os.path.join(ROOT, tool), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def with_pre(src, dst, pre):
    """Copies the GGUF src to dst with tokenizer.ggml.pre replaced."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, arch=r.fields["general.architecture"].contents(), endianess=r.endianess)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v = pre if k == "tokenizer.ggml.pre" else f.contents()
        if f.types[0] == VT.ARRAY:
            w.add_key_value(k, v, VT.ARRAY, sub_type=f.types[-1])
        else:
            w.add_key_value(k, v, f.types[0])
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_logits():
    tokens = json.load(open(os.path.join(FX, "tokens")))
    golden = np.fromfile(os.path.join(FX, "logits"), dtype="<f4").reshape(len(tokens), -1)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.json")
        r = run("ds4", "-m", MODEL, "--token-ids", ",".join(map(str, tokens)), "--dump-logits", out,
                "--logits-all", "--numerics", "exact")
        check(r.returncode == 0, f"ds4 on the llama.cpp-converted GLM file: {r.stderr.strip()[-300:]}")
        if r.returncode:
            return
        got = np.array(json.load(open(out))["logits"], dtype=np.float64)
    check(got.shape == golden.shape, f"one row per position: {got.shape} vs {golden.shape}")
    if got.shape != golden.shape:
        return
    scale = np.abs(golden).max()
    diff = np.abs(got - golden).max()
    print(f"llama.cpp-converted GLM: max |ds4 - transformers| {diff:.3g} (max |logit| {scale:.3g}, "
          f"{len(tokens)} positions)")
    check(diff <= 1e-5 * scale, f"logits within 1e-5 of the scale: {diff:.3g}")
    check((got.argmax(1) == golden.argmax(1)).all(), "argmax equal at every position")


def test_tokens():
    cases = [json.loads(line) for line in open(os.path.join(FX, "cases.jsonl"), encoding="utf-8")]
    with tempfile.TemporaryDirectory() as d:
        bad = 0
        for i, c in enumerate(cases):
            path = os.path.join(d, "text")
            with open(path, "wb") as f:
                f.write(c["text"].encode("utf-8"))
            r = run("ds4-vocab", MODEL, "--specials", "all", "--encode-file", path)
            got = [int(x) for x in r.stdout.split()] if r.returncode == 0 else None
            if got != c["ids"]:
                bad += 1
                check(False, f"case {i} {c['text'][:40]!r}: ds4 {got if got is None else got[:12]} "
                             f"!= HF {c['ids'][:12]} ({r.stderr.strip()[-200:]})")
        print(f"{len(cases)} texts encoded from the file's tokenizer, {bad} differ from HF tokenizers")
    check(len(cases) >= 50 and bad == 0, f"{bad} of {len(cases)} texts encode differently")


def test_unknown_pre():
    with tempfile.TemporaryDirectory() as d:
        gpt2 = os.path.join(d, "gpt2.gguf")
        with_pre(MODEL, gpt2, "gpt-2")
        check(GGUFReader(gpt2).fields["tokenizer.ggml.pre"].contents() == "gpt-2", "rewritten pre")
        for tool, args in (("ds4", ["-m", gpt2, "--token-ids", "1,2,3", "--dump-logits", os.path.join(d, "x")]),
                           ("ds4-vocab", [gpt2, "--encode", "hi"])):
            r = run(tool, *args)
            lines = r.stderr.strip().splitlines()
            check(r.returncode != 0 and len(lines) == 1 and '"gpt-2"' in lines[0] and "pre-tokenizer" in lines[0]
                  and "DeepSeek vocabulary" not in lines[0], f"{tool}: one line naming gpt-2: {r.stderr.strip()}")


def main():
    test_logits()
    test_tokens()
    test_unknown_pre()
    finish("test_glm_llamacpp")


if __name__ == "__main__":
    main()
