"""Self-instruct prompts (`eagle-zoo train prompts`), reading prompt files, and pausing a
training run with --stop-after-seconds (CPU, seconds).

References nobody here wrote: the tokenizer's own apply_chat_template (the user turn's
position in the template), a hand-built word-level tokenizer + chat template on a tiny
random Llama (decode of crafted token lists is known word by word), json.dumps for the
prompt files, and the uninterrupted training run for a paused-and-resumed one.
"""
from __future__ import annotations

import json
import random
import re
import time

import pytest
import torch

from checkpoint_factory import write_peaked_target, write_target
from eagle_zoo.train.data import GenerateSettings, generate_data, read_prompts
from eagle_zoo.train.save import INFO_FILE
from eagle_zoo.train.synthesize import (SynthesizeSettings, clean_message, interleave, synthesize_prompts,
                                        user_turn_prefix, write_prompts)
from eagle_zoo.train.trainer import Trainer, TrainSettings

CPU = torch.device("cpu")
EOS = 2  # <|im_end|> in the tiny tokenizer, eos_token_id of the tiny target's config
SPECIALS = ["<pad>", "<|im_start|>", "<|im_end|>"]
WORDS = ["system", "user", "assistant"] + [f"w{i}" for i in range(6, 128)]  # ids 3..127: every id decodes
TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


pytestmark = pytest.mark.usefixtures("one_thread")


