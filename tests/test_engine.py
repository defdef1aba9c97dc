"""The engine end to end on CPU (fp32, tiny random checkpoints).

Speculative decoding must not change greedy output: for every registered family with
a target model, and every method (eagle, eagle3, ngram, draft_model), the speculative
output equals the plain output token for token, with continuous batching (more prompts
than max_num_seqs, different prompt lengths and max_tokens, so requests join and leave
between steps). The plain output itself is checked against transformers' forward.

Lossless output says nothing about the drafts, so the drafts are checked too: EAGLE /
EAGLE-3 chains against a from-scratch recomputation (transformers' target features, the
head without a KV cache), n-gram drafts against a plain-Python lookup, draft-model
drafts against transformers' greedy continuation of the draft; and for heads whose
drafts are known in advance the counters are predicted exactly.

References nobody here wrote: transformers' forward and KV cache (greedy continuations,
features, the target distribution for sampled decoding) and the lookup in
engine_fixtures. Tiny models run on one thread (conftest's ``one_thread``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from eagle_zoo.metrics import Counter, Gauge, Histogram, Vector
from eagle_zoo.engine.sequence import Status

METHODS = ("eagle", "eagle3", "ngram", "draft_model")
K = {"eagle": 3, "eagle3": 2, "ngram": 3, "draft_model": 4}
LENGTHS = (5, 12, 3, 19, 8)           # five prompts ...
MAX_TOKENS = (24, 30, 17, 21, 27)     # ... leaving at different steps
MAX_NUM_SEQS = 2                      # < number of prompts: continuous batching
MAX_MODEL_LEN = 96
VOCAB = cf.TINY["vocab_size"]
NGRAM = {"prompt_lookup_min": 1, "prompt_lookup_max": 3}


pytestmark = pytest.mark.usefixtures("one_thread")


def greedy(max_tokens, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def token_prompts(prompts):
    return [{"prompt_token_ids": p} for p in prompts]


def run(target, prompts, max_tokens, spec=None, max_num_seqs=MAX_NUM_SEQS, params=None):
    llm = LLM(str(target), speculative_config=spec, device="cpu", dtype="float32",
              max_model_len=MAX_MODEL_LEN, max_num_seqs=max_num_seqs)
    params = params or [greedy(m) for m in max_tokens]
    outs = llm.generate(token_prompts(prompts), params)
    return llm, outs


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


# -- per-family targets, written once per module ----------------------------------------
@dataclass
class Case:
    root: Path
    kind: ef.TargetKind
    target: Path
    prompts: list
    _plain: list = field(default=None, repr=False)

    @property
    def plain(self):
        """The engine's plain (non-speculative) greedy outputs."""
        if self._plain is None:
            self._plain = run(self.target, self.prompts, MAX_TOKENS)[1]
        return self._plain


@pytest.fixture(scope="module")
def family_case(tmp_path_factory):
    cache = {}

    def get(kind: ef.TargetKind) -> Case:
        if kind not in cache:
            root = tmp_path_factory.mktemp(kind.family)
            target = ef.write_target(root / "target", kind)
            cache[kind] = Case(root, kind, target, ef.random_prompts(LENGTHS, VOCAB, seed=1))
        return cache[kind]

    return get


