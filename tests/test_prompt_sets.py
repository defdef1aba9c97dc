"""eagle_zoo.bench.load_prompt_rows: the prompt sets bench, perf, demo and `eagle-zoo diagnose` read."""
from __future__ import annotations

import json

import pytest

from eagle_zoo.bench import load_prompt_rows, load_prompts


def test_shipped_mt_bench_has_80_first_turns_in_8_categories():
    rows = load_prompt_rows(None, 1000)
    assert len(rows) == 80 and len({r["category"] for r in rows}) == 8
    assert load_prompts(None, 3) == [r["prompt"] for r in rows[:3]]


def test_file_rows_take_the_first_turn_or_the_prompt(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"turns": ["first", "second"], "category": "math"}, {"prompt": "plain"}, {"prompt": "cut"}]) + "\n\n")
    assert load_prompt_rows(str(path), 2) == [{"prompt": "first", "category": "math"},
                                              {"prompt": "plain", "category": None}]


def test_a_row_without_a_prompt_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl line 2: expected a 'turns' or a string 'prompt'"):
        load_prompt_rows(str(path), 10)
    with pytest.raises(SystemExit, match="no such file"):
        load_prompt_rows(str(tmp_path / "missing.jsonl"), 1)


def test_diagnose_names_rows_without_a_category_after_their_set(tmp_path):
    from eagle_zoo.tools.diagnose import read_rows

    path = tmp_path / "self_instruct.jsonl"
    path.write_text('{"prompt": "a"}\n')
    name, rows = read_rows(str(path), 5)
    assert name == "self_instruct" and rows == [{"prompt": "a", "category": "self_instruct"}]
    assert read_rows("mt-bench", 80)[1][0]["category"] == "writing"
