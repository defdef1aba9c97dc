"""One EAGLE-2 drafting round's choice of the nodes to expand next, in one launch.

tree_expand(cum, child_tokens, hidden, ancestors, first, level, parents_out) -> (scores,
tokens, node_hidden, ancestors) for B sequences, k expanded nodes
(hidden [B, k, H], ancestors [B, k, W]) and their k children each
(eagle_zoo/engine/tree_proposer.py), cum and child_tokens [B, k * k] the children's
cumulative scores and tokens (rows of any stride: slices of the tree's candidate rows):
  pick = the k largest of cum, largest first, ties to the lower index
  scores = cum[pick], tokens = child_tokens[pick]
  parents_out [B, k * k] = first + pick, each k times, in place (the candidate number
      of the parent of each of the next round's children: the candidate rows' slice for
      them)
  node_hidden = hidden[pick // k] ([B, k, H])
  ancestors = ancestors[pick // k] ([B, k, W]) with column level * k + j at ``level``
      for the j-th picked (its own scratch column in the round that runs it)
Why: torch takes ~12 small kernels a round for this (a sort, the divide, five gathers,
their copies, the repeat and the column write), and a tree step is bound by its kernel
count.

One program a sequence: the k * k scores as int64 keys (kernels/top_k.py's order_keys), the
k largest by k max-reductions, then the winners' rows copied.
"""
from __future__ import annotations

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton
from .top_k import key_column, order_keys, stable_top

MAX_K = 16  # k * k scores live in one program's registers


def tree_expand_torch(cum, child_tokens, hidden, ancestors, first: int, level: int, parents_out):
    B, k = hidden.shape[:2]
    pick = stable_top(cum, k)
    parent = pick // k
    rows = ancestors.gather(1, parent.unsqueeze(-1).expand(B, k, ancestors.shape[-1]))
    rows[:, :, level] = level * k + torch.arange(k, device=rows.device)
    parents_out.copy_((first + pick).repeat_interleave(k, 1))
    return (cum.gather(1, pick), child_tokens.gather(1, pick),
            hidden.gather(1, parent.unsqueeze(-1).expand(B, k, hidden.shape[-1])), rows)


@triton.jit
def _tree_expand_kernel(CUM, CT, HID, ANC, S_OUT, T_OUT, C_OUT, H_OUT, A_OUT, first, level,
                        s_cum, s_ct, s_c, s_hb, s_hk, s_ab, s_ak, H, W,
                        K: tl.constexpr, KK: tl.constexpr, KP: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_W: tl.constexpr, PDL: tl.constexpr):
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
        kcols = tl.arange(0, KP)
        tl.store(C_OUT + b * s_c + j * K + kcols, first + pick + kcols * 0, mask=kcols < K)
        for h0 in range(0, H, BLOCK_H):
            m = h0 + hcols < H
            row = tl.load(HID + b * s_hb + parent * s_hk + h0 + hcols, mask=m)
            tl.store(H_OUT + (b * K + j) * H + h0 + hcols, row, mask=m)
        wm = wcols < W
        path = tl.load(ANC + b * s_ab + parent * s_ak + wcols, mask=wm)
        path = tl.where(wcols == level, level * K + j, path)  # one store: its own column at its level
        tl.store(A_OUT + (b * K + j) * W + wcols, path, mask=wm)


def tree_expand_triton(cum, child_tokens, hidden, ancestors, first: int, level: int, parents_out):
    B, k = hidden.shape[:2]
    if not 1 <= k <= MAX_K:
        raise ValueError(f"tree_expand_triton: k = {k}, not in 1 .. {MAX_K}")
    if not 0 <= level < ancestors.shape[-1]:
        raise ValueError(f"tree_expand_triton: level {level} outside the ancestor rows' {ancestors.shape[-1]} levels")
    H, W = hidden.shape[-1], ancestors.shape[-1]
    device = cum.device
    out_s = torch.empty(B, k, dtype=cum.dtype, device=device)
    out_t = torch.empty(B, k, dtype=child_tokens.dtype, device=device)
    out_h = torch.empty(B, k, H, dtype=hidden.dtype, device=device)
    out_a = torch.empty(B, k, W, dtype=ancestors.dtype, device=device)
    if B:
        _tree_expand_kernel[(B,)](
            cum, child_tokens, hidden, ancestors, out_s, out_t, parents_out, out_h, out_a, first, level,
            cum.stride(0), child_tokens.stride(0), parents_out.stride(0), hidden.stride(0), hidden.stride(1),
            ancestors.stride(0), ancestors.stride(1),
            H, W, K=k, KK=triton.next_power_of_2(k * k), KP=triton.next_power_of_2(k), BLOCK_H=min(triton.next_power_of_2(H), 1024),
            BLOCK_W=triton.next_power_of_2(W), **pdl_launch(cum))
    return out_s, out_t, out_h, out_a


def tree_expand(cum, child_tokens, hidden, ancestors, first: int, level: int, parents_out):
    """Triton on CUDA for float32 scores (log-probs), int64 parents, k <= MAX_K and rows of
    unit stride; the reference otherwise."""
    ok = (use_triton(cum, child_tokens, hidden, ancestors) and cum.dtype == torch.float32
          and all(t.stride(-1) == 1 for t in (cum, child_tokens, hidden, ancestors))
          and parents_out.dtype == torch.long and parents_out.stride(-1) == 1
          and 1 <= hidden.shape[1] <= MAX_K)
    return (tree_expand_triton if ok else tree_expand_torch)(cum, child_tokens, hidden, ancestors, first, level,
                                                             parents_out)
