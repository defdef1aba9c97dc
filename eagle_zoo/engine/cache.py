"""Preallocated KV caches: one (k, v) pair per attention layer of a model.

Shapes are fixed at start-up ([num_slots, max_len, kv_heads, head_dim]) so that steps
can be captured in CUDA graphs; a request owns one slot (row) for its lifetime.
"""
from __future__ import annotations

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


def allocate_kv_caches(
    model: nn.Module, num_slots: int, max_len: int, dtype: torch.dtype, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    caches = []
    for layer in attention_layers(model):
        k_shape = (num_slots, max_len, layer.num_kv_heads, layer.head_dim)
        v_shape = (num_slots, max_len, layer.num_kv_heads, layer.v_head_dim)
        caches.append(
            (torch.zeros(k_shape, dtype=dtype, device=device), torch.zeros(v_shape, dtype=dtype, device=device))
        )
    return caches
