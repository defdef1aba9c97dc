"""Speculative-decoding rejection sampler (Leviathan et al. 2023; vLLM's semantics).

rejection_sample(draft_token_ids [B,K] int64, target_probs [B,K+1,V] float32,
                 draft_probs [B,K,V] float32 or None, num_draft [B] int, is_greedy [B] bool,
                 uniform [B,K] or [B,K+1] float32 in [0,1), exponential [B,V] or [B,K+1,V])
-> (output_token_ids [B,K+1] int64, -1 after the last emitted token;
    num_accepted [B] int64, drafts accepted; the row emits num_accepted + 1 tokens)

Row b has num_draft[b] <= K valid drafts (later columns are ignored, may be -1).
Greedy rows: position i emits argmax p_i; stop after the first draft != argmax; when all
  num_draft are accepted, add the bonus argmax p_{num_draft}.
Random rows: accept draft x at i iff u_i <= p_i(x) / q_i(x) (q = 1 without draft probs);
  at the first rejection emit a token from max(p_i - q_i, 0) (without draft probs: p_i
  with x zeroed) and stop; if all num_draft are accepted emit the bonus from p_{num_draft}.
Sampling from an unnormalised r uses the caller's Exponential(1) noise E: argmax(r / E)
  is distributed as r / sum(r) (the exponential race, i.e. Gumbel-max), so no cumsum, no
  normalisation and no host sync. A row samples exactly one token per call (recovered or
  bonus, at a position fixed by u alone), so one [B,V] noise vector per row suffices;
  [B,K+1,V] is accepted too. Ties go to the lowest token id (torch.argmax's rule).
The caller draws uniform and exponential from per-request seeded generators, so the
result is reproducible; Triton and torch give the same tokens bit for bit (same IEEE
divisions, same tie rule).
"""
from __future__ import annotations

from typing import Optional

import torch

from ._triton import tl, triton, use_triton


def _prepare(draft_token_ids, target_probs, draft_probs, uniform, exponential):
    B, K = draft_token_ids.shape
    V = target_probs.shape[-1]
    if K < 1 or target_probs.shape != (B, K + 1, V):
        raise ValueError(f"rejection_sample: target_probs must be [B={B}, K+1={K + 1}, V] with K >= 1, "
                         f"got {tuple(target_probs.shape)}")
    if draft_probs is not None and draft_probs.shape != (B, K, V):
        raise ValueError(f"rejection_sample: draft_probs must be [B, K, V] = {(B, K, V)}, got {tuple(draft_probs.shape)}")
    if uniform.shape not in ((B, K), (B, K + 1)):
        raise ValueError(f"rejection_sample: uniform must be [B, K] or [B, K+1], got {tuple(uniform.shape)}")
    if exponential.dim() == 2:  # one noise vector per row, shared by its positions
        exponential = exponential.unsqueeze(1).expand(B, K + 1, V)
    if exponential.shape != (B, K + 1, V):
        raise ValueError(f"rejection_sample: exponential must be [B, V] or [B, K+1, V], got {tuple(exponential.shape)}")
    return B, K, V, exponential


def rejection_sample_torch(draft_token_ids, target_probs, draft_probs, num_draft, is_greedy, uniform, exponential):
    """Reference: vectorised over B and K, no host sync."""
    B, K, V, noise = _prepare(draft_token_ids, target_probs, draft_probs, uniform, exponential)
    rows = torch.arange(B, device=target_probs.device)
    cols = torch.arange(K + 1, device=target_probs.device)
    x = draft_token_ids.clamp(0, V - 1)  # invalid columns (e.g. -1) must still index safely
    p_x = target_probs[:, :K].gather(-1, x.unsqueeze(-1)).squeeze(-1)
    q_x = draft_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1) if draft_probs is not None else torch.ones_like(p_x)
    argmax = target_probs.argmax(-1)  # [B,K+1]
    accept = torch.where(is_greedy.unsqueeze(1), draft_token_ids == argmax[:, :K], uniform[:, :K] <= p_x / q_x)
    accept &= cols[:K] < num_draft.unsqueeze(1)
    num_accepted = accept.long().cumprod(1).sum(1)  # drafts before the first rejection

    # The one sampled token of each row sits at i = num_accepted: recovered if i < num_draft, else bonus.
    i = num_accepted
    rejected = i < num_draft
    p = target_probs[rows, i]
    ik = i.clamp(max=K - 1)
    if draft_probs is not None:
        r = (p - draft_probs[rows, ik]).clamp(min=0)
    else:
        r = p.scatter(-1, x[rows, ik].unsqueeze(-1), 0.0)
    r = torch.where(rejected.unsqueeze(1), r, p)
    sampled = (r / noise[rows, i]).argmax(-1)
    last = torch.where(is_greedy, argmax[rows, i], sampled)

    drafts = torch.cat([draft_token_ids, draft_token_ids.new_full((B, 1), -1)], dim=1)
    out = torch.where(cols < i.unsqueeze(1), drafts, -1)
    out = torch.where(cols == i.unsqueeze(1), last.unsqueeze(1), out)
    return out, num_accepted


