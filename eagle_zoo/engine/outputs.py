"""What LLM.generate returns: vLLM-shaped RequestOutput / CompletionOutput."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    # "stop" | "length" | "error" (the engine failed this request alone: its inputs broke
    # a step; the message is in stop_reason); None while still running
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop token id / stop string / error; None for EOS or length
    # SamplingParams.logprobs set: per output token {token id: Logprob} (engine/logprobs.py),
    # the chosen token and the top-N; and the sum of the chosen tokens' logprobs.
    logprobs: list | None = None
    cumulative_logprob: float | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """Per-request timing (time.monotonic seconds) and speculation counters."""

    arrival_time: float
    first_scheduled_time: float | None = None  # admitted into a slot: its prefill begins
    first_token_time: float | None = None
    finished_time: float | None = None
    num_drafts: int = 0            # verification steps that carried draft tokens
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verification step: 1 + accepted / drafts (nan before any)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else math.nan


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    metrics: RequestMetrics | None = None
    # SamplingParams.prompt_logprobs set: None for the first prompt token, then {token id: Logprob}
    prompt_logprobs: list | None = None
