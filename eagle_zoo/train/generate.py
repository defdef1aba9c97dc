"""A plain batched generation loop over an eagle_zoo target model, for training data.

The engine (eagle_zoo.engine) prefills one request at a time and decodes with
continuous batching, which is right for serving; for regenerating thousands of
answers a fixed batch is simpler and faster: left-pad the prompts to one length,
prefill them together (in row chunks), then decode every row one token per step
until all rows have met an EOS. Rows share one cache column per step, so each row's
rope position is ``column - padding``; padded key columns are masked out.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch

from ..engine.cache import allocate_kv_caches
from ..models.attention import AttentionContext, use_context


def pick_tokens(logits: torch.Tensor, temperature: float, top_p: float, generator: Optional[torch.Generator]) -> torch.Tensor:
    """Greedy when temperature == 0, else a sample after temperature and top-p."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p > top_p  # keep the smallest head with mass >= top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    # Exponential race: argmax(p / E) with E ~ Exp(1) is a sample from p (no host sync).
    noise = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / noise).argmax(-1)


@torch.inference_mode()
def generate_batch(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_token_ids: Iterable[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: Optional[torch.Generator] = None,
    device: torch.device = torch.device("cpu"),
    dtype: torch.dtype = torch.float32,
    prefill_tokens: int = 32768,
) -> list[list[int]]:
    """Answers (token ids, ending with the EOS when one was produced) for ``prompts``."""
    B, P = len(prompts), max(len(p) for p in prompts)
    L = P + max_new_tokens
    pad = torch.tensor([P - len(p) for p in prompts])
    ids = torch.zeros(B, P, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.tensor(p)
    ids, pad = ids.to(device), pad.to(device)
    caches = allocate_kv_caches(model, B, L, dtype, device)
    cols = torch.arange(L, device=device)
    key_ok = cols.unsqueeze(0) >= pad.unsqueeze(1)  # [B, L]: not a padding column

    # Prefill in row chunks (bounded attention memory); the last column is every
    # row's real last prompt token.
    q = cols[:P]
    causal = q.view(1, P, 1) >= q.view(1, 1, P)
    diagonal = q.view(1, P, 1) == q.view(1, 1, P)  # padded queries see themselves: no empty rows
    logits = []
    step = max(1, prefill_tokens // P)
    for start in range(0, B, step):
        rows = torch.arange(start, min(B, start + step), device=device)
        mask = causal & (key_ok[rows, None, :P] | diagonal)
        ctx = AttentionContext(caches, rows, q.expand(len(rows), P), P, mask)
        with use_context(ctx):
            hidden, _ = model(ids[rows], (q.unsqueeze(0) - pad[rows].unsqueeze(1)).clamp(min=0))
        logits.append(model.compute_logits(hidden[:, -1]))
    token = pick_tokens(torch.cat(logits), temperature, top_p, generator)

    eos = torch.tensor(sorted(set(eos_token_ids)) or [-1], device=device)
    out = [token]
    done = torch.isin(token, eos)
    slots = torch.arange(B, device=device)
    for t in range(1, max_new_tokens):
        col = P + t - 1  # the cache column of the token fed now
        ctx = AttentionContext(caches, slots, torch.full((B, 1), col, device=device), col + 1,
                               key_ok[:, None, : col + 1])
        with use_context(ctx):
            hidden, _ = model(token.unsqueeze(1), (col - pad).unsqueeze(1))
        token = pick_tokens(model.compute_logits(hidden[:, 0]), temperature, top_p, generator)
        out.append(token)
        done |= torch.isin(token, eos)
        if t % 16 == 0 and bool(done.all()):  # one host sync every 16 steps
            break
    rows = torch.stack(out, 1).tolist()
    eos_set = set(eos.tolist())
    answers = []
    for row in rows:
        end = next((i for i, t in enumerate(row) if t in eos_set), len(row) - 1)
        answers.append(row[: end + 1])
    return answers
