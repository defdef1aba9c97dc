"""One EAGLE-2 drafting round's choice of the nodes to expand next, in one launch.

tree_expand(cum, child_tokens, hidden, visible, first) -> (scores, tokens, node_cand,
node_hidden, visible) for B sequences, k expanded nodes and their k children each
(eagle_zoo/engine/tree_proposer.py), cum [B, k * k] the children's cumulative scores:
  pick = the k largest of cum, largest first, ties to the lower index
  scores = cum[pick], tokens = child_tokens[pick], node_cand = first + pick
  node_hidden = hidden[pick // k] ([B, k, H]), visible = visible[pick // k] ([B, k, W])
Why: torch takes ~9 small kernels a round for this (a sort, the divide, five gathers,
their copies), and a tree step is bound by its kernel count.

One program a sequence: the k * k scores as int64 keys (kernels/top_k.py's order_keys), the
k largest by k max-reductions, then the winners' rows copied.
"""
from __future__ import annotations

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton
from .top_k import key_column, order_keys, stable_top

MAX_K = 16  # k * k scores live in one program's registers


def tree_expand_torch(cum, child_tokens, hidden, visible, first: int):
    B, k = child_tokens.shape[:2]
    pick = stable_top(cum, k)
    parent = pick // k
    return (cum.gather(1, pick), child_tokens.flatten(1).gather(1, pick), first + pick,
            hidden.gather(1, parent.unsqueeze(-1).expand(B, k, hidden.shape[-1])),
            visible.gather(1, parent.unsqueeze(-1).expand(B, k, visible.shape[-1])))


@triton.jit
def _tree_expand_kernel(CUM, CT, HID, VIS, S_OUT, T_OUT, C_OUT, H_OUT, V_OUT, first,
                        s_cum, s_ct, s_hb, s_hk, s_vb, s_vk, H, W,
                        K: tl.constexpr, KK: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
                        PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the scores are the kernel before's output
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0).to(tl.int64)
    idx = tl.arange(0, KK)
    valid = idx < K * K
    cum = tl.load(CUM + b * s_cum + idx, mask=valid, other=float("-inf"))
    key = order_keys(cum, idx, valid)
    empty = -9223372036854775807 - 1
    hcols = tl.arange(0, BLOCK_H)
    wcols = tl.arange(0, BLOCK_W)
    for j in tl.static_range(K):
        top = tl.max(key, axis=0)
        key = tl.where(key == top, empty, key)
        pick = key_column(top)
        parent = pick // K
        tl.store(S_OUT + b * K + j, tl.load(CUM + b * s_cum + pick))
        tl.store(T_OUT + b * K + j, tl.load(CT + b * s_ct + pick))
        tl.store(C_OUT + b * K + j, first + pick)
        for h0 in range(0, H, BLOCK_H):
            m = h0 + hcols < H
            row = tl.load(HID + b * s_hb + parent * s_hk + h0 + hcols, mask=m)
            tl.store(H_OUT + (b * K + j) * H + h0 + hcols, row, mask=m)
        wm = wcols < W
        tl.store(V_OUT + (b * K + j) * W + wcols, tl.load(VIS + b * s_vb + parent * s_vk + wcols, mask=wm), mask=wm)


def tree_expand_triton(cum, child_tokens, hidden, visible, first: int):
    B, k = child_tokens.shape[:2]
    if not 1 <= k <= MAX_K:
        raise ValueError(f"tree_expand_triton: k = {k}, not in 1 .. {MAX_K}")
    H, W = hidden.shape[-1], visible.shape[-1]
    ct = child_tokens.reshape(B, k * k)
    vis = visible.view(torch.uint8)  # bools as bytes, the same bits
    device = cum.device
    out_s = torch.empty(B, k, dtype=cum.dtype, device=device)
    out_t = torch.empty(B, k, dtype=child_tokens.dtype, device=device)
    out_c = torch.empty(B, k, dtype=torch.long, device=device)
    out_h = torch.empty(B, k, H, dtype=hidden.dtype, device=device)
    out_v = torch.empty(B, k, W, dtype=visible.dtype, device=device)
    if B:
        _tree_expand_kernel[(B,)](
            cum, ct, hidden, vis, out_s, out_t, out_c, out_h, out_v.view(torch.uint8), first,
            cum.stride(0), ct.stride(0), hidden.stride(0), hidden.stride(1), vis.stride(0), vis.stride(1),
            H, W, K=k, KK=triton.next_power_of_2(k * k), BLOCK_H=min(triton.next_power_of_2(H), 1024),
            BLOCK_W=triton.next_power_of_2(W), **pdl_launch(cum))
    return out_s, out_t, out_c, out_h, out_v


def tree_expand(cum, child_tokens, hidden, visible, first: int):
    """Triton on CUDA for float32 scores (log-probs), k <= MAX_K and rows of unit stride;
    the reference otherwise."""
    ok = (use_triton(cum, child_tokens, hidden, visible) and cum.dtype == torch.float32 and cum.stride(1) == 1
          and child_tokens.is_contiguous() and hidden.stride(-1) == 1 and visible.stride(-1) == 1
          and 1 <= child_tokens.shape[1] <= MAX_K)
    return (tree_expand_triton if ok else tree_expand_torch)(cum, child_tokens, hidden, visible, first)
