"""vLLM's tokenizer and version routes: POST /tokenize, POST /detokenize, GET /version.

    POST /tokenize    {"prompt": "...", "add_special_tokens": true}
                      or {"messages": [...], "add_generation_prompt": true}   (the chat template)
                   -> {"count": n, "max_model_len": m, "tokens": [...], "token_strs": [...] | null}
    POST /detokenize  {"tokens": [...]} -> {"prompt": "..."}
    GET  /version     -> {"version": eagle_zoo.__version__}

Token ids are the target's; ids outside its vocabulary are a 400 naming ``tokens``.
"""
from __future__ import annotations

from typing import Any, Optional

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from .protocol import APIError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenizeRequest(_Strict):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[dict[str, Any]]] = None
    add_special_tokens: Optional[bool] = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeRequest(_Strict):
    model: Optional[str] = None
    tokens: list[int] = Field(...)


class DetokenizeResponse(BaseModel):
    prompt: str


def install(app: FastAPI, tokenizer, *, max_model_len: int, vocab_size: int, check_model) -> None:
    """Add the routes to ``app``. ``check_model(name)`` raises the 404 for a name that is
    not served (the completion routes' check)."""

    def need_tokenizer():
        if tokenizer is None:
            raise APIError("the model has no tokenizer: /tokenize and /detokenize need one", status=400,
                           param="model")
        return tokenizer

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        if body.model is not None:
            check_model(body.model)
        tok = need_tokenizer()
        if (body.prompt is None) == (body.messages is None):
            raise APIError("give exactly one of 'prompt' (text) and 'messages' (a chat)", status=400,
                           param="prompt")
        if body.messages is not None:
            if not getattr(tok, "chat_template", None):
                raise APIError("the model has no chat template: send 'prompt' instead of 'messages'", status=400,
                               param="messages")
            try:
                text = tok.apply_chat_template(body.messages, tokenize=False,
                                               add_generation_prompt=body.add_generation_prompt
                                               and not body.continue_final_message,
                                               continue_final_message=body.continue_final_message)
            except Exception as exc:  # malformed messages: the template says what is wrong
                raise APIError(f"messages: the chat template failed ({exc})", status=400, param="messages") from None
            special = bool(body.add_special_tokens)
        else:
            text = body.prompt
            special = body.add_special_tokens is not False
        ids = tok.encode(text, add_special_tokens=special)
        strs = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=max_model_len, tokens=ids, token_strs=strs)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        if body.model is not None:
            check_model(body.model)
        tok = need_tokenizer()
        bad = [t for t in body.tokens if not 0 <= t < vocab_size]
        if bad:
            raise APIError(f"tokens: {bad[:5]} outside the vocabulary (ids 0..{vocab_size - 1})", status=400,
                           param="tokens")
        return DetokenizeResponse(prompt=tok.decode(body.tokens))

    @app.get("/version")
    async def version() -> dict:
        from .. import __version__

        return {"version": __version__}
