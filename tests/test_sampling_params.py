import pytest

from eagle_zoo.engine.sampling_params import SamplingParams, SamplingParamsError


def test_vllm_defaults():
    sp = SamplingParams()
    assert (sp.n, sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.max_tokens) == (1, 1.0, 1.0, 0, 0.0, 16)
    assert (sp.seed, sp.stop, sp.stop_token_ids, sp.ignore_eos, sp.greedy) == (None, [], [], False, False)


def test_normalisation():
    sp = SamplingParams(top_k=-1, stop="###", stop_token_ids=(2, 3), temperature=0)
    assert (sp.top_k, sp.stop, sp.stop_token_ids, sp.greedy) == (0, ["###"], [2, 3], True)


@pytest.mark.parametrize("kw, words", [
    (dict(temperature=-0.1), ["temperature", ">= 0", "-0.1"]),
    (dict(top_p=0.0), ["top_p", "(0, 1]", "0.0"]),
    (dict(top_p=1.5), ["top_p", "(0, 1]", "1.5"]),
    (dict(top_k=-2), ["top_k", "0 / -1 for off", "-2"]),
    (dict(min_p=2), ["min_p", "[0, 1]", "2"]),
    (dict(max_tokens=0), ["max_tokens", ">= 1", "0"]),
    (dict(seed=1.5), ["seed", "integer", "1.5"]),
    (dict(stop=[""]), ["stop", "non-empty"]),
    (dict(stop=5), ["stop", "non-empty string or a list", "got 5"]),
    (dict(stop_token_ids=7), ["stop_token_ids", "a list of token ids"]),
    (dict(stop_token_ids=[-1]), ["stop_token_ids", ">= 0"]),
    (dict(n=0), ["n", ">= 1", "0"]),
    (dict(presence_penalty=2.5), ["presence_penalty", "[-2, 2]", "2.5"]),
    (dict(frequency_penalty=-3), ["frequency_penalty", "[-2, 2]"]),
    (dict(repetition_penalty=0), ["repetition_penalty", "> 0", "0"]),
    (dict(repetition_penalty=float("nan")), ["repetition_penalty", "nan"]),
    (dict(min_tokens=-1), ["min_tokens", ">= 0"]),
    (dict(min_tokens=20, max_tokens=10), ["min_tokens", "at most max_tokens (10)", "20"]),
    (dict(logprobs=-1), ["logprobs", ">= 0", "-1"]),
    (dict(prompt_logprobs=1.0), ["prompt_logprobs", "integer"]),
    (dict(logit_bias={"5": 1.0}), ["logit_bias", "token id"]),
    (dict(logit_bias={5: 101}), ["logit_bias", "[-100, 100]"]),
    (dict(bad_words=[" "]), ["bad_words", "non-blank"]),
    (dict(allowed_token_ids=[]), ["allowed_token_ids", "non-empty"]),
    (dict(allowed_token_ids=[1, -1]), ["allowed_token_ids", ">= 0"]),
    (dict(ignore_eos="yes"), ["ignore_eos", "True or False"]),
])
def test_errors_name_field_range_and_value(kw, words):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**kw)
    assert isinstance(e.value, ValueError)
    assert all(w in str(e.value) for w in words), str(e.value)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("kw, words", [
    (dict(temperature=NAN), ["temperature", "finite", "nan"]),
    (dict(temperature=INF), ["temperature", "finite", "inf"]),
    (dict(temperature=1e7), ["temperature", "at most 1e+06"]),
    (dict(temperature=10**400), ["temperature", "finite"]),
    (dict(top_p=NAN), ["top_p", "nan"]),
    (dict(top_p=1e-46), ["top_p", "at least 1e-08", "top_k=1"]),
    (dict(top_p=-INF), ["top_p", "-inf"]),
    (dict(min_p=NAN), ["min_p", "nan"]),
    (dict(top_k=2**63), ["top_k", str(2**31 - 1), str(2**63)]),
    (dict(top_k=1180591620717411303424), ["top_k", "1180591620717411303424"]),
    (dict(top_k=5.0), ["top_k", "integer"]),
    (dict(top_k=True), ["top_k", "integer"]),
    (dict(seed=2**64), ["seed", "2**64 - 1", str(2**64)]),
    (dict(seed=-(2**63) - 1), ["seed", "-2**63"]),
    (dict(max_tokens=5.0), ["max_tokens", "integer"]),
    (dict(max_tokens="5"), ["max_tokens", "integer"]),
    (dict(stop_token_ids=[2**63]), ["stop_token_ids", "2**63"]),
])
def test_out_of_range_numbers_are_refused_by_name(kw, words):
    """Every value that would break the sampler's float32 / int64 math (or torch's seed)
    is refused when the SamplingParams is made, never later inside an engine step."""
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**kw)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_range_edges_are_accepted():
    sp = SamplingParams(temperature=1e6, top_p=1e-8, top_k=2**31 - 1, seed=2**64 - 1, min_p=1.0)
    assert (sp.top_k, sp.seed) == (2**31 - 1, 2**64 - 1)
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


def test_sampling_tensors_name_a_value_that_was_changed_after_creation():
    from eagle_zoo.engine.sampler import SamplingTensors

    sp = SamplingParams(temperature=0.5, top_k=4)
    sp.top_k = 2**70  # bypasses the checks made at creation
    with pytest.raises(ValueError, match=r"SamplingParams\.top_k values \[0, 1180591620717411303424\].*do not change"):
        SamplingTensors.from_params([SamplingParams(), sp])


def test_new_options_defaults_and_normalisation():
    sp = SamplingParams()
    assert (sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty, sp.min_tokens) == (0.0, 0.0, 1.0, 0)
    assert (sp.logprobs, sp.prompt_logprobs, sp.logit_bias, sp.bad_words) == (None, None, None, None)
    assert sp.plain_greedy is False and SamplingParams(temperature=0).plain_greedy
    assert not SamplingParams(temperature=0, logprobs=0).plain_greedy
    assert not SamplingParams(temperature=0, repetition_penalty=1.1).plain_greedy
    assert SamplingParams(allowed_token_ids=(5, 3, 5)).allowed_token_ids == [3, 5]
    sp = SamplingParams(logit_bias={3: 1}, bad_words="foo", n=3, seed=2**64 - 1)
    assert (sp.logit_bias, sp.bad_words, sp.processes_logits) == ({3: 1.0}, ["foo"], True)
    assert [c.seed for c in (sp.child(0), sp.child(1))] == [2**64 - 1, 0]  # seed + 1 wraps as torch does
    assert sp.child(2).n == 1 and sp.n == 3
