"""EAGLE-2 dynamic draft trees (speculative_config "tree"), on CPU with tiny random models.

1. The tree helpers (engine/tree.py, tree_verify.py) against brute-force Python on
   small hand-checked trees: depth, ancestor paths, attention masks, candidate
   selection (ties, -inf, fewer nodes than top_k), greedy acceptance, KV compaction.
2. Greedy tree decoding equals transformers' greedy decoding token for token (eagle and
   eagle3 heads, Llama and Qwen3, batch 1 and 3, several tree shapes).
3. The drafted trees themselves equal a from-scratch recomputation (transformers'
   target features, the head run without a KV cache, the selection rule in plain
   Python), so drafting positions, masks, scratch columns and catch-up all count.
4. A head that drafts well (the bigram pair of engine_fixtures): deep paths accepted.
5. Sampled requests: the tree's recursive rejection sampling against the target
   distribution (chi-square, by hand and end to end), seeded reproducibility, greedy
   requests exact inside sampled batches.
6. Options and refusals.

References nobody here wrote: transformers' forward (targets, features through
engine_fixtures.hf_head_features); the rest is brute force written for this file (no
shared code with the helpers under test).
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import checkpoint_factory as cf
import engine_fixtures as ef
from eagle_zoo import LLM, SamplingParams
from eagle_zoo.config.speculative import SpeculativeConfig, SpeculativeConfigError
from eagle_zoo.engine import tree_verify
from eagle_zoo.engine.tree import select_tree
from eagle_zoo.engine.tree_verify import accept_greedy, compact_kv
from eagle_zoo.kernels.attention import tree_visibility
from eagle_zoo.kernels.tree_select import build_tree

VOCAB = cf.TINY["vocab_size"]
MAX_MODEL_LEN = 96
LENGTHS = (5, 12, 3)
MAX_TOKENS = (20, 26, 14)


# -- 1. tree helpers -----------------------------------------------------------------------
def brute_paths(parents: list[int]) -> list[list[int]]:
    """Root -> node path of every node, by walking parent links."""
    paths = []
    for i in range(len(parents)):
        path, node = [], i
        while node != -1:
            path.insert(0, node)
            node = parents[node]
        paths.append(path)
    return paths


# Hand-checked trees (node: parent): a chain, a star, and a mixed tree.
TREES = {
    "chain": [-1, 0, 1, 2, 3],
    "star": [-1, 0, 0, 0],
    "mixed": [-1, 0, 0, 1, 1, 2, 3, 6],
}


@pytest.mark.parametrize("name", TREES)
def test_build_tree_matches_brute_force(name):
    parents = TREES[name]
    paths = brute_paths(parents)
    L = max(len(p) for p in paths) - 1
    depth, anc = build_tree(torch.tensor([parents, parents]), L + 1)  # a loose bound works too
    for b in range(2):
        assert depth[b].tolist() == [len(p) - 1 for p in paths]
        for i, path in enumerate(paths):
            assert anc[b, i].tolist() == path + [-1] * (L + 2 - len(path))


def test_build_tree_mixed_by_hand():
    depth, anc = build_tree(torch.tensor([TREES["mixed"]]), 4)
    assert depth[0].tolist() == [0, 1, 1, 2, 2, 2, 3, 4]
    assert anc[0, 7].tolist() == [0, 1, 3, 6, 7]
    assert anc[0, 5].tolist() == [0, 2, 5, -1, -1]


def brute_select(scores, parents, n):
    """Keep the n best candidates (score desc, lower number first on ties), in number order."""
    order = sorted(range(len(scores)), key=lambda c: (-scores[c], c))[:n]
    return sorted(order)


@pytest.mark.parametrize("case", ["plain", "ties", "neg_inf", "fewer_than_top_k"])
def test_select_tree(case):
    # Candidates: 0-2 the root's children (top_k = 3); 3-11 children of candidates 0, 1, 2
    # (three each, in that order), i.e. parent = 0,0,0,1,1,1,2,2,2.
    parents = [-1, -1, -1, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    tokens = list(range(100, 112))
    lp = {"plain": [-0.1, -0.7, -2.0, -0.2, -1.5, -3.0, -0.05, -2.5, -4.0, -0.3, -0.4, -5.0],
          # parent and child tie (a child with log-prob 0), and equal siblings
          "ties": [-0.5, -0.5, -1.0, 0.0, -0.1, -0.1, -0.2, -9.0, -9.0, 0.0, -3.0, -3.0],
          # an EAGLE-3 head gives -inf to tokens outside its draft vocabulary
          "neg_inf": [-0.1, -float("inf"), -0.3, -0.2, -float("inf"), -float("inf"),
                      -1.0, -2.0, -3.0, -0.5, -0.6, -0.7],
          "fewer_than_top_k": [-0.1, -0.7, -2.0, -0.2, -1.5, -3.0, -0.05, -2.5, -4.0, -0.3, -0.4, -5.0]}[case]
    scores = []
    for c, p in enumerate(parents):
        scores.append(lp[c] + (scores[p] if p >= 0 else 0.0))
    n = 2 if case == "fewer_than_top_k" else 7
    kept = brute_select(scores, parents, n)
    assert all(parents[c] in kept or parents[c] == -1 for c in kept)  # ancestor-closed
    columns = 40 + torch.arange(n + 1).view(1, n + 1)  # base 40
    tree = select_tree(torch.tensor([scores]), torch.tensor([tokens]), torch.tensor([parents]), torch.tensor([77]),
                       columns, 2)
    assert tree.columns is columns
    assert tree.tokens[0].tolist() == [77] + [tokens[c] for c in kept]
    want_parents = [-1] + [0 if parents[c] == -1 else kept.index(parents[c]) + 1 for c in kept]
    assert tree.parents[0].tolist() == want_parents
    assert tree.depth[0].tolist() == [len(p) - 1 for p in brute_paths(want_parents)]
    assert tree.positions[0].tolist() == [40 + len(p) - 1 for p in brute_paths(want_parents)]
    if case == "plain":  # by hand: 0 (-0.1), 3 (-0.3), 1 (-0.7), 6 (-0.75), 4 (-1.6), 2 (-2.0), 9 (-2.3)
        assert kept == [0, 1, 2, 3, 4, 6, 9]
    if case == "fewer_than_top_k":
        assert kept == [0, 3] and want_parents == [-1, 0, 1]


def test_tree_visibility_is_the_history_and_each_nodes_path():
    """kernels/attention.py tree_visibility, the mask of a tree pass's keys where no kernel
    walks them: the history below base, then the columns of the node's ancestors up to
    its own level (entries past it, here 7, are not read)."""
    base = torch.tensor([3, 5])
    ancestors = torch.tensor([[[0, 7, 7], [0, 2, 7]], [[0, 1, 3], [0, 7, 7]]])  # [B, T, L]
    positions = base.view(2, 1) + torch.tensor([[0, 1], [2, 0]])
    mask = tree_visibility((positions, base, ancestors), 10)
    for b in range(2):
        for t in range(2):
            path = {int(base[b]) + int(ancestors[b, t, d]) for d in range(int(positions[b, t] - base[b]) + 1)}
            assert mask[b, t].tolist() == [c < base[b] or c in path for c in range(10)]
    # A verified tree's (node numbers as columns): the history and each node's path.
    parents = TREES["mixed"]
    depth, anc = build_tree(torch.tensor([parents] * 2), 4)
    mask = tree_visibility((base.view(2, 1) + depth, base, anc), 16)
    for b in range(2):
        for i, path in enumerate(brute_paths(parents)):
            assert mask[b, i].nonzero().flatten().tolist() == list(range(base[b])) + [base[b] + j for j in path]


def test_accept_greedy_by_hand():
    # Tree "mixed": node tokens; the target's argmax after each node picks the path
    # 0 -> 1 -> 4 in sequence 0 (node 3 wrong), nothing in sequence 1.
    parents = torch.tensor([TREES["mixed"]] * 2)
    depth, anc = build_tree(parents, 4)
    node_tokens = torch.tensor([[9, 10, 11, 12, 13, 14, 15, 16]] * 2)
    from eagle_zoo.engine.tree import TreeDraft

    tree = TreeDraft(node_tokens, parents, depth, anc, torch.arange(8).expand(2, 8), depth)
    argmax = torch.tensor([[10, 13, 14, 15, 40, 41, 16, 42],
                           [50, 51, 52, 53, 54, 55, 56, 57]])
    tokens, accepted, path = accept_greedy(argmax, tree)
    assert accepted.tolist() == [2, 0]
    assert tokens.tolist() == [[10, 13, 40, -1, -1], [50, -1, -1, -1, -1]]
    assert path.tolist() == [[0, 1, 4, 3, 4], [0, 1, 2, 3, 4]]  # past the path: the level itself


def test_compact_kv():
    k = torch.arange(2 * 12, dtype=torch.float32).view(2, 12, 1, 1).repeat(1, 1, 2, 3)
    v = -k.clone()
    before = k.clone()
    slots, base = torch.tensor([1, 0]), torch.tensor([2, 4])
    path = torch.tensor([[0, 2, 5, 3], [0, 1, 2, 3]])
    compact_kv([(k, v)], slots, base, path)
    want = before.clone()
    want[1, 3], want[1, 4] = before[1, 2 + 2], before[1, 2 + 5]
    assert torch.equal(k, want) and torch.equal(v, -want)


def test_compact_kv_on_stacked_caches_equals_layer_by_layer():
    """allocate_kv_caches stacks same-shaped layers into one tensor; compaction then moves
    every layer's k and v in one gather / scatter, with the per-layer loop's result."""
    from eagle_zoo.engine.cache import KVCaches

    g = torch.Generator().manual_seed(3)
    caches = KVCaches()
    caches.stacked = torch.randn(3, 2, 2, 12, 2, 4, generator=g)
    caches.extend((caches.stacked[i, 0], caches.stacked[i, 1]) for i in range(3))
    separate = [(k.clone(), v.clone()) for k, v in caches]
    slots, base = torch.tensor([1, 0]), torch.tensor([2, 4])
    path = torch.tensor([[0, 2, 5, 3], [0, 1, 2, 3]])
    before = caches.stacked.clone()
    compact_kv(caches, slots, base, path)
    compact_kv(separate, slots, base, path)
    assert not torch.equal(caches.stacked, before)
    for (k, v), (k2, v2) in zip(caches, separate):
        assert torch.equal(k, k2) and torch.equal(v, v2)


# -- 2. greedy tree decoding == transformers -------------------------------------------------
def greedy(n) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cache = {}

    def get(family: str, method: str, scale: float = 0.1):
        if family not in cache:
            root = tmp_path_factory.mktemp(family)
            kind = ef.kind_of(family)
            target = ef.write_target(root / "target", kind)
            prompts = ef.random_prompts(LENGTHS, VOCAB, seed=1)
            cache[family] = (root, kind, target, prompts, ef.hf_greedy(target, prompts, MAX_TOKENS))
        root, kind, target, prompts, want = cache[family]
        head = root / f"head-{method}-{scale}"
        if not head.exists():
            ef.write_head(head, kind, method, seed=4, scale=scale)
        return target, head, prompts, want

    return get


def make_llm(target, spec, max_num_seqs):
    return LLM(str(target), speculative_config=spec, device="cpu", dtype="float32",
               max_model_len=MAX_MODEL_LEN, max_num_seqs=max_num_seqs)


def generate(llm, prompts, params):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return [o.outputs[0].token_ids for o in outs]


def check_counters(llm, outs, max_depth, num_nodes):
    """Every token after the prefill's comes from a tree step emitting accepted + 1."""
    m = llm.engine.metrics
    R = len(outs)
    per_pos = m.num_accepted_tokens_per_pos
    assert len(per_pos) == max_depth and sum(per_pos) == m.num_accepted_tokens
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))
    assert m.num_draft_tokens == num_nodes * m.num_drafts
    cut = R + m.num_drafts + m.num_accepted_tokens - sum(len(t) for t in outs)
    assert 0 <= cut <= max_depth * R
    assert m.mean_acceptance_length == pytest.approx(1 + m.num_accepted_tokens / m.num_drafts)
    return m


