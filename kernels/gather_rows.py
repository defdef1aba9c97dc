"""Rows of each sequence's positions, taken from several tensors side by side, in one launch.

gather_rows(sources [S x [B, N, H]], rows [B, T]) -> [B, T, S*H]:
out[b, t] = cat(source[b, rows[b, t]] for source in sources). A tree step's head catch-up
(eagle_zoo/engine/tree_proposer.py) takes the target's features at the accepted path's
nodes: for an EAGLE-3 head its three residual streams side by side, for an EAGLE-1 head
the final hidden state.
Why: torch takes two launches for the streams (a cat of every node's rows, then a
gather of the path's), once per tree step.
"""
from __future__ import annotations

import torch

from ._triton import MAX_ROW, gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton

MAX_SOURCES = 3  # an EAGLE-3 head's streams; more take the reference


def gather_rows_torch(sources: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    B, T = rows.shape
    index = rows.view(B, T, 1)
    return torch.cat([s.gather(1, index.expand(B, T, s.shape[-1])) for s in sources], dim=-1)


@triton.jit
def _gather_rows_kernel(S0, S1, S2, ROWS, OUT, T, H, s_b, s_n, s_rb, s_rt, NUM: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the rows and the sources are the kernels before's output
        gdc_wait()
        gdc_launch_dependents()
    i = tl.program_id(0).to(tl.int64)  # output row b * T + t
    b, t = i // T, i % T
    row = tl.load(ROWS + b * s_rb + t * s_rt).to(tl.int64)
    h = tl.arange(0, BLOCK)
    at = b * s_b + row * s_n + h
    out = OUT + i * NUM * H + h
    tl.store(out, tl.load(S0 + at, mask=h < H), mask=h < H)
    if NUM > 1:
        tl.store(out + H, tl.load(S1 + at, mask=h < H), mask=h < H)
    if NUM > 2:
        tl.store(out + 2 * H, tl.load(S2 + at, mask=h < H), mask=h < H)


def gather_rows_triton(sources: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    first = sources[0]
    B, _, H = first.shape
    T = rows.shape[1]
    if not 1 <= len(sources) <= MAX_SOURCES or H > MAX_ROW:
        raise ValueError(f"gather_rows_triton: {len(sources)} sources of rows of {H} values; give 1 to "
                         f"{MAX_SOURCES} sources of at most {MAX_ROW} values")
    if any(s.shape != first.shape or s.stride() != first.stride() or s.dtype != first.dtype for s in sources):
        raise ValueError("gather_rows_triton: the sources must share shape, strides and dtype")
    out = torch.empty(B, T, len(sources) * H, dtype=first.dtype, device=first.device)
    if B * T:
        padded = list(sources) + [first] * (MAX_SOURCES - len(sources))
        _gather_rows_kernel[(B * T,)](*padded, rows, out, T, H, first.stride(0), first.stride(1), rows.stride(0),
                                      rows.stride(1), NUM=len(sources), BLOCK=triton.next_power_of_2(H),
                                      **pdl_launch(first))
    return out


def gather_rows(sources: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """Triton on CUDA for up to MAX_SOURCES sources of one shape, strides and dtype whose
    rows have unit stride; the reference otherwise (module doc)."""
    first = sources[0]
    ok = (use_triton(rows, *sources) and len(sources) <= MAX_SOURCES and first.stride(-1) == 1
          and first.shape[-1] <= MAX_ROW
          and all(s.shape == first.shape and s.stride() == first.stride() and s.dtype == first.dtype for s in sources))
    return (gather_rows_triton if ok else gather_rows_torch)(sources, rows)
