"""Request and response bodies of the OpenAI-compatible API (pydantic).

Every field of OpenAI's chat / completions requests and of vLLM's extra parameters is
either honoured or refused with a 400 naming it (docs/serving.md has the table):

- OpenAI's sampling fields and vLLM's extensions (top_k, min_p, repetition_penalty,
  min_tokens, prompt_logprobs, bad_words, allowed_token_ids, stop_token_ids, ignore_eos,
  include_stop_str_in_output, skip_special_tokens) become SamplingParams fields; n > 1
  becomes n engine requests (choice index = prompt index * n + completion index);
  truncate_prompt_tokens, add_special_tokens and the chat-template options shape the
  prompt (prepare.py);
- fields that only describe the caller (user, metadata, request_id, ...; ``ACCEPTED``)
  are accepted and change nothing, as in vLLM;
- options this engine cannot honour (structured outputs, tools, beam search, logits
  processors, ...; ``UNSUPPORTED``) are a 400 naming the field unless they hold their
  neutral value (``false``, ``null``, ``"text"``, ...), never silently ignored;
- keys neither OpenAI nor vLLM define are ignored with a logged warning naming them,
  as vLLM does (its request models allow extra fields and log them).

Types are strict (JSON's own types: ``"5"`` is not a number, ``"yes"`` not a
boolean, ``5.0`` not an integer) and numbers must be finite; every numeric field has
the range SamplingParams accepts, so nothing out of range reaches the engine.
"""
from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..engine.sampling_params import (LOGIT_BIAS_MAX, PENALTY_MAX, REPETITION_PENALTY_MAX, SEED_MAX, SEED_MIN,
                                      TOKEN_ID_MAX, TOP_K_MAX, TOP_P_MIN)

log = logging.getLogger("eagle_zoo.serve")

# JSON as the server reads it: no coercion between types, no NaN / Infinity.
STRICT = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)
# The top-level request bodies keep the keys they do not declare (model_extra), so
# check_supported can sort them: UNSUPPORTED, ACCEPTED, or unknown.
REQUEST = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
TokenId = Annotated[int, Field(ge=0, le=TOKEN_ID_MAX)]
# Stop strings and ids are checked on every step for every token of the request: the
# engine thread's work for them is bounded here, so one request cannot slow the others.
MAX_STOP_STRINGS, MAX_STOP_STRING_CHARS, MAX_STOP_TOKEN_IDS = 16, 1000, 1024
# The same for the other per-step work a request brings: its bias entries and bad words.
MAX_LOGIT_BIAS, MAX_BAD_WORDS, MAX_BAD_WORD_CHARS = 1024, 128, 1000
MAX_ALLOWED_TOKEN_IDS = 2**20  # above any vocabulary: the list becomes one [V] mask per step
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


# -- fields not declared on the request models -------------------------------------
_NOT_SET = (None, False, [], {})
_STRUCTURED = "structured outputs (guided decoding) are not implemented by this engine: leave it out"
# OpenAI's and vLLM's request fields this server does not implement: a 400 naming the
# field unless its value is one of the neutral ones (what leaving it out means).
UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    **{name: (_NOT_SET, _STRUCTURED) for name in (
        "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structural_tag", "structured_outputs",
        "guided_decoding_backend", "guided_whitespace_pattern")},
    "response_format": (_NOT_SET + ({"type": "text"},),
                        'only {"type": "text"} is supported (no JSON mode or schemas): leave it out'),
    "tools": (_NOT_SET, "tool calling is not implemented by this server: leave them out"),
    "tool_choice": (_NOT_SET + ("none", "auto"), 'tool calling is not implemented by this server: leave it out '
                    'or send "none"'),
    "functions": (_NOT_SET, "function calling is not implemented by this server: leave them out"),
    "function_call": (_NOT_SET + ("none", "auto"), "function calling is not implemented by this server: "
                      "leave it out"),
    "use_beam_search": (_NOT_SET, "beam search is not implemented: leave it out (use n for several samples)"),
    "length_penalty": (_NOT_SET + (1, 1.0), "it applies to beam search only, which is not implemented: leave it out"),
    "logits_processors": (_NOT_SET, "custom logits processors cannot be loaded by this server: leave it out"),
    "vllm_xargs": (_NOT_SET, "no extension here reads them: leave it out"),
    "kv_transfer_params": (_NOT_SET, "disaggregated prefill (KV transfer) is not implemented: leave it out"),
    "priority": (_NOT_SET + (0,), "requests are served first come, first served (no priority scheduling): "
                 "leave it out or send 0"),
    "spaces_between_special_tokens": ((None, True), "special tokens are decoded as the tokenizer's decode "
                                      "writes them: leave it out or send true"),
    "return_tokens_as_token_ids": (_NOT_SET, "logprob tokens are always sent as text: leave it out"),
    "return_token_ids": (_NOT_SET, "responses carry text only: leave it out (POST /tokenize gives token ids)"),
    "prompt_embeds": (_NOT_SET, "prompts are text or token ids only: leave it out and send the prompt"),
    "mm_processor_kwargs": (_NOT_SET, "this server serves text-only models: leave it out"),
    "media_io_kwargs": (_NOT_SET, "this server serves text-only models: leave it out"),
    "audio": (_NOT_SET, "this server answers with text only: leave it out"),
    "modalities": (_NOT_SET + (["text"],), 'this server answers with text only: leave it out or send ["text"]'),
    "prediction": (_NOT_SET, "predicted outputs are not implemented: leave it out"),
    "reasoning_effort": (_NOT_SET, "this server has no reasoning controls: leave it out (or pass what the chat "
                         "template reads in chat_template_kwargs)"),
    "verbosity": (_NOT_SET, "this server has no verbosity control: leave it out"),
    "web_search_options": (_NOT_SET, "this server has no web search: leave it out"),
    "store": (_NOT_SET, "this server stores no completions: leave it out or send false"),
    "thinking_token_budget": (_NOT_SET, "this server has no reasoning controls: leave it out"),
}
# Fields that describe the caller or tune what has no effect here: accepted, as vLLM
# accepts them (vLLM ignores user and parallel_tool_calls too).
ACCEPTED = frozenset({
    "user", "metadata", "request_id", "service_tier", "prompt_cache_key", "safety_identifier",
    "parallel_tool_calls", "include_reasoning",
    "cache_salt",  # no prefix is shared between requests here, so there is nothing to salt
})