# (top_k, depth, total_tokens): a small tree, total_tokens - 1 < top_k (twice: the
# second a single draft node, no expansion round), a wide shallow one, and a deep one
# that total_tokens cuts short.
SHAPES = [(3, 3, 8), (4, 2, 3), (5, 3, 2), (8, 2, 40), (2, 6, 6)]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "k{}-d{}-n{}".format(*s))
def test_greedy_tree_equals_transformers(models, family, method, shape):
    target, head, prompts, want = models(family, method)
    top_k, depth, total = shape
    spec = {"method": method, "model": str(head), "tree": {"top_k": top_k, "depth": depth, "total_tokens": total}}
    max_depth = min(depth + 1, total - 1)
    for batch in (1, 3):
        llm = make_llm(target, spec, batch)
        outs = generate(llm, prompts, [greedy(n) for n in MAX_TOKENS])
        assert outs == want, (batch, shape)
        check_counters(llm, outs, max_depth, total - 1)


def test_graph_mode_runs_the_greedy_tree_step_as_one_graph(models):
    """With graphs on, a greedy tree step is one captured function over whole cache rows
    (drafting rounds, the target's tree pass, acceptance, compaction, catch-up): the
    runners' own graphs then serve only prefill, and the output is unchanged."""
    target, head, prompts, want = models("llama", "eagle3", scale=0.6)
    spec = {"method": "eagle3", "model": str(head), "tree": {"top_k": 3, "depth": 3, "total_tokens": 9}}
    llm = make_llm(target, spec, 3)
    calls = []
    for name, runner in (("target", llm.engine.runner), ("head", llm.engine.proposer.runner)):
        runner.graphed = ef.RunnerGraphStandIn(runner, name, calls)
    engine = llm.engine
    engine.tree_step_graph = ef.StepGraphStandIn(tree_verify.whole_row_greedy_step(engine), calls, "tree step",
                                                 engine.runner.scratch_slot, engine.proposer.total_tokens - 1)
    assert generate(llm, prompts, [greedy(n) for n in MAX_TOKENS]) == want
    prefill = sorted({n for n in LENGTHS if n <= 16})
    assert sorted({t for name, t in calls if name == "target"}) == prefill  # never the 9-node tree pass
    assert {t for name, t in calls if name == "head"} == set(prefill)  # the catch-up is inside the step
    assert ("tree step", 1) in calls
    assert llm.engine.metrics.num_accepted_tokens > 0
    assert llm.engine.runner.kv_caches.stacked is not None  # compaction took the one-tensor path


