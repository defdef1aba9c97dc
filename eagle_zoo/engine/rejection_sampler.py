"""Verification of draft tokens against the target (Leviathan et al. 2023), batched.

Inputs are fixed-shape tensors and nothing is read back to the host: acceptance is
a cumulative product, the emitted row is built with ``where`` against position
indices, and sampling is an exponential race (see sampler.py).

Contract
- ``target_probs`` [B, K+1, V]: the target's **probabilities** after the request's
  temperature / min-p / top-k / top-p, i.e. ``apply_sampling_params(logits, ...)``.
  Position j is the distribution of the token after the prompt + drafts[:j]; the last
  one gives the bonus token. Probabilities (not logits) because the acceptance test
  and the recovery distribution are defined on p, and because the processed
  distribution is the one speculative decoding must reproduce.
- ``draft_probs`` [B, K, V] or None. None means each draft token was chosen
  deterministically (greedy draft head, n-gram), i.e. q is one-hot at the draft.
- ``temperature`` [B]: rows below GREEDY_EPS are verified greedily against the
  argmax of ``target_probs``.
- Fewer drafts for some requests: pad ``draft_token_ids`` with -1 and/or pass
  ``num_draft_tokens`` [B]; request b then verifies only its first n_b drafts and
  its bonus token comes from position n_b. A negative id ends the row's drafts (it is
  never accepted or emitted); an id >= V raises (``torch._assert_async``: no host
  sync; on the CPU a RuntimeError naming the vocabulary, on CUDA a device-side assert).
- Randomness: ``uniforms`` [B, K] (U[0,1)) and ``exponentials`` [B, K+1, V] (Exp(1)),
  or drawn here with ``sampler.draw`` from per-request ``generators`` (seeded
  requests: reproducible and independent of the batch), uniforms first.

Returns ``output_token_ids`` [B, K+1] (accepted drafts, then one recovered or bonus
token, then -1 padding) and ``num_accepted`` [B] (accepted drafts; emitted = +1).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .sampler import apply_sampling_params, draw, sample_from_probs  # noqa: F401  (re-exported)
from .sampling_params import GREEDY_EPS

PAD = -1


def _recovery_probs(target_probs: torch.Tensor, drafts: torch.Tensor,
                    draft_probs: torch.Tensor | None) -> torch.Tensor:
    """Unnormalised max(p - q, 0) at the K draft positions: what to sample after a rejection."""
    p = target_probs[:, : drafts.shape[1]]
    if draft_probs is None:  # q one-hot at x: p with x removed
        residual = p.scatter(-1, drafts.unsqueeze(-1), 0.0)
    else:
        residual = (p - draft_probs.float()).clamp_min(0.0)
    # Empty only when p <= q everywhere, i.e. p == q, where rejection has probability
    # 0; round-off can still get there, and then p itself is the right answer.
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)


def rejection_sample(
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    temperature: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    num_draft_tokens: torch.Tensor | None = None,
    uniforms: torch.Tensor | None = None,
    exponentials: torch.Tensor | None = None,
    generators: Sequence[torch.Generator | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, K = draft_token_ids.shape
    V = target_probs.shape[-1]
    _check_shape("target_probs", target_probs, (B, K + 1, V))
    _check_shape("temperature", temperature, (B,))
    if draft_probs is not None:
        _check_shape("draft_probs", draft_probs, (B, K, V))
    device = target_probs.device
    if uniforms is None:
        uniforms = draw("uniform", (B, K), generators, device)
    if exponentials is None:
        exponentials = draw("exponential", (B, K + 1, V), generators, device)
    _check_shape("uniforms", uniforms, (B, K))
    _check_shape("exponentials", exponentials, (B, K + 1, V))

    torch._assert_async((draft_token_ids < V).all(),
                        f"rejection_sample: a draft token id is outside the vocabulary [0, {V}) "
                        "(-1 pads; anything else must be a token of target_probs' last dimension)")
    pos = torch.arange(K + 1, device=device)
    n = torch.full((B, 1), K, device=device) if num_draft_tokens is None else num_draft_tokens.view(B, 1)
    has_draft = (pos[:K] < n) & (draft_token_ids >= 0)  # [B, K]
    drafts = draft_token_ids.clamp_min(0).long()
    p = target_probs.float()

    # Random rows: accept x with probability min(1, p(x) / q(x)). The strict u * q < p
    # avoids 0/0 and never accepts a draft with p(x) = 0, not even at u = 0 exactly.
    p_x = p[:, :K].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    q_x = 1.0 if draft_probs is None else draft_probs.float().gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    accept_random = uniforms * q_x < p_x
    # The token after the accepted prefix: recovered (residual) where a draft was
    # rejected, bonus (p itself) at position n_b where every draft was accepted.
    fallback = torch.where(has_draft.unsqueeze(-1), _recovery_probs(p, drafts, draft_probs), p[:, :K])
    sampled = sample_from_probs(torch.cat([fallback, p[:, K:]], 1), exponentials)

    # Greedy rows: the target's argmax decides, both for acceptance and the next token.
    target_argmax = p.argmax(-1)
    greedy = (temperature < GREEDY_EPS).to(device).unsqueeze(1)
    accept = torch.where(greedy, drafts == target_argmax[:, :K], accept_random) & has_draft
    next_token = torch.where(greedy, target_argmax, sampled)

    num_accepted = accept.long().cumprod(1).sum(1)  # length of the all-accepted prefix
    na = num_accepted.unsqueeze(1)
    padded_drafts = torch.nn.functional.pad(drafts, (0, 1), value=PAD)
    out = torch.where(pos < na, padded_drafts, torch.where(pos == na, next_token, PAD))
    return out, num_accepted


def _check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != expected:
        raise ValueError(f"rejection_sample: {name} has shape {tuple(t.shape)}, expected "
                         f"{expected} (B, K = draft_token_ids.shape, V = target_probs.shape[-1])")
