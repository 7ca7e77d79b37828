#!/usr/bin/env python3
"""Measures a training checkpoint (docs/tiny-model.md):
  * perplexity on the held-out documents (every 50th document of the corpus,
    never trained on), per kind, over the full 129,280-id vocabulary (the
    exact softmax: a rare target costs the aggregated class's share divided
    evenly), against a unigram model of the training tokens (add-0.5
    smoothing over the whole vocabulary);
  * MTP acceptance on the model's own greedy output: for prompts of the chat
    and agent kinds the main model decodes greedily, then the MTP block's
    argmax at position i (for the token at i+2) is compared with the token
    the main model actually chose there: the acceptance of one draft token
    per step in greedy speculative decoding.

    python3 tools/train-tiny/eval.py CKPT [--data build/train-tiny] [--tokens N]"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from export import compact_model  # noqa: E402
from tok import N_VOCAB, V4Tokenizer  # noqa: E402
from train import load  # noqa: E402
import data  # noqa: E402


@torch.no_grad()
def nll_doc(m, remap, n_rare, ids, mask, T):
    """Summed NLL (nats) and count over the masked targets of one document."""
    tot, cnt = 0.0, 0
    log_rare = math.log(n_rare)
    for s in range(0, len(ids) - 1, T):
        x = torch.tensor([ids[s:s + T + 1]])
        cx = remap[x]
        lo, _ = m(cx[:, :-1], with_mtp=False)
        y = cx[0, 1:]
        lp = torch.log_softmax(lo[0].double(), -1).gather(1, y[:, None])[:, 0]
        lp = lp - (y == remap.max()).double() * log_rare
        mk = torch.tensor(mask[s + 1:s + T + 1])
        tot -= lp[mk].sum().item()
        cnt += int(mk.sum())
    return tot, cnt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--data", default="build/train-tiny")
    ap.add_argument("--tokens", type=int, default=12000, help="held-out tokens per kind")
    ap.add_argument("--mtp-prompts", type=int, default=12)
    ap.add_argument("--out", default=None)
    ap.add_argument("--max-agent", type=int, default=None,
                    help="agent documents read (default: the checkpoint's training run's, else 3000)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ck = torch.load(a.ckpt, weights_only=False)
    keep, n_rare = ck["keep"], ck["n_rare"]
    remap = torch.full((N_VOCAB,), len(keep), dtype=torch.long)
    remap[torch.tensor(keep)] = torch.arange(len(keep))
    m = compact_model(ck)
    max_agent = a.max_agent if a.max_agent is not None else ck.get("args", {}).get("max_agent", 3000)
    train, held = load(a.data, 50, max_agent)
    counts = torch.zeros(N_VOCAB, dtype=torch.float64)
    for ids, _, _ in train:
        counts += torch.bincount(torch.tensor(ids), minlength=N_VOCAB).double()
    uni = torch.log((counts + 0.5) / (counts.sum() + 0.5 * N_VOCAB))
    res = {}
    for kind in sorted({k for _, _, k in held}):
        tot = cnt = utot = 0.0
        for ids, mask, k in held:
            if k != kind or cnt >= a.tokens:
                continue
            t, c = nll_doc(m, remap, n_rare, ids, mask, ck.get("args", {}).get("seq", 1024))
            tgt = torch.tensor(ids[1:])[torch.tensor(mask[1:])]
            tot, cnt, utot = tot + t, cnt + c, utot - uni[tgt].sum().item()
        res[kind] = {"tokens": int(cnt), "ppl": math.exp(tot / cnt), "unigram_ppl": math.exp(utot / cnt)}
        print("%-13s %6d tokens  perplexity %8.2f  unigram %9.1f" % (kind, cnt, res[kind]["ppl"],
                                                                   res[kind]["unigram_ppl"]), flush=True)
    # MTP acceptance on greedy continuations
    tk = V4Tokenizer()
    prompts = ["Explain Redis streams in one paragraph.", "What does json.dumps do?", "What is a hash table?",
               "Explain recursion.", "What does os.path.join do?", "Tell me about TCP.",
               "List three Redis design principles.", "What is a linked list?", "Describe Git briefly.",
               "What does shutil.copy do?", "Explain a pointer in C.", "What is a Python list?"][:a.mtp_prompts]
    hit = tot = 0
    for p in prompts:
        text, _ = data.chat_doc(data.CLI_SYSTEM, [(p, [])], False)
        ids = tk.encode(text + data.ASSISTANT + data.THINK_END)
        x = remap[torch.tensor([ids])]
        n0 = x.shape[1]
        with torch.no_grad():
            for _ in range(48):
                lo, _ = m(x, with_mtp=False)
                nxt = lo[0, -1].argmax()
                x = torch.cat([x, nxt.view(1, 1)], 1)
                if nxt.item() == remap[1].item():
                    break
            _, lm = m(x)
        # MTP at i predicts i+2; count the generated region (targets at >= n0 + 1)
        pred = lm[0].argmax(-1)
        for i in range(n0 - 1, x.shape[1] - 2):
            tot += 1
            hit += int(pred[i].item() == x[0, i + 2].item())
    res["mtp_acceptance"] = {"accepted": hit, "drafts": tot, "rate": hit / max(1, tot)}
    print("MTP acceptance on greedy output: %d/%d = %.1f%%" % (hit, tot, 100 * hit / max(1, tot)))
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
