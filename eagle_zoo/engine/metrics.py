"""Speculative-decoding and request counters with vLLM's meaning and vLLM's metric shapes.

One *draft* is one verification step of one request that carried >= 1 draft token.
Mean acceptance length = 1 + accepted / drafts (tokens emitted per target step);
acceptance rate at position i = accepted_per_pos[i] / drafts (a draft's token i
counts as accepted only if tokens 0..i-1 were accepted too).

``SpecDecodingMetrics.get_metrics()`` lists the counters as vLLM's ``LLM.get_metrics()``
does: ``Counter`` / ``Gauge`` / ``Histogram`` / ``Vector`` objects with vLLM's attribute
names (``name``, ``labels``, ``value`` / ``values`` / ``count``, ``sum``, ``buckets``),
under ``vllm:`` names by default (``vllm:spec_decode_num_drafts``,
``vllm:spec_decode_num_accepted_tokens_per_pos`` as a ``Vector`` with one value per
position, ...). The server's /metrics offers the same counters under ``eagle_zoo:`` and
``vllm:`` names (serve/metrics.py).
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

PREFIX = "eagle_zoo:"
VLLM_PREFIX = "vllm:"


@dataclass
class Metric:
    """One metric as vLLM's metrics reader returns it: a name and its labels."""
    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    """A monotonically increasing count."""
    value: int


@dataclass
class Gauge(Metric):
    """A value that can go up and down."""
    value: float


@dataclass
class Vector(Metric):
    """A list of counts, one per position (per-position acceptance)."""
    values: list[int]


@dataclass
class Histogram(Metric):
    """Observations in buckets: ``buckets`` maps each bucket's upper limit (as a string,
    ``"+Inf"`` last) to the cumulative count of observations <= it."""
    count: int
    sum: float
    buckets: dict[str, int]


# Upper bounds of the per-request token-count histograms (vllm:request_prompt_tokens,
# vllm:request_generation_tokens).
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


@dataclass
class _TokenHistogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(TOKEN_BUCKETS) + 1))
    total: int = 0

    def observe(self, n: int) -> None:
        self.counts[bisect.bisect_left(TOKEN_BUCKETS, n)] += 1
        self.total += n

    def metric(self, name: str, labels: dict[str, str]) -> Histogram:
        buckets, running = {}, 0
        for bound, c in zip([*map(str, TOKEN_BUCKETS), "+Inf"], self.counts):
            running += c
            buckets[bound] = running
        return Histogram(name, dict(labels), count=running, sum=float(self.total), buckets=buckets)


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
    request_success: dict[str, int] = field(default_factory=dict)   # finished requests by finish reason
    request_prompt_tokens: _TokenHistogram = field(default_factory=_TokenHistogram)
    request_generation_tokens: _TokenHistogram = field(default_factory=_TokenHistogram)

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

    def observe_request(self, num_prompt_tokens: int, num_generation_tokens: int,
                        finish_reason: str | None = None) -> None:
        """Count a finished request."""
        self.num_requests += 1
        self.num_prompt_tokens += num_prompt_tokens
        self.num_generation_tokens += num_generation_tokens
        if finish_reason is not None:
            self.request_success[finish_reason] = self.request_success.get(finish_reason, 0) + 1
        self.request_prompt_tokens.observe(num_prompt_tokens)
        self.request_generation_tokens.observe(num_generation_tokens)

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

    def get_metrics(self, prefix: str = VLLM_PREFIX, labels: dict[str, str] | None = None) -> list[Metric]:
        """The counters as vLLM's ``LLM.get_metrics()`` lists them, each name ``prefix`` +
        vLLM's name, each with ``labels``: Counters ``spec_decode_num_drafts``,
        ``spec_decode_num_draft_tokens``, ``spec_decode_num_accepted_tokens``,
        ``prompt_tokens``, ``generation_tokens``, ``request_success`` (one per finish reason,
        label ``finished_reason``); the Vector ``spec_decode_num_accepted_tokens_per_pos``
        (one value per draft position); Histograms ``request_prompt_tokens`` and
        ``request_generation_tokens``. Spec-decode entries only when drafting is configured
        or has happened, as in vLLM."""
        labels = dict(labels or {})
        out: list[Metric] = []
        if self.num_speculative_tokens or self.num_drafts:
            out += [Counter(prefix + m.name, dict(labels), getattr(self, m.attr)) for m in _SPEC_COUNTERS]
            out.append(Vector(prefix + "spec_decode_num_accepted_tokens_per_pos", dict(labels),
                              list(self.num_accepted_tokens_per_pos)))
        out += [Counter(prefix + "prompt_tokens", dict(labels), self.num_prompt_tokens),
                Counter(prefix + "generation_tokens", dict(labels), self.num_generation_tokens)]
        out += [Counter(prefix + "request_success", {**labels, "finished_reason": reason}, n)
                for reason, n in sorted(self.request_success.items())]
        out += [self.request_prompt_tokens.metric(prefix + "request_prompt_tokens", labels),
                self.request_generation_tokens.metric(prefix + "request_generation_tokens", labels)]
        return out

    def reset(self) -> None:
        self.__init__(self.num_speculative_tokens)


