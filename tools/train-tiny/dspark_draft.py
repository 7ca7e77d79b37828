"""The DSpark block drafter's pieces shared by its oracle
(tests/oracles/ds4_dspark_oracle.py) and its training for the tiny model
(train_dspark.py): the draft's config for nemo-automodel's DeepSeek V4 DSpark
draft module, the target features a DeepSeek V4 model gives it, and the
DSpark support GGUF the engine reads (src/models/dsv4/ds4_layout.h)."""
import types

import torch

import hf_trunk


def draft_config(cfg, targets, *, layers, heads, head_dim, rope_dim, q_lora, o_groups, o_lora, ff, markov_rank,
                 block_size=5, num_anchors=1):
    """The draft's config: the target's width, vocabulary and norm epsilon
    with DSpark's fields and a small dense body (nemo derives the draft config
    from the target's the same way). The mask token is the vocabulary's last
    id."""
    c = types.SimpleNamespace()
    c.vocab_size = cfg.vocab_size
    c.hidden_size = cfg.hidden_size
    c.num_hidden_layers = layers
    c.num_attention_heads = heads
    c.head_dim = head_dim
    c.qk_rope_head_dim = rope_dim
    c.q_lora_rank = q_lora
    c.o_groups = o_groups
    c.o_lora_rank = o_lora
    c.moe_intermediate_size = ff
    c.hidden_act = "silu"
    c.rms_norm_eps = cfg.rms_norm_eps
    c.rope_theta = 10000.0
    c.pad_token_id = None
    c.attention_dropout = 0.0
    c.target_layer_ids = list(targets)
    c.mask_token_id = cfg.vocab_size - 1
    c.num_anchors = num_anchors
    c.block_size = block_size
    c.enable_confidence_head = True
    c.confidence_head_with_markov = True
    c.markov_rank = markov_rank
    c.markov_head_type = "vanilla"
    return c


@torch.no_grad()
def target_features(model, ids, targets, check=False):
    """What the draft reads from transformers' DeepseekV4ForCausalLM over ids
    [1][T]: per position, each target layer's output as the mean of its
    hyper-connection streams ([1][T][len(targets) * E], as nemo's target
    wrapper concatenates them), and the input of the output head ([1][T][E],
    for the target's own next-token distribution). check: the trunk written
    out here must reproduce transformers' logits exactly."""
    layers, _, _, _ = hf_trunk.trunk(model, ids)
    m = model.model
    last = m.norm(m.hc_head(layers[-1]))
    if check and (model.lm_head(last) - model(input_ids=ids, use_cache=False).logits).abs().max().item() != 0.0:
        raise RuntimeError("the trunk does not reproduce transformers' forward")
    return torch.cat([layers[t].mean(dim=2) for t in targets], dim=-1), last


def write_gguf(path, draft, c, n_layer_target, name, f16=False):
    """The DSpark support GGUF of draft (nemo's module): f32, or with f16 its
    matrices in F16 (vectors stay f32)."""
    import gguf
    w = gguf.GGUFWriter(path, "dspark")
    w.add_name(name)
    k = lambda s: "dspark." + s
    for key, value in (("embedding_length", c.hidden_size), ("vocab_size", c.vocab_size),
                       ("target_block_count", n_layer_target)):
        w.add_uint32(k(key), value)
    w.add_array(k("target_layers"), [int(t) for t in c.target_layer_ids])
    for key, value in (("block_count", c.num_hidden_layers), ("block_size", c.block_size),
                       ("mask_token_id", c.mask_token_id), ("head_count", c.num_attention_heads),
                       ("key_length", c.head_dim), ("rope.dimension_count", c.qk_rope_head_dim)):
        w.add_uint32(k(key), value)
    w.add_float32(k("rope.freq_base"), c.rope_theta)
    for key, value in (("q_lora_rank", c.q_lora_rank), ("output_group_count", c.o_groups),
                       ("output_lora_rank", c.o_lora_rank), ("feed_forward_length", c.moe_intermediate_size),
                       ("markov_rank", c.markov_rank)):
        w.add_uint32(k(key), value)
    w.add_float32(k("layer_norm_rms_epsilon"), c.rms_norm_eps)
    sd = draft.state_dict()
    def t(name, src):
        a = sd[src].detach().float().contiguous().numpy()
        w.add_tensor(name, a.astype("float16") if f16 and a.ndim == 2 else a)
    t("dspark.fc.weight", "fc.weight")
    t("dspark.hidden_norm.weight", "hidden_norm.weight")
    t("dspark.norm.weight", "norm.weight")
    t("dspark.markov_w1.weight", "markov_head.markov_w1.weight")
    t("dspark.markov_w2.weight", "markov_head.markov_w2.weight")
    t("dspark.confidence.weight", "confidence_head.proj.weight")
    t("dspark.confidence.bias", "confidence_head.proj.bias")
    names = {"attn_norm": "input_layernorm", "attn_q_a": "self_attn.wq_a", "attn_q_a_norm": "self_attn.q_norm",
             "attn_q_b": "self_attn.wq_b", "attn_kv": "self_attn.wkv", "attn_kv_a_norm": "self_attn.kv_norm",
             "attn_sinks": "self_attn.sinks_param", "attn_output_a": "self_attn.wo_a",
             "attn_output_b": "self_attn.wo_b", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for l in range(c.num_hidden_layers):
        for ours, theirs in names.items():
            t(f"dspark.blk.{l}.{ours}.weight", f"layers.{l}.{theirs}.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
