"""SamplingParams: per-request sampling settings, with vLLM's names and defaults.

Speculative decoding is lossless for these: the rejection sampler verifies drafts
against the target distribution *after* temperature / top-k / top-p / min-p.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

# Below this a temperature means greedy (vLLM uses the same cut-off): dividing
# logits by ~0 would overflow, and the limit of softmax(l / t) is the argmax anyway.
GREEDY_EPS = 1e-5

# Ranges that keep the sampler's float32 / int64 math finite and exact. Values outside
# them are refused (never clamped), here and by the server (a 400 naming the field).
TEMPERATURE_MAX = 1e6  # beyond it softmax(l / t) is uniform to float32 precision anyway
TOP_P_MIN = 1e-8  # float32 keeps the cut-off test exact (smaller values round towards 0)
TOP_K_MAX = 2**31 - 1  # any top_k >= the vocabulary size keeps every token
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed takes
TOKEN_ID_MAX = 2**63 - 1  # token ids travel as int64


class SamplingParamsError(ValueError):
    """A SamplingParams field is out of range; the message names field, range and value."""


def _check(ok: bool, name: str, allowed: str, value) -> None:
    if not ok:
        raise SamplingParamsError(f"SamplingParams.{name} must be {allowed}, got {value!r}")


def _is_real(x) -> bool:
    """A finite real number (not a bool, not NaN or infinity, not too large for a float)."""
    if not isinstance(x, Real) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:  # an int too large for a float
        return False


def _is_int(x) -> bool:
    return isinstance(x, Integral) and not isinstance(x, bool)


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0       # 0 -> greedy
    top_p: float = 1.0             # in (0, 1]; 1 -> off
    top_k: int = 0                 # 0 or -1 -> off (both accepted, stored as 0)
    min_p: float = 0.0             # in [0, 1]; 0 -> off
    seed: int | None = None        # per-request generator: reproducible whatever the batch
    max_tokens: int | None = 16    # None -> until the context length
    stop: str | list[str] | None = None   # stored as list[str]
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        _check(_is_int(self.n), "n", "an integer", self.n)
        if self.n != 1:
            raise SamplingParamsError(
                f"SamplingParams.n must be 1, got {self.n!r}: eagle-zoo returns one completion "
                "per request; submit the prompt n times with different seeds instead")
        _check(_is_real(self.temperature) and 0 <= self.temperature <= TEMPERATURE_MAX, "temperature",
               f"a finite number >= 0 and at most {TEMPERATURE_MAX:g} (0 = greedy)", self.temperature)
        _check(_is_real(self.top_p) and TOP_P_MIN <= self.top_p <= 1, "top_p",
               f"in (0, 1] and at least {TOP_P_MIN:g} (for the single most likely token use top_k=1)",
               self.top_p)
        _check(_is_int(self.top_k) and -1 <= self.top_k <= TOP_K_MAX, "top_k",
               f"an integer in [1, {TOP_K_MAX}], or 0 / -1 for off", self.top_k)
        self.top_k = max(int(self.top_k), 0)
        _check(_is_real(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        _check(self.seed is None or (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX), "seed",
               "an integer in [-2**63, 2**64 - 1] or None", self.seed)
        _check(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
               "max_tokens", "an integer >= 1 or None", self.max_tokens)

        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        _check(all(isinstance(s, str) and s for s in stop), "stop",
               "a non-empty string or a list of them", self.stop)
        self.stop = stop
        ids = list(self.stop_token_ids or [])
        _check(all(_is_int(t) and 0 <= t <= TOKEN_ID_MAX for t in ids), "stop_token_ids",
               "a list of token ids >= 0 (and below 2**63)", self.stop_token_ids)
        self.stop_token_ids = [int(t) for t in ids]
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            _check(isinstance(getattr(self, name), bool), name, "True or False", getattr(self, name))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS
