"""One engine step with EAGLE-2 dynamic trees: draft, verify every node in one target
pass, accept a path (greedy: the longest matching one; sampled: recursive rejection
sampling over siblings, lossless), compact the cache, let the head catch up.

Target pass: node i of sequence b is written at cache column base[b] + i with rope
position base[b] + depth[b, i] and attends to the history (columns < base[b]) and to
its own ancestors. After acceptance of a nodes on the path root -> n_1 -> ... -> n_a,
the k/v of n_d are copied to column base[b] + d, so the cache looks as if the path had
been decoded as a chain (same tokens, same positions, same visible keys).
"""
from __future__ import annotations

import torch

from ..kernels.top_k import argmax_rows
from ..kernels.tree_accept import emit_path, tree_accept_greedy
from ..kernels.tree_compact import tree_compact
from .sampler import apply_sampling_params, draw, sample_from_probs
from .tree import TreeDraft
from .verify import SamplingBatch


def accept_greedy(target_argmax: torch.Tensor, tree: TreeDraft):
    """target_argmax [B, N]: the target's greedy token after each node.

    A node is correct when its token is the target's choice after its parent; a path is
    accepted while all its nodes are correct. Siblings hold distinct tokens, so the
    accepted nodes form one path. Returns (tokens [B, L+1]: the accepted tokens, then
    the target's token after the deepest accepted node, then -1; num_accepted [B];
    path [B, L+1]: node at each level of the accepted path, and for levels past it the
    level number itself, a valid node index that compaction copies onto itself).
    kernels/tree_accept.py."""
    return tree_accept_greedy(target_argmax, tree.tokens, tree.parents, tree.depth, tree.ancestors)


def children_table(parents: torch.Tensor, width: int) -> torch.Tensor:
    """[B, N, width]: the children of each node in node order, -1 padded (a node of a
    tree with top_k = width has at most width children)."""
    B, N = parents.shape
    same = parents.unsqueeze(2) == parents.unsqueeze(1)  # [B, i, j]: i and j are siblings
    earlier = torch.ones(N, N, dtype=torch.bool, device=parents.device).tril(-1)
    rank = (same & earlier).sum(-1)  # earlier siblings of each node
    slot = torch.where(parents >= 0, parents * width + rank, torch.full_like(rank, N * width))  # root: dropped
    table = torch.full((B, N * width + 1), -1, dtype=torch.long, device=parents.device)
    table.scatter_(1, slot, torch.arange(N, device=parents.device).expand(B, N))
    return table[:, : N * width].view(B, N, width)


def accept_sampled(probs: torch.Tensor, tree: TreeDraft, width: int, uniforms: torch.Tensor,
                   exponentials: torch.Tensor):
    """Lossless verification of a tree of deterministic drafts (the head's top-k, so the
    draft distribution behind each child is one-hot).

    probs [B, N, V]: the target's distribution after each node (after the request's
    sampling parameters; one-hot for greedy rows); uniforms [B, L+1, width] in [0, 1);
    exponentials [B, V] Exp(1). From the root, the children of the current node are
    tried in node order: child x is accepted with probability p(x) / sum(p), p the
    current residual; on rejection x's mass is removed from p (max(p - onehot_x, 0),
    renormalised implicitly) and the next child is tried. An accepted child becomes the
    current node with the target's distribution at it; when every child is rejected (or
    there is none) the next token is drawn from the residual. Each emitted token is then
    distributed exactly as p: P(x_i emitted) = prod_{j<i} (1 - p_j / m_j) * p_i / m_i = p_i
    with m_i the mass left before trying x_i, and any other token comes from the residual.
    Returns what accept_greedy returns."""
    B, N, V = probs.shape
    L = tree.max_depth
    children = children_table(tree.parents, width)
    probs = probs.float()
    cur = torch.zeros(B, dtype=torch.long, device=probs.device)
    active = torch.ones(B, dtype=torch.bool, device=probs.device)
    num_accepted = torch.zeros(B, dtype=torch.long, device=probs.device)
    p = probs[:, 0].clone()
    final = torch.zeros_like(p)
    for level in range(L + 1):  # at level L there are no children: every row stops by then
        kids = children.gather(1, cur.view(B, 1, 1).expand(B, 1, width))[:, 0]
        moved = torch.zeros_like(active)
        nxt = cur.clone()
        for s in range(width):
            child = kids[:, s]
            tryit = active & ~moved & (child >= 0)
            x = tree.tokens.gather(1, child.clamp(min=0).view(B, 1))
            px = p.gather(1, x)[:, 0]
            take = tryit & (uniforms[:, level, s] * p.sum(-1) < px)
            moved |= take
            nxt = torch.where(take, child, nxt)
            p = p.scatter(1, x, torch.where(tryit & ~take, 0.0, px).view(B, 1))
        stop = active & ~moved
        final = torch.where(stop.view(B, 1), p, final)
        active &= moved
        num_accepted += moved.long()
        cur = nxt
        p = torch.where(moved.view(B, 1), probs.gather(1, cur.view(B, 1, 1).expand(B, 1, V))[:, 0], p)
    return emit_path(tree.ancestors, tree.tokens, cur, num_accepted, sample_from_probs(final, exponentials))


