"""Speculative-decoding counters with vLLM's meaning, under the ``eagle_zoo:`` prefix.

One *draft* is one verification step of one request that carried >= 1 draft token.
Mean acceptance length = 1 + accepted / drafts (tokens emitted per target step);
acceptance rate at position i = accepted_per_pos[i] / drafts (a draft's token i
counts as accepted only if tokens 0..i-1 were accepted too).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

PREFIX = "eagle_zoo:"


@dataclass(frozen=True)
class Metric:
    name: str
    value: int | float
    labels: dict[str, str] = field(default_factory=dict)
    kind: str = "counter"


def _ints(name: str, values) -> list[int]:
    if hasattr(values, "tolist"):  # tensors / arrays: one host copy here, at the end of a step
        values = values.tolist()
    out = [int(v) for v in values]
    if any(v < 0 for v in out):
        raise ValueError(f"SpecDecodingMetrics.observe: {name} must be >= 0, got {out}")
    return out


@dataclass
class SpecDecodingMetrics:
    num_speculative_tokens: int = 0  # initial length of the per-position list (grows as needed)
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_requests: int = 0            # finished requests
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0

    def __post_init__(self) -> None:
        missing = self.num_speculative_tokens - len(self.num_accepted_tokens_per_pos)
        self.num_accepted_tokens_per_pos += [0] * max(missing, 0)

    def observe(self, num_draft_tokens_per_request: Iterable[int],
                num_accepted_per_request: Iterable[int], num_positions: int | None = None) -> None:
        """Count one verification step; requests that proposed no draft are skipped.

        Per-position counts run over the drafted tokens of a chain; for a tree of n nodes,
        whose accepted path is at most ``num_positions`` levels deep, over its levels."""
        drafted = _ints("num_draft_tokens_per_request", num_draft_tokens_per_request)
        accepted = _ints("num_accepted_per_request", num_accepted_per_request)
        if len(drafted) != len(accepted):
            raise ValueError(f"SpecDecodingMetrics.observe: {len(drafted)} draft counts but "
                             f"{len(accepted)} accepted counts; pass one of each per request")
        for n, a in zip(drafted, accepted):
            if a > n:
                raise ValueError(f"SpecDecodingMetrics.observe: {a} tokens accepted out of "
                                 f"{n} drafted; accepted must be <= drafted")
            if n == 0:
                continue
            self.num_drafts += 1
            self.num_draft_tokens += n
            self.num_accepted_tokens += a
            per_pos = self.num_accepted_tokens_per_pos
            per_pos += [0] * ((n if num_positions is None else num_positions) - len(per_pos))
            for i in range(a):
                per_pos[i] += 1

    def observe_request(self, num_prompt_tokens: int, num_generation_tokens: int) -> None:
        """Count a finished request."""
        self.num_requests += 1
        self.num_prompt_tokens += num_prompt_tokens
        self.num_generation_tokens += num_generation_tokens

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else math.nan

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else math.nan

    @property
    def acceptance_rate_per_pos(self) -> list[float]:
        d = self.num_drafts
        return [a / d if d else math.nan for a in self.num_accepted_tokens_per_pos]

    def as_dict(self) -> dict:
        counters = {PREFIX + m.name: getattr(self, m.attr) for m in _COUNTERS}
        return {**counters,
                PREFIX + "spec_decode_num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
                "mean_acceptance_length": self.mean_acceptance_length,
                "acceptance_rate": self.acceptance_rate,
                "acceptance_rate_per_pos": self.acceptance_rate_per_pos}

    def get_metrics(self) -> list[Metric]:
        """Counters as vLLM's LLM.get_metrics() lists them; per-position ones labelled."""
        out = [Metric(PREFIX + m.name, getattr(self, m.attr)) for m in _COUNTERS]
        out += [Metric(PREFIX + "spec_decode_num_accepted_tokens_per_pos", a, {"position": str(i)})
                for i, a in enumerate(self.num_accepted_tokens_per_pos)]
        return out

    def reset(self) -> None:
        self.__init__(self.num_speculative_tokens)


@dataclass(frozen=True)
class _Counter:
    name: str   # without the prefix
    attr: str


_COUNTERS = (
    _Counter("spec_decode_num_drafts", "num_drafts"),
    _Counter("spec_decode_num_draft_tokens", "num_draft_tokens"),
    _Counter("spec_decode_num_accepted_tokens", "num_accepted_tokens"),
    _Counter("num_requests", "num_requests"),
    _Counter("prompt_tokens", "num_prompt_tokens"),
    _Counter("generation_tokens", "num_generation_tokens"),
)
