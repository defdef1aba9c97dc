"""The llama4 family (text): target model, EAGLE-1 head and the mapping table.

Llama 4 differs from Llama in every sublayer (transformers' Llama4TextModel):
  * attention: q/k rotated with *interleaved* pairs (2i, 2i+1) (transformers rotates
    them as complex numbers); every ``no_rope_layer_interval``-th layer is a NoPE layer
    (``no_rope_layers[i] == 0``) with global attention and, with
    ``attn_temperature_tuning``, queries scaled by
    ``1 + attn_scale * log1p(floor((pos + 1) / floor_scale))``; the rope layers attend
    within chunks of ``attention_chunk_size`` tokens (``layer_types[i] ==
    "chunked_attention"``) and, with ``use_qk_norm``, L2-normalise q and k (no weight)
    after rope;
  * feed-forward: layers in ``moe_layers`` (every ``interleave_moe_layer_step``-th)
    are MoE: a shared SwiGLU expert plus routed experts; the router picks the top
    ``num_experts_per_tok`` logits and scales each chosen expert's *input* by the
    sigmoid of its logit. Dense layers use ``intermediate_size_mlp``.

Routed experts load from either checkpoint spelling, both in LLAMA4_MAPPING's rows:
fused 3-D tensors (``experts.gate_up_proj`` [E, H, 2I], ``experts.down_proj``
[E, I, H], transformers' layout, kept as the parameters) and per-expert linears
(``experts.{e}.gate_proj.weight`` [I, H], ``up_proj``, ``down_proj`` [H, I]).
Llama4ForConditionalGeneration checkpoints nest the text model under
``language_model.``; the vision tower is not loaded.

The routed experts run densely (every expert sees every token, with a zero input scale
when not chosen: exact, fixed shapes, no host sync, E times the expert compute). A fused
MoE kernel is the way to real sizes.

EAGLE-1 head (vLLM's EagleLlama4ForCausalLM): fc(cat([embed, hidden])) (no bias unless
the file has one), a dense Llama4 decoder layer that keeps its input norm, a final
RMSNorm whose output is both the logits' input and the fed-back feature, lm_head over
the (possibly truncated) draft vocabulary. EAGLE-3 heads for Llama 4 targets
(nvidia/Llama-4-Maverick-17B-128E-Eagle3, SpecForge, speculators) are Llama-layer
heads (LlamaForCausalLMEagle3): they load through the llama family and read this
target's aux hidden states, as vLLM serves them; this family registers no EAGLE-3 head.
"""
from __future__ import annotations

from typing import Any, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..hookspecs import hookimpl
from ..specs import FamilySpec, WeightMapping
from . import parallel_state as ps
from .attention import Attention
from .heads import EagleHead, cfg, rms_norm
from .layers import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    SiluAndMul,
    check_shape,
    get_rope,
)
from .llama import LlamaForCausalLM

# HF checkpoint names -> this module's parameters (routed-expert rows are added per
# model by llama4_mapping(num_experts): they name the expert index).
LLAMA4_MAPPING = WeightMapping(
    renames=(
        ("^language_model.", ""),  # Llama4ForConditionalGeneration: the text model inside
        ("^model.", ""),
    ),
    stacked=(
        (".qkv_proj", ".q_proj", "q"),
        (".qkv_proj", ".k_proj", "k"),
        (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0),  # shared expert and dense MLPs
        (".gate_up_proj", ".up_proj", 1),
    ),
    ignored=("rotary_emb.inv_freq", "vision_model.", "multi_modal_projector."),
)


