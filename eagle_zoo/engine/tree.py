"""EAGLE-2 dynamic draft trees: which candidates become the tree, and its shape tensors.

Everything here is batched ([B, ...], one tree per sequence), fixed-shape and free of
host synchronisation: a tree always has exactly ``total_tokens`` nodes.

Vocabulary
- candidate: a drafted token with a cumulative score (sum of the draft's log-probs
  along its path). Candidates are numbered level by level (the root's top_k
  children first, then each expansion round's top_k * top_k children), so a
  candidate's parent always has a smaller number.
- node: a member of the tree. Node 0 is the root (the sequence's last, not yet
  cached token); nodes 1.. are the selected candidates in candidate order, so a
  node's parent again has a smaller index.
- level / depth: the root is level 0, its children level 1, ...

Selection keeps the best ``total_tokens - 1`` candidates by score. A child's score
is its parent's plus a log-prob <= 0, and the sort is stable over candidate numbers
(parents first), so the kept set always contains every kept node's ancestors, ties
and -inf scores (tokens outside an EAGLE-3 draft vocabulary) included.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.tree_select import tree_select


@dataclass
class TreeDraft:
    """One dynamic tree per sequence, N = total_tokens nodes, L = the deepest level allowed.

    tokens    [B, N]      node tokens (node 0: the root, the sequence's last token)
    parents   [B, N]      parent node index; -1 for the root
    depth     [B, N]      level of each node (root 0)
    ancestors [B, N, L+1] ancestors[b, i, d] = the node at level d on the root->i path
                          (itself at d = depth[b, i]); -1 for d > depth[b, i]. A leaf's
                          row is the official code's "retrieve indices" path; the
                          keys of node i's attention (kernels/attention.py tree mode).
    columns   [B, N]      cache column of each node in the step, base + i (the target's
                          pass writes node i there; compaction moves the accepted path to
                          the first ones, where the head's catch-up runs)
    positions [B, N]      rope position of each node in the target's pass, base + depth
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    ancestors: torch.Tensor
    columns: torch.Tensor
    positions: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @property
    def max_depth(self) -> int:
        return self.ancestors.shape[2] - 1


def select_tree(scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, root: torch.Tensor,
                columns: torch.Tensor, max_depth: int) -> TreeDraft:
    """The tree of the best ``total_tokens - 1`` candidates (kernels/tree_select.py).

    scores, tokens [B, M]: candidate cumulative scores and tokens; parents [B, M]: the
    parent's candidate number, -1 for the root's children; root [B]: the root's token;
    columns [B, total_tokens]: the nodes' cache columns (TreeDraft), the root's, base,
    first (the nodes' positions are base + depth). Requires
    total_tokens - 1 <= M and that no kept candidate is deeper than max_depth."""
    total_tokens = columns.shape[1]
    if total_tokens - 1 > scores.shape[1]:
        raise ValueError(f"select_tree: {total_tokens - 1} draft nodes asked for but only {scores.shape[1]} candidates")
    node_tokens, node_parents, depth, ancestors, positions = tree_select(scores, tokens, parents, root, columns[:, 0],
                                                                         total_tokens, max_depth)
    return TreeDraft(node_tokens, node_parents, depth, ancestors, columns, positions)
