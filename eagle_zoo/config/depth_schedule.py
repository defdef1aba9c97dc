"""Adaptive speculation depth: the number of draft tokens K chosen per engine step
from the running batch size (speculative_config ``num_speculative_tokens_by_batch_size``).

Why: verification makes every request of a step cost K+1 target positions. At batch 1
the target pass is bound by reading the weights (or, for a small model on a GPU, by
kernel launches), so the extra positions are nearly free and accepted drafts are pure
gain; as the batch grows the pass becomes compute-bound and rejected positions cost
real time. Where that happens depends on the device, so "auto" is one schedule per
device type (default_schedule).

A schedule maps the smallest batch size a depth applies to onto that depth:
``{"1": 3, "4": 1, "8": 0}`` drafts 3 tokens for batches of 1-3 requests, 1 for 4-7,
and runs plain steps (K = 0) from 8 on. ``"auto"`` is default_schedule with its top
depth replaced by num_speculative_tokens. Pure Python: no torch here.
"""
from __future__ import annotations

import bisect
from collections import Counter
from typing import Any, Optional, Union

OPTION = "num_speculative_tokens_by_batch_size"
AUTO = "auto"


def default_schedule(k: int, device_type: str = "cuda") -> dict[int, int]:
    """"auto" for a device type: {batch size a depth starts at: depth}.

    cuda: K up to batch 64, plain (0) from 65 on. On an H200 (bf16, SmolLM2-135M, EAGLE-3
    head, K = 3, MT-bench, 256 tokens; BENCHMARKS.md, "Throughput by batch size") fixed
    K = 3 beat plain decoding at every batch size measured, 64 included (1.21x and 1.33x
    in two runs), where plain steps from 64 on ran at 1.15x and 0.99x; larger batches
    are not measured, so they run plain steps.
    cpu: K at batch 1 only. On 2 cores (fp32) three requests decoded together with K = 3
    run below plain decoding (a step verifies 12 positions), while one request gains.

    Measure your own target and head with ``eagle-zoo bench --perf --depth-schedule ...``."""
    if device_type == "cpu":
        return {1: k, 2: 0}
    return {1: k, 65: 0}


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
    """K for a step's batch size. Depths are a few fixed values, so every step still has
    a fixed shape per (batch bucket, K) and CUDA graphs (keyed by batch bucket and
    tokens per sequence, K + 1) cover each of them."""

    def __init__(self, schedule: dict[int, int]):
        self.starts = sorted(schedule)
        self.depths = [schedule[s] for s in self.starts]
        self.max_depth = max(self.depths)
        self.steps_by_depth: Counter = Counter()  # decode steps run at each K (benchmarks)

    @classmethod
    def from_config(cls, value: Union[None, str, dict], num_speculative_tokens: int,
                    device_type: str = "cuda") -> Optional["DepthSchedule"]:
        if value is None:
            return None
        if value == AUTO:
            return cls(default_schedule(num_speculative_tokens, device_type))
        return cls({int(size): k for size, k in value.items()})

    def depth(self, batch_size: int) -> int:
        return self.depths[bisect.bisect_right(self.starts, batch_size) - 1]

    def choose(self, batch_size: int) -> int:
        """depth(batch_size), counted in steps_by_depth."""
        k = self.depth(batch_size)
        self.steps_by_depth[k] += 1
        return k

    def as_dict(self) -> dict[str, int]:
        return {str(s): k for s, k in zip(self.starts, self.depths)}
