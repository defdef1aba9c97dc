"""Tensor-parallel state: which group a module is built for, and its collectives.

A module reads the current group when it is *built* (``get_tp()``, ``get_tp_rank()``,
``get_tp_size()``) to size its shard, keeps that ``TPGroup`` and passes it to the
collectives it calls in ``forward``::

    self.tp = ps.get_tp()              # in __init__
    return ps.all_reduce(y, self.tp)   # in forward

So one process can hold modules of different groups at once: a target sharded over
two ranks and an EAGLE head built whole on every rank (draft_tensor_parallel_size=1)
that still uses the target's sharded embedding and lm_head. The engine picks the
group with ``with ps.use(group):`` around building; outside any ``use`` the group is
a single rank (size 1), where every collective is a no-op, so models run unchanged
without torch.distributed. Tests may fake a rank with ``fake(rank, size)`` to check
weight slicing (collectives are unavailable while faked).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass(frozen=True)
class TPGroup:
    """This process's place in one tensor-parallel group."""

    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed ProcessGroup; None = the default (world) group

    def __post_init__(self):
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is outside a group of size {self.size}")


SINGLE = TPGroup()  # one rank: no sharding, no communication
_current = SINGLE


class TPDivisionError(ValueError):
    """A size the model splits over ranks is not divisible by the tensor-parallel size."""


def init(group=None) -> TPGroup:
    """Make ``group`` (a torch.distributed process group; None = the world) current
    for the rest of the process and return it. The engine uses ``use()`` instead."""
    global _current
    _current = group_of(group)
    return _current


def group_of(group=None) -> TPGroup:
    """The TPGroup of this process in ``group`` (None = the world)."""
    import torch.distributed as dist

    return TPGroup(dist.get_rank(group), dist.get_world_size(group), group)


def get_tp() -> TPGroup:
    return _current


def get_tp_rank() -> int:
    return _current.rank


def get_tp_size() -> int:
    return _current.size


def get_tp_group():
    return _current.group


@contextmanager
def use(tp: TPGroup):
    """Build modules for ``tp`` inside this block (they keep it for their collectives)."""
    global _current
    saved, _current = _current, tp
    try:
        yield tp
    finally:
        _current = saved


def single():
    """Build modules whole, for one rank (draft_tensor_parallel_size=1)."""
    return use(SINGLE)


def fake(rank: int, size: int):
    """Pretend to be ``rank`` of ``size`` while building modules (tests only)."""
    return use(TPGroup(rank, size, None))


def all_reduce(x: torch.Tensor, tp: Optional[TPGroup] = None) -> torch.Tensor:
    """Sum ``x`` over the group (in place); identity at size 1. ``tp``: the group the
    calling module was built for (default: the current one)."""
    tp = _current if tp is None else tp
    if tp.size == 1:
        return x
    import torch.distributed as dist

    dist.all_reduce(x, group=tp.group)
    return x


def all_gather(x: torch.Tensor, dim: int = -1, tp: Optional[TPGroup] = None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in rank order; identity at size 1."""
    tp = _current if tp is None else tp
    if tp.size == 1:
        return x
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(tp.size)]
    dist.all_gather(parts, x.contiguous(), group=tp.group)
    return torch.cat(parts, dim=dim)


def divide(numerator: int, denominator: int, what: Optional[str] = None) -> int:
    if numerator % denominator:
        raise TPDivisionError(
            f"{what or 'size'} {numerator} is not divisible by the tensor-parallel size "
            f"{denominator}; choose a tensor_parallel_size that divides it"
        )
    return numerator // denominator
