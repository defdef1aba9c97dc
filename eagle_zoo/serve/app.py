"""The FastAPI app: OpenAI-compatible routes over one shared engine.

    app = create_app(LLM("HuggingFaceTB/SmolLM2-135M-Instruct"), api_key="...")

Routes: GET /health, GET /metrics, GET /v1/models, POST /v1/completions,
POST /v1/chat/completions (``stream: true`` answers with server-sent events ending
in ``data: [DONE]``), and vLLM's POST /tokenize, POST /detokenize, GET /version
(serve/tokenize.py). Every error body is OpenAI-shaped:
``{"error": {"message", "type", "param", "code"}}``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, asynccontextmanager
from typing import AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .engine_loop import EngineLoop, Update
from .limits import ServerLimits, parse_request, read_body
from .logprobs import CompletionLogprobsBuilder, chat_logprobs, prompt_logprobs_json
from .metrics import ServerMetrics
from .prepare import Prepared, RequestPreparer
from .protocol import (APIError, AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk,
                       ChatCompletionRequest, ChatCompletionResponse, CompletionChoice, CompletionRequest,
                       CompletionResponse, ModelCard, ModelList, Usage, error_body, new_id, now)

log = logging.getLogger("eagle_zoo.serve")

PREPARE_THREADS = 4  # request bodies parsed, validated and tokenized at once


def create_app(llm, *, served_model_names: Optional[list[str]] = None, api_key: Optional[str] = None,
               limits: Optional[ServerLimits] = None, log_stats_interval_s: Optional[float] = None,
               trust_request_chat_template: bool = False) -> FastAPI:
    """An app serving ``llm`` (an eagle_zoo LLM: uses .engine and .tokenizer), within
    ``limits`` (limits.py; default ServerLimits()). The engine thread starts and stops
    with the app (its lifespan). ``log_stats_interval_s``: log vLLM's "SpecDecoding
    metrics" line this often (None: never). ``trust_request_chat_template``: let a chat
    request bring its own ``chat_template`` (otherwise a 400, as vLLM)."""
    engine = llm.engine
    limits = limits or ServerLimits()
    names = list(served_model_names or [str(getattr(llm, "model_path", "model"))])
    loop = EngineLoop(engine, log_stats_interval_s=log_stats_interval_s)
    metrics = ServerMetrics(loop)
    prep = RequestPreparer(llm.tokenizer, max_model_len=engine.max_model_len,
                           vocab_size=engine.target.config.vocab_size, served_model_names=names,
                           max_prompts_per_request=limits.max_prompts_per_request,
                           max_logprobs=getattr(engine, "max_logprobs", None),
                           tree=getattr(engine, "strategy", None) == "tree",
                           trust_request_chat_template=trust_request_chat_template)
    # Parsing, chat templates and tokenization run here, off the event loop, each
    # thread with its own tokenizer copy (RequestPreparer): a large request being
    # tokenized holds up neither the event loop nor a small request beside it.
    workers = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="eagle-zoo-prepare")
    created = now()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop.start()
        try:
            yield
        finally:
            loop.stop()
            workers.shutdown(wait=False, cancel_futures=True)

    async def prepare(request: Request, model, endpoint):
        """Body -> (request model, served name, prepared prompts), off the event loop."""
        raw = await read_body(request, limits.max_request_bytes)

        def work():
            body = parse_request(raw, model)
            return body, prep.model_name(body.model), endpoint(body)

        return await asyncio.get_running_loop().run_in_executor(workers, work)

    app = FastAPI(title="eagle-zoo", lifespan=lifespan)
    app.state.engine_loop, app.state.metrics = loop, metrics
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    _install_error_handlers(app, metrics)

    @app.get("/health")
    async def health():
        if not loop.is_alive():
            return JSONResponse(error_body("the engine thread is not running", "internal_error"), 503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=n, created=created, root=str(getattr(llm, "model_path", n)),
                                         max_model_len=engine.max_model_len) for n in names])

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request):
        body, model, prompts = await prepare(request, CompletionRequest, prep.completion)
        run = _Run(loop, metrics, new_id("cmpl"), prompts, request, n=body.n)
        if body.stream:
            return _sse(_stream_completion(run, model, body))
        results = await run.collect()
        num_top = body.num_logprobs

        def logprobs(u):
            return None if num_top is None else CompletionLogprobsBuilder(num_top)(*run.logprobs_of(u.index))

        return CompletionResponse(
            id=run.id, created=run.created, model=model, usage=run.usage,
            choices=[CompletionChoice(index=u.index, text=u.text, finish_reason=u.finish_reason,
                                      logprobs=logprobs(u), prompt_logprobs=prompt_logprobs_json(u.prompt_logprobs))
                     for u in results])

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request):
        body, model, prompts = await prepare(request, ChatCompletionRequest, prep.chat)
        run = _Run(loop, metrics, new_id("chatcmpl"), prompts, request, n=body.n)
        if body.stream:
            return _sse(_stream_chat(run, model, body))
        results = await run.collect()
        num_top = body.num_logprobs
        return ChatCompletionResponse(
            id=run.id, created=run.created, model=model, usage=run.usage,
            prompt_logprobs=prompt_logprobs_json(results[0].prompt_logprobs) if results else None,
            choices=[ChatChoice(index=u.index, message=AssistantMessage(content=u.text), finish_reason=u.finish_reason,
                                logprobs=None if num_top is None else chat_logprobs(*run.logprobs_of(u.index), num_top))
                     for u in results])

    from . import tokenize

    tokenize.install(app, prep.tokenizer, max_model_len=engine.max_model_len,
                     vocab_size=engine.target.config.vocab_size, check_model=prep.model_name)
    return app


def _body_schema(model) -> dict:
    """The OpenAPI description of a route that reads its JSON body itself."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "title": model.__name__, "type": "object"}}}}}


