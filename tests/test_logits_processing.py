"""Logits processing (penalties, min_tokens, logit bias, bad words) against a per-token
reference written from the definitions, and speculative verification with it: exactly
greedy-equal and distribution-equal to plain decoding of the processed distribution.

The reference (``reference_logits``) takes one position's raw logits and the tokens
generated before it and walks the vocabulary in plain Python; nothing of
logits_processing.py is used to compute it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import pytest
import torch

from eagle_zoo.engine.logits_processing import LogitsProcessing, bad_words_token_ids, process_logits
from eagle_zoo.engine.sampler import apply_sampling_params
from eagle_zoo.engine.sampling_params import SamplingParams
from eagle_zoo.engine.verify import SamplingBatch, verify_drafts

EOS = 1


def reference_logits(raw: list[float], prompt: list[int], generated: list[int], params: SamplingParams,
                     bad_words: list[list[int]], eos=(EOS,)) -> list[float]:
    """One position, from the definitions: bad words, min_tokens, bias, allowed_token_ids, then repetition /
    frequency / presence penalties (vLLM's order)."""
    out = list(raw)
    for word in bad_words:
        prefix, last = word[:-1], word[-1]
        if len(prefix) <= len(generated) and (not prefix or generated[len(generated) - len(prefix):] == prefix):
            out[last] = -math.inf
    if len(generated) < params.min_tokens:
        banned = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos))
        for t in banned:
            out[t] = -math.inf
    for t, b in (params.logit_bias or {}).items():
        out[t] += b
    if params.allowed_token_ids is not None:
        out = [x if v in params.allowed_token_ids else -math.inf for v, x in enumerate(out)]
    for v in range(len(out)):
        count = generated.count(v)
        if params.repetition_penalty != 1 and (v in prompt or count):
            out[v] = out[v] / params.repetition_penalty if out[v] > 0 else out[v] * params.repetition_penalty
        out[v] -= params.frequency_penalty * count
        if count:
            out[v] -= params.presence_penalty
    return out


@dataclass
class FakeSeq:
    """What LogitsProcessing.build reads of an engine Sequence."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    bad_words_ids: Optional[list[list[int]]] = None
    generator: Optional[torch.Generator] = None


OPTIONS = {
    "presence_penalty": dict(presence_penalty=1.2),
    "frequency_penalty": dict(frequency_penalty=0.7),
    "repetition_penalty": dict(repetition_penalty=1.7),
    "repetition_penalty_below_1": dict(repetition_penalty=0.6),
    "min_tokens": dict(min_tokens=3, stop_token_ids=[2]),
    "logit_bias": dict(logit_bias={0: 1.5, 3: -2.0}),
    "allowed_token_ids": dict(allowed_token_ids=[0, 2, 3]),
    "bad_words": dict(),  # the words are given as token ids (BAD_WORDS)
    "all": dict(presence_penalty=-0.5, frequency_penalty=0.4, repetition_penalty=1.3, min_tokens=2,
                logit_bias={2: 0.8}),
}
BAD_WORDS = {"bad_words": [[3], [0, 2], [1, 0, 2]], "all": [[2, 0]]}


def make_seq(option: str, prompt, output, **kw) -> FakeSeq:
    words = BAD_WORDS.get(option)
    # The engine sets bad_words_ids from params.bad_words with the tokenizer; here the
    # ids are given, and the strings only mark the option as set.
    params = SamplingParams(max_tokens=64, bad_words=[str(w) for w in words] if words else None,
                            **OPTIONS[option], **kw)
    return FakeSeq(params, list(prompt), list(output), words)


def test_bad_words_tokenized_as_vllm():
    class Tok:  # "a b" -> ids of its characters, a leading space is its own token 32
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    # " ab" differs from "ab" in its first token but not in length: dropped (length differs)
    assert bad_words_token_ids([" ab"], Tok()) == [[97, 98]]

    class Merged:  # a leading space merges into the first token
        def encode(self, text, add_special_tokens=False):
            return [1000 + ord(text[1])] + [ord(c) for c in text[2:]] if text.startswith(" ") else [ord(c) for c in text]

    assert bad_words_token_ids(["ab"], Merged()) == [[97, 98], [1097, 98]]


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_process_logits_matches_reference_at_every_draft_position(option):
    g = torch.Generator().manual_seed(0)
    V, T = 6, 4
    rows = [([4, 5, 0], [2, 0]), ([3], []), ([1, 1], [0, 2, 0, 3, 5]), ([5], [1, 0])]
    # A row without processing in the same batch must stay bit-for-bit unchanged.
    seqs = [make_seq(option, p, o) for p, o in rows] + [FakeSeq(SamplingParams(), [2], [3, 3])]
    B = len(seqs)
    logits = torch.randn(B, T, V, generator=g) * 2
    drafts = torch.randint(0, V, (B, T - 1), generator=g)
    drafts[1, 2] = -1  # padding past a row's drafts counts as nothing
    proc = LogitsProcessing.build(seqs, V, [EOS], "cpu")
    got = process_logits(logits, proc, drafts)
    for b, seq in enumerate(seqs):
        for j in range(T):
            if (drafts[b, :j] < 0).any():  # past a row's drafts: verification never reads it
                continue
            generated = seq.output_token_ids + drafts[b, :j].tolist()
            want = reference_logits(logits[b, j].tolist(), seq.prompt_token_ids, generated, seq.params,
                                    seq.bad_words_ids or [])
            assert torch.allclose(got[b, j], torch.tensor(want), atol=1e-5), (b, j, got[b, j], want)
    assert torch.equal(got[-1], logits[-1])


def test_process_logits_none_without_options():
    assert LogitsProcessing.build([FakeSeq(SamplingParams(), [1], [2])], 6, [EOS], "cpu") is None


# ---------------------------------------------------- speculative verification, end to end
V, K = 4, 2
_TABLE = torch.randn(V, V, generator=torch.Generator().manual_seed(5)) * 1.5


def toy_logits(history: list[int]) -> list[float]:
    """A toy target: the next token's raw logits from the last token."""
    return _TABLE[history[-1]].tolist()


