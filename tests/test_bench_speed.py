"""`eagle-zoo bench`: speculative against plain decoding in one run, by category, and
--test's match of the run's setting against the catalog's measured records.

End to end on a tiny random Llama target with a character tokenizer (so llm.chat works)
and a random EAGLE-1 head; the grouping and timing logic also against a scripted LLM."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import engine_fixtures as ef
from eagle_zoo import bench, cli
from eagle_zoo.catalog import CatalogEntry, MeasuredRecord
from eagle_zoo.engine.metrics import SpecDecodingMetrics
from eagle_zoo.engine.outputs import RequestMetrics

pytestmark = pytest.mark.usefixtures("one_thread")

CHARS = list(" abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"-()\n")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Red."}, {"role": "user", "content": "Another one?"}]
ROWS = [
    {"prompt": "Write a poem about the sea.", "category": "writing"},
    {"messages": CHAT, "category": "chat"},
    {"prompt": "Write two lines on rain.", "category": "writing"},
    {"turns": ["Say hello.", "Say goodbye."], "category": "chat"},
    {"prompt": "Write a title.", "category": "writing"},
]


def write_char_tokenizer(directory) -> None:
    """One token per character (ids 3..), <unk> 0, <s> 1, </s> 2: fits the tiny target's
    128-token vocabulary; a chat template of the same characters."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {c: i + 3 for i, c in enumerate(CHARS)}
    assert len(vocab) <= ef.TINY_TARGET["vocab_size"]
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), "isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'][0] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}a: {% endif %}")
    fast.save_pretrained(directory)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    kind = ef.kind_of("llama")
    target = ef.write_target(root / "target", kind)
    write_char_tokenizer(target)
    head = ef.write_head(root / "head", kind, "eagle")
    dataset = root / "two_categories.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return SimpleNamespace(target=str(target), head=str(head), dataset=str(dataset))


def bench_args(tiny, out, *extra):
    return ["bench", "--model", tiny.target, "--method", "eagle", "--draft", tiny.head, "--dataset", tiny.dataset,
            "--num-prompts", "5", "--max-tokens", "10", "--max-num-seqs", "1", "--device", "cpu",
            "--dtype", "float32", "--json", str(out), *extra]


