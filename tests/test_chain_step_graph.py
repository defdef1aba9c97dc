"""A greedy EAGLE chain step as one captured function (EngineCore.chain_step_graph,
EagleProposer.greedy_chain_step). On the CPU the function the CUDA graph captures runs
directly, through stand-ins for the graphs: it must give transformers' greedy tokens and
the acceptance counters of the engine's pass-by-pass path, take every greedy chain step
(the runners' own graphs then serve only prefill), and leave sampled steps to the
pass-by-pass path. tests/test_gpu_graphs.py runs the captured graph on a GPU."""
from __future__ import annotations

import functools

import pytest

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTHS = (5, 12, 3)
MAX_TOKENS = (20, 26, 14)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("chain")
    kind = ef.kind_of("llama")
    # A bigram-like target with an EAGLE-1 head that predicts it (drafts accepted at every
    # count, so a catch-up at the wrong position shows in the counters) and a random EAGLE-3 head.
    target = ef.write_target(root / "target", kind, edit=ef.bigram_edit())
    prompts = ef.random_prompts(LENGTHS, cf.TINY["vocab_size"], seed=1)
    want = ef.hf_greedy(target, prompts, MAX_TOKENS)
    heads = {"eagle": ef.write_bigram_eagle_head(root / "head-eagle", target),
             "eagle3": ef.write_head(root / "head-eagle3", kind, "eagle3", seed=4, scale=0.6)}
    return target, heads, prompts, want


def make_llm(target, head, method, max_num_seqs, **spec):
    return LLM(str(target), speculative_config={"method": method, "model": str(head), "num_speculative_tokens": 3,
                                                **spec},
               device="cpu", dtype="float32", max_model_len=96, max_num_seqs=max_num_seqs)


def run(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [o.outputs[0].token_ids for o in outs]


def greedy(n):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def with_graph_stand_ins(llm, calls):
    """The engine as it is with CUDA graphs: runners' graphs and the chain-step graph."""
    engine = llm.engine
    for name, runner in (("target", engine.runner), ("head", engine.proposer.runner)):
        runner.graphed = ef.RunnerGraphStandIn(runner, name, calls)
    assert engine.chain_step_graph is None  # the CPU engine has no graphs of its own
    assert engine.proposer.whole_step_graphable
    step = functools.partial(engine.proposer.greedy_chain_step, engine.greedy_target_pass)
    engine.chain_step_graph = ef.StepGraphStandIn(step, calls, "chain step", engine.runner.scratch_slot)
    return llm


@pytest.mark.usefixtures("cpu_drafts_always_k")  # counters compared with paths that draft K
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("max_num_seqs", [1, 3])
def test_chain_step_as_one_function_is_lossless_and_counts_like_the_passes(setup, method, max_num_seqs):
    target, heads, prompts, want = setup
    params = [greedy(n) for n in MAX_TOKENS]
    passes = make_llm(target, heads[method], method, max_num_seqs)
    assert run(passes, prompts, params) == want
    calls = []
    one = with_graph_stand_ins(make_llm(target, heads[method], method, max_num_seqs), calls)
    assert run(one, prompts, params) == want
    assert ("chain step", 1) in calls
    # The runners' graphs serve prefill only: every decode-shaped pass is inside the step.
    prefill = {n for n in LENGTHS if n <= 16}
    assert {t for name, t in calls if name == "target"} == prefill
    assert {t for name, t in calls if name == "head"} == prefill
    a, b = passes.engine.metrics, one.engine.metrics
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens, a.num_accepted_tokens_per_pos) == \
           (b.num_drafts, b.num_draft_tokens, b.num_accepted_tokens, b.num_accepted_tokens_per_pos)
    if method == "eagle":
        assert b.num_accepted_tokens_per_pos[2] > 0  # runs of all three drafts accepted


def test_sampled_chain_steps_take_the_passes(setup):
    target, heads, prompts, _ = setup
    calls = []
    llm = with_graph_stand_ins(make_llm(target, heads["eagle3"], "eagle3", 3), calls)
    llm.engine.chain_step_graph = ef.StepGraphStandIn(lambda *a: pytest.fail("a sampled step was graphed"),
                                                      calls, "chain step", llm.engine.runner.scratch_slot)
    outs = run(llm, prompts[:2], [SamplingParams(temperature=0.8, seed=3, max_tokens=6)] * 2)
    assert all(len(o) == 6 for o in outs)
    assert ("target", 4) in calls  # verification went through the target runner's own graph


def test_whole_step_graph_needs_the_heads_graphs(setup):
    """The chain step is one graph only where the head's passes have graphs (not with
    speculative_config enforce_eager, which leaves the head none: tests/test_gpu_graphs.py)."""
    target, heads, _, _ = setup
    llm = make_llm(target, heads["eagle3"], "eagle3", 1)
    assert llm.engine.proposer.runner.graphed is None and not llm.engine.proposer.whole_step_graphable
    llm.engine.proposer.runner.graphed = ef.RunnerGraphStandIn(llm.engine.proposer.runner, "head", [])
    assert llm.engine.proposer.whole_step_graphable
