"""The tiny DeepSeek V4 model for training: transformers' own
DeepseekV4Model blocks (so the forward is transformers' by construction) with
  * a compact vocabulary: row i < K is the real token keep[i]; row K is one
    aggregated class standing for the N_rare = 129280 - K other tokens, which
    share one embedding row, one head row and one hash-routing row. The
    full-vocabulary softmax stays exact: the aggregated logit is the shared
    head row's logit + log(N_rare), and export.py writes that row into every
    rare token's head row, so the engine's 129280 logits equal this model's;
  * the MTP block (DeepSeek V4's mtp.0.*): e_proj(enorm(embed(t+1))) +
    h_proj(hnorm(S_h)) per hyper-connection stream, one sliding-attention
    decoder layer, its own hc_head and norm, the shared output head; trained
    on the token after next."""
import contextlib
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import DeepseekV4Config
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, create_sliding_window_causal_mask, eager_mask
from transformers.models.deepseek_v4 import modeling_deepseek_v4
from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
    DeepseekV4DecoderLayer, DeepseekV4HyperHead, DeepseekV4Model, DeepseekV4RMSNorm)


@contextlib.contextmanager
def indexer_ties_lower_first():
    """Within it, transformers' CSA indexer breaks exact score ties by keeping
    the lower compressed row, as the engine's ds4_topk does (src/nn/nn_math.h).
    torch.topk leaves the order of equal values unspecified, and the tiny
    model's 4 indexer heads give exact ties: a row whose every head's
    q.k is <= 0 scores exactly 0 (the ReLU), so several rows tie at 0 at the
    top-k boundary (on a 512-token held-out sequence from position 41 on).
    Which of them is kept changes the logits by up to 0.03; with this rule
    the engine's f32 logits equal PyTorch's at every position."""
    indexer = modeling_deepseek_v4.DeepseekV4Indexer
    forward, topk = indexer.forward, torch.Tensor.topk

    def stable_topk(t, k, dim=-1, largest=True, sorted=True):
        assert largest
        idx = torch.sort(t, dim=dim, descending=True, stable=True).indices.narrow(dim, 0, k)
        return torch.return_types.topk((t.gather(dim, idx), idx))

    def ordered_forward(self, *a, **kw):
        torch.Tensor.topk = stable_topk
        try:
            return forward(self, *a, **kw)
        finally:
            torch.Tensor.topk = topk

    indexer.forward = ordered_forward
    try:
        yield
    finally:
        indexer.forward = forward