@dataclass(frozen=True)
class _Counter:
    name: str   # without the prefix
    attr: str


_SPEC_COUNTERS = (
    _Counter("spec_decode_num_drafts", "num_drafts"),
    _Counter("spec_decode_num_draft_tokens", "num_draft_tokens"),
    _Counter("spec_decode_num_accepted_tokens", "num_accepted_tokens"),
)
_COUNTERS = (
    *_SPEC_COUNTERS,
    _Counter("num_requests", "num_requests"),
    _Counter("prompt_tokens", "num_prompt_tokens"),
    _Counter("generation_tokens", "num_generation_tokens"),
)


class SpecDecodingLogger:
    """Periodic log lines of the speculative counters, as vLLM's server prints them: over
    the interval since the last line, the mean acceptance length, accepted and drafted
    tokens (and per second), the per-position acceptance rates and the draft acceptance
    rate. ``maybe_log(metrics)`` after a step writes a line once ``interval_s`` has passed
    and drafting happened since the last one."""

    def __init__(self, interval_s: float = 10.0, log_fn=None, clock=None):
        import logging
        import time

        self.interval_s = interval_s
        self.log_fn = log_fn or logging.getLogger("eagle_zoo.engine").info
        self.clock = clock or time.monotonic
        self._last_time = self.clock()
        self._last: tuple[int, int, int, list[int]] = (0, 0, 0, [])

    def maybe_log(self, m: SpecDecodingMetrics) -> bool:
        now = self.clock()
        if now - self._last_time < self.interval_s:
            return False
        if m.num_drafts < self._last[0]:  # the counters were reset
            self._last = (0, 0, 0, [])
        drafts, drafted, accepted = (m.num_drafts - self._last[0], m.num_draft_tokens - self._last[1],
                                     m.num_accepted_tokens - self._last[2])
        before = self._last[3] + [0] * (len(m.num_accepted_tokens_per_pos) - len(self._last[3]))
        per_pos = [a - b for a, b in zip(m.num_accepted_tokens_per_pos, before)]
        elapsed = now - self._last_time
        self._last_time = now
        self._last = (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens, list(m.num_accepted_tokens_per_pos))
        if drafts == 0:
            return False
        self.log_fn(format_spec_decoding_line(drafts, drafted, accepted, per_pos, elapsed))
        return True


def format_spec_decoding_line(drafts: int, drafted: int, accepted: int, per_pos: list[int], elapsed_s: float) -> str:
    rates = ", ".join(f"{a / drafts:.3f}" for a in per_pos)
    return (f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / drafts:.2f}, "
            f"Accepted throughput: {accepted / elapsed_s:.2f} tokens/s, "
            f"Drafted throughput: {drafted / elapsed_s:.2f} tokens/s, "
            f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, "
            f"Per-position acceptance rate: {rates}, "
            f"Avg Draft acceptance rate: {100 * accepted / drafted if drafted else 0:.1f}%")
