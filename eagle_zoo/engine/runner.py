"""Runs one model over its own preallocated KV cache.

The runner owns the device-side state of a model (weights and caches) and turns
an engine step's token/position tensors into a forward pass under an
AttentionContext, so model code keeps a plain forward(input_ids, positions).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..models.attention import AttentionContext, use_context
from .cache import allocate_kv_caches


class ModelRunner:
    def __init__(self, model: nn.Module, num_slots: int, max_len: int, dtype: torch.dtype, device: torch.device):
        self.model = model
        self.max_len = max_len
        self.device = device
        self.kv_caches = allocate_kv_caches(model, num_slots, max_len, dtype, device)

    @torch.inference_mode()
    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_ids: torch.Tensor,
        kv_len: int,
        *args,
        attn_mask: Optional[torch.Tensor] = None,
        cache_positions: Optional[torch.Tensor] = None,
        **kwargs,
    ):
        """Forward [B, T] tokens of the sequences in `slot_ids`.

        kv_len bounds the keys attended to (known on the host from the sequences'
        lengths, so no device sync is needed to compute it).
        """
        ctx = AttentionContext(
            kv_caches=self.kv_caches,
            slot_ids=slot_ids,
            cache_positions=positions if cache_positions is None else cache_positions,
            attn_mask=attn_mask,
            kv_len=min(kv_len, self.max_len),
        )
        with use_context(ctx):
            return self.model(input_ids, positions, *args, **kwargs)
