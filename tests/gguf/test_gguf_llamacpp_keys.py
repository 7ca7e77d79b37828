#!/usr/bin/env python3
"""Files written by ds4-make-model carry every metadata key with the GGUF type
llama.cpp's deepseek4 loader accepts, read back with gguf-py.

The table below is llama.cpp's, not ours. Source: the llama.cpp tree vendored
in llama-cpp-python 0.3.36 (llama.cpp commit 0c1e5709), read with the `fetch`
tool's sibling `pip download --no-deps --no-binary :all: llama-cpp-python`:
- src/llama-model.cpp llama_model_base::load_hparams and
  src/models/deepseek4.cpp load_arch_hparams list the keys the loader reads;
- src/llama-hparams.h gives each destination field's C type, and
  src/llama-model-loader.cpp GKV<T> accepts a scalar only when its GGUF type is
  exactly that C type's (uint32_t -> UINT32, float -> FLOAT32, bool -> BOOL);
  get_arr / get_key_or_arr accept UINT32 or INT32 elements for uint32 arrays,
  FLOAT32 for float arrays, and get_key_or_arr needs exactly block_count
  entries;
- src/llama-vocab.cpp: token_type must be an INT32 array, the special ids and
  add_* flags go through get_key as uint32_t / bool;
- src/llama-model-loader.cpp reads general.file_type as uint32_t.
Keys llama.cpp does not read (ds4's YaRN betas) use the type gguf-py's
GGUFWriter.add_rope_scaling_yarn_beta_* writes (FLOAT32).
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

from gguf import GGUFReader, GGUFValueType as VT

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "convert"))
from harness import check, finish  # noqa: E402

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MAKE = os.path.join(ROOT, "ds4-make-model")

U32, F32, BOOL, STR = {VT.UINT32}, {VT.FLOAT32}, {VT.BOOL}, {VT.STRING}
U32_ARR = ("array", {VT.UINT32, VT.INT32})
F32_ARR = ("array", {VT.FLOAT32})
U32_OR_ARR = ("scalar-or-array", {VT.UINT32})

A = "deepseek4."
LLAMACPP_TYPES = {
    "general.architecture": STR,
    "general.name": STR,
    "general.file_type": U32,
    "general.quantization_version": U32,
    A + "context_length": U32,
    A + "embedding_length": U32,
    A + "block_count": U32,
    A + "vocab_size": U32,
    A + "nextn_predict_layers": U32,
    A + "expert_count": U32,
    A + "expert_used_count": U32_OR_ARR,
    A + "attention.head_count": U32_OR_ARR,
    A + "attention.head_count_kv": U32_OR_ARR,
    A + "attention.key_length": U32,
    A + "attention.value_length": U32,
    A + "rope.dimension_count": U32,
    A + "rope.freq_base": F32,
    A + "rope.scaling.type": STR,
    A + "rope.scaling.factor": F32,
    A + "rope.scaling.original_context_length": U32,
    A + "rope.scaling.yarn_beta_fast": F32,
    A + "rope.scaling.yarn_beta_slow": F32,
    A + "attention.layer_norm_rms_epsilon": F32,
    A + "attention.q_lora_rank": U32,
    A + "attention.sliding_window": U32,
    A + "expert_feed_forward_length": U32_OR_ARR,
    A + "expert_shared_count": U32,
    A + "expert_weights_scale": F32,
    A + "expert_weights_norm": BOOL,
    A + "swiglu_clamp_exp": F32_ARR,
    A + "swiglu_clamp_shexp": F32_ARR,
    A + "attention.indexer.head_count": U32,
    A + "attention.indexer.key_length": U32,
    A + "attention.indexer.top_k": U32,
    A + "attention.output_group_count": U32,
    A + "attention.output_lora_rank": U32,
    A + "attention.compress_rope_freq_base": F32,
    A + "attention.compress_ratios": U32_ARR,
    A + "hyper_connection.count": U32,
    A + "hyper_connection.sinkhorn_iterations": U32,
    A + "hyper_connection.epsilon": F32,
    A + "hash_layer_count": U32,
    A + "expert_gating_func": U32,
    "tokenizer.ggml.model": STR,
    "tokenizer.ggml.pre": STR,
    "tokenizer.ggml.tokens": ("array", {VT.STRING}),
    "tokenizer.ggml.token_type": ("array", {VT.INT32}),
    "tokenizer.ggml.merges": ("array", {VT.STRING}),
    "tokenizer.ggml.bos_token_id": U32,
    "tokenizer.ggml.eos_token_id": U32,
    "tokenizer.ggml.add_bos_token": BOOL,
    "tokenizer.ggml.add_eos_token": BOOL,
    "tokenizer.chat_template": STR,
}

# sha256 of models/templates/deepseek-ai-DeepSeek-V4.jinja in that llama.cpp
# tree: the template its converter embeds in DeepSeek-V4 GGUFs.
V4_TEMPLATE_SHA256 = "7bd4fbdf0c06cd7398ddb6913de6e4a5839b9d06569e74e5b2ec246b375ca9c9"

# llama_ftype (include/llama.h) by mix: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0,
# MOSTLY_IQ2_XXS, MOSTLY_Q4_K_M.
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "q2": 19, "q4": 15}

GLUE = "\u2581"
SPECIALS = ["<\uff5cbegin" + GLUE + "of" + GLUE + "sentence\uff5c>",
            "<\uff5cend" + GLUE + "of" + GLUE + "sentence\uff5c>",
            "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>", "<think>", "</think>", "\uff5cDSML\uff5c"]


def tiny_tokenizer(path, n_vocab):
    """A tokenizer.json with the 256 byte-level pieces and the seven
    chat-protocol tokens the engine requires, one merge, padded to n_vocab
    ids with made-up pieces."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or 0xae <= b <= 0xff]
    shifted = [b for b in range(256) if b not in printable]
    byte_piece = {b: chr(b) for b in printable} | {b: chr(0x100 + i) for i, b in enumerate(shifted)}
    vocab = {byte_piece[b]: b for b in range(256)}
    vocab["ab"] = 256
    vocab |= {f"t{i}": i for i in range(257, n_vocab - len(SPECIALS))}
    added = [{"id": len(vocab) + i, "content": s, "special": True} for i, s in enumerate(SPECIALS)]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(ensure_ascii=False, obj={"model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]}, "added_tokens": added}, fp=f)


def make(out, *args):
    r = subprocess.run([MAKE, "-o", out, "--preset", "demo", *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        print(r.stderr)
        raise SystemExit("ds4-make-model failed")
    return GGUFReader(out)


def check_types(reader, tag):
    n_layer = int(reader.fields[A + "block_count"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        want = LLAMACPP_TYPES.get(key)
        check(want is not None, f"{tag}: key {key} is not in llama.cpp's table")
        if want is None:
            continue
        got = field.types
        if isinstance(want, set):
            check(len(got) == 1 and got[0] in want, f"{tag}: {key} is {got}, llama.cpp needs {want}")
            continue
        shape, elems = want
        if shape == "scalar-or-array" and len(got) == 1:
            check(got[0] in elems, f"{tag}: {key} is {got}, llama.cpp needs {elems}")
            continue
        check(len(got) == 2 and got[0] == VT.ARRAY and got[1] in elems,
              f"{tag}: {key} is {got}, llama.cpp needs an array of {elems}")
        if key.startswith(A):
            check(len(field.data) == n_layer, f"{tag}: {key} has {len(field.data)} entries for {n_layer} layers")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        tok = os.path.join(tmp, "tokenizer.json")
        tiny_tokenizer(tok, 129280)
        for mix in ("q2", "q8_0"):
            r = make(os.path.join(tmp, mix + ".gguf"), "--type", mix, "--layers", "3",
                     "--vocab", tok, "--vocab-added", "")
            check_types(r, mix)
            for key in LLAMACPP_TYPES:
                check(key in r.fields, f"{mix}: {key} missing")
            check(int(r.fields["general.file_type"].contents()) == FILE_TYPE[mix], f"{mix}: file_type")
            tmpl = r.fields["tokenizer.chat_template"].contents()
            check(hashlib.sha256(tmpl.encode("utf-8")).hexdigest() == V4_TEMPLATE_SHA256,
                  f"{mix}: chat template is not the V4 one")
            check(r.fields[A + "context_length"].contents() == 1048576, f"{mix}: context_length value")
    finish("gguf llama.cpp key types")


if __name__ == "__main__":
    main()
