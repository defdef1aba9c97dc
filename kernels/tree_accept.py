"""Greedy acceptance of an EAGLE-2 tree, in one launch.

tree_accept_greedy(target_argmax, tokens, parents, depth, ancestors) -> (emitted [B, L+1],
num_accepted [B], path [B, L+1]) over TreeDraft's tensors (eagle_zoo/engine/tree.py):
a node is correct when its token is the target's greedy choice after its parent, and the
deepest node whose whole path is correct is the accepted leaf (siblings hold distinct
tokens, so it is unique). emit_path turns a leaf into what the engine emits:
  emitted  the path's tokens below the root, then the target's token after the leaf, then -1
  path     the node at each level of the path; past the leaf the level number itself, a
           valid node index that the cache compaction copies onto itself
Why: torch takes ~20 small kernels for this (gathers over the ancestor table, an all, a
max, the path's gathers and wheres), once per tree step.

One program a sequence: each node's correctness is read at its ancestors' places straight
from the inputs, so nothing is staged in memory.
"""
from __future__ import annotations

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton


def emit_path(ancestors, tokens, leaf, num_accepted, next_token):
    """(emitted, num_accepted, path) for the accepted path ending at node ``leaf`` [B],
    followed by ``next_token`` [B]; ancestors [B, N, L+1] and tokens [B, N] of the tree."""
    B, L = leaf.shape[0], ancestors.shape[2] - 1
    level = torch.arange(L + 1, device=leaf.device)
    path = ancestors.gather(1, leaf.view(B, 1, 1).expand(B, 1, L + 1))[:, 0]
    path = torch.where(path >= 0, path, level.expand(B, L + 1))
    path_tokens = torch.nn.functional.pad(tokens.gather(1, path)[:, 1:], (0, 1), value=-1)
    na = num_accepted.view(B, 1)
    pad = torch.full_like(path_tokens, -1)
    emitted = torch.where(level < na, path_tokens, torch.where(level == na, next_token.view(B, 1), pad))
    return emitted, num_accepted, path


def tree_accept_greedy_torch(target_argmax, tokens, parents, depth, ancestors):
    B, N = target_argmax.shape
    L = ancestors.shape[2] - 1
    expected = target_argmax.gather(1, parents.clamp(min=0))
    correct = tokens == expected
    correct[:, 0] = True  # the root is given
    along = correct.gather(1, ancestors.clamp(min=0).flatten(1)).view(B, N, L + 1)
    ok = (along | (ancestors < 0)).all(-1)
    num_accepted, leaf = torch.where(ok, depth, torch.full_like(depth, -1)).max(1)
    return emit_path(ancestors, tokens, leaf, num_accepted, target_argmax.gather(1, leaf.view(B, 1))[:, 0])


@triton.jit
def _tree_accept_kernel(ARG, TOK, PAR, DEP, ANC, E_OUT, NA_OUT, P_OUT, s_arg, s_tok, s_par, s_dep, s_ab, s_an, N,
                        L: tl.constexpr, NP: tl.constexpr, LP: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the target's choices are the kernel before's output
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, NP)
    live = i < N
    d = tl.arange(0, LP)
    anc = tl.load(ANC + b * s_ab + i[:, None] * s_an + d[None, :], mask=live[:, None] & (d[None, :] <= L), other=-1)
    j = tl.maximum(anc, 0)  # [NP, LP]: the ancestors whose correctness decides node i's
    parent_j = tl.maximum(tl.load(PAR + b * s_par + j), 0)
    correct_j = (tl.load(TOK + b * s_tok + j) == tl.load(ARG + b * s_arg + parent_j)) | (j == 0)
    ok = tl.min((correct_j | (anc < 0)).to(tl.int32), axis=1) > 0
    depth = tl.load(DEP + b * s_dep + i, mask=live, other=0)
    score = tl.where(ok & live, depth, -1)
    num_accepted = tl.max(score, axis=0)
    leaf = tl.min(tl.where(score == num_accepted, i, NP), axis=0)  # the first node of that depth, as torch's max
    next_token = tl.load(ARG + b * s_arg + leaf)
    path = tl.load(ANC + b * s_ab + leaf * s_an + d, mask=d <= L, other=-1)
    path = tl.where(path >= 0, path, d)
    below = tl.load(ANC + b * s_ab + leaf * s_an + d + 1, mask=d + 1 <= L, other=-1)  # the path's node one level down
    below_token = tl.load(TOK + b * s_tok + tl.where(below >= 0, below, d + 1), mask=d + 1 <= L, other=-1)
    emitted = tl.where(d < num_accepted, below_token, tl.where(d == num_accepted, next_token, -1))
    tl.store(E_OUT + b * (L + 1) + d, emitted, mask=d <= L)
    tl.store(P_OUT + b * (L + 1) + d, path, mask=d <= L)
    tl.store(NA_OUT + b, num_accepted)


def tree_accept_greedy_triton(target_argmax, tokens, parents, depth, ancestors):
    B, N = target_argmax.shape
    L = ancestors.shape[2] - 1
    device = target_argmax.device
    emitted = torch.empty(B, L + 1, dtype=target_argmax.dtype, device=device)
    num_accepted = torch.empty(B, dtype=depth.dtype, device=device)
    path = torch.empty(B, L + 1, dtype=ancestors.dtype, device=device)
    if B:
        _tree_accept_kernel[(B,)](target_argmax, tokens, parents, depth, ancestors, emitted, num_accepted, path,
                                  target_argmax.stride(0), tokens.stride(0), parents.stride(0), depth.stride(0),
                                  ancestors.stride(0), ancestors.stride(1), N, L=L, NP=triton.next_power_of_2(N),
                                  LP=triton.next_power_of_2(L + 1), **pdl_launch(target_argmax))
    return emitted, num_accepted, path


def tree_accept_greedy(target_argmax, tokens, parents, depth, ancestors):
    """Triton on CUDA for rows of unit stride; the reference otherwise."""
    ok = (use_triton(target_argmax, tokens, parents, depth, ancestors)
          and all(t.stride(-1) == 1 for t in (target_argmax, tokens, parents, depth, ancestors)))
    return (tree_accept_greedy_triton if ok else tree_accept_greedy_torch)(target_argmax, tokens, parents, depth,
                                                                            ancestors)