@pytest.fixture(scope="module")
def by_category(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.json"
    assert cli.main(bench_args(tiny, out, "--by-category")) == 0
    return json.loads(out.read_text())


# -- end to end on the tiny engine ----------------------------------------------------
def test_report_has_speed_up_plain_and_identical_outputs(by_category):
    spec, plain = by_category["speculative"], by_category["plain"]
    assert by_category["setting"] == {"dataset": by_category["setting"]["dataset"], "num_prompts": 5,
                                      "device": "cpu", "dtype": "float32", "batch": 1, "k": 3,
                                      "max_tokens": 10, "temperature": 0.0}
    assert spec["method"] == "eagle" and spec["num_prompts"] == plain["num_prompts"] == 5
    assert spec["mean_acceptance_length"] >= 1 and len(spec["acceptance_rates"]) == 3
    assert spec["tokens_per_second"] == pytest.approx(spec["generated_tokens"] / spec["seconds"])
    assert by_category["speedup"] == pytest.approx(spec["tokens_per_second"] / plain["tokens_per_second"])
    # greedy speculative decoding is lossless: every output as plain decoding's
    assert by_category["identical_outputs"] == by_category["num_prompts"] == 5


def test_categories_add_up_to_the_totals(by_category):
    rows = {r["category"]: r for r in by_category["by_category"]}
    assert list(rows) == ["writing", "chat"]  # in order of first appearance
    assert rows["writing"]["num_prompts"] == 3 and rows["chat"]["num_prompts"] == 2
    spec, plain = by_category["speculative"], by_category["plain"]
    for side, total in (("spec", spec), ("plain", plain)):
        assert sum(r[f"{side}_generated_tokens"] for r in rows.values()) == total["generated_tokens"]
        assert sum(r[f"{side}_seconds"] for r in rows.values()) == pytest.approx(total["seconds"])
    for r in rows.values():
        assert r["spec_tokens_per_second"] == pytest.approx(r["spec_generated_tokens"] / r["spec_seconds"])
        assert r["plain_tokens_per_second"] == pytest.approx(r["plain_generated_tokens"] / r["plain_seconds"])
        assert r["speedup"] == pytest.approx(r["spec_tokens_per_second"] / r["plain_tokens_per_second"])
        assert r["identical_outputs"] == r["num_prompts"]
    means = [r["mean_acceptance_length"] for r in rows.values()]
    assert min(means) - 1e-9 <= spec["mean_acceptance_length"] <= max(means) + 1e-9  # pooled over the drafts


def test_the_printed_summary_names_speed_and_categories(tiny, tmp_path, capsys):
    assert cli.main(bench_args(tiny, tmp_path / "r.json", "--by-category", "--num-prompts", "2")) == 0
    out = capsys.readouterr().out
    assert "speed-up:" in out and "plain:" in out and "identical outputs: 2/2" in out
    table = out[out.index("by category"):].splitlines()
    assert table[1].split() == ["category", "prompts", "accept", "spec", "tok/s", "plain", "tok/s", "speed-up",
                                "identical"]
    assert [line.split()[0] for line in table[2:4]] == ["writing", "chat"]
    assert table[2].split()[-1] == "1/1"


def test_share_outside_counts_the_tokens_the_draft_vocabulary_leaves_out():
    import torch

    in_vocab = torch.tensor([True, False, True, False])
    assert bench.share_outside([[0, 1, 2], [3, 3]], in_vocab) == pytest.approx(3 / 5)
    assert bench.share_outside([[0, 2]], in_vocab) == 0.0
    assert bench.share_outside([[], []], in_vocab) is None


def test_an_eagle3_head_reports_the_tokens_it_cannot_draft(tiny, by_category, tmp_path, capsys):
    """EAGLE-3 with a draft vocabulary of 40 of the target's 128 ids: the share of plain
    decoding's tokens outside it, overall and by category (their token-weighted mean);
    an EAGLE-1 head (the full vocabulary) has no such column."""
    head3 = ef.write_head(tmp_path / "head3", ef.kind_of("llama"), "eagle3", draft_vocab=40)
    out = tmp_path / "r3.json"
    args = bench_args(tiny, out, "--by-category")
    args[args.index("--method") + 1], args[args.index("--draft") + 1] = "eagle3", str(head3)
    assert cli.main(args) == 0
    report = json.loads(out.read_text())
    rows = report["by_category"]
    assert 0 <= report["outside_draft_vocab"] <= 1
    total = sum(r["plain_generated_tokens"] for r in rows)
    assert report["outside_draft_vocab"] == pytest.approx(
        sum(r["outside_draft_vocab"] * r["plain_generated_tokens"] for r in rows) / total)
    printed = capsys.readouterr().out
    assert "of plain decoding's tokens are outside the head's draft vocabulary (40 of 128 ids)" in printed
    assert printed[printed.index("by category"):].splitlines()[1].split()[-2:] == ["not", "draftable"]
    assert "outside_draft_vocab" not in by_category  # the EAGLE-1 head's report
    assert all("outside_draft_vocab" not in r for r in by_category["by_category"])


def test_a_run_without_a_draft_reports_plain_decoding_by_category(tiny, tmp_path):
    out = tmp_path / "plain.json"
    args = bench_args(tiny, out, "--by-category", "--num-prompts", "3")
    args = args[:args.index("--method")] + args[args.index("--method") + 4:]  # no --method, no --draft
    assert cli.main(args) == 0
    report = json.loads(out.read_text())
    assert "speculative" not in report and report["plain"]["num_prompts"] == 3
    rows = report["by_category"]
    assert [(r["category"], r["num_prompts"]) for r in rows] == [("writing", 2), ("chat", 1)]
    assert sum(r["plain_generated_tokens"] for r in rows) == report["plain"]["generated_tokens"]


def test_compare_plain_is_gone(tiny, tmp_path):
    with pytest.raises(SystemExit):
        cli.main(bench_args(tiny, tmp_path / "r.json", "--compare-plain"))


def test_by_category_needs_a_category_field(tiny, tmp_path):
    bare = tmp_path / "bare.jsonl"
    bare.write_text('{"prompt": "a"}\n')
    args = bench_args(tiny, tmp_path / "r.json", "--by-category")
    args[args.index("--dataset") + 1] = str(bare)
    with pytest.raises(SystemExit, match="--by-category: the rows of --dataset .*bare.jsonl have no 'category'"):
        cli.main(args)


# -- --test: the catalog record of the run's setting ------------------------------------
def _catalog(monkeypatch, tiny, *records):
    entry = CatalogEntry(id=tiny.head, method="eagle", family="llama", target="acme/Tiny", format="yuhuili-eagle",
                         measured=tuple(records))
    monkeypatch.setattr(bench, "catalog_entry", lambda draft: {tiny.head: entry}.get(draft))


def _record(setting, acceptance, **extra):
    return MeasuredRecord(**setting, acceptance_length=acceptance, **extra)


def test_test_passes_fails_and_reports_the_speed_up_against_the_matching_record(
        tiny, by_category, monkeypatch, tmp_path, capsys):
    setting = by_category["setting"]
    measured = by_category["speculative"]["mean_acceptance_length"]
    other = dict(setting, batch=64)
    _catalog(monkeypatch, tiny, _record(other, 9.0), _record(setting, measured, speedup=1.5))
    out = tmp_path / "r.json"
    assert cli.main(bench_args(tiny, out, "--by-category", "--test")) == 0
    text = capsys.readouterr().out
    assert f"vs catalog {measured:.3f}" in text and "PASS" in text and "recorded 1.50x (reported, not checked)" in text
    report = json.loads(out.read_text())["test"]
    assert report["passed"] and report["record"]["batch"] == 1

    _catalog(monkeypatch, tiny, _record(setting, measured * 1.5))
    assert cli.main(bench_args(tiny, out, "--by-category", "--test")) == 1
    assert "FAIL" in capsys.readouterr().out


def test_test_without_a_matching_record_names_both_settings_and_exits_2(tiny, by_category, monkeypatch, tmp_path,
                                                                         capsys):
    setting = by_category["setting"]
    _catalog(monkeypatch, tiny, _record(dict(setting, device="cuda", dtype="bfloat16"), 2.0))
    assert cli.main(bench_args(tiny, tmp_path / "r.json", "--test")) == 2
    err = capsys.readouterr().err
    assert "no measured record" in err and "matches this run's setting" in err
    assert "run:      dataset=" in err and "device=cpu, dtype=float32, batch=1, k=3, max_tokens=10" in err
    assert "device=cuda, dtype=bfloat16, batch=1" in err and "--max-num-seqs" in err
    assert not (tmp_path / "r.json").exists()  # nothing was decoded

    _catalog(monkeypatch, tiny)
    assert cli.main(bench_args(tiny, tmp_path / "r.json", "--test")) == 2
    assert "(none)" in capsys.readouterr().err


def test_test_needs_a_draft(tiny, tmp_path):
    args = [a for a in bench_args(tiny, tmp_path / "r.json", "--test") if a not in ("--method", "eagle")]
    args = args[:args.index("--draft")] + args[args.index("--draft") + 2:]
    with pytest.raises(SystemExit, match="--test needs a draft head"):
        cli.main(args)


# -- the grouping and timing logic against a scripted LLM ----------------------------------
class ScriptedLLM:
    """llm.chat's interface: answers each conversation with (number of messages) tokens
    and counts one draft with one accepted token per answer token."""

    def __init__(self):
        self.engine = SimpleNamespace(metrics=SpecDecodingMetrics(num_speculative_tokens=2))
        self.sent = []

    def chat(self, conversations, params, use_tqdm=False):
        self.sent.append(conversations)
        outs = []
        for c in conversations:
            ids = list(range(len(c)))
            self.engine.metrics.observe([2] * len(ids), [1] * len(ids))
            now = 0.010 * len(outs)  # requests one after another, 10 ms each
            metrics = RequestMetrics(arrival_time=now, first_scheduled_time=now + 0.001, first_token_time=now + 0.003,
                                     finished_time=now + 0.010)
            outs.append(SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, text="x" * len(ids))],
                                        metrics=metrics))
        return outs


