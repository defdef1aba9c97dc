"""One thread drives the engine; HTTP handlers talk to it through queues.

EngineCore is not thread-safe, so only the engine thread touches it. Handlers put
"add" and "abort" orders on a thread-safe inbox; the thread applies them between
steps (continuous batching: requests join and leave between steps) and, after every
step, pushes a snapshot of each live request (its full output text so far, its
token count, its finish reason) onto that request's asyncio queue with
``call_soon_threadsafe``. Handlers turn snapshots into deltas themselves.

Fair admission: an HTTP request's prompts wait here, not in the engine's queue. The
engine is given a prompt only when it has a free slot for it, taken round robin
over the HTTP requests waiting (one prompt each in turn), so a request with one
prompt behind a request with many waits for about one slot to free up per request
ahead of it, not for the whole batch.

The running / waiting gauges (``snapshot``) are refreshed after every step and after
every batch of orders (an abort from a client that went away shows at once, also
when the engine then idles).

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
from collections import OrderedDict, deque
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
    # Requests that asked for logprobs: the tokens new since the previous update and their
    # {token id: Logprob} entries; prompt_logprobs on the last update.
    new_token_ids: tuple = ()
    logprobs: Optional[list] = None
    prompt_logprobs: Optional[list] = None

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
    def __init__(self, engine, log_stats_interval_s: Optional[float] = None):
        """``log_stats_interval_s``: log the speculative counters this often (vLLM's
        periodic "SpecDecoding metrics" line; engine/metrics.py); None: never."""
        from ..engine.metrics import SpecDecodingLogger

        self.engine = engine
        self.stats_logger = (SpecDecodingLogger(log_stats_interval_s, log.info)
                             if log_stats_interval_s is not None else None)
        self._inbox: deque = deque()  # deque append/popleft are thread-safe
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._live: dict[str, _Live] = {}
        # HTTP request id -> its prompts not yet given to the engine, in arrival order
        # (fair admission: _admit); (engine request id, token ids, params, _Live) each.
        self._pending: OrderedDict[str, deque] = OrderedDict()
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
        self._inbox.append(("add", request_id, [(ids[i], token_ids, params, _Live(i, loop, queue))
                                                for i, (token_ids, params) in enumerate(prompts)]))
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
                for _, _, _, live in order[2]:
                    self._send(live, Update(live.index, "", 0, error="the server is shutting down"))

    def _drain_inbox(self) -> None:
        changed = False
        while self._inbox:
            changed = True
            order = self._inbox.popleft()
            if order[0] == "add":
                self._pending[order[1]] = deque(order[2])
            elif self._live.pop(order[1], None) is not None:
                self.engine.abort(order[1])
            else:  # not given to the engine yet
                self._drop_pending(order[1])
        if self._admit() or changed:
            self._take_snapshot()

    def _drop_pending(self, rid: str) -> None:
        for request_id, prompts in list(self._pending.items()):
            kept = deque(p for p in prompts if p[0] != rid)
            if len(kept) != len(prompts):
                if kept:
                    self._pending[request_id] = kept
                else:
                    del self._pending[request_id]
                return

    def _admit(self) -> bool:
        """Gives the engine pending prompts while it has free slots for them, one per
        HTTP request in turn (round robin). Returns whether any was taken."""
        sched = self.engine.scheduler
        room = len(sched.free_slots) - len(sched.waiting)
        took = False
        while room > 0 and self._pending:
            request_id, prompts = self._pending.popitem(last=False)
            rid, token_ids, params, live = prompts.popleft()
            if prompts:
                self._pending[request_id] = prompts  # to the back of the line
            took = True
            try:
                live.seq = self.engine.add_request(token_ids, params, request_id=rid)
            except Exception as exc:  # this request alone fails
                log.warning("request %s rejected by the engine: %s", rid, exc)
                self._send(live, Update(live.index, "", 0, error=f"{type(exc).__name__}: {exc}"))
                continue
            self._live[rid] = live
            room -= 1
        return took

    def _step(self) -> None:
        t0 = time.perf_counter()
        self.engine.step()
        self.steps += 1
        for rid, live in list(self._live.items()):
            seq = live.seq
            n = len(seq.output_token_ids)
            if n != live.sent_tokens or seq.finished:
                before, live.sent_tokens = live.sent_tokens, n
                error = getattr(seq, "error", None)
                if error is not None:
                    log.warning("request %s failed in the engine: %s", rid, error)
                    self._send(live, Update(live.index, seq.output_text, n, error=error))
                    del self._live[rid]
                    continue
                reason = seq.finish_reason if seq.finished else None
                entries = getattr(seq, "logprobs", None)
                self._send(live, Update(
                    live.index, seq.output_text, n, reason,
                    new_token_ids=tuple(seq.output_token_ids[before:n]) if entries is not None else (),
                    logprobs=entries[before:n] if entries is not None else None,
                    prompt_logprobs=getattr(seq, "prompt_logprobs", None) if seq.finished else None))
                if seq.finished:
                    del self._live[rid]
        self._take_snapshot()
        if self.stats_logger is not None:
            self.stats_logger.maybe_log(self.engine.metrics)
        log.debug("step %d: %.1f ms", self.steps, 1e3 * (time.perf_counter() - t0))

    def _take_snapshot(self) -> None:
        sched, spec = self.engine.scheduler, self.engine.metrics
        pending = sum(len(p) for p in self._pending.values())
        self.snapshot = {"running": len(sched.running), "waiting": len(sched.waiting) + pending,
                         "spec": spec.get_metrics(prefix=""), "mean_acceptance_length": spec.mean_acceptance_length}

    def _fail_all(self, message: str) -> None:
        for rid, live in list(self._live.items()):
            try:
                self.engine.abort(rid)
            except Exception:
                log.exception("abort of %s failed", rid)
            self._send(live, Update(live.index, "", live.sent_tokens, error=message))
        self._live.clear()
        for prompts in self._pending.values():
            for _, _, _, live in prompts:
                self._send(live, Update(live.index, "", 0, error=message))
        self._pending.clear()
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
