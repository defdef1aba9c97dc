"""The step-cost tables of `bench --perf --step-costs` (eagle_zoo/perf_steps.py), on the CPU
with a tiny random target: every strategy's row, its ratios, the projection's arithmetic
and the refusals of bad options."""
from __future__ import annotations

import argparse

import pytest
import torch

import checkpoint_factory as cf

from eagle_zoo import bench
from eagle_zoo.perf_steps import SYNC_WARNING, ImplicitSyncs, copy_bandwidth, format_table, host_profile, \
    parse_acceptance_profile, prefill_profile, project_speedup, random_eagle3_head, random_target, run_step_costs, \
    step_cost_table

TINY = cf.STEP_COST_TINY

pytestmark = pytest.mark.usefixtures("one_thread")


def test_table_has_a_row_per_strategy_with_ratios_to_plain():
    table = step_cost_table("tiny", shape=TINY, k=3, tree={"top_k": 4, "depth": 3, "total_tokens": 12},
                            dtype=torch.float32, device=torch.device("cpu"), steps=12,
                            acceptance_profile=[0.7, 0.5, 0.4])
    plain, chain, tree = table["rows"]
    assert [r["strategy"] for r in table["rows"]] == ["plain", "chain", "tree"]
    assert plain["vs_plain"] == 1.0 and plain["tokens_per_step"] == 1.0
    assert chain["k"] == 3 and 1.0 <= chain["tokens_per_step"] <= 4.0
    assert 1.0 <= tree["tokens_per_step"] <= 4.0
    for row in table["rows"]:
        assert row["step_us"] > 0 and 0 < row["host_us"] <= row["step_us"] + 1e-6
        assert row["vs_plain"] == pytest.approx(row["step_us"] / plain["step_us"])
    assert table["plain_tokens_per_s"] == pytest.approx(1e6 / plain["step_us"])
    projection = table["projection"]
    assert projection["projected_speedup"] == pytest.approx(2.6 / chain["vs_plain"])
    assert "projection" in format_table(table) and "| chain k=3 |" in format_table(table)


def test_a_batch_table_steps_every_request_together():
    """--step-cost-batch 3: three requests a step in every strategy; plain decoding's rate
    counts a token a request a step, and each row's tokens_per_step is a request's mean."""
    table = step_cost_table("tiny", shape=TINY, k=2, tree={"top_k": 4, "depth": 2, "total_tokens": 8},
                            dtype=torch.float32, device=torch.device("cpu"), steps=8, batch=3)
    plain, chain, tree = table["rows"]
    assert table["batch"] == 3 and plain["tokens_per_step"] == 1.0
    assert 1.0 <= chain["tokens_per_step"] <= 3.0 and 1.0 <= tree["tokens_per_step"] <= 3.0
    assert table["plain_tokens_per_s"] == pytest.approx(3e6 / plain["step_us"])
    assert format_table(table).startswith("shape tiny, cpu, float32, batch 3, max_model_len 512, "
                                          "async scheduling off;")
    with pytest.raises(ValueError, match="batch=0; a step serves 1 request or more"):
        step_cost_table("tiny", shape=TINY, device=torch.device("cpu"), batch=0)


@pytest.mark.parametrize("given, want", [(None, False), (True, True), (False, False)])
def test_async_scheduling_as_given_else_the_engine_default(monkeypatch, given, want):
    """`bench --perf --async-scheduling / --no-async-scheduling` reaches every row's engine;
    unset, LLM's default (off on the CPU), and the table's first line says which."""
    from eagle_zoo.engine.core import EngineCore

    monkeypatch.delenv("EAGLE_ZOO_ASYNC_SCHEDULING", raising=False)
    seen = []
    init = EngineCore.__init__

    def spy(self, *args, **kw):
        seen.append(kw["async_scheduling"])
        init(self, *args, **kw)

    monkeypatch.setattr(EngineCore, "__init__", spy)
    table = step_cost_table("tiny", shape=TINY, k=2, dtype=torch.float32, device=torch.device("cpu"), steps=4,
                            async_scheduling=given)
    assert seen == [want, want] and table["async_scheduling"] is want
    assert f"async scheduling {'on' if want else 'off'};" in format_table(table)


def test_every_row_caches_the_max_model_len_asked_for_or_what_the_deepest_steps_need():
    """--perf-max-model-len: every strategy's engine caches that many tokens where the timed
    steps need fewer (12 chain steps of up to 3 tokens after a 300-token prompt need 512),
    one length for the whole table; more than the shape allows is refused by name."""
    from eagle_zoo import perf_steps

    seen = []
    real = perf_steps.strategy_engine

    def spy(*args, **kw):
        seen.append(args[7])  # max_model_len
        return real(*args, **kw)
    kw = dict(shape=TINY, k=2, dtype=torch.float32, device=torch.device("cpu"), steps=6)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(perf_steps, "strategy_engine", spy)
        assert step_cost_table("tiny", max_model_len=3072, **kw)["max_model_len"] == 3072
        assert seen == [3072, 3072]
        seen.clear()
        table = step_cost_table("tiny", max_model_len=256, **kw)
        assert table["max_model_len"] == 512 and seen == [512, 512]
    assert format_table(table).startswith("shape tiny, cpu, float32, batch 1, max_model_len 512, async scheduling off;")
    with pytest.raises(ValueError, match="--perf-max-model-len 8192 is over the shape's max_position_embeddings=4096"):
        step_cost_table("tiny", max_model_len=8192, **kw)