def compact_kv(kv_caches, slots: torch.Tensor, base: torch.Tensor, path: torch.Tensor) -> None:
    """Move the k/v of the path's node at level d (column base + path[d]) to column base + d,
    d = 1..L, in every layer's cache (kernels/tree_compact.py): one launch for the engine's
    stacked caches, two a layer for caches of different shapes."""
    stacked = getattr(kv_caches, "stacked", None)
    if stacked is not None:
        tree_compact(stacked.flatten(0, 1), slots, base, path)
        return
    for k_cache, v_cache in kv_caches:
        for cache in (k_cache, v_cache):
            tree_compact(cache.unsqueeze(0), slots, base, path)


@torch.inference_mode()
def launch_tree_step(engine, seqs, slots, base, last, max_base: int):
    """Queue one tree step for ``seqs`` of ``engine`` (EngineCore), greedy or sampled, on
    the device: slots, base, last [B]; max_base bounds the sequences' cached lengths (the
    eager forms' attention). -> the engine's LaunchedStep (read back by the engine)."""
    proposer, dev = engine.proposer, engine.device
    B = len(seqs)
    # One draft of N - 1 tokens per sequence; per-position counts over the tree's levels.
    L, N = proposer.max_depth, proposer.total_tokens
    sampling = SamplingBatch.from_sequences(seqs, dev)
    graphed = engine.tree_step_graph
    if sampling.all_greedy and graphed is not None and graphed.eligible(last.view(B, 1)):
        outputs = graphed(last.view(B, 1), base.view(B, 1), slots)
    else:
        if sampling.all_greedy:
            tokens, accepted = greedy_tree_step(engine, last, base, slots, max_base)
        else:
            tokens, accepted = _sampled_tree_step(engine, last, base, slots, max_base, sampling)
        outputs = (*engine.step_outputs(tokens, accepted, N - 1, base, slots), slots)
    return engine.launched_step(seqs, L, *outputs, num_positions=L)


def _draft_and_verify(engine, last, base, slots, max_base):
    """Draft the trees and run the target over every node. max_base None: the whole-row
    form (kv_len = the caches' length, masks over it), which a CUDA graph captures."""
    tree = engine.proposer.propose_tree(slots, base, last, max_base)
    return (tree, *target_tree_pass(engine, tree, base, slots, max_base))


def target_tree_pass(engine, tree, base, slots, max_base):
    """The target over every node of the drafted trees (root = the last token):
    -> (hidden, aux, logits)."""
    runner = engine.runner
    N = tree.num_nodes
    # Each node's keys walked in position order (kernels/attention.py): plain decoding's bf16 bits.
    hidden, aux = runner.run(tree.tokens, tree.positions, slots, None if max_base is None else max_base + N,
                             engine.aux_layer_ids, cache_positions=tree.columns,
                             tree_keys=(tree.positions, base, tree.ancestors))
    return hidden, aux, engine.target.compute_logits(hidden)


def finish_tree_step(engine, tree, slots, base, max_base, tokens, accepted, path, hidden,
                     aux) -> tuple[torch.Tensor, torch.Tensor]:
    """Compact the target's cache onto the accepted path, catch the head up; returns
    (emitted tokens [B, L+1], -1 padded; accepted drafts [B])."""
    compact_kv(engine.runner.kv_caches, slots, base, path)
    engine.proposer.on_tree_verify(slots, tree.columns, max_base, path, tokens, accepted, hidden, aux)
    return tokens, accepted


def greedy_tree_step(engine, last, base, slots, max_base) -> tuple[torch.Tensor, torch.Tensor]:
    """A greedy tree step on the device, no host sync: last, base, slots [B]; returns
    what finish_tree_step returns. With max_base None it is the whole-row form that
    EngineCore.tree_step_graph captures; a host int bounds the attention instead."""
    tree, hidden, aux, logits = _draft_and_verify(engine, last, base, slots, max_base)
    tokens, accepted, path = accept_greedy(argmax_rows(logits), tree)
    return finish_tree_step(engine, tree, slots, base, max_base, tokens, accepted, path, hidden, aux)


def _sampled_tree_step(engine, last, base, slots, max_base, sampling) -> tuple[torch.Tensor, torch.Tensor]:
    # Eager: the per-request generators draw outside any graph.
    proposer = engine.proposer
    B = slots.shape[0]
    tree, hidden, aux, logits = _draft_and_verify(engine, last, base, slots, max_base)
    t = sampling.tensors
    probs = apply_sampling_params(logits, t.temperature, t.top_k, t.top_p, t.min_p)
    # Fixed shapes per request, so a seeded request draws the same numbers in any batch.
    uniforms = draw("uniform", (B, tree.max_depth + 1, proposer.top_k), sampling.generators, engine.device)
    exponentials = draw("exponential", (B, logits.shape[-1]), sampling.generators, engine.device)
    tokens, accepted, path = accept_sampled(probs, tree, proposer.top_k, uniforms, exponentials)
    return finish_tree_step(engine, tree, slots, base, max_base, tokens, accepted, path, hidden, aux)


def whole_row_greedy_step(engine):
    """What EngineCore.tree_step_graph captures, one CUDA graph per batch bucket (eagerly a
    step launches hundreds of small kernels from Python): greedy_tree_step in its
    whole-row form, taking GraphedForward's (input_ids, positions, slot_ids) =
    (last [B,1], base [B,1], slots [B])."""
    def step(last, base, slots):
        return greedy_tree_step(engine, last[:, 0], base[:, 0], slots, None)
    return step
