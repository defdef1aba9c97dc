"""The llama family: target model, EAGLE-1 / EAGLE-3 heads and the mapping table.

The pattern every family file follows: attention, MLP and decoder layer built on
eagle_zoo.models.layers; a target model; head subclasses that only set class
attributes; the mapping table as data; one @hookimpl registering a FamilySpec.
"""
from __future__ import annotations

from typing import ClassVar, Optional, Sequence

import torch
from torch import nn

from ..hookspecs import hookimpl
from ..specs import FamilySpec, WeightMapping
from .attention import Attention
from .fused_layer import CpuDecoderStack, fused_decoder_layer, layer_supports_fusion, stack_supports_cpu_call
from .heads import Eagle3Head, EagleHead, cfg, rms_norm
from .layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    SiluAndMul,
    VocabParallelEmbedding,
    get_rope,
)
from .loader import load_weights

# HF checkpoint names -> this module's parameters.
LLAMA_MAPPING = WeightMapping(
    renames=(("^model.", ""),),  # target checkpoints nest everything but lm_head under model.
    stacked=(
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),
        (".gate_up_proj", ".up_proj", 1),
    ),
    ignored=("rotary_emb.inv_freq",),
)


class LlamaAttention(nn.Module):
    """qkv projection (input_size defaults to hidden_size; EAGLE-3 uses 2H), rope,
    core attention, output projection."""

    def __init__(self, config, layer_idx: int = 0, input_size: int | None = None):
        super().__init__()
        H, heads = config.hidden_size, config.num_attention_heads
        kv_heads = cfg(config, "num_key_value_heads", heads)
        head_dim = cfg(config, "head_dim", H // heads)
        bias = bool(cfg(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(input_size or H, head_dim, heads, kv_heads, bias=bias)
        self.o_proj = RowParallelLinear(heads * head_dim, H, bias=bias)
        self.rotary_emb = get_rope(config, head_dim)
        self.attn = Attention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, head_dim,
                              layer_idx=layer_idx, sliding_window=cfg(config, "sliding_window"))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v))


class LlamaMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        if cfg(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"llama MLP supports hidden_act='silu', config has {config.hidden_act!r}")
        H, inter, bias = config.hidden_size, config.intermediate_size, bool(cfg(config, "mlp_bias", False))
        self.gate_up_proj = MergedColumnParallelLinear(H, [inter, inter], bias=bias)
        self.down_proj = RowParallelLinear(inter, H, bias=bias)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    attention_cls: ClassVar[type] = LlamaAttention
    mlp_cls: ClassVar[type] = LlamaMLP
    make_norm = staticmethod(rms_norm)

    def __init__(self, config, layer_idx: int = 0):
        super().__init__()
        self.input_layernorm = self.make_norm(config, config.hidden_size)
        self.self_attn = self.attention_cls(config, layer_idx=layer_idx)
        self.post_attention_layernorm = self.make_norm(config, config.hidden_size)
        self.mlp = self.mlp_cls(config)

    # Whether decode-shaped engine steps take models/fused_layer.py's regrouped kernels
    # (6 kernels on CUDA, one C++ call on the CPU): chosen once, when an engine's runner
    # takes the loaded model (choose_decode_path); the module path until then.
    fused_decode = False

    def choose_decode_path(self) -> None:
        self.fused_decode = layer_supports_fusion(self)

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        if self.fused_decode:
            fused = fused_decoder_layer(self, positions, h)  # None: not a decode-shaped step
            if fused is not None:
                return fused
        h = h + self.self_attn(positions, self.input_layernorm(h))
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(nn.Module):
    """Target model. Parameters are named like the HF checkpoint without ``model.``."""

    decoder_layer_cls: ClassVar[type] = LlamaDecoderLayer
    make_norm = staticmethod(rms_norm)
    weight_mapping: ClassVar[WeightMapping] = LLAMA_MAPPING

    def __init__(self, config):
        super().__init__()
        self.config = config
        H, V = config.hidden_size, config.vocab_size
        self.embed_tokens = VocabParallelEmbedding(V, H)
        self.layers = nn.ModuleList(self.decoder_layer_cls(config, i) for i in range(config.num_hidden_layers))
        self.norm = self.make_norm(config, H)
        self.lm_head = ParallelLMHead(V, H)
        self.tie_word_embeddings = bool(cfg(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                aux_layer_ids: Sequence[int] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """-> (hidden after the final norm, [residual stream entering layer i for i in aux_layer_ids])."""
        bad = [i for i in aux_layer_ids if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(f"aux_layer_ids {bad} out of range: the model has {len(self.layers)} layers")
        h = self.embed_tokens(input_ids)
        if self.cpu_stack is not None:
            stack = self.cpu_stack(positions, h, aux_layer_ids)  # None: not a CPU decode step
            if stack is not None:
                return self.norm(stack[0]), stack[1]
        aux = {}
        for i, layer in enumerate(self.layers):
            if i in aux_layer_ids:
                aux[i] = h
            h = layer(positions, h)
        return self.norm(h), [aux[i] for i in aux_layer_ids]

    # The decoder layers as one C++ call for decode-shaped CPU steps (models/fused_layer.py
    # CpuDecoderStack), or None: chosen once, after the layers chose their own paths, when an
    # engine's runner takes the loaded model; the layers' own calls until then.
    cpu_stack: Optional[CpuDecoderStack] = None

    def choose_decode_path(self) -> None:
        self.cpu_stack = CpuDecoderStack(self.layers) if stack_supports_cpu_call(self.layers) else None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights, source: str) -> set[str]:
        mapping = self.weight_mapping
        if self.tie_word_embeddings:  # some tied checkpoints still store the copy
            mapping = mapping.merged(WeightMapping(ignored=("lm_head.weight",)))
        return load_weights(self, weights, mapping, source)


class LlamaEagleHead(EagleHead):
    decoder_layer_cls = LlamaDecoderLayer
    weight_mapping = LLAMA_MAPPING


class LlamaEagle3Head(Eagle3Head):
    attention_cls = LlamaAttention
    mlp_cls = LlamaMLP
    decoder_layer_cls = LlamaDecoderLayer
    weight_mapping = LLAMA_MAPPING


def _llama_config(*args, **kwargs):
    from transformers import LlamaConfig  # imported on use: plugin discovery stays quick

    return LlamaConfig(*args, **kwargs)


@hookimpl
def register_families(register):
    register(FamilySpec(
        name="llama",
        architectures=("LlamaForCausalLM",),
        model_types=("llama",),
        target_model=LlamaForCausalLM,
        eagle_head=LlamaEagleHead,
        eagle3_head=LlamaEagle3Head,
        weight_mapping=LLAMA_MAPPING,
        config_class=_llama_config,
    ))
