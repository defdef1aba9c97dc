"""Rejection sampler: greedy cases by hand, the output distribution against the exact
target distribution (Leviathan et al.: speculative sampling is lossless), seeds."""
import math

import pytest
import torch

from eagle_zoo.engine import rejection_sampler as rs
from eagle_zoo.engine.rejection_sampler import rejection_sample
from eagle_zoo.engine.sampler import draw, make_generator


def one_hot_probs(rows):
    """[[argmax per position], ...] -> one-hot target probs [B, K+1, V=6]."""
    t = torch.tensor(rows)
    return torch.zeros(*t.shape, 6).scatter_(-1, t.unsqueeze(-1), 1.0)


# ---------------------------------------------------------------- greedy, by hand
@pytest.mark.parametrize("drafts, argmax, expected, n_acc", [
    ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4], 3),      # all accepted -> bonus
    ([1, 2, 3], [1, 2, 5, 4], [1, 2, 5, -1], 2),     # stop at first mismatch, emit argmax
    ([1, 2, 3], [0, 2, 3, 4], [0, -1, -1, -1], 0),   # later matches do not count
    ([1, -1, -1], [1, 5, 0, 0], [1, 5, -1, -1], 1),  # padded drafts: bonus from position 1
])
def test_greedy_by_hand(drafts, argmax, expected, n_acc):
    # Soft target probs with the given argmax: greedy must not need one-hot input.
    probs = one_hot_probs([argmax]) * 0.5 + 0.5 / 6
    out, na = rejection_sample(torch.tensor([drafts]), probs, torch.zeros(1))
    assert out.tolist() == [expected] and na.tolist() == [n_acc]


def test_greedy_batch_mixed_with_random_rows_and_num_draft_tokens():
    drafts = torch.tensor([[1, 2, 3], [1, 2, 3], [4, 4, 4]])
    probs = one_hot_probs([[1, 2, 3, 4], [1, 2, 3, 4], [4, 4, 4, 0]])
    # Row 2 is a random row with one-hot p: accepts exactly what greedy would.
    out, na = rejection_sample(drafts, probs, torch.tensor([0.0, 0.0, 0.8]),
                               num_draft_tokens=torch.tensor([3, 1, 2]))
    assert out.tolist() == [[1, 2, 3, 4], [1, 2, -1, -1], [4, 4, 4, -1]]
    assert na.tolist() == [3, 1, 2]


def test_shape_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"draft_probs has shape \(1, 2, 5\), expected \(1, 3, 6\)"):
        rejection_sample(torch.zeros(1, 3, dtype=torch.long), torch.rand(1, 4, 6), torch.ones(1),
                         torch.rand(1, 2, 5))


# ------------------------------------------- tokens the target gives probability 0
@pytest.mark.parametrize("q", ["none", "uniform", "one_hot_at_draft", "zero_at_draft"])
def test_draft_with_zero_target_probability_is_rejected_at_u_zero(q):
    # Token 3 has p = 0 at both positions; u = 0 exactly (torch.rand returns it with
    # probability 2**-24) must still reject it: the acceptance test is u * q < p.
    p = torch.zeros(1, 2, 6)
    p[..., 0] = 1
    draft_probs = {"none": None, "uniform": torch.full((1, 1, 6), 1 / 6),
                   "one_hot_at_draft": one_hot_probs([[3]]),
                   "zero_at_draft": one_hot_probs([[1]])}[q]
    out, na = rejection_sample(torch.tensor([[3]]), p, torch.ones(1), draft_probs,
                               uniforms=torch.zeros(1, 1), exponentials=torch.ones(1, 2, 6))
    assert out.tolist() == [[0, -1]] and na.tolist() == [0]


