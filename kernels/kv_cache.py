"""Write the k/v of new tokens into the preallocated KV caches.

k_cache [num_slots, max_len, n_kv, d_k], v_cache [..., d_v]; k [B,T,n_kv,d_k],
v [B,T,n_kv,d_v]; token (b, t) goes to row slot_ids[b], column cache_positions[b,t].
Values are cast to the cache dtype. Positions must lie in [0, max_len): the
reference raises on a bad index, the Triton kernel drops that token's write rather
than touch memory outside the cache (checking on the host would need a sync).
"""
from __future__ import annotations

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton


def write_kv_torch(k_cache, v_cache, k, v, slot_ids, cache_positions) -> None:
    """Reference: one advanced-index write per cache (no host sync, fixed shapes)."""
    B, T = cache_positions.shape
    rows = slot_ids.view(B, 1).expand(B, T)
    k_cache[rows, cache_positions] = k.to(k_cache.dtype)
    v_cache[rows, cache_positions] = v.to(v_cache.dtype)


@triton.jit(do_not_specialize=["T", "spb"])  # prompt lengths vary: one compiled variant
def _write_kv_kernel(K, V, KC, VC, SLOT, POS, T, n_kv, max_len,
                     skb, skt, skh, skd, svb, svt, svh, svd,
                     sks, skl, skch, skcd, svs, svl, svch, svcd, ssb, spb, spt,
                     DK: tl.constexpr, DV: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: nothing of the kernels before is read until they are done
        gdc_wait()
        gdc_launch_dependents()
    # One program per token: its whole [n_kv, d] tile for k and for v.
    pid = tl.program_id(0)
    b = pid // T
    t = pid % T
    slot = tl.load(SLOT + b * ssb).to(tl.int64)  # int64: slot * row stride can pass 2**31
    pos = tl.load(POS + b * spb + t * spt).to(tl.int64)
    # Masks are built from vector comparisons only: triton 3.9's interpreter mis-types a
    # scalar comparison broadcast into a load/store mask.
    heads = tl.where((pos >= 0) & (pos < max_len), n_kv, 0)
    h = tl.arange(0, BLOCK_H)[:, None]
    dk = tl.arange(0, BLOCK_DK)[None, :]
    mk = (h < heads) & (dk < DK)
    x = tl.load(K + b * skb + t * skt + h * skh + dk * skd, mask=mk)
    tl.store(KC + slot * sks + pos * skl + h * skch + dk * skcd, x.to(KC.dtype.element_ty), mask=mk)
    dv = tl.arange(0, BLOCK_DV)[None, :]
    mv = (h < heads) & (dv < DV)
    y = tl.load(V + b * svb + t * svt + h * svh + dv * svd, mask=mv)
    tl.store(VC + slot * svs + pos * svl + h * svch + dv * svcd, y.to(VC.dtype.element_ty), mask=mv)


def write_kv_triton(k_cache, v_cache, k, v, slot_ids, cache_positions) -> None:
    B, T, n_kv, dk = k.shape
    dv = v.shape[-1]
    if B * T == 0:
        return
    _write_kv_kernel[(B * T,)](
        k, v, k_cache, v_cache, slot_ids, cache_positions, T, n_kv, k_cache.shape[1],
        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(), slot_ids.stride(0),
        *cache_positions.stride(),
        DK=dk, DV=dv, BLOCK_H=triton.next_power_of_2(n_kv),
        BLOCK_DK=triton.next_power_of_2(dk), BLOCK_DV=triton.next_power_of_2(dv), **pdl_launch(k),
    )


def write_kv(k_cache, v_cache, k, v, slot_ids, cache_positions) -> None:
    """In place: k_cache[slot_ids[b], cache_positions[b,t]] = k[b,t] (and v). Triton on CUDA."""
    if use_triton(k_cache, k):
        write_kv_triton(k_cache, v_cache, k, v, slot_ids, cache_positions)
    else:
        write_kv_torch(k_cache, v_cache, k, v, slot_ids, cache_positions)