def word_tokenizer(chat_template=TEMPLATE):
    """A word-level tokenizer over the tiny target's 128 ids: decode joins words with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    assert len(vocab) == 128
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    if chat_template:
        fast.chat_template = chat_template
    return fast


def ids_of(text: str) -> list[int]:
    return [len(SPECIALS) + WORDS.index(w) for w in text.split()]


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    """A tiny random Llama with the word tokenizer and a ChatML-like template."""
    root = tmp_path_factory.mktemp("chat_target")
    write_target(root, num_hidden_layers=1, seed=3)
    word_tokenizer().save_pretrained(str(root))
    return root


# -- 1. the user-turn prefix ------------------------------------------------------------------
def _check_prefix(tok, messages):
    prefix = user_turn_prefix(tok)
    for text in messages:
        full = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                       add_generation_prompt=False, return_dict=False)
        turn = prefix + tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        assert list(full[:len(turn)]) == turn, text
    return prefix


def test_user_turn_prefix_on_smollm2(smol_tokenizer):
    tok = smol_tokenizer
    prefix = _check_prefix(tok, ["What is 2+2?", "Write a poem about the sea.", "x", "Übersetze: 你好"])
    text = tok.decode(prefix)
    assert text.endswith("<|im_start|>user\n"), repr(text)
    assert text.startswith("<|im_start|>system\n")  # the template's default system prompt comes first
    assert tok.convert_ids_to_tokens(prefix[-3]) == "<|im_start|>"  # then <|im_start|> user \n


def test_user_turn_prefix_on_a_word_tokenizer():
    tok = word_tokenizer()
    prefix = _check_prefix(tok, ["w6 w7 w8", "w100"])
    assert prefix == [1, len(SPECIALS) + WORDS.index("user")]


def test_no_chat_template_is_refused(smol_tokenizer):
    with pytest.raises(ValueError, match="chat template"):
        user_turn_prefix(word_tokenizer(chat_template=None))
    with pytest.raises(ValueError, match="tokenizer"):
        user_turn_prefix(None)
    tok = word_tokenizer(chat_template="{{ 'no messages here' }}")
    with pytest.raises(ValueError, match="does not place the user message"):
        user_turn_prefix(tok)


# -- 2. interleave ----------------------------------------------------------------------------
def test_interleave_round_robin():
    assert interleave([1, 2, 3], ["a", "b", "c"]) == [1, "a", 2, "b", 3, "c"]
    assert interleave([1, 2, 3, 4, 5], ["a"]) == [1, "a", 2, 3, 4, 5]
    assert interleave(["a"], [1, 2, 3], ["x", "y"]) == ["a", 1, "x", 2, "y", 3]
    assert interleave([], [1, 2]) == [1, 2] and interleave([1, 2], []) == [1, 2]
    assert interleave() == [] and interleave([], []) == []
    recs = [{"prompt": "p"}, {"prompt": "q"}]
    assert interleave(recs, [{"prompt": "m"}]) == [recs[0], {"prompt": "m"}, recs[1]]


def test_interleave_takes_several_from_a_source():
    assert interleave([1, 2, 3, 4, 5], ["a", "b"], take=[2, 1]) == [1, 2, "a", 3, 4, "b", 5]
    assert interleave([1], ["a", "b", "c"], take=[2, 1]) == [1, "a", "b", "c"]
    assert interleave([1, 2], ["a"], take=[1, 1]) == interleave([1, 2], ["a"])
    with pytest.raises(ValueError, match="one count >= 1 per source"):
        interleave([1], ["a"], take=[0, 1])


def test_interleave_keeps_falsy_items():
    # Records are dicts (never None), but an empty dict or 0 must not end a source early.
    assert interleave([{}, {"a": 1}], [0, 1]) == [{}, 0, {"a": 1}, 1]


# -- 3. filtering -----------------------------------------------------------------------------
def test_clean_message():
    assert clean_message("  hello there friend \n", 3) == "hello there friend"
    assert clean_message("hello there", 3) is None
    assert clean_message("   ", 1) is None
    assert clean_message("one", 1) == "one"


def _scripted_generate(monkeypatch, batches):
    """generate_batch returns the given rows (cycled per call); records its calls."""
    calls = []

    def fake(model, prompts, **kw):
        calls.append((prompts, kw))
        rows = batches[min(len(calls), len(batches)) - 1]
        return [list(r) for r in rows[:len(prompts)]]

    monkeypatch.setattr("eagle_zoo.train.generate.generate_batch", fake)
    return calls


def test_filters_drop_unfinished_short_and_duplicate_messages(chat_target, monkeypatch):
    first = [                                  # num 3 -> 6 rows asked for
        ids_of("w6 w7 w8") + [EOS],            # kept
        ids_of("w6 w7 w8 w9"),                 # cut by the length limit (no EOS): dropped
        ids_of("w10 w11") + [EOS],             # 2 words < 3: dropped
        ids_of("w6 w7 w8") + [EOS],            # duplicate: dropped
        [],                                    # nothing at all: unfinished
        ids_of("w20 w21 w22 w23") + [EOS],     # kept
    ]
    second = [                                 # 1 missing -> 2 rows asked for
        [1] + ids_of("w30 w31") + [EOS],       # the special token is not text: 2 words, too short
        ids_of("w40 w41 w42") + [EOS],         # kept: 3 reached
    ]
    calls = _scripted_generate(monkeypatch, [first, second, [[EOS]] * 64])
    s = SynthesizeSettings(num=3, max_new_tokens=7, temperature=0.7, top_p=0.9, batch_size=64, min_words=3)
    records, stats = synthesize_prompts(str(chat_target), s, CPU, torch.float32, log=lambda *a: None)
    assert [r["prompt"] for r in records] == ["w6 w7 w8", "w20 w21 w22 w23", "w40 w41 w42"]
    assert [r["id"] for r in records] == ["self-instruct-0", "self-instruct-1", "self-instruct-2"]
    assert all(r["source"] == "self-instruct" for r in records)
    assert stats["unfinished"] == 2 and stats["too_short"] == 2 and stats["duplicates"] == 1
    assert stats["generated"] == 8 and not stats["stopped_by_time_budget"]
    # Every row is the user-turn prefix; the settings reach the sampler.
    assert [len(p) for p, _ in calls] == [6, 2]
    user_prefix = [1, len(SPECIALS) + WORDS.index("user")]
    assert all(p == user_prefix for prompts, _ in calls for p in prompts)
    kw = calls[0][1]
    assert kw["max_new_tokens"] == 7 and kw["temperature"] == 0.7 and kw["top_p"] == 0.9
    assert EOS in set(kw["eos_token_ids"])


def test_openers_start_each_row_in_turn(chat_target, monkeypatch):
    """--openers: row r of the run starts its user message with opener r mod len (token
    ids after the user-turn prefix), and the kept prompt is the opener plus its continuation."""
    rows = [ids_of("w20 w21") + [EOS], ids_of("w22 w23") + [EOS], ids_of("w24") + [EOS], ids_of("w25 w26") + [EOS]]
    calls = _scripted_generate(monkeypatch, [rows[:3], rows[3:] + [[EOS]]])
    s = SynthesizeSettings(num=3, max_new_tokens=7, batch_size=3, min_words=3, openers=("w6", "w7 w8"))
    records, stats = synthesize_prompts(str(chat_target), s, CPU, torch.float32, log=lambda *a: None)
    user_prefix = [1, len(SPECIALS) + WORDS.index("user")]
    assert calls[0][0] == [user_prefix + ids_of("w6"), user_prefix + ids_of("w7 w8"), user_prefix + ids_of("w6")]
    # the turn goes on across batches (1 missing -> 2 rows asked for; the first one is kept)
    assert calls[1][0] == [user_prefix + ids_of("w7 w8"), user_prefix + ids_of("w6")]
    # "w6 w24" has 2 words: too short, the opener counting as words of the message
    assert [r["prompt"] for r in records] == ["w6 w20 w21", "w7 w8 w22 w23", "w7 w8 w25 w26"]
    assert stats["too_short"] == 1 and stats["generated"] == 4


def test_a_star_opener_is_a_free_row(chat_target, monkeypatch):
    """--openers "*,w6": every other row is the bare user-turn prefix (the target writes the
    whole message), the others start with w6."""
    rows = [ids_of("w20 w21 w22") + [EOS], ids_of("w23 w24") + [EOS]]
    calls = _scripted_generate(monkeypatch, [rows])
    s = SynthesizeSettings(num=2, max_new_tokens=7, batch_size=2, min_words=3, openers=("*", "w6"))
    records, _ = synthesize_prompts(str(chat_target), s, CPU, torch.float32, log=lambda *a: None)
    user_prefix = [1, len(SPECIALS) + WORDS.index("user")]
    assert calls[0][0] == [user_prefix, user_prefix + ids_of("w6")]
    assert [r["prompt"] for r in records] == ["w20 w21 w22", "w6 w23 w24"]


def test_an_opener_without_tokens_is_refused(chat_target):
    s = SynthesizeSettings(num=1, openers=("w6", ""))
    with pytest.raises(ValueError, match="--openers.*encodes to no tokens"):
        synthesize_prompts(str(chat_target), s, CPU, torch.float32, log=lambda *a: None)


def test_duplicates_ignore_case_and_spacing(chat_target, monkeypatch):
    # The word tokenizer cannot make case/spacing variants, so the decode is scripted too.
    from eagle_zoo.engine import model_loader

    texts = {10: "Tell me a joke", 11: "tell  me a   JOKE ", 12: "Tell me a story", 13: "tell me a story please"}
    real_load = model_loader.load_model

    def load(*a, **kw):
        loaded = real_load(*a, **kw)
        loaded.tokenizer.decode = lambda ids, skip_special_tokens=False: texts[ids[0]]
        return loaded

    monkeypatch.setattr(model_loader, "load_model", load)
    _scripted_generate(monkeypatch, [[[10, EOS], [11, EOS], [12, EOS], [13, EOS]]])
    s = SynthesizeSettings(num=10, batch_size=4, min_words=3)
    records, stats = synthesize_prompts(str(chat_target), s, CPU, torch.float32, log=lambda *a: None)
    assert [r["prompt"] for r in records] == ["Tell me a joke", "Tell me a story", "tell me a story please"]
    assert stats["duplicates"] == 1 + 4  # the second batch (same rows) adds nothing: stop


def test_stops_when_a_batch_adds_nothing_and_on_the_time_budget(chat_target, monkeypatch):
    same = [ids_of("w6 w7 w8") + [EOS]] * 4
    calls = _scripted_generate(monkeypatch, [same])
    logs = []
    s = SynthesizeSettings(num=100, batch_size=4, min_words=3)
    records, _ = synthesize_prompts(str(chat_target), s, CPU, torch.float32, log=logs.append)
    assert len(records) == 1 and len(calls) == 2 and "no new prompt" in logs[-1]

    # A budget already spent never stops the first batch, but stops the second.
    fresh = [[ids_of(f"w{6 + i} w{7 + i} w{8 + i}") + [EOS] for i in range(j, j + 4)] for j in (0, 40)]
    calls = _scripted_generate(monkeypatch, fresh)
    s = SynthesizeSettings(num=100, batch_size=4, min_words=3, max_seconds=0.0)
    records, stats = synthesize_prompts(str(chat_target), s, CPU, torch.float32, log=lambda *a: None)
    assert len(calls) == 1 and len(records) == 4 and stats["stopped_by_time_budget"]


def test_real_sampling_on_the_tiny_target(chat_target):
    """No scripting: the tiny target samples user turns after the prefix. Whatever it
    keeps must be the decode of a finished, long-enough, new message."""
    s = SynthesizeSettings(num=4, max_new_tokens=40, temperature=1.0, batch_size=64, min_words=1, seed=0)
    records, stats = synthesize_prompts(str(chat_target), s, CPU, torch.float32, log=lambda *a: None)
    assert stats["generated"] >= 8 and records  # seed 0 on CPU: some messages finish
    assert stats["generated"] == stats["unfinished"] + stats["too_short"] + stats["duplicates"] + len(records)
    for r in records:
        words = r["prompt"].split()
        assert words and all(w in WORDS for w in words), r  # special tokens are never in the text
    assert len({r["prompt"] for r in records}) == len(records)


# -- 4. the CLI -------------------------------------------------------------------------------
def _cli_rows():
    return [ids_of(f"w{10 + i} w{40 + i} w{80 + i}") + [EOS] for i in range(16)]


def test_cli_writes_prompts_mixed_with_another_file(chat_target, tmp_path, monkeypatch, capsys):
    from eagle_zoo.cli import main

    calls = _scripted_generate(monkeypatch, [_cli_rows()])
    mix = tmp_path / "mix.jsonl"
    mix.write_text("".join(json.dumps({"id": f"m{i}", "prompt": f"mixed prompt {i}"}) + "\n" for i in range(2)))
    out = tmp_path / "sub" / "synth.jsonl"
    rc = main(["train", "prompts", "--target", str(chat_target), "--out", str(out), "--num", "4", "--mix", str(mix),
               "--max-new-tokens", "9", "--temperature", "0.8", "--top-p", "0.95", "--min-words", "3",
               "--batch-size", "5", "--device", "cpu", "--dtype", "float32", "--no-progress"])
    assert rc == 0
    back = read_prompts(out)
    synth = [{"id": f"self-instruct-{i}", "source": "self-instruct", "prompt": f"w{10 + i} w{40 + i} w{80 + i}"}
             for i in range(4)]
    mixed = [{"id": "m0", "prompt": "mixed prompt 0"}, {"id": "m1", "prompt": "mixed prompt 1"}]
    assert back == [synth[0], mixed[0], synth[1], mixed[1], synth[2], synth[3]]
    assert "wrote 4 self-instruct prompts interleaved with 2" in capsys.readouterr().out
    assert len(calls[0][0]) == 5 and calls[0][1]["max_new_tokens"] == 9 and calls[0][1]["top_p"] == 0.95
    # --mix-every 2 and --openers: two new prompts per mixed one, each starting with its opener
    calls.clear()
    rc = main(["train", "prompts", "--target", str(chat_target), "--out", str(out), "--num", "4", "--mix", str(mix),
               "--mix-every", "2", "--openers", "w6, w7", "--min-words", "3", "--batch-size", "5", "--device", "cpu",
               "--dtype", "float32", "--no-progress"])
    assert rc == 0
    user_prefix = [1, len(SPECIALS) + WORDS.index("user")]
    assert calls[0][0][:3] == [user_prefix + ids_of("w6"), user_prefix + ids_of("w7"), user_prefix + ids_of("w6")]
    prompts = [r["prompt"] for r in read_prompts(out)]
    assert prompts == ["w6 w10 w40 w80", "w7 w11 w41 w81", "mixed prompt 0", "w6 w12 w42 w82", "w7 w13 w43 w83",
                       "mixed prompt 1"]


def test_cli_without_mix_and_on_real_sampling(chat_target, tmp_path):
    from eagle_zoo.cli import main

    out = tmp_path / "synth.jsonl"
    rc = main(["train", "prompts", "--target", str(chat_target), "--out", str(out), "--num", "2",
               "--max-new-tokens", "40", "--min-words", "1", "--batch-size", "32", "--device", "cpu",
               "--dtype", "float32", "--no-progress"])
    assert rc == 0  # seed 0 on CPU: two messages of the random target end with <|im_end|>
    back = read_prompts(out)
    assert len(back) == 2 and all(r["source"] == "self-instruct" and r["prompt"].split() for r in back)


@pytest.mark.parametrize("args, option", [
    (["--temperature", "0"], "--temperature"), (["--num", "0"], "--num"), (["--num", "-3"], "--num"),
    (["--mix-every", "0"], "--mix-every")])
def test_cli_refuses_bad_options(chat_target, tmp_path, monkeypatch, args, option):
    from eagle_zoo.cli import main

    calls = _scripted_generate(monkeypatch, [_cli_rows()])
    with pytest.raises(SystemExit) as info:
        main(["train", "prompts", "--target", str(chat_target), "--out", str(tmp_path / "o.jsonl"),
              "--device", "cpu", *args])
    assert str(info.value).startswith(option), info.value
    assert not calls and not (tmp_path / "o.jsonl").exists()


def test_cli_openers_file_is_one_opener_a_line(chat_target, tmp_path, monkeypatch):
    """--openers-file: the same turn-taking as --openers, one opener a line, blank lines
    skipped, * a free row."""
    from eagle_zoo.cli import main

    calls = _scripted_generate(monkeypatch, [_cli_rows()])
    openers = tmp_path / "openers.txt"
    openers.write_text("w6 w7\n\n*\n  w8  \n")
    out = tmp_path / "o.jsonl"
    rc = main(["train", "prompts", "--target", str(chat_target), "--out", str(out), "--num", "3",
               "--openers-file", str(openers), "--min-words", "3", "--batch-size", "4", "--device", "cpu",
               "--dtype", "float32", "--no-progress"])
    assert rc == 0
    user_prefix = [1, len(SPECIALS) + WORDS.index("user")]
    assert calls[0][0][:4] == [user_prefix + ids_of("w6 w7"), user_prefix, user_prefix + ids_of("w8"),
                               user_prefix + ids_of("w6 w7")]
    assert [r["prompt"] for r in read_prompts(out)] == ["w6 w7 w10 w40 w80", "w11 w41 w81", "w8 w12 w42 w82"]


def test_an_openers_file_keeps_commas(tmp_path):
    """A line is one opener, commas and all (what --openers cannot hold)."""
    from argparse import Namespace

    from eagle_zoo.train.cli import read_openers

    f = tmp_path / "openers.txt"
    f.write_text("In the field of optics,\r\n*\nCompare tea, coffee and\n")
    assert read_openers(Namespace(openers=None, openers_file=str(f))) == (
        "In the field of optics,", "*", "Compare tea, coffee and")
    assert read_openers(Namespace(openers="a, b", openers_file=None)) == ("a", "b")


@pytest.mark.parametrize("content, message", [(None, "cannot read it"), ("\n  \n", "no opener in it")])
def test_cli_refuses_a_bad_openers_file(chat_target, tmp_path, monkeypatch, content, message):
    from eagle_zoo.cli import main

    calls = _scripted_generate(monkeypatch, [_cli_rows()])
    openers = tmp_path / "openers.txt"
    if content is not None:
        openers.write_text(content)
    with pytest.raises(SystemExit) as info:
        main(["train", "prompts", "--target", str(chat_target), "--out", str(tmp_path / "o.jsonl"),
              "--openers-file", str(openers), "--device", "cpu"])
    assert str(info.value).startswith(f"--openers-file {openers}: {message}"), info.value
    assert not calls and not (tmp_path / "o.jsonl").exists()


def test_cli_openers_and_openers_file_exclude_each_other(chat_target, tmp_path, capsys):
    from eagle_zoo.cli import main

    with pytest.raises(SystemExit):
        main(["train", "prompts", "--target", str(chat_target), "--out", str(tmp_path / "o.jsonl"),
              "--openers", "w6", "--openers-file", str(tmp_path / "x.txt")])
    assert "not allowed with argument" in capsys.readouterr().err


def test_cli_checks_the_mix_file_before_generating(chat_target, tmp_path, monkeypatch, capsys):
    from eagle_zoo.cli import main

    calls = _scripted_generate(monkeypatch, [_cli_rows()])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt field"}\n')
    assert main(["train", "prompts", "--target", str(chat_target), "--out", str(tmp_path / "o.jsonl"),
                 "--mix", str(bad), "--device", "cpu"]) == 2
    assert re.search(r"eagle-zoo train: error: .*bad\.jsonl:2", capsys.readouterr().err)
    assert not calls


# -- 5. prompt files with unusual line separators --------------------------------------------
def test_read_prompts_splits_on_newline_only(tmp_path):
    odd = "first part\u2028second part\u0085third\u2029fourth\x0cfifth\x1cend\r"
    records = [{"prompt": odd}, {"prompt": "plain"}]
    path = write_prompts(records, tmp_path / "p.jsonl")
    raw = path.read_text(encoding="utf-8")
    assert "\u2028" in raw and "\u0085" in raw  # written as is (ensure_ascii=False), not escaped
    assert read_prompts(path) == records

    # A broken line after it: the error names the real line (3), not a count of splitlines() pieces.
    path.write_text(raw + "{broken\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.jsonl:3: not valid JSON"):
        read_prompts(path)
    # Blank lines and CRLF line ends count as lines too.
    path.write_text(json.dumps({"prompt": odd}, ensure_ascii=False) + "\r\n\r\n" + '{"x": 1}\r\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.jsonl:3: each line needs"):
        read_prompts(path)


def test_read_prompts_limit_and_empty(tmp_path):
    path = write_prompts([{"prompt": f"p{i}\u2028x"} for i in range(5)], tmp_path / "p.jsonl")
    assert [r["prompt"] for r in read_prompts(path, limit=2)] == ["p0\u2028x", "p1\u2028x"]
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="no prompts"):
        read_prompts(tmp_path / "e.jsonl")


# -- 6. pausing a training run -----------------------------------------------------------------
@pytest.fixture(scope="module")
def train_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("pause")
    write_peaked_target(root / "target", num_hidden_layers=2, seed=1)
    rng = random.Random(0)
    records = [{"prompt_token_ids": [rng.randrange(3, 128) for _ in range(rng.randrange(3, 10))]} for _ in range(10)]
    data = generate_data(str(root / "target"), records, GenerateSettings(max_new_tokens=16, batch_size=10,
                                                                          backend="static"),
                         CPU, torch.float32, progress=False)
    data.save(root / "data")
    return root


def _settings(root, **kw):
    base = dict(method="eagle", target=str(root / "target"), data=[str(root / "data")], steps=4, token_budget=160,
                max_len=32, lr=3e-3, warmup_steps=1, seed=0, device="cpu", log_every=1000, progress=False,
                save_every=0)
    base.update(kw)
    return TrainSettings(**base)


@pytest.mark.parametrize("pause", [dict(stop_after_seconds=1e-9), dict(pause_at=1.0)], ids=["stop-after", "pause-at"])
def test_a_pause_and_resume_reproduce_the_run(train_root, tmp_path, pause):
    """--stop-after-seconds and --pause-at (a time long past) pause after the job's first step."""
    quiet = dict(log=lambda *a: None)
    option = "--stop-after-seconds" if "stop_after_seconds" in pause else "--pause-at"
    straight = Trainer(_settings(train_root), **quiet)
    straight.run()
    assert straight.step == 4 and len(straight.epoch_batches) < 4  # the plan spans epochs

    state = str(tmp_path / "state")
    steps = []
    for job in range(4):  # every job stops after its first step: four pauses
        t = Trainer(_settings(train_root, state_dir=state, resume=job > 0, **pause), **quiet)
        assert t.step == job
        result = t.run()
        steps.append(t.step)
        assert (tmp_path / "state" / "state.pt").is_file()
        if t.step < 4:
            assert result.info["paused"] and result.info["stop_reason"].startswith(option)
    assert steps == [1, 2, 3, 4]
    assert not result.info["paused"] and result.info["stop_reason"] == "steps"
    for name, p in straight.params.items():
        assert torch.equal(p, t.params[name]), name


