"""One row of each sequence's positions stored at the sequence's slot, in one launch.

scatter_row(dst [S, H], slots [B], src [B, T, H], index [B]): dst[slots[b]] = src[b, index[b]],
in place. A draft head's catch-up (eagle_zoo/engine/proposers.py, tree_proposer.py) keeps
its output at each sequence's last accepted position as the next step's drafting state.
Why: torch takes two launches for this (a gather and an indexed write), once per chain or
tree step.
"""
from __future__ import annotations

import torch

from ._triton import MAX_ROW, gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton


def scatter_row_torch(dst: torch.Tensor, slots: torch.Tensor, src: torch.Tensor, index: torch.Tensor) -> None:
    B = src.shape[0]
    dst[slots] = src.gather(1, index.view(B, 1, 1).expand(B, 1, src.shape[-1]))[:, 0]


@triton.jit
def _scatter_row_kernel(DST, SLOT, SRC, IDX, s_dst, s_slot, s_sb, s_st, s_idx, H, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the rows are the kernel before's output
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0).to(tl.int64)
    slot = tl.load(SLOT + b * s_slot).to(tl.int64)
    t = tl.load(IDX + b * s_idx).to(tl.int64)
    h = tl.arange(0, BLOCK)
    row = tl.load(SRC + b * s_sb + t * s_st + h, mask=h < H)
    tl.store(DST + slot * s_dst + h, row, mask=h < H)


def scatter_row_triton(dst: torch.Tensor, slots: torch.Tensor, src: torch.Tensor, index: torch.Tensor) -> None:
    B, _, H = src.shape
    if H > MAX_ROW:
        raise ValueError(f"scatter_row_triton: rows of {H} values, at most {MAX_ROW}")
    if B:
        _scatter_row_kernel[(B,)](dst, slots, src, index, dst.stride(0), slots.stride(0), src.stride(0),
                                  src.stride(1), index.stride(0), H, BLOCK=triton.next_power_of_2(H),
                                  **pdl_launch(src))


def scatter_row(dst: torch.Tensor, slots: torch.Tensor, src: torch.Tensor, index: torch.Tensor) -> None:
    """Triton on CUDA for rows of unit stride and one dtype; the reference otherwise
    (module doc). A slot given twice (a captured graph's padding rows share the scratch
    slot) gets one of its rows, which one undefined, as with torch's indexed write."""
    ok = (use_triton(dst, slots, src, index) and dst.stride(-1) == 1 and src.stride(-1) == 1
          and dst.dtype == src.dtype and src.shape[-1] <= MAX_ROW)
    (scatter_row_triton if ok else scatter_row_torch)(dst, slots, src, index)
