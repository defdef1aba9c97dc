"""Adaptive speculation depth: the number of draft tokens K chosen per engine step
from the running batch size (speculative_config ``num_speculative_tokens_by_batch_size``).

Why: verification makes every request of a step cost K+1 target positions. At batch 1
the target pass is bound by reading the weights (or, for a small model on a GPU, by
kernel launches), so the extra positions are nearly free and accepted drafts are pure
gain; as the batch grows the pass becomes compute-bound and rejected positions cost
real time. Where that happens depends on the device, the target, the head and the
host, so "auto" measures it while it runs (MeasuredDepthSchedule).

A fixed schedule maps the smallest batch size a depth applies to onto that depth:
``{"1": 3, "4": 1, "8": 0}`` drafts 3 tokens for batches of 1-3 requests, 1 for 4-7,
and runs plain steps (K = 0) from 8 on (DepthSchedule). ``"auto"`` tries every depth
0..num_speculative_tokens for a few steps in each batch-size bucket and then runs the
one with the most tokens per second. Pure Python: no torch here.
"""
from __future__ import annotations

import bisect
import statistics
import time
from collections import Counter, defaultdict, deque
from typing import Any, Callable, Optional, Union

OPTION = "num_speculative_tokens_by_batch_size"
AUTO = "auto"


class DepthScheduleError(ValueError):
    pass


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def normalize(value: Any, num_speculative_tokens: Optional[int]) -> Union[None, str, dict[str, int]]:
    """The option as the user wrote it -> None, "auto" or {"<min batch>": K, ...} sorted
    by batch size. Raises DepthScheduleError naming the option and the fix."""
    if value is None or value == AUTO:
        return value
    example = '{"1": 3, "4": 1, "8": 0}'
    if value is True:
        raise DepthScheduleError(f"{OPTION}: write \"auto\" for the default schedule, or an object like {example}")
    if not isinstance(value, dict):
        raise DepthScheduleError(
            f"{OPTION} must be \"auto\" or an object mapping the smallest batch size to the number of "
            f"draft tokens, like {example}; got {value!r}"
        )
    out: dict[int, int] = {}
    for key, k in value.items():
        size = key if _is_int(key) else (int(key) if isinstance(key, str) and key.strip().isdigit() else None)
        if size is None or size < 1:
            raise DepthScheduleError(
                f"{OPTION}: key {key!r} is not a batch size; keys are batch sizes >= 1 written as strings "
                f"(JSON), like {example}"
            )
        if not _is_int(k) or k < 0:
            raise DepthScheduleError(
                f"{OPTION}[{key!r}] must be an integer >= 0 (0: a plain step without drafts), got {k!r}"
            )
        if size in out:
            raise DepthScheduleError(f"{OPTION}: batch size {size} appears twice ({key!r}); keep one")
        out[size] = k
    if 1 not in out:
        raise DepthScheduleError(
            f"{OPTION}: the schedule must start at batch size 1 (it says where each depth starts); "
            f"add \"1\": <draft tokens at batch 1>, e.g. {example}"
        )
    top = max(out.values())
    if top == 0:
        raise DepthScheduleError(
            f"{OPTION}: every depth is 0, so nothing would ever be drafted; remove speculative_config "
            f"or give some batch sizes a depth >= 1"
        )
    if num_speculative_tokens is not None and top > num_speculative_tokens:
        raise DepthScheduleError(
            f"{OPTION} asks for {top} draft tokens but num_speculative_tokens is {num_speculative_tokens}; "
            f"num_speculative_tokens is the largest depth: raise it to {top} or leave it out"
        )
    return {str(size): out[size] for size in sorted(out)}


class DepthSchedule:
    """A fixed schedule: K for a step's batch size. Depths are a few fixed values, so
    every step still has a fixed shape per (batch bucket, K) and CUDA graphs (keyed by
    batch bucket and tokens per sequence, K + 1) cover each of them."""

    def __init__(self, schedule: dict[int, int]):
        self.starts = sorted(schedule)
        self.depths = [schedule[s] for s in self.starts]
        self.max_depth = max(self.depths)
        self.steps_by_depth: Counter = Counter()  # decode steps run at each K (benchmarks)

    @classmethod
    def from_config(cls, value: Union[None, str, dict], num_speculative_tokens: int) -> Optional["DepthSchedule"]:
        if value is None:
            return None
        if value == AUTO:
            return MeasuredDepthSchedule(num_speculative_tokens)
        return cls({int(size): k for size, k in value.items()})

    def depth(self, batch_size: int) -> int:
        return self.depths[bisect.bisect_right(self.starts, batch_size) - 1]

    def choose(self, batch_size: int) -> int:
        """depth(batch_size), counted in steps_by_depth."""
        k = self.depth(batch_size)
        self.steps_by_depth[k] += 1
        return k

    def observe(self, batch_size: int, k: int, drafted: list[int], accepted: list[int]) -> None:
        """A decode step of ``batch_size`` requests at depth ``k`` was read back (per request:
        draft tokens proposed, drafts accepted). A fixed schedule learns nothing from it."""

    def interrupt(self) -> None:
        """Work other than decode steps (a prefill) ran since the last read-back."""

    def as_dict(self) -> dict[str, int]:
        return {str(s): k for s, k in zip(self.starts, self.depths)}


