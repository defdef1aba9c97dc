"""Adaptive speculation depth (K chosen per step from the batch size), end to end on CPU.

Greedy speculative output must equal plain output whatever K each step used, and the
proposer's state must stay right across K changes and plain (K = 0) steps. Output
equality alone would not show the latter (verification fixes any draft), so the drafts
of every step are checked against a from-scratch recomputation (transformers' target
features, the head without a KV cache: test_engine.reference_eagle_drafts), the draft
model drafting for itself must have every draft accepted, and the bigram head's drafts
are known from its files.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from eagle_zoo.config.depth_schedule import DepthSchedule
from eagle_zoo.config.speculative import SpeculativeConfig, SpeculativeConfigError
from test_engine import expected_counters, reference_eagle_drafts

VOCAB = cf.TINY["vocab_size"]
LENGTHS = (5, 12, 3, 19, 8)
MAX_TOKENS = (24, 30, 17, 21, 27)
MAX_NUM_SEQS = 3
MAX_MODEL_LEN = 96
# Batch 3: two drafts; batch 2: a plain step; batch 1: three drafts. With five requests
# and three slots the batch grows and shrinks as requests finish and join, so every
# request crosses between K values and through plain steps.
SCHEDULE = {"1": 3, "2": 0, "3": 2}
FAMILIES = ("llama", "mistral")  # mistral: a sliding window shorter than the sequences


pytestmark = pytest.mark.usefixtures("one_thread")


def greedy(n):
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """family -> (root, kind, target dir, prompts, plain greedy outputs)."""
    cache = {}

    def get(family):
        if family not in cache:
            kind = ef.kind_of(family)
            root = tmp_path_factory.mktemp(family)
            target = ef.write_target(root / "target", kind)
            prompts = ef.random_prompts(LENGTHS, VOCAB, seed=1)
            plain = generate(target, prompts, None)[1]
            cache[family] = (root, kind, target, prompts, plain)
        return cache[family]

    return get


def generate(target, prompts, spec, max_tokens=MAX_TOKENS, max_num_seqs=MAX_NUM_SEQS, watch=None):
    llm = LLM(str(target), speculative_config=spec, device="cpu", dtype="float32",
              max_model_len=MAX_MODEL_LEN, max_num_seqs=max_num_seqs)
    if watch is not None:
        watch(llm)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], [greedy(m) for m in max_tokens])
    return llm, [o.outputs[0].token_ids for o in outs]


class StepLog:
    """Wraps the engine's proposer: every propose() (history per sequence, drafts, the
    batch size) and every plain step's slots."""

    def __init__(self, llm):
        self.proposals = []  # (history, drafts, batch size)
        self.plain_steps = []  # slots of the sequences of each plain step
        self.verify_widths = []  # per catch-up: (batch size, [input shape of each head pass])
        p = llm.engine.proposer
        propose, plain = p.propose, p.on_plain_step
        head_pass = getattr(p, "_head_pass", None)  # an EAGLE head's passes over verified tokens

        def recording_propose(batch):
            drafts, num = propose(batch)
            n = len(drafts)
            for history, row in zip(batch.token_history or [None] * n, drafts.tolist()):
                self.proposals.append((history, row, n))
            return drafts, num

        def recording_plain(batch, out):
            self.plain_steps.append(batch.slots.tolist())
            return plain(batch, out)

        p.propose, p.on_plain_step = recording_propose, recording_plain
        if hasattr(p, "on_verify") and head_pass is not None:
            verify = p.on_verify

            def recording_verify(batch, out, accepted):
                calls = []
                p._head_pass = lambda ids, *a, **kw: calls.append(ids.shape) or head_pass(ids, *a, **kw)
                try:
                    return verify(batch, out, accepted)
                finally:
                    p._head_pass = head_pass
                    self.verify_widths.append((len(batch.slots), [tuple(c) for c in calls]))

            p.on_verify = recording_verify


def eagle_spec(root, kind, method, **extra):
    head = root / f"head-{method}"
    if not head.exists():
        ef.write_head(head, kind, method)
    return {"method": method, "model": str(head), **extra}


