"""Logprobs of emitted and prompt tokens, in vLLM's output shape.

Values come from the raw model output, ``log_softmax(logits)`` before any sampling
parameter or logits processing, as vLLM v1 returns them by default
(``logprobs_mode="raw_logprobs"``). Each position gives the chosen token's logprob and
rank (as vLLM counts it: the number of tokens whose logprob is >= the chosen one's, so
1 = the most likely) and the top-N tokens (ranks 1..N). On the device: one fixed-shape block per step, ``pack``; on the host:
``unpack`` into ``{token_id: Logprob}`` dicts, the chosen token first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass
class Logprob:
    """vLLM's Logprob: one token's log probability, its rank in the vocabulary (1 =
    most likely) and its text."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


def pack(logits: torch.Tensor, tokens: torch.Tensor, num_top: int) -> torch.Tensor:
    """logits [B, T, V], chosen tokens [B, T] (negative: none) -> [B, T, 2 + 2 * num_top]
    float64: chosen logprob, its rank, then the top ids and their logprobs (float64 holds
    token ids and float32 values exactly, so one tensor carries them back)."""
    lp = logits.float().log_softmax(-1)
    chosen = lp.gather(-1, tokens.clamp_min(0).unsqueeze(-1))  # [B, T, 1]
    rank = (lp >= chosen).sum(-1, keepdim=True)
    parts = [chosen.double(), rank.double()]
    if num_top:
        top = lp.topk(min(num_top, lp.shape[-1]), dim=-1)
        parts += [top.indices.double(), top.values.double()]
    return torch.cat(parts, dim=-1)


def unpack(row: list[float], token: int, num_top: int, decode: Callable[[int], str]) -> dict[int, Logprob]:
    """One position of ``pack``'s block (as a host list) -> {token: Logprob}: the chosen
    token, then the top ``num_top`` (a chosen token among them appears once)."""
    out = {token: Logprob(row[0], int(row[1]), decode(token))}
    width = (len(row) - 2) // 2
    for i in range(min(num_top, width)):
        tid = int(row[2 + i])
        if tid not in out:
            out[tid] = Logprob(row[2 + width + i], i + 1, decode(tid))
    return out


def prompt_logprobs(logits: torch.Tensor, prompt: list[int], num_top: int,
                    decode: Callable[[int], str]) -> list[Optional[dict[int, Logprob]]]:
    """logits [P, V] of a prompt's positions (row i predicts token i + 1) -> vLLM's
    prompt_logprobs: None for the first token, then one dict per prompt token."""
    ids = torch.tensor(prompt[1:], device=logits.device)
    block = pack(logits[: len(prompt) - 1].unsqueeze(0), ids.unsqueeze(0), num_top)[0].tolist()
    return [None] + [unpack(row, t, num_top, decode) for row, t in zip(block, prompt[1:])]
