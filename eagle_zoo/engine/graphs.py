"""CUDA-graph capture and replay of decode-shaped forward passes.

A decode-shaped call is [B, T] tokens with small T (plain decode T=1, verification
T=K+1, one draft step T=1). For each (batch bucket, T, argument signature) the
forward is captured once into a CUDA graph over static input/output buffers; later
calls copy their inputs in, replay, and read the outputs out. Graphs attend over
the whole preallocated cache row (kv_len = max_len, masked by position), so one
graph serves every sequence length. Batches are padded up to the bucket with
sequences that write into a scratch cache slot nobody reads.

GraphedPrefill does the same for one sequence's whole prompt of up to 512 tokens (vLLM
captures up to 512 tokens too): eagerly, a prefill launches every kernel of every layer
from Python, which on a small target costs more than the kernels themselves.
"""
from __future__ import annotations

import bisect
import gc
import weakref
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
MAX_GRAPH_TOKENS = 16  # T above this (prefill) takes GraphedPrefill or runs eagerly
# Prompt lengths of the prefill graphs: a prompt is padded up to the next one, at most
# 1.5x its length (the padding is computed too; from 32 tokens up, the kernels launched
# cost more than the rows they compute on the models this engine graphs).
PREFILL_BUCKETS = (32, 48, 64, 96, 128, 192, 256, 384, 512)


_live_pools: "weakref.WeakSet[GraphPool]" = weakref.WeakSet()


def release_all_graphs() -> None:
    """GraphPool.release() for every engine of this process (tensor parallelism calls it
    right before destroying its process group)."""
    for pool in list(_live_pools):
        pool.release()


class GraphPool:
    """One memory pool shared by every graph of an engine (target and drafter)."""

    def __init__(self):
        self.handle = torch.cuda.graph_pool_handle()
        self.users: list["GraphedForward"] = []
        _live_pools.add(self)

    def release(self) -> None:
        """Drops every captured graph of the engine. Tensor parallelism needs this before
        its NCCL process group is destroyed: graphs that captured NCCL collectives keep
        the communicator busy and destroy_process_group() then never returns (PyTorch
        issue 115388; it hung rank 0 on two H200s)."""
        for user in self.users:
            user.graphs.clear()
        self.users.clear()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            gc.collect()
            torch.cuda.empty_cache()


class GraphedForward:
    def __init__(self, forward: Callable[..., Any], max_batch: int, scratch_slot: int, pool: GraphPool,
                 clone_outputs: bool = True):
        self.forward = forward  # forward(input_ids, positions, slot_ids, *args) under a full-length context
        # Outputs are copies unless the caller reads them before the graph replays again
        # (a step's own graphs, whose outputs the step's later work consumes on the same
        # stream): then they are views of the static buffers, a copy kernel less each.
        self.clone_outputs = clone_outputs
        self.buckets = [b for b in DEFAULT_BATCH_BUCKETS if b < max_batch] + [max_batch]
        self.scratch_slot = scratch_slot
        self.pool = pool
        self.graphs: dict[tuple, tuple] = {}
        pool.users.append(self)

    def eligible(self, input_ids: torch.Tensor) -> bool:
        return input_ids.shape[0] <= self.buckets[-1] and input_ids.shape[1] <= MAX_GRAPH_TOKENS

    def __call__(self, input_ids, positions, slot_ids, *args):
        B, T = input_ids.shape
        bucket = self.buckets[bisect.bisect_left(self.buckets, B)]
        key = (bucket, T) + tuple(_signature(a) for a in args)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(bucket, T, args)
        graph, static_in, static_out, spec = entry
        ids, pos, slots, tensor_args = static_in
        ids[:B].copy_(input_ids)
        pos[:B].copy_(positions)
        slots[:B].copy_(slot_ids)
        if B < bucket:  # padding rows: write to the scratch slot, position 0
            ids[B:].zero_()
            pos[B:].zero_()
            slots[B:].fill_(self.scratch_slot)
        for dst, src in zip(tensor_args, (a for a in args if torch.is_tensor(a))):
            dst[:B].copy_(src)
        graph.replay()
        # Non-tensor leaves (a forward that only writes state returns None) pass through.
        outs = [o[:B] if torch.is_tensor(o) else o for o in static_out]
        return tree_unflatten([o.clone() if self.clone_outputs and torch.is_tensor(o) else o for o in outs], spec)

    def _capture(self, bucket: int, T: int, args: tuple):
        ids = torch.zeros(bucket, T, dtype=torch.long, device="cuda")
        pos = torch.zeros(bucket, T, dtype=torch.long, device="cuda")
        slots = torch.full((bucket,), self.scratch_slot, dtype=torch.long, device="cuda")
        tensor_args = _static_args(args, (bucket,))
        return _capture(self.forward, self.pool, ids, pos, slots, args, tensor_args)


