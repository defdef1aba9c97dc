"""Parallel drafting with P-EAGLE heads (speculators ``peagle``): all K drafts from one
head pass (engine/parallel_drafting.py).

The reference nobody here wrote the cache logic of: transformers' target gives the aux
hidden states of every verified position; the head runs over the whole sequence without
a KV cache (plain causal attention), fed (next token, fused aux feature) at each verified
position followed by K-1 slots of (mask_token_id, fc(mask_hidden)) at the next
positions; draft 0 is its output at the last verified position, drafts 1..K-1 the
slots' outputs. Engine drafts must equal it after every kind of step (partial and full
acceptance, plain steps, changing K), and greedy output
must equal plain output.
"""
from __future__ import annotations

import json

import pytest
import torch

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from eagle_zoo.engine.proposers import StepBatch, TargetOutput

VOCAB = cf.TINY["vocab_size"]
K = 3
MASK_TOKEN = 5
AUX = [1, 2, 3]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("peagle")
    target = ef.write_target(root / "target", ef.kind_of("llama"))
    head = root / "peagle-head"
    cf.write_speculators(head, model_type="peagle", speculative_tokens=K, mask_token_id=MASK_TOKEN, aux_layer_ids=AUX)
    return target, head


def make_llm(target, spec, max_num_seqs=2):
    return LLM(str(target), speculative_config=spec, device="cpu", dtype="float32", max_model_len=96,
               max_num_seqs=max_num_seqs)


@torch.no_grad()
def hf_aux(hf_target, x: list[int]) -> list[torch.Tensor]:
    """Residual streams entering the aux layers, [1, len(x), H] each (transformers)."""
    hs = hf_target(torch.tensor([x]), output_hidden_states=True, use_cache=False).hidden_states
    return [hs[i] for i in AUX]


@torch.no_grad()
def reference_drafts(hf_target, head, history: list[int], k: int = K) -> list[int]:
    n = len(history)
    features = head.combine_hidden_states(torch.cat(hf_aux(hf_target, history[:-1]), -1))
    mask = head.combine_hidden_states(head.mask_hidden.view(1, 1, -1)).expand(1, k - 1, -1)
    ids = torch.tensor([history[1:] + [MASK_TOKEN] * (k - 1)])
    h = head(ids, torch.arange(ids.shape[1])[None], torch.cat([features, mask], 1))
    out = torch.cat([h[:, n - 2:n - 1], h[:, n - 1:]], 1)
    assert out.shape[1] == k
    return head.compute_logits(out)[0].argmax(-1).tolist()


def check_cache_writes(prop) -> None:
    """Makes every head pass of ``prop`` check that no two of its tokens write one cache
    column: the order of such writes is undefined on GPUs (on the CPU the last one wins,
    which would hide the collision)."""
    run = prop.runner.run

    def checked_run(ids, positions, slots, kv_len, *args, cache_positions=None, **kw):
        cols = positions if cache_positions is None else cache_positions
        assert all(len(set(row)) == len(row) for row in cols.tolist()), cols
        return run(ids, positions, slots, kv_len, *args, cache_positions=cache_positions, **kw)

    prop.runner.run = checked_run


def test_loader_keeps_mask_hidden_and_token(files):
    target, head_dir = files
    llm = make_llm(target, {"model": str(head_dir)})
    assert llm.speculative_config.parallel_drafting and llm.speculative_config.method == "eagle3"
    p = llm.engine.proposer
    assert type(p).__name__ == "ParallelEagleProposer" and p.mask_token == MASK_TOKEN
    from safetensors.torch import load_file

    written = load_file(str(head_dir / "model.safetensors"))["mask_hidden"]
    assert written.shape == (1, 1, 3 * cf.TINY["hidden_size"])
    assert torch.equal(p.head.mask_hidden, written.reshape(-1))


def test_drafts_after_every_kind_of_step(files):
    """The proposer driven by hand: pretend x is the target's text; each step verifies
    (depth, accepted) of a schedule, with plain steps (depth 0) in between."""
    target, head_dir = files
    llm = make_llm(target, {"model": str(head_dir)})
    prop, hf_target = llm.engine.proposer, ef.load_hf(target)
    head = prop.head
    x = ef.random_prompts((60,), VOCAB, seed=3)[0]
    aux = hf_aux(hf_target, x)
    P, slot = 7, 1
    check_cache_writes(prop)

    def window(lo, hi, valid):
        ids = torch.tensor([x[lo:hi]])
        toks = torch.tensor([[x[i + 1] if i - lo < valid else -1 for i in range(lo, hi)]])
        return TargetOutput(ids, toks, torch.arange(lo, hi)[None], None, [a[:, lo:hi] for a in aux])

    prop.on_prefill(slot, window(0, P, P))
    c, checked = P - 1, 0  # c: last verified position that has a feature; history x[:c+2]
    schedule = [(3, 2), (3, 0), (0, 0), (2, 1), (3, 3), (1, 0), (0, 0), (0, 0), (3, 1), (2, 2), (3, 0)]
    for depth, accepted in schedule:
        base = c + 1
        batch = StepBatch(torch.tensor([slot]), torch.tensor([base]), [], base + depth + 1, depth=depth)
        if depth == 0:
            prop.on_plain_step(batch, window(base, base + 1, 1))
            c = base
            continue
        drafts = prop.propose(batch)[0][0].tolist()
        assert drafts == reference_drafts(hf_target, head, x[:base + 1])[:depth], (base, depth)
        checked += 1
        prop.on_verify(batch, window(base, base + depth + 1, accepted + 1), torch.tensor([accepted]))
        c = base + accepted
    assert checked == 8
    batch = StepBatch(torch.tensor([slot]), torch.tensor([c + 1]), [], c + 1 + K + 1, depth=K)
    assert prop.propose(batch)[0][0].tolist() == reference_drafts(hf_target, head, x[:c + 2])