def test_sampled_tree_steps_stay_eager_with_graphs(models):
    """Sampled tree steps draw from per-request generators, outside any graph."""
    target, head, prompts, _ = models("llama", "eagle3", scale=0.6)
    spec = {"method": "eagle3", "model": str(head), "tree": {"top_k": 3, "depth": 3, "total_tokens": 9}}
    llm = make_llm(target, spec, 3)
    calls = []
    llm.engine.tree_step_graph = ef.StepGraphStandIn(lambda *a: pytest.fail("a sampled step was graphed"), calls,
                                                     "tree step", llm.engine.runner.scratch_slot)
    outs = generate(llm, prompts[:2], [SamplingParams(temperature=0.8, seed=3, max_tokens=6)] * 2)
    assert all(len(o) == 6 for o in outs) and not calls


def test_tree_runs_to_max_model_len(models):
    """Without max_tokens a request runs until the context is full: the last steps write
    tree nodes (and head scratch) past max_model_len, which the caches must hold."""
    target, head, prompts, _ = models("llama", "eagle3", scale=0.6)
    spec = {"method": "eagle3", "model": str(head), "tree": {"top_k": 8, "depth": 2, "total_tokens": 40}}
    want = ef.hf_greedy(target, prompts[:2], [MAX_MODEL_LEN - len(p) for p in prompts[:2]])
    got = generate(make_llm(target, spec, 2), prompts[:2], [greedy(None)] * 2)
    assert got == want and [len(p) + len(g) for p, g in zip(prompts, got)] == [MAX_MODEL_LEN] * 2


