"""Incremental detokenization (engine/detokenizer.py) against the tokenizer's own full decode.

The reference is ``tokenizer.decode(all ids so far, skip_special_tokens=True)`` after
every update, on the real SmolLM2 tokenizer (conftest's ``smol_tokenizer``: byte-level
BPE, the embedded default target) over random token streams fed in random chunk sizes
(an engine step appends 1..K+1 tokens): random vocabulary ids, special tokens,
multi-byte characters split across single-byte tokens, invalid UTF-8 bytes. Stop
strings are checked against the old semantics written out here: full decode, then cut
at the first stop string (in list order) found anywhere.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from eagle_zoo.engine.detokenizer import IncrementalDetokenizer, find_stop, update_sequence_text


def full(tok, ids):
    return tok.decode(ids, skip_special_tokens=True)


def byte_tokens(tok) -> list[int]:
    """Ids of the 256 single-byte tokens of the byte-level vocabulary (their decode
    alone is one byte: a piece of a multi-byte character, or invalid UTF-8)."""
    ids = []
    for t, i in tok.get_vocab().items():
        if len(t) == 1 and i not in tok.all_special_ids:
            ids.append(i)
    return ids


def streams(tok, n, seed):
    """Random token streams mixing: uniform vocabulary ids, specials, single-byte tokens
    and the encodings of multi-byte texts (emoji, CJK, accents), which byte-level BPE
    splits into partial characters."""
    rng = random.Random(seed)
    V, specials, singles = len(tok), list(tok.all_special_ids), byte_tokens(tok)
    assert len(singles) >= 200  # byte-level BPE: every byte has a token
    texts = ["😀 你好 héllo", "naïve café ✓", "🇫🇷 flag, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", " \n\t tabs  and  spaces", "日本語のテキスト"]
    encoded = [tok.encode(t, add_special_tokens=False) for t in texts]
    for _ in range(n):
        ids = []
        while len(ids) < rng.randint(1, 120):
            r = rng.random()
            if r < 0.45:
                ids.append(rng.randrange(V))
            elif r < 0.55:
                ids.append(rng.choice(specials))
            elif r < 0.80:
                ids.append(rng.choice(singles))
            else:
                e = rng.choice(encoded)
                a = rng.randrange(len(e))
                ids += e[a:a + rng.randint(1, 6)]
        yield ids


def chunks(ids, rng):
    i = 0
    while i < len(ids):
        j = min(len(ids), i + rng.randint(1, 5))
        yield ids[:j]
        i = j


def test_matches_full_decode_after_every_update(smol_tokenizer):
    rng = random.Random(1)
    windows = 0
    for ids in streams(smol_tokenizer, 300, seed=0):
        detok = IncrementalDetokenizer(smol_tokenizer)
        assert detok.incremental
        for prefix in chunks(ids, rng):
            text = detok.update(prefix)
            assert text == full(smol_tokenizer, prefix), prefix
            assert detok.stable_len <= len(text)
            assert detok.incremental  # never fell back to a full decode
        windows = max(windows, len(ids) - detok._start)
    # it really is incremental: the last window is short, not the whole stream
    assert windows < 60


def test_long_stream_decodes_short_windows(smol_tokenizer):
    """A 2000-token stream one token at a time: each update decodes a window of a few
    tokens (counted through a wrapper), not the whole output."""
    ids = smol_tokenizer.encode("The quick brown fox jumps over the lazy dog. 😀 你好! " * 100,
                                add_special_tokens=False)
    ids = ids[:2000]
    sizes = []

    class Counting:
        is_fast = True
        clean_up_tokenization_spaces = False

        def get_vocab(self):
            return smol_tokenizer.get_vocab()

        def decode(self, x, **kw):
            sizes.append(len(x))
            return smol_tokenizer.decode(x, **kw)

    detok = IncrementalDetokenizer(Counting())
    for n in range(1, len(ids) + 1):
        detok.update(ids[:n])
    assert detok.text == full(smol_tokenizer, ids)
    assert max(sizes) <= 16


def test_special_tokens_are_skipped_and_kept_when_asked(smol_tokenizer):
    im_start, im_end = smol_tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    ids = [im_start] + smol_tokenizer.encode("assistant\nHi 😀", add_special_tokens=False) + [im_end]
    for skip in (True, False):
        detok = IncrementalDetokenizer(smol_tokenizer, skip_special_tokens=skip)
        for n in range(1, len(ids) + 1):
            assert detok.update(ids[:n]) == smol_tokenizer.decode(ids[:n], skip_special_tokens=skip)


def test_shrinking_ids_is_an_error(smol_tokenizer):
    detok = IncrementalDetokenizer(smol_tokenizer)
    detok.update([100, 200, 300])
    with pytest.raises(ValueError, match="shrank"):
        detok.update([100])


def test_tokenizers_with_space_cleanup_decode_in_full(smol_tokenizer):
    """clean_up_tokenization_spaces rewrites across token boundaries (" ." -> "."): such
    tokenizers get a full decode per update, still equal to their own decode."""

    class CleanUp:
        is_fast = True
        clean_up_tokenization_spaces = True

        def get_vocab(self):
            return smol_tokenizer.get_vocab()

        def decode(self, x, skip_special_tokens=False):
            return smol_tokenizer.decode(x, skip_special_tokens=skip_special_tokens).replace(" .", ".")

    tok = CleanUp()
    ids = smol_tokenizer.encode("a . b . c .", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    assert not detok.incremental
    for n in range(1, len(ids) + 1):
        assert detok.update(ids[:n]) == tok.decode(ids[:n], skip_special_tokens=True)


def reference_text(tok, ids, stops, finished_before_text: bool):
    """The engine's former text step: full decode, cut at the first stop (list order)."""
    text = full(tok, ids)
    for stop in stops:
        cut = text.find(stop)
        if cut != -1 and not finished_before_text:
            return text[:cut], stop
    return text, None


