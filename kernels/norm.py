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
def _store_normed(x, W, Y, cols, mask, N, eps):
    # x: the row in float32 (zeros past N); Y: the row's output
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / N + eps)
    normed = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)  # rounded like the reference
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + cols, (w * normed).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_row(X, W, Y, row, sx, sy, N, eps, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    _store_normed(x, W, Y + row * sy, cols, mask, N, eps)


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


@triton.jit
def _add_rms_norm_kernel(X, R, W, S, Y, sx, sr, ss, sy, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + row * sr + cols, mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(S.dtype.element_ty)  # the sum rounded as torch's add rounds it
    tl.store(S + row * ss + cols, s, mask=mask)
    _store_normed(s.to(tl.float32), W, Y + row * sy, cols, mask, N, eps)


def add_rms_norm_torch(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + residual
    return s, rms_norm_torch(s, weight, eps)


def add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, rms_norm(x + residual)) in one launch, the sum with torch's add's
    bits and its norm with rms_norm_triton's: a decoder layer's residual add and the norm
    after it, where the product before them is cuBLAS's (models/fused_layer.py
    wide_layer_kernels) and cannot take the add as its epilogue."""
    n = x.shape[-1]
    rows, res = x.reshape(-1, n), residual.reshape(-1, n)
    s = torch.empty_like(rows)
    y = torch.empty_like(rows)
    if rows.shape[0]:
        _add_rms_norm_kernel[(rows.shape[0],)](rows, res, weight, s, y, rows.stride(0), res.stride(0), s.stride(0),
                                               y.stride(0), n, eps, BLOCK=triton.next_power_of_2(n),
                                               **pdl_launch(x))
    return s.view(x.shape), y.view(x.shape)


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