def test_measure_sends_messages_whole_and_times_each_category_as_a_batch(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    rows = bench.load_prompt_rows(str(path), 10)
    llm = ScriptedLLM()
    groups = bench.measure(llm, bench.group_rows(rows, by_category=True), params=None)
    assert [len(batch) for batch in llm.sent] == [3, 2]  # one chat call per category
    assert llm.sent[1][0] == CHAT  # the multi-turn row as it is
    assert llm.sent[1][1] == [{"role": "user", "content": "Say hello."}]
    assert [(g.category, g.num_prompts, g.generated_tokens) for g in groups] == [("writing", 3, 3), ("chat", 2, 5)]
    total = bench.BenchResult.from_groups(groups)
    assert total.generated_tokens == 8 and total.num_prompts == 5
    assert total.mean_acceptance_length == 2.0 and total.acceptance_rates == [1.0, 0.0]
    one = bench.measure(ScriptedLLM(), bench.group_rows(rows, by_category=False), params=None)
    assert len(one) == 1 and one[0].category is None and one[0].generated_tokens == 8
    for g in groups + one:  # the requests' scripted prefill (2 ms) and decoding (7 ms) times add up
        assert g.first_token_seconds == pytest.approx(0.002 * g.num_prompts)
        assert g.decode_seconds == pytest.approx(0.007 * g.num_prompts)


def test_measure_keeps_the_pass_of_median_time(monkeypatch):
    """--num-iters: each group is timed that many times and the median pass is kept whole
    (its seconds, tokens and acceptance counters), so one slow pass does not set the figure."""
    pass_seconds = iter([3.0, 1.0, 2.0, 5.0, 4.0])  # five passes of one group
    clock = {"now": 0.0, "start": True}

    def perf_counter():  # a pass's start, then its end after its scripted seconds
        if not clock["start"]:
            clock["now"] += next(pass_seconds)
        clock["start"] = not clock["start"]
        return clock["now"]

    class CountingLLM(ScriptedLLM):  # pass n (from 0) answers with n + 1 tokens a request
        def chat(self, conversations, params, use_tqdm=False):
            return super().chat([c + [c[-1]] * len(self.sent) for c in conversations], params)

    monkeypatch.setattr(bench.time, "perf_counter", perf_counter)
    rows = [{"messages": [{"role": "user", "content": "hi"}], "category": None}] * 2
    llm = CountingLLM()
    [kept] = bench.measure(llm, bench.group_rows(rows, by_category=False), params=None, num_iters=5)
    assert len(llm.sent) == 5
    assert kept.seconds == 3.0  # the median of 3, 1, 2, 5, 4
    assert kept.outputs == [[0]] * 2 and kept.num_drafts == 2  # the first pass's (one token a request): 3 s
    pass_seconds = iter([2.0, 1.0])
    [kept] = bench.measure(CountingLLM(), bench.group_rows(rows, by_category=False), params=None, num_iters=2)
    assert kept.seconds == 1.0  # of two, the faster
    with pytest.raises(ValueError, match="num_iters=0"):
        bench.measure(CountingLLM(), bench.group_rows(rows, by_category=False), params=None, num_iters=0)


def test_rounds_alternate_between_the_engines():
    """Each round times every engine once, in turn, so a slow spell hits both sides."""
    order = []

    class Named(ScriptedLLM):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def chat(self, conversations, params, use_tqdm=False):
            order.append(self.name)
            return super().chat(conversations, params)

    rows = [{"messages": [{"role": "user", "content": "hi"}], "category": c} for c in ("a", "b")]
    spec, plain = bench.measure_rounds([Named("spec"), Named("plain")], bench.group_rows(rows, by_category=True),
                                       params=None, num_iters=3)
    assert order == ["spec", "spec", "plain", "plain"] * 3  # its two categories, then the other engine's
    assert [len(g.pass_seconds) for g in spec + plain] == [3] * 4


def test_num_iters_holds_both_engines_and_reports_every_pass(tiny, tmp_path):
    out = tmp_path / "r.json"
    assert cli.main(bench_args(tiny, out, "--num-iters", "2")) == 0
    report = json.loads(out.read_text())
    [row] = report["by_category"]
    assert report["num_iters"] == 2 and report["identical_outputs"] == 5
    assert len(row["spec_pass_seconds"]) == 2 and len(row["plain_pass_seconds"]) == 2
    assert min(row["plain_pass_seconds"]) == pytest.approx(row["plain_seconds"])  # of two, the faster


def test_num_iters_below_one_or_with_tensor_parallel_is_refused_by_name(tiny, tmp_path):
    with pytest.raises(SystemExit, match="--num-iters 0"):
        cli.main(bench_args(tiny, tmp_path / "r.json", "--num-iters", "0"))
    with pytest.raises(SystemExit, match="--num-iters 2 with --tp 2"):
        cli.main(bench_args(tiny, tmp_path / "r.json", "--num-iters", "2", "--tp", "2"))


def test_covered_adds_intervals_one_after_another_and_counts_overlaps_once():
    assert bench.covered([(0.0, 1.0), (2.0, 3.5)]) == 2.5  # one request after another
    assert bench.covered([(0.0, 2.0), (1.0, 3.0), (1.5, 2.5)]) == 3.0  # concurrent requests
    assert bench.covered([(4.0, 5.0), (0.0, 1.0), (None, 9.0), (6.0, None)]) == 2.0  # unfinished ones left out


def test_phases_split_first_token_from_decoding():
    spec = bench.GroupResult("c", num_prompts=2, generated_tokens=202, seconds=1.0, first_token_seconds=0.04,
                             decode_seconds=0.5)
    plain = bench.GroupResult("c", num_prompts=2, generated_tokens=202, seconds=1.6, first_token_seconds=0.04,
                              decode_seconds=1.0)
    p = bench.phases(spec, plain)
    assert p["spec_first_token_ms"] == pytest.approx(20.0) and p["plain_first_token_ms"] == pytest.approx(20.0)
    assert p["spec_decode_tokens_per_second"] == pytest.approx(400.0) and p["decode_speedup"] == pytest.approx(2.0)
    total = bench.GroupResult.total([spec, plain])
    assert (total.num_prompts, total.first_token_seconds, total.decode_seconds) == (4, pytest.approx(0.08), 1.5)


# -- make demo -------------------------------------------------------------------------------
def _dev(monkeypatch, tmp_path, rows):
    """A placeholder for eagle_zoo/data/dev.jsonl (None: the package has none)."""
    data = tmp_path / "eagle_zoo" / "data"
    data.mkdir(parents=True, exist_ok=True)
    if rows is not None:
        (data / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(bench, "package_files", lambda: tmp_path / "eagle_zoo")


def test_demo_takes_the_shortest_early_prompt_of_each_dev_category(monkeypatch, tmp_path):
    """One prompt per category, in the set's order of categories: the shortest of the
    category's first DEV_CANDIDATES (a later, shorter one is not looked at)."""
    from eagle_zoo import demo

    late = [{"prompt": "Write a poem about the sea, now much longer than before.", "category": "writing"}] * 3
    _dev(monkeypatch, tmp_path, [ROWS[0]] + late + ROWS[1:] + [{"prompt": "2 + 2?", "category": "math"}])
    source, rows = demo.demo_rows()
    assert "dev set" in source and demo.DEV_CANDIDATES == 5
    assert [(r["category"], r["prompt"]) for r in rows] == [
        ("writing", "Write two lines on rain."), ("chat", "Say hello."), ("math", "2 + 2?")]
    _dev(monkeypatch, tmp_path, [ROWS[1], ROWS[3]])
    assert demo.demo_rows()[1][0]["messages"] == [{"role": "user", "content": "Say hello."}]
    _dev(monkeypatch, tmp_path, ROWS + [{"prompt": "2 + 2?", "category": "math"}])
    assert len(demo.demo_rows(limit=2)[1]) == 2


def test_demo_falls_back_to_built_in_prompts_of_six_kinds(monkeypatch, tmp_path):
    from eagle_zoo import demo

    _dev(monkeypatch, tmp_path, None)
    source, rows = demo.demo_rows()
    assert source == "built-in prompts of different kinds"
    assert [r["category"] for r in rows] == ["chat", "writing", "code", "math", "translation", "summarization"]
    assert len(rows[0]["messages"]) == 3 and rows[0]["prompt"] == rows[0]["messages"][-1]["content"]
    assert all(r["messages"][-1] == {"role": "user", "content": r["prompt"]} for r in rows)


def test_demo_prints_per_prompt_and_overall_speed_up(tiny, monkeypatch, tmp_path, capsys):
    from eagle_zoo import demo

    _dev(monkeypatch, tmp_path, ROWS)
    monkeypatch.setattr(demo, "DEFAULT_TARGET", tiny.target)
    monkeypatch.setattr(demo, "MAX_MODEL_LEN", 256)  # the tiny target's context
    monkeypatch.setattr(demo, "speculative_config",
                        lambda draft, k: {"model": draft, "method": "eagle", "num_speculative_tokens": k})
    args = SimpleNamespace(num_prompts=None, max_tokens=8, num_speculative_tokens=2, draft=tiny.head, num_iters=2)
    assert demo.run(args) == 0  # every output identical to plain decoding's
    out = capsys.readouterr().out
    assert "the median of 2 rounds each" in out
    table = out[out.index("== results (k=2)"):].splitlines()[1:]
    assert table[0].split() == ["category", "accept", "first", "token", "s", "spec", "tok/s", "plain", "tok/s",
                                "speed-up", "end", "to", "end", "identical"]
    rows = [line.split() for line in table[1:4]]
    assert [r[0] for r in rows] == ["writing", "chat", "overall"]
    assert [r[-1] for r in rows] == ["y", "y", "2/2"]
    for r in rows:  # first-token seconds spec / plain, decode tok/s, the decode and end-to-end ratios
        assert r[3] == "/" and float(r[2]) > 0 and float(r[4]) > 0
        assert r[-3].endswith("x") and r[-2].endswith("x")
        assert float(r[-3][:-1]) == pytest.approx(float(r[5]) / float(r[6]), rel=0.02, abs=0.011)
    # the overall first-token time is the prompts' sum
    assert float(rows[2][2]) == pytest.approx(float(rows[0][2]) + float(rows[1][2]), abs=0.0011)


def test_demo_refuses_no_rounds_by_name():
    from eagle_zoo import demo

    with pytest.raises(SystemExit, match="--num-iters 0"):
        demo.run(SimpleNamespace(num_prompts=None, max_tokens=8, num_speculative_tokens=2, draft="x", num_iters=0))


def test_demo_with_an_eagle3_head_shows_the_tokens_it_cannot_draft(tiny, monkeypatch, tmp_path, capsys):
    """A draft vocabulary of 40 of 128 ids: a "not draftable" column, per prompt and
    overall (the token-weighted share over both prompts' plain outputs)."""
    from eagle_zoo import demo

    head3 = ef.write_head(tmp_path / "head3", ef.kind_of("llama"), "eagle3", draft_vocab=40)
    _dev(monkeypatch, tmp_path, ROWS)
    monkeypatch.setattr(demo, "DEFAULT_TARGET", tiny.target)
    monkeypatch.setattr(demo, "MAX_MODEL_LEN", 256)
    monkeypatch.setattr(demo, "speculative_config",
                        lambda draft, k: {"model": draft, "method": "eagle3", "num_speculative_tokens": k})
    assert demo.run(SimpleNamespace(num_prompts=None, max_tokens=8, num_speculative_tokens=2, draft=str(head3),
                                    num_iters=1)) == 0
    table = capsys.readouterr().out.split("== results (k=2)")[1].splitlines()[1:5]
    assert table[0].split()[-2:] == ["not", "draftable"]
    shares = [float(line.split()[-1].rstrip("%")) for line in table[1:4]]
    assert all(0 <= x <= 100 for x in shares)
    assert min(shares[:2]) - 0.05 <= shares[2] <= max(shares[:2]) + 0.05  # a token-weighted mean of the two


def test_a_spec_decode_py_command_line_runs_and_prints_its_summary(tiny, tmp_path, capsys):
    """vLLM's spec_decode.py flags, the dataset a local ShareGPT-style JSON list: the run
    prints the script's summary, whose counters are the report's, and announces that
    --enable-chunked-prefill does nothing here."""
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "Write a poem."}, {"from": "gpt", "value": "No."}]},
        {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Say hi."}]},
        {"conversations": [{"from": "human", "value": "Name a colour."}]},
    ]))
    out = tmp_path / "r.json"
    argv = ["bench", "--method", "eagle", "--model-dir", tiny.target, "--eagle-dir", tiny.head,
            "--num-spec-tokens", "3", "--tp", "1", "--draft-tp", "1", "--dataset-name", "sharegpt",
            "--dataset-path", str(sharegpt), "--num-prompts", "3", "--max-num-seqs", "1", "--temp", "0",
            "--top-p", "1.0", "--top-k", "-1", "--output-len", "8", "--print-output", "--enable-chunked-prefill",
            "--max-model-len", "96", "--device", "cpu", "--dtype", "float32", "--json", str(out)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    spec = report["speculative"]
    assert report["setting"]["max_tokens"] == 8 and spec["num_prompts"] == 3
    assert report["identical_outputs"] == 3
    assert "--enable-chunked-prefill: no effect here" in printed
    assert "--- [None] 'Say hi.'" in printed  # --print-output; the first human turn is sent
    d = spec["num_drafts"]
    assert d > 0 and spec["num_draft_tokens"] == 3 * d
    summary = printed[printed.index("total_num_output_tokens"):].splitlines()
    assert summary[:5] == [f"total_num_output_tokens: {spec['generated_tokens']}", f"num_drafts: {d}",
                           f"num_draft_tokens: {spec['num_draft_tokens']}",
                           f"num_accepted_tokens: {spec['num_accepted_tokens']}",
                           f"mean acceptance length: {1 + spec['num_accepted_tokens'] / d:.2f}"]
    assert summary[6:9] == [f"acceptance at token {i}: {r:.2f}" for i, r in enumerate(spec["acceptance_rates"])]


def test_dataset_flags_fold_into_dataset(tmp_path, capsys):
    def folded(**kw):
        args = SimpleNamespace(dataset=None, dataset_name=None, dataset_path=None)
        vars(args).update(kw)
        bench.resolve_dataset_flags(args)
        return args.dataset

    local = tmp_path / "p.jsonl"
    local.write_text('{"prompt": "a"}\n')
    assert folded(dataset_name="custom", dataset_path=str(local)) == str(local)
    assert folded(dataset_name="dev") == "dev" and folded(dataset_name="hf") == "mt-bench"
    assert folded(dataset_name="hf", dataset_path="philschmid/mt-bench") == "mt-bench"
    assert "shipped copy" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no such local file"):
        folded(dataset_name="hf", dataset_path="someone/some-set")
    with pytest.raises(SystemExit, match="not both"):
        folded(dataset="dev", dataset_name="dev")
    with pytest.raises(SystemExit, match="--dataset-name random"):
        folded(dataset_name="random")


def test_draft_quantization_reaches_the_speculative_config(tiny, tmp_path, capsys):
    """--draft-quantization fp8 is the speculative_config's quantization: on the CPU the LLM
    refuses it by name (it runs on CUDA only), so the flag is read, not dropped."""
    assert cli.main(bench_args(tiny, tmp_path / "r.json", "--draft-quantization", "fp8")) != 0
    assert "speculative_config quantization='fp8' runs on CUDA only" in capsys.readouterr().err


def test_perf_refuses_two_sources_of_the_heads_quantization(tiny, tmp_path):
    args = ["bench", "--perf", "--model", tiny.target, "--eagle", tiny.head, "--dataset", tiny.dataset,
            "--num-prompts", "2", "--device", "cpu", "--draft-quantization", "fp8",
            "--spec-options", '{"quantization": "fp8"}']
    with pytest.raises(SystemExit, match="--draft-quantization and --spec-options' quantization"):
        cli.main(args)