def expert_rows(num_experts: int) -> tuple[tuple[str, str, Any], ...]:
    """Per-expert linears -> slices of the fused expert tensors (shard (part, expert)).

    The trailing ``.weight`` keeps ``experts.1.`` from matching ``experts.12.``; these
    rows come before the generic gate/up rows, which would otherwise claim the keys.
    """
    rows = []
    for e in range(num_experts):
        rows += [
            (".experts.gate_up_proj", f".experts.{e}.gate_proj.weight", ("gate", e)),
            (".experts.gate_up_proj", f".experts.{e}.up_proj.weight", ("up", e)),
            (".experts.down_proj", f".experts.{e}.down_proj.weight", ("down", e)),
        ]
    return tuple(rows)


def llama4_mapping(num_experts: int) -> WeightMapping:
    return WeightMapping(
        renames=LLAMA4_MAPPING.renames,
        stacked=expert_rows(num_experts) + LLAMA4_MAPPING.stacked,
        ignored=LLAMA4_MAPPING.ignored,
    )


def text_config(config: Any) -> Any:
    """The text part of a Llama4Config (multimodal) or the config itself."""
    return cfg(config, "text_config", config)


def uses_rope(config: Any, layer_idx: int) -> bool:
    """False for NoPE layers: ``no_rope_layers[i] == 0`` (1 = rope)."""
    flags = cfg(config, "no_rope_layers")
    if not flags:  # transformers' default: a NoPE layer every no_rope_layer_interval layers
        return (layer_idx + 1) % cfg(config, "no_rope_layer_interval", 4) != 0
    if layer_idx >= len(flags):
        raise ValueError(f"config no_rope_layers has {len(flags)} entries but layer {layer_idx} was asked for: "
                         f"give one 0/1 flag per layer (num_hidden_layers)")
    return bool(flags[layer_idx])


def chunk_size(config: Any, layer_idx: int) -> Optional[int]:
    """attention_chunk_size on "chunked_attention" layers (by default the rope layers)."""
    size = cfg(config, "attention_chunk_size")
    layer_types = cfg(config, "layer_types")
    if size is None:
        return None
    if layer_types is None:
        return size if uses_rope(config, layer_idx) else None
    if layer_idx >= len(layer_types):
        raise ValueError(f"config layer_types has {len(layer_types)} entries but layer {layer_idx} was asked for: "
                         f"give one entry ('chunked_attention' / 'full_attention') per layer (num_hidden_layers)")
    return size if layer_types[layer_idx] == "chunked_attention" else None


def is_moe_layer(config: Any, layer_idx: int) -> bool:
    moe_layers = cfg(config, "moe_layers")
    if moe_layers is None:
        step = cfg(config, "interleave_moe_layer_step", 1)
        return step > 0 and (layer_idx + 1) % step == 0
    return layer_idx in moe_layers


