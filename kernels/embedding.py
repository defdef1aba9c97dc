"""Token embeddings: the rows of a table at the given ids, in one launch.

embedding(ids [...], weight [V, H]) -> [..., H] = weight[ids], and a row of zeros for a
negative id: padding, as the -1 past a step's accepted tokens, which the head's catch-up
reads at fixed width (so its callers need no clamp, a kernel a step). An id of V or more
is a bug: the reference raises, the Triton kernel gives zeros rather than read outside
the table (checking on the host would need a sync).
Why: torch's index_select kernel for a few rows takes 1.6-5 us on an H200, and a tree step
looks up embeddings five times (the head's three drafting rounds, its catch-up, the
target's pass), a chain step four; this kernel takes part in programmatic dependent launch
with the kernels around it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._triton import MAX_ROW, gdc_launch_dependents, gdc_wait, pdl_launch, triton, tl, use_triton


def embedding_torch(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    padding = (ids < 0).unsqueeze(-1)
    return F.embedding(ids.clamp(min=0), weight).masked_fill(padding, 0)


@triton.jit
def _embedding_kernel(IDS, W, OUT, V, H, s_ids, s_w, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # kernels/_triton.py: the ids are the kernel before's output
        gdc_wait()
        gdc_launch_dependents()
    i = tl.program_id(0).to(tl.int64)
    token = tl.load(IDS + i * s_ids).to(tl.int64)
    h = tl.arange(0, BLOCK)
    # A vector comparison for the mask (kernels/kv_cache.py says why): no columns for a bad id.
    width = tl.where((token >= 0) & (token < V), H, 0)
    row = tl.load(W + token * s_w + h, mask=h < width, other=0.0)
    tl.store(OUT + i * H + h, row, mask=h < H)


def embedding_triton(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    V, H = weight.shape
    if H > MAX_ROW:
        raise ValueError(f"embedding_triton: rows of {H} values, at most {MAX_ROW}")
    flat = ids.reshape(-1)
    out = torch.empty(flat.shape[0], H, dtype=weight.dtype, device=weight.device)
    if flat.shape[0]:
        _embedding_kernel[(flat.shape[0],)](flat, weight, out, V, H, flat.stride(0), weight.stride(0),
                                            BLOCK=triton.next_power_of_2(H), **pdl_launch(weight))
    return out.view(*ids.shape, H)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Triton on CUDA for a table of unit stride along its rows (outside autograd);
    torch's F.embedding otherwise, negative ids masked (module doc)."""
    if use_triton(ids, weight) and weight.dim() == 2 and weight.stride(1) == 1 and weight.shape[1] <= MAX_ROW:
        return embedding_triton(ids, weight)
    return embedding_torch(ids, weight)