# -- 3. drafted trees against a from-scratch recomputation ----------------------------------
@torch.no_grad()
def reference_tree(hf_target, head, method, history, top_k, depth, total_tokens):
    """(token, parent node) of nodes 1..total_tokens-1, recomputed without any KV cache:
    target features of the verified tokens from transformers; each expanded node's head
    output from running the head over the whole sequence (history, then the node's
    path), feeding each path entry its parent's head output; the full `depth` rounds."""
    feats = ef.hf_head_features(hf_target, head, method, history)
    ids = list(history[1:])
    outputs = {}  # path (tuple of tokens) -> head output of its last entry

    def head_out(path):
        if path not in outputs:
            prefix = [head_out(path[:i]) for i in range(len(path))]  # parents' outputs, root first
            f = torch.cat([feats] + [p.view(1, 1, -1) for p in prefix], 1)
            x = torch.tensor([ids + list(path)])
            outputs[path] = head(x, torch.arange(x.shape[1])[None], f)[0, -1]
        return outputs[path]

    def children(path, score):
        lp = torch.log_softmax(head.compute_logits(head_out(path)[None, None])[0, 0].float(), -1)
        values, tokens = lp.topk(top_k)
        return [(score + float(v), path + (int(t),)) for v, t in zip(values, tokens)]

    cands = []  # (score, number, parent number, path)
    level = [(s, i, -1, p) for i, (s, p) in enumerate(children((), 0.0))]
    cands += level
    expanded = level
    for _ in range(depth):
        new = []
        for s, num, _, p in expanded:
            for score, child in children(p, s):
                new.append((score, len(cands) + len(new), num, child))
        cands += new
        expanded = sorted(new, key=lambda c: (-c[0], c[1]))[:top_k]
    kept = sorted(sorted(cands, key=lambda c: (-c[0], c[1]))[:total_tokens - 1], key=lambda c: c[1])
    numbers = [c[1] for c in kept]
    return [(c[3][-1], 0 if c[2] == -1 else numbers.index(c[2]) + 1) for c in kept]


