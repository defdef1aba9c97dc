"""The engine with penalties, min_tokens, logit bias, bad words, logprobs and n > 1, on
tiny random models (CPU).

Greedy: plain decoding equals a reference loop over transformers' forward that applies
tests/test_logits_processing.reference_logits at every step, and every speculative
method (draft model, n-gram, EAGLE) gives exactly the plain outputs. Logprobs: equal to
transformers' log-softmax at every position.
"""
from __future__ import annotations


import pytest
import torch

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from test_logits_processing import reference_logits

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = cf.TINY["vocab_size"]
EOS = 2  # engine_fixtures.TINY_TARGET's eos_token_id
MAX_TOKENS = 16
PROMPTS = ef.random_prompts((6, 11), VOCAB, seed=21)


class WordTokenizer:
    """Text of space-separated token ids: enough for bad_words and detokenization."""

    chat_template = None
    eos_token_id = EOS

    def encode(self, text, add_special_tokens=False):
        return [int(w) for w in text.split()]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f" {i}" for i in ids)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("options")
    kind = ef.kind_of("llama")
    target = ef.write_target(root / "target", kind)
    draft = ef.write_target(root / "draft", kind, edit=ef.perturb_edit(0.05))
    ef.write_head(root / "head", kind, "eagle")
    specs = {
        None: None,
        "draft_model": {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3},
        "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2},
        "eagle": {"method": "eagle", "model": str(root / "head"), "num_speculative_tokens": 3},
    }
    llms = {}

    def llm(method):
        if method not in llms:
            llms[method] = LLM(str(target), speculative_config=specs[method], device="cpu", dtype="float32",
                               max_model_len=64, max_num_seqs=2)
            llms[method].engine.tokenizer = WordTokenizer()
        return llms[method]

    return target, ef.load_hf(target), llm


def options(plain_output: list[int]) -> dict[str, dict]:
    """Each option at values that change the greedy output of this tiny model (bad words
    and the min_tokens stop token come from the plain output itself)."""
    return {
        "presence_penalty": dict(presence_penalty=1.5),
        "frequency_penalty": dict(frequency_penalty=0.9),
        "repetition_penalty": dict(repetition_penalty=2.0),
        "min_tokens": dict(min_tokens=6, stop_token_ids=[plain_output[2]], ignore_eos=False),
        "logit_bias": dict(logit_bias={plain_output[1]: -5.0, 7: 2.0}),
        "bad_words": dict(bad_words=[str(plain_output[3]), f"{plain_output[5]} {plain_output[6]}"]),
        "allowed_token_ids": dict(allowed_token_ids=sorted({*plain_output[:3], 5, 9, 11})),
        "all": dict(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.4, min_tokens=3,
                    logit_bias={9: 1.0}, bad_words=[f"{plain_output[0]} {plain_output[1]}"]),
    }


@torch.no_grad()
def reference_greedy(hf, prompt: list[int], params: SamplingParams, tokenizer) -> list[int]:
    """Plain greedy decoding with the processing applied from the definitions, stopping
    as the engine does (stop ids, EOS unless ignore_eos, but not before min_tokens)."""
    from eagle_zoo.engine.logits_processing import bad_words_token_ids

    words = bad_words_token_ids(params.bad_words or [], tokenizer)
    out: list[int] = []
    while len(out) < params.max_tokens:
        raw = hf(torch.tensor([prompt + out])).logits[0, -1].tolist()
        x = reference_logits(raw, prompt, out, params, words, eos=(EOS,))
        out.append(max(range(len(x)), key=lambda v: x[v]))
        stop = out[-1] in params.stop_token_ids or (not params.ignore_eos and out[-1] == EOS)
        if stop and len(out) >= params.min_tokens:
            break
    return out


@pytest.mark.parametrize("option", ["presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
                                    "logit_bias", "bad_words", "allowed_token_ids", "all"])
