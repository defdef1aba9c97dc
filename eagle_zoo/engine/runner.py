"""Runs one model over its own preallocated KV cache.

The runner owns the device-side state of a model (weights and caches) and turns
an engine step's token/position tensors into a forward pass under an
AttentionContext, so model code keeps a plain forward(input_ids, positions).
On CUDA, decode-shaped calls replay captured CUDA graphs (graphs.py).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..models.attention import AttentionContext, use_context
from ..models.fused_layer import choose_decode_paths
from ..models.layers import add_exact_int8_copies, add_exact_q4_copies, prepare_one_row_copies
from .cache import allocate_kv_caches
from .graphs import GraphedForward, GraphPool
from .prefill_graphs import GraphedPrefill


class ModelRunner:
    def __init__(
        self,
        model: nn.Module,
        num_slots: int,
        max_len: int,
        dtype: torch.dtype,
        device: torch.device,
        graph_pool: Optional[GraphPool] = None,
    ):
        self.model = model
        self.max_len = max_len
        self.device = device
        # One extra slot: padding rows of a graphed batch write there.
        self.scratch_slot = num_slots
        self.kv_caches = allocate_kv_caches(model, num_slots + 1, max_len, dtype, device)
        choose_decode_paths(model)  # fused or module decoder layers, once (models/fused_layer.py)
        if torch.device(device).type == "cpu":
            # Faster one-row (decode / draft) matmuls from column-major weight copies,
            # within a memory budget (models/layers.py, CPU_ONE_ROW_COPY_BYTES).
            prepare_one_row_copies(model)
            # Weights that are exactly int8 blocks times a scale (a GGUF's Q8_0 tensors:
            # SmolLM2's lm_head) are read from an int8 copy, those that are 4-bit blocks
            # times a scale plus a minimum (Q4_1: SmolLM2's decoder layers) from a 4-bit
            # copy, same bits (models/layers.py).
            add_exact_int8_copies(model)
            add_exact_q4_copies(model)
        self.graphed = self.graphed_prefill = None
        if graph_pool is not None:
            self.graphed = GraphedForward(self.forward_full_length, num_slots, self.scratch_slot, graph_pool)
            self.graphed_prefill = GraphedPrefill(self.forward_prefix, max_len, self.scratch_slot, graph_pool)

    def forward_full_length(self, input_ids, positions, slot_ids, *args, **keys):
        """The model over the whole cache row (kv_len = max_len, masked by position, or by
        a tree's keys): the form CUDA graphs capture."""
        return self._forward(input_ids, positions, slot_ids, self.max_len, args, **keys)

    def forward_prefix(self, input_ids, positions, slot_ids, *args):
        """The model over the first T positions of the cache row, T = input_ids.shape[1]
        (one sequence's prompt from position 0): the form prefill graphs capture."""
        return self._forward(input_ids, positions, slot_ids, input_ids.shape[1], args)

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, slot_ids: torch.Tensor, *args):
        """One sequence's whole prompt, input_ids [1, L] at positions 0 .. L-1 of row
        slot_ids [1]; tensor args are per-position [1, L, ...]. A captured prefill graph
        on CUDA where one applies (prefill_graphs.py), else as run()."""
        L = input_ids.shape[1]
        if self.graphed_prefill is not None and self.graphed_prefill.eligible(L):
            return self.graphed_prefill(input_ids, slot_ids, *args)
        positions = torch.arange(L, device=input_ids.device).unsqueeze(0)
        return self.run(input_ids, positions, slot_ids, L, *args)

    def _forward(self, input_ids, positions, slot_ids, kv_len: int, args, cache_positions=None, tree_keys=None):
        ctx = AttentionContext(self.kv_caches, slot_ids, positions if cache_positions is None else cache_positions,
                               kv_len, tree_keys=tree_keys)
        with use_context(ctx):
            return self.model(input_ids, positions, *args)

    @torch.inference_mode()
    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_ids: torch.Tensor,
        kv_len: Optional[int],
        *args,
        cache_positions: Optional[torch.Tensor] = None,
        tree_keys: Optional[tuple] = None,
    ):
        """Forward [B, T] tokens of the sequences in `slot_ids`.

        kv_len bounds the keys attended to (known on the host from the sequences'
        lengths, so no device sync is needed to compute it). kv_len None: the whole
        cache row and no graph replay, the form a larger captured function (the EAGLE
        drafting loop and catch-up, a tree step) calls from inside its capture.
        """
        keys = dict(cache_positions=cache_positions, tree_keys=tree_keys)
        if kv_len is None:
            return self.forward_full_length(input_ids, positions, slot_ids, *args, **keys)
        plain = tree_keys is None and cache_positions is None
        if self.graphed is not None and plain and self.graphed.eligible(input_ids):
            return self.graphed(input_ids, positions, slot_ids, *args)
        return self._forward(input_ids, positions, slot_ids, min(kv_len, self.max_len), args, **keys)