class L2Norm(nn.Module):
    """x / rms(x) over the last dimension, no weight (Llama 4's q/k norm)."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Llama4Attention(nn.Module):
    """qkv, interleaved rope + L2 q/k norm (rope layers) or temperature-tuned queries
    (NoPE layers), chunked (rope layers) or global attention, o_proj."""

    def __init__(self, config, layer_idx: int = 0, input_size: Optional[int] = None):
        super().__init__()
        H, heads = config.hidden_size, config.num_attention_heads
        kv_heads = cfg(config, "num_key_value_heads", heads)
        head_dim = cfg(config, "head_dim", H // heads)
        bias = bool(cfg(config, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(input_size or H, head_dim, heads, kv_heads, bias=bias)
        self.o_proj = RowParallelLinear(heads * head_dim, H, bias=bias)
        self.use_rope = uses_rope(config, layer_idx)
        self.rotary_emb = get_rope(config, head_dim, interleaved=True) if self.use_rope else None
        use_qk_norm = self.use_rope and bool(cfg(config, "use_qk_norm", False))
        self.qk_norm = L2Norm(cfg(config, "rms_norm_eps", 1e-5)) if use_qk_norm else None
        tuning = not self.use_rope and bool(cfg(config, "attn_temperature_tuning", False))
        self.floor_scale = float(cfg(config, "floor_scale", 8192)) if tuning else None
        self.attn_scale = float(cfg(config, "attn_scale", 0.1))
        self.attn = Attention(self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, head_dim, layer_idx=layer_idx,
                              attention_chunk_size=chunk_size(config, layer_idx))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        if self.rotary_emb is not None:
            q, k = self.rotary_emb(positions, q, k)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q), self.qk_norm(k)
        if self.floor_scale is not None:  # per-token query temperature, by the token's position
            scale = torch.log1p(torch.floor((positions.float() + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
            q = (q * scale[..., None, None]).to(q.dtype)
        return self.o_proj(self.attn(q, k, v))


class Llama4MLP(nn.Module):
    """silu(gate) * up -> down (the shared expert and the dense layers)."""

    def __init__(self, config, intermediate_size: int):
        super().__init__()
        if cfg(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"llama4 MLP supports hidden_act='silu', config has {config.hidden_act!r}")
        H = config.hidden_size
        self.gate_up_proj = MergedColumnParallelLinear(H, [intermediate_size, intermediate_size])
        self.down_proj = RowParallelLinear(intermediate_size, H)
        self.act = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class Llama4Experts(nn.Module):
    """E SwiGLU experts in transformers' layout: ``gate_up_proj`` [E, H, 2I] (x @ W,
    gate columns then up columns), ``down_proj`` [E, I, H].

    Tensor parallel: each rank holds I/tp of the gate columns, of the up columns and of
    the down rows; the caller sums the partial outputs over ranks.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.tp_rank = ps.get_tp_rank()
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.local = ps.divide(intermediate_size, ps.get_tp_size(), "expert intermediate size")
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden_size, 2 * self.local))
        self.gate_up_proj.weight_loader = self._load_gate_up
        self.gate_up_proj.shard_ids = tuple((p, e) for e in range(num_experts) for p in ("gate", "up"))
        self.down_proj = nn.Parameter(torch.empty(num_experts, self.local, hidden_size))
        self.down_proj.weight_loader = self._load_down
        self.down_proj.shard_ids = tuple(("down", e) for e in range(num_experts))

    def _mine(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.narrow(dim, self.tp_rank * self.local, self.local)

    @torch.no_grad()
    def _load_gate_up(self, param, loaded, shard_id=None):
        E, H, I, n = self.num_experts, self.hidden_size, self.intermediate_size, self.local
        if shard_id is None:  # fused [E, H, 2I]
            check_shape(loaded, (E, H, 2 * I), "experts.gate_up_proj")
            gate, up = loaded.split(I, -1)
            param.data[..., :n].copy_(self._mine(gate, -1))
            param.data[..., n:].copy_(self._mine(up, -1))
            return
        part, e = shard_id  # one expert's nn.Linear weight [I, H]
        check_shape(loaded, (I, H), f"expert {e} {part}_proj")
        cols = slice(0, n) if part == "gate" else slice(n, 2 * n)
        param.data[e, :, cols].copy_(self._mine(loaded, 0).t())

    @torch.no_grad()
    def _load_down(self, param, loaded, shard_id=None):
        E, H, I = self.num_experts, self.hidden_size, self.intermediate_size
        if shard_id is None:  # fused [E, I, H]
            check_shape(loaded, (E, I, H), "experts.down_proj")
            param.data.copy_(self._mine(loaded, 1))
            return
        _, e = shard_id  # one expert's nn.Linear weight [H, I]
        check_shape(loaded, (H, I), f"expert {e} down_proj")
        param.data[e].copy_(self._mine(loaded, 1).t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [E, N, H] (each expert's input) -> [E, N, H] (this rank's partial sums)."""
        gate, up = torch.bmm(x, self.gate_up_proj).chunk(2, -1)
        return torch.bmm(F.silu(gate) * up, self.down_proj)

    def extra_repr(self) -> str:
        return f"experts={self.num_experts}, hidden={self.hidden_size}, intermediate={self.local}"


class Llama4MoE(nn.Module):
    """shared_expert(x) + sum over chosen experts e of expert_e(x * sigmoid(router_e(x)))."""

    def __init__(self, config):
        super().__init__()
        H, E = config.hidden_size, config.num_local_experts
        self.top_k = cfg(config, "num_experts_per_tok", 1)
        self.router = ReplicatedLinear(H, E)
        self.tp = ps.get_tp()  # the experts' partial sums are reduced over this group
        self.experts = Llama4Experts(E, H, config.intermediate_size)
        self.shared_expert = Llama4MLP(config, config.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, x = x.shape, x.reshape(-1, x.shape[-1])
        logits = self.router(x)  # [N, E]
        top, idx = logits.topk(self.top_k, dim=-1)
        # Unchosen experts get sigmoid(-inf) = 0: a zero input, hence a zero output.
        scores = torch.full_like(logits, float("-inf")).scatter_(1, idx, top).float().sigmoid().to(x.dtype)
        routed = self.experts(x.unsqueeze(0) * scores.t().unsqueeze(-1)).sum(0)
        out = self.shared_expert(x) + ps.all_reduce(routed, self.tp)
        return out.view(shape)


class Llama4DecoderLayer(nn.Module):
    """Pre-norm attention and feed-forward (MoE on ``moe_layers``), residuals inside."""

    allow_moe: ClassVar[bool] = True
    make_norm = staticmethod(rms_norm)

    def __init__(self, config, layer_idx: int = 0):
        super().__init__()
        H = config.hidden_size
        self.input_layernorm = self.make_norm(config, H)
        self.self_attn = Llama4Attention(config, layer_idx=layer_idx)
        self.post_attention_layernorm = self.make_norm(config, H)
        if self.allow_moe and is_moe_layer(config, layer_idx):
            self.feed_forward = Llama4MoE(config)
        else:
            self.feed_forward = Llama4MLP(config, cfg(config, "intermediate_size_mlp", config.intermediate_size))

    def forward(self, positions: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        h = h + self.self_attn(positions, self.input_layernorm(h))
        return h + self.feed_forward(self.post_attention_layernorm(h))


class Llama4DenseDecoderLayer(Llama4DecoderLayer):
    """The EAGLE head's layer: always the dense MLP (intermediate_size_mlp)."""

    allow_moe = False


class Llama4ForCausalLM(LlamaForCausalLM):
    """Target model: Llama4ForCausalLM, or the text model of Llama4ForConditionalGeneration.

    Built from the text config; parameters are named like the text checkpoint without
    ``model.`` (and without ``language_model.``).
    """

    decoder_layer_cls = Llama4DecoderLayer
    weight_mapping = LLAMA4_MAPPING

    def __init__(self, config):
        config = text_config(config)
        super().__init__(config)
        if any(isinstance(layer.feed_forward, Llama4MoE) for layer in self.layers):
            self.weight_mapping = llama4_mapping(config.num_local_experts)


class Llama4EagleHead(EagleHead):
    decoder_layer_cls = Llama4DenseDecoderLayer
    weight_mapping = LLAMA4_MAPPING
    input_norm_identity = False  # vLLM's head keeps the layer's input norm
    final_norm = True
    norm_output = True  # vLLM's model returns norm(h) for the logits and the next step


def _llama4_config(*args, **kwargs):
    from transformers import Llama4TextConfig  # imported on use: plugin discovery stays quick

    return Llama4TextConfig(*args, **kwargs)


@hookimpl
def register_families(register):
    register(FamilySpec(
        name="llama4",
        architectures=("Llama4ForCausalLM", "Llama4ForConditionalGeneration"),
        model_types=("llama4", "llama4_text"),
        target_model=Llama4ForCausalLM,
        eagle_head=Llama4EagleHead,
        eagle3_head=None,
        weight_mapping=LLAMA4_MAPPING,
        config_class=_llama4_config,
    ))
