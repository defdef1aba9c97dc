"""SiluAndMul: silu(gate) * up for x = [..., 2I] holding gate then up -> [..., I].

One program per (row, block of I) in one kernel where the eager reference launches
three (chunk views, silu, mul); elementwise, so batch invariant.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton

_BLOCK = 1024


def silu_and_mul_torch(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, -1)
    return F.silu(gate) * up


@triton.jit
def _silu_and_mul_kernel(X, Y, sx, sy, I, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: nothing of the kernels before is read until they are done
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(X + row * sx + I + cols, mask=mask, other=0.0).to(tl.float32)
    # silu rounded to the activation dtype before the product, as the reference's two ops do
    s = (g / (1.0 + tl.exp(-g))).to(Y.dtype.element_ty).to(tl.float32)
    tl.store(Y + row * sy + cols, (s * u).to(Y.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor) -> torch.Tensor:
    two_i = x.shape[-1]
    rows = x.reshape(-1, two_i)
    out = torch.empty((rows.shape[0], two_i // 2), dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        grid = (rows.shape[0], triton.cdiv(two_i // 2, _BLOCK))
        _silu_and_mul_kernel[grid](rows, out, rows.stride(0), out.stride(0), two_i // 2, BLOCK=_BLOCK, **pdl_launch(x))
    return out.view(*x.shape[:-1], two_i // 2)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Triton on CUDA for rows of unit stride; the reference otherwise."""
    if use_triton(x) and x.stride(-1) == 1 and x.shape[-1] % 2 == 0:
        return silu_and_mul_triton(x)
    return silu_and_mul_torch(x)
