"""Rotary embedding: the angles of a forward's positions, and the rotation of q and k.

rope_angles(positions [B,T], inv_freq [R], scaling) -> cos, sin [B,T,1,R] float32:
cos(position * inv_freq) * scaling and the same with sin, in one kernel where torch
takes four (the cast, the product, cos, sin), once per forward (models/layers.py
RotaryEmbedding); the CUDA math library's cosf / sinf (which torch's kernels call too) of
the same float32 products.

Rotation, "neox" pairs (i, i + d/2) over the whole head, of q and k in
one kernel: q [B,T,Hq,d], k [B,T,Hk,d] (views of the fused qkv projection: any
strides, unit stride in d), cos / sin [B,T,1,d/2] float32 -> rotated q, k (new,
contiguous). eagle_zoo/models/layers.py's RotaryEmbedding calls it for that case.

The reference is the formula RotaryEmbedding uses on CPU: x * [cos, cos] + [x2, x1] *
[-sin, sin] with the angles cast to x's dtype, each product rounded to that dtype.
The kernel rounds at the same places, yet in bf16 on the H200 it is not bit for bit
the reference (one bf16 step apart at most, tests/test_kernels.py): plain decoding and
verification both use the kernel, so they still agree. One program per token: batch
invariant.
"""
from __future__ import annotations

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton


def rope_angles_torch(positions, inv_freq, scaling: float = 1.0):
    angles = positions.unsqueeze(-1).float() * inv_freq  # [B,T,R]
    cos, sin = angles.cos().unsqueeze(-2), angles.sin().unsqueeze(-2)
    if scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    return cos, sin


