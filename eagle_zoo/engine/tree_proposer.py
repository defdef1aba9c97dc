"""EAGLE / EAGLE-3 heads drafting EAGLE-2 dynamic trees (speculative_config ``tree``).

The head state between steps is the chain's (EagleProposer): ``next_hidden[slot]`` is
the head's output at the sequence's last verified position, and the head's KV cache
holds every verified position (prefill is the chain's on_prefill).

Drafting one tree per sequence (B sequences, k = top_k, R = expansion rounds):
  level 1: the top k tokens of the head's distribution at next_hidden; all k expanded.
  round r = 1..R: the head runs once over the k expanded nodes of level r (rope position
      base + r - 1, the position of their parent), each attending to the history plus
      its own ancestors; each gets its top k children, scored by cumulative log-prob,
      giving k * k candidates at level r + 1, of which the global top k are expanded
      in the next round.
  selection (tree.select_tree): the best total_tokens - 1 candidates of all levels.
The expanded nodes' keys/values go to scratch columns base + (r-1) * k + j of the head
cache, past the history; they are overwritten by the catch-up before anything else
reads them. A node attends to the history and its ancestors' scratch columns, one a
round (its ancestors row, the tree_keys of models/attention.py).

Catch-up (after verification): the head runs over the accepted path like the chain's
catch-up, consuming the target's features at the root and the accepted nodes, so
its cache gets exactly the entries a chain of the same tokens would have written
(the drafting-time entries were computed from the head's own features, not the
target's, so they are recomputed rather than moved).
"""
from __future__ import annotations

import torch

from .proposers import EagleProposer
from ..kernels.gather_rows import gather_rows
from ..kernels.scatter_row import scatter_row
from ..kernels.tree_expand import tree_expand
from .tree import TreeDraft, select_tree


def tree_shape(depth: int, total_tokens: int) -> tuple[int, int]:
    """(expansion rounds, deepest level) actually needed. A kept node at level l comes
    with its l - 1 ancestors, so levels beyond total_tokens - 1 can never be kept and
    rounds producing them are skipped without changing the tree."""
    rounds = min(depth, total_tokens - 2)
    return rounds, rounds + 1


