"""Request body -> (prompt token ids, SamplingParams) per choice, or an APIError.

Everything the engine would refuse is checked here first, so a bad request gets a
400 before any streaming starts. Prompts are encoded exactly as the offline ``LLM``
encodes them (text: with the tokenizer's special tokens; chat: the chat template
rendered to text, then encoded without adding special tokens again), so a server
answer equals ``LLM.generate`` / ``LLM.chat`` for the same prompt and parameters.
"""
from __future__ import annotations

import copy
import threading
from typing import Optional

from ..engine.sampling_params import SamplingParams
from .protocol import APIError, ChatCompletionRequest, CompletionRequest, _SamplingRequest

Prepared = list[tuple[list[int], SamplingParams]]


def _choices(ids: list[int], params: SamplingParams) -> Prepared:
    """A prompt's n completions as n engine requests (SamplingParams.child: seed + i)."""
    return [(ids, params if params.n == 1 else params.child(i)) for i in range(params.n)]
# apply_chat_template's own arguments: not settable through chat_template_kwargs.
_TEMPLATE_ARGS = frozenset({"conversation", "tools", "documents", "chat_template", "add_generation_prompt",
                            "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                            "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
                            "sanitize_control_tokens"})
_COPY_LOCK = threading.Lock()  # copying reads the original: one copy at a time


