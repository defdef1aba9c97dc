"""`eagle-zoo bench --perf` on the embedded SmolLM2 (CPU, a few tokens): a configuration
that fails becomes a row with its error and the rows after it are still measured, and
the JSON holds every row (a GPU run that times out keeps what it measured)."""
from __future__ import annotations

import argparse
import json

import pytest

from eagle_zoo import bench
from eagle_zoo.perf import run_perf

pytestmark = pytest.mark.usefixtures("one_thread")


def test_perf_keeps_measuring_past_a_failing_config(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "perf.json"
    args = parser.parse_args(["--perf", "--device", "cpu", "--dtype", "float32", "--num-prompts", "1",
                              "--max-tokens", "4", "--ks", "1", "--eagle", str(tmp_path / "no-such-head"),
                              "--ngram", "--batch-sizes", "2", "--tput-waves", "2", "--num-iters", "2",
                              "--json", str(out)])
    assert run_perf(args) == 0
    report = json.loads(out.read_text())
    rows = {r["config"]: r for r in report["batch1"]}
    assert rows["plain"]["tokens_per_s"] > 0
    failed = [r for r in report["batch1"] if "error" in r]
    assert [r["config"] for r in failed] == [f"{tmp_path / 'no-such-head'} k=1"]
    assert "no-such-head" in failed[0]["error"]
    assert rows["ngram k=1"]["identical_to_plain"] == 1  # measured after the failure
    # the throughput row uses the first head (the missing one): plain is measured, the
    # speculative column reports its error
    (tput,) = report["throughput"]
    assert tput["plain"] > 0 and "speculative_error" in tput
    assert tput["batch"] == 2 and tput["requests"] == 4  # two waves of the batch size
    assert len(tput["plain_pass_seconds"]) == 2  # --num-iters rounds
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"')]
    assert [next(iter(p)) for p in printed[:3]] == ["batch1", "batch1", "batch1"]  # printed as measured


def perf_args(*argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_perf_takes_the_prompts_the_acceptance_benchmark_takes(tmp_path):
    """--dataset / --num-prompts / --per-category choose the same rows as without --perf
    (one of each of the dev set's 11 categories here); only the random-weight tables are
    asked for, so no model loads."""
    out = tmp_path / "perf.json"
    args = perf_args("--perf", "--device", "cpu", "--dataset", "dev", "--per-category", "1", "--num-prompts", "500",
                     "--ks", "", "--batch-sizes", "", "--step-costs", "", "--json", str(out))
    assert bench.run(args) == 0
    report = json.loads(out.read_text())
    categories = {row["category"] for row in bench.load_prompt_rows("dev", 500)}
    assert report["dataset"] == "dev" and report["per_category"] == 1
    assert report["prompts"] == len(categories) == 11


@pytest.mark.parametrize("argv, named", [
    (["--perf", "--max-num-seqs", "4"], "--max-num-seqs (with --perf: --batch-sizes)"),
    (["--perf", "--draft", "x", "--num-spec-tokens", "4"],
     "--draft (with --perf: --eagle / --eagle3), --num-spec-tokens (with --perf: --ks)"),
    (["--perf", "--by-category"], "--by-category"),
    (["--tree", "6,3,30"], "--tree"),
    (["--ks", "3", "--eagle3", "x"], "--eagle3, --ks"),
    (["--num-spec-tokens", "5"], "--num-spec-tokens"),  # no --draft / --method: plain decoding
    (["--draft-tp", "2", "--prompt-lookup-max", "3"], "--draft-tp, --prompt-lookup-max"),
])
def test_an_option_the_mode_does_not_read_is_refused_by_name(argv, named):
    with pytest.raises(SystemExit) as stop:
        bench.run(perf_args(*argv))
    assert str(stop.value).startswith(named + ": not read by ")


@pytest.mark.parametrize("argv, message", [
    (["--num-prompts", "0"], "--num-prompts 0: give at least 1"),
    (["--num-prompts", "-1"], "--num-prompts -1: give at least 1"),
    (["--max-tokens", "0"], "--max-tokens must be an integer >= 1"),
    (["--temperature", "-1"], "--temperature must be"),
    (["--json", "/no-such-dir/out.json"], "--json /no-such-dir/out.json: the directory /no-such-dir does not exist"),
    (["--plot", "/no-such-dir/p.png", "--draft", "x"], "--plot /no-such-dir/p.png: the directory /no-such-dir"),
    (["--perf", "--json", "/no-such-dir/out.json"], "--json /no-such-dir/out.json: the directory"),
    (["--dataset", "TMP/bin.jsonl"], "--dataset TMP/bin.jsonl: not UTF-8 text"),
])
def test_bad_values_are_refused_by_option_before_any_model_loads(monkeypatch, tmp_path, argv, message):
    # Results are written after the whole run: an output path that cannot be written is
    # refused first, as is a value that names no work; nothing is built before.
    monkeypatch.setattr(bench, "build_llm", lambda *a: pytest.fail("a model was built"))
    (tmp_path / "bin.jsonl").write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(SystemExit) as stop:
        bench.run(perf_args(*[a.replace("TMP", str(tmp_path)) for a in argv]))
    assert str(stop.value).startswith(message.replace("TMP", str(tmp_path)))
