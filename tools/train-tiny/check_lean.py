#!/usr/bin/env python3
"""Checks that train.py's lean training path computes what transformers'
forward computes, on the same weights and random ids of a full training
sequence:
  1. logits: the training model (model.TinyV4 with the banded attention)
     against transformers' own DeepseekV4ForCausalLM (eager attention), every
     position;
  2. loss and gradients: train.losses (banded attention, heads only at the
     positions that carry loss) against the straightforward loss (eager
     attention, full-sequence heads, masked mean), main + MTP, every
     parameter's gradient. The mask has a loss-free prefix, like an agent
     document's tools block.

    python3 tools/train-tiny/check_lean.py [--seq 1024] [--double] [--compile]

--double runs the models in float64: everything must then agree to 1e-12 of
the largest value, which shows the lean path computes the same function; in
float32 (default) the logits and losses must agree to 1e-5 and the gradients
are reported. With --compile the hyper-connection weights come from fused
kernels; transformers computes them in float32 whatever the model's dtype
(its own .float()), so there the bound is float32's 1e-5 even with --double
(measured: logits 3.0e-7, gradients 1.3e-5 of the largest) (a scalar such as hc_head.hc_scale sums the terms of 1,024
positions that cancel, so its float32 gradient moves with summation order)."""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from transformers import DeepseekV4ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import TinyV4, compile_hyper_connections, indexer_ties_lower_first, make_config  # noqa: E402
from train import init_weights, losses  # noqa: E402


def dense_losses(model, ids, mask):
    """The loss as written before the lean path: full logits, masked means."""
    x, y = ids[:, :-1], ids[:, 1:]
    lo, lm = model(x)
    m1 = mask[:, 1:].to(lo.dtype)
    ce = F.cross_entropy(lo.reshape(-1, lo.shape[-1]), y.reshape(-1), reduction="none").view_as(m1)
    main = (ce * m1).sum() / m1.sum().clamp(min=1)
    y2, m2 = y[:, 1:], m1[:, 1:]
    ce2 = F.cross_entropy(lm[:, :-1].reshape(-1, lm.shape[-1]), y2.reshape(-1), reduction="none").view_as(m2)
    return main, (ce2 * m2).sum() / m2.sum().clamp(min=1)


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-300)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=4097)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--double", action="store_true")
    ap.add_argument("--compile", action="store_true", help="as train.py --compile: "
                    "model.compile_hyper_connections on the lean model")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    lean = TinyV4(make_config(a.vocab, attn="banded"), 129280 - a.vocab + 1)
    init_weights(lean, a.vocab - 1, torch.Generator().manual_seed(0))
    with torch.no_grad():  # constants at init: give every path a non-trivial value
        for n, p in lean.named_parameters():
            if n.endswith("sinks") or n.endswith("position_bias") or n.endswith("base"):
                p.normal_(0, 0.5)
    eager = TinyV4(make_config(a.vocab, attn="eager"), 129280 - a.vocab + 1)
    eager.load_state_dict(lean.state_dict())
    ref = DeepseekV4ForCausalLM(make_config(a.vocab, attn="eager"))
    ref.model.load_state_dict(lean.model.state_dict())
    ref.lm_head.load_state_dict(lean.lm_head.state_dict())
    if a.compile:
        compile_hyper_connections(lean)
    models = (lean, eager, ref)
    if a.double:  # transformers' grouped expert matmul is float32-only; its loop is not
        for m in models:
            m.double()
            for mod in m.modules():
                if type(mod).__name__ == "DeepseekV4Experts":
                    mod.config._experts_implementation = "eager"
    ids = torch.randint(0, a.vocab, (1, a.seq + 1))
    mask = torch.rand(1, a.seq + 1) < 0.8
    mask[:, :a.seq // 3] = False
    tol = 1e-12 if a.double and not a.compile else 1e-5
    with indexer_ties_lower_first(), torch.no_grad():  # both sides keep the same rows at exact ties
        got = lean(ids[:, :-1], with_mtp=False)[0] - lean.agg_bias
        want = ref(input_ids=ids[:, :-1], use_cache=False).logits
    d_logits = rel(got, want)
    print("1. logits vs transformers' DeepseekV4ForCausalLM, %d positions: max|diff| / max|logit| %.3g"
          % (a.seq, d_logits))
    with indexer_ties_lower_first():
        lm, lt, _ = losses(lean, ids, mask)
        (lm + 0.3 * lt).backward()
        em, et = dense_losses(eager, ids, mask)
        (em + 0.3 * et).backward()
    d_loss = max(abs(lm.item() - em.item()) / em.item(), abs(lt.item() - et.item()) / et.item())
    worst, name = 0.0, None
    ge = dict(eager.named_parameters())
    n = 0
    for k, p in lean.named_parameters():
        q = ge[k]
        if p.grad is None and q.grad is None:
            continue
        assert p.grad is not None and q.grad is not None, k
        n += 1
        r = rel(p.grad, q.grad)
        if r > worst:
            worst, name = r, k
    print("2. loss (main %.4f, MTP %.4f) vs the full-head eager loss: relative %.3g; gradients of %d tensors: "
          "worst max|diff| / max|grad| %.3g (%s)" % (lm.item(), lt.item(), d_loss, n, worst, name))
    ok = d_logits <= tol and d_loss <= tol and (worst <= tol or not a.double or a.compile)
    print("OK" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
