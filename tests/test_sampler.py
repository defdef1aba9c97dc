"""apply_sampling_params / sample_from_probs against hand-computed distributions."""
import math

import pytest
import torch

from eagle_zoo.engine.sampler import SamplingTensors, apply_sampling_params, sample_from_probs
from eagle_zoo.engine.sampling_params import SamplingParams

BASE = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
LOGITS = BASE.log()


def norm(*ps):
    t = torch.tensor(ps + (0.0,) * (5 - len(ps)))
    return t / t.sum()


@pytest.mark.parametrize("kw, expected", [
    (dict(), BASE),
    (dict(temperature=2.0), BASE.sqrt() / BASE.sqrt().sum()),  # softmax(log p / 2)
    (dict(temperature=0.0), norm(1.0)),                         # greedy: one-hot at argmax
    (dict(top_k=2), norm(0.4, 0.3)),
    (dict(top_k=-1), BASE),
    (dict(top_p=0.7), norm(0.4, 0.3)),        # 0.4 + 0.3 reaches 0.7: stop there
    (dict(top_p=0.71), norm(0.4, 0.3, 0.15)),
    (dict(min_p=0.3), norm(0.4, 0.3, 0.15)),  # keep p >= 0.3 * 0.4 = 0.12
    # top-p on the renormalised top-3 (.47, .35, .18): .47 + .35 >= 0.8 keeps two; on the
    # raw probabilities 0.4 + 0.3 < 0.8 would have kept three.
    (dict(top_k=3, top_p=0.8), norm(0.4, 0.3)),
])
def test_single_setting(kw, expected):
    st = SamplingTensors.from_params([SamplingParams(**kw)])
    got = apply_sampling_params(LOGITS[None], st.temperature, st.top_k, st.top_p, st.min_p)
    torch.testing.assert_close(got[0], expected, rtol=1e-5, atol=1e-6)


def test_per_request_values_in_one_batch_and_positions():
    params = [SamplingParams(top_k=2), SamplingParams(temperature=0), SamplingParams(top_p=0.71),
              SamplingParams()]
    st = SamplingTensors.from_params(params)
    assert st.min_p is None  # unused filters are skipped
    logits = LOGITS.expand(4, 3, 5)  # [B, T, V]: a request's values apply at every position
    got = apply_sampling_params(logits, st.temperature, st.top_k, st.top_p, st.min_p)
    for b, want in enumerate([norm(0.4, 0.3), norm(1.0), norm(0.4, 0.3, 0.15), BASE]):
        torch.testing.assert_close(got[b], want.expand(3, 5), rtol=1e-5, atol=1e-6)


def test_sample_from_probs_matches_distribution():
    n = 40_000
    p = torch.tensor([0.5, 0.0, 0.2, 0.3])
    torch.manual_seed(0)
    x = sample_from_probs(p.expand(n, 4) * 3.0)  # unnormalised input is fine
    f = torch.bincount(x, minlength=4).float() / n
    assert f[1] == 0
    # TV bound as in test_rejection_sampler.tv_bound (4 cells, delta 1e-6).
    assert 0.5 * (f - p).abs().sum() <= 0.5 * (math.sqrt(4 / n) + math.sqrt(2 * math.log(1e6) / n))


def test_exponential_zero_does_not_pick_an_impossible_token():
    p = torch.tensor([[0.0, 1.0, 0.0]])
    assert sample_from_probs(p, torch.tensor([[0.0, 1.0, 0.0]])).tolist() == [1]
