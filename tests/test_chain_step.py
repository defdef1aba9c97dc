"""The greedy EAGLE chain step as one captured function (engine/chain_step.py). On the
CPU the function a CUDA graph would capture runs directly, through stand-ins for the
graphs: it must give the plain greedy output token for token (transformers' greedy here)
and the same acceptance counters as the engine's three-graph path, and it must take over
every greedy chain step while sampled steps stay on the eager path."""
from __future__ import annotations

import pytest

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from eagle_zoo.engine import chain_step

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTHS = (5, 12, 3)
MAX_TOKENS = (20, 26, 14)


class StepGraphStandIn:
    """Stands in for GraphedForward on the CPU: records each call, runs the function."""

    def __init__(self, fn, calls):
        self.fn, self.calls = fn, calls

    def eligible(self, input_ids):
        return True

    def __call__(self, last, base, slots, k):
        self.calls.append((last.shape[0], k))
        return self.fn(last, base, slots, k)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("chain")
    kind = ef.kind_of("llama")
    target = ef.write_target(root / "target", kind)
    prompts = ef.random_prompts(LENGTHS, cf.TINY["vocab_size"], seed=1)
    want = ef.hf_greedy(target, prompts, MAX_TOKENS)
    heads = {m: ef.write_head(root / f"head-{m}", kind, m, seed=4, scale=0.6) for m in ("eagle", "eagle3")}
    return target, heads, prompts, want


def make_llm(target, head, method, max_num_seqs):
    return LLM(str(target), speculative_config={"method": method, "model": str(head), "num_speculative_tokens": 3},
               device="cpu", dtype="float32", max_model_len=96, max_num_seqs=max_num_seqs)


def run(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [o.outputs[0].token_ids for o in outs]


def greedy(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("max_num_seqs", [1, 3])
def test_chain_step_as_one_function_is_lossless_and_counts_like_three(setup, method, max_num_seqs):
    target, heads, prompts, want = setup
    params = [greedy(n) for n in MAX_TOKENS]
    three = make_llm(target, heads[method], method, max_num_seqs)  # the eager path (CPU: no graphs)
    assert run(three, prompts, params) == want
    one = make_llm(target, heads[method], method, max_num_seqs)
    calls = []
    for name, runner in (("target", one.engine.runner), ("head", one.engine.proposer.runner)):
        runner.graphed = ef.RunnerGraphStandIn(runner, name, calls)
    steps = []
    one.engine._chain_step_graph = StepGraphStandIn(chain_step.whole_row_greedy_chain_step(one.engine), steps)
    assert run(one, prompts, params) == want
    assert steps and all(k == 3 for _, k in steps)
    # The runners' graphs serve prefill only: every decode-shaped pass is inside the step.
    prefill = {n for n in LENGTHS if n <= 16}
    assert {t for name, t in calls if name == "target"} == prefill
    a, b = three.engine.metrics, one.engine.metrics
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens, a.num_accepted_tokens_per_pos) == \
           (b.num_drafts, b.num_draft_tokens, b.num_accepted_tokens, b.num_accepted_tokens_per_pos)
    if method == "eagle":  # this random EAGLE-1 head agrees with the target now and then (EAGLE-3's never)
        assert b.num_accepted_tokens > 0


def test_sampled_chain_steps_stay_eager(setup):
    target, heads, prompts, _ = setup
    llm = make_llm(target, heads["eagle3"], "eagle3", 3)
    steps = []
    llm.engine._chain_step_graph = StepGraphStandIn(lambda *a: pytest.fail("a sampled step was graphed"), steps)
    outs = run(llm, prompts[:2], [SamplingParams(temperature=0.8, seed=3, max_tokens=6)] * 2)
    assert all(len(o) == 6 for o in outs) and not steps


def test_chain_step_graph_switch(monkeypatch, setup):
    """Off unless EAGLE_ZOO_CHAIN_STEP_GRAPH=1 (+1-2% on an H200, within noise); never made
    without CUDA graphs (the CPU engine has none)."""
    monkeypatch.delenv("EAGLE_ZOO_CHAIN_STEP_GRAPH", raising=False)
    monkeypatch.delenv("EAGLE_ZOO_STEP_GRAPHS", raising=False)
    assert not chain_step.chain_step_graph_enabled()
    monkeypatch.setenv("EAGLE_ZOO_CHAIN_STEP_GRAPH", "1")
    assert chain_step.chain_step_graph_enabled()
    monkeypatch.setenv("EAGLE_ZOO_STEP_GRAPHS", "0")
    assert not chain_step.chain_step_graph_enabled()
    monkeypatch.delenv("EAGLE_ZOO_STEP_GRAPHS")
    target, heads, _, _ = setup
    llm = make_llm(target, heads["eagle"], "eagle", 1)
    assert chain_step.graphed_chain_step(llm.engine) is None
