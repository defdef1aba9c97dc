"""eagle_zoo.bench.load_prompt_rows: the prompt sets bench, perf, demo and `eagle-zoo diagnose` read."""
from __future__ import annotations

import json

import pytest

from eagle_zoo import bench
from eagle_zoo.bench import load_prompt_rows, load_prompts


def _user(text):
    return [{"role": "user", "content": text}]


def test_shipped_mt_bench_has_80_first_turns_in_8_categories():
    rows = load_prompt_rows(None, 1000)
    assert len(rows) == 80 and len({r["category"] for r in rows}) == 8
    assert load_prompts(None, 3) == [r["prompt"] for r in rows[:3]]
    assert load_prompt_rows("mt-bench", 2) == rows[:2]
    assert rows[0]["messages"] == _user(rows[0]["prompt"])


def test_file_rows_take_the_first_turn_or_the_prompt(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"turns": ["first", "second"], "category": "math"}, {"prompt": "plain"}, {"prompt": "cut"}]) + "\n\n")
    assert load_prompt_rows(str(path), 2) == [
        {"prompt": "first", "category": "math", "messages": _user("first")},
        {"prompt": "plain", "category": None, "messages": _user("plain")}]


def test_messages_rows_are_sent_whole(tmp_path):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "And in French?"}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": chat, "category": "multi-turn"}) + "\n")
    (row,) = load_prompt_rows(str(path), 5)
    assert row == {"prompt": "And in French?", "category": "multi-turn", "messages": chat}
    assert load_prompts(str(path), 5) == ["And in French?"]


@pytest.mark.parametrize("messages, message", [
    ([], "non-empty list"),
    ("hi", "non-empty list"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "last message must be the user's"),
    ([{"role": "robot", "content": "a"}], r"messages\[0\] must be"),
    ([{"role": "user", "content": 3}], r"messages\[0\] must be"),
])
def test_bad_messages_name_the_file_line_and_problem(tmp_path, messages, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n' + json.dumps({"messages": messages}) + "\n")
    with pytest.raises(SystemExit, match=r"bad\.jsonl line 2: .*" + message):
        load_prompt_rows(str(path), 10)


def test_a_row_without_a_prompt_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl line 2: expected a 'messages' list, a 'turns' list or a string 'prompt'"):
        load_prompt_rows(str(path), 10)
    path.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl line 2: not valid JSON"):
        load_prompt_rows(str(path), 10)
    with pytest.raises(SystemExit, match="no such file"):
        load_prompt_rows(str(tmp_path / "missing.jsonl"), 1)


def test_dev_names_the_shipped_dev_set(tmp_path, monkeypatch):
    """--dataset dev reads eagle_zoo/data/dev.jsonl; here a placeholder stands in for it."""
    data = tmp_path / "eagle_zoo" / "data"
    data.mkdir(parents=True)
    (data / "placeholder_dev.jsonl").write_text(json.dumps({"prompt": "Translate 'cat' to German.",
                                                            "category": "translation"}) + "\n")
    monkeypatch.setattr(bench, "DATASETS", {**bench.DATASETS, "dev": "data/placeholder_dev.jsonl"})
    monkeypatch.setattr(bench, "package_files", lambda: tmp_path / "eagle_zoo")
    assert load_prompt_rows("dev", 10) == [{"prompt": "Translate 'cat' to German.", "category": "translation",
                                            "messages": _user("Translate 'cat' to German.")}]
    monkeypatch.setattr(bench, "DATASETS", {**bench.DATASETS, "dev": "data/absent.jsonl"})
    with pytest.raises(SystemExit, match=r"--dataset dev: eagle_zoo/data/absent\.jsonl is not in this installation"):
        load_prompt_rows("dev", 10)


def test_diagnose_names_rows_without_a_category_after_their_set(tmp_path):
    from eagle_zoo.tools.diagnose import read_rows

    path = tmp_path / "self_instruct.jsonl"
    path.write_text('{"prompt": "a"}\n')
    name, rows = read_rows(str(path), 5)
    assert name == "self_instruct" and rows == [{"prompt": "a", "category": "self_instruct", "messages": _user("a")}]
    assert read_rows("mt-bench", 80)[1][0]["category"] == "writing"


def test_per_category_takes_the_first_rows_of_each_category(tmp_path):
    path = tmp_path / "set.jsonl"
    rows = [{"prompt": f"{c}{i}", "category": c} for i in range(4) for c in ("a", "b", "c")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_prompt_rows(str(path), 100, per_category=2)
    assert [r["prompt"] for r in got] == ["a0", "b0", "c0", "a1", "b1", "c1"]
    assert [r["prompt"] for r in load_prompt_rows(str(path), 4, per_category=2)] == ["a0", "b0", "c0", "a1"]
    dev = load_prompt_rows("dev", 10 ** 6, per_category=10)
    assert len(dev) == 110 and all(sum(r["category"] == c for r in dev) == 10 for c in {r["category"] for r in dev})


def test_per_category_is_refused_where_it_cannot_mean_anything(tmp_path):
    from eagle_zoo import cli

    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"prompt": "Hi."}) + "\n")
    with pytest.raises(SystemExit, match="--per-category 0: give at least 1"):
        cli.main(["bench", "--dataset", "dev", "--per-category", "0", "--device", "cpu"])
    with pytest.raises(SystemExit, match="--per-category: the rows of --dataset .* have no 'category'"):
        cli.main(["bench", "--dataset", str(plain), "--per-category", "2", "--device", "cpu"])
