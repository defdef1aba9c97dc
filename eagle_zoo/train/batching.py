"""Token-budget batches: sequences of similar length padded together.

Each epoch has its own order, a pure function of (seed, epoch): sequences are
grouped by length (16-token buckets, random order inside a bucket) and cut into
batches whose padded size rows * longest stays within the token budget; then the
batches are shuffled. A resumed run rebuilds the same plan and skips what was done.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .data import TokenData


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] long, padded with 0
    loss_mask: torch.Tensor  # [B, T] bool: the token is an assistant token
    lengths: torch.Tensor  # [B]
    # [B] on the host: each row's loss tokens from index 2 on (the predictable ones), so
    # the losses size their gathers without reading the device (collate fills it)
    loss_counts: Optional[torch.Tensor] = None
    # the target's features of these tokens from a FeatureCache (else the losses run the
    # target): final hidden states [B, T, H] and, for EAGLE-3, aux states [B, T, 3H]
    hidden: Optional[torch.Tensor] = None
    aux: Optional[torch.Tensor] = None

    def to(self, device) -> "Batch":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Batch(self.input_ids.to(device), self.loss_mask.to(device), self.lengths.to(device), self.loss_counts,
                     move(self.hidden), move(self.aux))

    def rows(self, sl: slice) -> "Batch":
        cut = lambda t: None if t is None else t[sl]  # noqa: E731
        return Batch(self.input_ids[sl], self.loss_mask[sl], self.lengths[sl], cut(self.loss_counts), cut(self.hidden),
                     cut(self.aux))

    def num_loss_tokens(self) -> int:
        """Tokens at index >= 2 with a loss (a device read only when collate did not count them)."""
        counts = self.loss_counts if self.loss_counts is not None else self.loss_mask[:, 2:].sum(1)
        return int(counts.sum())


def usable(data: TokenData, max_len: int) -> torch.Tensor:
    """Indices of sequences that keep a loss token after truncation to ``max_len``
    (the first two tokens are never predicted: the head reads token i+1 to predict i+2)."""
    keep = []
    for i in range(len(data)):
        _, mask = data.sequence(i)
        if bool(mask[2:max_len].any()):
            keep.append(i)
    return torch.tensor(keep, dtype=torch.long)


def plan_epoch(lengths: torch.Tensor, token_budget: int, seed: int, epoch: int) -> list[torch.Tensor]:
    """Batches (tensors of positions into ``lengths``) for one epoch."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    n = lengths.numel()
    jitter = torch.randperm(n, generator=g)
    order = torch.argsort((lengths // 16) * n + jitter)
    batches, current, longest = [], [], 0
    for i in order.tolist():
        L = int(lengths[i])
        if current and (len(current) + 1) * max(longest, L) > token_budget:
            batches.append(torch.tensor(current))
            current, longest = [], 0
        current.append(i)
        longest = max(longest, L)
    if current:
        batches.append(torch.tensor(current))
    perm = torch.randperm(len(batches), generator=g)
    return [batches[i] for i in perm.tolist()]


def collate(data: TokenData, indices: list[int], max_len: int) -> Batch:
    seqs = [data.sequence(i) for i in indices]
    lengths = torch.tensor([min(len(ids), max_len) for ids, _ in seqs])
    T = int(lengths.max())
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for b, (s, m) in enumerate(seqs):
        n = int(lengths[b])
        ids[b, :n] = s[:n].long()
        mask[b, :n] = m[:n].bool()
    return Batch(ids, mask, lengths, mask[:, 2:].sum(1))
