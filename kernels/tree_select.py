"""An EAGLE-2 tree from its drafted candidates, in one launch.

tree_select(scores, tokens, parents, root, base, total_tokens, max_depth) -> (tokens,
parents, depth, ancestors, positions), the tensors of eagle_zoo/engine/tree.py's
TreeDraft: the best total_tokens - 1 of M candidates (largest cumulative score first,
ties to the lower candidate number) become nodes 1.. in candidate order under the root,
node 0, whose token is root [B]. scores, tokens, parents [B, M]; parents holds candidate
numbers, -1 for the root's children; base [B] the root's position, so that each node's
rope position, base + its depth, comes from the same launch (not an add after it).
Why: torch takes ~30 small kernels for the selection and the tree's shape tensors (a
sort, scatters, a gather per level, stacks, comparisons), once per tree step.

One program a sequence: each candidate's rank from comparisons of its order_keys
(kernels/top_k.py) with all the others', the kept ones' node numbers by a prefix count; the node parents go to
memory, and each node's chain of ancestors is walked from there.
"""
from __future__ import annotations

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton
from .top_k import order_keys, stable_top

MAX_CANDIDATES = 1024  # each program holds its candidates' keys in registers
RANK_BLOCK = 32  # candidates compared with all the others at a time


def build_tree(parents: torch.Tensor, max_depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From parents [B, N] (-1 for node 0, else a smaller node index) and a bound on the
    depth: (depth [B, N], ancestors [B, N, max_depth+1])."""
    B, N = parents.shape
    up = parents.clamp(min=0)  # the root points at itself
    # chain[:, :, s] = the node s steps above each node (the root once reached)
    steps = [torch.arange(N, device=parents.device).expand(B, N)]
    for _ in range(max_depth):
        steps.append(up.gather(1, steps[-1]))
    chain = torch.stack(steps, dim=2)  # [B, N, max_depth+1]
    depth = (chain != 0).sum(-1)
    level = torch.arange(max_depth + 1, device=parents.device)
    above = (depth.unsqueeze(-1) - level).clamp(min=0)  # steps up to reach level d
    ancestors = chain.gather(2, above)
    return depth, torch.where(level <= depth.unsqueeze(-1), ancestors, torch.full_like(ancestors, -1))


def tree_select_torch(scores, tokens, parents, root, base, total_tokens: int, max_depth: int):
    B, M = scores.shape
    n = total_tokens - 1
    device = scores.device
    chosen = stable_top(scores, n).sort(dim=1).values  # candidate order: parents first
    node_of = torch.zeros(B, M, dtype=torch.long, device=device)
    node_of.scatter_(1, chosen, torch.arange(1, n + 1, device=device).expand(B, n))
    cand_parent = parents.gather(1, chosen)
    node_parent = torch.where(cand_parent < 0, torch.zeros_like(cand_parent),
                              node_of.gather(1, cand_parent.clamp(min=0)))
    node_parents = torch.cat([torch.full((B, 1), -1, dtype=torch.long, device=device), node_parent], dim=1)
    node_tokens = torch.cat([root.view(B, 1).to(tokens.dtype), tokens.gather(1, chosen)], dim=1)
    depth, ancestors = build_tree(node_parents, max_depth)
    return node_tokens, node_parents, depth, ancestors, base.view(B, 1) + depth


@triton.jit
def _tree_select_kernel(SC, TOK, PAR, ROOT, BASE, KEYS, NODE_OF, T_OUT, P_OUT, D_OUT, A_OUT, POS_OUT,
                        s_sc, s_tok, s_par, s_root, s_base, M, N,
                        MP: tl.constexpr, NP: tl.constexpr, L: tl.constexpr, JB: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the candidates are the kernels before's output
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, MP)
    valid = c < M
    key = order_keys(tl.load(SC + b * s_sc + c, mask=valid, other=float("-inf")).to(tl.float32), c, valid)
    tl.store(KEYS + b * MP + c, key)
    tl.debug_barrier()  # every candidate's key is compared with every other's below
    rank = tl.zeros([MP], tl.int32)  # candidates ahead of each
    for j0 in range(0, MP, JB):
        other = tl.load(KEYS + b * MP + j0 + tl.arange(0, JB))
        rank += tl.sum((other[None, :] > key[:, None]).to(tl.int32), axis=1)
    kept = valid & (rank < N - 1)
    node = tl.cumsum(kept.to(tl.int32), axis=0)  # node number of each kept candidate (1-based)
    tl.store(NODE_OF + b * MP + c, node)
    tl.debug_barrier()  # NODE_OF is read below at other candidates' places
    par = tl.load(PAR + b * s_par + c, mask=kept, other=-1)
    parent_node = tl.load(NODE_OF + b * MP + tl.maximum(par, 0), mask=kept & (par >= 0), other=0)
    tl.store(T_OUT + b * N + node, tl.load(TOK + b * s_tok + c, mask=kept), mask=kept)
    tl.store(P_OUT + b * N + node, parent_node.to(tl.int64), mask=kept)
    tl.store(T_OUT + b * N, tl.load(ROOT + b * s_root).to(T_OUT.dtype.element_ty))
    tl.store(P_OUT + b * N, -1)
    tl.debug_barrier()  # the node parents are walked below
    v = tl.arange(0, NP)
    live = v < N
    # depth: the chain v, parent(v), ... (the root stays at itself)
    cur = v
    depth = tl.zeros([NP], tl.int64)
    for _ in tl.static_range(L):
        cur = tl.maximum(tl.load(P_OUT + b * N + cur, mask=live, other=0), 0)
        depth += (cur != 0).to(tl.int64)
    depth += (v != 0).to(tl.int64)
    tl.store(D_OUT + b * N + v, depth, mask=live)
    tl.store(POS_OUT + b * N + v, tl.load(BASE + b * s_base).to(tl.int64) + depth, mask=live)
    # ancestors[v, d]: the node s = depth - d steps above v, -1 for d > depth
    for d in tl.static_range(L + 1):
        anc = tl.full([NP], -1, tl.int64)
        cur = v
        for s in tl.static_range(L + 1):
            anc = tl.where(depth - d == s, cur, anc)
            if s < L:
                cur = tl.maximum(tl.load(P_OUT + b * N + cur, mask=live, other=0), 0)
        tl.store(A_OUT + (b * N + v) * (L + 1) + d, anc, mask=live)


def tree_select_triton(scores, tokens, parents, root, base, total_tokens: int, max_depth: int):
    B, M = scores.shape
    N = total_tokens
    if not 2 <= N <= M + 1 or M > MAX_CANDIDATES:
        raise ValueError(f"tree_select_triton: {N - 1} draft nodes of {M} candidates: give 1 .. M nodes "
                         f"and at most {MAX_CANDIDATES} candidates")
    device = scores.device
    MP, NP = triton.next_power_of_2(M), triton.next_power_of_2(N)
    keys = torch.empty(B, MP, dtype=torch.long, device=device)
    node_of = torch.empty(B, MP, dtype=torch.int32, device=device)
    out_t = torch.empty(B, N, dtype=tokens.dtype, device=device)
    out_p = torch.empty(B, N, dtype=torch.long, device=device)
    out_d = torch.empty(B, N, dtype=torch.long, device=device)
    out_a = torch.empty(B, N, max_depth + 1, dtype=torch.long, device=device)
    out_pos = torch.empty(B, N, dtype=torch.long, device=device)
    if B:
        _tree_select_kernel[(B,)](scores, tokens, parents, root, base, keys, node_of, out_t, out_p, out_d, out_a,
                                  out_pos, scores.stride(0), tokens.stride(0), parents.stride(0), root.stride(0),
                                  base.stride(0), M, N,
                                  MP=MP, NP=NP, L=max_depth, JB=min(MP, RANK_BLOCK), num_warps=8 if MP >= 128 else 4,
                                  **pdl_launch(scores))
    return out_t, out_p, out_d, out_a, out_pos


def tree_select(scores, tokens, parents, root, base, total_tokens: int, max_depth: int):
    """Triton on CUDA for rows of unit stride and at most MAX_CANDIDATES candidates; the
    reference otherwise."""
    ok = (use_triton(scores, tokens, parents, root, base) and scores.stride(1) == 1 and tokens.stride(1) == 1
          and parents.stride(1) == 1 and scores.shape[1] <= MAX_CANDIDATES)
    return (tree_select_triton if ok else tree_select_torch)(scores, tokens, parents, root, base, total_tokens,
                                                              max_depth)
