"""Request and response bodies of the OpenAI-compatible API (pydantic).

Only what the engine can honour is accepted: OpenAI's sampling fields and vLLM's
extensions (top_k, min_p, repetition_penalty, min_tokens, prompt_logprobs, bad_words,
stop_token_ids, ignore_eos) become SamplingParams fields; n > 1 becomes n engine
requests (choice index = prompt index * n + completion index). Options it cannot
honour (echo, suffix, tools, best_of other than n) are rejected with a 400 naming the
option, never silently ignored; unknown extra keys are ignored, as OpenAI clients send
some.

Types are strict (JSON's own types: ``"5"`` is not a number, ``"yes"`` not a
boolean, ``5.0`` not an integer) and numbers must be finite; every numeric field has
the range SamplingParams accepts, so nothing out of range reaches the engine.
"""
from __future__ import annotations

import re
import time
import uuid
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..engine.sampling_params import (LOGIT_BIAS_MAX, PENALTY_MAX, REPETITION_PENALTY_MAX, SEED_MAX, SEED_MIN,
                                      TOKEN_ID_MAX, TOP_K_MAX, TOP_P_MIN)

# JSON as the server reads it: no coercion between types, no NaN / Infinity.
STRICT = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
TokenId = Annotated[int, Field(ge=0, le=TOKEN_ID_MAX)]
# Stop strings and ids are checked on every step for every token of the request: the
# engine thread's work for them is bounded here, so one request cannot slow the others.
MAX_STOP_STRINGS, MAX_STOP_STRING_CHARS, MAX_STOP_TOKEN_IDS = 16, 1000, 1024
# The same for the other per-step work a request brings: its bias entries and bad words.
MAX_LOGIT_BIAS, MAX_BAD_WORDS, MAX_BAD_WORD_CHARS = 1024, 128, 1000
# Logprobs: JSON has no -inf; a token the model rules out is sent with this (as vLLM).
LOGPROB_FLOOR = -9999.0


class APIError(Exception):
    """An error that becomes an OpenAI-style JSON body with this HTTP status."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


_SURROGATE = re.compile("[\ud800-\udfff]")


def find_lone_surrogate(value: Any, path: tuple = ()) -> Optional[tuple]:
    """The path (keys and indexes) of the first string in a parsed JSON value, key or
    value, that holds a lone UTF-16 surrogate (``"\\ud800"`` escapes without their pair):
    such a string cannot be encoded as UTF-8, so no tokenizer can take it. None if none."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and _SURROGATE.search(k):
                return path + (k,)
            found = find_lone_surrogate(v, path + (k,))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = find_lone_surrogate(v, path + (i,))
            if found is not None:
                return found
    return None


