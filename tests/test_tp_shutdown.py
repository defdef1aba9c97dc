"""Tensor-parallel teardown: CUDA graphs are dropped before the process group is
destroyed (graphs holding NCCL collectives make destroy_process_group() hang, PyTorch
issue 115388), and a destroy that hangs anyway cannot hang the engine's shutdown."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

from eagle_zoo.engine import graphs, parallel


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("handle",))
    return graphs.GraphPool()


def test_release_drops_every_graph_of_the_pool(pool):
    users = [graphs.GraphedForward(lambda *a: None, 4, 4, pool) for _ in range(2)]
    for i, user in enumerate(users):
        user.graphs[(1, 1)] = ("graph", i)
    graphs.release_all_graphs()
    assert all(user.graphs == {} for user in users)
    assert pool.users == []


def test_graphs_go_before_the_group_and_a_hanging_destroy_is_bounded(pool, monkeypatch):
    user = graphs.GraphedForward(lambda *a: None, 1, 1, pool)
    user.graphs[(1, 1)] = ("graph",)
    seen, hang = [], threading.Event()

    def destroy():
        seen.append(dict(user.graphs))  # what was still captured when destroy began
        hang.wait(5)

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", destroy)
    with pytest.warns(RuntimeWarning, match="did not return within"):
        parallel.destroy_process_group(timeout=0.2)
    hang.set()
    assert seen == [{}]


def test_destroy_without_a_group_does_nothing(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: pytest.fail("destroyed a group that does not exist"))
    parallel.destroy_process_group(timeout=0.1)