def needs_history(llm):
    # The EAGLE proposer does not read token histories; the reference needs them.
    llm.engine.proposer.needs_token_history = True


def generate_logged(target, prompts, spec, history=False, max_num_seqs=MAX_NUM_SEQS):
    """generate() with a StepLog on the proposer (``history``: token histories on, for
    the references that need them) -> (llm, outputs, log)."""
    log = {}

    def watch(llm):
        if history:
            needs_history(llm)
        log["steps"] = StepLog(llm)

    llm, got = generate(target, prompts, spec, max_num_seqs=max_num_seqs, watch=watch)
    return llm, got, log["steps"]


# -- 1. the option ---------------------------------------------------------------------------
def parse(obj):
    return SpeculativeConfig.parse(obj)


def test_schedule_is_normalised_and_sets_the_largest_depth():
    cfg = parse({"method": "ngram", "num_speculative_tokens_by_batch_size": {"8": 0, "1": 4, "4": 2}})
    assert cfg.num_speculative_tokens_by_batch_size == {"1": 4, "4": 2, "8": 0}
    assert cfg.num_speculative_tokens == 4  # the largest depth when not given
    cfg = parse({"method": "ngram", "num_speculative_tokens": 5, "num_speculative_tokens_by_batch_size": {"1": 2}})
    assert cfg.num_speculative_tokens == 5
    auto = parse({"method": "ngram", "num_speculative_tokens_by_batch_size": "auto"})
    assert auto.num_speculative_tokens_by_batch_size == "auto" and auto.num_speculative_tokens is None
    assert parse(json.dumps({"method": "ngram", "num_speculative_tokens_by_batch_size": {"1": 1}})
                 ).num_speculative_tokens_by_batch_size == {"1": 1}


def test_schedule_depths():
    s = DepthSchedule.from_config({"1": 4, "4": 2, "8": 0}, 4)
    assert [s.depth(b) for b in (1, 2, 3, 4, 7, 8, 200)] == [4, 4, 4, 2, 2, 0, 0]
    # "auto" as documented in docs/speculative-config.md: on CUDA K up to batch 64, plain
    # from 65; on the CPU K at batch 1 only.
    auto = DepthSchedule.from_config("auto", 5)
    assert [auto.depth(b) for b in (1, 4, 16, 63, 64, 65, 96, 128)] == [5, 5, 5, 5, 5, 0, 0, 0]
    cpu = DepthSchedule.from_config("auto", 3, "cpu")
    assert [cpu.depth(b) for b in (1, 2, 8)] == [3, 0, 0]
    assert DepthSchedule.from_config(None, 3) is None


@pytest.mark.parametrize("value, match", [
    ({"2": 3}, 'must start at batch size 1.*add "1"'),
    ({"1": -1}, r"\['1'\] must be an integer >= 0"),
    ({"1": True}, r"\['1'\] must be an integer >= 0"),
    ({"1": 2.0}, r"\['1'\] must be an integer >= 0"),
    ({"one": 2}, "key 'one' is not a batch size"),
    ({"0": 2}, "key '0' is not a batch size"),
    ({"1": 0, "4": 0}, "every depth is 0"),
    (True, 'write "auto"'),
    ([[1, 3]], 'must be "auto" or an object'),
    ("fast", 'must be "auto" or an object'),
], ids=["no-1", "negative", "bool", "float", "word-key", "zero-key", "all-zero", "true", "list", "string"])
def test_schedule_errors(value, match):
    with pytest.raises(SpeculativeConfigError, match="num_speculative_tokens_by_batch_size") as info:
        parse({"method": "ngram", "num_speculative_tokens_by_batch_size": value})
    assert info.match(match)


def test_schedule_deeper_than_num_speculative_tokens():
    with pytest.raises(SpeculativeConfigError, match="asks for 4 draft tokens but num_speculative_tokens is 2"):
        parse({"method": "ngram", "num_speculative_tokens": 2, "num_speculative_tokens_by_batch_size": {"1": 4}})


