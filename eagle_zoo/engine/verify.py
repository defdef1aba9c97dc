"""One verification call for a batch: target logits + drafts -> emitted tokens.

Glue between the engine's sequences and the batched, sync-free sampler
(sampler.py) and rejection sampler (rejection_sampler.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .rejection_sampler import rejection_sample
from .sampler import SamplingTensors, apply_sampling_params
from .sequence import Sequence


@dataclass
class SamplingBatch:
    tensors: SamplingTensors
    generators: list[Optional[torch.Generator]]

    @classmethod
    def from_sequences(cls, seqs: list[Sequence], device: torch.device) -> "SamplingBatch":
        return cls(SamplingTensors.from_params([s.params for s in seqs], device), [s.generator for s in seqs])


def verify_drafts(
    logits: torch.Tensor,
    drafts: Optional[torch.Tensor],
    num_draft: Optional[torch.Tensor],
    batch: SamplingBatch,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, K+1, V]; drafts [B, K] or None (plain decoding, K = 0).

    Returns (tokens [B, K+1]: accepted drafts, then the recovered or bonus token, then
    -1) and num_accepted [B]."""
    t = batch.tensors
    probs = apply_sampling_params(logits, t.temperature, t.top_k, t.top_p, t.min_p)
    if drafts is None:
        drafts = torch.empty(logits.shape[0], 0, dtype=torch.long, device=logits.device)
    return rejection_sample(
        drafts, probs, t.temperature, None, num_draft_tokens=num_draft, generators=batch.generators
    )