def drafter(history: list[int]) -> list[int]:
    """A deterministic drafter that is often wrong: K tokens after the history."""
    last, out = history[-1], []
    for _ in range(K):
        last = (last * 3 + 1) % V
        out.append(last)
    return out


def speculative_run(seqs: list[FakeSeq], num_tokens: int, count_drafts: bool = True) -> list[list[int]]:
    """Generate ``num_tokens`` per sequence with K-draft verification steps; returns the
    outputs. count_drafts False: a broken verifier that processes every position as if
    no draft came before it (the negative control)."""
    while any(len(s.output_token_ids) < num_tokens for s in seqs):
        drafts = torch.tensor([drafter(s.prompt_token_ids + s.output_token_ids) for s in seqs])
        logits = torch.tensor([[toy_logits(s.prompt_token_ids + s.output_token_ids + drafts[b, :j].tolist())
                                for j in range(K + 1)] for b, s in enumerate(seqs)])
        batch = SamplingBatch.from_sequences(seqs, "cpu", V, [EOS])
        if not count_drafts:
            batch.processing = None
            logits = torch.cat([process_logits(logits[:, j:j + 1], LogitsProcessing.build(seqs, V, [EOS], "cpu"))
                                for j in range(K + 1)], 1)
        tokens, accepted = verify_drafts(logits, drafts, None, batch)
        for s, row, n in zip(seqs, tokens.tolist(), accepted.tolist()):
            s.output_token_ids += row[: n + 1]
    return [s.output_token_ids[:num_tokens] for s in seqs]


def reference_distribution(seq: FakeSeq, num_tokens: int) -> dict[tuple, float]:
    """Exact probabilities of every continuation of ``num_tokens`` under plain decoding
    of the processed distribution (temperature, top-k applied as sampler.py does)."""
    out = {(): 1.0}
    for _ in range(num_tokens):
        nxt = {}
        for prefix, p in out.items():
            raw = toy_logits(seq.prompt_token_ids + list(prefix))
            x = reference_logits(raw, seq.prompt_token_ids, list(prefix), seq.params, seq.bad_words_ids or [])
            t = torch.tensor(x).view(1, 1, V)
            probs = apply_sampling_params(t, torch.tensor([seq.params.temperature]),
                                          torch.tensor([seq.params.top_k]) if seq.params.top_k else None)[0, 0]
            for v in range(V):
                if probs[v] > 0:
                    nxt[prefix + (v,)] = p * float(probs[v])
        out = nxt
    return out


def chi2_critical(dof: int, z: float = 3.09) -> float:
    """The chi-square quantile at p = 0.001 (Wilson-Hilferty)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_greedy_speculative_equals_reference_loop(option):
    prompts = [[0], [1, 3], [2], [3, 3, 1]]
    seqs = [make_seq(option, p, [], temperature=0.0) for p in prompts]
    got = speculative_run(seqs, 8)
    for s, out in zip(seqs, got):
        want: list[int] = []
        for _ in range(8):
            x = reference_logits(toy_logits(s.prompt_token_ids + want), s.prompt_token_ids, want, s.params,
                                 s.bad_words_ids or [])
            want.append(max(range(V), key=lambda v: x[v]))
        assert out == want, (s.prompt_token_ids, out, want)


def _sampled_counts(option: str, n: int, num_tokens: int, count_drafts: bool = True):
    torch.manual_seed(1)
    seqs = [make_seq(option, [1, 3], [], temperature=0.9) for _ in range(n)]
    counts: dict[tuple, int] = {}
    for out in speculative_run(seqs, num_tokens, count_drafts):
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    return counts, reference_distribution(seqs[0], num_tokens)


def _chi2(counts, expected, n) -> tuple[float, int]:
    """Pearson's statistic and its degrees of freedom, outcomes expected fewer than 5
    times pooled into one bin (the usual condition for the chi-square approximation)."""
    assert set(counts) <= set(expected), "an outcome the processed distribution rules out was emitted"
    bins = [(counts.get(key, 0), n * p) for key, p in expected.items() if n * p >= 5]
    rare = [(counts.get(key, 0), n * p) for key, p in expected.items() if n * p < 5]
    if rare:
        bins.append((sum(c for c, _ in rare), sum(e for _, e in rare)))
    return sum((c - e) ** 2 / e for c, e in bins), len(bins) - 1


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_sampled_speculative_distribution_matches_processed_target(option):
    """The joint distribution of three sampled tokens through K=2 drafts (the drafts
    matter for positions 1 and 2) against the exact processed distribution."""
    n, num_tokens = 6000, 3
    counts, expected = _sampled_counts(option, n, num_tokens)
    stat, dof = _chi2(counts, expected, n)
    assert stat < chi2_critical(dof), (stat, dof, counts, expected)


def test_distribution_test_catches_drafts_not_counted():
    """Negative control: a verifier that forgets the drafts before each position fails the test above."""
    n = 6000
    counts, expected = _sampled_counts("presence_penalty", n, 3, count_drafts=False)
    stat, dof = _chi2(counts, expected, n)
    assert stat > chi2_critical(dof), (stat, dof)
