"""Qwen2 checkpoint tensor names -> this package's parameter names. Pure data.

Both kinds of checkpoint use transformers' Qwen2 names:
  target (Qwen/Qwen2-7B-Instruct ...)    model.layers.{i}.self_attn.{q,k,v,o}_proj.*,
                                         model.layers.{i}.mlp.{gate,up,down}_proj.weight,
                                         model.embed_tokens / model.norm, lm_head.weight
  yuhuili EAGLE-1 head                   the same without the ``model.`` prefix for
                                         layers.0.*, plus embed_tokens and fc (see quirks.py)
The q/k/v projections carry a bias in Qwen2; the stacking below moves
``q_proj.bias`` into shard "q" of ``qkv_proj.bias`` exactly as it moves the weight
(a key matches a part by substring), so the biases need no rows of their own.
"""
from eagle_zoo.specs import WeightMapping

QWEN2_MAPPING = WeightMapping(
    # Target checkpoints nest everything but lm_head under ``model.``.
    renames=(("^model.", ""),),
    stacked=(
        (".qkv_proj", ".q_proj", "q"),   # weight [heads*d, H] and bias [heads*d]
        (".qkv_proj", ".k_proj", "k"),   # weight [kv_heads*d, H] and bias [kv_heads*d]
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ),
    # Rotary frequencies are recomputed from the config; old exports saved them.
    ignored=("rotary_emb.inv_freq",),
)
