"""The engine's logprobs ({token id: Logprob} per token, engine/logprobs.py) in OpenAI's
response shapes: chat's ``{"content": [{token, logprob, bytes, top_logprobs}]}`` and
completions' ``{tokens, token_logprobs, top_logprobs, text_offset}``; and vLLM's
``prompt_logprobs`` (token id -> {logprob, rank, decoded_token}).

Values are the raw model log-softmax (engine/logprobs.py); JSON has no -inf, so a
token the model rules out is sent as LOGPROB_FLOOR, as vLLM does.
"""
from __future__ import annotations

from typing import Optional

from .protocol import LOGPROB_FLOOR, ChatLogprobs, ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs


def _value(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR)


def _text(lp) -> str:
    return lp.decoded_token if lp.decoded_token is not None else ""


def _top(entry: dict, num_top: int) -> list:
    """The entry's top-``num_top`` alternatives (ranks 1..num_top), most likely first."""
    ranked = [(tid, lp) for tid, lp in entry.items() if lp.rank is not None and lp.rank <= num_top]
    return sorted(ranked, key=lambda item: item[1].rank)[:num_top]


def chat_logprobs(token_ids: list[int], entries: list[dict], num_top: int) -> ChatLogprobs:
    content = []
    for tid, entry in zip(token_ids, entries):
        chosen = entry[tid]
        text = _text(chosen)
        content.append(ChatTokenLogprob(
            token=text, logprob=_value(chosen.logprob), bytes=list(text.encode("utf-8")),
            top_logprobs=[ChatTopLogprob(token=_text(lp), logprob=_value(lp.logprob),
                                         bytes=list(_text(lp).encode("utf-8"))) for _, lp in _top(entry, num_top)]))
    return ChatLogprobs(content=content)


class CompletionLogprobsBuilder:
    """Completions' logprobs, chunk by chunk: text offsets run on from the previous chunk."""

    def __init__(self, num_top: int):
        self.num_top, self.offset = num_top, 0

    def __call__(self, token_ids: list[int], entries: list[dict]) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for tid, entry in zip(token_ids, entries):
            chosen = entry[tid]
            out.tokens.append(_text(chosen))
            out.token_logprobs.append(_value(chosen.logprob))
            top = {_text(lp): _value(lp.logprob) for _, lp in _top(entry, self.num_top)}
            top.setdefault(_text(chosen), _value(chosen.logprob))
            out.top_logprobs.append(top)
            out.text_offset.append(self.offset)
            self.offset += len(_text(chosen))
        return out


def prompt_logprobs_json(prompt_logprobs: Optional[list]) -> Optional[list]:
    if prompt_logprobs is None:
        return None
    return [None if entry is None else
            {str(tid): {"logprob": _value(lp.logprob), "rank": lp.rank, "decoded_token": lp.decoded_token}
             for tid, lp in entry.items()} for entry in prompt_logprobs]
