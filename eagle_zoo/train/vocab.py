"""EAGLE-3 draft vocabulary: the most frequent target tokens of the training data.

target_id = draft_id + d2t[draft_id]; t2d[target_id] is True iff the token is drafted
(docs/formats.md). The draft ids are the chosen target ids sorted ascending, so d2t is
non-decreasing and every offset is >= 0.
"""
from __future__ import annotations

import torch


def token_counts(tokens: torch.Tensor, mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each target token is a training target (assistant tokens only)."""
    ids = tokens[mask.bool()].long()
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"the training data holds token ids outside the target vocabulary [0, {vocab_size})")
    return torch.bincount(ids, minlength=vocab_size)


def select_draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """The ``draft_vocab_size`` most frequent ids, ascending. Ties go to the lower id
    (a stable sort), so the choice is deterministic; ids never seen fill the rest
    (lowest ids first) when the data has fewer distinct tokens."""
    vocab_size = counts.numel()
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(
            f"draft_vocab_size must be in [1, {vocab_size}] (the target vocabulary), got {draft_vocab_size}: "
            f"pass --draft-vocab-size"
        )
    order = torch.sort(counts, descending=True, stable=True).indices
    return order[:draft_vocab_size].sort().values


def vocab_maps(draft_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t int64 [draft_V], t2d bool [V]) for ascending target ids ``draft_ids``."""
    draft_ids = draft_ids.long()
    if draft_ids.numel() > 1 and not bool((draft_ids[1:] > draft_ids[:-1]).all()):
        raise ValueError("draft vocabulary ids must be strictly ascending")
    d2t = draft_ids - torch.arange(draft_ids.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return d2t, t2d


def coverage(counts: torch.Tensor, draft_ids: torch.Tensor) -> float:
    """Share of training targets that the draft vocabulary can produce."""
    total = int(counts.sum())
    return float(counts[draft_ids].sum()) / total if total else 0.0