class GraphedPrefill:
    """One sequence's whole prompt (its first T tokens, MAX_GRAPH_TOKENS < T <= 512) as a
    graph per PREFILL_BUCKETS length: the prompt fills the first T places of static
    buffers one bucket long, the rest holds whatever an earlier prompt left there (token
    ids, positions continuing the prompt's, features), and outputs are cut back to T.
    Causal attention keeps the padding out of the prompt's own rows, and the keys and
    values the padding writes past the prompt in its cache row are written again by the
    decode steps before any query attends to them."""

    def __init__(self, forward: Callable[..., Any], max_len: int, scratch_slot: int, pool: GraphPool):
        self.forward = forward  # forward(input_ids, positions, slot_ids, *args): kv_len = T, a whole prompt
        self.buckets = [b for b in PREFILL_BUCKETS if b <= max_len]
        self.scratch_slot = scratch_slot
        self.pool = pool
        self.graphs: dict[tuple, tuple] = {}
        pool.users.append(self)

    def eligible(self, input_ids: torch.Tensor, kv_len: int) -> bool:
        """One sequence's whole prompt (kv_len == T: the step attends to its own tokens
        only) of a length some bucket holds."""
        B, T = input_ids.shape
        return B == 1 and kv_len == T and MAX_GRAPH_TOKENS < T and bool(self.buckets) and T <= self.buckets[-1]

    def bucket(self, T: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, T)]

    def __call__(self, input_ids, positions, slot_ids, *args):
        T = input_ids.shape[1]
        bucket = self.bucket(T)
        key = (bucket,) + tuple(_signature(a) for a in args)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(bucket, args)
        graph, static_in, static_out, spec = entry
        ids, pos, slots, tensor_args = static_in
        ids[:, :T].copy_(input_ids)
        pos[:, :T].copy_(positions)
        slots.copy_(slot_ids)
        for dst, src in zip(tensor_args, (a for a in args if torch.is_tensor(a))):
            dst[:, :T].copy_(src)
        graph.replay()
        return tree_unflatten([o[:, :T].clone() if torch.is_tensor(o) else o for o in static_out], spec)

    def _capture(self, bucket: int, args: tuple):
        ids = torch.zeros(1, bucket, dtype=torch.long, device="cuda")
        pos = torch.arange(bucket, device="cuda").unsqueeze(0)
        slots = torch.full((1,), self.scratch_slot, dtype=torch.long, device="cuda")
        tensor_args = _static_args(args, (1, bucket))
        entry = _capture(self.forward, self.pool, ids, pos, slots, args, tensor_args)
        if any(torch.is_tensor(o) and (o.dim() < 2 or o.shape[1] != bucket) for o in entry[2]):
            raise ValueError("GraphedPrefill: every tensor the forward returns must be [1, T, ...]")
        return entry


def _static_args(args: tuple, leading: tuple) -> list[torch.Tensor]:
    """Zeroed static buffers for the tensor arguments: ``leading`` dims, then each
    argument's own beyond as many dims."""
    return [torch.zeros((*leading, *a.shape[len(leading):]), dtype=a.dtype, device=a.device)
            for a in args if torch.is_tensor(a)]


def _capture(forward: Callable[..., Any], pool: GraphPool, ids, pos, slots, args: tuple, tensor_args: list):
    """forward(ids, pos, slots, *args) with the tensor arguments replaced by their static
    buffers, captured into a graph of ``pool`` after two warm-up calls on a side stream
    (allocator, lazy initialisation): -> (graph, static inputs, flat outputs, their spec)."""
    it = iter(tensor_args)
    call_args = [next(it) if torch.is_tensor(a) else a for a in args]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            forward(ids, pos, slots, *call_args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool.handle):
        out = forward(ids, pos, slots, *call_args)
    flat, spec = tree_flatten(out)
    return graph, (ids, pos, slots, tensor_args), flat, spec


def _signature(arg) -> Any:
    if torch.is_tensor(arg):
        return ("tensor", tuple(arg.shape[1:]), arg.dtype)
    return ("value", arg)
