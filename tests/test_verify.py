"""The engine's greedy fast path must agree with the rejection sampler's greedy rows."""
import torch

from eagle_zoo.engine.rejection_sampler import rejection_sample
from eagle_zoo.engine.sampler import apply_sampling_params
from eagle_zoo.engine.verify import verify_greedy


def test_greedy_fast_path_matches_rejection_sampler():
    g = torch.Generator().manual_seed(0)
    B, K, V = 64, 4, 7
    logits = torch.randn(B, K + 1, V, generator=g)
    # Drafts that often equal the argmax, so every acceptance length occurs.
    argmax = logits.argmax(-1)[:, :K]
    noise = torch.randint(0, V, (B, K), generator=g)
    drafts = torch.where(torch.rand(B, K, generator=g) < 0.7, argmax, noise)
    num_draft = torch.randint(0, K + 1, (B,), generator=g)
    zero = torch.zeros(B)
    probs = apply_sampling_params(logits, zero)
    for n in (None, num_draft):
        want_tokens, want_acc = rejection_sample(drafts, probs, zero, num_draft_tokens=n)
        got_tokens, got_acc = verify_greedy(logits, drafts, n)
        assert torch.equal(got_acc, want_acc)
        assert torch.equal(got_tokens, want_tokens)
    assert len(set(want_acc.tolist())) > 2  # the case mix exercised several lengths
