"""The qwen3 family: target model, EAGLE-1 / EAGLE-3 heads and the mapping table.

Qwen3 is Llama-shaped with three differences, all in the attention:
  * q_norm / k_norm: an RMSNorm over each head's features (weight [head_dim]) applied
    to q and k after the projection and before rope;
  * attention_bias (default False) puts a bias on q/k/v and o_proj (as transformers);
  * sliding windows per layer: ``config.sliding_window`` on the layers whose
    ``layer_types`` entry is "sliding_attention" (transformers derives layer_types
    from use_sliding_window / max_window_layers; sliding_window is None unless
    use_sliding_window).
head_dim comes from the config (Qwen3 sets it; it need not be hidden / heads).

The EAGLE-3 head is vLLM's Eagle3Qwen3ForCausalLM: the Qwen3 attention (q/k norms
included) reading cat([embeds, hidden]) of width 2H; speculators checkpoints whose
transformer_layer_config has model_type qwen3 resolve to it. (SpecForge heads for Qwen3
targets are LlamaForCausalLMEagle3 and load through the llama family.) The EAGLE-1
head is the yuhuili layout over a Qwen3 decoder layer.

Not covered: Qwen3-MoE (Qwen3MoeForCausalLM) needs a routed-experts MLP; EAGLE-3 heads
for MoE targets are dense Llama/Qwen3 heads and load through their own family.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ..hookspecs import hookimpl
from ..specs import FamilySpec, WeightMapping
from .heads import Eagle3Head, EagleHead, cfg, rms_norm
from .llama import LLAMA_MAPPING, LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP

# The HF names are Llama's plus self_attn.q_norm / k_norm, which load under their own
# names: the Llama table (strip model., fuse q/k/v and gate/up) is the whole table.
QWEN3_MAPPING: WeightMapping = LLAMA_MAPPING


def layer_sliding_window(config: Any, layer_idx: int) -> Optional[int]:
    """The attention window of layer ``layer_idx`` (None: full attention)."""
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


class Qwen3Attention(LlamaAttention):
    """Llama attention + per-head q/k RMSNorm before rope + per-layer sliding window."""

    def __init__(self, config, layer_idx: int = 0, input_size: Optional[int] = None):
        super().__init__(config, layer_idx=layer_idx, input_size=input_size)
        head_dim = self.qkv_proj.head_size
        self.q_norm = rms_norm(config, head_dim)
        self.k_norm = rms_norm(config, head_dim)
        self.attn.sliding_window = layer_sliding_window(config, layer_idx)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))  # [B,T,heads,d]: the norms act on d
        q, k = self.rotary_emb(positions, self.q_norm(q), self.k_norm(k))
        return self.o_proj(self.attn(q, k, v))


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention
    mlp_cls = LlamaMLP  # silu(gate) * up, no bias: the same MLP


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Target model (tie_word_embeddings as the config says, like Llama)."""

    decoder_layer_cls = Qwen3DecoderLayer
    weight_mapping = QWEN3_MAPPING


class Qwen3EagleHead(EagleHead):
    decoder_layer_cls = Qwen3DecoderLayer
    weight_mapping = QWEN3_MAPPING


class Qwen3Eagle3Head(Eagle3Head):
    attention_cls = Qwen3Attention
    mlp_cls = LlamaMLP
    decoder_layer_cls = Qwen3DecoderLayer
    weight_mapping = QWEN3_MAPPING


def _qwen3_config(*args, **kwargs):
    from transformers import Qwen3Config  # imported on use: plugin discovery stays quick

    return Qwen3Config(*args, **kwargs)


@hookimpl
def register_families(register):
    register(FamilySpec(
        name="qwen3",
        architectures=("Qwen3ForCausalLM",),
        model_types=("qwen3",),
        target_model=Qwen3ForCausalLM,
        eagle_head=Qwen3EagleHead,
        eagle3_head=Qwen3Eagle3Head,
        weight_mapping=QWEN3_MAPPING,
        config_class=_qwen3_config,
    ))