def check_metrics(llm, outs, k: int, method: str):
    """Invariants between the counters and the outputs.

    Each request's first token comes from its prefill; every later one is emitted by a
    verification step, which emits (accepted + 1) tokens, of which the last step may
    lose up to K to max_tokens. For methods that always draft K tokens the number of
    steps is num_drafts, so
        sum(len(out)) = R + num_drafts + num_accepted - cut,   0 <= cut <= K * R.
    n-gram lookup and the CPU's one-call EAGLE-3 drafts (EagleProposer.cpu_min_confidence)
    may draft fewer than K, or none (a plain step, not counted).
    """
    m = llm.engine.metrics
    lens = [len(t) for t in tokens(outs)]
    R = len(outs)
    assert m.num_requests == R
    assert m.num_generation_tokens == sum(lens)
    assert m.num_prompt_tokens == sum(len(o.prompt_token_ids) for o in outs)
    per_pos = m.num_accepted_tokens_per_pos
    assert len(per_pos) == k
    assert sum(per_pos) == m.num_accepted_tokens
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:])), per_pos  # a prefix is accepted
    assert per_pos[0] <= m.num_drafts
    proposer = llm.engine.proposer
    if method == "ngram" or (getattr(proposer, "cpu_head", None) is not None and proposer.cpu_min_confidence > 0):
        # A lookup may find fewer than K tokens, or none (a step without a draft, not
        # counted): steps >= num_drafts, and each step keeps at least one token.
        assert m.num_drafts <= m.num_draft_tokens <= k * m.num_drafts
        assert m.num_drafts <= sum(lens) - R
        assert m.num_drafts <= sum(lens) - R - m.num_accepted_tokens + k * R
    else:
        assert m.num_draft_tokens == k * m.num_drafts
        cut = R + m.num_drafts + m.num_accepted_tokens - sum(lens)
        assert 0 <= cut <= k * R, (cut, m)
    assert m.num_drafts > 0
    assert m.mean_acceptance_length == pytest.approx(1 + m.num_accepted_tokens / m.num_drafts)
    assert m.acceptance_rate_per_pos == pytest.approx([a / m.num_drafts for a in per_pos])
    got = {x.name: x for x in llm.get_metrics() if "finished_reason" not in x.labels}
    assert got["vllm:spec_decode_num_drafts"].value == m.num_drafts
    assert got["vllm:spec_decode_num_draft_tokens"].value == m.num_draft_tokens
    assert got["vllm:spec_decode_num_accepted_tokens"].value == m.num_accepted_tokens
    assert got["vllm:spec_decode_num_accepted_tokens_per_pos"].values == per_pos
    assert got["vllm:generation_tokens"].value == sum(lens)
    assert got["vllm:request_generation_tokens"].count == R
    assert got["vllm:request_generation_tokens"].sum == sum(lens)
    return m


# -- 1. greedy: plain == transformers, speculative == plain --------------------------------
@pytest.mark.parametrize("kind, method", ef.family_params())
def test_plain_greedy_matches_transformers(family_case, kind, method):
    case = family_case(kind)
    got = tokens(case.plain)
    want = ef.hf_greedy(case.target, case.prompts, MAX_TOKENS)
    assert got == want
    assert [o.outputs[0].finish_reason for o in case.plain] == ["length"] * len(LENGTHS)
    assert len(set(sum(want, []))) > 10  # not a degenerate constant continuation


def spec_config(case: Case, method: str) -> dict:
    k = K[method]
    if method in ("eagle", "eagle3"):
        head = case.root / f"head-{method}"
        if not head.exists():
            ef.write_head(head, case.kind, method)
        return {"method": method, "model": str(head), "num_speculative_tokens": k}
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, **NGRAM}
    # The target drafting for itself: every greedy draft is right, so the
    # multi-token acceptance path runs on every step.
    return {"method": "draft_model", "model": str(case.target), "num_speculative_tokens": k}


def record_drafts(llm) -> list[tuple[list[int], list[int]]]:
    """Wraps the engine's proposer: (token history, proposed drafts) of every sequence
    at every step."""
    proposer, seen = llm.engine.proposer, []
    propose = proposer.propose

    def recording(batch):
        drafts, num = propose(batch)
        n = [proposer.num_speculative_tokens] * len(drafts) if num is None else num.tolist()
        for history, row, count in zip(batch.token_history, drafts.tolist(), n):
            seen.append((list(history), row[:count]))
        return drafts, num

    proposer.propose = recording
    return seen


@torch.no_grad()
def reference_eagle_drafts(hf_target, head, method: str, history: list[int], k: int) -> list[int]:
    """The K greedy drafts of an EAGLE chain after ``history``, recomputed from scratch:
    transformers' target gives the features of every verified position (its final
    hidden state, or for EAGLE-3 the residual streams entering the aux layers, fused by
    the head's fc); the head runs over the whole sequence without a KV cache, each
    draft step appending (its last draft, its own last output) at the next position."""
    n = len(history)
    features = ef.hf_head_features(hf_target, head, method, history)
    ids, drafts = list(history[1:]), []
    for _ in range(k):
        h = head(torch.tensor([ids]), torch.arange(len(ids))[None], features)[:, -1:]
        drafts.append(int(head.compute_logits(h)[0, -1].argmax()))
        ids.append(drafts[-1])
        features = torch.cat([features, h], 1)
    assert len(ids) == n - 1 + k
    return drafts