@pytest.mark.parametrize("strategy", ["plain", "chain", "tree"])
def test_host_profile_times_the_steps_of_the_strategy_asked_for(strategy):
    target = random_target(TINY, torch.float32, torch.device("cpu"))
    head = random_eagle3_head(target, 256, torch.float32)
    text = host_profile(target, head, strategy, k=3, tree={"top_k": 4, "depth": 3, "total_tokens": 12},
                        dtype=torch.float32, device=torch.device("cpu"), steps=6, top=400)
    # EngineCore's step, among the functions listed as file:line(function): the function it
    # calls, since not every torch lists the decorated step itself (the GPU image's did not).
    assert "(_decode_isolated)" in text
    assert {"plain": "(_launch)", "chain": "(propose)", "tree": "(launch_tree_step)"}[strategy] in text
    assert ("(propose)" in text) == (strategy == "chain")


@pytest.mark.parametrize("strategy", ["plain", "chain"])
def test_prefill_profile_times_each_request_s_prefill_step(strategy):
    import statistics

    target = random_target(TINY, torch.float32, torch.device("cpu"))
    head = random_eagle3_head(target, 256, torch.float32)
    result = prefill_profile(target, head, strategy, prompt_tokens=40, requests=5, k=3, dtype=torch.float32,
                             device=torch.device("cpu"), top=400)
    assert (result["strategy"], result["prompt_tokens"], result["requests"]) == (strategy, 40, 5)
    times = result["prefill_ms_all"]
    assert len(times) == 5 and all(t > 0 for t in times)
    assert result["prefill_ms"] == statistics.median(times)
    assert result["host_waits_per_prefill"] == 0  # no device to wait for on the CPU
    text = result["profile"]  # functions listed as file:line(function)
    assert "(_prefill)" in text
    assert ("(on_prefill)" in text) == (strategy == "chain")  # the draft head's prefill
    assert "(_decode)" not in text  # one output token: the prefill step is the request's only step
    assert "kernels" not in result  # torch.profiler's kernel count: CUDA only


def test_a_prefill_longer_than_the_shape_s_positions_is_refused_by_name():
    target = random_target(TINY, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="max_position_embeddings=4096; give --prefill between 1 and 4095"):
        prefill_profile(target, None, "chain", prompt_tokens=5000, dtype=torch.float32, device=torch.device("cpu"))


def test_implicit_syncs_count_each_sync_warning_and_not_the_mode_s_own_notice():
    """Every sync torch reports while active is counted, repeats included; other warnings,
    such as set_sync_debug_mode's prototype notice, are not."""
    import warnings

    with ImplicitSyncs(torch.device("cpu")) as syncs:
        for _ in range(2):
            warnings.warn(f"a device-to-host copy {SYNC_WARNING}")
        # torch's notice when the mode is set: it names synchronizing operations, yet is no sync
        warnings.warn("Synchronization debug mode is a prototype feature and does not detect all "
                      "synchronizing operations")
    assert syncs.count == 2


def test_a_chain_step_s_read_ratio_counts_the_target_once_and_the_head_once_a_draft():
    """chain_read_ratio against the shapes counted by hand: TINY's 4 layers, its final
    norm and its tied lm_head (read whole, though it shares the embedding's tensor);
    the head's fc once, its layer, norms and 300-row lm_head once a draft."""
    from eagle_zoo.perf_steps import chain_read_ratio, read_bytes

    target = random_target(TINY, torch.float32, torch.device("cpu"))
    head = random_eagle3_head(target, 300, torch.float32)
    H, inter, d = 64, 128, 16
    layer = H * (4 + 2 * 2) * d + H * H + 2 * inter * H + inter * H + 2 * H  # qkv, o, gate_up, down, norms
    target_floats = 4 * layer + H + 512 * H
    head_layer = 2 * H * (4 + 2 * 2) * d + H * H + 2 * inter * H + inter * H + 3 * H  # qkv over 2H, three norms
    per_draft = head_layer + H + 300 * H  # the layer, the final norm, the lm_head
    assert read_bytes(target) == 4 * target_floats
    for k in (1, 3):
        assert chain_read_ratio(target, head, k) == pytest.approx((target_floats + 3 * H * H + k * per_draft)
                                                                   / target_floats)
    table = step_cost_table("tiny", shape=TINY, k=3, dtype=torch.float32, device=torch.device("cpu"), steps=4)
    full_vocab_head = per_draft + (512 - 300) * H  # a shape without a DRAFT_VOCAB entry drafts over all 512
    assert table["chain_read_ratio"] == pytest.approx((target_floats + 3 * H * H + 3 * full_vocab_head)
                                                      / target_floats)
    assert f"a chain step reads {table['chain_read_ratio']:.3f}x a plain step's weight bytes" in format_table(table)


