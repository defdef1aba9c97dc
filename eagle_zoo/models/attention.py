"""Core attention (after projections and rope) and the context that says where k/v live.

Model code stays ``forward(input_ids, positions)``: the engine wraps a step in
``with use_context(AttentionContext(...))`` and every Attention layer reads it.
Without a context, attention is plain causal attention over the T given tokens
(parity tests, training).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from eagle_zoo.kernels import cpu_decode
from eagle_zoo.kernels.attention import tree_visibility
from eagle_zoo.kernels._triton import needs_autograd
from eagle_zoo.kernels.linear import STEP_MAX_T


@dataclass(slots=True)
class AttentionContext:
    """Where the keys and values of one step live.

    kv_caches[layer_idx] = (k [num_slots, max_len, kv_heads, d_k], v [..., d_v]).
    slot_ids [B]: the cache row of each sequence.
    cache_positions [B,T]: where each token's k/v is written in its row (differs
        from the rope position for tree drafts). Padding tokens should write to a
        scratch slot or position that no real query attends to.
    kv_len: attend over cache columns [:kv_len] (a host int: fixed per CUDA graph).
    attn_mask [B,T,kv_len] bool (True = may attend) or None: the keys each query sees,
        for callers outside the engine's decode steps (training's TTT chains, padded
        batch generation in eagle_zoo/train).
    tree_keys (positions [B,T], base [B], ancestors [B,T,L]) or None: for an EAGLE-2
        tree pass (a verified tree or a drafting round), the keys each token sees: the
        history below base and its ancestors' columns, walked in position order by the
        Triton kernel (kernels/attention.py cache_attention_triton), so nodes get plain
        decoding's bits; a mask built from them elsewhere (tree_visibility). Neither
        given: key index <= the query's cache position, within the layer's sliding window
        or chunk.
    memo: tensors that every layer of one forward would otherwise rebuild from the same
        inputs (the attention mask per (window, chunk, dtype), rope angles per positions
        tensor), built by the first layer that needs them. A context serves one forward
        (or one captured graph): do not modify its tensors in place between forwards.
    """

    kv_caches: list
    slot_ids: torch.Tensor
    cache_positions: torch.Tensor
    kv_len: int
    attn_mask: Optional[torch.Tensor] = None
    memo: dict = field(default_factory=dict)
    tree_keys: Optional[tuple] = None


_context: Optional[AttentionContext] = None


def get_context() -> Optional[AttentionContext]:
    return _context


@contextmanager
def use_context(ctx: Optional[AttentionContext]):
    global _context
    saved, _context = _context, ctx
    try:
        yield ctx
    finally:
        _context = saved


def single_slot(ctx: AttentionContext) -> int:
    """The cache row of a one-sequence step, read on the host once per forward (no device
    sync on the CPU) and kept in the context's memo for every layer."""
    slot = ctx.memo.get("slot")
    if slot is None:
        slot = ctx.memo["slot"] = int(ctx.slot_ids[0])
    return slot


def _window_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: Optional[int],
                 chunk: Optional[int] = None) -> torch.Tensor:
    """Causal (+ sliding window) visibility: key j seen by query i iff j <= i and i - j < window;
    with ``chunk`` (Llama 4's chunked local attention) also only within i's chunk: j // chunk == i // chunk."""
    diff = query_pos.unsqueeze(-1) - key_pos
    mask = diff >= 0
    if window is not None:
        mask &= diff < window
    if chunk is not None:
        mask &= torch.div(query_pos.unsqueeze(-1), chunk, rounding_mode="floor") == torch.div(
            key_pos, chunk, rounding_mode="floor")
    return mask


KERNEL_MAX_T = STEP_MAX_T  # tokens a sequence of a decode-shaped step; longer steps (prefill) use the torch path


