"""Linear layers of decode-shaped steps (a few rows): y = x W^T (+ bias), with an
optional RMSNorm of x before it and SiluAndMul or a residual add after it, in one kernel.

Why a kernel of our own instead of cuBLAS for these few rows:
- Kernel count. A batch-1 decode step of a small model is bound by the number of
  kernels, not by bytes (SmolLM2-135M on the H200: 13 kernels a layer, the GEMMs 3.6-3.9
  us each, the norms, adds and activation 1.1-1.4 us each; scripts/device/step_profile.py).
  Folding the norm into the projection that reads it, the activation into gate_up and the
  residual add into o_proj / down_proj leaves 4 GEMM kernels and no elementwise ones.
- Batch invariance. The reduction depends only on the weight's shape, never on the
  number of rows: every row is reduced over K in the same order (tile_config's fixed
  BLOCK_K steps, one tl.dot per step). The rows a program takes (row_block) grow with the
  step, which changes which program computes a row, not its arithmetic: a row gives the
  same bits alone (plain decoding) as inside a verification or tree step of any size.
  cuBLAS picks its kernel by M, so a row's bits could depend on the step's size (not the
  cause of the trees' bf16 mismatches, it turned out: that was attention's key order,
  kernels/attention.py's tree mode).

Rounding: the norm is folded into the product (x * norm_weight, rounded to the
activation dtype, then the fp32 sums scaled by the row's rstd: one pass over x instead of
two; in bf16 not the module path's bits, which round x * rstd first); the product is
rounded once (bias added in fp32 first); silu(gate) is rounded before the product with
up; the residual add rounds once. A prefill of more than MAX_ROWS tokens keeps cuBLAS:
plain and speculative decoding prefill alike, so they still agree.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton
from .activation import silu_and_mul_torch
from .norm import rms_norm_torch

# The kernel's case by shape (kernel_rows): every decode-shaped step, [B, T, K] with at most
# STEP_MAX_T tokens a sequence, whatever its batch (a plain step of B rows and a verification
# of B x (k+1) must reduce each row alike: batch 64 at k = 4 is 320 rows); other inputs
# (a prompt's prefill) of at most MAX_ROWS rows; more rows: cuBLAS.
STEP_MAX_T = 64
MAX_ROWS = 256
BLOCK_M = 16    # the smallest tl.dot tile: the rows a program takes in steps of few rows
WIDE_ROWS = 17  # from this many rows on, a program takes more (row_block)
# Wider inputs keep cuBLAS: on the H200 this kernel lost to it on Llama-3-8B's qkv (32.6
# vs 16.3 us), gate_up (69.5 vs 61.7) and down_proj (37.6 vs 33.8), and won on SmolLM2's
# o_proj and down_proj (2.8 vs 4.8, 4.1 vs 6.3 us with the add they absorb). A whole
# 8B-shaped step through it, with tilings for long inputs, was level at best
# (BENCHMARKS.md, "Tried, did not help"), though it made that step batch invariant, which
# cuBLAS's is not ("Losslessness").
MAX_K = 2048

# fp8 weights (a draft head under speculative_config quantization="fp8"): e4m3 values with
# one float32 scale a weight row, read by the same kernel at any input width (there is no
# cuBLAS product for them here). Why: a head of Llama-3.1-8B's shape reads ~2.3 GB of bf16
# weights a k = 3 chain step, 1.156x a plain step's bytes; fp8 halves that.
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # the largest finite e4m3fn value


def fused_linear_torch(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                       norm_weight: Optional[torch.Tensor] = None, eps: float = 1e-6, gated: bool = False,
                       residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reference: [rms_norm(x)] -> F.linear -> [silu_and_mul] -> [+ residual]."""
    if norm_weight is not None:
        x = rms_norm_torch(x, norm_weight, eps)
    y = F.linear(x, weight, bias)
    if gated:
        y = silu_and_mul_torch(y)
    return y if residual is None else residual + y


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (e4m3 values [N, K], float32 scales [N]): each row scaled so that its
    largest magnitude is FP8_MAX, then rounded to nearest; weight ~ values * scales[:, None]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / FP8_MAX
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def fp8_linear_torch(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                     bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Reference of the kernel with an fp8 weight: the product in float32, scaled per
    output, the bias added, rounded once to x's dtype."""
    y = F.linear(x.float(), weight.float()) * scale
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
               bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x W^T (+ bias) for an fp8 weight and its row scales (quantize_fp8): the kernel on CUDA
    for any rows and width, the reference elsewhere."""
    if use_triton(x, weight, scale) and x.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return fused_linear_triton(x.contiguous(), weight.contiguous(), bias, scale=scale)
    return fp8_linear_torch(x, weight, scale, bias)


@triton.jit
def _weight_tiles(W, cols, cmask, ks, kmask, N, swn, GATED: tl.constexpr):
    # The weight tiles of one BLOCK_K step: gate (or the only) rows, and up rows if GATED.
    wmask = cmask[:, None] & kmask[None, :]
    w = tl.load(W + cols[:, None] * swn + ks[None, :], mask=wmask, other=0.0)
    u = w
    if GATED:
        u = tl.load(W + (cols[:, None] + N) * swn + ks[None, :], mask=wmask, other=0.0)
    return w, u


@triton.jit
def _k_block(X, NW, rows, rmask, ks, kmask, sxm, w, u, acc, acc_up, sq,
             HAS_NORM: tl.constexpr, GATED: tl.constexpr, IEEE: tl.constexpr):
    # One BLOCK_K step of the reduction, given this step's weight tiles w (and u, GATED).
    x = tl.load(X + rows[:, None] * sxm + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
    if HAS_NORM:
        # RMSNorm as a prologue in the same pass: rstd is one scalar a row, so the
        # product takes x * norm_weight and is scaled by rstd after the reduction.
        xf = x.to(tl.float32)
        sq += xf * xf
        x = (xf * tl.load(NW + ks, mask=kmask, other=0.0).to(tl.float32)[None, :]).to(x.dtype)
    # fp8 weights are widened to x's dtype exactly (every e4m3 value is a bfloat16 one);
    # their scale is applied after the reduction. Other weights have x's dtype already.
    w = w.to(x.dtype)
    if IEEE:
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    else:
        acc = tl.dot(x, tl.trans(w), acc)
    if GATED:
        u = u.to(x.dtype)
        if IEEE:
            acc_up = tl.dot(x, tl.trans(u), acc_up, input_precision="ieee")
        else:
            acc_up = tl.dot(x, tl.trans(u), acc_up)
    return acc, acc_up, sq


@triton.jit
def _product(X, W, NW, rows, rmask, cols, cmask, N, K, sxm, swn, eps,
             HAS_NORM: tl.constexpr, GATED: tl.constexpr, IEEE: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    # [rms_norm(x)] W^T for weight rows cols (and their up rows cols + N, GATED) in fp32,
    # reduced over K in fixed BLOCK_K steps: -> (acc, acc_up).
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    sq = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)  # summed over K once, after the loop
    if PDL:
        # The weights are no kernel's output: the first K block's tiles are read before
        # waiting for the kernel before, so their latency overlaps it.
        ks = tl.arange(0, BLOCK_K)
        kmask = ks < K
        w, u = _weight_tiles(W, cols, cmask, ks, kmask, N, swn, GATED)
        gdc_wait()  # kernels/_triton.py: no activation is read before the kernels before are done
        gdc_launch_dependents()
        acc, acc_up, sq = _k_block(X, NW, rows, rmask, ks, kmask, sxm, w, u, acc, acc_up, sq, HAS_NORM, GATED, IEEE)
    for k0 in range(BLOCK_K if PDL else 0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        w, u = _weight_tiles(W, cols, cmask, ks, kmask, N, swn, GATED)
        acc, acc_up, sq = _k_block(X, NW, rows, rmask, ks, kmask, sxm, w, u, acc, acc_up, sq, HAS_NORM, GATED, IEEE)
    if HAS_NORM:
        rstd = (1.0 / tl.sqrt(tl.sum(sq, axis=1) / K + eps))[:, None]
        acc = acc * rstd
        if GATED:
            acc_up = acc_up * rstd
    return acc, acc_up


@triton.jit(do_not_specialize=["M"])  # M varies per call (prefill lengths): one compiled variant
def _linear_kernel(X, W, S, B, NW, R, Y, M, N, K, sxm, swn, srm, sym, eps,
                   HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr, GATED: tl.constexpr,
                   HAS_RES: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    # Program (m, n): output columns [n*BLOCK_N, +BLOCK_N) of rows [m*BLOCK_M, +BLOCK_M).
    # Row blocks are the grid's first axis: the programs sharing a weight tile are scheduled
    # side by side, so a weight too large for L2 (a vocabulary projection) is read from HBM
    # once, not once per row block (BENCHMARKS.md, "Steps of 16 requests").
    # GATED: W holds gate rows [0, N) then up rows [N, 2N); the output is silu(gate) * up.
    # HAS_SCALE: W is fp8 and S holds one float32 scale a weight row (quantize_fp8).
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rmask = rows < M
    cmask = cols < N
    dt = Y.dtype.element_ty
    acc, acc_up = _product(X, W, NW, rows, rmask, cols, cmask, N, K, sxm, swn, eps,
                           HAS_NORM, GATED, IEEE, BLOCK_M, BLOCK_N, BLOCK_K, PDL)
    if HAS_SCALE:
        acc = acc * tl.load(S + cols, mask=cmask, other=0.0)[None, :]
        if GATED:
            acc_up = acc_up * tl.load(S + N + cols, mask=cmask, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
        if GATED:
            acc_up += tl.load(B + N + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    y = acc.to(dt)
    if GATED:
        g = y.to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        y = (s * acc_up.to(dt).to(tl.float32)).to(dt)
    omask = rmask[:, None] & cmask[None, :]
    if HAS_RES:
        r = tl.load(R + rows[:, None] * srm + cols[None, :], mask=omask, other=0.0).to(tl.float32)
        y = (r + y.to(tl.float32)).to(dt)
    tl.store(Y + rows[:, None] * sym + cols[None, :], y, mask=omask)


def row_block(m: int, n: int) -> int:
    """BLOCK_M, the rows one program takes, for m rows of a weight of n rows: BLOCK_M for
    up to 16 rows (one tl.dot tile: a plain step up to batch 16, a chain's drafts up to
    batch 16, a chain's verification up to batch 4); from WIDE_ROWS rows on (a tree's 31
    at batch 1, a chain's verification from batch 5, a tree level's drafts from batch 3)
    32, and 64 for a vocabulary-wide weight, so that fewer programs read each weight tile
    again (on an H100, `python -m eagle_zoo.kernels.bench`'s linear rows; the step costs
    from 17 rows on: BENCHMARKS.md, "Step costs"). A row's bits are the same whichever
    BLOCK_M takes it (the module doc; tests/test_kernels.py checks rows alone against the
    same rows among 37, 60 and 130)."""
    if m < WIDE_ROWS:
        return BLOCK_M
    return 64 if n > 4096 else 32


def tile_config(n: int, k: int) -> dict:
    """BLOCK_N, BLOCK_K, num_warps, num_stages for a weight of n rows and k columns: from
    the weight's shape only (batch invariance). Picked by timing tilings on the H200:
    narrow tiles for the narrow matrices of small models, so that enough programs share
    the weight reads; wide ones for a large vocabulary. Inputs wider than MAX_K come only
    with fp8 weights (fp8_wide_tile)."""
    if k > MAX_K:
        return fp8_wide_tile(n, k)
    if n > 4096:
        return dict(BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=3)
    if k >= 1024:
        return dict(BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=3)
    return dict(BLOCK_N=16, BLOCK_K=128, num_warps=2, num_stages=4)


def fp8_wide_tile(n: int, k: int) -> dict:
    """The tiling of an fp8 weight of n rows and k > MAX_K columns: 32 weight rows a program,
    K steps of 512 for inputs over 8,192 (a Llama-3.1-8B head's down_proj and fc), of 128
    for weights over 8,192 rows (its gate_up and its 32,000-row lm_head), else 256: each of
    that head's products at or within 1% of its fastest of the 48 tilings that `python -m
    eagle_zoo.kernels.bench --fp8` times at one row (an H100)."""
    block_k = 512 if k > 8192 else 128 if n > 8192 else 256
    return dict(BLOCK_N=32, BLOCK_K=block_k, num_warps=4, num_stages=3 if block_k == 128 else 4)


def fused_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                        norm_weight: Optional[torch.Tensor] = None, eps: float = 1e-6, gated: bool = False,
                        residual: Optional[torch.Tensor] = None, scale: Optional[torch.Tensor] = None,
                        block_m: Optional[int] = None, tile: Optional[dict] = None) -> torch.Tensor:
    """The kernel; scale: the float32 row scales of an fp8 weight (quantize_fp8); block_m:
    rows a program takes (default row_block's), tile: tile_config's dict (default
    tile_config's); kernels/bench.py times others of both."""
    K = x.shape[-1]
    rows = x.reshape(-1, K)
    M = rows.shape[0]
    N = weight.shape[0] // 2 if gated else weight.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    res = residual.reshape(-1, N) if residual is not None else out
    if M:
        cfg = tile or tile_config(weight.shape[0], K)
        block_m = block_m or row_block(M, weight.shape[0])
        grid = (triton.cdiv(M, block_m), triton.cdiv(N, cfg["BLOCK_N"]))
        _linear_kernel[grid](
            rows, weight, scale if scale is not None else weight, bias if bias is not None else weight,
            norm_weight if norm_weight is not None else weight,
            res, out, M, N, K, rows.stride(0), weight.stride(0), res.stride(0), out.stride(0), eps,
            HAS_SCALE=scale is not None, HAS_BIAS=bias is not None, HAS_NORM=norm_weight is not None, GATED=gated,
            HAS_RES=residual is not None, IEEE=x.dtype == torch.float32,
            BLOCK_M=block_m, **cfg, **pdl_launch(x),
        )
    return out.view(*x.shape[:-1], N)


def kernel_rows(shape: torch.Size | tuple) -> bool:
    """Whether x of this shape is the kernel's by its rows (MAX_ROWS's comment)."""
    if len(shape) == 3 and shape[1] <= STEP_MAX_T:
        return True
    rows = 1
    for n in shape[:-1]:
        rows *= n
    return rows <= MAX_ROWS


def use_linear_kernel(x: torch.Tensor, weight: torch.Tensor, *others: Optional[torch.Tensor]) -> bool:
    """The kernel's case: CUDA, rows it takes (kernel_rows) of unit stride and at most
    MAX_K columns, a contiguous 2-D weight and every tensor of x's dtype."""
    present = [t for t in others if t is not None]
    if not use_triton(x, weight, *present):
        return False
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or weight.dim() != 2:
        return False
    if not kernel_rows(x.shape) or x.stride(-1) != 1 or not weight.is_contiguous():
        return False
    if x.shape[-1] > MAX_K:
        return False
    return all(t.dtype == x.dtype and t.is_contiguous() for t in (weight, *present))


def fused_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                 norm_weight: Optional[torch.Tensor] = None, eps: float = 1e-6, gated: bool = False,
                 residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Triton for few rows on CUDA (use_linear_kernel), the reference otherwise."""
    kw = dict(norm_weight=norm_weight, eps=eps, gated=gated, residual=residual)
    if use_linear_kernel(x, weight, bias, norm_weight, residual):
        return fused_linear_triton(x, weight, bias, **kw)
    return fused_linear_torch(x, weight, bias, **kw)