def test_the_floor_line_names_the_bandwidth_it_divides_by():
    table = {"shape": "8b", "device": "cuda", "dtype": "bfloat16", "batch": 1, "rows": [], "plain_tokens_per_s": 155.8,
             "copy_bandwidth": 3.36e12, "weight_read_floor_us": 4467.3, "plain_vs_floor": 1.44}
    assert "1.44x the weight-read floor (4467.3 us at a measured copy bandwidth of 3.36 TB/s)" in format_table(table)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_copy_bandwidth_is_measured_on_the_gpu_at_hand():
    assert 1e11 < copy_bandwidth(torch.device("cuda"), nbytes=1 << 28) < 2e13  # bytes/s read plus written


def test_the_cache_is_sized_for_the_steps_and_too_many_steps_are_refused_by_name():
    """max_model_len follows the step count and tree depth (12 steps of a depth-3 tree ran
    above); steps whose tokens outgrow the shape's positions are refused before any engine
    is built, naming the option to lower."""
    from eagle_zoo.perf_steps import measure_strategy, random_target

    target = random_target(TINY, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="give fewer --step-cost-steps"):
        measure_strategy(target, None, "chain", k=3, dtype=torch.float32, device=torch.device("cpu"), steps=2000)


def test_projection_is_tokens_a_step_over_the_step_ratio():
    p = project_speedup([0.5, 0.25], 1.25)
    assert p["mean_acceptance_length"] == 1.75 and p["projected_speedup"] == pytest.approx(1.4)
    assert p["label"] == "projection, not a measurement"
    with pytest.raises(ValueError, match="acceptance profile"):
        project_speedup([1.5], 1.0)


def test_bad_options_are_refused_by_name():
    assert parse_acceptance_profile("0.75,0.5") == [0.75, 0.5]
    assert parse_acceptance_profile(None) is None
    with pytest.raises(SystemExit, match="--acceptance-profile"):
        parse_acceptance_profile("0.7,high")
    with pytest.raises(SystemExit, match="--acceptance-profile"):
        parse_acceptance_profile("0.7,1.2")
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    args = p.parse_args(["--perf", "--step-costs", "70b", "--device", "cpu"])
    with pytest.raises(SystemExit, match="--step-costs: unknown shape '70b'"):
        run_step_costs(args, lambda *a: None)
    args = p.parse_args(["--perf", "--step-costs", "smollm2", "--dtype", "int8", "--device", "cpu"])
    with pytest.raises(SystemExit, match="--dtype 'int8'"):
        run_step_costs(args, lambda *a: None)
    args = p.parse_args(["--perf", "--step-costs", "smollm2", "--step-cost-batch", "0", "--device", "cpu"])
    with pytest.raises(SystemExit, match="--step-cost-batch 0"):
        run_step_costs(args, lambda *a: None)


def test_gpu_busy_time_is_the_union_of_kernel_intervals():
    from eagle_zoo.perf_steps import _busy_us

    assert _busy_us([]) == 0.0
    assert _busy_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17.0  # overlaps count once, gaps not at all
    assert _busy_us([(20, 25), (0, 10)]) == 15.0


def test_step_cost_tables_alone_never_load_the_target(tmp_path, monkeypatch):
    """--ks '' --batch-sizes '' and no head: only the random-weight tables run (a GPU machine
    without the target's weights can run them); the target is never built."""
    import json

    import eagle_zoo.engine.llm as llm_module
    from eagle_zoo import cli, perf_steps

    monkeypatch.setattr(llm_module, "LLM", lambda *a, **kw: pytest.fail("the target was loaded"))
    monkeypatch.setitem(perf_steps.SHAPES, "smollm2", TINY)  # the table's code path at a tiny size
    out = tmp_path / "perf.json"
    assert cli.main(["bench", "--perf", "--step-costs", "smollm2", "--step-cost-steps", "4", "--ks", "",
                     "--batch-sizes", "", "--tree", "2,2,4", "--device", "cpu", "--dtype", "float32",
                     "--acceptance-profile", "0.5", "--tput-k", "1", "--json", str(out)]) == 0
    (table,) = json.loads(out.read_text())["step_costs"]
    assert [r["strategy"] for r in table["rows"]] == ["plain", "chain", "tree"]
    assert table["projection"]["mean_acceptance_length"] == 1.5
    with pytest.raises(SystemExit, match="--ks: expected comma-separated integers"):
        cli.main(["bench", "--perf", "--ks", "three", "--step-costs", "", "--device", "cpu"])
