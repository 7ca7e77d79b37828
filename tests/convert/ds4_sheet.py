"""The DS4 GGUF layout restated from the fact sheet (deepseek-v4-model.md
sections 2, 4, 5, 14) for the converter tests: what tensors and metadata a
converted checkpoint must contain, and where each tensor comes from in an HF
checkpoint. Written independently of src/models/dsv4/ds4_layout.c."""
import numpy as np

import st_np

LAYER_RATIO = {"sliding_attention": 0}

# Released-file type of each tensor family (sheet section 5). "EXP_GU"/"EXP_D"
# are the routed experts.
F32, F16, Q8, I32, EXP_GU, EXP_D = "F32", "F16", "Q8", "I32", "EXP_GU", "EXP_D"


def ratios(cfg):
    rates = cfg.get("compress_rates", {})
    out = []
    for t in cfg["layer_types"]:
        out.append(0 if t == "sliding_attention" else rates[t])
    return out


CSA = "compressed_sparse_attention"
KIND_CSA = 1


def kinds(cfg):
    """Per-layer attention kind by transformers' layer_types (0 window, 1 CSA:
    overlapping compressor + indexer, 2 HCA), whatever the ratio; any other
    compressed type name (test_make_model's "hca<ratio>") is HCA."""
    return [0 if t == "sliding_attention" else KIND_CSA if t == CSA else 2 for t in cfg["layer_types"]]


def kinds_follow_ratios(cfg):
    """Whether the released files' rule (ratio 4 is CSA, any other nonzero
    ratio HCA) gives every layer's kind, so no kinds key is needed."""
    return all(k == (0 if r == 0 else 1 if r == 4 else 2) for k, r in zip(kinds(cfg), ratios(cfg)))


def n_hash(cfg):
    return sum(1 for t in cfg["mlp_layer_types"] if t == "hash_moe")


