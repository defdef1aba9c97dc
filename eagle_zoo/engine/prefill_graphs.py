"""CUDA graphs for one sequence's prompt prefill.

An eager prefill launches every op of every layer from Python, so a short prompt's
prefill costs the host's launch time, not the GPU's (BENCHMARKS.md: about 21 ms for 100
tokens of SmolLM2-135M on an H100, against about 2 ms replayed from a graph). Here a
prompt of L tokens is padded up to a bucket of T tokens (PREFILL_BUCKETS) and the
model's pass over positions 0 .. T-1 of the sequence's cache row is replayed from a
graph captured once per bucket and argument signature. The padding tokens sit after the
prompt, so causal attention keeps them out of the prompt's outputs; their keys and
values land in the row's positions L .. T-1, which the decode steps overwrite before
anything attends to them (every step writes a position before attending to it, and
attention is masked by position). Outputs are the first L positions.

Prompts of at most MAX_GRAPH_TOKENS go through the decode-shaped graphs (graphs.py);
prompts above the largest bucket run eagerly (their graphs would hold that many tokens'
activations for the engine's lifetime).
"""
from __future__ import annotations

import bisect
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_unflatten

from .graphs import MAX_GRAPH_TOKENS, GraphPool, capture, static_args

PREFILL_BUCKETS = (32, 64, 128, 256, 512)


class GraphedPrefill:
    def __init__(self, forward: Callable[..., Any], max_tokens: int, scratch_slot: int, pool: GraphPool):
        # forward(input_ids [1, T], positions [1, T], slot_ids [1], *args): the model over
        # the first T positions of the slot's cache row (ModelRunner.forward_prefix).
        self.forward = forward
        self.buckets = [b for b in PREFILL_BUCKETS if b <= max_tokens]  # padding must fit the cache row
        # The static row until a call sets it: the capture's warm-up passes write their keys
        # and values there, never into a live sequence's row.
        self.scratch_slot = scratch_slot
        self.pool = pool
        self.graphs: dict[tuple, tuple] = {}
        pool.users.append(self)

    def eligible(self, num_tokens: int) -> bool:
        return bool(self.buckets) and MAX_GRAPH_TOKENS < num_tokens <= self.buckets[-1]

    def __call__(self, input_ids: torch.Tensor, slot_ids: torch.Tensor, *args):
        """The pass over one sequence's prompt input_ids [1, L] at positions 0 .. L-1;
        tensor args are per-position inputs [1, L, ...], padded alike."""
        L = input_ids.shape[1]
        T = self.buckets[bisect.bisect_left(self.buckets, L)]
        key = (T,) + tuple(("tensor", tuple(a.shape[2:]), a.dtype) if torch.is_tensor(a) else ("value", a)
                           for a in args)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(T, args, input_ids.device)
        replay, (ids, _positions, slots, tensor_args), static_out, spec = entry
        ids[:, :L].copy_(input_ids)
        ids[:, L:].zero_()
        slots.copy_(slot_ids)
        for dst, src in zip(tensor_args, (a for a in args if torch.is_tensor(a))):
            dst[:, :L].copy_(src)
            dst[:, L:].zero_()
        replay()
        return tree_unflatten([o[:, :L].clone() if torch.is_tensor(o) else o for o in static_out], spec)

    def _capture(self, T: int, args: tuple, device: torch.device):
        """-> (replay, static inputs, flat static outputs, their tree spec). The entry holds
        every static input, positions included: the graph reads them by address, so one
        left to the allocator would be handed to other tensors and the replays would read
        whatever those hold."""
        ids = torch.zeros(1, T, dtype=torch.long, device=device)
        positions = torch.arange(T, device=device).unsqueeze(0)
        slots = torch.full((1,), self.scratch_slot, dtype=torch.long, device=device)
        tensor_args, call_args = static_args(args, lambda a: (1, T, *a.shape[2:]))
        graph, flat, spec = capture(self.forward, (ids, positions, slots, *call_args), self.pool)
        return graph.replay, (ids, positions, slots, tensor_args), flat, spec
