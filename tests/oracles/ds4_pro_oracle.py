#!/usr/bin/env python3
"""Regenerates tests/fixtures/ds4pro/P: a small random DeepSeek V4 model with
V4 Pro's structure and the float32 logits transformers computes for it.

Same procedure as ds4_tiny_oracle.py (whose build() it runs): transformers'
DeepseekV4ForCausalLM from a DeepseekV4Config, every constant-initialised
parameter randomised, every weight rounded to bf16, saved with
save_pretrained and reloaded, token sequences redrawn until no indexer top-k
choice is nearly tied, full-sequence logits of every position recorded.
Needs torch + transformers (tested with torch 2.15, transformers 5.24, in a
separate venv); the test suite only reads the committed outputs.

    python3 tests/oracles/ds4_pro_oracle.py [--out tests/fixtures/ds4pro]

What is Pro's here (ds4_layout.c ds4_hparams_v4, DS4_V4_PRO), scaled down:
  * the schedule: no raw-window-only layer; layers 0-1 compress by 128 (HCA),
    then CSA (ratio 4, indexer) and HCA alternate from a CSA layer 2, with
    Pro's real ratios 4 and 128 and its 128-token window;
  * hash routing on the first three layers, which in Pro are HCA, HCA, CSA
    (Flash's are sliding, sliding, CSA), then top-k on an HCA and a CSA layer;
  * 8 heads per output group (Pro: 128 heads in 16 groups), a query rank 1.5x
    the output rank (1536 / 1024), routed scale 2.5;
  * many experts per selected one (64 of which 2 are used; Pro 384 / 6),
    each narrow so the fixture stays small.
Not Pro's: the sizes; swiglu_limit 0.25 (as the tiny fixtures) so both clamps
trigger with random weights; index_topk 8 so the indexer prunes within 300
tokens; 16 indexer heads (the tiny fixtures' fix for score ties).
"""
import argparse
import os

import torch

import ds4_tiny_oracle as tiny

CSA, HCA = tiny.CSA, tiny.HCA

# The tiny fixtures' shared arguments with Pro's proportions where they differ.
PRO_COMMON = {**tiny.COMMON, **dict(
    hidden_size=128, num_attention_heads=16, q_lora_rank=96, o_lora_rank=64, o_groups=2,
    n_routed_experts=64, num_experts_per_tok=2, moe_intermediate_size=32, routed_scaling_factor=2.5)}

CONFIGS = {
    "P": dict(cfg=dict(
        num_hidden_layers=5, layer_types=[HCA, HCA, CSA, HCA, CSA],
        compress_rates={CSA: 4, HCA: 128}, mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 2,
        sliding_window=128, index_topk=8, max_position_embeddings=1048576,
        rope_parameters=tiny.rope(65536)),
        n_tokens=300, seed=4321),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "ds4pro"))
    ap.add_argument("names", nargs="*", default=sorted(CONFIGS))
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    for n in a.names:
        tiny.build(n, CONFIGS[n], os.path.normpath(a.out), common=PRO_COMMON)


if __name__ == "__main__":
    main()