# -- one request's run ----------------------------------------------------------------
class _Run:
    """Drives one HTTP request's prompts through the engine loop; keeps usage and
    the latency / token metrics."""

    def __init__(self, loop: EngineLoop, metrics: ServerMetrics, request_id: str, prompts: Prepared,
                 request: Request, n: int = 1):
        if not loop.is_alive():
            raise APIError("the engine is not running: see the server log", status=503, type="internal_error")
        self.loop, self.metrics, self.id, self.prompts, self.request = loop, metrics, request_id, prompts, request
        self.created = now()
        self.usage = Usage()
        self.n = n  # completions per prompt: prompt tokens count once per prompt in usage
        # Per choice: (token ids, {token id: Logprob} entries) of requests asking for logprobs.
        self._logprobs: dict[int, tuple[list, list]] = {}
        self.stops = [p.stop for _, p in prompts]
        self._t0 = time.perf_counter()
        self._first_token_seen = False

    async def updates(self, watch_disconnect: bool = False) -> AsyncIterator[Update]:
        # Streaming responses are cancelled by Starlette when the client goes away;
        # plain ones are not, so those poll for the disconnect themselves.
        watch = self.request.is_disconnected if watch_disconnect else None
        finished, failed = 0, False
        try:
            async with aclosing(self.loop.generate(self.id, self.prompts, watch)) as it:
                async for u in it:
                    if u.error:
                        failed = True
                        self.metrics.failed("error")
                        raise APIError(f"request failed: {u.error}", status=500, type="internal_error")
                    if u.num_tokens and not self._first_token_seen:
                        self._first_token_seen = True
                        self.metrics.first_token(time.perf_counter() - self._t0)
                    if u.logprobs is not None:
                        ids, entries = self._logprobs.setdefault(u.index, ([], []))
                        ids += u.new_token_ids
                        entries += u.logprobs
                    if u.finish_reason:
                        finished += 1
                        n_prompt = len(self.prompts[u.index][0])
                        self.usage.add(n_prompt if u.index % self.n == 0 else 0, u.num_tokens)
                        self.metrics.finished(u.finish_reason, n_prompt, u.num_tokens, time.perf_counter() - self._t0)
                    yield u
        finally:
            if finished < len(self.prompts) and not failed:
                self.metrics.failed("aborted")

    def logprobs_of(self, index: int) -> tuple[list, list]:
        """Choice ``index``'s (token ids, logprob entries) so far."""
        return self._logprobs.get(index, ([], []))

    async def collect(self) -> list[Update]:
        final: dict[int, Update] = {}
        async with aclosing(self.updates(watch_disconnect=True)) as it:
            async for u in it:
                if u.finish_reason:
                    final[u.index] = u
        if len(final) < len(self.prompts):  # the client went away; nobody reads this
            raise APIError("the client disconnected", status=499, type="aborted")
        return [final[i] for i in sorted(final)]


class _TextDeltas:
    """Turns full-text snapshots into the new text to send. While running, holds back
    an incomplete UTF-8 character (U+FFFD at the end) and any tail that could still
    become a stop string (the engine cuts the text there when it completes)."""

    def __init__(self, stops: list[str]):
        self.stops, self.sent = stops, 0

    def __call__(self, text: str, finished: bool) -> str:
        end = len(text)
        if not finished:
            end = len(text.rstrip("\ufffd"))
            hold = max((k for s in self.stops for k in range(1, len(s)) if text[:end].endswith(s[:k])),
                       default=0)
            end -= hold
        delta = text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return delta