class TreeEagleProposer(EagleProposer):
    """EagleProposer whose steps draft trees (engine/tree_verify.py runs them);
    num_speculative_tokens is the tree's deepest level (the metrics' positions)."""

    step_strategy = "tree"

    def __init__(self, head, method: str, tree, num_slots: int, max_model_len: int, dtype, device,
                 target_num_layers: int, graph_pool=None):
        self.top_k, self.total_tokens = tree.top_k, tree.total_tokens
        self.rounds, self.max_depth = tree_shape(tree.depth, tree.total_tokens)
        # Cache columns past the history one step may write: the target's tree, the head's
        # drafting scratch, the head's catch-up.
        self.max_verify_tokens = max(self.total_tokens, self.rounds * self.top_k, self.max_depth + 1)
        max_len = max_model_len + self.max_verify_tokens + 1
        super().__init__(head, method, self.max_depth, num_slots, max_len, dtype, device,
                         target_num_layers, graph_pool)
        # What every tree step starts from, made once (not a kernel a step each):
        k, R = self.top_k, self.rounds
        on = dict(dtype=torch.long, device=device)
        # A step's cache columns and rope positions, less base, for one add a step: the
        # drafting scratch columns [R, k], the drafting rounds' positions [R], the tree's
        # node columns [N] (the target's pass; their first max_depth + 1 are the catch-up's).
        self._step_offsets = torch.cat([torch.arange(R * k, **on), torch.arange(R, **on),
                                        torch.arange(self.total_tokens, **on)])
        self._first_ancestors = torch.arange(k, **on).view(k, 1).expand(k, R).contiguous()  # round 0: itself
        self.num_candidates = k + R * k * k  # the root's k children, then k * k a round
        self._parents: dict[int, torch.Tensor] = {}  # candidate_parents

    @torch.inference_mode()
    def propose_tree(self, slots: torch.Tensor, base: torch.Tensor, root: torch.Tensor,
                     max_base: int | None) -> TreeDraft:
        """One tree per sequence; base [B] is each sequence's root position (its number of
        cached tokens), root [B] its token (the last one, not yet cached), max_base its
        maximum (a host int), or None for the whole-row form a CUDA graph captures
        (tree_verify.py)."""
        k, R = self.top_k, self.rounds
        B = slots.shape[0]
        hidden = self.next_hidden[slots]
        H = hidden.shape[-1]
        # The candidates' rows, each level written in place by the kernel that makes it
        # (no cat gathers them for the selection).
        on = dict(device=hidden.device)
        cand_scores = torch.empty(B, self.num_candidates, dtype=torch.float32, **on)
        cand_tokens = torch.empty(B, self.num_candidates, dtype=torch.long, **on)
        cand_parents = self.candidate_parents(B)
        scores, tokens = self.head.draft_top_k(hidden, k, out=(cand_scores[:, :k], cand_tokens[:, :k]))  # level 1
        node_hidden = hidden.unsqueeze(1).expand(B, k, H)
        # ancestors[b, j, r]: scratch column (less base) of expanded node j's ancestor of
        # round r, its own at its round; the rows move with the nodes (tree_expand).
        ancestors = self._first_ancestors.expand(B, k, R)
        at = base.view(B, 1) + self._step_offsets
        columns = at[:, :R * k].view(B, R, k)
        positions = at[:, R * k:R * k + R]
        node_columns = at[:, R * k + R:]
        kv_len = None if max_base is None else max_base + R * k
        for r in range(R):
            pos = positions[:, r:r + 1].expand(B, k)
            h = self.runner.run(tokens, pos, slots, kv_len, node_hidden, cache_positions=columns[:, r],
                                tree_keys=(pos, base, ancestors))
            first = k + r * k * k  # candidate number of this round's first child
            cum, child_tokens = cand_scores[:, first:first + k * k], cand_tokens[:, first:first + k * k]
            self.head.draft_top_k(h, k, parent_scores=scores, out=(cum.view(B, k, k), child_tokens.view(B, k, k)))
            if r + 1 < R:  # the k best children are expanded next, with their parents' state
                scores, tokens, node_hidden, ancestors = tree_expand(
                    cum, child_tokens, h, ancestors, first, level=r + 1,
                    parents_out=cand_parents[:, first + k * k:first + 2 * k * k])
        return select_tree(cand_scores, cand_tokens, cand_parents, root, node_columns, self.max_depth)

    def candidate_parents(self, B: int) -> torch.Tensor:
        """[B, num_candidates]: each candidate's parent candidate, for B sequences. The
        first two levels' are the same every step (-1 for the root's children, then j for
        the j-th node's k children), made once per batch size, by device ops (a first call
        inside a graph capture works too); tree_expand writes the later rounds' in place."""
        parents = self._parents.get(B)
        if parents is None:
            k, R = self.top_k, self.rounds
            on = dict(dtype=torch.long, device=self.next_hidden.device)  # device ops only: capturable
            parents = self._parents[B] = torch.zeros(B, self.num_candidates, **on)
            parents[:, :k] = -1
            if R > 0:
                parents[:, k:k + k * k] = torch.arange(k * k, **on) // k
        return parents

    @torch.inference_mode()
    def on_tree_verify(self, slots: torch.Tensor, columns: torch.Tensor, max_base: int | None, path: torch.Tensor,
                       out_tokens: torch.Tensor, num_accepted: torch.Tensor, hidden: torch.Tensor,
                       aux: list[torch.Tensor]) -> None:
        """Catch up on the accepted path. columns [B, N]: the tree's node columns (TreeDraft),
        base + i, whose first L+1 are the path's positions after compaction; path [B, L+1]:
        node index at each level (any valid node past the accepted depth); out_tokens
        [B, L+1]: the emitted tokens (-1 after); max_base None: the whole-row form
        (propose_tree)."""
        T = path.shape[1]
        if self.method == "eagle3":  # the path's rows of the three streams side by side, in one launch
            feats = self.head.combine_hidden_states(gather_rows(aux, path))
        else:
            feats = gather_rows([hidden], path)
        positions = columns[:, :T]
        # Fixed width: positions past the accepted ones (token -1, a zero embedding) get
        # garbage, overwritten next step.
        h = self.runner.run(out_tokens, positions, slots, None if max_base is None else max_base + T,
                            feats)
        scatter_row(self.next_hidden, slots, h, num_accepted)


def _short_windows(model, max_len: int) -> list[str]:
    """Attention layers whose sliding window or attention chunk is shorter than the cache:
    a tree's keys (the history and the node's ancestors, models/attention.py tree_keys)
    replace the window rule, so they would see keys they must not."""
    from .cache import attention_layers

    out = []
    for layer in attention_layers(model):
        for name in ("sliding_window", "attention_chunk_size"):
            value = getattr(layer, name, None)
            if value is not None and value < max_len:
                out.append(f"layer {layer.layer_idx} {name}={value}")
    return out


def build_tree_proposer(spec, head, target, max_num_seqs: int, max_model_len: int, dtype, device,
                        target_num_layers: int, graph_pool=None) -> TreeEagleProposer:
    """The proposer for speculative_config ``tree`` (methods eagle / eagle3), after the
    checks that this engine's tree steps need."""
    if spec.parallel_drafting:
        raise NotImplementedError(
            "speculative_config: 'tree' drafts level by level and does not combine with "
            "parallel_drafting: set \"parallel_drafting\": false or remove 'tree'"
        )
    proposer = TreeEagleProposer(head, spec.method, spec.tree, max_num_seqs, max_model_len, dtype, device,
                                 target_num_layers, graph_pool)
    for who, model in (("the target", target), ("the draft head", head)):
        short = _short_windows(model, max_model_len + proposer.max_verify_tokens + 1)
        if short:
            raise NotImplementedError(
                f"speculative_config 'tree': {who} has sliding-window / chunked attention shorter than "
                f"the context ({', '.join(short[:3])}), which tree verification does not apply yet: "
                f"remove 'tree' (chain drafting handles these models)"
            )
    return proposer
