"""What one request may ask of the server, and reading a request body within it.

    ServerLimits(max_request_bytes=8 MiB, max_prompts_per_request=32)

A body over ``max_request_bytes`` gets a 413 before it is read past the limit (the
Content-Length header is checked first, then the bytes as they arrive); a
/v1/completions request with more than ``max_prompts_per_request`` prompts gets a 400.
The body is parsed, validated and tokenized off the event loop (RequestPreparer runs
in one worker thread), so a large request never stalls /health or other streams.
Fair admission (a small request is not queued behind a large batch of prompts) is
the engine loop's (engine_loop.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from .protocol import APIError, find_lone_surrogate

DEFAULT_MAX_REQUEST_BYTES = 8 * 2**20
DEFAULT_MAX_PROMPTS_PER_REQUEST = 32

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class ServerLimits:
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_prompts_per_request: int = DEFAULT_MAX_PROMPTS_PER_REQUEST

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_prompts_per_request"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ServerLimits.{name} must be an integer >= 1, got {value!r}")


def too_large(size: int, limit: int) -> APIError:
    return APIError(f"the request body has {size} bytes or more, over this server's limit of {limit} bytes "
                    "(eagle-zoo serve --max-request-bytes): send fewer or shorter prompts per request",
                    status=413, code="request_too_large")


async def read_body(request, limit: int) -> bytes:
    """The raw body, refusing (413) one longer than ``limit`` bytes without reading it all."""
    header = request.headers.get("content-length")
    if header is not None:
        try:
            declared = int(header)
        except ValueError:
            raise APIError(f"the Content-Length header {header!r} is not a number") from None
        if declared > limit:
            raise too_large(declared, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_request(raw: bytes, model: type[M]) -> M:
    """A body -> the validated request model, or an APIError (400) naming the field.

    The body must be UTF-8 JSON; a string with a lone surrogate (an unpaired
    ``\\ud800``-style escape) is refused naming where it is, as no tokenizer can
    encode it; then the strict pydantic model checks types and ranges."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(f"the body is not valid UTF-8 (byte {raw[exc.start:exc.start + 1]!r} at offset "
                       f"{exc.start}): send JSON encoded as UTF-8") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise APIError(f"the body is not valid JSON: {exc}") from None
    where = find_lone_surrogate(data)
    if where is not None:
        # A key may hold the surrogate itself: written escaped, so the answer is UTF-8.
        names = [str(p).encode("utf-8", "backslashreplace").decode("utf-8") for p in where]
        raise APIError(f"{'.'.join(names) or 'body'}: the string holds a lone UTF-16 surrogate (an unpaired "
                       "\\ud800-\\udfff escape), which is not text: send valid Unicode",
                       param=names[0] if names else None)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def validation_error(exc: ValidationError) -> APIError:
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    # Union fields repeat the field name per member type: the field itself is loc[0].
    param = loc[0] if loc else None
    message = err.get("msg", "invalid request").removeprefix("Value error, ")
    if err.get("type") in ("model_type", "dict_type") and not loc:
        message = "the body must be a JSON object"
    return APIError(f"{'.'.join(loc) or 'body'}: {message}", param=param)
