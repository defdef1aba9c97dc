"""On a GPU: the engine's CUDA graphs give the eager engine's tokens. Plain decoding,
EAGLE-1 / EAGLE-3 chains (a greedy step is one graph; a sampled one replays the drafting
loop's and the catch-up's) and EAGLE-2 trees (a greedy tree step is one graph), fp32, on
tiny random checkpoints (tests/engine_fixtures.py): a bigram-like target with a head that
predicts it, so drafts are accepted at every count. Skipped without CUDA (the CPU runs the
same functions uncaptured: tests/test_draft_graph_functions.py, tests/test_chain_step_graph.py,
tests/test_tree.py)."""
from __future__ import annotations

import pytest
import torch

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from eagle_zoo.perf_steps import ImplicitSyncs

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SPECS = {
    "plain": None,
    "eagle k=3": ("eagle", {"num_speculative_tokens": 3}),
    "eagle3 k=3": ("eagle3", {"num_speculative_tokens": 3}),
    "eagle tree": ("eagle", {"tree": {"top_k": 4, "depth": 3, "total_tokens": 16}}),
    "eagle3 tree": ("eagle3", {"tree": {"top_k": 4, "depth": 3, "total_tokens": 16}}),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_graphs")
    kind = ef.kind_of("llama")
    target = ef.write_target(root / "target", kind, edit=ef.bigram_edit())
    heads = {"eagle": ef.write_bigram_eagle_head(root / "eagle", target),
             "eagle3": ef.write_head(root / "eagle3", kind, "eagle3")}
    return target, heads


def _generate(target, spec, eager):
    llm = LLM(str(target), speculative_config=spec, device="cuda", dtype="float32", max_model_len=256,
              max_num_seqs=4, enforce_eager=eager)
    prompts = ef.random_prompts((20, 31, 44, 25), cf.TINY["vocab_size"], seed=5)
    params = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [o.outputs[0].token_ids for o in outs], llm.engine.metrics.num_accepted_tokens


@pytest.mark.parametrize("name", list(SPECS))
def test_graphs_give_the_eager_tokens(checkpoints, name):
    target, heads = checkpoints
    spec = None if SPECS[name] is None else {"method": SPECS[name][0], "model": str(heads[SPECS[name][0]]),
                                              **SPECS[name][1]}
    graphed, accepted = _generate(target, spec, eager=False)
    eager, accepted_eager = _generate(target, spec, eager=True)
    assert graphed == eager and accepted == accepted_eager
    if spec is not None:
        plain, _ = _generate(target, None, eager=True)
        assert graphed == plain


def test_parallel_drafting_pass_graphed_gives_the_eager_tokens(checkpoints, tmp_path):
    """A P-EAGLE head's pass after each step replays its graph (graphed_pass): the eager
    engine's tokens and acceptance, and plain decoding's tokens."""
    target, _ = checkpoints
    head = tmp_path / "peagle"
    cf.write_speculators(head, model_type="peagle", speculative_tokens=3, mask_token_id=5, aux_layer_ids=[1, 2, 3])
    spec = {"model": str(head)}
    llm = LLM(str(target), speculative_config=spec, device="cuda", dtype="float32", max_model_len=256, max_num_seqs=4)
    prompts = ef.random_prompts((20, 31, 44, 25), cf.TINY["vocab_size"], seed=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=96, ignore_eos=True))
    assert llm.engine.strategy == "parallel" and llm.engine.proposer.graphed_pass.graphs
    eager, accepted_eager = _generate(target, spec, eager=True)
    assert [o.outputs[0].token_ids for o in outs] == eager
    assert llm.engine.metrics.num_accepted_tokens == accepted_eager
    assert eager == _generate(target, None, eager=True)[0]


@pytest.mark.parametrize("name", ["eagle k=3", "eagle3 tree"])
def test_draft_enforce_eager_keeps_the_target_graphs(checkpoints, name):
    """speculative_config enforce_eager: the head runs without graphs (a greedy tree or
    chain step, whose one graph holds the head's passes, then runs without it), the
    target's graphs stay; the eager engine's tokens."""
    target, heads = checkpoints
    method, extra = SPECS[name]
    spec = {"method": method, "model": str(heads[method]), **extra}
    eager, accepted_eager = _generate(target, spec, eager=True)
    llm = LLM(str(target), speculative_config={**spec, "enforce_eager": True}, device="cuda", dtype="float32",
              max_model_len=256, max_num_seqs=4)
    assert llm.engine.runner.graphed is not None and llm.engine.proposer.runner.graphed is None
    assert llm.engine.tree_step_graph is None and llm.engine.chain_step_graph is None
    prompts = ef.random_prompts((20, 31, 44, 25), cf.TINY["vocab_size"], seed=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=96, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == eager
    assert llm.engine.metrics.num_accepted_tokens == accepted_eager


@pytest.mark.parametrize("name", ["plain", "eagle k=3", "eagle3 k=3", "eagle3 tree"])
def test_async_scheduling_with_graphs_gives_the_same_tokens(checkpoints, name):
    """Run-ahead steps (engine/core.py) replay the same graphs from device-side inputs."""
    target, heads = checkpoints
    spec = None if SPECS[name] is None else {"method": SPECS[name][0], "model": str(heads[SPECS[name][0]]),
                                              **SPECS[name][1]}
    outs = []
    for async_scheduling in (False, True):
        llm = LLM(str(target), speculative_config=spec, device="cuda", dtype="float32", max_model_len=256,
                  max_num_seqs=4, async_scheduling=async_scheduling)
        prompts = ef.random_prompts((20, 31, 44, 25), cf.TINY["vocab_size"], seed=5)
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (96, 40, 70, 12)]
        got = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        outs.append(([o.outputs[0].token_ids for o in got], llm.engine.metrics.num_accepted_tokens))
    assert outs[0] == outs[1]


