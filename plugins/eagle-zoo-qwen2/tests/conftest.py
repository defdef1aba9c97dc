"""Fixtures of the eagle-zoo-qwen2 tests (kept apart from eagle-zoo's own tests/)."""
from __future__ import annotations

import pytest
import torch

from eagle_zoo import plugins


@pytest.fixture
def fresh_plugin_host(monkeypatch):
    """A new global plugin host that loads entry points (the env vars cleared), and a
    clean one again afterwards."""
    for var in (plugins.DISABLE_AUTOLOAD_ENV, plugins.ALLOW_LIST_ENV):
        monkeypatch.delenv(var, raising=False)
    plugins.reset()
    yield plugins
    plugins.reset()


@pytest.fixture(scope="module")
def one_thread():
    # Tiny models: one intra-op thread beats two fighting over a busy 2-core machine.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def k_drafts_every_step():
    # A random head gives every draft less than the CPU's confidence floor, so its chain
    # would run plain steps only: the K-draft step is tested with the floor at 0, as in
    # eagle-zoo's own tests/conftest.py.
    from eagle_zoo.engine import proposers

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(proposers, "CPU_MIN_DRAFT_PROB", 0.0)
        yield