# -- streaming ----------------------------------------------------------------------
def _sse(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _data(obj) -> str:
    payload = obj.model_dump_json() if hasattr(obj, "model_dump_json") else json.dumps(obj)
    return f"data: {payload}\n\n"


async def _stream(run: _Run, chunk, first=None, usage_chunk=None) -> AsyncIterator[str]:
    """SSE events for a run: ``chunk(index, delta_text, finish_reason, token_ids, entries)``
    builds one event (token_ids / entries: the logprobs of the tokens since the previous
    event, for requests that asked); errors after the 200 went out travel as an error event."""
    deltas = [_TextDeltas(stops) for stops in run.stops]
    pending: dict[int, tuple[list, list]] = {}
    try:
        if first is not None:
            for i in range(len(run.prompts)):
                yield _data(first(i))
        async with aclosing(run.updates()) as it:
            async for u in it:
                text = deltas[u.index](u.text, u.finished)
                ids, entries = pending.setdefault(u.index, ([], []))
                if u.logprobs is not None:
                    ids += u.new_token_ids
                    entries += u.logprobs
                if text or u.finish_reason:
                    pending.pop(u.index)
                    yield _data(chunk(u.index, text, u.finish_reason, ids, entries))
        if usage_chunk is not None:
            yield _data(usage_chunk())
    except Exception as exc:  # the 200 has gone out: report in the stream
        if not isinstance(exc, APIError):
            log.exception("stream %s failed", run.id)
        body = exc.body() if isinstance(exc, APIError) else error_body(f"internal error: {exc}", "internal_error")
        yield _data(body)
    yield "data: [DONE]\n\n"


def _stream_completion(run: _Run, model: str, body: CompletionRequest) -> AsyncIterator[str]:
    num_top = body.num_logprobs
    builders: dict[int, CompletionLogprobsBuilder] = {}

    def chunk(i, text, reason, ids, entries):
        logprobs = None
        if num_top is not None:
            logprobs = builders.setdefault(i, CompletionLogprobsBuilder(num_top))(ids, entries)
        return CompletionResponse(id=run.id, created=run.created, model=model,
                                  choices=[CompletionChoice(index=i, text=text, finish_reason=reason,
                                                            logprobs=logprobs)])

    def usage():
        return CompletionResponse(id=run.id, created=run.created, model=model, choices=[], usage=run.usage)

    return _stream(run, chunk, usage_chunk=usage if body.include_usage else None)


def _stream_chat(run: _Run, model: str, body: ChatCompletionRequest) -> AsyncIterator[str]:
    def make(choices, usage=None):
        return ChatCompletionChunk(id=run.id, created=run.created, model=model, choices=choices, usage=usage)

    def first(i):
        return make([ChatChunkChoice(index=i, delta={"role": "assistant", "content": ""})])

    num_top = body.num_logprobs

    def chunk(i, text, reason, ids, entries):
        logprobs = None if num_top is None else chat_logprobs(ids, entries, num_top)
        return make([ChatChunkChoice(index=i, delta={"content": text} if text else {}, finish_reason=reason,
                                     logprobs=logprobs)])

    def usage():
        return make([], run.usage)

    return _stream(run, chunk, first=first, usage_chunk=usage if body.include_usage else None)


# -- auth and errors ----------------------------------------------------------------
class ApiKeyMiddleware:
    """Checks ``Authorization: Bearer <key>`` on every route but /health. Plain ASGI
    (not BaseHTTPMiddleware) so streaming and disconnect detection pass through."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                body = error_body("invalid or missing API key: send the header 'Authorization: Bearer <key>'",
                                  "invalid_request_error", None, "invalid_api_key")
                await JSONResponse(body, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        if exc.status in (400, 413):
            metrics.failed("bad_request")
        return JSONResponse(exc.body(), exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        metrics.failed("bad_request")
        err = exc.errors()[0]
        if err.get("type") == "json_invalid":
            return JSONResponse(error_body(f"the body is not valid JSON: {err.get('ctx', {}).get('error', '')}"), 400)
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        # Union fields repeat the field name per member type: keep the field itself.
        param = loc[0] if loc else None
        message = err.get("msg", "invalid request").removeprefix("Value error, ")
        return JSONResponse(error_body(f"{'.'.join(loc) or 'body'}: {message}", param=param), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), exc.status_code)

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception):
        log.exception("unhandled error in %s", request.url.path)
        metrics.failed("error")
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "internal_error"), 500)