@pytest.mark.parametrize("kind, method", ef.family_params(METHODS))
def test_greedy_speculative_equals_plain(family_case, kind, method):
    case = family_case(kind)
    llm = LLM(str(case.target), speculative_config=spec_config(case, method), device="cpu",
              max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS)
    proposed = record_drafts(llm)
    outs = llm.generate(token_prompts(case.prompts), [greedy(m) for m in MAX_TOKENS])
    assert tokens(outs) == tokens(case.plain)
    if method in ("eagle", "eagle3"):
        # Lossless whatever the drafts: check the drafts themselves against a from-scratch
        # recomputation (features, positions, head cache and catch-up all matter here).
        hf_target, head = ef.load_hf(case.target), llm.engine.proposer.head
        for history, drafts in proposed[::3]:
            assert drafts == reference_eagle_drafts(hf_target, head, method, history, K[method])
    elif method == "ngram":
        assert all(d == ef.ngram_lookup(h, K[method], NGRAM["prompt_lookup_min"], NGRAM["prompt_lookup_max"])
                   for h, d in proposed)
    else:  # the target drafting for itself: its drafts are its own greedy continuation
        for history, drafts in proposed:
            (cont,) = [c[len(history) - len(p):] for p, c in zip(case.prompts, tokens(case.plain))
                       if history[:len(p)] == p]
            assert len(drafts) == K[method] and drafts[:len(cont)] == cont[:K[method]]
    assert [len(t) for t in tokens(outs)] == list(MAX_TOKENS)
    m = check_metrics(llm, outs, K[method], method)
    if method == "draft_model":
        k = K[method]
        # All accepted, counted even where max_tokens cuts the last step short.
        steps = sum(math.ceil((n - 1) / (k + 1)) for n in MAX_TOKENS)
        assert (m.num_drafts, m.num_accepted_tokens) == (steps, k * steps)
        assert m.num_accepted_tokens_per_pos == [steps] * k
        assert m.mean_acceptance_length == k + 1


# -- 2. Llama: high acceptance with EAGLE and n-gram, exact counters ----------------------
@pytest.fixture(scope="module")
def bigram(tmp_path_factory):
    """A Llama target whose next token depends mostly on the current one, and an EAGLE-1
    head that predicts it from the token alone (see engine_fixtures.bigram_edit)."""
    root = tmp_path_factory.mktemp("bigram")
    target = ef.write_target(root / "target", ef.kind_of("llama"), edit=ef.bigram_edit())
    head = ef.write_bigram_eagle_head(root / "head", target)
    return target, head


def expected_counters(prompts, continuations, max_tokens, k, propose):
    """The counters predicted from the reference continuation (greedy: request by request)
    and a reference proposer ``propose(history) -> draft tokens``."""
    drafts = draft_tokens = accepted = 0
    per_pos = [0] * k
    for prompt, cont, m in zip(prompts, continuations, max_tokens):
        out = cont[:1]  # the prefill's token
        while len(out) < m:
            draft = propose(prompt + out)
            a = 0
            while a < len(draft) and draft[a] == cont[len(out) + a]:
                a += 1
            if draft:
                drafts, draft_tokens, accepted = drafts + 1, draft_tokens + len(draft), accepted + a
                for i in range(a):
                    per_pos[i] += 1
            out = cont[:min(len(out) + a + 1, m)]
    return drafts, draft_tokens, accepted, per_pos


def test_eagle_high_acceptance_counters_exact(bigram):
    """The bigram head's drafts are known from its files (engine_fixtures), so every
    counter of the EAGLE chain (first draft from the prefill, catch-up at the number
    of accepted tokens, K-1 chained steps) is predicted exactly."""
    target, head = bigram
    k = 3
    prompts = ef.random_prompts(LENGTHS, VOCAB, seed=2)
    cont = ef.hf_greedy(target, prompts, [m + k for m in MAX_TOKENS])
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": k}
    llm, outs = run(target, prompts, MAX_TOKENS, spec)
    assert tokens(outs) == [c[:m] for c, m in zip(cont, MAX_TOKENS)]
    m = check_metrics(llm, outs, k, "eagle")
    chain = bigram_chain(ef.bigram_head_next_tokens(head, target), k)

    want = expected_counters(prompts, cont, MAX_TOKENS, k, chain)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens, m.num_accepted_tokens_per_pos) == want
    # Multi-token acceptance, all-accepted rounds and rejections all happened.
    assert m.num_accepted_tokens_per_pos[-1] > 0
    assert m.num_accepted_tokens < m.num_draft_tokens