def record_trees(llm, monkeypatch):
    """(history, [(token, parent) of nodes 1..]) for every sequence of every tree step."""
    seen = []
    step = tree_verify.launch_tree_step
    proposer = llm.engine.proposer
    propose = proposer.propose_tree

    def recording_step(engine, seqs, *args):
        histories = [list(s.all_token_ids) for s in seqs]

        def recording_propose(*args):
            tree = propose(*args)
            for h, toks, pars in zip(histories, tree.tokens.tolist(), tree.parents.tolist()):
                seen.append((h, list(zip(toks[1:], pars[1:]))))
            return tree

        proposer.propose_tree = recording_propose
        try:
            return step(engine, seqs, *args)
        finally:
            proposer.propose_tree = propose

    monkeypatch.setattr(tree_verify, "launch_tree_step", recording_step)
    return seen


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_drafted_trees_match_reference(models, monkeypatch, method):
    # Larger head weights than the default: peaked draft distributions, so trees reach
    # level 3 (nodes whose drafting used the scratch columns of two earlier rounds).
    target, head_dir, prompts, want = models("llama", method, scale=0.6)
    top_k, depth, total = 3, 3, 10
    spec = {"method": method, "model": str(head_dir), "tree": {"top_k": top_k, "depth": depth, "total_tokens": total}}
    llm = make_llm(target, spec, 3)
    seen = record_trees(llm, monkeypatch)
    outs = generate(llm, prompts, [greedy(n) for n in MAX_TOKENS])
    assert outs == want
    hf_target, head = ef.load_hf(target), llm.engine.proposer.head
    for i, (history, nodes) in enumerate(seen):
        assert nodes == reference_tree(hf_target, head, method, history, top_k, depth, total), i
    deepest = [max(len(p) for p in brute_paths([-1] + [par for _, par in nodes])) - 1 for _, nodes in seen]
    assert sum(d >= 3 for d in deepest) > len(seen) // 2
    # Steps after an acceptance ran (their trees depend on the catch-up over accepted nodes).
    assert llm.engine.metrics.num_accepted_tokens > 0


# -- 4. a head that drafts well: deep paths ---------------------------------------------------
@pytest.fixture(scope="module")
def bigram(tmp_path_factory):
    root = tmp_path_factory.mktemp("bigram")
    target = ef.write_target(root / "target", ef.kind_of("llama"), edit=ef.bigram_edit())
    head = ef.write_bigram_eagle_head(root / "head", target)
    return target, head


