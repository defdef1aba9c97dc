"""A Llama-style decoder layer in 6 launches for decode-shaped steps on CUDA.

The module path runs ~13 kernels a layer (norm, qkv, rope, KV write, attention split and
merge, o_proj, add, norm, gate_up, silu-and-mul, down_proj, add). At batch 1 a step of a
small model costs per kernel, not per byte, so the same layer is regrouped here:

  qkv   = linear(rms_norm(h), W_qkv)               kernels/linear.py, norm as prologue
  q     = rope(q); cache <- rope(k), v            kernels/rope.py, one launch
  a     = attention over the cache                 kernels/attention.py (split + merge)
  h     = h + linear(a, W_o)                       residual add as epilogue
  m     = silu_and_mul(linear(rms_norm(h), W_gu))  norm prologue, activation epilogue
  h     = h + linear(m, W_down)

Roundings as kernels/linear.py says (the norm folded into the product, so in bf16 not the
module path's bits), and every kernel is batch invariant, so plain decoding, chain
verification and tree verification agree bit for bit.
Used when the layer is exactly the Llama layer (Llama, SmolLM2, Mistral-style targets and
EAGLE-1 heads built on it), on one rank, without biases, under an engine step's
AttentionContext; otherwise LlamaDecoderLayer runs its modules.
"""
from __future__ import annotations

from typing import Optional

import torch

from kernels.attention import cache_attention_triton
from kernels.linear import fused_linear_triton, use_linear_kernel
from kernels.rope import rope_write_kv_triton

from .attention import KERNEL_MAX_T, get_context
from .layers import RMSNorm


def layer_supports_fusion(layer) -> bool:
    """Static part of the check, cached on the layer: exact module types, one rank, no
    biases, whole-head neox rope, no chunked attention."""
    ok = getattr(layer, "_fusable", None)
    if ok is None:
        from .llama import LlamaAttention, LlamaMLP  # the classes the regrouping reproduces

        attn, mlp = layer.self_attn, layer.mlp
        ok = (type(attn) is LlamaAttention and type(mlp) is LlamaMLP
              and type(layer.input_layernorm) is RMSNorm and type(layer.post_attention_layernorm) is RMSNorm
              and attn.qkv_proj.tp_size == 1 and attn.o_proj.tp_size == 1
              and mlp.gate_up_proj.tp_size == 1 and mlp.down_proj.tp_size == 1
              and all(m.bias is None for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj))
              and not attn.rotary_emb.interleaved and attn.rotary_emb.rotary_dim == attn.qkv_proj.head_size
              and attn.attn.attention_chunk_size is None)
        layer._fusable = ok
    return ok


def fused_decoder_layer(layer, positions: torch.Tensor, h: torch.Tensor) -> Optional[torch.Tensor]:
    """The layer's output through the regrouped kernels, or None when they do not apply
    (CPU, prefill-sized steps, no engine context, another layer type)."""
    ctx = get_context()
    if (ctx is None or not h.is_cuda or h.dim() != 3 or h.shape[1] > KERNEL_MAX_T
            or not layer_supports_fusion(layer)):
        return None
    attn, mlp = layer.self_attn, layer.mlp
    norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
    if not (use_linear_kernel(h, attn.qkv_proj.weight, norm1.weight, attn.o_proj.weight)
            and use_linear_kernel(h, mlp.gate_up_proj.weight, norm2.weight, mlp.down_proj.weight)):
        return None
    k_cache, v_cache = ctx.kv_caches[attn.attn.layer_idx]
    # q, k, v will be views of the kernel's contiguous qkv output (unit stride in d) and
    # the angles float32 (RotaryEmbedding): what rope_write_kv needs besides the caches.
    if not (k_cache.is_cuda and k_cache.dtype == v_cache.dtype == h.dtype
            and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1):
        return None
    return fused_layer_kernels(layer, positions, h, ctx)


def fused_layer_kernels(layer, positions: torch.Tensor, h: torch.Tensor, ctx) -> torch.Tensor:
    """The regrouped layer itself, Triton kernels called directly (the checks are the
    caller's; tests run it on CPU tensors under TRITON_INTERPRET=1)."""
    attn, mlp, core = layer.self_attn, layer.mlp, layer.self_attn.attn
    norm1, norm2 = layer.input_layernorm, layer.post_attention_layernorm
    k_cache, v_cache = ctx.kv_caches[core.layer_idx]
    qkv = fused_linear_triton(h, attn.qkv_proj.weight, norm_weight=norm1.weight, eps=norm1.eps)
    q, k, v = attn.qkv_proj.split(qkv)
    cos, sin = attn.rotary_emb._angles(positions)
    q = rope_write_kv_triton(q, k, v, cos, sin, k_cache, v_cache, ctx.slot_ids, ctx.cache_positions)
    a = cache_attention_triton(q, k_cache, v_cache, ctx.slot_ids, ctx.cache_positions, ctx.kv_len, core.scale,
                               attn_mask=ctx.attn_mask, window=core.sliding_window, tree=ctx.tree_keys).flatten(2)
    h = fused_linear_triton(a, attn.o_proj.weight, residual=h)
    m = fused_linear_triton(h, mlp.gate_up_proj.weight, norm_weight=norm2.weight, eps=norm2.eps, gated=True)
    return fused_linear_triton(m, mlp.down_proj.weight, residual=h)
