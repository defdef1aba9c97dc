"""Batched sampling without host syncs: logits -> probabilities -> token ids.

Everything takes per-request values as tensors ([B]) so one batch can mix greedy,
temperature, top-k, top-p and min-p requests. Sampling is an exponential race,
``argmax(p / E)`` with ``E ~ Exp(1)`` i.i.d., which picks token i with probability
p_i / sum(p) (the minimum of independent Exp(p_i) clocks) and needs no
``multinomial`` (a host sync on CUDA) and no normalisation.

Randomness comes in as tensors. ``draw`` builds them, taking the rows of seeded
requests from that request's own ``torch.Generator`` so a seeded request sees the
same numbers whatever else is in the batch. Its loop over seeded requests launches
one fill per request but reads nothing back from the device.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .host_tensors import device_tensor
from .sampling_params import GREEDY_EPS, SamplingParams


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator | None:
    """The per-request generator for a seeded request (None: use the global RNG)."""
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


def draw(kind: str, shape: Sequence[int], generators: Sequence[torch.Generator | None] | None = None,
         device: torch.device | str = "cpu") -> torch.Tensor:
    """Uniform [0, 1) or Exp(1) noise of ``shape``; row b from ``generators[b]`` when set."""
    if kind not in ("uniform", "exponential"):
        raise ValueError(f"draw(kind={kind!r}): kind must be 'uniform' or 'exponential'")
    out = torch.empty(tuple(shape), device=device, dtype=torch.float32)
    fill = "uniform_" if kind == "uniform" else "exponential_"
    getattr(out, fill)()
    for b, gen in enumerate(generators or ()):
        if gen is not None:
            getattr(out[b], fill)(generator=gen)
    return out


@dataclass
class SamplingTensors:
    """Per-request sampling values for one batch. Fields that no request uses are None
    so the (sorting) filter is skipped; this is decided on the host, from Python values."""

    temperature: torch.Tensor          # [B] float, 0 = greedy
    top_k: torch.Tensor | None = None  # [B] int, 0 = off
    top_p: torch.Tensor | None = None  # [B] float, 1 = off
    min_p: torch.Tensor | None = None  # [B] float, 0 = off

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], device: torch.device | str = "cpu") -> "SamplingTensors":
        def col(name, dtype, off):
            values = [getattr(sp, name) for sp in params]
            if off is not None and all(v == off for v in values):
                return None
            try:
                return device_tensor(values, device, dtype)
            except (OverflowError, RuntimeError, TypeError, ValueError) as exc:
                raise ValueError(f"SamplingParams.{name} values {values} do not fit a {dtype} tensor ({exc}); "
                                 "SamplingParams checks the ranges when it is created: do not change a "
                                 "SamplingParams after creating it") from exc

        return cls(col("temperature", torch.float32, None), col("top_k", torch.long, 0),
                   col("top_p", torch.float32, 1.0), col("min_p", torch.float32, 0.0))


def _per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, 1, ..., 1] broadcasting against ``like`` ([B, ..., V])."""
    return values.to(like.device).view(-1, *([1] * (like.dim() - 1)))


def apply_sampling_params(logits: torch.Tensor, temperature: torch.Tensor,
                          top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None,
                          min_p: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [B, ..., V] -> fp32 probabilities, per-request values [B].

    Order (as vLLM): temperature, min-p, top-k, top-p (on what top-k kept). Top-k keeps
    ties with the k-th value. Greedy rows (temperature < GREEDY_EPS) become one-hot at
    the argmax of the raw logits, so sampling them, or verifying drafts against them,
    is exactly greedy decoding.
    """
    logits = logits.float()
    greedy = _per_row(temperature < GREEDY_EPS, logits)
    x = logits / torch.where(greedy, 1.0, _per_row(temperature.float(), logits))
    neg_inf = float("-inf")
    if min_p is not None:
        # p_i >= min_p * p_max  <=>  x_i >= x_max + log(min_p); log(0) = -inf keeps all.
        floor = x.amax(-1, keepdim=True) + _per_row(min_p.float(), x).log()
        x = x.masked_fill(x < floor, neg_inf)
    if top_k is not None or top_p is not None:
        x = _top_k_top_p(x, top_k, top_p)
    probs = x.softmax(-1)
    one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where(greedy, one_hot, probs)


def _top_k_top_p(x: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    neg_inf = float("-inf")
    vocab = x.shape[-1]
    sorted_x, order = x.sort(-1, descending=True)
    if top_k is not None:
        k = _per_row(top_k, x)
        k = torch.where((k <= 0) | (k > vocab), vocab, k).expand(*x.shape[:-1], 1)
        kth = sorted_x.gather(-1, k - 1)
        sorted_x = sorted_x.masked_fill(sorted_x < kth, neg_inf)
    if top_p is not None:
        p = sorted_x.softmax(-1)
        mass_before = p.cumsum(-1) - p  # the first token always stays (mass_before = 0)
        top_p = _per_row(top_p.float(), x)
        # top_p == 1 is "off": round-off in the cumsum must not cut the tail.
        sorted_x = sorted_x.masked_fill((mass_before >= top_p) & (top_p < 1), neg_inf)
    return torch.empty_like(x).scatter_(-1, order, sorted_x)


def sample_from_probs(probs: torch.Tensor, exponentials: torch.Tensor | None = None) -> torch.Tensor:
    """Token ids [B, ...] drawn from (possibly unnormalised) probs [B, ..., V]."""
    if exponentials is None:
        exponentials = torch.empty_like(probs, dtype=torch.float32).exponential_()
    # Exp(1) draws can be exactly 0; 0/0 = nan would win the argmax.
    tiny = torch.finfo(torch.float32).tiny
    return (probs.float() / exponentials.clamp_min(tiny)).argmax(-1)
