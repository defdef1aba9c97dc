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
    (dict(stop_token_ids=[-1]), ["stop_token_ids", ">= 0"]),
    (dict(n=2), ["n must be 1", "2", "submit the prompt n times"]),
    (dict(ignore_eos="yes"), ["ignore_eos", "True or False"]),
])
def test_errors_name_field_range_and_value(kw, words):
    with pytest.raises(SamplingParamsError) as e:
        SamplingParams(**kw)
    assert isinstance(e.value, ValueError)
    assert all(w in str(e.value) for w in words), str(e.value)