class WholeRowPass:
    """Stands in for the pass's CUDA graph (ParallelEagleProposer.graphed_pass) on the CPU:
    runs the function the graph captures in its whole-row form (no kv_len), as a replay does."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def eligible(self, tokens):
        return True

    def __call__(self, *args):
        self.calls += 1
        self.fn(*args)


@pytest.mark.parametrize("graph_form", [False, True], ids=["eager", "graph-form"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_greedy_equals_plain(files, adaptive, graph_form):
    target, head_dir = files
    prompts = ef.random_prompts((5, 12, 3, 19, 8), VOCAB, seed=1)
    max_tokens = (24, 30, 17, 21, 27)
    want = ef.hf_greedy(target, prompts, max_tokens)
    spec = {"model": str(head_dir)}
    if adaptive:
        spec["num_speculative_tokens_by_batch_size"] = {"1": 3, "2": 0, "3": 2}
    llm = make_llm(target, spec, max_num_seqs=3)
    prop, seen = llm.engine.proposer, []
    assert prop.graphed_pass is None  # the CPU has no graphs
    if graph_form:
        prop.graphed_pass = WholeRowPass(prop._pass)
    check_cache_writes(prop)
    propose = prop.propose

    def recording(batch):
        drafts, num = propose(batch)
        seen.append((batch.slots.tolist(), drafts.tolist()))
        return drafts, num

    prop.propose = recording
    seqs = [llm.engine.add_request(p, SamplingParams(temperature=0, max_tokens=m, ignore_eos=True))
            for p, m in zip(prompts, max_tokens)]
    by_slot_history = []
    while llm.engine.has_unfinished():
        histories = {s.slot: list(s.all_token_ids) for s in seqs if s.status.name == "RUNNING"}
        n = len(seen)
        llm.engine.step()
        for slots, rows in seen[n:]:
            by_slot_history += [(histories[s], r) for s, r in zip(slots, rows)]
    assert [s.output_token_ids for s in seqs] == want
    hf_target = ef.load_hf(target)
    for history, drafts in by_slot_history[::2]:
        assert drafts == reference_drafts(hf_target, prop.head, history)[:len(drafts)]
    m = llm.engine.metrics
    assert m.num_drafts > 0 and len(m.num_accepted_tokens_per_pos) == K
    if adaptive:
        assert llm.engine.depth_schedule.steps_by_depth[0] > 0
    if graph_form:  # every pass after a step (verifications and plain steps) took the graph's form
        assert prop.graphed_pass.calls == sum(llm.engine.depth_schedule.steps_by_depth.values()) if adaptive \
            else prop.graphed_pass.calls > 0


def test_missing_mask_token_id(tmp_path, files):
    target, head_dir = files
    head = tmp_path / "peagle-no-token"
    cf.write_speculators(head, model_type="peagle", mask_token_id=MASK_TOKEN, aux_layer_ids=AUX)
    cfg = json.loads((head / "config.json").read_text())
    del cfg["mask_token_id"]
    (head / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="placeholder token id .*mask_token_id / pard_token / ptd_token_id") as info:
        make_llm(target, {"model": str(head)})
    assert str(head) in str(info.value) and '"parallel_drafting": false' in str(info.value)
    llm = make_llm(target, {"model": str(head), "parallel_drafting": False})  # a chain still runs
    assert type(llm.engine.proposer).__name__ == "EagleProposer"


def test_mask_token_outside_the_vocabulary(tmp_path, files):
    target, _ = files
    head = tmp_path / "peagle-far-token"
    cf.write_speculators(head, model_type="peagle", mask_token_id=VOCAB, aux_layer_ids=AUX)
    with pytest.raises(ValueError, match=f"mask token id {VOCAB} is outside the head's embedding of {VOCAB} rows"):
        make_llm(target, {"model": str(head)})


def test_missing_mask_hidden(tmp_path, files):
    target, _ = files
    head = tmp_path / "peagle-no-mask"
    cf.write_speculators(head, model_type="peagle", aux_layer_ids=AUX)
    with pytest.raises(ValueError, match="needs the P-EAGLE mask_hidden tensor") as info:
        make_llm(target, {"model": str(head)})
    assert str(head) in str(info.value)
