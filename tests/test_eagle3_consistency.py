"""Train/inference consistency of the EAGLE draft chains (CPU, seconds).

The engine's EagleProposer (prefill, propose, padded verify catch-up with partial
acceptance) must draft exactly what the trainer's forward predicts for the same
chain, and both must equal an independent reference: EAGLE drafting written as
*sequence extension* with plain causal attention and no KV cache, the way the
official EAGLE code drafts (step s of the chain at the last verified position c
appends one entry -- token = the previous draft (the verified next token at step 0),
feature = the head's previous output (the fused target features at step 0), rope
position c+s -- to the head's inputs over positions 0..c and reads the last output).
Its draft tokens are mapped back to target ids with the draft-id list the head was
built from, not with the head's d2t.

What this pins down: which target states feed the head (aux layers, fused by fc at
step 0 only), the token read at each step (verified token first, then the drafts),
rope positions, the attention pattern (step-0 keys of every chain <= c plus the
chain's own earlier steps), the fed-back feature, the d2t mapping, and the
catch-up index after partial acceptance.
"""
from __future__ import annotations

import pytest
import torch

from checkpoint_factory import write_peaked_target
from eagle_zoo.engine.model_loader import load_model
from eagle_zoo.engine.proposers import EagleProposer, StepBatch, TargetOutput
from eagle_zoo.plugins import get_registry
from eagle_zoo.train.build import build_head, head_config
from eagle_zoo.train.eagle3 import ttt_steps_forward

CPU = torch.device("cpu")
K = 3
PROMPT = 7
# Accepted drafts per verification round (0..K): covers no, partial and full acceptance.
SCHEDULE = (0, 2, 3, 1, 0, 3, 2)
DRAFT_IDS = torch.tensor(sorted(torch.randperm(125, generator=torch.Generator().manual_seed(5))[:48].add(3).tolist()))


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("consistency")
    # 6 layers; the EAGLE-3 head reads aux layers (1, 3, 4), not the defaults (2, 3, 3), so a
    # proposer that ignored the config's eagle_aux_hidden_state_layer_ids would be caught.
    write_peaked_target(root / "target", num_hidden_layers=6, seed=3)
    return load_model(str(root / "target"), torch.float32, CPU)


