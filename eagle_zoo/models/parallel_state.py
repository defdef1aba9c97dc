"""Tensor-parallel state: this process's rank and the group size.

Defaults to a single rank (size 1), where every collective is a no-op, so models
run unchanged without torch.distributed. The engine calls ``init(group)`` once per
process when it shards a model; tests may fake a rank with ``fake(rank, size)`` to
check weight slicing (collectives are unavailable while faked).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import torch

_group = None
_rank = 0
_size = 1


def init(group=None) -> None:
    """Use ``group`` (a torch.distributed process group; None = the world)."""
    import torch.distributed as dist

    global _group, _rank, _size
    _group, _rank, _size = group, dist.get_rank(group), dist.get_world_size(group)


def get_tp_rank() -> int:
    return _rank


def get_tp_size() -> int:
    return _size


def get_tp_group():
    return _group


@contextmanager
def fake(rank: int, size: int):
    """Pretend to be ``rank`` of ``size`` while building modules (tests only)."""
    global _rank, _size
    saved = _rank, _size
    _rank, _size = rank, size
    try:
        yield
    finally:
        _rank, _size = saved


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the group (in place); identity at size 1."""
    if _size == 1:
        return x
    import torch.distributed as dist

    dist.all_reduce(x, group=_group)
    return x


def all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in rank order; identity at size 1."""
    if _size == 1:
        return x
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(_size)]
    dist.all_gather(parts, x.contiguous(), group=_group)
    return torch.cat(parts, dim=dim)


def divide(numerator: int, denominator: int, what: Optional[str] = None) -> int:
    if numerator % denominator:
        raise ValueError(
            f"{what or 'size'} {numerator} is not divisible by the tensor-parallel size "
            f"{denominator}; choose a tensor_parallel_size that divides it"
        )
    return numerator // denominator