@triton.jit(do_not_specialize=["T"])
def _rope_angles_kernel(POS, INV, COS, SIN, T, spb, spt, scaling, R: tl.constexpr, BLOCK_R: tl.constexpr,
                        SCALED: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the positions may be the kernel before's output
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)  # (b, t)
    b = (pid // T).to(tl.int64)
    t = (pid % T).to(tl.int64)
    r = tl.arange(0, BLOCK_R)
    m = r < R
    angle = tl.load(POS + b * spb + t * spt).to(tl.float32) * tl.load(INV + r, mask=m, other=0.0)
    cos = tl.cos(angle)  # on CUDA the math library's cosf / sinf (__nv_cosf in the PTX), as torch calls
    sin = tl.sin(angle)
    if SCALED:
        cos = cos * scaling
        sin = sin * scaling
    tl.store(COS + pid * R + r, cos, mask=m)
    tl.store(SIN + pid * R + r, sin, mask=m)


def rope_angles_triton(positions, inv_freq, scaling: float = 1.0):
    B, T = positions.shape
    R = inv_freq.numel()
    cos = torch.empty(B, T, 1, R, dtype=torch.float32, device=positions.device)
    sin = torch.empty_like(cos)
    if B * T:
        _rope_angles_kernel[(B * T,)](positions, inv_freq, cos, sin, T, positions.stride(0), positions.stride(1),
                                      float(scaling), R=R, BLOCK_R=triton.next_power_of_2(R),
                                      SCALED=scaling != 1.0, **pdl_launch(positions))
    return cos, sin


def rope_angles(positions, inv_freq, scaling: float = 1.0):
    """Triton on CUDA for float32 frequencies of unit stride, the reference otherwise
    (and under autograd, as every dispatcher here)."""
    if use_triton(positions, inv_freq) and inv_freq.dtype == torch.float32 and inv_freq.is_contiguous():
        return rope_angles_triton(positions, inv_freq, scaling)
    return rope_angles_torch(positions, inv_freq, scaling)


def signed_angles(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype):
    """[cos, cos] and [-sin, sin] in ``dtype``: the factors of the whole-head formula."""
    return torch.cat((cos, cos), -1).to(dtype), torch.cat((-sin, sin), -1).to(dtype)


def rotate_qk_torch(q, k, cos2, sin2):
    """The whole-head formula on q and k as one tensor (cos2 / sin2 from signed_angles)."""
    qk = torch.cat((q, k), -2)
    x1, x2 = qk.chunk(2, -1)
    out = qk * cos2 + torch.cat((x2, x1), -1) * sin2
    return out.split((q.shape[-2], k.shape[-2]), -2)


def rope_neox_torch(q, k, cos, sin):
    return rotate_qk_torch(q, k, *signed_angles(cos, sin, q.dtype))


@triton.jit
def _rotate_heads(X, Y, sxh, syh, heads, c, s, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    # X / Y point at this token's first head; c, s: [1, BLOCK_D] angles in float32
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < heads) & (d < HALF)
    x1 = tl.load(X + h * sxh + d, mask=mask, other=0.0)
    x2 = tl.load(X + h * sxh + HALF + d, mask=mask, other=0.0)
    dt = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    # out1 = x1*cos + x2*(-sin), out2 = x2*cos + x1*sin, each product rounded like the reference
    o1 = (x1 * c).to(dt).to(tl.float32) + (x2 * (-s)).to(dt).to(tl.float32)
    o2 = (x2 * c).to(dt).to(tl.float32) + (x1 * s).to(dt).to(tl.float32)
    tl.store(Y + h * syh + d, o1.to(dt), mask=mask)
    tl.store(Y + h * syh + HALF + d, o2.to(dt), mask=mask)


@triton.jit
def _token_angles(COS, SIN, b, t, scb, sct, ssb, sst, dt, HALF: tl.constexpr, BLOCK_D: tl.constexpr):
    # A token's cos / sin [1, BLOCK_D] in float32 after rounding to the activation dtype dt,
    # as the reference multiplies by the angles cast to that dtype.
    d = tl.arange(0, BLOCK_D)[None, :]
    c = tl.load(COS + b * scb + t * sct + d, mask=d < HALF, other=0.0)
    s = tl.load(SIN + b * ssb + t * sst + d, mask=d < HALF, other=0.0)
    return c.to(dt).to(tl.float32), s.to(dt).to(tl.float32)


@triton.jit(do_not_specialize=["T"])  # prompt lengths vary: one compiled variant
def _rope_neox_kernel(Q, K, QO, KO, COS, SIN, T, hq, hk,
                      sqb, sqt, sqh, skb, skt, skh, sqob, sqot, sqoh, skob, skot, skoh, scb, sct, ssb, sst,
                      HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
                      BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: nothing of the kernels before is read until they are done
        gdc_wait()
        gdc_launch_dependents()
    pid = tl.program_id(0)
    b = (pid // T).to(tl.int64)
    t = (pid % T).to(tl.int64)
    c, s = _token_angles(COS, SIN, b, t, scb, sct, ssb, sst, QO.dtype.element_ty, HALF, BLOCK_D)
    _rotate_heads(Q + b * sqb + t * sqt, QO + b * sqob + t * sqot, sqh, sqoh, hq, c, s, HALF, BLOCK_HQ, BLOCK_D)
    _rotate_heads(K + b * skb + t * skt, KO + b * skob + t * skot, skh, skoh, hk, c, s, HALF, BLOCK_HK, BLOCK_D)


def rope_neox_triton(q, k, cos, sin):
    B, T, hq, d = q.shape
    hk = k.shape[2]
    qo = torch.empty((B, T, hq, d), dtype=q.dtype, device=q.device)
    ko = torch.empty((B, T, hk, d), dtype=k.dtype, device=k.device)
    cos = cos.expand(B, T, 1, d // 2)
    sin = sin.expand(B, T, 1, d // 2)
    if B * T:
        _rope_neox_kernel[(B * T,)](
            q, k, qo, ko, cos, sin, T, hq, hk,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
            cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
            HALF=d // 2, BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HK=triton.next_power_of_2(hk),
            BLOCK_D=triton.next_power_of_2(d // 2), **pdl_launch(q),
        )
    return qo, ko


def use_rope_kernel(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> bool:
    """The kernel's case: CUDA, same dtype, unit stride in d, angles float32 with unit stride."""
    return (use_triton(q, k, cos) and q.dtype == k.dtype and q.stride(-1) == 1 and k.stride(-1) == 1
            and cos.dtype == torch.float32 and cos.stride(-1) == 1 and q.shape[-1] == k.shape[-1])


def rope_neox(q, k, cos, sin):
    """Triton on CUDA (use_rope_kernel), the reference otherwise."""
    if use_rope_kernel(q, k, cos):
        return rope_neox_triton(q, k, cos, sin)
    return rope_neox_torch(q, k, cos, sin)
