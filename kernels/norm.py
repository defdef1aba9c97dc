"""RMSNorm: y = weight * (x * rsqrt(mean(x^2) + eps)), normalised in float32 and
scaled in the input dtype (the convention of Llama checkpoints, as in
eagle_zoo/models/layers.py's RMSNorm, which calls this).

One program per row, the whole row in one block: a row's result does not depend on
the other rows or on how many there are (plain decoding and verification agree).
The eager reference takes 7 kernels per norm; at batch 1 a decode step of a small
model is bound by kernel count, not bytes.
"""
from __future__ import annotations

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton

MAX_TRITON_HIDDEN = 16384  # one row per block; wider rows keep the reference


def rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@triton.jit
def _norm_row(X, W, Y, row, sx, sy, N, eps, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    normed = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)  # rounded like the reference
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * sy + cols, (w * normed).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_kernel(X, W, Y, sx, sy, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: nothing of the kernels before is read until they are done
        gdc_wait()
        gdc_launch_dependents()
    _norm_row(X, W, Y, tl.program_id(0).to(tl.int64), sx, sy, N, eps, BLOCK)


@triton.jit
def _rms_norm_pair_kernel(X1, W1, X2, W2, Y, sx1, sx2, sy, N, eps1, eps2, BLOCK: tl.constexpr,
                          PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    if tl.program_id(1) == 0:
        _norm_row(X1, W1, Y, row, sx1, sy, N, eps1, BLOCK)
    else:
        _norm_row(X2, W2, Y + N, row, sx2, sy, N, eps2, BLOCK)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    rows = x.reshape(-1, n)  # a view for the usual contiguous activations
    out = torch.empty_like(rows)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, rows.stride(0), out.stride(0), n, eps,
                                           BLOCK=triton.next_power_of_2(n), **pdl_launch(x))
    return out.view(x.shape)


def rms_norm_pair_torch(x1: torch.Tensor, w1: torch.Tensor, eps1: float, x2: torch.Tensor, w2: torch.Tensor,
                        eps2: float) -> torch.Tensor:
    return torch.cat([rms_norm_torch(x1, w1, eps1), rms_norm_torch(x2, w2, eps2)], dim=-1)


def rms_norm_pair_triton(x1: torch.Tensor, w1: torch.Tensor, eps1: float, x2: torch.Tensor, w2: torch.Tensor,
                         eps2: float) -> torch.Tensor:
    """cat([rms_norm(x1, w1, eps1), rms_norm(x2, w2, eps2)], -1) in one launch, each half
    with rms_norm_triton's bits: an EAGLE-3 head layer's input (its embeddings' norm and
    the fused target features' norm, side by side) without two norms and a cat."""
    n = x1.shape[-1]
    rows1, rows2 = x1.reshape(-1, n), x2.reshape(-1, n)
    out = torch.empty((rows1.shape[0], 2 * n), dtype=x1.dtype, device=x1.device)
    if rows1.shape[0]:
        _rms_norm_pair_kernel[(rows1.shape[0], 2)](rows1, w1, rows2, w2, out, rows1.stride(0), rows2.stride(0),
                                                   out.stride(0), n, eps1, eps2,
                                                   BLOCK=triton.next_power_of_2(n), **pdl_launch(x1))
    return out.view(*x1.shape[:-1], 2 * n)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton on CUDA for rows of unit stride with a weight of their dtype; the reference otherwise."""
    if (use_triton(x, weight) and weight.dtype == x.dtype and x.stride(-1) == 1
            and x.shape[-1] <= MAX_TRITON_HIDDEN):
        return rms_norm_triton(x, weight, eps)
    return rms_norm_torch(x, weight, eps)