@pytest.mark.parametrize("stop_after, pause_in, reason", [(None, 3600, "steps"), (1e-9, 3600, "--stop-after-seconds"),
                                                         (3600, -1, "--pause-at")])
def test_the_earlier_pause_wins(train_root, stop_after, pause_in, reason):
    """A pause still ahead lets the run end; of two pauses the earlier one stops it."""
    t = Trainer(_settings(train_root, stop_after_seconds=stop_after, pause_at=time.time() + pause_in),
                log=lambda *a: None)
    info = t.run().info
    assert info["stop_reason"].startswith(reason) and info["paused"] == (reason != "steps")
    assert t.step == (4 if reason == "steps" else 1)


def test_stop_file_ends_the_run_like_its_time_budget(train_root, tmp_path):
    stop = tmp_path / "stop"
    absent = Trainer(_settings(train_root, stop_file=str(stop)), log=lambda *a: None)
    assert absent.run().info["stop_reason"] == "steps" and absent.step == 4  # no file: the whole run

    stop.touch()
    stopped = Trainer(_settings(train_root, stop_file=str(stop)), log=lambda *a: None)
    result = stopped.run()
    assert stopped.step == 0 and result.info["stop_reason"] == f"--stop-file {stop}"
    assert not result.info["paused"]  # an end, not a pause: the head is final


