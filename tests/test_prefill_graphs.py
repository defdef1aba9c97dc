"""Prompt prefill through padded, captured passes (engine/prefill_graphs.py). On the CPU the
function a prefill graph captures runs on the graph's static, padded buffers through a
stand-in for the capture that, like a graph, holds them by address only: the prompt
padded up to its bucket must give transformers' greedy tokens (the padding's keys and
values in the cache row are overwritten before anything attends to them), EAGLE chains
and trees whose heads prefill the same way must give plain decoding's tokens, and
prompts outside the buckets prefill eagerly. tests/test_gpu_graphs.py runs the captured
graphs on a GPU."""
from __future__ import annotations

import gc
import types
import weakref

import pytest
import torch
from torch.utils._pytree import tree_flatten

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from eagle_zoo.engine import prefill_graphs
from eagle_zoo.engine.prefill_graphs import PREFILL_BUCKETS, GraphedPrefill

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_MODEL_LEN = 96  # the cache rows hold 96 + k + 1 positions: buckets 32 and 64 fit, 128 does not
LENGTHS = (20, 45, 9, 70, 33)  # buckets 32 and 64; 9: a decode-shaped pass; 70: over the largest bucket
MAX_TOKENS = (18, 12, 10, 14, 16)


def capture_by_address(forward, args, pool):
    """A stand-in for graphs.capture on the CPU: replaying runs ``forward`` again on the
    static buffers. Like a CUDA graph it keeps its inputs by address only (weak
    references), so a static input its owner did not keep alive fails the replay instead
    of being read after the allocator handed its memory to another tensor."""
    refs = [weakref.ref(a) if torch.is_tensor(a) else a for a in args]
    flat, spec = tree_flatten(forward(*args))
    static = [o.clone() if torch.is_tensor(o) else o for o in flat]

    def replay():
        live = [r() if isinstance(r, weakref.ref) else r for r in refs]
        assert all(a is not None for a in live), "a captured graph's static input was freed"
        fresh, _ = tree_flatten(forward(*live))
        for dst, src in zip(static, fresh):
            if torch.is_tensor(dst):
                dst.copy_(src)
    return types.SimpleNamespace(replay=replay), static, spec


class CpuPrefillGraphs(GraphedPrefill):
    """GraphedPrefill over capture_by_address that logs (name, bucket) for every replay."""

    def __init__(self, runner, name, calls):
        super().__init__(runner.forward_prefix, runner.max_len, runner.scratch_slot,
                         types.SimpleNamespace(users=[], handle=None))
        self.name, self.calls = name, calls

    def _capture(self, T, args, device):
        replay, static_in, static_out, spec = super()._capture(T, args, device)

        def logged_replay():
            self.calls.append((self.name, T))
            gc.collect()  # what the graph does not hold is gone before it replays
            replay()
        return logged_replay, static_in, static_out, spec


@pytest.fixture(autouse=True)
def cpu_capture(monkeypatch):
    monkeypatch.setattr(prefill_graphs, "capture", capture_by_address)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefill")
    kind = ef.kind_of("llama")
    # A random target: a padded pass changes the prompt's values in the last bits (the
    # products' blocking depends on the number of rows), which its greedy margins absorb.
    target = ef.write_target(root / "target", kind)
    # A bigram-like target with heads that predict it, so that drafts are accepted at every count.
    bigram = ef.write_target(root / "bigram", kind, edit=ef.bigram_edit())
    heads = {"eagle": ef.write_bigram_eagle_head(root / "head-eagle", bigram),
             "eagle3": ef.write_head(root / "head-eagle3", kind, "eagle3", seed=4, scale=0.6)}
    prompts = ef.random_prompts(LENGTHS, cf.TINY["vocab_size"], seed=2)
    return target, bigram, heads, prompts


def generate(llm, prompts):
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [o.outputs[0].token_ids for o in outs]


def padded_llm(target, spec, calls):
    """A CPU engine whose runners prefill through CpuPrefillGraphs."""
    llm = LLM(str(target), speculative_config=spec, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN,
              max_num_seqs=2)
    runners = [("target", llm.engine.runner)] + ([] if spec is None else [("head", llm.engine.proposer.runner)])
    for name, runner in runners:
        assert runner.graphed_prefill is None  # the CPU engine captures nothing of its own
        runner.graphed_prefill = CpuPrefillGraphs(runner, name, calls)
    return llm


def test_padded_prefill_gives_the_greedy_tokens(setup):
    target, _, _, prompts = setup
    calls = []
    assert generate(padded_llm(target, None, calls), prompts) == ef.hf_greedy(target, prompts, MAX_TOKENS)
    # 20 tokens padded to 32; 33 and 45 to 64; 9 (decode-shaped) and 70 (over the largest bucket) eagerly.
    assert sorted(T for _, T in calls) == [32, 64, 64]


SPECS = {"eagle": {"method": "eagle", "num_speculative_tokens": 3},
         "eagle3": {"method": "eagle3", "num_speculative_tokens": 3},
         "eagle tree": {"method": "eagle", "tree": {"top_k": 3, "depth": 3, "total_tokens": 10}}}


@pytest.mark.parametrize("name", list(SPECS))
def test_speculation_over_padded_prefills_is_lossless(setup, name):
    """The target and the head both prefill padded; the output is plain decoding's over
    the same padded prefills (the EAGLE-1 head predicts the bigram target, so its drafts
    are accepted)."""
    _, bigram, heads, prompts = setup
    plain = generate(padded_llm(bigram, None, []), prompts)
    calls = []
    spec = SPECS[name]
    llm = padded_llm(bigram, {**spec, "model": str(heads[spec["method"]])}, calls)
    assert generate(llm, prompts) == plain
    assert spec["method"] != "eagle" or llm.engine.metrics.num_accepted_tokens > 0
    for runner_name in ("target", "head"):
        assert sorted(T for n, T in calls if n == runner_name) == [32, 64, 64]


def test_buckets_fit_the_cache_row_and_leave_short_and_long_prompts_out():
    graphs = GraphedPrefill(lambda *a: None, 100, 0, types.SimpleNamespace(users=[], handle=None))
    assert graphs.buckets == [b for b in PREFILL_BUCKETS if b <= 100] == [32, 64]
    assert [n for n in (16, 17, 64, 65) if graphs.eligible(n)] == [17, 64]
    assert not GraphedPrefill(lambda *a: None, 20, 0, types.SimpleNamespace(users=[], handle=None)).eligible(18)
