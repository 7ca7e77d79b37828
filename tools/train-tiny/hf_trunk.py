"""transformers' DeepseekV4ForCausalLM run layer by layer, for what its
forward does not return: the hyper-connection streams of every layer (the
MTP block reads the last, a DSpark draft the means of chosen ones). Shared by
the MTP and DSpark oracles (tests/oracles/) and the DSpark training here."""
import torch


@torch.no_grad()
def trunk(model, ids):
    """For ids [1][T]: the HC streams after each layer ([1][T][hc][D] each, in
    layer order) and the position inputs the layers used (RoPE tables,
    positions, mask), as transformers' forward builds them."""
    from transformers.masking_utils import create_sliding_window_causal_mask
    m, cfg = model.model, model.config
    emb = m.embed_tokens(ids)
    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    mask = create_sliding_window_causal_mask(config=cfg, inputs_embeds=emb, attention_mask=None, cache=None,
                                             position_ids=pos)
    pe = {"main": m.rotary_emb(emb, position_ids=pos, layer_type="main"),
          "compress": m.rotary_emb(emb, position_ids=pos, layer_type="compress")}
    h = emb.unsqueeze(2).expand(-1, -1, cfg.hc_mult, -1).contiguous()
    layers = []
    for layer in m.layers:
        h = layer(h, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=ids, cache=None)
        layers.append(h)
    return layers, pe, pos, mask
