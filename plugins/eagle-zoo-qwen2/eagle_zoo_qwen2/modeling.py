"""The Qwen2 family on eagle-zoo's shared layers: attention, decoder layer, target
model, EAGLE-1 and EAGLE-3 heads.

Qwen2 is Llama-shaped with two differences, both in the attention:
  * q/k/v projections carry a bias, o_proj does not (transformers' Qwen2Attention;
    a yuhuili head states it with its ``qkv_bias`` key, see quirks.py);
  * optional sliding windows per layer: ``config.sliding_window`` on the layers whose
    ``layer_types`` entry is "sliding_attention" (transformers fills layer_types from
    use_sliding_window / max_window_layers and sets sliding_window to None unless
    use_sliding_window).
Everything else (SwiGLU MLP, RMSNorm, rope with rope_theta / rope scaling, tied
embeddings in the small models) is what eagle-zoo's llama family already builds, so
the classes below reuse it and only swap the attention.

Calling convention (eagle_zoo.models.heads): attention ``forward(positions, x)``,
decoder layer ``forward(positions, h) -> h`` with submodules input_layernorm,
self_attn, post_attention_layernorm, mlp.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from eagle_zoo.models.attention import Attention
from eagle_zoo.models.heads import Eagle3Head, EagleHead, cfg
from eagle_zoo.models.layers import QKVParallelLinear, RowParallelLinear, get_rope
from eagle_zoo.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP

from .mapping import QWEN2_MAPPING
from .quirks import qkv_bias


def layer_sliding_window(config: Any, layer_idx: int) -> Optional[int]:
    """The attention window of layer ``layer_idx`` (None: full causal attention)."""
    window = cfg(config, "sliding_window")
    if window is None or getattr(config, "use_sliding_window", None) is False:
        return None
    layer_types = cfg(config, "layer_types")
    if layer_types is None:  # a config transformers did not complete: its rule
        return window if layer_idx >= cfg(config, "max_window_layers", 0) else None
    if layer_idx >= len(layer_types):
        raise ValueError(
            f"config layer_types has {len(layer_types)} entries but layer {layer_idx} was asked for: "
            f"give one entry ('full_attention' / 'sliding_attention') per layer (num_hidden_layers)"
        )
    return window if layer_types[layer_idx] == "sliding_attention" else None


class Qwen2Attention(nn.Module):
    """qkv projection with bias (input_size defaults to hidden_size; EAGLE-3 reads 2H),
    rope, core attention over this layer's window, output projection without bias."""

    def __init__(self, config, layer_idx: int = 0, input_size: Optional[int] = None):
        super().__init__()
        H, heads = config.hidden_size, config.num_attention_heads
        kv_heads = cfg(config, "num_key_value_heads", heads)
        head_dim = cfg(config, "head_dim", H // heads)
        self.qkv_proj = QKVParallelLinear(input_size or H, head_dim, heads, kv_heads, bias=qkv_bias(config))
        self.o_proj = RowParallelLinear(heads * head_dim, H, bias=False)
        self.rotary_emb = get_rope(config, head_dim)
        self.attn = Attention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, head_dim,
                              layer_idx=layer_idx, sliding_window=layer_sliding_window(config, layer_idx))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class Qwen2DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen2Attention
    mlp_cls = LlamaMLP  # silu(gate) * up, no bias: Qwen2's MLP


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Target model: embed -> Qwen2 layers -> norm -> lm_head (tied when the config says)."""

    decoder_layer_cls = Qwen2DecoderLayer
    weight_mapping = QWEN2_MAPPING


class Qwen2EagleHead(EagleHead):
    """yuhuili EAGLE-1 head: fc(cat[embed, hidden]) (+bias) -> one Qwen2 layer without
    its input norm -> the target's lm_head."""

    decoder_layer_cls = Qwen2DecoderLayer
    weight_mapping = QWEN2_MAPPING


class Qwen2Eagle3Head(Eagle3Head):
    """EAGLE-3 head whose layer is a Qwen2 layer (q/k/v with bias, reading 2H).

    Published EAGLE-3 heads for Qwen2.5 targets are Llama-style
    (LlamaForCausalLMEagle3) and load through eagle-zoo's llama family; this class
    serves Eagle3Qwen2ForCausalLM / Qwen2ForCausalLMEagle3 and speculators checkpoints
    whose transformer_layer_config has model_type qwen2.
    """

    attention_cls = Qwen2Attention
    mlp_cls = LlamaMLP
    decoder_layer_cls = Qwen2DecoderLayer
    weight_mapping = QWEN2_MAPPING


def qwen2_config(*args, **kwargs):
    """transformers' own Qwen2Config (imported on use: plugin discovery stays quick)."""
    from transformers import Qwen2Config

    return Qwen2Config(*args, **kwargs)