def bigram_chain(next_token: list[int], k: int):
    """The K drafts a bigram head proposes after a history: its next token, chained."""
    def chain(history):
        draft = [next_token[history[-1]]]
        while len(draft) < k:
            draft.append(next_token[draft[-1]])
        return draft
    return chain


def vllm_acceptance_loop(llm, num_spec_tokens: int) -> None:
    """vLLM's documented acceptance loop over ``llm.get_metrics()``, as the user-code tests
    keep it (tests/test_vllm_user_code.py)."""
    from types import SimpleNamespace

    from test_vllm_user_code import METRICS_LOOP, run_snippet

    run_snippet(METRICS_LOOP, llm=llm, args=SimpleNamespace(num_spec_tokens=num_spec_tokens))


def test_vllm_metrics_loop_prints_the_counters(bigram, capsys):
    """vLLM's acceptance loop reads the engine's counters: the printed numbers are the
    ones predicted exactly from the bigram head, and every metric is one of vLLM's four
    types (its metrics-dump example branches on them)."""
    target, head = bigram
    k = 3
    prompts = ef.random_prompts(LENGTHS, VOCAB, seed=2)
    cont = ef.hf_greedy(target, prompts, [m + k for m in MAX_TOKENS])
    llm, outs = run(target, prompts, MAX_TOKENS, {"method": "eagle", "model": str(head),
                                                  "num_speculative_tokens": k})
    chain = bigram_chain(ef.bigram_head_next_tokens(head, target), k)

    drafts, drafted, accepted, per_pos = expected_counters(prompts, cont, MAX_TOKENS, k, chain)
    assert drafts > 0
    vllm_acceptance_loop(llm, k)
    want = [f"num_drafts: {drafts}", f"num_draft_tokens: {drafted}", f"num_accepted_tokens: {accepted}",
            f"mean acceptance length: {1 + accepted / drafts:.2f}",
            *(f"acceptance at token {i}: {a / drafts:.2f}" for i, a in enumerate(per_pos))]
    assert [line for line in capsys.readouterr().out.splitlines() if line != "-" * 50] == want
    metrics = llm.get_metrics()
    assert all(isinstance(x, (Counter, Gauge, Histogram, Vector)) for x in metrics)
    assert all(x.labels["model_name"] == str(target) for x in metrics)
    assert {x.name for x in metrics} >= {"vllm:num_requests_running", "vllm:num_requests_waiting",
                                         "vllm:prompt_tokens", "vllm:generation_tokens",
                                         "vllm:request_success", "vllm:request_prompt_tokens"}
    success = {x.labels["finished_reason"]: x.value for x in metrics if x.name == "vllm:request_success"}
    assert sum(success.values()) == len(prompts)


@pytest.mark.parametrize("n_min, n_max", [(1, 3), (2, 2)])
def test_ngram_counters_match_reference_lookup(bigram, n_min, n_max):
    target, _ = bigram
    k = 3
    prompts = [[7, 8, 9, 10] * 4, [20, 21, 22, 20, 21], *ef.random_prompts((6, 13, 2), VOCAB, seed=3)]
    max_tokens = [26, 31, 19, 40, 23]
    # Continuations K tokens past max_tokens: a last draft may reach beyond them.
    cont = ef.hf_greedy(target, prompts, [m + k for m in max_tokens])
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": n_min, "prompt_lookup_max": n_max}
    llm, outs = run(target, prompts, max_tokens, spec)
    assert tokens(outs) == [c[:m] for c, m in zip(cont, max_tokens)]
    m = check_metrics(llm, outs, k, "ngram")
    want = expected_counters(prompts, cont, max_tokens, k, lambda h: ef.ngram_lookup(h, k, n_min, n_max))
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens, m.num_accepted_tokens_per_pos) == want
    assert m.num_accepted_tokens_per_pos[-1] > 0