def test_schedule_with_tree_is_refused():
    with pytest.raises(SpeculativeConfigError, match="does not combine with 'tree'"):
        parse({"method": "eagle", "model": "x", "tree": True, "num_speculative_tokens_by_batch_size": "auto"})


# -- 2. EAGLE / EAGLE-3: greedy equality, drafts after every kind of step ------------------------
@pytest.mark.usefixtures("cpu_drafts_always_k")  # counters compared with paths that draft K
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("family", FAMILIES)
def test_adaptive_eagle_equals_plain(cases, family, method):
    root, kind, target, prompts, plain = cases(family)
    spec = eagle_spec(root, kind, method, num_speculative_tokens_by_batch_size=SCHEDULE)
    llm, got, steps = generate_logged(target, prompts, spec, history=True)
    assert got == plain
    schedule = llm.engine.depth_schedule
    # The schedule picked K from the batch size, and crossed all its depths.
    assert all(len(drafts) == schedule.depth(n) for _, drafts, n in steps.proposals)
    assert {k for k, c in schedule.steps_by_depth.items() if c} == {0, 2, 3}
    assert steps.plain_steps and all(len(s) == 2 for s in steps.plain_steps)
    # Every draft equals the from-scratch chain: the head's cache and features kept up
    # through plain steps and K changes.
    hf_target, head = ef.load_hf(target), llm.engine.proposer.head
    for history, drafts, _ in steps.proposals:
        assert drafts == reference_eagle_drafts(hf_target, head, method, history, len(drafts))
    assert steps.verify_widths
    for batch_size, shapes in steps.verify_widths:
        # one [B, K+1] pass, K the step's depth (2 or 3 here)
        assert len(shapes) == 1 and shapes[0][0] == batch_size and shapes[0][1] in (3, 4)
    m = llm.engine.metrics
    assert len(m.num_accepted_tokens_per_pos) == 3  # sized by the largest K
    assert m.num_drafts > 0 and m.num_draft_tokens == sum(len(d) for _, d, _ in steps.proposals)


# -- 3. exact drafts with high acceptance (the bigram head of test_engine) -----------------------
@pytest.fixture(scope="module")
def bigram(tmp_path_factory):
    root = tmp_path_factory.mktemp("bigram")
    target = ef.write_target(root / "target", ef.kind_of("llama"), edit=ef.bigram_edit())
    return target, ef.write_bigram_eagle_head(root / "head", target)


def test_bigram_head_counters_exact(bigram):
    """Fixed K: the counters are predicted exactly (request by request) from the
    reference continuation and the head's known drafts; every verification pass is K+1
    wide (the padded catch-up)."""
    target, head = bigram
    k = 3
    prompts = ef.random_prompts(LENGTHS, VOCAB, seed=2)
    cont = ef.hf_greedy(target, prompts, [m + k for m in MAX_TOKENS])
    g = ef.bigram_head_next_tokens(head, target)

    def chain(history, depth=k):
        draft = [g[history[-1]]]
        while len(draft) < depth:
            draft.append(g[draft[-1]])
        return draft

    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens": k}
    llm, got, steps = generate_logged(target, prompts, spec, max_num_seqs=2)
    assert got == [c[:m] for c, m in zip(cont, MAX_TOKENS)]
    m = llm.engine.metrics
    want = expected_counters(prompts, cont, MAX_TOKENS, k, chain)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens, m.num_accepted_tokens_per_pos) == want
    widths = Counter(t for _, shapes in steps.verify_widths for _, t in shapes)
    assert set(widths) == {k + 1}


def test_bigram_head_adaptive_drafts_known(bigram):
    """With a schedule (including plain steps) each step's drafts are the head's known
    chain of that step's depth after the sequence's last token."""
    target, head = bigram
    prompts = ef.random_prompts(LENGTHS, VOCAB, seed=2)
    cont = ef.hf_greedy(target, prompts, list(MAX_TOKENS))
    g = ef.bigram_head_next_tokens(head, target)
    spec = {"method": "eagle", "model": str(head), "num_speculative_tokens_by_batch_size": SCHEDULE}
    llm, got, steps = generate_logged(target, prompts, spec, history=True)
    assert got == cont
    assert steps.plain_steps
    for history, drafts, _ in steps.proposals:
        want = [g[history[-1]]]
        while len(want) < len(drafts):
            want.append(g[want[-1]])
        assert drafts == want
    assert llm.engine.metrics.num_accepted_tokens > 0


