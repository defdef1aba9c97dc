"""The k largest entries of each row with their log-softmax values, in one launch.

log_softmax_top_k(x, k, offsets=None) -> (scores [..., k] fp32, ids [..., k] int64):
the k largest entries of x's last dim in descending order, ties to the lower index, with
log_softmax(x.float()) at each; ids + offsets[ids] when offsets (a draft-to-target id map,
[V] int64) is given. Why: an EAGLE-2 tree step takes the top k of the draft head's
distribution once a level; torch's log_softmax, radix top-k and id map are several kernels
a level, the top-k alone ~200 us of a SmolLM2-shaped tree step (6, 3, 30) on an H100.

One program a row walks the row in blocks: an online max and sum of exponentials give the
normaliser, and each block's k largest enter a running top k. Entries are compared as one
int64 key (order_keys): the float's bits made order-preserving in the high half, the
inverted column in the low half, so equal values order by column and every key is distinct.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton

MAX_K = 16  # the running top k lives in registers


def stable_top(x: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n largest entries along the last dim, largest first, ties to the lower
    index: the order every kernel here keeps (order_keys)."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :n]


def log_softmax_top_k_torch(x: torch.Tensor, k: int, offsets: Optional[torch.Tensor] = None):
    xf = x.float()
    ids = stable_top(xf, k)
    scores = torch.log_softmax(xf, dim=-1).gather(-1, ids)
    return scores, ids if offsets is None else ids + offsets[ids]


@triton.jit
def order_keys(x, cols, valid):
    """int64 keys of fp32 values x at columns cols: larger values give larger keys, equal
    ones the lower column the larger key, so every key is distinct; the int64 minimum where
    not valid, below every key."""
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 keys as +0.0
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)  # float order as int order
    return tl.where(valid, ordered * 4294967296 + (2147483647 - cols), -9223372036854775807 - 1)


@triton.jit
def key_column(key):
    """The column an order_keys key was made at."""
    return 2147483647 - (key & 4294967295)


@triton.jit
def _top_k_kernel(X, OFF, S, I, sx, V, K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr,
                  HAS_OFF: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the logits are the kernel before's output
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    empty = -9223372036854775807 - 1  # int64 min: below every entry's key
    best = empty + tl.arange(0, KP).to(tl.int64)  # distinct placeholders, below every key
    m = tl.full([], float("-inf"), tl.float32)  # running max and sum of exp(x - m)
    s = tl.full([], 0.0, tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + lanes
        valid = cols < V
        x = tl.load(X + row * sx + cols, mask=valid, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # where() keeps exp(-inf - -inf) out while every value so far is -inf
        s = s * tl.where(m == m_new, 1.0, tl.exp(m - m_new)) + tl.sum(tl.where(x == m_new, 1.0, tl.exp(x - m_new)), 0)
        m = m_new
        key = order_keys(x, cols, valid)
        for _ in tl.static_range(K):
            top = tl.max(key, axis=0)
            low = tl.min(best, axis=0)
            best = tl.where((best == low) & (top > low), top, best)
            key = tl.where(key == top, empty, key)
    norm = m + tl.log(s)
    for j in tl.static_range(K):
        top = tl.max(best, axis=0)
        best = tl.where(best == top, empty, best)
        col = key_column(top)
        value = tl.load(X + row * sx + col).to(tl.float32)
        if HAS_OFF:
            col += tl.load(OFF + col)
        tl.store(S + row * K + j, value - norm)
        tl.store(I + row * K + j, col)


def log_softmax_top_k_triton(x: torch.Tensor, k: int, offsets: Optional[torch.Tensor] = None):
    V = x.shape[-1]
    if not 1 <= k <= min(V, MAX_K):
        raise ValueError(f"log_softmax_top_k_triton: k = {k}, not in 1 .. min(row length {V}, {MAX_K})")
    rows = x.reshape(-1, V)
    scores = torch.empty(rows.shape[0], k, dtype=torch.float32, device=x.device)
    ids = torch.empty(rows.shape[0], k, dtype=torch.long, device=x.device)
    if rows.shape[0]:
        block = min(triton.next_power_of_2(V), 16384)
        _top_k_kernel[(rows.shape[0],)](rows, offsets if offsets is not None else ids, scores, ids, rows.stride(0), V,
                                        K=k, KP=triton.next_power_of_2(k), BLOCK=block, HAS_OFF=offsets is not None,
                                        num_warps=16 if block >= 8192 else 4, **pdl_launch(x))
    return scores.view(*x.shape[:-1], k), ids.view(*x.shape[:-1], k)


def log_softmax_top_k(x: torch.Tensor, k: int, offsets: Optional[torch.Tensor] = None):
    """Triton on CUDA for rows of unit stride and k <= MAX_K; the reference otherwise."""
    if use_triton(x) and x.stride(-1) == 1 and 1 <= k <= min(x.shape[-1], MAX_K):
        return log_softmax_top_k_triton(x, k, offsets)
    return log_softmax_top_k_torch(x, k, offsets)