@pytest.mark.parametrize("with_q", [True, False])
def test_no_emitted_token_has_zero_target_probability(with_q):
    # Targets with many zeros, drafts from a draft distribution that puts mass there,
    # every uniform exactly 0: every draft with p(x) > 0 is accepted, every other one
    # is rejected, and recovered / bonus tokens come from where p > 0.
    g = torch.Generator().manual_seed(5)
    B, K, vocab = 2000, 3, 8
    p = torch.rand(B, K + 1, vocab, generator=g) * (torch.rand(B, K + 1, vocab, generator=g) < 0.4)
    p[..., 0] += 1e-3  # every position keeps some mass
    p = p / p.sum(-1, keepdim=True)
    q = torch.softmax(torch.randn(B, K, vocab, generator=g), -1)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(B, K)
    out, na = rejection_sample(drafts, p, torch.ones(B), q if with_q else None, uniforms=torch.zeros(B, K),
                               exponentials=torch.empty(B, K + 1, vocab).exponential_(generator=g))
    emitted = out >= 0
    assert (emitted.sum(1) == na + 1).all()
    p_emitted = p.gather(-1, out.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    assert (p_emitted[emitted] > 0).all()
    zero_at_draft = p[:, :K].gather(-1, drafts.unsqueeze(-1)).squeeze(-1) == 0
    assert zero_at_draft[:, 0].any() and (na > 0).any()  # both cases occur
    assert (na == (~zero_at_draft).long().cumprod(1).sum(1)).all()


# ------------------------------------------------------------------ invalid draft ids
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_padding_draft_id_is_never_accepted(temperature):
    # -1 inside num_draft_tokens ends the drafts: it is not read as token 0 (which the
    # target would accept with certainty), and the next token comes from position 0.
    p = one_hot_probs([[0, 5]])
    out, na = rejection_sample(torch.tensor([[-1]]), p, torch.tensor([temperature]),
                               num_draft_tokens=torch.tensor([1]),
                               uniforms=torch.zeros(1, 1), exponentials=torch.ones(1, 2, 6))
    assert out.tolist() == [[0, -1]] and na.tolist() == [0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("bad", [6, 1000])
def test_out_of_vocabulary_draft_id_raises(bad, temperature):
    p = one_hot_probs([[0, 5, 2]])
    with pytest.raises(RuntimeError, match=r"draft token id is outside the vocabulary \[0, 6\)"):
        rejection_sample(torch.tensor([[0, bad]]), p, torch.tensor([temperature]),
                         uniforms=torch.zeros(1, 2), exponentials=torch.ones(1, 3, 6))


# ------------------------------------------------- the output distribution is the target's
# A first-order Markov "target" P[prev] and a "draft" Q[prev] over V=5 tokens, far
# apart. The exact law of the first two emitted tokens after context token C is
# P[C, y0] * P[y0, y1].
V, C, N = 5, 4, 50_000
_g = torch.Generator().manual_seed(0)
P = torch.softmax(torch.randn(V, V, generator=_g) * 1.5, -1)
Q = torch.softmax(torch.randn(V, V, generator=_g) * 1.5, -1)
EXACT_FIRST = P[C]
EXACT_JOINT = P[C].unsqueeze(1) * P  # [y0, y1]


def tv_bound(cells: int, n: int, delta: float = 1e-6) -> float:
    # Empirical frequencies f of n i.i.d. draws over `cells` outcomes:
    # E|f_i - p_i| <= sqrt(p_i (1 - p_i) / n), so E||f - p||_1 <= sqrt(cells / n)
    # (Cauchy-Schwarz). One draw moves ||f - p||_1 by at most 2/n, so McDiarmid gives
    # P(||f - p||_1 >= E + t) <= exp(-n t^2 / 2). TV = ||.||_1 / 2; with delta = 1e-6 a
    # correct sampler fails with probability < 1e-6 whatever the seed.
    return 0.5 * (math.sqrt(cells / n) + math.sqrt(2 * math.log(1 / delta) / n))


def one_round(sampler, last, K, with_q, gen):
    """Draft K tokens after each `last` token, build p along the draft, verify."""
    M = last.shape[0]
    drafts, q, p, prev = [], [], [], last
    for _ in range(K):  # positions, in the test only
        qj = Q[prev]
        # Without draft probs the draft is deterministic (greedy head): q one-hot.
        x = torch.multinomial(qj, 1, generator=gen).squeeze(1) if with_q else qj.argmax(-1)
        drafts.append(x), q.append(qj), p.append(P[prev])
        prev = x
    p.append(P[prev])
    return sampler(torch.stack(drafts, 1), torch.stack(p, 1), torch.ones(M),
                   torch.stack(q, 1) if with_q else None,
                   uniforms=torch.rand(M, K, generator=gen),
                   exponentials=torch.empty(M, K + 1, V).exponential_(generator=gen))


def first_two_tokens(sampler, K, with_q, seed=1):
    gen = torch.Generator().manual_seed(seed)
    out, _ = one_round(sampler, torch.full((N,), C), K, with_q, gen)
    first, second = out[:, 0], out[:, 1].clone()
    rejected = second < 0  # only one token emitted: the next step continues from it
    second[rejected] = one_round(sampler, first[rejected], K, with_q, gen)[0][:, 0]
    return first, second


def distance_to_target(first, second):
    f1 = torch.bincount(first, minlength=V).float() / N
    f2 = torch.bincount(first * V + second, minlength=V * V).float().view(V, V) / N
    return 0.5 * (f1 - EXACT_FIRST).abs().sum().item(), 0.5 * (f2 - EXACT_JOINT).abs().sum().item()


def assert_matches_target(first, second):
    tv1, tv2 = distance_to_target(first, second)
    assert tv1 <= tv_bound(V, N) and tv2 <= tv_bound(V * V, N), (tv1, tv2)


def test_draft_is_far_from_target():  # precondition: a lazy sampler cannot pass by luck
    assert 0.5 * (P[C] - Q[C]).abs().sum() > 0.3


@pytest.mark.parametrize("K", [1, 2])  # K=1: the 2nd token is often the bonus; K=2: a recovery
@pytest.mark.parametrize("with_q", [True, False])
def test_output_distribution_is_target(K, with_q):
    assert_matches_target(*first_two_tokens(rejection_sample, K, with_q))


def accept_always(drafts, p, temperature, q=None, *, uniforms, exponentials):
    B, K = drafts.shape
    bonus = (p[:, K] / exponentials[:, K]).argmax(-1, keepdim=True)
    return torch.cat([drafts, bonus], 1), torch.full((B,), K)


@pytest.mark.parametrize("with_q", [True, False])
@pytest.mark.parametrize("bug", ["accept_always", "recover_from_p"])
def test_wrong_samplers_fail_the_check(bug, with_q, monkeypatch):
    sampler = rejection_sample
    if bug == "accept_always":
        sampler = accept_always
    else:  # the classic mistake: after a rejection, resample from p instead of max(p - q, 0)
        monkeypatch.setattr(rs, "_recovery_probs", lambda p, drafts, q: p[:, : drafts.shape[1]])
    with pytest.raises(AssertionError):
        assert_matches_target(*first_two_tokens(sampler, 2, with_q))


# ---------------------------------------------------------------- seeds
def _inputs(B, K=3, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(B, K + 1, vocab, generator=g), -1)
    q = torch.softmax(torch.randn(B, K, vocab, generator=g), -1)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(B, K)
    return drafts, p, q


def test_seeded_request_is_reproducible_and_independent_of_batch():
    drafts, p, q = _inputs(4)
    temp = torch.ones(4)
    alone = [rejection_sample(drafts[:1], p[:1], temp[:1], q[:1], generators=[make_generator(7)])[0]
             for _ in range(2)]
    assert torch.equal(alone[0], alone[1])
    batch_gens = [make_generator(7), None, make_generator(8), make_generator(9)]
    out, _ = rejection_sample(drafts, p, temp, q, generators=batch_gens)
    assert torch.equal(out[:1], alone[0])
    # Over several steps too: the generator advances by the same amount either way.
    g_alone, g_batch = make_generator(3), make_generator(3)
    for _ in range(3):
        a = rejection_sample(drafts[2:3], p[2:3], temp[2:3], q[2:3], generators=[g_alone])[0]
        b = rejection_sample(drafts, p, temp, q, generators=[None, None, g_batch, None])[0]
        assert torch.equal(a[0], b[2])


def test_different_seeds_draw_different_noise():
    u = draw("uniform", (2, 64), [make_generator(1), make_generator(2)])
    assert not torch.equal(u[0], u[1])


def test_traces_without_graph_breaks():
    # fullgraph=True refuses .item(), .tolist() and data-dependent Python branches:
    # the sampler must stay one graph (no host sync) to live inside a CUDA graph.
    drafts, p, q = _inputs(3)
    u, e = draw("uniform", (3, 3)), draw("exponential", (3, 4, 50))
    temp = torch.tensor([0.0, 1.0, 0.5])
    compiled = torch.compile(rejection_sample, fullgraph=True, backend="eager")
    got = compiled(drafts, p, temp, q, uniforms=u, exponentials=e)
    want = rejection_sample(drafts, p, temp, q, uniforms=u, exponentials=e)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
