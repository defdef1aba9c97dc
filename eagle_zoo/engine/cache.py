"""Preallocated KV caches: one (k, v) pair per attention layer of a model.

Shapes are fixed at start-up ([num_slots, max_len, kv_heads, head_dim]) so that steps
can be captured in CUDA graphs; a request owns one slot (row) for its lifetime.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..models.attention import Attention


def attention_layers(model: nn.Module) -> list[Attention]:
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    indices = [m.layer_idx for m in layers]
    if sorted(indices) != list(range(len(indices))):
        raise ValueError(
            f"{type(model).__name__}: attention layer indices must be 0..N-1 without gaps, got {indices}"
        )
    return sorted(layers, key=lambda m: m.layer_idx)


class KVCaches(list):
    """The list of (k, v) pairs, one per attention layer. ``stacked`` is the one tensor
    [layers, 2, num_slots, max_len, kv_heads, head_dim] they are views of when every
    layer's k and v have the same shape (None otherwise, e.g. MLA), so an operation on
    every layer's cache (tree compaction) is one kernel instead of one per layer."""

    stacked: Optional[torch.Tensor] = None


def allocate_kv_caches(
    model: nn.Module, num_slots: int, max_len: int, dtype: torch.dtype, device: torch.device, *, stack: bool = True
) -> KVCaches:
    """stack=False: separate tensors always. Training needs that: autograd refuses in-place
    writes of values that require grad into views of one shared tensor."""
    layers = attention_layers(model)
    shapes = [((num_slots, max_len, layer.num_kv_heads, layer.head_dim),
               (num_slots, max_len, layer.num_kv_heads, layer.v_head_dim)) for layer in layers]
    caches = KVCaches()
    if stack and layers and all(k == v == shapes[0][0] for k, v in shapes):
        caches.stacked = torch.zeros((len(layers), 2, *shapes[0][0]), dtype=dtype, device=device)
        caches.extend((caches.stacked[i, 0], caches.stacked[i, 1]) for i in range(len(layers)))
        return caches
    caches.extend((torch.zeros(k, dtype=dtype, device=device), torch.zeros(v, dtype=dtype, device=device))
                  for k, v in shapes)
    return caches
