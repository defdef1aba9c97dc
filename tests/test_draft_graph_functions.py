"""The functions the EAGLE proposer captures as one CUDA graph each (the K-step drafting
loop, the padded catch-up) run on the CPU too: there they take the runner's full-length
path (kv_len = max_len, masked by position), as inside a graph. They must give the same
drafts and the same head state as the step-by-step path through runner.run (kv_len
bounded by the sequences), which the engine uses without graphs."""
from __future__ import annotations

import pytest
import torch

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@torch.inference_mode()  # as in the engine's propose / on_verify
def test_full_length_draft_chain_and_catch_up_match_the_runner_path(method, tmp_path):
    kind = ef.kind_of("llama")
    target = ef.write_target(tmp_path / "target", kind)
    head = ef.write_head(tmp_path / "head", kind, method)
    llm = LLM(str(target), speculative_config={"method": method, "model": str(head), "num_speculative_tokens": 3},
              device="cpu", dtype="float32", max_model_len=96, max_num_seqs=3, enforce_eager=True)
    prompts = ef.random_prompts((7, 11), cf.TINY["vocab_size"], seed=2)
    llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=9,
                                                                           ignore_eos=True))
    proposer = llm.engine.proposer
    assert proposer.graphed_drafts is None  # CPU: no graphs, the functions run as they are
    g = torch.Generator().manual_seed(3)
    proposer.next_hidden.copy_(torch.randn(proposer.next_hidden.shape, generator=g))
    slots = torch.tensor([2, 0])
    base = torch.tensor([[20], [33]])
    before = [c.clone() for pair in proposer.runner.kv_caches for c in pair]
    full = proposer._draft_chain(None, base, slots, 3)
    after_full = [c.clone() for pair in proposer.runner.kv_caches for c in pair]
    for c, b in zip((c for pair in proposer.runner.kv_caches for c in pair), before):
        c.copy_(b)
    stepwise = proposer._draft_chain(None, base, slots, 3, kv_len=int(base.max()) + 4)
    assert full.shape == (2, 3) and torch.equal(full, stepwise)
    for a, b in zip(after_full, (c for pair in proposer.runner.kv_caches for c in pair)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the draft passes wrote the same k/v

    # Catch-up: 4 verified positions a sequence, 1 and 3 of them accepted.
    H = proposer.next_hidden.shape[1]
    tokens = torch.tensor([[5, 9, -1, -1], [4, 8, 2, 7]])
    positions = base + torch.arange(4)
    n_aux = len(proposer.aux_layer_ids) if method == "eagle3" else 1
    inputs = [torch.randn(2, 4, H if method == "eagle" else llm.engine.target.config.hidden_size, generator=g)
              for _ in range(n_aux)]
    accepted = torch.tensor([[1], [3]])
    proposer._catch_up(tokens, positions, slots, accepted, *inputs)
    full_state = proposer.next_hidden[slots].clone()
    proposer.next_hidden.zero_()
    proposer._catch_up(tokens, positions, slots, accepted, *inputs, kv_len=int(positions.max()) + 1)
    torch.testing.assert_close(full_state, proposer.next_hidden[slots], rtol=1e-5, atol=1e-6)
    assert full_state.abs().sum() > 0


@pytest.mark.parametrize("k", [0, 3])
@torch.inference_mode()
def test_greedy_target_pass_matches_the_eager_verification(k, tmp_path):
    """EngineCore.greedy_target_pass (what the greedy steps' CUDA graph captures: the target
    over whole cache rows, lm_head, greedy verification) gives the eager path's tokens,
    accepted counts and features (runner.run bounded by kv_len, compute_logits,
    verify_drafts)."""
    from eagle_zoo.engine.verify import SamplingBatch, verify_drafts

    kind = ef.kind_of("llama")
    target = ef.write_target(tmp_path / "target", kind, edit=ef.bigram_edit())
    llm = LLM(str(target), device="cpu", dtype="float32", max_model_len=96, max_num_seqs=2, enforce_eager=True)
    engine = llm.engine
    prompts = ef.random_prompts((7, 11), cf.TINY["vocab_size"], seed=2)
    llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=9,
                                                                           ignore_eos=True))  # caches filled
    slots = torch.tensor([1, 0])
    base = torch.tensor([len(p) + 8 for p in prompts])
    positions = base.view(2, 1) + torch.arange(k + 1)
    caches = [c for pair in engine.runner.kv_caches for c in pair]
    saved = [c.clone() for c in caches]
    greedy = SamplingBatch(tensors=None, generators=[None, None], all_greedy=True)

    def eager(ids):
        for c, b in zip(caches, saved):
            c.copy_(b)
        hidden, _ = engine.runner.run(ids, positions, slots, int(positions.max()) + 1, ())
        return (*verify_drafts(engine.target.compute_logits(hidden), ids[:, 1:] if k else None, None, greedy),
                hidden)

    # Row 0 drafts the target's own greedy chain (all k accepted), row 1 random tokens.
    ids = torch.randint(3, cf.TINY["vocab_size"], (2, k + 1), generator=torch.Generator().manual_seed(4))
    for _ in range(k):
        argmax = engine.target.compute_logits(eager(ids)[2]).argmax(-1)
        ids[0, 1:] = argmax[0, :k]
    want_tokens, want_accepted, want_hidden = eager(ids)
    for c, b in zip(caches, saved):
        c.copy_(b)
    tokens, accepted, hidden, _ = engine.greedy_target_pass(ids, positions, slots, ids[:, 1:])
    assert torch.equal(tokens, want_tokens) and torch.equal(accepted, want_accepted)
    assert int(accepted[0]) == k
    torch.testing.assert_close(hidden, want_hidden, rtol=1e-5, atol=1e-6)
