"""Held-out prompts (`--val-share`): how the head does on prompts it never trains on.

Why: a run with --cache-features can go over its data many times (23 epochs in 930 s
on an H200), and the accuracy logged on the batches it trains on then overstates what
it does on new prompts (0.81 at the first position in training against ~0.75 on new
prompts of the same kind). A held-out share tells
when more passes stop helping and more data is what is missing.

Held out by prompt, not by sequence: the greedy and the sampled answer to one prompt
(two data directories) fall on the same side, so no held-out prompt is trained on. A
prompt's side is a hash of its tokens and the seed, so it does not depend on the order
or the number of data directories.
"""
from __future__ import annotations

import hashlib

import torch

from .data import TokenData


def prompt_key(ids: torch.Tensor, mask: torch.Tensor) -> bytes:
    """The tokens before the first loss token (the prompt, chat template included)."""
    first = int(mask.nonzero()[0]) if bool(mask.any()) else len(ids)
    return ids[:first].long().numpy().tobytes()


def held_out(key: bytes, share: float, seed: int) -> bool:
    digest = hashlib.blake2b(key, digest_size=8, salt=seed.to_bytes(8, "little", signed=True)).digest()
    return int.from_bytes(digest, "little") / 2**64 < share


def split_by_prompt(data: TokenData, index: torch.Tensor, share: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held out): the positions of ``index`` whose prompt is trained on, and the
    others (about ``share`` of the prompts)."""
    if not 0 <= share < 1:
        raise ValueError(f"--val-share {share}: give a share of the prompts in [0, 1), e.g. 0.01")
    out = [held_out(prompt_key(*data.sequence(int(i))), share, seed) for i in index.tolist()]
    flags = torch.tensor(out, dtype=torch.bool)
    return index[~flags], index[flags]