def _head(target, method, layers=1):
    family = get_registry().family_for_config(target.config)
    kw = dict(draft_vocab_size=DRAFT_IDS.numel(), aux_layer_ids=[1, 3, 4]) if method == "eagle3" else {}
    cfg = head_config(target.path, method, num_layers=layers, **kw)
    head = build_head(family, cfg, method, target.model, seed=0,
                      draft_ids=DRAFT_IDS if method == "eagle3" else None)
    with torch.no_grad():  # away from the init: peaked, input-dependent drafts
        for name, p in head.named_parameters():
            # embed_tokens (and EAGLE-1's lm_head) are the target's own modules: leave them.
            if not name.startswith(("embed_tokens", "lm_head") if method == "eagle" else "embed_tokens"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    return head.eval()


def _features(head, method, target_model, ids):
    """Per-position head input from the target run over ``ids`` (plain causal forward)."""
    T = ids.shape[1]
    aux_ids = list(head.config.eagle_aux_hidden_state_layer_ids) if method == "eagle3" else []
    hidden, aux = target_model(ids, torch.arange(T)[None], aux_ids)
    if method == "eagle3":
        return hidden, aux, head.combine_hidden_states(torch.cat(aux, -1))
    return hidden, aux, hidden


def _to_target_ids(head, method, h):
    if method == "eagle3":  # independent of d2t: the draft ids the head was built from
        return DRAFT_IDS[head.compute_draft_logits(h).argmax(-1)]
    return head.compute_logits(h).argmax(-1)


def _reference_drafts(head, method, target_model, x: list[int], c: int):
    """Sequence-extension drafting of the chain at verified position c (x[c+1] is the
    verified next token): plain causal attention, no cache, no attention context."""
    ids = torch.tensor([x[: c + 2]])
    _, _, g = _features(head, method, target_model, ids[:, : c + 1])
    tokens, feats = ids[:, 1 : c + 2], g
    drafts, states = [], []
    for _ in range(K):
        n = tokens.shape[1]
        last = head(tokens, torch.arange(n)[None], feats)[:, -1:]
        d = _to_target_ids(head, method, last[:, 0])
        drafts.append(int(d))
        states.append(last[0, 0])
        tokens, feats = torch.cat([tokens, d.view(1, 1)], 1), torch.cat([feats, last], 1)
    return drafts, states


def _trainer_drafts(head, target_model, x: list[int], c: int, drafts: list[int]):
    """The trainer's TTT forward (eagle3_loss's) on the text the chain drafts over:
    the verified prefix, then the drafts as the next tokens; chain c, steps 0..K-1."""
    ids = torch.tensor([x[: c + 2] + drafts[: K - 1]])
    _, _, g = _features(head, "eagle3", target_model, ids)
    steps = [h for _, h in ttt_steps_forward(head, ids, g[:, : ids.shape[1] - 1], K)]
    return [int(_to_target_ids(head, "eagle3", h[0, c])) for h in steps], [h[0, c] for h in steps]


# Two layers: heads grown past the published one (`train --head-layers`): the engine's
# per-layer caches, the trainer's and the reference's must agree for every layer.
@pytest.mark.usefixtures("cpu_drafts_always_k")  # counters compared with paths that draft K
@pytest.mark.parametrize("method,layers", [("eagle", 1), ("eagle3", 1), ("eagle3", 2)])
@torch.inference_mode()
def test_engine_drafts_equal_reference_and_trainer(target, method, layers):
    head, model = _head(target, method, layers), target.model
    assert len(head.layers) == layers
    n_tokens = PROMPT + len(SCHEDULE) * (K + 1) + K + 2
    x = torch.randint(3, 128, (n_tokens,), generator=torch.Generator().manual_seed(11)).tolist()
    prop = EagleProposer(head, method, K, num_slots=2, max_len=128, dtype=torch.float32, device=CPU,
                         target_num_layers=len(model.layers))
    if method == "eagle3":
        assert prop.aux_layer_ids == (1, 3, 4)
    assert (prop.cpu_head is not None) == (method == "eagle3" and layers == 1)
    slot = 1  # not row 0: the slot indexing is part of what is checked
    runs = []  # the head's outputs of draft steps 1..K-1 (propose runs the head K-1 times)
    run = prop.runner.run
    prop.runner.run = lambda *a, **kw: runs.append(run(*a, **kw)) or runs[-1]

    # Prefill: the prompt x[:P]; the target's first token is x[P] (verified).
    ids = torch.tensor([x[:PROMPT]])
    hidden, aux, _ = _features(head, method, model, ids)
    prop.on_prefill(slot, TargetOutput(ids, torch.tensor([x[1 : PROMPT + 1]]), torch.arange(PROMPT)[None],
                                       hidden, aux))
    c = PROMPT - 1  # last verified chain: position c, next token x[c+1]
    checked = 0
    for accepted in SCHEDULE + (None,):
        base = c + 1
        batch = StepBatch(torch.tensor([slot]), torch.tensor([base]), [x[: base + 1]], base + K + 1)
        state0 = prop.next_hidden[slot].clone()
        # A one-layer EAGLE-3 head drafts in one C++ call on the CPU (cpu_head); the
        # module path, whose head states runs records, must draft the same.
        in_one_call = prop.propose(batch)[0][0].tolist() if prop.cpu_head is not None else None
        runs.clear()
        prop.cpu_head, one_call = None, prop.cpu_head
        drafts = prop.propose(batch)[0][0].tolist()
        prop.cpu_head = one_call
        assert in_one_call in (None, drafts), f"chain {c}: one call drafted {in_one_call}, the modules {drafts}"
        states = [state0] + [r[0, 0] for r in runs]
        ref, ref_states = _reference_drafts(head, method, model, x, c)
        assert drafts == ref, f"chain {c}: engine drafted {drafts}, sequence-extension reference {ref}"
        for s in range(K):
            torch.testing.assert_close(states[s], ref_states[s], rtol=1e-3, atol=1e-3,
                                       msg=lambda m: f"chain {c} step {s}: engine state vs reference: {m}")
        if method == "eagle3":
            ttt, ttt_states = _trainer_drafts(head, model, x, c, drafts)
            assert drafts == ttt, f"chain {c}: engine drafted {drafts}, the trainer's forward predicts {ttt}"
            for s in range(K):
                torch.testing.assert_close(ttt_states[s], ref_states[s], rtol=1e-3, atol=1e-3,
                                           msg=lambda m: f"chain {c} step {s}: trainer state vs reference: {m}")
        checked += 1
        if accepted is None:
            break
        # Verification: pretend the target's text is x and `accepted` drafts matched it.
        window = torch.tensor([x[: base + K + 1]])
        hidden, aux, _ = _features(head, method, model, window)
        sl = slice(base, base + K + 1)
        out = TargetOutput(window[:, sl], torch.tensor([x[base + 1 : base + K + 2]]), torch.arange(base, base + K + 1)[None],
                           hidden[:, sl], [a[:, sl] for a in aux])
        prop.on_verify(batch, out, torch.tensor([accepted]))
        c = base + accepted
    assert checked == len(SCHEDULE) + 1


@torch.inference_mode()
def test_reference_is_sensitive_to_the_attention_pattern(target):
    """Control: step 1 fed the target's feature of position c+1 (what a teacher-forced,
    non-TTT forward reads) instead of the head's own step-0 output gives another
    state, so the comparisons above can fail on a feedback mix-up."""
    head, model = _head(target, "eagle3"), target.model
    x = torch.randint(3, 128, (24,), generator=torch.Generator().manual_seed(11)).tolist()
    c = 12
    ids = torch.tensor([x[: c + 3]])
    _, _, g = _features(head, "eagle3", model, ids)
    h0 = head(ids[:, 1 : c + 2], torch.arange(c + 1)[None], g[:, : c + 1])[:, -1:]
    right = head(torch.tensor([x[1 : c + 3]]), torch.arange(c + 2)[None], torch.cat([g[:, : c + 1], h0], 1))[0, -1]
    wrong = head(torch.tensor([x[1 : c + 3]]), torch.arange(c + 2)[None], g[:, : c + 2])[0, -1]
    assert not torch.allclose(right, wrong, atol=1e-3)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@torch.inference_mode()
def test_draft_argmax_and_top_k_equal_the_full_vocabulary_logits(target, method):
    """The drafting shortcuts (EAGLE-3: over the draft vocabulary, then d2t) pick the
    tokens and log-probs that compute_logits' full-vocabulary logits give."""
    head = _head(target, method)
    h = torch.randn(3, 5, head.config.hidden_size, generator=torch.Generator().manual_seed(8))
    full = head.compute_logits(h)
    assert torch.equal(head.draft_argmax(h), full.argmax(-1))
    scores, tokens = head.draft_top_k(h, 4)
    want_scores, want_tokens = torch.log_softmax(full.float(), -1).topk(4, dim=-1)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(scores, want_scores, rtol=0, atol=1e-5)
    if method == "eagle3":
        assert bool(torch.isin(tokens, DRAFT_IDS).all())