def test_bigram_head_accepts_deep_paths(bigram, monkeypatch):
    target, head_dir = bigram
    prompts = ef.random_prompts(LENGTHS, VOCAB, seed=2)
    want = ef.hf_greedy(target, prompts, MAX_TOKENS)
    top_k, depth, total = 3, 4, 14
    spec = {"method": "eagle", "model": str(head_dir), "tree": {"top_k": top_k, "depth": depth, "total_tokens": total}}
    llm = make_llm(target, spec, 2)
    seen = record_trees(llm, monkeypatch)
    outs = generate(llm, prompts, [greedy(n) for n in MAX_TOKENS])
    assert outs == want
    m = check_counters(llm, outs, depth + 1, total - 1)
    assert m.num_accepted_tokens_per_pos[2] > 0  # paths of three and more accepted
    # The accepted counts are those of the recorded trees against the known continuation.
    conts = {tuple(p): w for p, w in zip(prompts, ef.hf_greedy(target, prompts, [n + 8 for n in MAX_TOKENS]))}
    accepted = []
    for history, nodes in seen:
        (prompt,) = [p for p in conts if history[:len(p)] == list(p)]
        cont = conts[prompt][len(history) - len(prompt):]
        node, a = 0, 0
        while True:
            nxt = [j + 1 for j, (tok, par) in enumerate(nodes) if par == node and tok == cont[a]]
            if not nxt:
                break
            node, a = nxt[0], a + 1
        accepted.append(a)
    assert sum(accepted) == m.num_accepted_tokens and len(accepted) == m.num_drafts
    hf_target, head = ef.load_hf(target), llm.engine.proposer.head
    for history, nodes in seen[::4]:
        assert nodes == reference_tree(hf_target, head, "eagle", history, top_k, depth, total)



# -- 5. sampled requests: lossless tree verification --------------------------------------
def chi_square(counts: dict, probs: dict, n: int) -> float:
    assert set(counts) <= {k for k, p in probs.items() if p > 0}, (counts, probs)
    return sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in probs.items() if p > 0)


# chi-square critical values at p = 0.001 by degrees of freedom
CHI2_001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def test_children_table_by_hand():
    from eagle_zoo.engine.tree_verify import children_table

    table = children_table(torch.tensor([TREES["mixed"]]), 3)
    assert table[0].tolist() == [[1, 2, -1], [3, 4, -1], [5, -1, -1], [6, -1, -1],
                                 [-1, -1, -1], [-1, -1, -1], [7, -1, -1], [-1, -1, -1]]


