"""async_scheduling: the engine launches a batch's next decode step from the device-side
results of the step in flight, before reading that one back (engine/core.py). Outputs,
finish reasons and metrics must be those of the synchronous engine, whatever finishes,
stops, joins or is aborted in between (plain decoding, EAGLE chains, EAGLE-2 trees,
P-EAGLE);
sampled requests and host-side proposers (n-gram) fall back to reading each step back
first. On the CPU the overlap buys nothing, but the run-ahead path runs the same code as
on CUDA (where graphs replay it)."""
from __future__ import annotations

import pytest
import torch

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from eagle_zoo.engine.core import EngineCore

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT_LENGTHS = (9, 14, 6, 20, 11)
# Different lengths, an EOS-stopped one, a stop token, and requests that run into
# max_model_len (64): the run-ahead must stop short of the caches' end.
PARAMS = [dict(max_tokens=21, ignore_eos=True), dict(max_tokens=35), dict(max_tokens=9, ignore_eos=True),
          dict(max_tokens=60, ignore_eos=True), dict(max_tokens=50, ignore_eos=True, stop_token_ids=[49])]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("async")
    kind = ef.kind_of("llama")
    target = ef.write_target(root / "target", kind, edit=ef.bigram_edit())
    peagle = root / "peagle"
    cf.write_speculators(peagle, model_type="peagle", speculative_tokens=3, mask_token_id=5, aux_layer_ids=[1, 2, 3])
    return target, {"eagle": ef.write_bigram_eagle_head(root / "eagle", target),
                    "eagle3": ef.write_head(root / "eagle3", kind, "eagle3"), "peagle": peagle}


def _spec(models, method):
    target, heads = models
    if method is None:
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    if method == "peagle":  # P-EAGLE: K drafts in one head pass (parallel_drafting)
        return {"model": str(heads["peagle"]), "num_speculative_tokens": 3}
    if method == "eagle tree":
        return {"method": "eagle", "model": str(heads["eagle"]), "tree": {"top_k": 3, "depth": 3, "total_tokens": 10}}
    if method == "eagle, adaptive depth":  # K = 3 alone, plain steps (K = 0) from 2 requests
        return {"method": "eagle", "model": str(heads["eagle"]), "num_speculative_tokens": 3,
                "num_speculative_tokens_by_batch_size": {"1": 3, "2": 0}}
    return {"method": method, "model": str(heads[method]), "num_speculative_tokens": 3}


def _record_run_ahead(monkeypatch):
    """Counts the read-backs of a step that happened after a later step was launched."""
    events = []
    launch, read_back = EngineCore._launch_step, EngineCore._read_back

    def launch_spy(self, *args, **kw):
        step = launch(self, *args, **kw)
        events.append(("launch", step))  # the object, kept alive: ids are not reused
        return step

    def read_spy(self, step):
        events.append(("read", step))
        return read_back(self, step)

    monkeypatch.setattr(EngineCore, "_launch_step", launch_spy)
    monkeypatch.setattr(EngineCore, "_read_back", read_spy)

    def run_ahead() -> tuple[int, int]:
        """(read-backs after a later launch, all read-backs)"""
        count = 0
        for i, (kind, step) in enumerate(events):
            if kind == "read":
                launched_at = next(j for j, (k, s) in enumerate(events) if k == "launch" and s is step)
                count += any(k == "launch" for k, _ in events[launched_at + 1:i])
        return count, sum(kind == "read" for kind, _ in events)
    return run_ahead


