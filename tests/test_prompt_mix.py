"""eagle_zoo.train.prompt_mix: the broad training prompts, the held-apart dev set, licenses
and the refusal of benchmark prompts."""
from __future__ import annotations

import gzip
import json
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from eagle_zoo.train.data import encode_prompt, read_prompts
from eagle_zoo.train.prompt_mix import CATEGORIES, BenchmarkGuard, build_mix, load_sources

SOURCES = Path(__file__).resolve().parents[1] / "plugins" / "eagle-zoo-smollm2-heads" / "training-data"


@pytest.fixture(scope="module")
def mix():
    return build_mix(SOURCES, train_caps={"retrieval_qa": 200})


def _keys(rec):
    return {(s["source"], str(s["id"])) for s in rec["sources"]}


def test_the_shipped_dev_set_is_what_the_sources_build(mix):
    _, dev = mix
    shipped = resources.files("eagle_zoo").joinpath("data/dev.jsonl").read_text(encoding="utf-8")
    assert [json.loads(line) for line in shipped.splitlines()] == dev


def test_dev_covers_every_category_and_shares_no_record_with_training(mix):
    train, dev = mix
    assert len(dev) >= 300
    assert Counter(r["category"] for r in dev) == {c: 30 for c in CATEGORIES}
    assert set(Counter(r["category"] for r in train)) == set(CATEGORIES)
    dev_records = set().union(*(_keys(r) for r in dev))
    train_records = set().union(*(_keys(r) for r in train))
    assert dev_records and train_records and not dev_records & train_records


def test_every_prompt_names_its_sources_and_their_licenses(mix):
    train, dev = mix
    for rec in train[:2000] + dev:
        assert rec["sources"] and all(s["license"] for s in rec["sources"])


def test_long_context_prompts_reach_thousands_of_words(mix):
    _, dev = mix
    longest = max(len(r["prompt"].split()) for r in dev if r["category"] == "retrieval_qa")
    shortest_summary = min(len(r["prompt"].split()) for r in dev if r["category"] == "summarization")
    assert longest > 1500 and shortest_summary >= 700


def test_multi_turn_chats_end_in_a_user_turn_and_encode(mix):
    _, dev = mix
    chat = next(r for r in dev if r["category"] == "chat")
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "user"]

    class Template:  # the chat template's job, spelt out: every turn, then the assistant's header
        chat_template = "stub"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

        def encode(self, text, add_special_tokens):
            return [ord(c) for c in text]

    ids = encode_prompt(chat, Template())
    assert "".join(map(chr, ids)).startswith("<user>" + chat["messages"][0]["content"] + "<assistant>")


def test_a_benchmark_question_is_refused():
    guard = BenchmarkGuard()
    mt_bench = json.loads(resources.files("eagle_zoo").joinpath("data/mt_bench.jsonl").read_text().splitlines()[0])
    question = mt_bench["turns"][0]
    assert guard.check("Please help. " + question.upper()) is not None
    assert guard.check("Write a poem about the sea.") is None


def _sources_copy(tmp_path, edit):
    for name in ("train_prompts", "questions", "multilingual_sentences", "long_passages"):
        rows = [json.loads(line) for line in gzip.open(SOURCES / f"{name}.jsonl.gz", "rt", encoding="utf-8")]
        rows = edit(name, rows)
        with gzip.open(tmp_path / f"{name}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return tmp_path


def test_a_source_holding_a_benchmark_prompt_stops_the_build(tmp_path):
    question = json.loads(resources.files("eagle_zoo").joinpath("data/mt_bench.jsonl").read_text()
                          .splitlines()[5])["turns"][0]

    def plant(name, rows):
        if name == "train_prompts":
            rows = rows[:300] + [{"id": 99999, "source": "gpteacher-roleplay", "prompt": question}]
        return rows if name != "long_passages" else rows[:60]

    with pytest.raises(ValueError, match="holds the benchmark question"):
        build_mix(_sources_copy(tmp_path, plant), train_caps={"retrieval_qa": 10})


def _fresh(path):
    path.mkdir()
    return path


def test_benchmark_sources_and_unlicensed_rows_are_refused(tmp_path):
    def rename(name, rows):
        if name == "questions":
            rows[0]["source"] = "gsm8k-test"
        return rows

    with pytest.raises(ValueError, match="'gsm8k-test' is a benchmark"):
        load_sources(_sources_copy(_fresh(tmp_path / "a"), rename))

    def unlicensed(name, rows):
        if name == "train_prompts":
            rows[0]["source"] = "somewhere"
        return rows

    with pytest.raises(ValueError, match="'somewhere' has no license recorded"):
        load_sources(_sources_copy(_fresh(tmp_path / "b"), unlicensed))


def test_read_prompts_checks_messages(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    with pytest.raises(ValueError, match=r"p\.jsonl:1: \"messages\" must be a list .* ending in a user turn"):
        read_prompts(path)


def test_read_prompts_names_the_option_that_gave_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^--add .*none\.jsonl: no such file"):
        read_prompts(tmp_path / "none.jsonl", option="--add")
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b'{"prompt": "\xff\xfe"}\n')
    with pytest.raises(ValueError, match=r"^--mix .*bin\.jsonl: not UTF-8 text"):
        read_prompts(binary, option="--mix")
