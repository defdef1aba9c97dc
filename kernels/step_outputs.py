"""A decode step's outputs, for the host and for the next step, in one launch.

step_outputs(tokens [B, T], accepted [B], drafted [B] or an int, base [B], slots [B],
scratch_slot, into=None) -> (out [B, T+2], next_last [B, 1], next_base [B]):
  out[b] = tokens[b], accepted[b], drafted[b]: the row the host reads back (T - 1 drafts'
          emitted tokens, -1 padded, then how many were accepted and drafted);
  next_last[b, 0] = tokens[b, accepted[b]]: the step's last emitted token, the next input;
  next_base[b] = base[b] + accepted[b] + 1: the sequence's cached length after the step,
          0 for a row of scratch_slot (a captured graph's padding row, which must stay
          inside its scratch cache row however many steps the graph feeds itself).
into = (last [B, 1], base [B]) writes next_last and next_base there, else into new
tensors. A captured whole step (eagle_zoo/engine/graphs.py, StepGraph) gives its own input
buffers, so each replay leaves the next one's inputs in place.
Why: torch takes five kernels for this (a fill, two adds, a gather, a cat), and a step graph
two copies more to feed itself; each costs ~2 us between a batch-1 step's graphs.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._triton import gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton

MAX_TOKENS = 1024  # T + 2 in one program's registers


def step_outputs_torch(tokens, accepted, drafted, base, slots, scratch_slot: int, into=None):
    drafted = drafted.to(accepted.dtype) if torch.is_tensor(drafted) else torch.full_like(accepted, drafted)
    out = torch.cat([tokens, accepted[:, None], drafted[:, None]], dim=1)
    next_last = tokens.gather(1, accepted.view(-1, 1))
    next_base = torch.where(slots == scratch_slot, 0, base + accepted + 1)
    if into is not None:
        into[0].copy_(next_last)
        into[1].copy_(next_base)
        next_last, next_base = into
    return out, next_last, next_base


@triton.jit(do_not_specialize=["T", "drafted", "scratch"])
def _step_outputs_kernel(TOK, ACC, DR, BASE, SLOT, OUT, LAST, NEXT, T, drafted, scratch, s_tok, s_base, s_last, s_next,
                         HAS_DRAFTED: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the step's tokens are the kernels before's output
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    tokens = tl.load(TOK + b * s_tok + j, mask=j < T, other=0).to(tl.int64)
    a = tl.load(ACC + b).to(tl.int64)
    if HAS_DRAFTED:
        d = tl.load(DR + b).to(tl.int64)
    else:
        d = drafted.to(tl.int64)
    base = tl.load(BASE + b * s_base).to(tl.int64)
    slot = tl.load(SLOT + b).to(tl.int64)
    row = tl.where(j < T, tokens, tl.where(j == T, a, d))
    tl.store(OUT + b * (T + 2) + j, row, mask=j < T + 2)
    tl.store(LAST + b * s_last, tl.sum(tl.where(j == a, tokens, 0), axis=0))
    tl.store(NEXT + b * s_next, tl.where(slot == scratch, 0, base + a + 1))


def step_outputs_triton(tokens, accepted, drafted, base, slots, scratch_slot: int, into=None):
    B, T = tokens.shape
    if T + 2 > MAX_TOKENS:
        raise ValueError(f"step_outputs_triton: {T} tokens a row, at most {MAX_TOKENS - 2}")
    out = torch.empty(B, T + 2, dtype=tokens.dtype, device=tokens.device)
    next_last, next_base = into if into is not None else (torch.empty(B, 1, dtype=tokens.dtype, device=tokens.device),
                                                          torch.empty(B, dtype=base.dtype, device=base.device))
    if B:
        has_drafted = torch.is_tensor(drafted)
        _step_outputs_kernel[(B,)](
            tokens, accepted, drafted if has_drafted else accepted, base, slots, out, next_last, next_base,
            T, 0 if has_drafted else int(drafted), int(scratch_slot), tokens.stride(0), base.stride(0),
            next_last.stride(0), next_base.stride(0),
            HAS_DRAFTED=has_drafted, BLOCK=triton.next_power_of_2(T + 2), **pdl_launch(tokens))
    return out, next_last, next_base


def step_outputs(tokens: torch.Tensor, accepted: torch.Tensor, drafted, base: torch.Tensor, slots: torch.Tensor,
                 scratch_slot: int, into: Optional[tuple] = None):
    """Triton on CUDA for rows of unit stride (accepted, drafted and slots contiguous);
    the reference otherwise (module doc)."""
    tensors = [tokens, accepted, base, slots] + ([drafted] if torch.is_tensor(drafted) else [])
    ok = (use_triton(*tensors) and tokens.stride(1) == 1 and tokens.shape[1] + 2 <= MAX_TOKENS
          and all(t.is_contiguous() for t in (accepted, slots) + ((drafted,) if torch.is_tensor(drafted) else ())))
    return (step_outputs_triton if ok else step_outputs_torch)(tokens, accepted, drafted, base, slots, scratch_slot,
                                                                 into)