# --- Triton: two small kernels --------------------------------------------------------
# 1. grid (B, K+1, chunks of V): the best (value, index) of one chunk for position i's
#    candidate, the token emitted if the row stops at i: greedy argmax p_i, or the
#    recovered (i < num_draft) / bonus (i == num_draft) sample. Every position and chunk
#    in parallel, so B=1 still fills the GPU.
# 2. grid (B,): per position, the chunk maxima reduced (argmax, lowest chunk on ties, so
#    the lowest token id overall, as torch.argmax), then the sequential accept test.

@triton.jit
def _candidate_kernel(DRAFT, TP, DP, GREEDY, ND, EXP, CVAL, CIDX, K, V, n_chunks,
                      sdb, sdk, stb, stk, stv, sqb, sqk, sqv, sgb, snb, seb, sek, sev,
                      HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)  # b * stride can pass 2**31 for large B*K*V
    i = tl.program_id(1)
    c = tl.program_id(2)
    nd = tl.load(ND + b * snb)
    rand = tl.load(GREEDY + b * sgb) == 0
    recover = rand & (i < nd)
    x = tl.load(DRAFT + b * sdb + tl.minimum(i, K - 1) * sdk)
    offs = c * BLOCK_V + tl.arange(0, BLOCK_V)
    # Positions after num_draft are never emitted: read nothing. Load masks come from
    # vector comparisons (offs < limit) because triton 3.9's interpreter mis-types a
    # scalar comparison broadcast into a mask.
    p_lim = tl.where(i <= nd, V, 0)
    q_lim = tl.where(recover, p_lim, 0)
    e_lim = tl.where(rand, p_lim, 0)
    p = tl.load(TP + b * stb + i * stk + offs * stv, mask=offs < p_lim, other=0.0).to(tl.float32)
    if HAS_Q:
        q = tl.load(DP + b * sqb + i * sqk + offs * sqv, mask=offs < q_lim, other=0.0).to(tl.float32)
        r = tl.where(recover, tl.maximum(p - q, 0.0), p)
    else:
        r = tl.where(recover & (offs == x), 0.0, p)
    e = tl.load(EXP + b * seb + i * sek + offs * sev, mask=offs < e_lim, other=1.0).to(tl.float32)
    val = tl.where(rand, tl.math.div_rn(r, e), r)  # IEEE division, as torch
    val = tl.where(offs < V, val, float("-inf"))
    slot = (b * (K + 1) + i) * n_chunks + c
    tl.store(CVAL + slot, tl.max(val, 0))
    tl.store(CIDX + slot, c * BLOCK_V + tl.argmax(val, 0, tie_break_left=True).to(tl.int64))


