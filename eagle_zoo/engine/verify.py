"""One verification call for a batch: target logits + drafts -> emitted tokens.

Glue between the engine's sequences and the batched, sync-free sampler
(sampler.py) and rejection sampler (rejection_sampler.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..kernels.chain_accept import chain_accept_greedy
from ..kernels.top_k import argmax_rows
from .logits_processing import LogitsProcessing, process_logits
from .rejection_sampler import rejection_sample
from .sampler import SamplingTensors, apply_sampling_params
from .sequence import Sequence


@dataclass
class SamplingBatch:
    tensors: Optional[SamplingTensors]  # None when every request is greedy (nothing reads them)
    generators: list[Optional[torch.Generator]]
    all_greedy: bool  # known on the host from the requests' parameters
    # Penalties / min_tokens / bias / bad words of the batch (None: no request has any).
    processing: Optional[LogitsProcessing] = None

    @classmethod
    def from_sequences(cls, seqs: list[Sequence], device: torch.device, vocab_size: Optional[int] = None,
                       eos_token_ids=()) -> "SamplingBatch":
        """``vocab_size`` None: no logits processing (callers that refuse such requests)."""
        params = [s.params for s in seqs]
        all_greedy = all(p.greedy for p in params)
        tensors = None if all_greedy else SamplingTensors.from_params(params, device)
        processing = None
        if vocab_size is not None:
            processing = LogitsProcessing.build(seqs, vocab_size, eos_token_ids, device)
        return cls(tensors, [s.generator for s in seqs], all_greedy, processing)

    @property
    def plain_greedy(self) -> bool:
        """Every request greedy on the raw logits: what a captured greedy graph computes."""
        return self.all_greedy and self.processing is None


def verify_greedy(logits: torch.Tensor, drafts: torch.Tensor, num_draft: Optional[torch.Tensor]):
    """The greedy rule on raw logits (the same result as rejection_sample's greedy rows,
    without building probabilities or drawing noise): emit the target's argmax at
    each position; accept drafts up to the first mismatch."""
    return chain_accept_greedy(argmax_rows(logits), drafts, num_draft)  # three launches on CUDA


def verify_drafts(
    logits: torch.Tensor,
    drafts: Optional[torch.Tensor],
    num_draft: Optional[torch.Tensor],
    batch: SamplingBatch,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, K+1, V]; drafts [B, K] or None (plain decoding, K = 0).

    With logits processing, position j is processed as plain decoding would process it
    after drafts[:j] (logits_processing.py), then greedy rows take its argmax and random
    rows are verified against its sampling distribution.

    Returns (tokens [B, K+1]: accepted drafts, then the recovered or bonus token, then
    -1) and num_accepted [B]."""
    t = batch.tensors
    if drafts is None:
        drafts = torch.empty(logits.shape[0], 0, dtype=torch.long, device=logits.device)
    if batch.processing is not None:
        logits = process_logits(logits, batch.processing, drafts)
    if batch.all_greedy:
        return verify_greedy(logits, drafts, num_draft)
    probs = apply_sampling_params(logits, t.temperature, t.top_k, t.top_p, t.min_p)
    return rejection_sample(
        drafts, probs, t.temperature, None, num_draft_tokens=num_draft, generators=batch.generators
    )