def test_greedy_options_plain_equals_reference_and_speculative_equals_plain(models, option):
    target, hf, llm = models
    base = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    plain_outputs = [o.outputs[0].token_ids for o in llm(None).generate(
        [{"prompt_token_ids": p} for p in PROMPTS], base)]
    params = [SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, **{"ignore_eos": True,
                                                                         **options(out)[option]})
              for out in plain_outputs]
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    plain = [o.outputs[0].token_ids for o in llm(None).generate(prompts, params)]
    assert plain != plain_outputs, "the option changes nothing here: the test would prove nothing"
    for p, sp, got in zip(PROMPTS, params, plain):
        assert got == reference_greedy(hf, p, sp, WordTokenizer())
    for method in ("draft_model", "ngram", "eagle"):
        spec = [o.outputs[0].token_ids for o in llm(method).generate(prompts, params)]
        assert spec == plain, method
    assert llm("draft_model").engine.metrics.num_accepted_tokens > 0


@torch.no_grad()
@pytest.mark.parametrize("method", [None, "draft_model"])
def test_logprobs_are_the_raw_log_softmax(models, method):
    target, hf, llm = models
    prompt = PROMPTS[1]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3, prompt_logprobs=2,
                            repetition_penalty=1.5)
    out = llm(method).generate([{"prompt_token_ids": prompt}], params)[0]
    tokens = out.outputs[0].token_ids
    ref = hf(torch.tensor([prompt + tokens])).logits[0].float().log_softmax(-1)
    assert len(out.outputs[0].logprobs) == len(tokens)
    total = 0.0
    for i, (token, entry) in enumerate(zip(tokens, out.outputs[0].logprobs)):
        row = ref[len(prompt) - 1 + i]
        top = row.topk(3)
        assert list(entry)[0] == token  # the chosen token first
        assert set(entry) == {token, *top.indices.tolist()}
        for tid, lp in entry.items():
            assert lp.logprob == pytest.approx(float(row[tid]), abs=1e-4)
            assert lp.rank == int((row >= row[tid]).sum())
            assert lp.decoded_token == f" {tid}"
        total += entry[token].logprob
    assert out.outputs[0].cumulative_logprob == pytest.approx(total)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for i in range(1, len(prompt)):
        row = ref[i - 1]
        entry = out.prompt_logprobs[i]
        assert list(entry)[0] == prompt[i]
        assert set(entry) == {prompt[i], *row.topk(2).indices.tolist()}
        assert entry[prompt[i]].logprob == pytest.approx(float(row[prompt[i]]), abs=1e-4)


def test_no_logprobs_unless_asked_and_max_logprobs(models):
    _, _, llm = models
    out = llm(None).generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(max_tokens=3))[0]
    assert out.outputs[0].logprobs is None and out.prompt_logprobs is None
    with pytest.raises(ValueError, match="SamplingParams.logprobs=21 exceeds max_logprobs=20"):
        llm(None).generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(logprobs=21))
    with pytest.raises(ValueError, match="logit_bias token ids"):
        llm(None).generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(logit_bias={VOCAB: 1.0}))


def test_n_completions_each_with_its_own_seed(models):
    _, _, llm = models
    prompt = [{"prompt_token_ids": PROMPTS[0]}]
    params = SamplingParams(temperature=1.0, n=3, seed=100, max_tokens=10, ignore_eos=True, logprobs=1)
    outs = llm("draft_model").generate(prompt, params)
    assert len(outs) == 1 and [c.index for c in outs[0].outputs] == [0, 1, 2]
    for i, c in enumerate(outs[0].outputs):
        alone = llm("draft_model").generate(prompt, SamplingParams(temperature=1.0, seed=100 + i, max_tokens=10,
                                                                  ignore_eos=True))[0].outputs[0]
        assert c.token_ids == alone.token_ids and len(c.logprobs) == 10
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) > 1
    greedy = llm(None).generate(prompt * 2, SamplingParams(temperature=0, n=2, max_tokens=5))
    assert [len(o.outputs) for o in greedy] == [2, 2]
    assert greedy[0].outputs[0].token_ids == greedy[0].outputs[1].token_ids


