"""Per-request logits processing that depends on the tokens generated so far.

vLLM's names and order, applied to the raw logits before temperature / top-k / top-p /
min-p (sampler.py) and before the greedy argmax:

1. bad words: a word's last token gets -inf where the output so far ends with the
   word's other tokens (a one-token word is always banned);
2. min_tokens: EOS (unless ignore_eos) and stop_token_ids get -inf while fewer than
   min_tokens tokens are out;
3. logit bias: added;
4. allowed_token_ids: every other token gets -inf;
5. repetition penalty on tokens of the prompt or the output: positive logits divided by
   it, negative ones multiplied; frequency penalty times the token's count in the
   output subtracted; presence penalty subtracted once for every token in the output.

Speculative verification scores K+1 positions in one pass: position j continues the
sequence with drafts[:j] appended, so those drafts count as generated tokens there
(their counts, the min_tokens length, the bad words' context). ``process_logits`` does
this for the whole [B, K+1, V] block with tensor ops, no per-token loop: exactly the
distribution plain decoding computes at each position, which is what keeps
speculative decoding lossless for these parameters.

The history (output tokens, and the prompt where a repetition penalty reads it) is
copied to the device once per step in ``LogitsProcessing.build``; rows of requests
without processing are left bit-for-bit unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from .host_tensors import device_tensor

NEG_INF = float("-inf")
_NO_TOKEN = -2  # history padding: matches no bad word's token (words pad with -1)


def bad_words_token_ids(bad_words: Iterable[str], tokenizer) -> list[list[int]]:
    """The token sequences of ``bad_words`` (vLLM's rule): each word as it is written at
    the start of a text and with one leading space (how it looks after another word),
    the second kept when its tokens differ from the first's in their first token and
    have the same length."""
    out: list[list[int]] = []
    for word in bad_words:
        bare = list(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = list(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if bare:
            out.append(bare)
        if spaced and (not bare or (spaced[0] != bare[0] and len(spaced) == len(bare))):
            out.append(spaced)
    return out


@dataclass
class LogitsProcessing:
    """One batch's processing values on the device ([B] rows; neutral for rows without)."""

    active: torch.Tensor            # [B] bool: rows whose logits are processed
    out_counts: torch.Tensor        # [B, V] float: each token's count in the output so far
    num_out: torch.Tensor           # [B] long: output tokens so far
    seen: Optional[torch.Tensor]    # [B, V] bool: in the prompt or the output (repetition rows)
    penalties: Optional[torch.Tensor]  # [B, 3] float: presence, frequency, repetition
    min_tokens: Optional[torch.Tensor]  # [B] long
    min_tokens_ban: Optional[torch.Tensor]  # [B, V] bool: what min_tokens masks
    bias: Optional[torch.Tensor]    # [B, V] float
    disallowed: Optional[torch.Tensor]  # [B, V] bool: outside the row's allowed_token_ids
    words: Optional[torch.Tensor]   # [B, W, L] long: bad words right-aligned, -1 padded on the left
    tail: Optional[torch.Tensor]    # [B, L-1] long: the output's last L-1 tokens, -2 padded

    @classmethod
    def build(cls, seqs, vocab_size: int, eos_token_ids: Iterable[int],
              device: torch.device | str) -> Optional["LogitsProcessing"]:
        """The batch's values, or None when no request of it processes its logits.
        ``seqs``: engine Sequences (params, prompt_token_ids, output_token_ids and, for
        bad words, bad_words_ids)."""
        if not any(s.params.processes_logits for s in seqs):
            return None
        V = vocab_size
        params = [s.params for s in seqs]
        active = [p.processes_logits for p in params]
        # One history row per request: the prompt where a repetition penalty reads it,
        # then the output; a column's flag says which.
        use_prompt = [p.repetition_penalty != 1 for p in params]
        prompt_len = [len(s.prompt_token_ids) if (a and u) else 0 for s, a, u in zip(seqs, active, use_prompt)]
        rows = [(s.prompt_token_ids if (a and u) else []) + (s.output_token_ids if a else [])
                for s, a, u in zip(seqs, active, use_prompt)]
        width = max(1, max(len(r) for r in rows))
        hist = device_tensor([r + [-1] * (width - len(r)) for r in rows], device, torch.long)
        lengths = device_tensor([[pl, len(r)] for pl, r in zip(prompt_len, rows)], device, torch.long)
        col = torch.arange(width, device=hist.device)
        in_row = col < lengths[:, 1:2]
        is_out = in_row & (col >= lengths[:, 0:1])
        ids = hist.clamp(0, V - 1)
        out_counts = torch.zeros(len(seqs), V, device=hist.device).scatter_add_(1, ids, is_out.float())
        num_out = lengths[:, 1] - lengths[:, 0]
        seen = None
        if any(use_prompt):
            seen = torch.zeros(len(seqs), V, device=hist.device).scatter_add_(1, ids, in_row.float()) > 0
        penalties = None
        if any(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1 for p in params):
            penalties = device_tensor([[p.presence_penalty, p.frequency_penalty, p.repetition_penalty]
                                       for p in params], device, torch.float32)
        min_tokens = ban = None
        if any(p.min_tokens for p in params):
            eos = sorted(set(eos_token_ids))
            stops = [sorted({*p.stop_token_ids, *([] if p.ignore_eos else eos)}) if p.min_tokens else []
                     for p in params]
            ban = _mask_rows([[t for t in s if 0 <= t < V] for s in stops], V, device)
            min_tokens = device_tensor([p.min_tokens for p in params], device, torch.long)
        bias = None
        if any(p.logit_bias for p in params):
            items = [sorted((p.logit_bias or {}).items()) for p in params]
            n = max(len(i) for i in items)
            bias_ids = device_tensor([[t for t, _ in i] + [0] * (n - len(i)) for i in items], device, torch.long)
            values = device_tensor([[v for _, v in i] + [0.0] * (n - len(i)) for i in items], device,
                                   torch.float32)
            bias = torch.zeros(len(seqs), V, device=hist.device).scatter_add_(1, bias_ids, values)
        disallowed = None
        if any(p.allowed_token_ids is not None for p in params):
            allowed = _mask_rows([[t for t in (p.allowed_token_ids or []) if t < V] for p in params], V, device)
            limited = device_tensor([p.allowed_token_ids is not None for p in params], device, torch.bool)
            disallowed = ~allowed & limited.view(-1, 1)  # rows without the option allow every token
        words = tail = None
        word_lists = [getattr(s, "bad_words_ids", None) or [] for s in seqs]
        if any(word_lists):
            L = max(len(w) for ws in word_lists for w in ws)
            W = max(len(ws) for ws in word_lists)
            padded = [[[-1] * (L - len(w)) + list(w) for w in ws] + [[-1] * L] * (W - len(ws)) for ws in word_lists]
            words = device_tensor(padded, device, torch.long)
            tails = [list(s.output_token_ids[len(s.output_token_ids) - (L - 1):]) if L > 1 else [] for s in seqs]
            tail = device_tensor([[_NO_TOKEN] * (L - 1 - len(t)) + t for t in tails], device, torch.long)
            tail = tail.view(len(seqs), L - 1)
        return cls(device_tensor(active, device, torch.bool), out_counts, num_out, seen, penalties,
                   min_tokens, ban, bias, disallowed, words, tail)


def _mask_rows(rows: list[list[int]], vocab_size: int, device) -> torch.Tensor:
    """[B, V] bool with True at each row's token ids."""
    n = max(1, max(len(r) for r in rows))
    ids = device_tensor([r + [0] * (n - len(r)) for r in rows], device, torch.long)
    flags = device_tensor([[1.0] * len(r) + [0.0] * (n - len(r)) for r in rows], device, torch.float32)
    return torch.zeros(len(rows), vocab_size, device=ids.device).scatter_add_(1, ids, flags) > 0


def process_logits(logits: torch.Tensor, proc: LogitsProcessing, drafts: Optional[torch.Tensor] = None
                   ) -> torch.Tensor:
    """logits [B, T, V] (position j: after drafts[:, :j]) -> processed fp32 logits.
    drafts [B, T-1] or None (T = 1); ids outside [0, V) (-1 padding) count as nothing."""
    x = logits.float()
    B, T, V = x.shape
    dev = x.device
    if drafts is None or T == 1:
        drafts = torch.empty(B, 0, dtype=torch.long, device=dev)
    drafts = drafts[:, : T - 1].long()
    valid = (drafts >= 0) & (drafts < V)
    # extra[b, j, v]: how often v is among drafts[b, :j], the tokens position j adds.
    step = torch.zeros(B, T, V, device=dev)
    if T > 1:
        step[:, 1:].scatter_add_(2, drafts.clamp(0, V - 1).unsqueeze(-1), valid.float().unsqueeze(-1))
    extra = step.cumsum(1)
    counts = proc.out_counts.unsqueeze(1) + extra  # [B, T, V]
    pos = torch.arange(T, device=dev)
    y = x
    if proc.words is not None:
        y = y.masked_fill(_bad_word_bans(proc.words, proc.tail, drafts, T, V), NEG_INF)
    if proc.min_tokens is not None:
        short = (proc.num_out.view(B, 1) + pos) < proc.min_tokens.view(B, 1)  # [B, T]
        y = y.masked_fill(short.unsqueeze(-1) & proc.min_tokens_ban.unsqueeze(1), NEG_INF)
    if proc.bias is not None:
        y = y + proc.bias.unsqueeze(1)
    if proc.disallowed is not None:
        y = y.masked_fill(proc.disallowed.unsqueeze(1), NEG_INF)
    if proc.penalties is not None:
        presence, frequency, repetition = (proc.penalties[:, i].view(B, 1, 1) for i in range(3))
        if proc.seen is not None:
            seen = proc.seen.unsqueeze(1) | (extra > 0)
            y = torch.where(seen, torch.where(y > 0, y / repetition, y * repetition), y)
        y = y - frequency * counts - presence * (counts > 0).float()
    return torch.where(proc.active.view(B, 1, 1), y, x)


def _bad_word_bans(words: torch.Tensor, tail: torch.Tensor, drafts: torch.Tensor, T: int, V: int) -> torch.Tensor:
    """[B, T, V] bool: the tokens a bad word bans at each position. The context before
    position j is the output's tail followed by drafts[:, :j]."""
    B, W, L = words.shape
    last = words[:, :, -1]  # [B, W]
    if L > 1:
        context = torch.cat([tail, drafts], dim=1)  # [B, L-1 + T-1]
        windows = context.unfold(1, L - 1, 1)  # [B, T, L-1]: the L-1 tokens before each position
        prefix = words[:, :, :-1]  # [B, W, L-1]
        same = (prefix.unsqueeze(1) == -1) | (prefix.unsqueeze(1) == windows.unsqueeze(2))  # [B, T, W, L-1]
        match = same.all(-1)
    else:
        match = torch.ones(B, T, W, dtype=torch.bool, device=words.device)
    match &= (last >= 0).unsqueeze(1)
    hits = torch.zeros(B, T, V, device=words.device)
    hits.scatter_add_(2, last.clamp(0, V - 1).unsqueeze(1).expand(B, T, W).contiguous(), match.float())
    return hits > 0