def batch_bucket(batch_size: int) -> int:
    """The power of two at or above ``batch_size``: steps of one bucket cost about the same
    (CUDA graphs pad the batch to a bucket of this kind), so they share measurements."""
    return 1 << max(batch_size - 1, 0).bit_length()


class MeasuredDepthSchedule(DepthSchedule):
    """"auto": per batch bucket, the depth K in 0..max_depth with the most tokens per
    second, measured on this run.

    tokens per second at depth K = tokens a request gains per step at K / step time at K.
    - Tokens per step come from acceptance by position, pooled over all steps and buckets:
      1 + sum over positions i <= K of P(draft i accepted). Chain drafts of depth K are
      the first K drafts of any deeper step, so a step at depth K' >= i tells about
      position i (the fraction of its requests that drafted i and accepted it).
    - Step time is per (bucket, K): the host time between consecutive read-backs of
      steps of that bucket and depth, i.e. the whole engine step (device work, host work,
      the one sync). Intervals with a prefill, a depth or bucket change, or the first use
      of a shape (CUDA graph capture) are not samples. The median of the last
      ``window`` samples is used: a stray slow step (a page fault, another process)
      does not move it.
    A bucket first runs each depth (deepest first) for ``probe_steps`` consecutive steps,
    then the best; depths keep being re-estimated from the steps they run, and the
    acceptance term keeps learning from every step. Greedy output does not depend on the
    depths chosen; a seeded sampled request's output does (its random numbers follow the
    step widths), as with any schedule.
    """

    def __init__(self, max_depth: int, probe_steps: int = 5, window: int = 16,
                 clock: Callable[[], float] = time.perf_counter):
        if max_depth < 1:
            raise DepthScheduleError(f"{OPTION}: \"auto\" needs num_speculative_tokens >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.candidates = list(range(max_depth, -1, -1))  # probing order: deepest first
        self.samples_needed = max(probe_steps - 1, 1)  # a depth's first step in a row is no sample
        self.clock = clock
        self.steps_by_depth = Counter()
        self.seconds: dict[tuple[int, int], deque] = defaultdict(lambda: deque(maxlen=window))
        self.position_drafted = [0] * (max_depth + 1)  # [i]: requests that drafted position i
        self.position_accepted = [0] * (max_depth + 1)  # [i]: ... and accepted it
        self._last: Optional[tuple[int, int, float]] = None  # (bucket, K, time) of the last read-back

    def tokens_per_step(self, k: int) -> float:
        """Expected tokens a request gains in a step at depth k (1 = plain)."""
        total = 1.0
        for i in range(1, k + 1):
            if self.position_drafted[i]:
                total += self.position_accepted[i] / self.position_drafted[i]
        return total

    def step_seconds(self, bucket: int, k: int) -> Optional[float]:
        samples = self.seconds.get((bucket, k))
        if not samples or len(samples) < self.samples_needed:
            return None
        return statistics.median(samples)

    def depth(self, batch_size: int) -> int:
        bucket = batch_bucket(batch_size)
        best, best_rate = None, 0.0
        for k in self.candidates:
            seconds = self.step_seconds(bucket, k)
            if seconds is None:
                return k  # still probing this bucket
            rate = self.tokens_per_step(k) / max(seconds, 1e-12)
            if rate > best_rate:
                best, best_rate = k, rate
        return best

    def observe(self, batch_size: int, k: int, drafted: list[int], accepted: list[int]) -> None:
        now = self.clock()
        for d, a in zip(drafted, accepted):
            for i in range(1, min(d, self.max_depth) + 1):
                self.position_drafted[i] += 1
                self.position_accepted[i] += a >= i
        bucket = batch_bucket(batch_size)
        if self._last is not None and self._last[:2] == (bucket, k):
            self.seconds[(bucket, k)].append(now - self._last[2])
        self._last = (bucket, k, now)

    def interrupt(self) -> None:
        self._last = None