class Attention(nn.Module):
    """softmax(q k^T * scale + mask) v over heads; GQA when num_kv_heads < num_heads.

    forward(q [B,T,heads,d], k [B,T,kv_heads,d], v [B,T,kv_heads,d_v]) -> [B,T,heads*d_v].
    Head counts are this rank's. ``layer_idx`` picks the cache in ``kv_caches``; it
    numbers the Attention layers of one model 0..N-1.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: Optional[float] = None,
                 layer_idx: int = 0, sliding_window: Optional[int] = None, v_head_dim: Optional[int] = None,
                 attention_chunk_size: Optional[int] = None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.layer_idx, self.sliding_window = layer_idx, sliding_window
        self.attention_chunk_size = attention_chunk_size

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = _context
        if ctx is not None and self._use_kernels(q):
            return self._kernel_attention(ctx, q, k, v)
        if ctx is None:
            keys, values, mask = k, v, None
            if self.sliding_window is not None or self.attention_chunk_size is not None:
                pos = torch.arange(q.shape[1], device=q.device)
                mask = _window_mask(pos, pos, self.sliding_window, self.attention_chunk_size)
        elif self._use_cpu_kernel(ctx, q, k):
            return self._cpu_kernel_attention(ctx, q, k, v)
        else:
            keys, values, mask = self._use_cache(ctx, k, v, q.dtype)
        if keys.dtype != q.dtype:  # (a no-op .to still costs a dispatch per layer)
            keys, values = keys.to(q.dtype), values.to(q.dtype)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=mask, is_causal=mask is None, scale=self.scale,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )
        return out.transpose(1, 2).flatten(2)

    def _whole_prompt(self, ctx: AttentionContext, k: torch.Tensor, k_cache: torch.Tensor) -> bool:
        """Whether the step is one sequence's first T tokens, so that each query sees
        exactly the step's keys up to its own: one sequence whose T tokens fill the
        cache's first kv_len == T positions (a prefill: distinct positions, in order), no
        mask of the engine's own (trees), no window or chunk, and a cache of the keys'
        dtype (so the cache holds these very values)."""
        return (k.shape[0] == 1 and k.shape[1] == ctx.kv_len and k.shape[1] > 1 and ctx.attn_mask is None
                and ctx.tree_keys is None and self.sliding_window is None and self.attention_chunk_size is None
                and k.dtype == k_cache.dtype)

    def _use_kernels(self, q: torch.Tensor) -> bool:
        # Triton kernels on CUDA for decode-shaped steps: their reduction order does not
        # depend on the batch or on T, so verification reproduces plain decoding bit for
        # bit. Prefill (long T) and chunked attention keep the torch path.
        return q.is_cuda and q.shape[1] <= KERNEL_MAX_T and self.attention_chunk_size is None

    def _kernel_attention(self, ctx: AttentionContext, q, k, v):
        from eagle_zoo.kernels import cache_attention, write_kv

        k_cache, v_cache = ctx.kv_caches[self.layer_idx]
        write_kv(k_cache, v_cache, k, v, ctx.slot_ids, ctx.cache_positions)
        out = cache_attention(q, k_cache, v_cache, ctx.slot_ids, ctx.cache_positions, ctx.kv_len, self.scale,
                              attn_mask=ctx.attn_mask, window=self.sliding_window, tree=ctx.tree_keys)
        return out.flatten(2)

    def cpu_kernel_applies(self, ctx: AttentionContext, x: torch.Tensor) -> bool:
        """Whether kernels/cpu_decode.py's attention can serve this layer's step of x
        [1, T, ...]: one float32 sequence of up to MAX_ROWS tokens on the CPU, causal (no
        tree mask, window or chunk), float32 contiguous caches whose head size is a multiple
        of 8 (the kernel's vectors), int64 positions, and the kernels built. The fused
        layer's C++ call (models/fused_layer.py) and this module's own attention both ask."""
        k_cache, v_cache = ctx.kv_caches[self.layer_idx]
        return (x.device.type == "cpu" and x.shape[0] == 1 and 0 < x.shape[1] <= cpu_decode.MAX_ROWS
                and x.dtype == torch.float32 and ctx.attn_mask is None and ctx.tree_keys is None
                and self.sliding_window is None and self.attention_chunk_size is None
                and k_cache.dtype == v_cache.dtype == torch.float32 and k_cache.is_contiguous()
                and v_cache.is_contiguous() and k_cache.shape[-1] == v_cache.shape[-1] and k_cache.shape[-1] % 8 == 0
                and ctx.cache_positions.dtype == torch.long and cpu_decode.available())

    def _use_cpu_kernel(self, ctx: AttentionContext, q: torch.Tensor, k: torch.Tensor) -> bool:
        # A layer that keeps its modules (one the C++ layer calls do not cover, as a head
        # layer of another family): the fused layer's own flash-decoding instead of a
        # built mask and SDPA.
        return self.cpu_kernel_applies(ctx, q) and k.dtype == q.dtype and not needs_autograd(q, k)

    def _cpu_kernel_attention(self, ctx: AttentionContext, q, k, v):
        k_cache, v_cache = self._write_cache(ctx, k, v)
        T = q.shape[1]
        out = cpu_decode.cache_attention(q.reshape(T, -1), k_cache, v_cache, single_slot(ctx),
                                         ctx.cache_positions.reshape(T),
                                         ctx.kv_len, self.num_heads, self.num_kv_heads, self.scale)
        return out.view(1, T, -1)

    def _write_cache(self, ctx: AttentionContext, k, v) -> tuple[torch.Tensor, torch.Tensor]:
        k_cache, v_cache = ctx.kv_caches[self.layer_idx]
        B, T = k.shape[:2]
        rows = ctx.slot_ids.view(B, 1).expand(B, T)
        # Index writes: no host sync, fixed shapes (CUDA-graph friendly).
        k_cache[rows, ctx.cache_positions] = k if k.dtype == k_cache.dtype else k.to(k_cache.dtype)
        v_cache[rows, ctx.cache_positions] = v if v.dtype == v_cache.dtype else v.to(v_cache.dtype)
        return k_cache, v_cache

    def _use_cache(self, ctx: AttentionContext, k, v, dtype: torch.dtype):
        k_cache, v_cache = self._write_cache(ctx, k, v)
        B = k.shape[0]
        if self._whole_prompt(ctx, k, k_cache):
            # A prompt's prefill: the mask is the causal one, which SDPA applies itself,
            # skipping the blocks above the diagonal (half a long prompt's attention)
            # without building or reading a [T, T] mask.
            return k, v, None
        if B == 1 and k.device.type == "cpu" and not k.requires_grad:
            # One sequence (CPU decoding): attend over a view of its row instead of a
            # gathered copy. Not in training: the next in-place cache write would
            # invalidate the view autograd saved.
            slot = single_slot(ctx)
            keys, values = k_cache[slot:slot + 1, : ctx.kv_len], v_cache[slot:slot + 1, : ctx.kv_len]
        else:
            # index_select on the narrowed view: advanced indexing `cache[slots, :L]` takes a
            # slow general path on CPU (milliseconds per layer).
            keys = k_cache[:, : ctx.kv_len].index_select(0, ctx.slot_ids)
            values = v_cache[:, : ctx.kv_len].index_select(0, ctx.slot_ids)
        return keys, values, self._mask(ctx, dtype, k.device)

    def _mask(self, ctx: AttentionContext, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """[B,1,T,L] (same for every head), built once per context and reused by every
        layer with the same window and chunk. On CPU it is the additive float mask (0 /
        -inf) that SDPA would otherwise derive from the bool mask in every layer; the
        same values, so the same result."""
        key = ("mask", self.sliding_window, self.attention_chunk_size, dtype)
        mask = ctx.memo.get(key)
        if mask is None:
            if ctx.tree_keys is not None:  # (trees refuse windows and chunks: engine/tree_proposer.py)
                mask = tree_visibility(ctx.tree_keys, ctx.kv_len)
            elif ctx.attn_mask is not None:
                mask = ctx.attn_mask
            else:
                key_pos = torch.arange(ctx.kv_len, device=device)
                mask = _window_mask(ctx.cache_positions, key_pos, self.sliding_window, self.attention_chunk_size)
            mask = mask.unsqueeze(1)
            if device.type == "cpu" and mask.dtype == torch.bool and dtype.is_floating_point:
                mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))
            ctx.memo[key] = mask
        return mask

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
                f"v_head_dim={self.v_head_dim}, layer_idx={self.layer_idx}, window={self.sliding_window}, "
                f"chunk={self.attention_chunk_size}")
