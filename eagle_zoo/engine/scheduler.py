"""Which requests run in the next engine step: a FIFO queue over fixed cache slots.

Pure Python so it is testable without a device. Requests join between steps when a
cache slot is free and leave as soon as they finish, freeing their slot
(continuous batching). A slot is one row of every preallocated KV cache.
"""
from __future__ import annotations

import time

from collections import deque
from dataclasses import dataclass

from .sequence import Sequence, Status


@dataclass
class ScheduledStep:
    prefill: list[Sequence]
    decode: list[Sequence]


class Scheduler:
    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self.free_slots = deque(range(num_slots))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        """Admit waiting requests into free slots; everything already running decodes."""
        decode = list(self.running)
        prefill = []
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot = self.free_slots.popleft()
            seq.status = Status.RUNNING
            seq.metrics.first_scheduled_time = time.monotonic()
            prefill.append(seq)
            self.running.append(seq)
        return ScheduledStep(prefill=prefill, decode=decode)

    def finish(self, seq: Sequence) -> None:
        if seq.status is Status.FINISHED:
            return
        was_running = seq.status is Status.RUNNING
        seq.status = Status.FINISHED
        seq.metrics.finished_time = time.monotonic()
        if was_running:
            self.running.remove(seq)
            self.free_slots.append(seq.slot)
        else:
            self.waiting.remove(seq)

    def abort(self, request_id: str) -> Sequence | None:
        for seq in list(self.waiting) + list(self.running):
            if seq.request_id == request_id:
                seq.finish_reason = "abort"
                self.finish(seq)
                return seq
        return None
