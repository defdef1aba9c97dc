"""The k largest entries of each row with their log-softmax values, and each row's argmax,
in two launches whatever the row's length.

log_softmax_top_k(x, k, offsets=None, add=None, out=None) -> (scores [..., k] fp32, ids
[..., k] int64): the k largest entries of x's last dim in descending order, ties to the
lower index, with log_softmax(x.float()) at each, plus add[...] (fp32, one value a row: an
EAGLE-2 node's cumulative score, so its children's come out cumulative) when given; ids +
offsets[ids] when offsets (a draft-to-target id map, [V] int64) is given; written into
out = (scores, ids) when given, views of up to two leading dims with any strides but a
unit last one (an EAGLE-2 tree's candidate rows, each level a slice of them, so that no
copy or cat gathers the levels: eagle_zoo/engine/tree_proposer.py). Why: an EAGLE-2 tree step
takes the top k of the draft head's distribution once a level, and an EAGLE-3 chain its
top 1 once a draft; torch's log_softmax, radix top-k and id map are several kernels a
level, the top-k alone ~200 us of a SmolLM2-shaped tree step (6, 3, 30) on an H100.

argmax_rows(x, offsets=None) -> ids [...] int64: the first maximum of x's last dim, as
torch.argmax (NaN aside: a NaN with its sign bit clear ranks above +inf, one with it set
below -inf), mapped through offsets as above. Why: the target's greedy token at every
verified position once a decode step, and an EAGLE-3 chain's greedy drafts; torch's
argmax walks a whole row in one thread block (BENCHMARKS.md, "Step costs": a SmolLM2-
and a Llama-3.1-8B-shaped step before and after).

How: the row is cut into parts of BLOCK entries, one program each (the first launch),
which writes its part's k largest entries and, for scores, its max and sum of
exponentials; one program a row (the second launch) merges the parts. One program a row
walking the whole row is bound by its sequential reductions, not by the bytes. BLOCK and
NUM_WARPS: one part size for every row length and row count; `python -m
eagle_zoo.kernels.bench` times the others (fewer entries a part gain a little at a few
rows and lose at 31 rows and more). Entries are compared as one int64 key (order_keys):
the float's bits made order-preserving in the high half, the inverted column in the low
half, so equal values order by column and every key is distinct.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton

MAX_K = 16  # a part's running top k lives in registers
Pair = tuple[torch.Tensor, torch.Tensor]  # (scores, ids)
BLOCK, NUM_WARPS = 1024, 4  # entries of a part and its program's warps


def stable_top(x: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the n largest entries along the last dim, largest first, ties to the lower
    index: the order every kernel here keeps (order_keys)."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :n]


def log_softmax_top_k_torch(x: torch.Tensor, k: int, offsets: Optional[torch.Tensor] = None,
                            add: Optional[torch.Tensor] = None, out: Optional[Pair] = None):
    xf = x.float()
    ids = stable_top(xf, k)
    scores = torch.log_softmax(xf, dim=-1).gather(-1, ids)
    if add is not None:
        scores = scores + add.unsqueeze(-1)
    ids = ids if offsets is None else ids + offsets[ids]
    if out is None:
        return scores, ids
    _out_layout(out, x.shape[:-1], k)
    out[0].copy_(scores)
    out[1].copy_(ids)
    return out


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
def _top_k_part_kernel(X, PM, PS, PK, sx, V, n_parts, K: tl.constexpr, SCORES: tl.constexpr,
                       BLOCK: tl.constexpr, PDL: tl.constexpr):
    # Program (row, part): entries [part * BLOCK, +BLOCK) of the row -> its k largest keys
    # (the int64 minimum past the row's end) and, SCORES, their max and sum of exp(x - max).
    if PDL:  # kernels/_triton.py: the logits are the kernel before's output
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    cols = part * BLOCK + tl.arange(0, BLOCK)
    valid = cols < V
    x = tl.load(X + row * sx + cols, mask=valid, other=float("-inf")).to(tl.float32)
    out = row * n_parts + part
    if SCORES:
        m = tl.max(x, axis=0)
        # where() keeps exp(-inf - -inf) out of a part whose entries are all -inf
        e = tl.where(x == m, 1.0, tl.exp(x - m))
        tl.store(PM + out, m)
        tl.store(PS + out, tl.sum(tl.where(valid, e, 0.0), axis=0))
    key = order_keys(x, cols, valid)
    for j in tl.static_range(K):
        top = tl.max(key, axis=0)
        tl.store(PK + out * K + j, top)
        key = tl.where(key == top, -9223372036854775807 - 1, key)


@triton.jit
def _top_k_merge_kernel(X, OFF, ADD, PM, PS, PK, S, I, sx, n_parts, inner, s_outer, s_inner, K: tl.constexpr,
                        PARTS: tl.constexpr, KEYS: tl.constexpr, SCORES: tl.constexpr, HAS_OFF: tl.constexpr,
                        HAS_ADD: tl.constexpr, PDL: tl.constexpr):
    # Program row: the parts' keys -> the row's k largest, largest first; SCORES: the
    # normaliser from the parts' maxima and sums, and each entry's log-softmax value.
    # Row r's outputs start at (r // inner) * s_outer + (r % inner) * s_inner (_out_layout).
    if PDL:  # kernels/_triton.py: the parts are the kernel before's output
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    o = (row // inner) * s_outer + (row % inner) * s_inner
    empty = -9223372036854775807 - 1  # int64 min: below every entry's key
    if SCORES:
        p = tl.arange(0, PARTS)
        pm = tl.load(PM + row * n_parts + p, mask=p < n_parts, other=float("-inf"))
        ps = tl.load(PS + row * n_parts + p, mask=p < n_parts, other=0.0)
        m = tl.max(pm, axis=0)
        norm = m + tl.log(tl.sum(tl.where(pm == m, ps, ps * tl.exp(pm - m)), axis=0))
        if HAS_ADD:
            add = tl.load(ADD + row)
    j = tl.arange(0, KEYS)
    key = tl.load(PK + row * n_parts * K + j, mask=j < n_parts * K, other=empty)
    for i in tl.static_range(K):
        top = tl.max(key, axis=0)
        key = tl.where(key == top, empty, key)
        col = key_column(top)
        if SCORES:
            value = tl.load(X + row * sx + col).to(tl.float32)
            if HAS_ADD:  # the log-softmax value rounded first, as the reference adds it
                tl.store(S + o + i, (value - norm) + add)
            else:
                tl.store(S + o + i, value - norm)
        if HAS_OFF:
            col += tl.load(OFF + col)
        tl.store(I + o + i, col)


def _out_layout(out: Pair, lead: torch.Size, k: int) -> tuple[int, int, int]:
    """(inner, s_outer, s_inner) of log_softmax_top_k's out = (scores, ids), each of shape
    lead + (k,): row r of the lead dims flattened starts at (r // inner) * s_outer +
    (r % inner) * s_inner. Raises ValueError for what the kernel cannot address."""
    scores, ids = out
    want = (*lead, k)
    if tuple(scores.shape) != want or tuple(ids.shape) != want:
        raise ValueError(f"log_softmax_top_k: out of shapes {tuple(scores.shape)} and {tuple(ids.shape)}; "
                         f"give (scores, ids) of shape {want}")
    if scores.dtype != torch.float32 or ids.dtype != torch.long:
        raise ValueError(f"log_softmax_top_k: out of {scores.dtype} and {ids.dtype}; give float32 scores "
                         f"and int64 ids")
    if len(want) > 3 or scores.stride() != ids.stride() or scores.stride(-1) != 1:
        raise ValueError(f"log_softmax_top_k: out of strides {scores.stride()} and {ids.stride()}; give views "
                         f"of at most two leading dims with the same strides, the last one 1")
    if len(want) == 3:
        return want[1], scores.stride(0), scores.stride(1)
    return 1, scores.stride(0) if len(want) == 2 else k, 0


def _top_k_launch(x: torch.Tensor, k: int, offsets: Optional[torch.Tensor], scores: bool,
                  block: int = BLOCK, num_warps: int = NUM_WARPS, add: Optional[torch.Tensor] = None,
                  into: Optional[Pair] = None):
    """The two launches over x's rows -> (scores [rows, k] fp32 or None, ids [rows, k]);
    add: fp32, one value a row, contiguous; into: log_softmax_top_k's out (then returned
    as it is)."""
    V = x.shape[-1]
    rows = x.reshape(-1, V)
    R = rows.shape[0]
    if into is None:
        ids = torch.empty(R, k, dtype=torch.long, device=x.device)
        out = torch.empty(R, k, dtype=torch.float32, device=x.device) if scores else None
        layout = (1, k, 0)
    else:
        out, ids = into
        layout = _out_layout(into, x.shape[:-1], k)
    if R:
        block = min(block, triton.next_power_of_2(V))
        n_parts = triton.cdiv(V, block)
        keys = torch.empty(R, n_parts, k, dtype=torch.long, device=x.device)
        pm = torch.empty(R, n_parts, dtype=torch.float32, device=x.device) if scores else keys
        ps = torch.empty_like(pm) if scores else keys
        pdl = pdl_launch(x)
        _top_k_part_kernel[(R, n_parts)](rows, pm, ps, keys, rows.stride(0), V, n_parts, K=k, SCORES=scores,
                                         BLOCK=block, num_warps=num_warps, **pdl)
        _top_k_merge_kernel[(R,)](rows, offsets if offsets is not None else ids, add if add is not None else pm,
                                  pm, ps, keys, out if scores else ids, ids, rows.stride(0), n_parts, *layout, K=k,
                                  PARTS=triton.next_power_of_2(n_parts), KEYS=triton.next_power_of_2(n_parts * k),
                                  SCORES=scores, HAS_OFF=offsets is not None, HAS_ADD=add is not None,
                                  num_warps=1, **pdl)
    return out, ids


def log_softmax_top_k_triton(x: torch.Tensor, k: int, offsets: Optional[torch.Tensor] = None,
                             add: Optional[torch.Tensor] = None, out: Optional[Pair] = None, *, block: int = BLOCK,
                             num_warps: int = NUM_WARPS):
    """Triton version; block / num_warps (a part's entries and warps) are for the bench."""
    V = x.shape[-1]
    if not 1 <= k <= min(V, MAX_K):
        raise ValueError(f"log_softmax_top_k_triton: k = {k}, not in 1 .. min(row length {V}, {MAX_K})")
    if add is not None and (add.shape != x.shape[:-1] or add.dtype != torch.float32):
        raise ValueError(f"log_softmax_top_k_triton: add of shape {tuple(add.shape)} and {add.dtype}; give one "
                         f"float32 value a row, shape {tuple(x.shape[:-1])}")
    scores, ids = _top_k_launch(x, k, offsets, True, block, num_warps,
                                None if add is None else add.contiguous().view(-1), out)
    if out is not None:
        return out
    return scores.view(*x.shape[:-1], k), ids.view(*x.shape[:-1], k)


def log_softmax_top_k(x: torch.Tensor, k: int, offsets: Optional[torch.Tensor] = None,
                      add: Optional[torch.Tensor] = None, out: Optional[Pair] = None):
    """Triton on CUDA for rows of unit stride and k <= MAX_K; the reference otherwise."""
    if use_triton(x) and x.stride(-1) == 1 and 1 <= k <= min(x.shape[-1], MAX_K):
        return log_softmax_top_k_triton(x, k, offsets, add, out)
    return log_softmax_top_k_torch(x, k, offsets, add, out)


def argmax_rows_triton(x: torch.Tensor, offsets: Optional[torch.Tensor] = None, *, block: int = BLOCK,
                       num_warps: int = NUM_WARPS) -> torch.Tensor:
    """Triton version; block / num_warps as log_softmax_top_k_triton's."""
    if x.shape[-1] == 0:
        raise ValueError("argmax_rows_triton: rows of no entries have no argmax")
    return _top_k_launch(x, 1, offsets, False, block, num_warps)[1].view(x.shape[:-1])


def argmax_rows(x: torch.Tensor, offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x.argmax(-1) (+ offsets at it): Triton on CUDA for rows of unit stride, torch's otherwise."""
    if use_triton(x) and x.stride(-1) == 1 and x.shape[-1] > 0:
        return argmax_rows_triton(x, offsets)
    ids = x.argmax(-1)
    return ids if offsets is None else ids + offsets[ids]
