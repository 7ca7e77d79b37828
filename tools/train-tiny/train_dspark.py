#!/usr/bin/env python3
"""Trains a DSpark block drafter for the tiny model (docs/tiny-model.md,
docs/speculative.md) and writes its support GGUF.

The draft is nemo-automodel's DeepSeek V4 DSpark draft (DeepseekV4DSparkModel)
and the objective nemo's own (DSparkTrainerModule: cross-entropy on the next
five tokens, the probability L1 distance to the target's next-token
distribution, the confidence head), trained on the tiny model's corpus with
the main model frozen: transformers' DeepseekV4ForCausalLM loaded from the
exported checkpoint (export.py's OUT_DIR) gives the target features of every
position (target_features in dspark_draft.py) and the draft shares its token
embedding and output head. Anchors are drawn where the corpus carries loss
(the assistant's turns), so the drafter learns the text the model writes.

    python3 tools/train-tiny/train_dspark.py HF_DIR DATA_DIR OUT.gguf --nemo DIR \
        [--minutes M] [--seq T] [--anchors N]

DATA_DIR holds a corpus.jsonl of data.py; --kinds picks its document kinds.
"""
import argparse
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dspark_draft  # noqa: E402
import train as tiny_train  # noqa: E402

TARGETS = [2, 3, 4]   # as ds4-make-model --support dspark picks: the three layers below the last


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf")
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--nemo", required=True, help="directory holding the nemo_automodel package")
    ap.add_argument("--minutes", type=float, default=20)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--anchors", type=int, default=32, help="blocks trained per sequence")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kinds", default="agent-session,agent,agent-client,chat-para,chat-small")
    a = ap.parse_args()
    sys.path.insert(0, a.nemo)
    from nemo_automodel.components.speculative.dspark.core import DSparkTrainerModule
    from nemo_automodel.components.speculative.dspark.draft_deepseek_v4 import DeepseekV4DSparkModel
    from transformers import DeepseekV4ForCausalLM
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = DeepseekV4ForCausalLM.from_pretrained(a.hf, dtype=torch.float32, attn_implementation="eager").eval()
    for p in model.parameters():
        p.requires_grad_(False)
    n_layer = model.config.num_hidden_layers
    c = dspark_draft.draft_config(model.config, TARGETS, layers=2, heads=4, head_dim=64, rope_dim=32, q_lora=64,
                                  o_groups=2, o_lora=64, ff=512, markov_rank=16, num_anchors=a.anchors)
    draft = DeepseekV4DSparkModel(c).float()
    draft.initialize_embeddings_and_head(embed_tokens=model.model.embed_tokens, lm_head=model.lm_head)
    draft.set_embedding_head_trainable(False)
    trainer = DSparkTrainerModule(draft)
    params = [p for p in draft.parameters() if p.requires_grad]
    print("draft: %d layers, %.2fM trained parameters, target layers %s of %d" %
          (c.num_hidden_layers, sum(p.numel() for p in params) / 1e6, TARGETS, n_layer), flush=True)
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.01)

    docs, _ = tiny_train.load(a.data, 50, 10 ** 9, a.kinds.split(","))
    rng = random.Random(a.seed)
    seqs = tiny_train.pack(docs, a.seq, rng)
    print("%d documents, %d sequences of %d tokens" % (len(docs), len(seqs), a.seq), flush=True)

    t0, step, seen = time.time(), 0, 0
    budget = a.minutes * 60
    while time.time() - t0 < budget:
        ids_list, mask_list = seqs[step % len(seqs)]
        ids = torch.tensor([ids_list[:a.seq]])
        mask = torch.tensor([mask_list[:a.seq]], dtype=torch.float32)
        frac = (time.time() - t0) / budget
        for g in opt.param_groups:   # warm-up, then cosine to a tenth
            g["lr"] = a.lr * min(1.0, (step + 1) / 20) * (0.55 + 0.45 * torch.cos(torch.tensor(frac * 3.14159)).item())
        feats, last = dspark_draft.target_features(model, ids, TARGETS)
        m = trainer(input_ids=ids, target_hidden_states=feats, loss_mask=mask, target_last_hidden_states=last)
        opt.zero_grad(set_to_none=True)
        m.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        seen += a.seq
        if step % 10 == 0:
            acc = (m.accept_rate_per_pos_num / m.accept_rate_per_pos_den.clamp(min=1)).tolist()
            print("step %d loss %.3f ce %.3f l1 %.3f conf %.3f accept by position %s  %.0f tok/s" %
                  (step, m.loss.item(), m.ce_loss.item(), m.l1_loss.item(), m.confidence_loss.item(),
                   " ".join("%.2f" % x for x in acc), seen / (time.time() - t0)), flush=True)
    draft.eval()
    with torch.no_grad():
        # the Markov rows of ids the corpus never has are untrained: zero
        # (no Markov term after them), so the file compresses
        used = torch.zeros(c.vocab_size, dtype=torch.bool)
        for ids_list, _, _ in docs:
            used[torch.tensor(ids_list)] = True
        draft.markov_head.markov_w1.weight[~used] = 0
    dspark_draft.write_gguf(a.out, draft, c, n_layer, "ds4-tiny-dspark", f16=True)
    print("done: %d steps, %d tokens, %.1f min -> %s" % (step, seen, (time.time() - t0) / 60, a.out), flush=True)


if __name__ == "__main__":
    main()