def test_paused_time_counts_towards_max_seconds(train_root, tmp_path):
    state = str(tmp_path / "state")
    paused = Trainer(_settings(train_root, state_dir=state, max_seconds=1e6, stop_after_seconds=1e-9),
                     log=lambda *a: None)
    paused.run()
    assert paused.step == 1 and paused.elapsed > 0
    resumed = Trainer(_settings(train_root, state_dir=state, resume=True, max_seconds=1e6), log=lambda *a: None)
    assert resumed.elapsed == paused.elapsed  # the schedule's clock continues, not restarts
    # A budget the first job already used up: the resumed job stops at once.
    spent = Trainer(_settings(train_root, state_dir=state, resume=True, max_seconds=paused.elapsed / 2),
                    log=lambda *a: None)
    result = spent.run()
    assert spent.step == 1 and result.info["stop_reason"] == "time budget"


@pytest.mark.parametrize("pause", [["--stop-after-seconds", "1e-9"], ["--pause-at", "1"]], ids=["stop-after", "pause-at"])
def test_cli_pause_saves_the_head_and_resume_finishes(train_root, tmp_path, capsys, pause):
    from eagle_zoo.cli import main

    out = tmp_path / "head"
    args = ["train", "eagle", "--target", str(train_root / "target"), "--data", str(train_root / "data"),
            "--out", str(out), "--steps", "3", "--max-len", "32", "--token-budget", "160", "--device", "cpu",
            "--no-progress", "--no-verify"]
    assert main(args + pause) == 0
    first = json.loads((out / INFO_FILE).read_text())  # the head of the first job is saved, marked paused
    assert first["paused"] and first["steps"] == 1 and first["stop_reason"].startswith(pause[0])
    state = torch.load(tmp_path / "head.state" / "state.pt", map_location="cpu", weights_only=True)
    assert state["step"] == 1
    assert main(args + ["--resume"]) == 0
    final = json.loads((out / INFO_FILE).read_text())
    assert not final["paused"] and final["steps"] == 3 and final["stop_reason"] == "steps"