# -- 4. other proposers with a schedule ------------------------------------------------------------
def test_adaptive_draft_model_drafting_for_itself(cases):
    """The target as its own draft model: every draft is right only if the draft's cache
    kept up through plain steps, so all drafted tokens are accepted."""
    root, kind, target, prompts, plain = cases("llama")
    spec = {"method": "draft_model", "model": str(target), "num_speculative_tokens_by_batch_size": SCHEDULE}
    llm, got, steps = generate_logged(target, prompts, spec)
    assert got == plain
    m, schedule = llm.engine.metrics, llm.engine.depth_schedule
    assert steps.plain_steps and {k for k, c in schedule.steps_by_depth.items() if c} == {0, 2, 3}
    assert m.num_draft_tokens > 0 and m.num_accepted_tokens == m.num_draft_tokens
    assert m.num_accepted_tokens_per_pos[:2] == [m.num_drafts] * 2


def test_adaptive_ngram(cases):
    root, kind, target, prompts, plain = cases("llama")
    spec = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3,
            "num_speculative_tokens_by_batch_size": SCHEDULE}
    llm, got, steps = generate_logged(target, prompts, spec)
    assert got == plain
    schedule = llm.engine.depth_schedule
    for history, drafts, n in steps.proposals:
        k = schedule.depth(n)
        assert drafts[:len(ef.ngram_lookup(history, k, 1, 3))] == ef.ngram_lookup(history, k, 1, 3)
        assert len(drafts) <= k


def test_auto_schedule_on_the_cpu(cases):
    """"auto" on the CPU with nine requests at once: plain steps while two or more run,
    K=2 once one is left; output equal to plain decoding."""
    root, kind, target, _, _ = cases("llama")
    prompts = ef.random_prompts((4, 9, 3, 11, 6, 7, 5, 10, 8), VOCAB, seed=12)
    max_tokens = (6, 9, 12, 14, 16, 18, 20, 22, 25)
    plain = generate(target, prompts, None, max_tokens=max_tokens, max_num_seqs=9)[1]
    spec = eagle_spec(root, kind, "eagle", num_speculative_tokens=2, num_speculative_tokens_by_batch_size="auto")
    llm, got = generate(target, prompts, spec, max_tokens=max_tokens, max_num_seqs=9)
    assert got == plain
    steps = llm.engine.depth_schedule.steps_by_depth
    assert steps[0] > 0 and steps[2] > 0 and steps[1] == 0, steps


@pytest.mark.parametrize("method", ["eagle3", "draft_model"])
def test_adaptive_sampled_runs_and_repeats(cases, method):
    """Sampled requests through K changes and plain steps: every request gets its
    max_tokens, tokens stay in the vocabulary, and a rerun (same seeds, same batches)
    repeats the output exactly."""
    root, kind, target, prompts, _ = cases("llama")
    if method == "draft_model":
        spec = {"method": "draft_model", "model": str(target)}
    else:
        spec = eagle_spec(root, kind, method)
    spec["num_speculative_tokens_by_batch_size"] = SCHEDULE
    params = [SamplingParams(temperature=0.8, top_k=20, seed=i, max_tokens=m, ignore_eos=True)
              for i, m in enumerate(MAX_TOKENS)]
    runs = []
    for _ in range(2):
        llm = LLM(str(target), speculative_config=spec, device="cpu", dtype="float32",
                  max_model_len=MAX_MODEL_LEN, max_num_seqs=MAX_NUM_SEQS)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        runs.append([o.outputs[0].token_ids for o in outs])
        assert llm.engine.depth_schedule.steps_by_depth[0] > 0
    assert runs[0] == runs[1]
    assert [len(t) for t in runs[0]] == list(MAX_TOKENS)
    assert all(0 <= t < VOCAB for out in runs[0] for t in out)