def test_sampled_options_seeded_speculative_reproducible(models):
    """A seeded sampled request with every option gives the same tokens in any batch."""
    _, _, llm = models
    sp = SamplingParams(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True, presence_penalty=0.8,
                        repetition_penalty=1.3, logit_bias={4: 1.0}, min_tokens=4)
    mine = {"prompt_token_ids": PROMPTS[0]}
    alone = llm("eagle").generate([mine], sp)[0].outputs[0].token_ids
    other = {"prompt_token_ids": PROMPTS[1]}
    batch = llm("eagle").generate([other, mine], [SamplingParams(temperature=1.0, max_tokens=20), sp])
    assert batch[1].outputs[0].token_ids == alone


def test_tree_engine_refuses_options_by_name(tmp_path, models):
    target, _, _ = models
    ef.write_head(tmp_path / "head", ef.kind_of("llama"), "eagle3")
    spec = {"method": "eagle3", "model": str(tmp_path / "head"), "tree": {"top_k": 2, "depth": 2, "total_tokens": 5}}
    llm = LLM(str(target), speculative_config=spec, device="cpu", dtype="float32", max_model_len=64)
    prompt = [{"prompt_token_ids": PROMPTS[0]}]
    for kw, name in ((dict(presence_penalty=0.5), "presence_penalty"), (dict(logprobs=1), "logprobs"),
                     (dict(min_tokens=2), "min_tokens")):
        with pytest.raises(ValueError, match=f"{name}: not supported with EAGLE-2 tree"):
            llm.generate(prompt, SamplingParams(max_tokens=4, **kw))
    assert len(llm.generate(prompt, SamplingParams(max_tokens=4, n=2))[0].outputs) == 2


@torch.no_grad()
def test_sampled_speculative_distribution_with_options_matches_reference(models):
    """Three sampled tokens (top-k 3) with penalties, bias and min_tokens through a draft
    model that is often wrong: their joint frequency matches the product of the processed
    conditionals computed from transformers' logits and the reference (chi-square)."""
    target, hf, llm = models
    prompt = PROMPTS[0]
    first = int(hf(torch.tensor([prompt])).logits[0, -1].argmax())
    sp = SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True, presence_penalty=1.0,
                        frequency_penalty=0.5, repetition_penalty=1.5, logit_bias={first: -1.0},
                        min_tokens=2, stop_token_ids=[first])
    n = 600
    engine = llm("draft_model").engine
    accepted_before = engine.metrics.num_accepted_tokens
    outs = llm("draft_model").generate([{"prompt_token_ids": prompt}] * n, sp)
    assert engine.metrics.num_accepted_tokens > accepted_before
    counts: dict[tuple, int] = {}
    for o in outs:
        key = tuple(o.outputs[0].token_ids)
        counts[key] = counts.get(key, 0) + 1

    def probs(prefix):
        raw = hf(torch.tensor([prompt + list(prefix)])).logits[0, -1].tolist()
        x = torch.tensor(reference_logits(raw, prompt, list(prefix), sp, [], eos=(EOS,)), dtype=torch.float64)
        kth = x.topk(3).values[-1]
        return x.masked_fill(x < kth, float("-inf")).softmax(-1)

    expected: dict[tuple, float] = {}
    p1 = probs(())
    for a in p1.nonzero().flatten().tolist():
        p2 = probs((a,))
        for b in p2.nonzero().flatten().tolist():
            p3 = probs((a, b))
            for c in p3.nonzero().flatten().tolist():
                expected[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    assert set(counts) <= set(expected), "a token the processed distribution rules out was emitted"
    bins = [(counts.get(k, 0), n * p) for k, p in expected.items() if n * p >= 5]
    rare = [(counts.get(k, 0), n * p) for k, p in expected.items() if n * p < 5]
    if rare:
        bins.append((sum(c for c, _ in rare), sum(e for _, e in rare)))
    chi2 = sum((c - e) ** 2 / e for c, e in bins)
    dof = len(bins) - 1
    assert chi2 < dof * (1 - 2 / (9 * dof) + 3.09 * (2 / (9 * dof)) ** 0.5) ** 3, (chi2, dof, counts, expected)
