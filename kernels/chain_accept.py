"""Greedy acceptance of a chain of drafts, in one launch.

chain_accept_greedy(target_argmax [B, K+1], drafts [B, K], num_draft [B] or None) ->
(tokens [B, K+1], num_accepted [B]): draft j is accepted while it and every draft before
it equal the target's greedy token at their positions (target_argmax[b, j]) and, with
num_draft, while j < num_draft[b]; tokens are the target's up to and including the one
after the last accepted draft, then -1. K = 0 is a plain step: its token, none accepted.
Why: torch takes ~8 small kernels for this (arange, a compare, cumprod, sum, where and
their fills), once per decode step, plain steps included (eagle_zoo/engine/verify.py).
"""
from __future__ import annotations

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton

MAX_POSITIONS = 1024  # K + 1 in one program's registers


def chain_accept_greedy_torch(target_argmax, drafts, num_draft=None):
    B, K = drafts.shape
    pos = torch.arange(K + 1, device=target_argmax.device)
    match = drafts == target_argmax[:, :K]
    if num_draft is not None:
        match &= pos[:K] < num_draft.view(B, 1)
    accepted = match.long().cumprod(1).sum(1)
    tokens = torch.where(pos <= accepted.unsqueeze(1), target_argmax, torch.full_like(target_argmax, -1))
    return tokens, accepted


@triton.jit
def _chain_accept_kernel(ARG, DR, NUM, T_OUT, A_OUT, K, s_arg, s_dr, HAS_NUM: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the target's choices are the kernel before's output
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    target = tl.load(ARG + b * s_arg + j, mask=j <= K, other=-1)
    draft = tl.load(DR + b * s_dr + j, mask=j < K, other=-1)
    match = (draft == target) & (j < K)
    if HAS_NUM:
        match &= j < tl.load(NUM + b)
    accepted = tl.min(tl.where(match, BLOCK, j), axis=0)  # the first draft not accepted (K when all are)
    tl.store(T_OUT + b * (K + 1) + j, tl.where(j <= accepted, target, -1), mask=j <= K)
    tl.store(A_OUT + b, accepted.to(tl.int64))


def chain_accept_greedy_triton(target_argmax, drafts, num_draft=None):
    B, K = drafts.shape
    if K + 1 > MAX_POSITIONS:
        raise ValueError(f"chain_accept_greedy_triton: {K} drafts, at most {MAX_POSITIONS - 1}")
    tokens = torch.empty(B, K + 1, dtype=target_argmax.dtype, device=target_argmax.device)
    accepted = torch.empty(B, dtype=torch.long, device=target_argmax.device)
    if B:
        dr = drafts if K else target_argmax  # no draft is read at K = 0: any pointer
        _chain_accept_kernel[(B,)](target_argmax, dr, num_draft if num_draft is not None else target_argmax,
                                   tokens, accepted, K, target_argmax.stride(0), dr.stride(0),
                                   HAS_NUM=num_draft is not None, BLOCK=triton.next_power_of_2(K + 1),
                                   **pdl_launch(target_argmax))
    return tokens, accepted


def chain_accept_greedy(target_argmax, drafts, num_draft=None):
    """Triton on CUDA for rows of unit stride and at most MAX_POSITIONS positions; the
    reference otherwise."""
    K = drafts.shape[1]
    ok = (use_triton(target_argmax, drafts) and target_argmax.stride(1) == 1 and (K == 0 or drafts.stride(1) == 1)
          and K + 1 <= MAX_POSITIONS and (num_draft is None or num_draft.is_contiguous()))
    return (chain_accept_greedy_triton if ok else chain_accept_greedy_torch)(target_argmax, drafts, num_draft)