def test_accept_sampled_distribution():
    """The emitted tokens of accept_sampled, over many independent rows, follow the
    target: the first token ~ p(root); after the first token equals a child's token
    (only possible by accepting it: the residual excludes every tried child), the second
    ~ p(child); and so on. Hand-made tree over a 6-token vocabulary."""
    from eagle_zoo.engine.tree import TreeDraft
    from eagle_zoo.engine.tree_verify import accept_sampled

    parents = [-1, 0, 0, 1, 1, 2]  # root -> {1, 2}; 1 -> {3, 4}; 2 -> {5}
    node_tokens = [0, 2, 4, 1, 2, 0]
    V, B = 6, 40000
    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor([
        [0.1, 0.1, 0.4, 0.1, 0.3, 0.0],   # root: drafts 2, 4; token 5 impossible
        [0.1, 0.0, 0.5, 0.2, 0.1, 0.1],   # node 1: draft 1 impossible (always rejected), draft 2
        [0.6, 0.1, 0.1, 0.1, 0.05, 0.05],
        [1 / 6] * 6,
        [0.2, 0.2, 0.2, 0.2, 0.1, 0.1],
        [0.3, 0.1, 0.1, 0.1, 0.2, 0.2],
    ], dtype=torch.float64).float()
    depth, anc = build_tree(torch.tensor([parents]), 2)
    tree = TreeDraft(*(x.expand(B, *x.shape[1:]) for x in
                       (torch.tensor([node_tokens]), torch.tensor([parents]), depth, anc, torch.arange(6).view(1, 6),
                        depth)))
    uniforms = torch.rand(B, 3, 2, generator=gen)
    exponentials = torch.empty(B, V).exponential_(generator=gen)
    tokens, accepted, path = accept_sampled(probs.expand(B, 6, V), tree, 2, uniforms, exponentials)
    rows = tokens.tolist()
    na = accepted.tolist()
    assert all(r[a + 1:] == [-1] * (2 - a) and r[a] >= 0 for r, a in zip(rows, na))

    def check(node, prefix):
        """Rows whose emitted tokens start with `prefix` (the path to `node`): their next
        token ~ probs[node]; recurse into children whose token came next."""
        sel = [r for r in rows if r[:len(prefix)] == prefix]
        counts: dict = {}
        for r in sel:
            counts[r[len(prefix)]] = counts.get(r[len(prefix)], 0) + 1
        want = {t: float(probs[node, t]) for t in range(V)}
        dof = sum(p > 0 for p in want.values()) - 1
        assert chi_square(counts, want, len(sel)) < CHI2_001[dof], (node, counts)
        for child, par in enumerate(parents):
            if par == node and probs[node, node_tokens[child]] > 0:
                check(child, prefix + [node_tokens[child]])
        return len(sel)

    assert check(0, []) == B
    # Both acceptance and rejection at every level ran.
    # Acceptance at every level and rejection ran: P(2 accepted) = 0.4 * 0.5 + 0.3 * 0.6.
    assert sum(a == 2 for a in na) / B == pytest.approx(0.38, abs=0.02)
    assert sum(a == 0 for a in na) / B == pytest.approx(0.3, abs=0.02)  # (1 - 0.4 - 0.3)
    # Greedy rows (one-hot p) are exactly greedy.
    one_hot = torch.zeros(6, V).scatter_(1, probs.argmax(-1, keepdim=True), 1.0)
    g_tokens, g_acc, _ = accept_sampled(one_hot.expand(B, 6, V), tree, 2, uniforms, exponentials)
    from eagle_zoo.engine.tree_verify import accept_greedy

    w_tokens, w_acc, _ = accept_greedy(probs.argmax(-1).expand(B, 6), tree)
    assert torch.equal(g_tokens, w_tokens) and torch.equal(g_acc, w_acc)


def test_accept_sampled_never_takes_a_zero_probability_child_at_u_zero():
    """u = 0 exactly: every child with p > 0 is taken, a child with p = 0 never is."""
    from eagle_zoo.engine.tree import TreeDraft
    from eagle_zoo.engine.tree_verify import accept_sampled

    parents = [-1, 0, 1, 1]  # root -> node 1 (token 2) -> {node 2 (token 1, p = 0), node 3 (token 3)}
    node_tokens = [0, 2, 1, 3]
    probs = torch.tensor([
        [0.2, 0.2, 0.6, 0.0],
        [0.5, 0.0, 0.0, 0.5],  # at node 1: token 1 impossible
        [0.25] * 4,
        [0.0, 0.0, 0.0, 1.0],
    ]).unsqueeze(0)
    depth, anc = build_tree(torch.tensor([parents]), 2)
    tree = TreeDraft(torch.tensor([node_tokens]), torch.tensor([parents]), depth, anc, torch.arange(4).view(1, 4),
                     depth)
    tokens, accepted, _ = accept_sampled(probs, tree, 2, torch.zeros(1, 3, 2), torch.ones(1, 4))
    assert tokens.tolist() == [[2, 3, 3]] and accepted.tolist() == [2]


def test_sampled_tree_distribution_matches_target(bigram):
    """Three sampled tokens (temperature 1, top-k 2: eight outcomes) through trees of the
    bigram head (often right, sometimes wrong): their joint frequency over many requests
    matches the product of transformers' conditional distributions (chi-square)."""
    target, head = bigram
    prompt = ef.random_prompts((6,), VOCAB, seed=10)[0]
    n, top_k = 600, 2
    params = SamplingParams(temperature=1.0, top_k=top_k, max_tokens=3, ignore_eos=True)
    llm = LLM(str(target), speculative_config={"method": "eagle", "model": str(head),
                                               "tree": {"top_k": 2, "depth": 2, "total_tokens": 6}},
              device="cpu", max_model_len=32, max_num_seqs=64, seed=11)
    outs = generate(llm, [prompt] * n, params)
    counts: dict = {}
    for t in outs:
        counts[tuple(t)] = counts.get(tuple(t), 0) + 1
    expected = ef.hf_three_token_probs(ef.load_hf(target), prompt, top_k)
    assert chi_square(counts, expected, n) < CHI2_001[7], (counts, expected)
    m = llm.engine.metrics
    assert 0 < m.num_accepted_tokens and m.num_accepted_tokens_per_pos[1] > 0


