"""One thread drives the engine; HTTP handlers talk to it through queues.

EngineCore is not thread-safe, so only the engine thread touches it. Handlers put
"add" and "abort" orders on a thread-safe inbox; the thread applies them between
steps (continuous batching: requests join and leave between steps) and, after every
step, pushes a snapshot of each live request (its full output text so far, its
token count, its finish reason) onto that request's asyncio queue with
``call_soon_threadsafe``. Handlers turn snapshots into deltas themselves.

Failure isolation: an error adding one request fails that request only. Inside
``step()`` the engine pins an error on the request whose own inputs caused it and
finishes that request alone with reason "error" (EngineCore._decode_isolated); the
loop turns that into an error update for it while the others go on. An error no
request is found to cause (the device, the model itself) fails every request in
flight (each gets the error, their slots are freed) and the loop keeps serving.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Optional

import torch

from ..engine.sampling_params import SamplingParams

log = logging.getLogger("eagle_zoo.serve")

# How often a waiting handler checks whether its client went away (seconds).
DISCONNECT_POLL_S = 0.5


@dataclass(frozen=True)
class Update:
    index: int  # which prompt of the HTTP request (the choice index)
    text: str  # the whole output text so far, as the engine detokenized it
    num_tokens: int  # output tokens so far
    finish_reason: Optional[str] = None
    error: Optional[str] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@dataclass
class _Live:
    """Engine-thread record of one request it is running."""

    index: int
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    seq: object = None
    sent_tokens: int = 0


class EngineLoop:
    def __init__(self, engine):
        self.engine = engine
        self._inbox: deque = deque()  # deque append/popleft are thread-safe
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._live: dict[str, _Live] = {}
        self._thread: Optional[threading.Thread] = None
        # Read by the metrics collector from another thread: replaced, never mutated.
        self.snapshot: dict = {"running": 0, "waiting": 0, "spec": None}
        self.steps = 0

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="eagle-zoo-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- handler side (event-loop thread) ----------------------------------------
    async def generate(
        self,
        request_id: str,
        prompts: list[tuple[list[int], SamplingParams]],
        is_disconnected: Optional[Callable[[], Awaitable[bool]]] = None,
    ) -> AsyncIterator[Update]:
        """Runs every prompt as its own engine request and yields their updates,
        interleaved, until all have finished. Leaving early (client gone, consumer
        closed or cancelled) aborts the unfinished ones, freeing their slots."""
        if not self.is_alive():
            raise RuntimeError("the engine thread is not running")
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()
        ids = [f"{request_id}-{i}" for i in range(len(prompts))]
        for i, (token_ids, params) in enumerate(prompts):
            self._inbox.append(("add", ids[i], token_ids, params, _Live(i, loop, queue)))
        self._wake.set()
        pending = set(range(len(prompts)))
        next_check = time.monotonic() + DISCONNECT_POLL_S
        try:
            while pending:
                try:
                    update = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    update = None
                if is_disconnected is not None and time.monotonic() >= next_check:
                    next_check = time.monotonic() + DISCONNECT_POLL_S
                    if await is_disconnected():
                        log.info("request %s: client disconnected, aborting", request_id)
                        return
                if update is None:
                    continue
                if update.finished:
                    pending.discard(update.index)
                yield update
        finally:
            for i in pending:
                self._inbox.append(("abort", ids[i]))
            self._wake.set()

    # -- engine thread -----------------------------------------------------------
    def _run(self) -> None:
        device = torch.device(getattr(self.engine, "device", None) or "cpu")
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)  # a new thread starts on cuda:0, whatever the engine uses
        while not self._stopping.is_set():
            try:
                self._wake.clear()  # before draining, so no order is missed
                self._drain_inbox()
                if not self.engine.has_unfinished():
                    self._wake.wait()
                    continue
                self._step()
            except Exception as exc:  # keep serving whatever happened
                log.exception("engine loop error")
                self._fail_all(f"engine error: {exc}")
        self._fail_all("the server is shutting down")
        while self._inbox:  # orders that arrived too late
            order = self._inbox.popleft()
            if order[0] == "add":
                self._send(order[4], Update(order[4].index, "", 0, error="the server is shutting down"))

    def _drain_inbox(self) -> None:
        while self._inbox:
            order = self._inbox.popleft()
            if order[0] == "add":
                _, rid, token_ids, params, live = order
                try:
                    live.seq = self.engine.add_request(token_ids, params, request_id=rid)
                except Exception as exc:  # this request alone fails
                    log.warning("request %s rejected by the engine: %s", rid, exc)
                    self._send(live, Update(live.index, "", 0, error=f"{type(exc).__name__}: {exc}"))
                    continue
                self._live[rid] = live
            elif self._live.pop(order[1], None) is not None:
                self.engine.abort(order[1])

    def _step(self) -> None:
        t0 = time.perf_counter()
        self.engine.step()
        self.steps += 1
        for rid, live in list(self._live.items()):
            seq = live.seq
            n = len(seq.output_token_ids)
            if n != live.sent_tokens or seq.finished:
                live.sent_tokens = n
                error = getattr(seq, "error", None)
                if error is not None:
                    log.warning("request %s failed in the engine: %s", rid, error)
                    self._send(live, Update(live.index, seq.output_text, n, error=error))
                    del self._live[rid]
                    continue
                reason = seq.finish_reason if seq.finished else None
                self._send(live, Update(live.index, seq.output_text, n, reason))
                if seq.finished:
                    del self._live[rid]
        self._take_snapshot()
        log.debug("step %d: %.1f ms", self.steps, 1e3 * (time.perf_counter() - t0))

    def _take_snapshot(self) -> None:
        sched, spec = self.engine.scheduler, self.engine.metrics
        self.snapshot = {"running": len(sched.running), "waiting": len(sched.waiting),
                         "spec": spec.get_metrics(), "mean_acceptance_length": spec.mean_acceptance_length}

    def _fail_all(self, message: str) -> None:
        for rid, live in list(self._live.items()):
            try:
                self.engine.abort(rid)
            except Exception:
                log.exception("abort of %s failed", rid)
            self._send(live, Update(live.index, "", live.sent_tokens, error=message))
        self._live.clear()
        try:
            self._take_snapshot()
        except Exception:
            pass

    @staticmethod
    def _send(live: _Live, update: Update) -> None:
        try:
            live.loop.call_soon_threadsafe(live.queue.put_nowait, update)
        except RuntimeError:  # that event loop is closed: nobody is listening
            pass
