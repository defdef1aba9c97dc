"""One request's state inside the engine (pure Python bookkeeping)."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from .outputs import RequestMetrics
from .sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_index: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    slot: int = -1
    finish_reason: Optional[str] = None
    stop_reason: Optional[object] = None
    generator: Optional[torch.Generator] = None
    output_text: str = ""
    detokenizer: Optional[object] = None  # detokenizer.IncrementalDetokenizer, made on first use
    error: Optional[str] = None  # why the engine failed this request (finish_reason "error")
    bad_words_ids: Optional[list[list[int]]] = None  # params.bad_words as token sequences
    logprobs: Optional[list] = None  # params.logprobs set: one {token id: Logprob} per output token
    cumulative_logprob: Optional[float] = None  # the sum of the output tokens' logprobs
    prompt_logprobs: Optional[list] = None  # params.prompt_logprobs set: vLLM's prompt_logprobs
    # Timing (time.monotonic) and speculation counters, returned as RequestOutput.metrics.
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(arrival_time=time.monotonic()))

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def num_cached(self) -> int:
        """Tokens whose keys/values are in the target cache: all but the last one."""
        return self.num_tokens - 1

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
