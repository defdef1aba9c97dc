"""Shared fixtures (keep this file to fixtures every test module may want)."""
from __future__ import annotations

import os

# One intra-op thread per process, for this process and every process a test starts
# (servers, tensor-parallel ranks, CLI runs): on a 2-core machine two processes with two
# spinning OpenMP threads each run an order of magnitude slower than with one thread.
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from eagle_zoo import plugins


@pytest.fixture
def reset_plugin_host():
    """A clean global plugin host before and after the test (env vars are read on load)."""
    plugins.reset()
    yield plugins
    plugins.reset()


@pytest.fixture
def register_plugin(reset_plugin_host):
    """register_plugin(obj, name=None, host=None) -> name: registers a throwaway plugin
    object on `host` (default: the global host) and unregisters it after the test."""
    done = []

    def _register(plugin, name=None, host=None):
        host = host or plugins.get_host()
        name = host.register(plugin, name=name)
        done.append((host, name))
        return name

    yield _register
    for host, name in reversed(done):
        host.unregister(name)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for the module's tests, restored after it (tiny models: one
    thread is many times faster than two fighting over a busy 2-core machine). Modules
    ask for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def default_target_dir():
    """The embedded default target as a model directory (SmolLM2, converted from its GGUF);
    the module's tests that ask for it are skipped, with the reason, where it is unavailable."""
    from eagle_zoo import default_target as dt

    try:
        return dt.resolve_default(dt.DEFAULT_MODEL_ID)
    except dt.DefaultTargetError as exc:
        pytest.skip(f"default target unavailable: {exc}")


@pytest.fixture(scope="module")
def smol_tokenizer(default_target_dir):
    """The embedded default target's tokenizer (SmolLM2, byte-level BPE)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_target_dir))


@pytest.fixture
def cpu_drafts_always_k(monkeypatch):
    """EAGLE proposers made in the test draft K every step on the CPU too
    (engine/proposers.py CPU_DRAFT_MIN_CONFIDENCE 0): for tests that compare the one-call
    drafts, or counters that depend on them, with a path that always drafts K (the module
    path, tensor parallelism, a graph stand-in, a depth schedule's K)."""
    from eagle_zoo.engine import proposers

    monkeypatch.setattr(proposers, "CPU_DRAFT_MIN_CONFIDENCE", 0.0)
