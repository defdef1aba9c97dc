"""On the CPU a greedy EAGLE chain stops drafting at the first draft its head gives less
than proposers.CPU_MIN_DRAFT_PROB (no draft: a plain step). The drafts it keeps are the
full chain's first columns, the output stays plain decoding's, and the cut falls where
the head's probability does."""
from __future__ import annotations

import pytest
import torch

import checkpoint_factory as cf
import engine_fixtures as ef
import eagle_zoo.engine.proposers as proposers
from eagle_zoo import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

K = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("confident")
    kind = ef.kind_of("llama")
    target = ef.write_target(root / "target", kind)
    head = ef.write_head(root / "head", kind, "eagle3")
    prompts = ef.random_prompts((6, 13, 9), cf.TINY["vocab_size"], seed=3)
    return target, head, prompts


def _generate(setup, speculative: bool, max_num_seqs: int = 1):
    target, head, prompts = setup
    spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": K} if speculative else None
    llm = LLM(str(target), speculative_config=spec, device="cpu", dtype="float32", max_model_len=96,
              max_num_seqs=max_num_seqs)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs], llm.engine.metrics, llm


def _draft_probs(monkeypatch, setup) -> list[float]:
    """The head's probability of every draft it makes with the cut off (K drafts a step)."""
    seen = []
    original = proposers.EagleProposer._confident_drafts

    def spy(self, base, slots, k, kv_len):
        top = self.head.draft_top_k

        def recording(h, n):
            logprob, ids = top(h, n)
            seen.extend(logprob.exp().flatten().tolist())
            return logprob, ids

        self.head.draft_top_k = recording
        try:
            return original(self, base, slots, k, kv_len)
        finally:
            del self.head.draft_top_k

    monkeypatch.setattr(proposers, "CPU_MIN_DRAFT_PROB", 0.0)
    monkeypatch.setattr(proposers.EagleProposer, "_confident_drafts", spy)
    _generate(setup, True)
    monkeypatch.undo()
    return seen


@pytest.mark.parametrize("max_num_seqs", [1, 3])
def test_the_cut_keeps_plain_decodings_output_and_drafts_only_above_the_floor(monkeypatch, setup, max_num_seqs):
    plain, _, _ = _generate(setup, False, max_num_seqs)
    probs = sorted(_draft_probs(monkeypatch, setup))
    monkeypatch.setattr(proposers, "CPU_MIN_DRAFT_PROB", 0.0)
    full, m, _ = _generate(setup, True, max_num_seqs)
    assert full == plain and m.num_draft_tokens == K * m.num_drafts  # no floor: K drafts every step
    drafted = m.num_draft_tokens
    monkeypatch.setattr(proposers, "CPU_MIN_DRAFT_PROB", probs[len(probs) // 2])  # the median draft's
    cut, m, _ = _generate(setup, True, max_num_seqs)
    assert cut == plain
    assert 0 < m.num_draft_tokens < drafted  # fewer drafts: steps cut short or plain
    monkeypatch.setattr(proposers, "CPU_MIN_DRAFT_PROB", 1.01)  # above every probability
    none, m, _ = _generate(setup, True, max_num_seqs)
    assert none == plain and m.num_drafts == 0 and m.num_draft_tokens == 0


@torch.inference_mode()
def test_kept_drafts_are_the_full_chains_first_columns_cut_where_every_probability_falls(monkeypatch, setup):
    _, _, llm = _generate(setup, True, max_num_seqs=3)
    proposer = llm.engine.proposer
    g = torch.Generator().manual_seed(5)
    slots = torch.tensor([2, 0])
    base = torch.tensor([[20], [33]])
    caches = [c.clone() for pair in proposer.runner.kv_caches for c in pair]

    def restore():
        for c, saved in zip((c for pair in proposer.runner.kv_caches for c in pair), caches):
            c.copy_(saved)

    for trial in range(6):
        proposer.next_hidden.copy_(torch.randn(proposer.next_hidden.shape, generator=g) * (trial + 1))
        restore()
        full = proposer._draft_chain(None, base, slots, K, kv_len=40)
        # each step's best probability along the full chain, per sequence
        restore()
        hidden, best = proposer.next_hidden[slots], []
        for step in range(K):
            if step:
                hidden = proposer.runner.run(full[:, step - 1:step], base + step - 1, slots, 40,
                                             hidden.unsqueeze(1))[:, 0]
            best.append(proposer.head.draft_top_k(hidden, 1)[0][:, 0].exp())
        floor = float(torch.stack(best).median())
        monkeypatch.setattr(proposers, "CPU_MIN_DRAFT_PROB", floor)
        restore()
        kept = proposer._confident_drafts(base, slots, K, 40)
        width = next((i for i, p in enumerate(best) if bool((p < floor).all())), K)
        assert kept.shape == (2, width) and torch.equal(kept, full[:, :width])