@triton.jit
def _accept_kernel(DRAFT, TP, DP, GREEDY, ND, U, CVAL, CIDX, OUT, NACC, K, V, n_chunks,
                   sdb, sdk, stb, stk, stv, sqb, sqk, sqv, sgb, snb, sub, suk,
                   HAS_Q: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    nd = tl.load(ND + b * snb)
    greedy = tl.load(GREEDY + b * sgb) != 0
    chunks = tl.arange(0, BLOCK_C)
    alive = nd >= 0  # all drafts so far accepted
    n_acc = tl.zeros([], tl.int64)
    for i in range(0, K + 1):
        base = (b * (K + 1) + i) * n_chunks
        best = tl.argmax(tl.load(CVAL + base + chunks, mask=chunks < n_chunks, other=float("-inf")), 0,
                         tie_break_left=True)
        cand = tl.load(CIDX + base + best)
        valid = alive & (i < nd)
        x = tl.load(DRAFT + b * sdb + tl.minimum(i, K - 1) * sdk).to(tl.int64)
        xs = tl.minimum(tl.maximum(x, 0), V - 1)
        p = tl.load(TP + b * stb + i * stk + xs * stv, mask=valid, other=0.0).to(tl.float32)
        if HAS_Q:
            q = tl.load(DP + b * sqb + i * sqk + xs * sqv, mask=valid, other=1.0).to(tl.float32)
        else:
            q = tl.full([], 1.0, tl.float32)
        u = tl.load(U + b * sub + tl.minimum(i, K - 1) * suk, mask=valid, other=2.0)
        ok = tl.where(greedy, x == cand, u <= tl.math.div_rn(p, q))
        acc = valid & ok
        # rejected here (valid, not ok) -> the candidate; i == nd with all accepted -> the bonus
        tok = tl.where(acc, x, tl.where(alive & (i <= nd), cand, -1))
        tl.store(OUT + b * (K + 1) + i, tok)
        n_acc += acc.to(tl.int64)
        alive = acc
    tl.store(NACC + b, n_acc)


def rejection_sample_triton(draft_token_ids, target_probs, draft_probs, num_draft, is_greedy, uniform, exponential,
                            *, block_v: int = 2048):
    """Triton version; block_v (a power of two) is the V chunk of one program (tests use small ones)."""
    B, K, V, noise = _prepare(draft_token_ids, target_probs, draft_probs, uniform, exponential)
    dev = target_probs.device
    out = torch.empty(B, K + 1, device=dev, dtype=torch.int64)
    num_accepted = torch.empty(B, device=dev, dtype=torch.int64)
    if B == 0:
        return out, num_accepted
    block_v = min(block_v, triton.next_power_of_2(V))
    n_chunks = triton.cdiv(V, block_v)
    cval = torch.empty(B, K + 1, n_chunks, device=dev, dtype=torch.float32)
    cidx = torch.empty(B, K + 1, n_chunks, device=dev, dtype=torch.int64)
    greedy = is_greedy.view(torch.uint8)
    dp = draft_probs if draft_probs is not None else target_probs  # dummy pointer when unused
    dps = draft_probs.stride() if draft_probs is not None else (0, 0, 0)
    common = (*draft_token_ids.stride(), *target_probs.stride(), *dps, greedy.stride(0), num_draft.stride(0))
    _candidate_kernel[(B, K + 1, n_chunks)](
        draft_token_ids, target_probs, dp, greedy, num_draft, noise, cval, cidx, K, V, n_chunks, *common,
        *noise.stride(), HAS_Q=draft_probs is not None, BLOCK_V=block_v, num_warps=4,
    )
    _accept_kernel[(B,)](
        draft_token_ids, target_probs, dp, greedy, num_draft, uniform, cval, cidx, out, num_accepted, K, V, n_chunks,
        *common, *uniform.stride(), HAS_Q=draft_probs is not None,
        BLOCK_C=max(16, triton.next_power_of_2(n_chunks)), num_warps=1,
    )
    return out, num_accepted


def rejection_sample(draft_token_ids: torch.Tensor, target_probs: torch.Tensor, draft_probs: Optional[torch.Tensor],
                     num_draft: torch.Tensor, is_greedy: torch.Tensor, uniform: torch.Tensor,
                     exponential: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify drafts against the target (module doc). Triton on CUDA."""
    if use_triton(target_probs):
        return rejection_sample_triton(draft_token_ids, target_probs, draft_probs, num_draft, is_greedy,
                                       uniform, exponential)
    return rejection_sample_torch(draft_token_ids, target_probs, draft_probs, num_draft, is_greedy,
                                  uniform, exponential)
