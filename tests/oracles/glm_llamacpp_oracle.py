#!/usr/bin/env python3
"""Regenerates tests/fixtures/glm_llamacpp: a tiny random GLM 5.2 model with a
GLM-form tokenizer, converted to GGUF by llama.cpp's own convert_hf_to_gguf.py
(the way GLM GGUFs are commonly made), plus what Hugging Face computes for it.

Needs torch + transformers (GlmMoeDsaForCausalLM), tokenizers, and the
llama.cpp tree vendored in the llama-cpp-python source distribution:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36
    tar xzf llama_cpp_python-0.3.36.tar.gz
    python3 tests/oracles/glm_llamacpp_oracle.py \
        --llama-cpp llama_cpp_python-0.3.36/vendor/llama.cpp

(fixture made with llama-cpp-python 0.3.36, torch 2.15.0, transformers 5.25.0,
tokenizers 0.23.3). The test suite never runs this script; it reads:

  model.gguf   convert_hf_to_gguf.py --outtype bf16 of the checkpoint below:
               llama.cpp's glm-dsa tensors and keys, and its tokenizer.* keys
               (tokens, token types, merges, model "gpt2", pre "glm4", bos
               [gMASK], eot <|user|>, unk <|endoftext|>, eom <|observation|>)
  tokens       JSON ids: HF `tokenizers`' encoding of TEXT (added tokens
               matched), the sequence the logits are for
  logits       float32 little-endian [len(tokens)][vocab]: transformers'
               full-sequence forward (use_cache=False), every position
  cases.jsonl  {"text", "ids"}: more HF encodings (added tokens matched) for
               the tokenizer the file carries

The checkpoint: 2 layers (layer 0 dense, layer 1 MoE: 4 routed experts top-2
and the shared expert), indexer full / shared, 8 indexer heads of 32,
top-k 8, hidden 64, 2 heads (q/k 16 nope + 16 rope, v 16), q_lora 32, kv_lora
32, vocab 512, dense intermediate 64; constant-initialised parameters randomised and every weight
bf16-exact (glm_tiny_oracle.randomise), so bf16 storage loses nothing.

The tokenizer: glm_tokenizer_make.build at 476 trained ids (256 bytes + 220
merges) + GLM's 36 added tokens = 512 ids; GLM's pre-tokenizer (one Split
regex, then ByteLevel without its own regex).

How llama.cpp names the pre-tokenizer: get_vocab_base_pre() hashes the ids a
tokenizer gives one check string and looks the hash up in a table of known
models' tokenizers; GLM's real tokenizers are listed there as "glm4". The
constructed tokenizer has GLM's form but not its ids, so its hash is in no
table and the script stops ("BPE pre-tokenizer was not recognized"). The
oracle runs the script unchanged except for that one lookup, which answers
what the table answers for GLM's tokenizers: "glm4". (A file whose
converter named some other pre-tokenizer, e.g. "gpt-2", is derived from this
one by the test itself.)
"""
import argparse
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import torch
from tokenizers import Tokenizer
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glm_tokenizer_make as glmtok  # noqa: E402
from glm_tiny_oracle import randomise  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 512
SEED = 2468
CONFIG = dict(
    vocab_size=VOCAB, hidden_size=64, num_attention_heads=2, num_key_value_heads=2,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
    intermediate_size=64, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
    n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    first_k_dense_replace=1, index_n_heads=8, index_head_dim=32, index_topk=8, rms_norm_eps=1e-5,
    max_position_embeddings=4096, tie_word_embeddings=False, attention_bias=False,
    num_hidden_layers=2, indexer_types=["full", "shared"],
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
# GLM's own config names no BOS and ends a turn on these (ids set from the
# tokenizer); convert_hf_to_gguf.py copies them into tokenizer.ggml.*.
EOS = ["<|endoftext|>", "<|user|>", "<|observation|>"]
# The chat framing GLM prompts start with, then ordinary text: added tokens
# and byte-level pieces in one sequence.
TEXT = ("[gMASK]<sop><|user|>What's 12+30?<|assistant|><think>12 + 30 = 42.</think>It's 42."
        "<|user|>Danke — 你好?<|assistant|>")
TIE_TOLERANCE = 1e-3

# Runs convert_hf_to_gguf.py as its own __main__ with get_vocab_base_pre
# answering "glm4" (see the module docstring).
CONVERT = r"""
import runpy, sys
llama = sys.argv.pop(1)
sys.path[:0] = [llama, llama + "/gguf-py"]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "glm4"
sys.argv[0] = llama + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def write_tokenizer(d):
    j, _ = glmtok.build(VOCAB - len(glmtok.ADDED))
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                   "model_max_length": 4096}, f)
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (vendor/llama.cpp of the sdist)")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "glm_llamacpp"))
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    with tempfile.TemporaryDirectory() as tmp:
        # the directory's name becomes general.name
        hf = os.path.join(tmp, "glm-tiny")
        os.makedirs(hf)
        tok = write_tokenizer(hf)
        ids = tok.encode(TEXT, add_special_tokens=False).ids
        T = len(ids)
        assert T > CONFIG["index_topk"], T

        gen = torch.Generator().manual_seed(SEED)
        torch.manual_seed(SEED)
        eos = [tok.token_to_id(t) for t in EOS]
        cfg = GlmMoeDsaConfig(**CONFIG, bos_token_id=None, eos_token_id=eos, pad_token_id=eos[0],
                              attn_implementation="eager", experts_implementation="eager")
        model = GlmMoeDsaForCausalLM(cfg).float().eval()
        randomise(model, gen)
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(hf, safe_serialization=True)
        reloaded = GlmMoeDsaForCausalLM.from_pretrained(hf, dtype=torch.float32, attn_implementation="eager",
                                                        experts_implementation="eager").eval()
        x = torch.tensor([ids])
        full = reloaded(input_ids=x, use_cache=False).logits
        mem = model(input_ids=x, use_cache=False).logits
        if (mem - full).abs().max().item() != 0.0:
            sys.exit("saved model does not reproduce the in-memory logits")
        # a near-tie in a top-k (indexer or router) would flip between f32 and f64
        d64 = (full.double() - copy.deepcopy(reloaded).double()(input_ids=x, use_cache=False).logits).abs().max()
        scale = full.abs().max().item()
        print(f"T={T}: f32 vs f64 max |diff| {d64.item():.3g}, max |logit| {scale:.3f}")
        if d64.item() > TIE_TOLERANCE * scale:
            sys.exit("near-tied top-k selection: change SEED")

        os.makedirs(a.out, exist_ok=True)
        gguf = os.path.join(a.out, "model.gguf")
        subprocess.run([sys.executable, "-c", CONVERT, os.path.abspath(a.llama_cpp), hf, "--outtype", "bf16",
                        "--outfile", gguf], check=True)

    with open(os.path.join(a.out, "tokens"), "w") as f:
        json.dump(ids, f)
        f.write("\n")
    full.squeeze(0).numpy().astype("<f4").tofile(os.path.join(a.out, "logits"))
    rng = random.Random(97)
    texts = glmtok.HANDPICKED + [glmtok.random_text(rng) for _ in range(40)]
    with open(os.path.join(a.out, "cases.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "ids": tok.encode(t, add_special_tokens=False).ids},
                               ensure_ascii=False) + "\n")
    size = sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out))
    print(f"wrote {a.out} ({size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