def tensors(cfg):
    """[(gguf name, ne list, family, source spec)] where source spec is a list
    of alternative HF names (without the layers.N. prefix), or ("experts", w)
    for routed experts (w = "w1"/"w2"/"w3")."""
    E, V, H, D = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"], cfg["head_dim"]
    hc, X, Fe, k = cfg["hc_mult"], cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["num_experts_per_tok"]
    Rq, G, Ro = cfg["q_lora_rank"], cfg["o_groups"], cfg["o_lora_rank"]
    HI, DI = cfg["index_n_heads"], cfg["index_head_dim"]
    mix = (2 + hc) * hc
    out = [
        ("token_embd.weight", [E, V], F16, ["embed.weight", "embed_tokens.weight"]),
        ("output_hc_fn.weight", [hc * E, hc], F16, ["hc_head_fn", "hc_head.hc_fn"]),
        ("output_hc_scale.weight", [1], F32, ["hc_head_scale", "hc_head.hc_scale"]),
        ("output_hc_base.weight", [hc], F32, ["hc_head_base", "hc_head.hc_base"]),
        ("output_norm.weight", [E], F32, ["norm.weight"]),
        ("output.weight", [E, V], Q8, ["head.weight", "lm_head.weight"]),
    ]
    for l, (r, kind) in enumerate(zip(ratios(cfg), kinds(cfg))):
        p = f"blk.{l}."
        L = [
            ("hc_attn_fn.weight", [hc * E, mix], F16, ["hc_attn_fn"]),
            ("hc_attn_scale.weight", [3], F32, ["hc_attn_scale"]),
            ("hc_attn_base.weight", [mix], F32, ["hc_attn_base"]),
            ("attn_norm.weight", [E], F32, ["attn_norm.weight"]),
            ("attn_q_a.weight", [E, Rq], Q8, ["attn.wq_a.weight"]),
            ("attn_q_a_norm.weight", [Rq], F32, ["attn.q_norm.weight"]),
            ("attn_q_b.weight", [Rq, H * D], Q8, ["attn.wq_b.weight"]),
            ("attn_kv.weight", [E, D], Q8, ["attn.wkv.weight"]),
            ("attn_kv_a_norm.weight", [D], F32, ["attn.kv_norm.weight", "attn.norm.weight"]),
            ("attn_sinks.weight", [H], F32, ["attn.attn_sink"]),
            ("attn_output_a.weight", [H * D // G, G * Ro], Q8, ["attn.wo_a.weight"]),
            ("attn_output_b.weight", [G * Ro, E], Q8, ["attn.wo_b.weight"]),
            ("hc_ffn_fn.weight", [hc * E, mix], F16, ["hc_ffn_fn"]),
            ("hc_ffn_scale.weight", [3], F32, ["hc_ffn_scale"]),
            ("hc_ffn_base.weight", [mix], F32, ["hc_ffn_base"]),
            ("ffn_norm.weight", [E], F32, ["ffn_norm.weight"]),
            ("ffn_gate_inp.weight", [E, X], F16, ["ffn.gate.weight"]),
            ("ffn_gate_exps.weight", [E, Fe, X], EXP_GU, ("experts", "w1")),
            ("ffn_up_exps.weight", [E, Fe, X], EXP_GU, ("experts", "w3")),
            ("ffn_down_exps.weight", [Fe, E, X], EXP_D, ("experts", "w2")),
            ("ffn_gate_shexp.weight", [E, Fe], Q8, ["ffn.shared_experts.w1.weight"]),
            ("ffn_up_shexp.weight", [E, Fe], Q8, ["ffn.shared_experts.w3.weight"]),
            ("ffn_down_shexp.weight", [Fe, E], Q8, ["ffn.shared_experts.w2.weight"]),
        ]
        if l < n_hash(cfg):
            L.append(("ffn_gate_tid2eid.weight", [k, V], I32, ["ffn.gate.tid2eid"]))
        else:
            L.append(("exp_probs_b.bias", [X], F32, ["ffn.gate.bias"]))
        if r:
            coff = 2 if kind == KIND_CSA else 1
            L += [
                ("attn_compressor_ape.weight", [coff * D, r], F16, ["attn.compressor.ape"]),
                ("attn_compressor_kv.weight", [E, coff * D], F16, ["attn.compressor.wkv.weight"]),
                ("attn_compressor_gate.weight", [E, coff * D], F16, ["attn.compressor.wgate.weight"]),
                ("attn_compressor_norm.weight", [D], F32, ["attn.compressor.norm.weight"]),
            ]
        if kind == KIND_CSA:
            L += [
                ("indexer.attn_q_b.weight", [Rq, HI * DI], F16, ["attn.indexer.wq_b.weight"]),
                ("indexer.proj.weight", [E, HI], F16, ["attn.indexer.weights_proj.weight"]),
                ("indexer_compressor_ape.weight", [2 * DI, r], F16, ["attn.indexer.compressor.ape"]),
                ("indexer_compressor_kv.weight", [E, 2 * DI], F16, ["attn.indexer.compressor.wkv.weight"]),
                ("indexer_compressor_gate.weight", [E, 2 * DI], F16, ["attn.indexer.compressor.wgate.weight"]),
                ("indexer_compressor_norm.weight", [DI], F32, ["attn.indexer.compressor.norm.weight"]),
            ]
        out += [(p + n, ne, fam, (l, src)) for n, ne, fam, src in L]
    return out


def _find(st, layer, names):
    for n in names:
        for pre in ([f"layers.{layer}.", f"model.layers.{layer}."] if layer is not None else ["", "model."]):
            if pre + n in st:
                return pre + n
    raise KeyError(f"none of {names} (layer {layer}) in checkpoint")


def _scale(entry):
    # U8 scales are UE8M0 exponents, like F8_E8M0
    return st_np.e8m0_to_f32(entry[2]) if entry[0] == "U8" else st_np.to_f32(entry)


def dequant_official(st, name):
    """Float values of an official-encoding tensor: FP8 E4M3 with a 128x128
    UE8M0 block scale, FP4 E2M1 packed (low nibble first) with a UE8M0 scale
    per 32 inputs, or a plain float/int tensor."""
    dtype, shape, arr = st[name]
    scale_name = name[:-len(".weight")] + ".scale" if name.endswith(".weight") else None
    if dtype == "F8_E4M3":
        s = _scale(st[scale_name])
        full = np.kron(s, np.ones((128, 128), np.float32))[:shape[0], :shape[1]]
        return st_np.e4m3_to_f32(arr) * full
    if dtype in ("I8", "U8", "F4") and scale_name in st:
        b = arr.view(np.uint8)
        vals = np.empty((b.shape[0], b.shape[1] * 2), np.float32)
        vals[:, 0::2] = st_np.FP4_VALUES[b & 15]
        vals[:, 1::2] = st_np.FP4_VALUES[b >> 4]
        s = _scale(st[scale_name])
        return vals * np.repeat(s, 32, axis=1)
    return st_np.to_f32(st[name])


def source_values(st, cfg, src):
    """Expected float values (numpy, GGUF ne reversed) of one tensor."""
    if isinstance(src, list):            # global
        return dequant_official(st, _find(st, None, src))
    layer, spec = src
    if isinstance(spec, tuple):          # routed experts
        w = spec[1]
        X, Fe = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        per = f"ffn.experts.0.{w}.weight"
        try:
            _find(st, layer, [per])
            return np.stack([dequant_official(st, _find(st, layer, [f"ffn.experts.{e}.{w}.weight"]))
                             for e in range(X)])
        except KeyError:
            if w == "w2":
                return st_np.to_f32(st[_find(st, layer, ["mlp.experts.down_proj"])])
            gu = st_np.to_f32(st[_find(st, layer, ["mlp.experts.gate_up_proj"])])
            return gu[:, :Fe] if w == "w1" else gu[:, Fe:]
    return dequant_official(st, _find(st, layer, spec))


def metadata(cfg):
    """{key: (gguf value type name, expected value)} for every section-2 key,
    plus deepseek4.attention.layer_kinds when the ratios do not imply the
    kinds."""
    n = cfg["num_hidden_layers"]
    rp = cfg["rope_parameters"]["compress"]
    lim = cfg["swiglu_limit"]
    U32, F, B, S, A = "UINT32", "FLOAT32", "BOOL", "STRING", "ARRAY"
    extra = {} if kinds_follow_ratios(cfg) else {"deepseek4.attention.layer_kinds": (A, kinds(cfg))}
    return extra | {
        "general.architecture": (S, "deepseek4"),
        "deepseek4.block_count": (U32, n),
        "deepseek4.context_length": (U32, cfg["max_position_embeddings"]),
        "deepseek4.embedding_length": (U32, cfg["hidden_size"]),
        "deepseek4.vocab_size": (U32, cfg["vocab_size"]),
        "deepseek4.attention.head_count": (U32, cfg["num_attention_heads"]),
        "deepseek4.attention.head_count_kv": (U32, cfg["num_key_value_heads"]),
        "deepseek4.attention.key_length": (U32, cfg["head_dim"]),
        "deepseek4.attention.value_length": (U32, cfg["head_dim"]),
        "deepseek4.rope.dimension_count": (U32, int(cfg["head_dim"] * cfg["partial_rotary_factor"])),
        "deepseek4.attention.q_lora_rank": (U32, cfg["q_lora_rank"]),
        "deepseek4.attention.output_lora_rank": (U32, cfg["o_lora_rank"]),
        "deepseek4.attention.output_group_count": (U32, cfg["o_groups"]),
        "deepseek4.attention.sliding_window": (U32, cfg["sliding_window"]),
        "deepseek4.attention.compress_ratios": (A, ratios(cfg)),
        "deepseek4.attention.compress_rope_freq_base": (F, cfg["compress_rope_theta"]),
        "deepseek4.rope.freq_base": (F, cfg["rope_theta"]),
        "deepseek4.rope.scaling.type": (S, "yarn"),
        "deepseek4.rope.scaling.factor": (F, rp["factor"]),
        "deepseek4.rope.scaling.original_context_length": (U32, rp["original_max_position_embeddings"]),
        "deepseek4.rope.scaling.yarn_beta_fast": (F, rp["beta_fast"]),
        "deepseek4.rope.scaling.yarn_beta_slow": (F, rp["beta_slow"]),
        "deepseek4.attention.layer_norm_rms_epsilon": (F, cfg["rms_norm_eps"]),
        "deepseek4.attention.indexer.head_count": (U32, cfg["index_n_heads"]),
        "deepseek4.attention.indexer.key_length": (U32, cfg["index_head_dim"]),
        "deepseek4.attention.indexer.top_k": (U32, cfg["index_topk"]),
        "deepseek4.hyper_connection.count": (U32, cfg["hc_mult"]),
        "deepseek4.hyper_connection.sinkhorn_iterations": (U32, cfg["hc_sinkhorn_iters"]),
        "deepseek4.hyper_connection.epsilon": (F, cfg["hc_eps"]),
        "deepseek4.expert_count": (U32, cfg["n_routed_experts"]),
        "deepseek4.expert_used_count": (U32, cfg["num_experts_per_tok"]),
        "deepseek4.expert_feed_forward_length": (U32, cfg["moe_intermediate_size"]),
        "deepseek4.expert_shared_count": (U32, cfg["n_shared_experts"]),
        "deepseek4.hash_layer_count": (U32, n_hash(cfg)),
        "deepseek4.expert_weights_scale": (F, cfg["routed_scaling_factor"]),
        "deepseek4.expert_weights_norm": (B, cfg["norm_topk_prob"]),
        "deepseek4.expert_gating_func": (U32, 4),
        "deepseek4.swiglu_clamp_exp": (A, [lim] * n),
        "deepseek4.swiglu_clamp_shexp": (A, [lim] * n),
        "deepseek4.nextn_predict_layers": (U32, cfg["num_nextn_predict_layers"]),
    }