def test_stop_strings_as_with_full_decode(smol_tokenizer):
    """update_sequence_text over random streams and stop strings (including multi-byte
    and ones spanning token and update boundaries) stops at the same update, with the
    same text and stop reason, as the full-decode reference."""
    rng = random.Random(2)
    stops_pool = ["e", "th", "😀", "你好", "\n", " the", "é", "zz", "ing ", ". "]
    stopped = 0
    for ids in streams(smol_tokenizer, 300, seed=3):
        stops = rng.sample(stops_pool, rng.randint(1, 3))
        seq = SimpleNamespace(detokenizer=None, output_token_ids=[], finish_reason=None, stop_reason=None,
                              output_text="", params=SimpleNamespace(stop=stops))
        got_at = None
        for prefix in chunks(ids, rng):
            seq.output_token_ids = prefix
            update_sequence_text(seq, smol_tokenizer)
            ref_text, ref_stop = reference_text(smol_tokenizer, prefix, stops, False)
            assert (seq.output_text, seq.stop_reason) == (ref_text, ref_stop), (prefix, stops)
            if seq.finish_reason is not None:
                got_at = len(prefix)
                break
        if got_at is not None:
            stopped += 1
            assert (seq.finish_reason, seq.stop_reason) == ("stop", ref_stop)
        else:
            assert seq.output_text == full(smol_tokenizer, ids)
    assert stopped > 50  # the stop strings were really exercised (93 of 300 with these seeds)


def test_no_stop_cut_once_finished(smol_tokenizer):
    """A sequence that already has a finish reason (EOS in the same step) keeps its text
    uncut, as before."""
    ids = smol_tokenizer.encode("hello world", add_special_tokens=False)
    seq = SimpleNamespace(detokenizer=None, output_token_ids=ids, finish_reason="stop", stop_reason=None,
                          output_text="", params=SimpleNamespace(stop=["world"]))
    update_sequence_text(seq, smol_tokenizer)
    assert seq.output_text == "hello world" and seq.stop_reason is None


@pytest.mark.parametrize("text, stops, start, want", [
    ("abcdef", ["cd"], 0, ("cd", 2)),
    ("abcdef", ["cd"], 3, ("cd", 2)),      # ends after the stable part: still new
    ("abcdef", ["cd"], 4, None),           # entirely inside the stable part: seen before
    ("abcdef", ["ef", "bc"], 0, ("ef", 4)),  # list order, not position order
    ("abc", ["x"], 0, None),
])
def test_find_stop(text, stops, start, want):
    assert find_stop(text, stops, start) == want


@pytest.fixture(scope="module")
def sentencepiece_style():
    """A Llama-2-style fast tokenizer built here (no download): '▁' word pieces, <0xNN>
    byte-fallback tokens, and the decoder chain Replace('▁', ' ') -> ByteFallback -> Fuse
    -> Strip(one leading space). Its decode is not a concatenation of token texts: the
    first piece loses its space, and a run of byte tokens becomes text only as a whole
    (an invalid run gives one U+FFFD per byte)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "▁the", "▁cat", "s", "at", "▁é", "▁日本", "語", "x", "▁▁"]
    tok = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token="<unk>"))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   clean_up_tokenization_spaces=False)
    assert fast.decode([pieces.index("▁the")]) == "the"  # the strip the window must respect
    return fast, pieces


def test_sentencepiece_style_matches_full_decode(sentencepiece_style):
    tok, pieces = sentencepiece_style
    rng = random.Random(5)
    words = [i for i, p in enumerate(pieces) if not p.startswith("<")]
    emoji = [pieces.index(f"<0x{b:02X}>") for b in "😀".encode()]
    for _ in range(400):
        ids = []
        while len(ids) < rng.randint(1, 60):
            r = rng.random()
            if r < 0.5:
                ids.append(rng.choice(words))
            elif r < 0.65:
                ids.append(rng.choice((1, 2)))  # specials, skipped
            elif r < 0.85:
                ids += emoji[:rng.randint(1, 4)]  # whole or cut-off character
            else:
                ids.append(3 + rng.randrange(256))  # any byte
        for skip in (True, False):
            detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
            assert detok.incremental
            for prefix in chunks(ids, rng):
                assert detok.update(prefix) == tok.decode(prefix, skip_special_tokens=skip), prefix
                assert detok.incremental


def test_stop_string_kept_with_include_stop_str_in_output(smol_tokenizer):
    ids = smol_tokenizer.encode("Hello world, and more text", add_special_tokens=False)
    for include, want in ((False, "Hello"), (True, "Hello world")):
        seq = SimpleNamespace(detokenizer=None, output_token_ids=ids, finish_reason=None, stop_reason=None,
                              output_text="", params=SimpleNamespace(stop=[" world"], include_stop_str_in_output=include))
        update_sequence_text(seq, smol_tokenizer)
        assert (seq.output_text, seq.finish_reason, seq.stop_reason) == (want, "stop", " world")


def test_special_tokens_in_text_when_not_skipped(smol_tokenizer):
    eos = smol_tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = smol_tokenizer.encode("Hi there", add_special_tokens=False) + [eos]
    for skip, want in ((True, "Hi there"), (False, "Hi there<|im_end|>")):
        seq = SimpleNamespace(detokenizer=None, output_token_ids=ids, finish_reason=None, stop_reason=None,
                              output_text="", params=SimpleNamespace(stop=None, skip_special_tokens=skip))
        update_sequence_text(seq, smol_tokenizer)
        assert seq.output_text == want