def banded_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers' eager attention (sinks included) computed only where the
    mask can be open: query block b of W = sliding_window positions against
    the 2W window keys before and in it, plus every compressed key (the
    entries past the T window keys, with the compressor's own mask). The eager
    path multiplies every query with all T keys, of which at most W are open.
    Same logits (the masked terms are exact zeros in both), summed in another
    order; tools/train-tiny/check_lean.py checks logits and gradients against
    transformers' forward. The mask outside the band must be closed: checked
    on every call, so another mask is refused, not silently cut."""
    B, H, T, D = query.shape
    W = module.sliding_window
    C = key.shape[2] - T
    nb = -(-T // W)
    P = nb * W
    closed = torch.finfo(attention_mask.dtype).min / 2
    win = attention_mask[:, 0, :, :T]
    # window keys of query block b: positions (b-1)W .. (b+1)W-1, i.e. rows of
    # the keys padded in front by W, taken 2W at a time with step W
    kpad = F.pad(key[:, 0, :T], (0, 0, W, P - T))                    # [B, P+W, D]
    vpad = F.pad(value[:, 0, :T], (0, 0, W, P - T))
    kb = kpad.unfold(1, 2 * W, W)                                      # [B, nb, D, 2W]
    vb = vpad.unfold(1, 2 * W, W).transpose(-1, -2)                    # [B, nb, 2W, D]
    mpad = F.pad(win, (W, P - T, 0, P - T), value=torch.finfo(attention_mask.dtype).min)  # [B, P, P+W]
    cols = (torch.arange(P).div(W, rounding_mode="floor") * W).unsqueeze(1) + torch.arange(2 * W)
    mband = mpad.gather(2, cols.unsqueeze(0).expand(B, -1, -1))       # [B, P, 2W]
    if int((win > closed).sum()) != int((mband > closed).sum()):
        raise ValueError("banded_attention: the attention mask is open outside the sliding window")
    q = F.pad(query, (0, 0, 0, P - T)).view(B, H, nb, W, D)
    s_win = (q @ kb.unsqueeze(1)).reshape(B, H, P, 2 * W) * scaling + mband.unsqueeze(1)
    parts = [s_win]
    if C:
        kc = key[:, :, T:]                                             # [B, 1, C, D]
        s_c = (query @ kc.transpose(-1, -2)) * scaling + attention_mask[..., T:]
        parts.append(F.pad(s_c, (0, 0, 0, P - T)))
    parts.append(module.sinks.view(1, H, 1, 1).expand(B, H, P, 1))
    logits = torch.cat(parts, dim=-1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = F.softmax(logits, dim=-1)
    out = (probs[..., :2 * W].view(B, H, nb, W, 2 * W) @ vb.unsqueeze(1)).view(B, H, P, D)
    if C:
        out = out + probs[..., 2 * W:2 * W + C] @ value[:, :, T:]
    return out[:, :, :T].transpose(1, 2).contiguous(), None


def compile_hyper_connections(model):
    """torch.compile the hyper-connection weights of model's layers
    (a projection, sigmoid/softmax and 20 Sinkhorn iterations over 4x4
    matrices: some 80 small element-wise operations per call, forward and
    backward) and its hyper-connection heads into fused kernels. About 30 s
    of compiling at the first step; the whole model does not compile in
    useful time on 2 cores."""
    for mod in model.modules():
        if isinstance(mod, (modeling_deepseek_v4.DeepseekV4HyperConnection, DeepseekV4HyperHead)):
            mod.forward = torch.compile(mod.forward, dynamic=False)


AttentionInterface.register("banded", banded_attention)
AttentionMaskInterface.register("banded", eager_mask)

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"


def make_config(vocab_size, attn="eager", **over):
    """The demo preset's shape (tools/ds4-make-model.c, Flash's schedule at tiny
    dims: ratios 0,0,4,128,4,128, window 128, 3 hash layers)."""
    cfg = dict(
        vocab_size=vocab_size, hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
        head_dim=128, partial_rotary_factor=0.5, q_lora_rank=64, o_groups=2, o_lora_rank=64,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=256,
        scoring_func="sqrtsoftplus", norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0,
        index_n_heads=4, index_head_dim=128, index_topk=8, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
        rms_norm_eps=1e-6, rope_theta=10000.0, compress_rope_theta=160000.0, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=1, layer_types=[SWA, SWA, CSA, HCA, CSA, HCA],
        compress_rates={CSA: 4, HCA: 128}, mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 3,
        sliding_window=128, max_position_embeddings=65536, num_nextn_predict_layers=1,
        rope_parameters={
            "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "partial_rotary_factor": 0.5,
                         "factor": 16.0, "original_max_position_embeddings": 65536,
                         "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.0}},
    )
    cfg.update(over)
    return DeepseekV4Config(**cfg, attn_implementation=attn)


class MTP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.hidden_size
        mcfg = copy.deepcopy(cfg)
        mcfg.num_hidden_layers = 1
        mcfg.layer_types = [SWA]
        mcfg.mlp_layer_types = ["moe"]
        self.enorm = DeepseekV4RMSNorm(d, eps=cfg.rms_norm_eps)
        self.hnorm = DeepseekV4RMSNorm(d, eps=cfg.rms_norm_eps)
        self.e_proj = nn.Linear(d, d, bias=False)
        self.h_proj = nn.Linear(d, d, bias=False)
        self.block = DeepseekV4DecoderLayer(mcfg, 0)
        self.hc_head = DeepseekV4HyperHead(cfg)
        self.norm = DeepseekV4RMSNorm(d, eps=cfg.rms_norm_eps)


class TinyV4(nn.Module):
    def __init__(self, cfg, n_rare):
        super().__init__()
        self.cfg = cfg
        self.model = DeepseekV4Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mtp = MTP(cfg)
        bias = torch.zeros(cfg.vocab_size)
        bias[-1] = math.log(n_rare)
        self.register_buffer("agg_bias", bias, persistent=False)

    def trunk(self, ids):
        """Final HC state [B, T, hc, D] and the shared position inputs."""
        m = self.model
        emb = m.embed_tokens(ids)
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        mask = create_sliding_window_causal_mask(config=self.cfg, inputs_embeds=emb, attention_mask=None,
                                                 cache=None, position_ids=pos)
        pe = {"main": m.rotary_emb(emb, position_ids=pos, layer_type="main"),
              "compress": m.rotary_emb(emb, position_ids=pos, layer_type="compress")}
        h = emb.unsqueeze(2).expand(-1, -1, self.cfg.hc_mult, -1).contiguous()
        for layer in m.layers:
            h = layer(h, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=ids, cache=None)
        return h, (pe, pos, mask)

    def logits(self, hidden):
        """Compact logits with the aggregated row's log(N_rare): softmax over
        these = the full-vocabulary softmax."""
        return self.lm_head(hidden) + self.agg_bias

    def forward(self, ids, with_mtp=True, main_at=None, mtp_at=None):
        """Compact logits [B, T, V] of the main head and of the MTP block.
        main_at / mtp_at (bool [B, T]): the head only at those positions,
        logits [n, V] (training needs them only where a loss is taken; the
        rest of the forward is unchanged, so those rows are the same)."""
        h, (pe, pos, mask) = self.trunk(ids)
        main = self.model.norm(self.model.hc_head(h))
        out = self.logits(main if main_at is None else main[main_at])
        if not with_mtp:
            return out, None
        t = self.mtp
        # position i: the trunk state at i and the embedding of token i+1 -> token i+2
        nxt = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
        e = t.e_proj(t.enorm(self.model.embed_tokens(nxt)))
        x = e.unsqueeze(2) + t.h_proj(t.hnorm(h))
        x = t.block(x, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=nxt, cache=None)
        y = t.norm(t.hc_head(x))
        return out, self.logits(y if mtp_at is None else y[mtp_at])