@pytest.mark.parametrize("name", ["plain", "eagle3 k=3", "eagle3 tree"])
def test_steps_launched_ahead_copy_nothing_into_their_graph(checkpoints, name, monkeypatch):
    """A step graph leaves the next step's inputs in its own buffers (graphs.StepGraph): a
    step launched ahead of the same batch copies none of its three inputs in; without
    async scheduling every step's inputs come from the host and are copied."""
    from eagle_zoo.engine import graphs

    target, heads = checkpoints
    spec = None if SPECS[name] is None else {"method": SPECS[name][0], "model": str(heads[SPECS[name][0]]),
                                              **SPECS[name][1]}
    held, real = [], graphs._holds
    monkeypatch.setattr(graphs, "_holds", lambda buffer, t: held.append(real(buffer, t)) or held[-1])
    for async_scheduling in (False, True):
        held.clear()
        llm = LLM(str(target), speculative_config=spec, device="cuda", dtype="float32", max_model_len=256,
                  max_num_seqs=1, async_scheduling=async_scheduling)
        prompt = ef.random_prompts((20,), cf.TINY["vocab_size"], seed=5)[0]
        llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=96, ignore_eos=True))
        if async_scheduling:
            assert held.count(True) >= 30  # three inputs held for each step launched ahead: 24 to 95 steps
        else:
            assert True not in held


@pytest.mark.parametrize("name", ["eagle k=3", "eagle3 k=3"])
def test_greedy_chain_steps_replay_one_graph(checkpoints, name):
    """A greedy EAGLE chain step is EngineCore.chain_step_graph (drafting, target pass,
    catch-up); the runners' own decode graphs are not replayed; sampled steps take them."""
    target, heads = checkpoints
    method, extra = SPECS[name]
    spec = {"method": method, "model": str(heads[method]), **extra}
    eager, accepted_eager = _generate(target, spec, eager=True)
    llm = LLM(str(target), speculative_config=spec, device="cuda", dtype="float32", max_model_len=256,
              max_num_seqs=4)
    prompts = ef.random_prompts((20, 31, 44, 25), cf.TINY["vocab_size"], seed=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=96, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == eager
    assert llm.engine.metrics.num_accepted_tokens == accepted_eager
    engine = llm.engine
    assert engine.chain_step_graph.graphs and not engine.greedy_target_graph.graphs
    assert not engine.proposer.graphed_drafts.graphs and not engine.proposer.graphed_catch_up.graphs
    sampled = llm.generate([{"prompt_token_ids": p} for p in prompts[:2]],
                           SamplingParams(temperature=0.8, seed=3, max_tokens=8))
    assert all(len(o.outputs[0].token_ids) == 8 for o in sampled)
    assert engine.proposer.graphed_drafts.graphs and engine.proposer.graphed_catch_up.graphs


@pytest.mark.parametrize("name", ["plain", "eagle3 k=3"])
def test_a_prefill_step_waits_for_the_device_once(checkpoints, name):
    """A request's prefill step (the target's pass, its first token, the head's on_prefill)
    waits for the device only to read its first token: the prompt's and the slot's copies
    are pinned and non-blocking (engine/host_tensors.py), so the host queues the head's pass
    behind the target's instead of waiting for it."""
    target, heads = checkpoints
    spec = None if SPECS[name] is None else {"method": SPECS[name][0], "model": str(heads[SPECS[name][0]]),
                                              **SPECS[name][1]}
    engine = LLM(str(target), speculative_config=spec, device="cuda", dtype="float32", max_model_len=256,
                 max_num_seqs=1).engine
    prompt = ef.random_prompts((40,), cf.TINY["vocab_size"], seed=5)[0]
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)  # the prefill step is its only step
    engine.add_request(prompt, params)
    engine.step()  # warm-up: this prompt length's first pass
    engine.add_request(prompt, params)
    with ImplicitSyncs(torch.device("cuda")) as syncs:
        finished = engine.step()
    assert len(finished) == 1 and not engine.has_unfinished()
    assert syncs.count == 1


def test_prefill_graphs_give_the_eager_tokens(tmp_path):
    """Prompts padded up to a prefill graph's bucket (engine/prefill_graphs.py): up to 64
    tokens through the fused decode kernels, whose rows do not depend on the padding, and
    longer ones through the layers' modules; a random target, whose greedy margins absorb
    the last bits a padded product may move. The engine captures each bucket once."""
    target = ef.write_target(tmp_path / "target", ef.kind_of("llama"))
    prompts = ef.random_prompts((20, 64, 100, 200), cf.TINY["vocab_size"], seed=6)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    tokens = []
    for eager in (False, True):
        llm = LLM(str(target), device="cuda", dtype="float32", max_model_len=256, max_num_seqs=2,
                  enforce_eager=eager)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        tokens.append([o.outputs[0].token_ids for o in outs])
        prefill = llm.engine.runner.graphed_prefill
        assert (prefill is None) == eager
        if not eager:
            assert sorted(key[0] for key in prefill.graphs) == [32, 64, 128, 256]
    assert tokens[0] == tokens[1]