class RequestPreparer:
    def __init__(self, tokenizer, *, max_model_len: int, vocab_size: int, served_model_names: list[str],
                 max_prompts_per_request: Optional[int] = None, max_logprobs: Optional[int] = None,
                 tree: bool = False, trust_request_chat_template: bool = False):
        # The engine thread detokenizes with the engine's tokenizer; each preparation
        # thread gets its own copy, so no two threads share one Rust tokenizer object
        # (and a long prompt being encoded does not hold up a short one).
        self._original = copy.deepcopy(tokenizer) if tokenizer is not None else None
        self._local = threading.local()
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.served_model_names = list(served_model_names)
        self.max_prompts_per_request = max_prompts_per_request
        self.max_logprobs = max_logprobs
        self.tree = tree  # an EAGLE-2 tree engine: what it does not implement is a 400 here
        # A request's own chat template runs on the server (Jinja): only when the operator allows it.
        self.trust_request_chat_template = trust_request_chat_template

    def model_name(self, requested: Optional[str]) -> str:
        if requested is None:
            return self.served_model_names[0]
        if requested not in self.served_model_names:
            raise APIError(f"model {requested!r} is not served here; use one of {self.served_model_names} "
                           "(see /v1/models)", param="model", code="model_not_found")
        return requested

    # -- per endpoint ------------------------------------------------------------
    def completion(self, req: CompletionRequest) -> Prepared:
        req.check_supported()
        prompts = req.prompt
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise APIError("prompt is empty: give a string, a list of strings or token ids", param="prompt")
        cap = self.max_prompts_per_request
        if cap is not None and len(prompts) > cap:
            raise APIError(f"prompt holds {len(prompts)} prompts; this server takes at most {cap} per request "
                           "(eagle-zoo serve --max-prompts-per-request): split them over several requests",
                           param="prompt")
        self._check_choices(len(prompts), req.n)
        explicit = "max_tokens" in req.model_fields_set
        out = []
        for prompt in prompts:
            ids = (self._encode(prompt, add_special_tokens=req.add_special_tokens) if isinstance(prompt, str)
                   else list(prompt))
            ids = self._truncate(ids, req)
            self._check_prompt(ids, "prompt")
            out += _choices(ids, self._params(req, len(ids), req.max_tokens, explicit, "max_tokens"))
        return out

    def chat(self, req: ChatCompletionRequest) -> Prepared:
        req.check_supported()
        tok = self._need_tokenizer()
        if req.chat_template is not None and not self.trust_request_chat_template:
            raise APIError("a chat_template in the request is refused: this server runs only its own template "
                           "(start it with --trust-request-chat-template to allow one per request, or set it with "
                           "--chat-template)", param="chat_template")
        if not (req.chat_template or getattr(tok, "chat_template", None)):
            raise APIError("this model has no chat template: use /v1/completions, or send chat_template",
                           param="messages")
        kwargs = dict(req.chat_template_kwargs or {})
        clash = sorted(set(kwargs) & _TEMPLATE_ARGS)
        if clash:
            raise APIError(f"chat_template_kwargs may not set {clash}: these are the renderer's own arguments "
                           "(add_generation_prompt, continue_final_message, documents and chat_template are request "
                           "fields of their own)", param="chat_template_kwargs")
        for m in req.messages:
            m.check_supported()
        conversation = [m.template_message() for m in req.messages]
        if req.continue_final_message and conversation[-1]["role"] != "assistant":
            raise APIError("continue_final_message needs the last message to be the assistant's (the text to "
                           "continue)", param="continue_final_message")
        try:
            text = tok.apply_chat_template(conversation, tokenize=False, chat_template=req.chat_template,
                                           add_generation_prompt=req.add_generation_prompt,
                                           continue_final_message=req.continue_final_message,
                                           documents=req.documents, **kwargs)
        except Exception as exc:  # templates raise on role orders they do not accept
            raise APIError(f"the chat template rejected these messages: {exc}", param="messages") from exc
        ids = self._truncate(self._encode(text, add_special_tokens=req.add_special_tokens), req)
        self._check_prompt(ids, "messages")
        max_tokens = req.requested_max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        self._check_choices(1, req.n)
        return _choices(ids, self._params(req, len(ids), max_tokens, max_tokens is not None, param))

    # -- helpers -----------------------------------------------------------------
    def _truncate(self, ids: list[int], req: _SamplingRequest) -> list[int]:
        """vLLM's truncate_prompt_tokens: the prompt's last N tokens (-1 or None: all)."""
        k = req.truncate_prompt_tokens
        return ids[-k:] if k is not None and k > 0 else ids

    def _check_choices(self, num_prompts: int, n: int) -> None:
        cap = self.max_prompts_per_request
        if cap is not None and num_prompts * n > cap:
            raise APIError(f"n={n} completions of {num_prompts} prompt(s) make {num_prompts * n} engine requests; "
                           f"this server takes at most {cap} per request (eagle-zoo serve "
                           "--max-prompts-per-request): ask for fewer", param="n")

    @property
    def tokenizer(self):
        """This thread's copy of the tokenizer (None for a model without one)."""
        if self._original is None:
            return None
        tok = getattr(self._local, "tokenizer", None)
        if tok is None:
            with _COPY_LOCK:
                tok = self._local.tokenizer = copy.deepcopy(self._original)
        return tok

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise APIError("this model has no tokenizer: send prompts as token ids to /v1/completions",
                           param="prompt")
        return self.tokenizer

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._need_tokenizer().encode(text, add_special_tokens=add_special_tokens))

    def _check_prompt(self, ids: list[int], param: str) -> None:
        if not ids:
            raise APIError("the prompt is empty: give at least one token", param=param)
        if len(ids) >= self.max_model_len:
            raise APIError(f"the prompt has {len(ids)} tokens but max_model_len is {self.max_model_len}, "
                           "which leaves no room to generate: shorten the prompt", param=param,
                           code="context_length_exceeded")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise APIError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})",
                           param=param)

    def _params(self, req: _SamplingRequest, prompt_len: int, max_tokens: Optional[int], explicit: bool,
                param: str) -> SamplingParams:
        room = self.max_model_len - prompt_len
        if max_tokens is None:
            max_tokens = room  # chat default: the rest of the context (as vLLM)
        elif max_tokens > room:
            if explicit:
                raise APIError(f"{param}={max_tokens} plus the prompt's {prompt_len} tokens exceeds "
                               f"max_model_len={self.max_model_len}: ask for at most {room}", param=param,
                               code="context_length_exceeded")
            max_tokens = room  # the completions default (16) shrinks to fit
        kwargs = dict(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            max_tokens=max_tokens,
            seed=req.seed,
            stop=req.stop_list,
            stop_token_ids=list(req.stop_token_ids or []),
            ignore_eos=req.ignore_eos,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            allowed_token_ids=req.allowed_token_ids,
        )
        if req.top_k is not None:
            kwargs["top_k"] = req.top_k
        optional = dict(min_p=req.min_p, presence_penalty=req.presence_penalty,
                        frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty,
                        logit_bias=req.bias_dict, bad_words=req.bad_words or None,
                        logprobs=req.num_logprobs, prompt_logprobs=req.prompt_logprobs)
        kwargs.update({k: v for k, v in optional.items() if v is not None})
        kwargs["min_tokens"] = req.min_tokens
        kwargs["n"] = req.n
        if req.bad_words and self._original is None:
            raise APIError("bad_words needs a tokenizer to turn the words into tokens, and this model has none",
                           param="bad_words")
        outside = sorted({t for t in (req.allowed_token_ids or []) if t >= self.vocab_size})
        if outside:
            raise APIError(f"allowed_token_ids {outside[:5]} are outside the vocabulary [0, {self.vocab_size})",
                           param="allowed_token_ids")
        bad_bias = sorted(t for t in (req.bias_dict or {}) if t >= self.vocab_size)
        if bad_bias:
            raise APIError(f"logit_bias token ids {bad_bias[:5]} are outside the vocabulary [0, {self.vocab_size})",
                           param="logit_bias")
        if req.min_tokens > max_tokens:
            raise APIError(f"min_tokens={req.min_tokens} exceeds the {max_tokens} tokens this request may generate",
                           param="min_tokens")
        asked = {"logprobs" if isinstance(req, CompletionRequest) else "top_logprobs": req.num_logprobs,
                 "prompt_logprobs": req.prompt_logprobs}
        for name, value in asked.items():
            if value is not None and self.max_logprobs is not None and value > self.max_logprobs:
                raise APIError(f"{name}={value} exceeds this server's max_logprobs={self.max_logprobs} "
                               "(eagle-zoo serve --max-logprobs)", param=name)
        try:
            params = SamplingParams(**kwargs)
        except (ValueError, TypeError) as exc:  # the engine's own checks, in its words
            raise APIError(str(exc)) from exc
        if self.tree:
            from ..engine.core import tree_unsupported

            asked = tree_unsupported(params)
            if asked:
                raise APIError(f"{', '.join(asked)}: not supported by this server's EAGLE-2 tree speculation "
                               "(speculative_config 'tree'): leave them out", param=asked[0])
        return params
