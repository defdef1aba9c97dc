"""CUDA-graph capture and replay of decode-shaped forward passes.

A decode-shaped call is [B, T] tokens with small T (plain decode T=1, verification
T=K+1, one draft step T=1). For each (batch bucket, T, argument signature) the
forward is captured once into a CUDA graph over static input/output buffers; later
calls copy their inputs in, replay, and read the outputs out. Graphs attend over
the whole preallocated cache row (kv_len = max_len, masked by position), so one
graph serves every sequence length. Batches are padded up to the bucket with
sequences that write into a scratch cache slot nobody reads. A whole decode step's
graph (StepGraph) instead writes the next step's inputs over its own input buffers and
hands out views of its outputs, so the next step of the same batch copies nothing.
"""
from __future__ import annotations

import bisect
import gc
import weakref
from typing import Any, Callable, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..kernels.step_outputs import step_outputs

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
MAX_GRAPH_TOKENS = 16  # T above this (prefill) runs eagerly


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
    def __init__(self, forward: Callable[..., Any], max_batch: int, scratch_slot: int, pool: GraphPool):
        self.forward = forward  # forward(input_ids, positions, slot_ids, *args) under a full-length context
        self.buckets = [b for b in DEFAULT_BATCH_BUCKETS if b < max_batch] + [max_batch]
        self.scratch_slot = scratch_slot
        self.pool = pool
        self.graphs: dict[tuple, tuple] = {}
        pool.users.append(self)

    def eligible(self, input_ids: torch.Tensor) -> bool:
        return input_ids.shape[0] <= self.buckets[-1] and input_ids.shape[1] <= MAX_GRAPH_TOKENS

    # A call's outputs: copies of the static ones, which the next replay overwrites
    # (StepGraph hands out the static buffers themselves).
    returns_views = False

    def __call__(self, input_ids, positions, slot_ids, *args):
        B = input_ids.shape[0]
        graph, static_out, spec = self._load(input_ids, positions, slot_ids, args)
        graph.replay()
        # Non-tensor leaves (a forward that only writes state returns None) pass through.
        return tree_unflatten([(o[:B] if self.returns_views else o[:B].clone()) if torch.is_tensor(o) else o
                               for o in static_out], spec)

    def _load(self, input_ids, positions, slot_ids, args):
        """The graph of this call's bucket and shapes (captured at its first call), with
        the call's inputs copied into its static buffers; -> (graph, static outputs, spec)."""
        B, T = input_ids.shape
        bucket = self.buckets[bisect.bisect_left(self.buckets, B)]
        key = (bucket, T) + tuple(_signature(a) for a in args)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(bucket, T, args)
        graph, static_in, static_out, spec = entry
        ids, pos, slots, tensor_args = static_in
        held = [_holds(ids, input_ids), _holds(pos, positions), _holds(slots, slot_ids)]
        for dst, src, same in zip((ids, pos, slots), (input_ids, positions, slot_ids), held):
            if not same:
                dst[:B].copy_(src)
        if B < bucket and not all(held):  # padding rows: write to the scratch slot, position 0
            ids[B:].zero_()
            pos[B:].zero_()
            slots[B:].fill_(self.scratch_slot)
        for dst, src in zip(tensor_args, (a for a in args if torch.is_tensor(a))):
            if not _holds(dst, src):
                dst[:B].copy_(src)
        return graph, static_out, spec

    def _capture(self, bucket: int, T: int, args: tuple):
        ids = torch.zeros(bucket, T, dtype=torch.long, device="cuda")
        pos = torch.zeros(bucket, T, dtype=torch.long, device="cuda")
        slots = torch.full((bucket,), self.scratch_slot, dtype=torch.long, device="cuda")
        tensor_args, call_args = static_args(args, lambda a: (bucket, *a.shape[1:]))
        graph, flat, spec = capture(self.forward, (ids, pos, slots, *call_args), self.pool)
        return graph, (ids, pos, slots, tensor_args), flat, spec


def static_args(args: tuple, shape: Callable[[torch.Tensor], tuple]) -> tuple[list, list]:
    """Zeroed static buffers for a captured call's tensor arguments, each of shape(arg) and
    the argument's dtype and device; -> (the buffers, args with each tensor replaced by its
    buffer and other values kept)."""
    buffers = [torch.zeros(shape(a), dtype=a.dtype, device=a.device) for a in args if torch.is_tensor(a)]
    it = iter(buffers)
    return buffers, [next(it) if torch.is_tensor(a) else a for a in args]


def capture(forward: Callable[..., Any], args: tuple, pool: GraphPool):
    """forward(*args) over static buffers captured into a CUDA graph in the engine's pool,
    after two warm-up calls outside it (allocator, lazy init); -> (graph, its flat outputs,
    their tree spec)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            forward(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool.handle):
        out = forward(*args)
    flat, spec = tree_flatten(out)
    return graph, flat, spec


def feeding_step(forward: Callable[..., Any], scratch_slot: int, drafted: Optional[int] = None):
    """The function a StepGraph captures: ``forward(input_ids [B, T], positions [B, T],
    slots [B], *args) -> (tokens [B, K+1], accepted [B], *rest)``, a whole step, then
    kernels/step_outputs.py writing the step's last emitted token and each sequence's next
    cached length into column 0 of input_ids and positions themselves; -> (out [B, K+3],
    next_last [B, 1], next_base [B], slots [B], *rest), out as step_outputs gives it with
    ``drafted`` drafts a row (default K)."""
    def step(input_ids, positions, slots, *args):
        tokens, accepted, *rest = forward(input_ids, positions, slots, *args)
        count = tokens.shape[1] - 1 if drafted is None else drafted
        out, next_last, next_base = step_outputs(tokens, accepted, count, positions[:, 0], slots, scratch_slot,
                                                 into=(input_ids[:, :1], positions[:, 0]))
        return (out, next_last, next_base, slots, *rest)
    return step


class StepGraph(GraphedForward):
    """A whole greedy decode step as one graph that feeds its next replay: feeding_step's
    function captured, so each replay leaves the next one's inputs in its own static input
    buffers. A call returns views of static buffers (not copies), valid until the graph's
    next replay; every reader of them is queued on the stream before that (the engine
    copies ``out`` to the host right behind the step). A call given those views as its
    inputs (the next step of the same batch, launched ahead under async scheduling) copies
    nothing in: the step costs its replay alone."""

    returns_views = True

    def __init__(self, forward: Callable[..., Any], max_batch: int, scratch_slot: int, pool: GraphPool,
                 drafted: Optional[int] = None):
        super().__init__(feeding_step(forward, scratch_slot, drafted), max_batch, scratch_slot, pool)


def _holds(buffer: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether ``t`` is the first rows of the static ``buffer`` itself (a step graph's own
    output fed back), so copying it in would change nothing. Never for an empty ``t``,
    whose data_ptr is 0 like an empty buffer's (its copy launches nothing anyway)."""
    return (t.numel() > 0 and t.data_ptr() == buffer.data_ptr() and t.dim() == buffer.dim()
            and t.shape[1:] == buffer.shape[1:] and t.stride() == buffer.stride())


def _signature(arg) -> Any:
    if torch.is_tensor(arg):
        return ("tensor", tuple(arg.shape[1:]), arg.dtype)
    return ("value", arg)
