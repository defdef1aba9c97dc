"""SamplingParams: per-request sampling settings, with vLLM's names and defaults.

Speculative decoding is lossless for these: the rejection sampler verifies drafts
against the target distribution *after* the logits processing (bad words, min_tokens,
logit bias, repetition / frequency / presence penalties; logits_processing.py, with
the drafts before each position counted as generated) and temperature / top-k /
top-p / min-p.
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
PENALTY_MAX = 2.0  # presence / frequency penalties: [-2, 2], as vLLM and OpenAI
REPETITION_PENALTY_MAX = 1e6  # > 0; beyond it every seen token is as good as banned anyway
LOGIT_BIAS_MAX = 100.0  # |bias| <= 100 (OpenAI's range): -100 already bans a token in practice


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
    presence_penalty: float = 0.0    # in [-2, 2]; subtracted once from every generated token's logit
    frequency_penalty: float = 0.0   # in [-2, 2]; subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # > 0; prompt and output tokens: positive logits / it, negative * it
    min_tokens: int = 0              # EOS and stop_token_ids are masked until this many tokens are out
    logprobs: int | None = None      # per output token: the sampled token's logprob plus the top-N
    prompt_logprobs: int | None = None  # per prompt token (but the first): its logprob plus the top-N
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit
    bad_words: list[str] | None = None  # their last token is banned after the others were generated
    allowed_token_ids: list[int] | None = None  # every other token gets -inf (None: all allowed)

    def __post_init__(self) -> None:
        _check(_is_int(self.n) and self.n >= 1, "n", "an integer >= 1", self.n)
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

        _check(self.stop is None or isinstance(self.stop, (str, list, tuple)), "stop",
               "a non-empty string or a list of them", self.stop)
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        _check(all(isinstance(s, str) and s for s in stop), "stop",
               "a non-empty string or a list of them", self.stop)
        self.stop = stop
        _check(self.stop_token_ids is None or isinstance(self.stop_token_ids, (list, tuple)), "stop_token_ids",
               "a list of token ids >= 0 (and below 2**63)", self.stop_token_ids)
        ids = list(self.stop_token_ids or [])
        _check(all(_is_int(t) and 0 <= t <= TOKEN_ID_MAX for t in ids), "stop_token_ids",
               "a list of token ids >= 0 (and below 2**63)", self.stop_token_ids)
        self.stop_token_ids = [int(t) for t in ids]
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            _check(isinstance(getattr(self, name), bool), name, "True or False", getattr(self, name))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_is_real(value) and -PENALTY_MAX <= value <= PENALTY_MAX, name,
                   f"a number in [-{PENALTY_MAX:g}, {PENALTY_MAX:g}] (0 = off)", value)
        _check(_is_real(self.repetition_penalty) and 0 < self.repetition_penalty <= REPETITION_PENALTY_MAX,
               "repetition_penalty", f"a number > 0 and at most {REPETITION_PENALTY_MAX:g} (1 = off)",
               self.repetition_penalty)
        _check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens", "an integer >= 0", self.min_tokens)
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens",
                   f"at most max_tokens ({self.max_tokens})", self.min_tokens)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or (_is_int(value) and 0 <= value <= TOP_K_MAX), name,
                   "None or an integer >= 0 (the number of top alternatives besides the chosen token)", value)
        bias = self.logit_bias
        _check(bias is None or (isinstance(bias, dict) and all(
            _is_int(t) and 0 <= t <= TOKEN_ID_MAX and _is_real(v) and -LOGIT_BIAS_MAX <= v <= LOGIT_BIAS_MAX
            for t, v in bias.items())), "logit_bias",
            f"None or a dict of token id (>= 0) -> bias in [-{LOGIT_BIAS_MAX:g}, {LOGIT_BIAS_MAX:g}]", bias)
        self.logit_bias = {int(t): float(v) for t, v in bias.items()} if bias else None
        words = [self.bad_words] if isinstance(self.bad_words, str) else self.bad_words
        _check(words is None or (isinstance(words, (list, tuple)) and all(isinstance(w, str) and w.strip()
                                                                            for w in words)),
               "bad_words", "None or a list of non-blank strings", self.bad_words)
        self.bad_words = list(words) if words else None
        allowed = self.allowed_token_ids
        _check(allowed is None or (isinstance(allowed, (list, tuple)) and len(allowed) > 0 and all(
            _is_int(t) and 0 <= t <= TOKEN_ID_MAX for t in allowed)), "allowed_token_ids",
            "None or a non-empty list of token ids >= 0", allowed)
        self.allowed_token_ids = sorted({int(t) for t in allowed}) if allowed is not None else None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @property
    def processes_logits(self) -> bool:
        """Whether the logits are changed before sampling (penalties, min_tokens, bias, bad
        words, allowed_token_ids): the processed distribution depends on the tokens generated so far, so such
        a request is verified on the engine's eager path, never a captured greedy graph."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
                or self.min_tokens > 0 or bool(self.logit_bias) or bool(self.bad_words)
                or self.allowed_token_ids is not None)

    @property
    def plain_greedy(self) -> bool:
        """Greedy on the raw logits with nothing to read back but the tokens: what the
        captured greedy graphs and async run-ahead serve."""
        return self.greedy and not self.processes_logits and self.logprobs is None

    def child(self, index: int) -> "SamplingParams":
        """The parameters of completion ``index`` of an n > 1 request: n = 1, and a seeded
        request's seed + index (as vLLM derives its child requests' seeds)."""
        import dataclasses

        seed = self.seed
        if seed is not None:
            seed += index
            if seed > SEED_MAX:
                seed -= 2**64  # the same generator state: torch takes the seed modulo 2**64
        return dataclasses.replace(self, n=1, seed=seed)