def test_draft_model_partial_acceptance_step_by_step(tmp_path):
    """A near copy of the target as draft model; the engine driven step by step.

    Per step: one draft of K tokens per sequence that was already running; each emits
    1..K+1 tokens; where no sequence finished, accepted == sum(emitted - 1)."""
    kind, k = ef.kind_of("llama"), 3
    target = ef.write_target(tmp_path / "target", kind)
    draft = ef.write_target(tmp_path / "draft", kind, edit=ef.perturb_edit(0.05))
    prompts = ef.random_prompts(LENGTHS, VOCAB, seed=4)
    want = ef.hf_greedy(target, prompts, MAX_TOKENS)
    llm = LLM(str(target), speculative_config={"method": "draft_model", "model": str(draft),
                                               "num_speculative_tokens": k},
              device="cpu", max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS)
    eng, m = llm.engine, llm.engine.metrics
    proposed = record_drafts(llm)
    seqs = [eng.add_request(p, greedy(n)) for p, n in zip(prompts, MAX_TOKENS)]
    joined_while_decoding = False
    while eng.has_unfinished():
        running = [s for s in seqs if s.status is Status.RUNNING]
        waiting = [s for s in seqs if s.status is Status.WAITING]
        before = {s.request_id: len(s.output_token_ids) for s in running}
        counters = (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens)
        done = eng.step()
        assert sum(s.status is Status.RUNNING for s in seqs) <= MAX_NUM_SEQS
        joined = [s for s in waiting if s.status is not Status.WAITING]
        joined_while_decoding |= bool(joined and running)
        for s in joined:  # a prefill emits exactly one token
            assert len(s.output_token_ids) == 1
        emitted = [len(s.output_token_ids) - before[s.request_id] for s in running]
        assert all(1 <= e <= k + 1 for e in emitted), emitted
        d_drafts, d_draft_tokens, d_accepted = (m.num_drafts - counters[0], m.num_draft_tokens - counters[1],
                                                m.num_accepted_tokens - counters[2])
        assert (d_drafts, d_draft_tokens) == (len(running), k * len(running))
        if not set(done) & set(running):
            assert d_accepted == sum(e - 1 for e in emitted)
        else:  # a finishing sequence may drop accepted tokens past max_tokens
            assert d_accepted >= sum(e - 1 for e in emitted)
    assert joined_while_decoding
    assert [s.output_token_ids for s in seqs] == want
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens  # partial acceptance
    # Each draft is the draft model's own greedy continuation (by transformers).
    hf_draft = ef.load_hf(draft)
    for history, drafts in proposed[::4]:
        assert drafts == ef.hf_greedy(draft, [history], [k], model=hf_draft)[0]


@pytest.mark.parametrize("fmt", sorted(cf.WRITERS))
def test_published_head_layouts_equal_plain(tmp_path, fmt):
    """One head of each publisher's layout (checkpoint_factory) drives the engine."""
    target = ef.write_target(tmp_path / "target", ef.kind_of("llama"))
    # No method given: inferred from the config, or (a plain Llama config, as yuhuili
    # EAGLE-1 heads have) from the name, as for yuhuili/EAGLE-LLaMA3-Instruct-8B.
    head = tmp_path / "EAGLE-tiny"
    cf.WRITERS[fmt](head)
    prompts = ef.random_prompts((4, 9, 15), VOCAB, seed=5)
    max_tokens = (14, 11, 9)
    want = ef.hf_greedy(target, prompts, max_tokens)
    spec = {"model": str(head), "num_speculative_tokens": 2}
    if "peagle" in fmt:
        # A P-EAGLE checkpoint turns parallel drafting on, which needs its mask_hidden
        # tensor (this layout has none: tests/test_parallel_drafting.py runs one that
        # does); with it off the head drafts as an EAGLE-3 chain.
        with pytest.raises(ValueError, match="parallel_drafting needs the P-EAGLE mask_hidden"):
            LLM(str(target), speculative_config=spec, device="cpu")
        spec["parallel_drafting"] = False
    llm, outs = run(target, prompts, max_tokens, spec)
    assert tokens(outs) == want
    method = "eagle3" if "eagle3" in fmt or "peagle" in fmt else "eagle"
    assert llm.speculative_config.method == method
    check_metrics(llm, outs, 2, method)


