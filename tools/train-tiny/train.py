#!/usr/bin/env python3
"""Trains the tiny DeepSeek V4 model (docs/tiny-model.md) on the corpus of
data.py, on the CPU, reproducibly from --seed.

    python3 tools/train-tiny/train.py [--data build/train-tiny] [--minutes 50]

Writes DATA/ckpt.pt every --save-every steps (and at the end), so a stopped
run still leaves a usable model; DATA/train.log gets one line per step
(tokens/s, main and MTP loss). --resume continues from ckpt.pt."""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from model import TinyV4, compile_hyper_connections, make_config  # noqa: E402
from tok import N_VOCAB, SPECIALS, V4Tokenizer  # noqa: E402

SPLITTABLE = ("python", "c", "prose")


def build_vocab(docs, k):
    """The k most frequent ids (protocol ids always included) -> compact ids."""
    counts = {}
    for ids, _, _ in docs:
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
    keep = sorted(set(SPECIALS.values()))
    rest = sorted((c, i) for i, c in counts.items() if i not in keep)
    rest.sort(key=lambda x: (-x[0], x[1]))
    keep += [i for _, i in rest[:k - len(keep)]]
    return sorted(keep)


def grow_vocab(st, docs, k, gen):
    """Fine-tuning with more trained rows: the checkpoint's kept ids plus the
    most frequent other ids of docs, up to k. A new id's embedding and output
    rows start as the aggregated row they belonged to (its embedding plus
    noise of the initialisation's scale, so the new ids can be told apart; its
    output row unchanged, so its logit starts at the aggregated row's own);
    its hash-routing row is drawn as a fresh model's are. Every other
    tensor is the checkpoint's."""
    old = st["keep"]
    K0 = len(old)
    counts = {}
    for ids, _, _ in docs:
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
    kept = set(old)
    extra = sorted((i for i in counts if i not in kept), key=lambda i: (-counts[i], i))
    keep = sorted(old + extra[:max(0, k - K0)])
    pos = {t: n for n, t in enumerate(keep)}
    src = torch.tensor([pos[t] for t in old] + [len(keep)])      # old compact row -> new compact row
    new = torch.tensor([pos[t] for t in keep if t not in kept], dtype=torch.long)
    state = {}
    for name, t in st["model"].items():
        if t.dim() == 0 or t.shape[0] != K0 + 1:
            state[name] = t
            continue
        g = t[-1:].expand(len(keep) + 1, *t.shape[1:]).clone()
        g[src] = t
        if name.endswith("embed_tokens.weight"):
            g[new] += 0.02 * torch.randn(len(new), t.shape[1], generator=gen)
        elif t.dtype == torch.long:                                 # a hash router's tid2eid
            n_exp = st["config"]["n_routed_experts"]
            g[new] = torch.stack([torch.randperm(n_exp, generator=gen)[:t.shape[1]] for _ in range(len(new))])
        state[name] = g
    return {**st, "model": state, "keep": keep}


def load(data_dir, held_out_every, max_agent, kinds=None):
    """Every held_out_every-th document is held out; at most max_agent agent
    documents are kept (their fixed prefix makes them long)."""
    tk = V4Tokenizer()
    train, held = [], []
    n_agent = 0
    with open(os.path.join(data_dir, "corpus.jsonl")) as f:
        for n, line in enumerate(f):
            d = json.loads(line)
            if kinds and n % held_out_every and d["kind"] not in kinds:
                continue
            if d["kind"].startswith("agent"):
                n_agent += 1
                if n_agent > max_agent:
                    continue
            ids, mask = tk.encode_offsets(d["text"], d["train_from"])
            (held if n % held_out_every == 0 else train).append((ids, mask, d["kind"]))
    return train, held


