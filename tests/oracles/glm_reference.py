"""A plain numpy GLM 5.2 (glm_moe_dsa) forward pass, written from the fact
sheet's formulas (docs glm-5.2-model.md section 5), not from transformers'
code: the readable statement of the math a C forward pass must match.
float64 throughout; one sequence, full prefill, every position's logits.

    logits = forward(cfg, weights, tokens)

cfg: the transformers config.json dict; weights: {name: float array} in
transformers' names (per-expert experts, as save_pretrained writes them)."""
import numpy as np


# transformers builds q_a_layernorm and kv_a_layernorm with its RMSNorm's
# default eps, not config.rms_norm_eps (modeling_glm_moe_dsa.py); llama.cpp
# uses rms_norm_eps for every RMSNorm. The layer and final norms take the config's.
LATENT_NORM_EPS = 1e-6


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def rope_interleaved(x, pos, base):
    """Rotates adjacent pairs (x[2i], x[2i+1]) by pos * base^(-2i/d)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = pos[:, None] * inv[None, :]                       # [T, d/2]
    shape = [x.shape[0]] + [1] * (x.ndim - 2) + [d // 2]
    cos, sin = np.cos(ang).reshape(shape), np.sin(ang).reshape(shape)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def silu(x):
    return x / (1 + np.exp(-x))


def indexer_topk(c, W, p, a, qr, pos, base):
    """Top-k visible keys per query from the DSA lightning indexer."""
    T = a.shape[0]
    IH, ID, R, K = c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"], c["index_topk"]
    q = (qr @ W[p + "self_attn.indexer.wq_b.weight"].T).reshape(T, IH, ID)
    k = layer_norm(a @ W[p + "self_attn.indexer.wk.weight"].T, W[p + "self_attn.indexer.k_norm.weight"], W[p + "self_attn.indexer.k_norm.bias"],
                   1e-6)
    q = np.concatenate([rope_interleaved(q[..., :R], pos, base), q[..., R:]], -1)
    k = np.concatenate([rope_interleaved(k[..., :R], pos, base), k[..., R:]], -1)
    w = a @ W[p + "self_attn.indexer.weights_proj.weight"].T                              # [T, IH]
    s = np.maximum(np.einsum("shd,td->sht", q, k) * ID ** -0.5, 0)             # [T, IH, T]
    score = np.einsum("sht,sh->st", s, w) * IH ** -0.5
    sel = np.zeros((T, T), dtype=bool)
    for i in range(T):
        n = min(K, i + 1)
        sel[i, np.argsort(-score[i, :i + 1], kind="stable")[:n]] = True
    return sel


def q_latent(c, W, p, a):
    """The normalised q_a output: input of q_b and of the indexer's queries."""
    return rms(a @ W[p + "self_attn.q_a_proj.weight"].T, W[p + "self_attn.q_a_layernorm.weight"], LATENT_NORM_EPS)


def attention(c, W, p, a, qr, pos, base, sel):
    T = a.shape[0]
    H, nope, R, dv, LKV = c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], \
        c["kv_lora_rank"]
    q = (qr @ W[p + "self_attn.q_b_proj.weight"].T).reshape(T, H, nope + R)
    q_nope, q_pe = q[..., :nope], rope_interleaved(q[..., nope:], pos, base)
    kv = a @ W[p + "self_attn.kv_a_proj_with_mqa.weight"].T
    lat = rms(kv[:, :LKV], W[p + "self_attn.kv_a_layernorm.weight"], LATENT_NORM_EPS)
    k_pe = rope_interleaved(kv[:, LKV:], pos, base)
    kvb = W[p + "self_attn.kv_b_proj.weight"].reshape(H, nope + dv, LKV)
    k_nope = np.einsum("hdl,tl->thd", kvb[:, :nope], lat)
    v = np.einsum("hdl,tl->thd", kvb[:, nope:], lat)
    score = (np.einsum("shd,thd->hst", q_nope, k_nope) + np.einsum("shd,td->hst", q_pe, k_pe)) * (nope + R) ** -0.5
    allowed = np.tril(np.ones((T, T), dtype=bool)) & sel
    score = np.where(allowed[None], score, -np.inf)
    prob = np.exp(score - score.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    o = np.einsum("hst,thd->shd", prob, v).reshape(T, H * dv)
    return o @ W[p + "self_attn.o_proj.weight"].T


def moe(c, W, p, y):
    k = c["num_experts_per_tok"]
    s = 1 / (1 + np.exp(-(y @ W[p + "mlp.gate.weight"].T)))                  # [T, X]
    choice = s + W[p + "mlp.gate.e_score_correction_bias"]
    out = np.zeros_like(y)
    for t in range(y.shape[0]):
        top = np.argsort(-choice[t], kind="stable")[:k]
        wt = s[t, top]
        if c.get("norm_topk_prob", True):
            wt = wt / (wt.sum() + 1e-20)
        wt = wt * c["routed_scaling_factor"]
        for e, we in zip(top, wt):
            q = f"{p}mlp.experts.{e}."
            h = silu(y[t] @ W[q + "gate_proj.weight"].T) * (y[t] @ W[q + "up_proj.weight"].T)
            out[t] += we * (h @ W[q + "down_proj.weight"].T)
    sh = p + "mlp.shared_experts."
    out += (silu(y @ W[sh + "gate_proj.weight"].T) * (y @ W[sh + "up_proj.weight"].T)) @ W[sh + "down_proj.weight"].T
    return out


def forward(c, W, tokens):
    W = {k: np.asarray(v, dtype=np.float64) for k, v in W.items()}
    eps, base = c["rms_norm_eps"], c["rope_parameters"]["rope_theta"]
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = W["model.embed_tokens.weight"][np.asarray(tokens)]
    sel = None
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        a = rms(x, W[p + "input_layernorm.weight"], eps)
        qr = q_latent(c, W, p, a)
        if c["indexer_types"][layer] == "full":   # shared layers keep the previous full layer's selection
            sel = indexer_topk(c, W, p, a, qr, pos, base)
        attn = attention(c, W, p, a, qr, pos, base, sel)
        h = x + attn
        y = rms(h, W[p + "post_attention_layernorm.weight"], eps)
        if layer < c["first_k_dense_replace"]:
            f = (silu(y @ W[p + "mlp.gate_proj.weight"].T) * (y @ W[p + "mlp.up_proj.weight"].T)) @ \
                W[p + "mlp.down_proj.weight"].T
        else:
            f = moe(c, W, p, y)
        x = h + f
    return rms(x, W["model.norm.weight"], eps) @ W["lm_head.weight"].T
