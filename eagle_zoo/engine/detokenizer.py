"""Incremental detokenization: a growing output's text without re-decoding all of it.

Decoding the whole output after every step costs O(length) per step, O(length^2) per
request. ``IncrementalDetokenizer`` decodes a short window at the end instead and
still returns exactly ``tokenizer.decode(ids, skip_special_tokens=...)`` after every
update.

Why a window and not just the new tokens: a token's text can depend on its
neighbours. Byte-level BPE tokens may carry part of a multi-byte UTF-8 character (its
decode alone is U+FFFD until the rest arrives); SentencePiece ``Metaspace`` decoders
drop the leading space of the first token decoded; ``ByteFallback`` decoders turn a
run of ``<0x..>`` tokens into text only as a whole. So the new tokens are decoded
together with the tokens of the previous update (the "prefix"), and the new text is
what the window adds to the prefix's own decode. Text is committed (never decoded
again) only at a clean boundary: its window text does not end in U+FFFD (an
unfinished character) and its last token seen by the decoder is not a byte-fallback
token (skipped special tokens do not end a run of bytes).

Tokenizers whose decode is not a concatenation of such windows (Python "slow"
tokenizers, ``clean_up_tokenization_spaces``, which rewrites across token
boundaries) get a full decode per update: exact, as before, just not incremental.
"""
from __future__ import annotations

import re
import weakref
from typing import Any, Optional

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_byte_token_ids: "weakref.WeakKeyDictionary[Any, frozenset[int]]" = weakref.WeakKeyDictionary()


def byte_fallback_ids(tokenizer) -> frozenset[int]:
    """Ids of ``<0xNN>`` byte-fallback tokens (none for byte-level BPE), once per tokenizer."""
    try:
        return _byte_token_ids[tokenizer]
    except (KeyError, TypeError):
        pass
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    ids = frozenset(i for t, i in vocab.items() if _BYTE_TOKEN.fullmatch(t))
    try:
        _byte_token_ids[tokenizer] = ids
    except TypeError:  # not weak-referenceable: recomputed per request
        pass
    return ids


def special_ids(tokenizer) -> frozenset[int]:
    """Ids that ``decode(..., skip_special_tokens=True)`` drops."""
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    for i, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(i)
    return frozenset(ids)


def supports_incremental(tokenizer) -> bool:
    """True for tokenizers whose decode the window method reproduces exactly: a Rust
    ("fast") backend and no clean-up of tokenization spaces."""
    if not getattr(tokenizer, "is_fast", False):
        return False
    return not getattr(tokenizer, "clean_up_tokenization_spaces", False)


class IncrementalDetokenizer:
    """``update(ids)`` -> the text of ``ids`` (a list that only grows between calls).

    ``stable_len`` after an update: the length of the text prefix that the update did
    not change (searches for stop strings need to look only after it).
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.incremental = supports_incremental(tokenizer)
        self._byte_ids = byte_fallback_ids(tokenizer) if self.incremental else frozenset()
        self._skipped = special_ids(tokenizer) if skip_special_tokens and self._byte_ids else frozenset()
        self._committed = ""  # decode(ids[:_read]): final, never decoded again
        self._start = 0       # the window's prefix is ids[_start:_read]
        self._read = 0
        self._prefix_text = ""  # decode(ids[_start:_read])
        self._seen = 0
        self.text = ""
        self.stable_len = 0

    def _ends_in_byte_token(self, ids) -> bool:
        """Whether the last token the decoder sees is a byte-fallback token (skipped
        special tokens are invisible to it: bytes on both sides of one form one run)."""
        if not self._byte_ids:
            return False
        for i in reversed(ids):
            if i not in self._skipped:
                return i in self._byte_ids
        return False

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def update(self, ids: list[int]) -> str:
        n = len(ids)
        if n < self._seen:
            raise ValueError(f"token ids shrank from {self._seen} to {n}: the detokenizer follows a growing list")
        self.stable_len = len(self._committed)
        if n == self._seen:
            return self.text
        self._seen = n
        if not self.incremental:
            self.stable_len = 0
            self.text = self._decode(ids)
            return self.text
        window = self._decode(ids[self._start:])
        if not window.startswith(self._prefix_text):
            # Not expected for the tokenizers admitted above; stay exact regardless.
            self.incremental = False
            self.stable_len = 0
            self.text = self._decode(ids)
            return self.text
        new = window[len(self._prefix_text):]
        self.text = self._committed + new
        if new and not new.endswith("\ufffd") and not self._ends_in_byte_token(ids):
            self._committed = self.text
            # The next window starts at these tokens (they carry the context the next
            # tokens' text may depend on). Their raw text is not empty (``new`` is not),
            # so a decoder that strips the first token's space strips the same one in
            # the prefix and in the window.
            self._start, self._read = self._read, n
            self._prefix_text = self._decode(ids[self._start:])
        return self.text


def find_stop(text: str, stops, search_from: int = 0) -> Optional[tuple[str, int]]:
    """The first stop string of ``stops`` (in their order) found in ``text``, and where.

    An occurrence that ends before ``search_from`` was already visible to an earlier
    search, so only occurrences ending at or after it are looked for."""
    for stop in stops or ():
        cut = text.find(stop, max(0, search_from - len(stop) + 1))
        if cut != -1:
            return stop, cut
    return None


def update_sequence_text(seq, tokenizer) -> None:
    """The engine's text step for one sequence after new tokens: ``seq.output_text`` =
    the decode of its output (special tokens skipped unless ``params.skip_special_tokens``
    is false), cut at the first stop string (in ``params.stop`` order) found while the
    sequence had no finish reason yet: before it, or after it with
    ``params.include_stop_str_in_output``. Stop strings count only once
    ``params.min_tokens`` tokens are out (as vLLM)."""
    params = seq.params
    detok = seq.detokenizer
    if detok is None:
        detok = seq.detokenizer = IncrementalDetokenizer(
            tokenizer, skip_special_tokens=getattr(params, "skip_special_tokens", True))
    text = detok.update(seq.output_token_ids)
    if seq.finish_reason is None and len(seq.output_token_ids) >= getattr(params, "min_tokens", 0):
        hit = find_stop(text, params.stop, detok.stable_len)
        if hit is not None:
            stop, cut = hit
            text = text[:cut + len(stop)] if getattr(params, "include_stop_str_in_output", False) else text[:cut]
            seq.finish_reason, seq.stop_reason = "stop", stop
    seq.output_text = text