def _generate(models, method, async_scheduling, params, max_num_seqs=3):
    target, _ = models
    llm = LLM(str(target), speculative_config=_spec(models, method), device="cpu", dtype="float32",
              max_model_len=64, max_num_seqs=max_num_seqs, async_scheduling=async_scheduling)
    prompts = ef.random_prompts(PROMPT_LENGTHS, cf.TINY["vocab_size"], seed=4)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    m = llm.engine.metrics
    return ([(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs],
            (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens, list(m.num_accepted_tokens_per_pos)))


@pytest.mark.parametrize("method", [None, "eagle", "eagle3", "eagle, adaptive depth", "eagle tree", "peagle"])
def test_run_ahead_gives_the_synchronous_outputs_and_metrics(models, method, monkeypatch):
    params = [SamplingParams(temperature=0, **p) for p in PARAMS]
    want = _generate(models, method, False, params)
    run_ahead = _record_run_ahead(monkeypatch)
    got = _generate(models, method, True, params)
    assert got == want
    ahead, reads = run_ahead()
    assert ahead > reads / 2  # most steps ran ahead (the others: joins, finishes, the caches' end)
    reasons = {reason for _, reason in want[0]}
    assert {"length", "stop"} <= reasons  # the cases above did occur
    if method and method.startswith("eagle"):
        assert want[1][2] > 0  # drafts were accepted
    if method == "peagle":
        assert want[1][0] > 0  # drafts were made


@pytest.mark.parametrize("method", [None, "ngram"])
def test_sampled_requests_and_host_side_proposers_read_each_step_back(models, method, monkeypatch):
    """A sampled request's generator must not draw for a discarded step, and n-gram
    lookup reads the host's tokens: such batches never run ahead, outputs unchanged."""
    params = [SamplingParams(temperature=0.8, seed=i, **p) if i % 2 else SamplingParams(temperature=0, **p)
              for i, p in enumerate(PARAMS)]
    if method == "ngram":
        params = [SamplingParams(temperature=0, **p) for p in PARAMS]
    want = _generate(models, method, False, params)
    run_ahead = _record_run_ahead(monkeypatch)
    got = _generate(models, method, True, params)
    assert got == want
    if method == "ngram":
        assert run_ahead()[0] == 0
    else:  # only once the sampled requests have finished may the greedy rest run ahead
        ahead, reads = run_ahead()
        assert ahead < reads / 2


def test_abort_while_a_step_is_in_flight(models):
    """An aborted request's row of the step in flight is dropped; the other request's
    output is unchanged (its tokens do not depend on when the abort happened)."""
    target, _ = models
    prompts = ef.random_prompts((8, 12), cf.TINY["vocab_size"], seed=6)
    outputs = {}
    for async_scheduling in (False, True):
        llm = LLM(str(target), speculative_config=_spec(models, "eagle"), device="cpu", dtype="float32",
                  max_model_len=64, max_num_seqs=2, async_scheduling=async_scheduling)
        engine = llm.engine
        keep, drop = (engine.add_request(p, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
                      for p in prompts)
        for _ in range(4):
            engine.step()
        assert (engine._in_flight is not None) == async_scheduling
        engine.abort(drop.request_id)
        while engine.has_unfinished():
            engine.step()
        outputs[async_scheduling] = list(keep.output_token_ids)
        assert drop.finish_reason is not None or drop.status.name == "FINISHED"
    assert outputs[True] == outputs[False] and len(outputs[True]) == 30


def test_async_scheduling_with_tensor_parallelism_is_refused(models):
    target, _ = models
    with pytest.raises(ValueError, match="async_scheduling"):
        LLM(str(target), device="cpu", tensor_parallel_size=2, async_scheduling=True)


def test_default_is_on_for_one_cuda_device(monkeypatch, models):
    """Unset: on for a CUDA device (the host's work hides behind the GPU's), off on the
    CPU and with tensor parallelism; EAGLE_ZOO_ASYNC_SCHEDULING=0/1 decides for a process."""
    import torch

    from eagle_zoo.engine.llm import default_async_scheduling

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.delenv("EAGLE_ZOO_ASYNC_SCHEDULING", raising=False)
    assert default_async_scheduling(cuda, 1) and not default_async_scheduling(cpu, 1)
    assert not default_async_scheduling(cuda, 2)
    monkeypatch.setenv("EAGLE_ZOO_ASYNC_SCHEDULING", "0")
    assert not default_async_scheduling(cuda, 1)
    monkeypatch.setenv("EAGLE_ZOO_ASYNC_SCHEDULING", "1")
    assert default_async_scheduling(cpu, 1) and not default_async_scheduling(cpu, 2)
    target, _ = models
    assert LLM(str(target), device="cpu", dtype="float32", max_model_len=64).engine.async_scheduling
    assert not LLM(str(target), device="cpu", dtype="float32", max_model_len=64,
                   async_scheduling=False).engine.async_scheduling


@pytest.mark.parametrize("flag, want", [([], False), (["--async-scheduling"], True), (["--no-async-scheduling"], False)])
def test_bench_takes_the_engine_argument(monkeypatch, models, flag, want):
    """`eagle-zoo bench --async-scheduling / --no-async-scheduling` is LLM(async_scheduling=...);
    unset, the engine's default (off on the CPU)."""
    from eagle_zoo import bench
    from eagle_zoo.cli import build_parser

    monkeypatch.delenv("EAGLE_ZOO_ASYNC_SCHEDULING", raising=False)
    target, _ = models
    args = build_parser().parse_args(["bench", "--model", str(target), "--device", "cpu", "--dtype", "float32",
                                      "--max-model-len", "64", *flag])
    assert bench.build_llm(args, None).engine.async_scheduling is want