# -- 3. stops inside an accepted run -------------------------------------------------------
@pytest.fixture(scope="module")
def llama_target(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    return ef.write_target(root / "target", ef.kind_of("llama"))


def test_stop_token_inside_accepted_run(llama_target):
    prompt = ef.random_prompts((7,), VOCAB, seed=6)[0]
    ref = ef.hf_greedy(llama_target, [prompt], [30])[0]
    stop = ref[9]
    first = ref.index(stop)
    spec = {"method": "draft_model", "model": str(llama_target), "num_speculative_tokens": 4}
    for s in (None, spec):
        _, outs = run(llama_target, [prompt], [30], s, params=[greedy(30, stop_token_ids=[stop])])
        out = outs[0].outputs[0]
        assert out.token_ids == ref[:first + 1]
        assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_eos_inside_accepted_run(tmp_path, llama_target):
    """EOS (from config.json / generation_config.json) ends a request mid-run unless
    ignore_eos; the stop_reason of an EOS stop is None."""
    import shutil

    prompt = ef.random_prompts((7,), VOCAB, seed=6)[0]
    ref = ef.hf_greedy(llama_target, [prompt], [30])[0]
    eos = ref[11]
    target = Path(shutil.copytree(llama_target, tmp_path / "target"))
    for name in ("config.json", "generation_config.json"):
        cfg = json.loads((target / name).read_text())
        cfg["eos_token_id"] = eos
        (target / name).write_text(json.dumps(cfg))
    spec = {"method": "draft_model", "model": str(target), "num_speculative_tokens": 4}
    for s in (None, spec):
        stop = SamplingParams(temperature=0.0, max_tokens=30)
        keep = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
        _, outs = run(target, [prompt, prompt], [30, 30], s, params=[stop, keep])
        stopped, kept = (o.outputs[0] for o in outs)
        assert stopped.token_ids == ref[:ref.index(eos) + 1]
        assert (stopped.finish_reason, stopped.stop_reason) == ("stop", None)
        assert kept.token_ids == ref and kept.finish_reason == "length"


def test_no_max_tokens_stops_at_max_model_len(llama_target):
    prompt = ef.random_prompts((10,), VOCAB, seed=7)[0]
    ref = ef.hf_greedy(llama_target, [prompt], [MAX_MODEL_LEN - 10])[0]
    spec = {"method": "draft_model", "model": str(llama_target), "num_speculative_tokens": 4}
    for s in (None, spec):
        _, outs = run(llama_target, [prompt], [None], s, params=[greedy(None)])
        out = outs[0].outputs[0]
        assert len(prompt) + len(out.token_ids) == MAX_MODEL_LEN
        assert out.token_ids == ref and out.finish_reason == "length"


# -- 4. sampled decoding ----------------------------------------------------------------------
@pytest.mark.parametrize("method", [None, "ngram", "eagle"])
def test_seeded_sampling_reproducible_across_batches(tmp_path, llama_target, method):
    spec = None
    if method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": 3, **NGRAM}
    elif method == "eagle":
        ef.write_head(tmp_path / "head", ef.kind_of("llama"), "eagle")
        spec = {"method": "eagle", "model": str(tmp_path / "head"), "num_speculative_tokens": 3}
    mine = ef.random_prompts((9,), VOCAB, seed=8)[0]
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=20, ignore_eos=True)
    alone = tokens(run(llama_target, [mine], [20], spec, max_num_seqs=1, params=[seeded])[1])[0]

    others = ef.random_prompts((3, 17, 6, 11), VOCAB, seed=9)
    other_params = [SamplingParams(temperature=1.0, seed=7, max_tokens=13, ignore_eos=True),
                    SamplingParams(temperature=0.7, top_k=5, max_tokens=25, ignore_eos=True),
                    greedy(8),
                    SamplingParams(temperature=1.3, max_tokens=17, ignore_eos=True)]
    prompts = others[:2] + [mine] + others[2:]
    params = other_params[:2] + [seeded] + other_params[2:]
    for n in (2, 5):
        batch = tokens(run(llama_target, prompts, None, spec, max_num_seqs=n, params=params)[1])
        assert batch[2] == alone
    other_seed = SamplingParams(temperature=0.9, top_p=0.95, seed=4321, max_tokens=20, ignore_eos=True)
    assert tokens(run(llama_target, [mine], [20], spec, max_num_seqs=1, params=[other_seed])[1])[0] != alone