def _is_neutral(value, neutral: tuple) -> bool:
    # type-exact: 0 is not False, 1.0 may be 1
    return any(value == n and (type(value) is type(n) or {type(value), type(n)} <= {int, float})
               for n in neutral)


# -- requests ---------------------------------------------------------------------
class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: refused when true (check_supported)


class _SamplingRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = REQUEST

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
    allowed_token_ids: Optional[Annotated[list[TokenId], Field(min_length=1, max_length=MAX_ALLOWED_TOKEN_IDS)]] = None
    include_stop_str_in_output: bool = False  # extension (vLLM)
    skip_special_tokens: bool = True  # extension (vLLM)
    truncate_prompt_tokens: Optional[int] = Field(None, ge=-1)  # vLLM: keep the prompt's last N tokens (-1: all)
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
        extra = self.model_extra or {}
        for name, value in extra.items():
            if name in UNSUPPORTED and not _is_neutral(value, UNSUPPORTED[name][0]):
                raise APIError(f"{name} is not supported by this server: {UNSUPPORTED[name][1]}", param=name)
        unknown = sorted(k for k in extra if k not in UNSUPPORTED and k not in ACCEPTED)
        if unknown:  # vLLM's behaviour: ignored, and said so in the log
            log.warning("The following fields were present in the request but ignored: %s", unknown)
        if self.stream_options is not None and not self.stream:
            raise APIError("stream_options needs stream=true: leave it out or stream", param="stream_options")
        if self.stream_options is not None and self.stream_options.continuous_usage_stats:
            raise APIError("stream_options.continuous_usage_stats is not supported by this server: use "
                           "include_usage for the usage at the end", param="stream_options")
        if self.truncate_prompt_tokens == 0:
            raise APIError("truncate_prompt_tokens must be -1 (keep the whole prompt) or at least 1",
                           param="truncate_prompt_tokens")
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
    add_special_tokens: bool = True  # vLLM: the tokenizer's BOS etc. around a text prompt
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


# Message keys of tool calling and audio: refused unless empty, as the request's own tool fields.
MESSAGE_UNSUPPORTED = ("tool_calls", "tool_call_id", "function_call", "audio", "refusal", "reasoning_content")


class ChatMessage(BaseModel):
    model_config = REQUEST
    role: Literal["system", "developer", "user", "assistant"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None  # passed to the chat template with the message, as vLLM does

    def check_supported(self) -> None:
        """Tool-calling keys: a 400 naming them; keys nobody defines: logged, as at the top level."""
        extra = self.model_extra or {}
        for key in MESSAGE_UNSUPPORTED:
            if extra.get(key) not in (None, [], ""):
                raise APIError(f"messages[].{key} is not supported by this server (no tool calling or audio): "
                               "leave it out", param="messages")
        unknown = sorted(k for k in extra if k not in MESSAGE_UNSUPPORTED)
        if unknown:
            log.warning("The following message fields were present in the request but ignored: %s", unknown)

    def template_message(self) -> dict:
        """The message as the chat template reads it (developer is the template's system)."""
        message = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        return message

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
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=TOP_K_MAX)
    # vLLM's chat-template options (prepare.py passes them to apply_chat_template)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # on top of what the template writes
    chat_template: Optional[str] = None  # only with eagle-zoo serve --trust-request-chat-template
    chat_template_kwargs: Optional[dict[str, Any]] = None
    documents: Optional[list[dict[str, str]]] = None
    echo: bool = False  # vLLM's chat echo: refused when true

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise APIError("echo is not supported by this server for chat: leave it out", param="echo")
        if self.continue_final_message and self.add_generation_prompt:
            if "add_generation_prompt" in self.model_fields_set:
                raise APIError("continue_final_message and add_generation_prompt cannot both be true: the reply "
                               "either continues the last message or starts a new one", param="add_generation_prompt")
            self.add_generation_prompt = False  # continuing the final message implies no new one
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
