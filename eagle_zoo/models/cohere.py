"""The cohere family (Command R / R+ and Command R7B / A): target model, EAGLE-1 head
and the mapping table.

Cohere differs from Llama in the block and the norms (transformers' CohereModel and
Cohere2Model):
  * LayerNorm with a weight and no bias (mean-centred, computed in float32);
  * one norm per layer and a *parallel* block: h + attn(ln(h)) + mlp(ln(h));
  * rope on interleaved pairs (2i, 2i+1);
  * logits = lm_head(h) * logit_scale, lm_head tied to the embeddings by default;
  * Cohere (v1) with ``use_qk_norm``: per-head LayerNorms on q and k (weight
    [heads, head_dim]) before rope;
  * Cohere2: ``layer_types`` (from ``sliding_window_pattern``): "sliding_attention"
    layers use rope and a ``sliding_window``; "full_attention" layers attend globally
    without rope. A config without layer_types (Cohere v1) ropes every layer.

EAGLE-1 head (vLLM's EagleCohereForCausalLM): fc(cat([embed, hidden])) with a bias,
Cohere decoder layers that keep their input norm (for Cohere2 drafts, layer i follows
the draft config's layer_types[i]), a final LayerNorm whose output is both the logits'
input and the fed-back feature, logits scaled by logit_scale; embeddings and lm_head
come from the target (the checkpoints have none: tied embeddings). Its weights load
with or without a ``model.`` prefix (vLLM's module tree has one).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..hookspecs import hookimpl
from ..specs import FamilySpec, WeightMapping
from .attention import Attention
from .heads import EagleHead, cfg
from .layers import QKVParallelLinear, RowParallelLinear, check_shape, get_rope
from .llama import LLAMA_MAPPING, LlamaForCausalLM, LlamaMLP

# HF names are Llama's (minus post_attention_layernorm, plus q_norm / k_norm which load
# under their own names): the Llama table is the whole table.
COHERE_MAPPING: WeightMapping = LLAMA_MAPPING


class CohereLayerNorm(nn.Module):
    """(x - mean) / sqrt(var + eps) * weight over the last dimension, no bias, in float32.

    ``shape`` may be (heads, head_dim) for the per-head q/k norms: one weight row per head.
    """

    def __init__(self, shape, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf - xf.mean(-1, keepdim=True)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * xf).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def layer_norm(config: Any, size: int) -> nn.Module:
    return CohereLayerNorm(size, cfg(config, "layer_norm_eps", 1e-5))


def head_norm(config: Any, total_heads: int, local_heads: int, index: int, head_dim: int) -> CohereLayerNorm:
    """A per-head LayerNorm holding heads [index * local, +local) of the checkpoint's rows."""
    norm = CohereLayerNorm((local_heads, head_dim), cfg(config, "layer_norm_eps", 1e-5))

    @torch.no_grad()
    def weight_loader(param, loaded, shard_id=None):
        if shard_id is not None:
            raise ValueError(f"a q/k norm is not fused, but shard {shard_id!r} was given")
        check_shape(loaded, (total_heads, head_dim))
        param.data.copy_(loaded.narrow(0, index * local_heads, local_heads))

    norm.weight.weight_loader = weight_loader
    return norm


def layer_kind(config: Any, layer_idx: int) -> Optional[str]:
    """layer_types[layer_idx], or None for configs without layer types (Cohere v1)."""
    layer_types = cfg(config, "layer_types")
    if layer_types is None:
        return None
    if layer_idx >= len(layer_types):
        raise ValueError(
            f"config layer_types has {len(layer_types)} entries but layer {layer_idx} was asked for: "
            f"give one entry ('full_attention' / 'sliding_attention') per layer (num_hidden_layers)"
        )
    return layer_types[layer_idx]


class CohereAttention(nn.Module):
    """qkv, optional per-head q/k LayerNorm, interleaved rope (all layers in v1; sliding
    layers in Cohere2), windowed or global attention, o_proj."""

    def __init__(self, config, layer_idx: int = 0, input_size: Optional[int] = None):
        super().__init__()
        H, heads = config.hidden_size, config.num_attention_heads
        kv_heads = cfg(config, "num_key_value_heads", heads)
        head_dim = cfg(config, "head_dim", H // heads)
        bias = bool(cfg(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(input_size or H, head_dim, heads, kv_heads, bias=bias)
        self.o_proj = RowParallelLinear(heads * head_dim, H, bias=bias)
        kind = layer_kind(config, layer_idx)
        sliding = kind == "sliding_attention"
        self.rotary_emb = get_rope(config, head_dim, interleaved=True) if kind is None or sliding else None
        if cfg(config, "use_qk_norm", False):
            qkv = self.qkv_proj
            self.q_norm = head_norm(config, heads, qkv.num_heads, qkv.shards["q"][2], head_dim)
            self.k_norm = head_norm(config, kv_heads, qkv.num_kv_heads, qkv.shards["k"][2], head_dim)
        else:
            self.q_norm = self.k_norm = None
        self.attn = Attention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, head_dim, layer_idx=layer_idx,
                              sliding_window=cfg(config, "sliding_window") if sliding else None)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))  # [B,T,heads,d]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class CohereDecoderLayer(nn.Module):
    """h + attn(ln(h)) + mlp(ln(h)): attention and MLP in parallel on one norm."""

    make_norm = staticmethod(layer_norm)

    def __init__(self, config, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = self.make_norm(config, config.hidden_size)
        self.self_attn = CohereAttention(config, layer_idx=layer_idx)
        self.mlp = LlamaMLP(config)  # silu(gate) * up, no bias: the same MLP

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        x = self.input_layernorm(h)
        return h + self.self_attn(positions, x) + self.mlp(x)


class CohereForCausalLM(LlamaForCausalLM):
    """Target model for CohereForCausalLM and Cohere2ForCausalLM (tied embeddings unless
    the config says otherwise)."""

    decoder_layer_cls = CohereDecoderLayer
    make_norm = staticmethod(layer_norm)
    weight_mapping = COHERE_MAPPING

    def __init__(self, config):
        super().__init__(config)
        self.logit_scale = float(cfg(config, "logit_scale", 1.0))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden) * self.logit_scale


class CohereEagleHead(EagleHead):
    """logit_scale is read from the config by the generic head."""

    decoder_layer_cls = CohereDecoderLayer
    make_norm = staticmethod(layer_norm)
    weight_mapping = COHERE_MAPPING
    input_norm_identity = False  # vLLM's head keeps the layer's input norm
    final_norm = True
    norm_output = True  # vLLM's model returns norm(h) for the logits and the next step
    fc_bias = True


def _cohere_config(*args, **kwargs):
    """CohereConfig, or Cohere2Config for model_type="cohere2"."""
    from transformers import Cohere2Config, CohereConfig  # imported on use: plugin discovery stays quick

    cls = Cohere2Config if kwargs.pop("model_type", "cohere") == "cohere2" else CohereConfig
    return cls(*args, **kwargs)


@hookimpl
def register_families(register):
    register(FamilySpec(
        name="cohere",
        architectures=("CohereForCausalLM", "Cohere2ForCausalLM"),
        model_types=("cohere", "cohere2"),
        target_model=CohereForCausalLM,
        eagle_head=CohereEagleHead,
        eagle3_head=None,
        weight_mapping=COHERE_MAPPING,
        config_class=_cohere_config,
    ))