def pack(docs, T, rng):
    """Sequences of T+1 ids: whole chat/agent documents (truncated only when
    longer than T+1), gaps filled with a running stream of code/prose."""
    fill_ids, fill_mask = [], []
    whole = []
    for ids, mask, kind in docs:
        if kind in SPLITTABLE:
            fill_ids += ids
            fill_mask += mask
        else:
            whole.append((ids[:T + 1], mask[:T + 1]))
    rng.shuffle(whole)
    seqs, cur_i, cur_m, fp = [], [], [], 0

    def flush():
        nonlocal cur_i, cur_m, fp
        need = T + 1 - len(cur_i)
        if need > 0:
            if fp + need > len(fill_ids):
                fp = 0
            cur_i += fill_ids[fp:fp + need]
            cur_m += fill_mask[fp:fp + need]
            fp += need
        seqs.append((cur_i, cur_m))
        cur_i, cur_m = [], []

    # interleave code/prose-only sequences so they make up their share
    n_code_seqs = len(fill_ids) // (T + 1)
    code_slots = set(rng.sample(range(len(whole) // 3 + n_code_seqs), n_code_seqs)) if n_code_seqs else set()
    slot = 0
    for ids, mask in whole:
        while slot in code_slots:
            if cur_i:
                flush()
            flush()
            slot += 1
        if len(cur_i) + len(ids) > T + 1:
            flush()
            slot += 1
        cur_i += ids
        cur_m += mask
    if cur_i:
        flush()
    return seqs


def to_tensors(seqs, remap):
    ids = torch.tensor([s[0] for s in seqs], dtype=torch.long)
    mask = torch.tensor([s[1] for s in seqs], dtype=torch.bool)
    return remap[ids], mask


def losses(model, ids, mask):
    """Mean main and MTP cross-entropy over the trained positions (compact
    softmax = exact full-vocabulary softmax up to log(N_rare) on rare targets).
    The heads run only at those positions (a document's fixed prefix, e.g. the
    agent's 752-token tools block, carries no loss)."""
    x, y = ids[:, :-1], ids[:, 1:]
    m1 = mask[:, 1:]
    # MTP at position i predicts token i+2 (y shifted by one more); its last position has no target
    m2 = torch.zeros_like(m1)
    m2[:, :-1] = m1[:, 1:]
    lo, lm = model(x, main_at=m1, mtp_at=m2)
    n1, n2 = int(m1.sum()), int(m2.sum())
    main = F.cross_entropy(lo, y[m1], reduction="sum") / max(n1, 1)
    y2 = torch.zeros_like(y)
    y2[:, :-1] = y[:, 1:]
    mtp = F.cross_entropy(lm, y2[m2], reduction="sum") / max(n2, 1)
    return main, mtp, n1


@torch.no_grad()
def init_weights(model, n_keep, gen):
    model.model._init_weights(model.lm_head)
    for mod in model.mtp.modules():
        model.model._init_weights(mod)
    for mod in model.modules():
        if type(mod).__name__ == "DeepseekV4HashRouter":
            n_exp, k = mod.num_experts, mod.top_k
            mod.tid2eid.copy_(torch.stack([torch.randperm(n_exp, generator=gen)[:k] for _ in range(mod.tid2eid.shape[0])]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="build/train-tiny")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=4096, help="trained rows (the rest share one aggregated row)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--minutes", type=float, default=50.0)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--save-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attn", default="banded", choices=("banded", "eager"),
                    help="attention: banded (model.banded_attention, only the open band of the mask; "
                    "check_lean.py proves it equal to transformers' forward) or transformers' eager")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the hyper-connection operations (model.compile_hyper_connections): "
                    "~10%% less CPU per step after ~30 s of compiling; equal to float32 rounding (check_lean.py)")
    ap.add_argument("--max-agent", type=int, default=3000)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--init", default=None, help="start from this checkpoint's weights and vocabulary with a fresh "
                    "optimizer and schedule (fine-tuning; e.g. from_gguf.py's rebuild of the committed model)")
    ap.add_argument("--grow-vocab", type=int, default=0, help="with --init: train this many rows, the "
                    "checkpoint's kept ids plus the most frequent other ids of the corpus (grow_vocab)")
    ap.add_argument("--kinds", default=None, help="train only on these document kinds (comma list), e.g. a "
                    "final phase on the agent and chat kinds")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    rng = random.Random(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    log = open(os.path.join(a.data, "train.log"), "a")

    def say(*x):
        s = " ".join(str(v) for v in x)
        print(s, flush=True)
        log.write(s + "\n")
        log.flush()

    t0 = time.time()
    train, held = load(a.data, 50, a.max_agent, a.kinds.split(",") if a.kinds else None)
    ck = os.path.join(a.data, "ckpt.pt")
    st = torch.load(ck, weights_only=False) if a.resume and os.path.exists(ck) else None
    if a.init:
        st = torch.load(a.init, weights_only=False)
        if a.grow_vocab > len(st["keep"]):
            st = grow_vocab(st, train, a.grow_vocab, gen)
    # a resumed run keeps the checkpoint's vocabulary, whatever documents it trains on now
    keep = st["keep"] if st else build_vocab(train, a.vocab)
    n_rare = N_VOCAB - len(keep)
    remap = torch.full((N_VOCAB,), len(keep), dtype=torch.long)
    remap[torch.tensor(keep)] = torch.arange(len(keep))
    seqs = pack(train, a.seq, rng)
    held_seqs = pack(held, a.seq, random.Random(a.seed + 1))
    ntok = sum(len(i) for i, _, _ in train)
    say("corpus: %d train docs (%d tokens), %d held-out docs; %d sequences of %d; vocab %d kept + 1 aggregated "
        "(%d rare ids); load %.0fs" % (len(train), ntok, len(held), len(seqs), a.seq, len(keep), n_rare,
                                      time.time() - t0))
    cfg = make_config(len(keep) + 1, attn=a.attn)
    model = TinyV4(cfg, n_rare)
    init_weights(model, len(keep), gen)
    if a.compile:
        compile_hyper_connections(model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)
    step, seen = 0, 0
    if st:
        model.load_state_dict(st["model"])
        if not a.init:
            opt.load_state_dict(st["opt"])
            step, seen = st["step"], st["seen"]
    say("params: %.2fM" % (sum(p.numel() for p in model.parameters()) / 1e6))

    def save():
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "seen": seen,
                    "keep": keep, "n_rare": n_rare, "config": cfg.to_dict(), "args": vars(a)}, ck + ".tmp")
        os.replace(ck + ".tmp", ck)

    order = list(range(len(seqs)))
    rng.shuffle(order)
    deadline = time.time() + a.minutes * 60
    # an estimate of the total steps for the cosine schedule, refined as the run goes
    est_total = None
    run_t0, run_tok, run_cpu0 = time.time(), 0, time.process_time()
    while time.time() < deadline:
        idx = [order[(step * a.batch + j) % len(order)] for j in range(a.batch)]
        ids, mask = to_tensors([seqs[i] for i in idx], remap)
        ts = time.time()
        if est_total is None or step % 10 == 0:
            el = time.time() - run_t0
            if run_tok:
                est_total = step + int((deadline - time.time()) / (el / max(1, step - start_step)))
            else:
                est_total, start_step = step + 1000, step
        warm = min(1.0, (step + 1) / a.warmup)
        prog = min(1.0, step / max(1, est_total))
        lr = a.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))
        for g in opt.param_groups:
            g["lr"] = lr
        main_l, mtp_l, n = losses(model, ids, mask)
        (main_l + a.mtp_weight * mtp_l).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        seen += ids.numel()
        run_tok += ids.numel()
        dt = time.time() - ts
        say("step %d lr %.2e loss %.4f mtp %.4f tok/s %.0f seen %d" % (step, lr, main_l.item(), mtp_l.item(),
                                                                       ids.numel() / dt, seen))
        if step % a.save_every == 0:
            save()
    save()
    # per CPU second too: on a machine shared with other work the wall-clock rate follows its load
    say("done: %d steps, %d tokens, %.1f min, %.0f tok/s average, %.0f tok per CPU second"
        % (step, seen, (time.time() - run_t0) / 60, run_tok / (time.time() - run_t0),
           run_tok / (time.process_time() - run_cpu0)))


if __name__ == "__main__":
    main()