def test_seeded_sampling_reproducible_and_mixed_batches(models):
    target, head, prompts, want = models("llama", "eagle", scale=0.6)
    spec = {"method": "eagle", "model": str(head), "tree": {"top_k": 3, "depth": 2, "total_tokens": 8}}
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=20, ignore_eos=True)
    alone = generate(make_llm(target, spec, 1), prompts[:1], [seeded])[0]
    mixed = [seeded, greedy(MAX_TOKENS[1]), SamplingParams(temperature=1.2, max_tokens=9, ignore_eos=True)]
    for n in (2, 3):
        got = generate(make_llm(target, spec, n), prompts, mixed)
        assert got[0] == alone and got[1] == want[1]
    other = SamplingParams(temperature=0.9, top_p=0.95, seed=4321, max_tokens=20, ignore_eos=True)
    assert generate(make_llm(target, spec, 1), prompts[:1], [other])[0] != alone


# -- 6. options ---------------------------------------------------------------------------------
def parse(tree, **kw):
    return SpeculativeConfig.parse({"method": "eagle", "model": "x", "tree": tree, **kw})


@pytest.mark.parametrize("tree, message", [
    ({"top_k": 0}, "tree.top_k must be >= 1"),
    ({"depth": 0}, "tree.depth must be >= 1"),
    ({"total_tokens": 1}, "tree.total_tokens must be >= 2"),
    ({"top_k": 2, "depth": 1, "total_tokens": 8}, "at most 7"),  # 2 + 1 * 4 = 6 candidates
    ({"topk": 3}, "did you mean 'top_k'"),
    ({"total_token": 3}, "did you mean 'total_tokens'"),
    ({"top_k": "3"}, "top_k"),
    ("yes", "'tree' must be true or an object"),
])
def test_bad_tree_options(tree, message):
    with pytest.raises(SpeculativeConfigError, match=message):
        parse(tree)


def test_tree_bound_is_exact():
    assert parse({"top_k": 2, "depth": 1, "total_tokens": 7}).tree.total_tokens == 7


def test_tree_refusals(models, tmp_path):
    target, head, _, _ = models("llama", "eagle")
    tree = {"top_k": 2, "depth": 2, "total_tokens": 5}
    head3 = models("llama", "eagle3")[1]
    with pytest.raises(NotImplementedError, match="parallel_drafting"):
        make_llm(target, {"method": "eagle3", "model": str(head3), "tree": tree, "parallel_drafting": True}, 1)
    mistral = ef.kind_of("mistral")
    window_target = ef.write_target(tmp_path / "mistral", mistral)  # sliding_window 24 < the context
    window_head = ef.write_head(tmp_path / "mistral-head", mistral, "eagle")
    with pytest.raises(NotImplementedError, match="sliding_window=24"):
        make_llm(window_target, {"method": "eagle", "model": str(window_head), "tree": tree}, 1)


def test_perf_tree_option():
    from eagle_zoo.perf import _tree_option

    assert _tree_option("8,5,60") == {"top_k": 8, "depth": 5, "total_tokens": 60}
    with pytest.raises(SystemExit, match="TOP_K,DEPTH,TOTAL_TOKENS"):
        _tree_option("8,5")
    from eagle_zoo.perf import _tree_options

    assert _tree_options("8,5,60; 4,4,24") == [("8,5,60", {"top_k": 8, "depth": 5, "total_tokens": 60}),
                                              ("4,4,24", {"top_k": 4, "depth": 4, "total_tokens": 24})]
    with pytest.raises(SystemExit, match="TOP_K,DEPTH,TOTAL_TOKENS"):
        _tree_options("8,5,60;4,4")
