"""The qkv projection of a decode-shaped step with rope and the KV-cache write in its
epilogue, in one launch.

qkv_rope_write_kv_triton(x [B,T,K], weight [(hq + 2 hk) d, K], cos / sin [B,T,1,d/2]
float32, k_cache, v_cache, slot_ids [B], cache_positions [B,T], hq, hk, norm_weight=None,
eps) -> rotated q [B,T,hq,d]; the rotated k and v land in the caches' row slot_ids[b]
at column cache_positions[b, t] (a column outside the cache writes nothing).

The product's bits are fused_linear_triton's: each output is reduced over K in
linear.py's order and rounded to the activation dtype, row_block's rows a program. Only
which outputs share a program differs: a rope program's BLOCK_N weight rows are BLOCK_N /
2 rope pairs (i, i + d/2) of the q and k heads, their halves side by side, so each pair
meets in the epilogue; a v program takes BLOCK_N consecutive v rows. The rotation is
rope.py's formula, but the compiler contracts a product and the sum into one FMA in its
own way in each kernel, so q and k can be one rounding step from rope_neox_triton's (on an
H100: here the first product of each sum unrounded). What decoding needs holds: plain
decoding and verification both run this kernel, and its reduction (linear.py
tile_config) comes from the weight's shape only, so a row's bits never depend on the
step's size (batch invariance).
Why: at batch 1 a small model's step costs per launch (linear.py), and rope and the KV
write are a few hundred multiplies a token, cheaper as the product's epilogue than as a
launch of their own.

rope_write_kv_triton(qkv [B,T,(hq + 2 hk) d], cos, sin, k_cache, v_cache, slot_ids,
cache_positions, hq, hk) -> rotated q: the same epilogue as a launch of its own, after a
product the linear kernel does not take (weights wider than linear.py's MAX_K, run by
cuBLAS: models/fused_layer.py wide_layer_kernels), where the module path takes two (rope,
then the KV write). q and k have rope_neox_triton's bits (the same rotation code), v is
copied: exactly rope_neox_triton then write_kv_triton. One program per token.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, tl, triton
from .linear import _product, row_block, tile_config
from .rope import _rotate_heads, _token_angles


@triton.jit(do_not_specialize=["M", "T", "spb"])
def _qkv_rope_kernel(X, W, NW, QO, KC, VC, COS, SIN, SLOT, POS, M, T, K, hq, hk, n_rope, max_len, eps,
                     sxm, swn, sqm, sks, skl, skh, svs, svl, svh, scb, sct, ssb, sst, sslot, spb, spt,
                     HALF: tl.constexpr, HAS_NORM: tl.constexpr, IEEE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    # Program (m, n), row blocks first as in linear.py: rows [m*BLOCK_M, +BLOCK_M); n < n_rope:
    # rope pairs [n*PAIRS, +PAIRS) of the q heads then the k heads (pair p: head p // HALF,
    # element p % HALF), else v outputs [(n - n_rope)*BLOCK_N, +BLOCK_N).
    D: tl.constexpr = 2 * HALF
    PAIRS: tl.constexpr = BLOCK_N // 2
    pid_n = tl.program_id(1)
    rope = pid_n < n_rope
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rmask = rows < M
    j = tl.arange(0, BLOCK_N)
    pair = pid_n * PAIRS + j % PAIRS  # tile columns: the pairs' first halves, then their second
    vcol = (pid_n - n_rope) * BLOCK_N + j
    wrows = tl.where(rope, (pair // HALF) * D + pair % HALF + (j // PAIRS) * HALF, (hq + hk) * D + vcol)
    cmask = tl.where(rope, pair < (hq + hk) * HALF, (vcol >= 0) & (vcol < hk * D))
    wrows = tl.where(cmask, wrows, 0).to(tl.int64)
    acc, _ = _product(X, W, NW, rows, rmask, wrows, cmask, 0, K, sxm, swn, eps,
                      HAS_NORM, False, IEEE, BLOCK_M, BLOCK_N, BLOCK_K, PDL)  # linear.py's reduction
    dt = QO.dtype.element_ty
    y = acc.to(dt)  # the projection's output, rounded as linear.py rounds it
    b = rows // T
    t = rows % T
    slot = tl.load(SLOT + b * sslot, mask=rmask, other=0).to(tl.int64)
    pos = tl.load(POS + b * spb + t * spt, mask=rmask, other=-1).to(tl.int64)
    in_cache = rmask & (pos >= 0) & (pos < max_len)
    if rope:
        x1, x2 = tl.split(tl.permute(tl.reshape(y.to(tl.float32), [BLOCK_M, 2, PAIRS]), (0, 2, 1)))
        p = pid_n * PAIRS + tl.arange(0, PAIRS)
        head = (p // HALF)[None, :]
        i = (p % HALF)[None, :]
        pmask = (p < (hq + hk) * HALF)[None, :]
        # rope.py's formula: the angles rounded to dt, each product rounded to dt where the
        # compiler does not contract it into the sum (the module docstring)
        c = tl.load(COS + b[:, None] * scb + t[:, None] * sct + i, mask=rmask[:, None] & pmask, other=0.0)
        s = tl.load(SIN + b[:, None] * ssb + t[:, None] * sst + i, mask=rmask[:, None] & pmask, other=0.0)
        c = c.to(dt).to(tl.float32)
        s = s.to(dt).to(tl.float32)
        o1 = ((x1 * c).to(dt).to(tl.float32) + (x2 * (-s)).to(dt).to(tl.float32)).to(dt)
        o2 = ((x2 * c).to(dt).to(tl.float32) + (x1 * s).to(dt).to(tl.float32)).to(dt)
        is_q = head < hq
        q_at = QO + rows[:, None] * sqm + head * D + i
        qmask = rmask[:, None] & pmask & is_q
        tl.store(q_at, o1, mask=qmask)
        tl.store(q_at + HALF, o2, mask=qmask)
        k_at = KC + slot[:, None] * sks + pos[:, None] * skl + (head - hq) * skh + i
        kmask_out = in_cache[:, None] & pmask & (head >= hq)
        tl.store(k_at, o1, mask=kmask_out)
        tl.store(k_at + HALF, o2, mask=kmask_out)
    else:
        v_at = VC + slot[:, None] * svs + pos[:, None] * svl + (vcol // D)[None, :] * svh + (vcol % D)[None, :]
        tl.store(v_at, y, mask=in_cache[:, None] & cmask[None, :])


def qkv_rope_write_kv_triton(x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                             k_cache: torch.Tensor, v_cache: torch.Tensor, slot_ids: torch.Tensor,
                             cache_positions: torch.Tensor, hq: int, hk: int, *,
                             norm_weight: Optional[torch.Tensor] = None, eps: float = 1e-6) -> torch.Tensor:
    """The module doc's function (the caller checks the case: linear.py use_linear_kernel
    for x and the weights, contiguous caches of x's dtype with unit stride in d)."""
    B, T, K = x.shape
    d = _head_size("qkv_rope_write_kv_triton: weight", weight.shape[0], hq, hk, k_cache, v_cache)
    rows = x.reshape(-1, K)
    M = rows.shape[0]
    qo = torch.empty((B, T, hq, d), dtype=x.dtype, device=x.device)
    if M:
        cfg = tile_config(weight.shape[0], K)
        block_m = row_block(M, weight.shape[0])
        n_rope = triton.cdiv((hq + hk) * (d // 2), cfg["BLOCK_N"] // 2)
        grid = (triton.cdiv(M, block_m), n_rope + triton.cdiv(hk * d, cfg["BLOCK_N"]))
        cos = cos.expand(B, T, 1, d // 2)
        sin = sin.expand(B, T, 1, d // 2)
        _qkv_rope_kernel[grid](
            rows, weight, norm_weight if norm_weight is not None else weight, qo, k_cache, v_cache, cos, sin,
            slot_ids, cache_positions, M, T, K, hq, hk, n_rope, k_cache.shape[1], eps,
            rows.stride(0), weight.stride(0), qo.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1), slot_ids.stride(0),
            cache_positions.stride(0), cache_positions.stride(1),
            HALF=d // 2, HAS_NORM=norm_weight is not None, IEEE=x.dtype == torch.float32,
            BLOCK_M=block_m, **cfg, **pdl_launch(x),
        )
    return qo


def _head_size(what: str, width: int, hq: int, hk: int, k_cache: torch.Tensor, v_cache: torch.Tensor) -> int:
    """The head size d of a qkv width holding hq q and hk k and v heads, checked against the caches'."""
    d = width // (hq + 2 * hk)
    if d * (hq + 2 * hk) != width or d % 2 or k_cache.shape[-1] != d or v_cache.shape[-1] != d:
        raise ValueError(f"{what} of width {width} must hold {hq} q and {hk} k and v heads of one even head "
                         f"size, the caches' ({k_cache.shape[-1]}, {v_cache.shape[-1]})")
    return d


@triton.jit(do_not_specialize=["T", "spb"])
def _rope_write_kv_kernel(QKV, QO, KC, VC, COS, SIN, SLOT, POS, T, hq, hk, max_len,
                          sxb, sxt, sqb, sqt, sqh, sks, skl, skh, svs, svl, svh, scb, sct, ssb, sst, sslot, spb, spt,
                          HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
                          BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: nothing of the kernels before is read until they are done
        gdc_wait()
        gdc_launch_dependents()
    D: tl.constexpr = 2 * HALF
    pid = tl.program_id(0)  # (b, t)
    b = (pid // T).to(tl.int64)
    t = (pid % T).to(tl.int64)
    x = QKV + b * sxb + t * sxt  # the token's q heads, then k, then v, each D wide
    c, s = _token_angles(COS, SIN, b, t, scb, sct, ssb, sst, QO.dtype.element_ty, HALF, BLOCK_D)
    _rotate_heads(x, QO + b * sqb + t * sqt, D, sqh, hq, c, s, HALF, BLOCK_HQ, BLOCK_D)
    slot = tl.load(SLOT + b * sslot).to(tl.int64)
    pos = tl.load(POS + b * spb + t * spt).to(tl.int64)
    heads = tl.where((pos >= 0) & (pos < max_len), hk, 0)  # a column outside the cache writes nothing
    _rotate_heads(x + hq * D, KC + slot * sks + pos * skl, D, skh, heads, c, s, HALF, BLOCK_HK, BLOCK_D)
    h = tl.arange(0, BLOCK_HK)[:, None]
    e = tl.arange(0, 2 * BLOCK_D)[None, :]
    vmask = (h < heads) & (e < D)
    v = tl.load(x + (hq + hk) * D + h * D + e, mask=vmask)
    tl.store(VC + slot * svs + pos * svl + h * svh + e, v, mask=vmask)


def rope_write_kv_triton(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, slot_ids: torch.Tensor, cache_positions: torch.Tensor,
                         hq: int, hk: int) -> torch.Tensor:
    """The module doc's second function (the caller checks the case: qkv with unit stride
    in its last dim, contiguous caches of its dtype with unit stride in d)."""
    B, T, width = qkv.shape
    d = _head_size("rope_write_kv_triton: qkv", width, hq, hk, k_cache, v_cache)
    qo = torch.empty((B, T, hq, d), dtype=qkv.dtype, device=qkv.device)
    if B * T:
        cos = cos.expand(B, T, 1, d // 2)
        sin = sin.expand(B, T, 1, d // 2)
        _rope_write_kv_kernel[(B * T,)](
            qkv, qo, k_cache, v_cache, cos, sin, slot_ids, cache_positions, T, hq, hk, k_cache.shape[1],
            qkv.stride(0), qkv.stride(1), qo.stride(0), qo.stride(1), qo.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1), slot_ids.stride(0),
            cache_positions.stride(0), cache_positions.stride(1),
            HALF=d // 2, BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HK=triton.next_power_of_2(hk),
            BLOCK_D=triton.next_power_of_2(d // 2), **pdl_launch(qkv),
        )
    return qo