def test_sampled_speculative_distribution_matches_target(tmp_path, llama_target):
    """Three sampled tokens (temperature 1, top-k 2: eight outcomes) through a draft model
    that is often wrong: their joint frequency over many requests matches the product of
    the target's conditional distributions computed by transformers (chi-square)."""
    draft = ef.write_target(tmp_path / "draft", ef.kind_of("llama"), edit=ef.perturb_edit(0.05))
    prompt = ef.random_prompts((6,), VOCAB, seed=10)[0]
    n, top_k = 600, 2
    params = SamplingParams(temperature=1.0, top_k=top_k, max_tokens=3, ignore_eos=True)
    llm = LLM(str(llama_target), speculative_config={"method": "draft_model", "model": str(draft),
                                                     "num_speculative_tokens": 2},
              device="cpu", max_model_len=32, max_num_seqs=64, seed=11)
    outs = llm.generate(token_prompts([prompt] * n), params)
    counts: dict[tuple, int] = {}
    for t in tokens(outs):
        counts[tuple(t)] = counts.get(tuple(t), 0) + 1

    expected = ef.hf_three_token_probs(ef.load_hf(llama_target), prompt, top_k)
    assert set(counts) <= set(expected), "a token outside the target's top-k was emitted"
    chi2 = sum((counts.get(key, 0) - n * p) ** 2 / (n * p) for key, p in expected.items())
    assert chi2 < 24.3, (chi2, counts, expected)  # 7 degrees of freedom, p = 0.001
    m = llm.engine.metrics
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens  # both acceptance and rejection ran


# -- 5. SmolLM2, the embedded default target ----------------------------------------------------
SMOL_PROMPTS = [
    "The capital of France is",
    # Repetitive text: the model repeats it, so prompt lookup drafts well.
    "Repeat after me. The quick brown fox jumps over the lazy dog. The quick brown fox jumps "
    "over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
]
SMOL_TOKENS = 24


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from eagle_zoo import default_target as dt

    try:
        path = dt.resolve_default(dt.DEFAULT_MODEL_ID)
    except dt.DefaultTargetError as exc:
        pytest.skip(f"default target unavailable: {exc}")
    return path


def write_smollm2_eagle_head(directory: Path, target: Path) -> Path:
    """A random yuhuili EAGLE-1 head at SmolLM2's sizes (hidden 576, 9 heads, 3 kv heads,
    intermediate 1536, vocab 49152): fc + one decoder layer, no embed_tokens / lm_head
    (shared from the target)."""
    cfg = json.loads((target / "config.json").read_text())
    cfg.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"])
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["intermediate_size"], cfg["vocab_size"]) == (576, 9, 3, 1536, 49152)
    gen = torch.Generator().manual_seed(0)
    H = cfg["hidden_size"]
    w = cf.decoder_layer(gen, "layers.0.", cfg, H, ("post_attention_layernorm",))
    w["fc.weight"] = torch.randn(H, 2 * H, generator=gen) * 0.02
    cf.write_config(directory, cfg)
    cf.save_weights(directory, w, "safetensors")
    return directory


@pytest.mark.slow
def test_smollm2_speculative_equals_plain(smollm2, tmp_path):
    params = SamplingParams(temperature=0.0, max_tokens=SMOL_TOKENS, ignore_eos=True)
    kw = dict(device="cpu", dtype="float32", max_model_len=128, max_num_seqs=2)
    plain = LLM("HuggingFaceTB/SmolLM2-135M-Instruct", **kw)
    want = plain.generate(SMOL_PROMPTS, params)
    del plain
    ids = [o.prompt_token_ids for o in want]
    assert tokens(want) == ef.hf_greedy(smollm2, ids, [SMOL_TOKENS] * len(ids))

    head = write_smollm2_eagle_head(tmp_path / "head", smollm2)
    for spec, method in (({"method": "ngram", "num_speculative_tokens": 3, **NGRAM}, "ngram"),
                         ({"method": "eagle", "model": str(head), "num_speculative_tokens": 3}, "eagle")):
        llm = LLM("HuggingFaceTB/SmolLM2-135M-Instruct", speculative_config=spec, **kw)
        outs = llm.generate(SMOL_PROMPTS, params)
        assert tokens(outs) == tokens(want), method
        assert [o.outputs[0].text for o in outs] == [o.outputs[0].text for o in want]
        m = check_metrics(llm, outs, 3, method)
        if method == "ngram":  # the second prompt repeats itself
            assert m.num_accepted_tokens > 0
        del llm