# -- requests ---------------------------------------------------------------------
class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = STRICT

    model: Optional[str] = None
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, ge=TOP_P_MIN, le=1)  # below it float32 rounds the cut to 0
    top_k: Optional[int] = Field(None, ge=-1, le=TOP_K_MAX)  # extension (vLLM): -1 or 0 = off
    max_tokens: Optional[int] = Field(None, ge=1)
    n: int = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop_token_ids: Optional[Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)]] = None  # vLLM
    ignore_eos: bool = False  # extension (vLLM)
    min_p: Optional[float] = Field(None, ge=0, le=1)  # extension (vLLM)
    presence_penalty: Optional[float] = Field(None, ge=-PENALTY_MAX, le=PENALTY_MAX)
    frequency_penalty: Optional[float] = Field(None, ge=-PENALTY_MAX, le=PENALTY_MAX)
    repetition_penalty: Optional[float] = Field(None, gt=0, le=REPETITION_PENALTY_MAX)  # extension (vLLM)
    min_tokens: int = Field(0, ge=0)  # extension (vLLM)
    logit_bias: Optional[Annotated[dict[str, Annotated[float, Field(ge=-LOGIT_BIAS_MAX, le=LOGIT_BIAS_MAX)]],
                                   Field(max_length=MAX_LOGIT_BIAS)]] = None
    bad_words: Optional[Annotated[list[Annotated[str, Field(max_length=MAX_BAD_WORD_CHARS)]],
                                  Field(max_length=MAX_BAD_WORDS)]] = None  # extension (vLLM)
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=TOP_K_MAX)  # extension (vLLM)
    best_of: Optional[int] = None

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop):
        stops = [stop] if isinstance(stop, str) else (stop or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are accepted, got {len(stops)}")
        longest = max((len(x) for x in stops), default=0)
        if longest > MAX_STOP_STRING_CHARS:
            raise ValueError(f"a stop string may have at most {MAX_STOP_STRING_CHARS} characters, got one of {longest}")
        return stop

    @field_validator("n")
    @classmethod
    def _positive_n(cls, n: int) -> int:
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        return n

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, bias):
        for key in bias or {}:
            if not key.isdigit() or int(key) > TOKEN_ID_MAX:
                raise ValueError(f"logit_bias keys must be token ids (strings of digits), got {key!r}")
        return bias

    def check_supported(self) -> None:
        if self.best_of not in (None, self.n):
            raise APIError(f"best_of={self.best_of!r} is not supported by this server (it returns every completion "
                           "it generates): leave it out, or set it to n", param="best_of")
        if self.prompt_logprobs is not None and self.stream:
            raise APIError("prompt_logprobs is not supported with stream=true: ask without streaming",
                           param="prompt_logprobs")

    @property
    def num_logprobs(self) -> Optional[int]:
        """SamplingParams.logprobs: the top alternatives per output token, None for none."""
        return None

    @property
    def bias_dict(self) -> Optional[dict[int, float]]:
        return {int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingRequest):
    # A string, a list of strings, a list of token ids or a list of those.
    prompt: Union[str, list[str], list[TokenId], list[list[TokenId]]]
    max_tokens: Optional[int] = Field(16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    suffix: Optional[str] = None
    # Per output token the chosen token's logprob and the top N; 0 gives the chosen one's only.
    logprobs: Optional[int] = Field(None, ge=0, le=TOP_K_MAX)

    @property
    def num_logprobs(self) -> Optional[int]:
        return self.logprobs

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise APIError("echo=true is not supported by this server: leave it out", param="echo")
        if self.suffix:
            raise APIError("suffix is not supported by this server: leave it out", param="suffix")


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text":
                raise APIError(f"message content part of type {part.get('type')!r} is not supported: "
                               "send text parts only", param="messages")
            text = part.get("text", "")
            if not isinstance(text, str):
                raise APIError(f"a text part's text must be a string, got {type(text).__name__}",
                               param="messages")
            parts.append(text)
        return "".join(parts)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    tools: Optional[list[Any]] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=TOP_K_MAX)

    def check_supported(self) -> None:
        super().check_supported()
        if self.tools:
            raise APIError("tools are not supported by this server: leave them out", param="tools")
        if self.top_logprobs and not self.logprobs:
            raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")

    @property
    def num_logprobs(self) -> Optional[int]:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens


# -- responses --------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def add(self, prompt: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.total_tokens = self.prompt_tokens + self.completion_tokens


class CompletionLogprobs(BaseModel):
    """OpenAI's completions logprobs: per token its text, logprob, the top alternatives
    (text -> logprob, the chosen token among them) and its character offset."""

    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    prompt_logprobs: Optional[list[Optional[dict[str, dict[str, Any]]]]] = None  # vLLM's extension


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = []


class ChatLogprobs(BaseModel):
    content: Optional[list[ChatTokenLogprob]] = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: Optional[list[Optional[dict[str, dict[str, Any]]]]] = None  # vLLM's extension


class ChatChunkChoice(BaseModel):
    index: int
    delta: dict[str, str]  # {"role": "assistant"} first, then {"content": "..."}
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[str] = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "eagle-zoo"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
