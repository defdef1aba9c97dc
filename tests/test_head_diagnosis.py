"""eagle_zoo.tools.diagnose (`eagle-zoo diagnose`): the engine's walk over an answer, replayed from
per-position drafts, and the out-of-vocabulary count."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def diagnosis():
    from eagle_zoo.tools import diagnose

    return diagnose


def _part(right: list[list[bool]]) -> dict:
    """Chains whose step s drafts the target's token where right[i][s]."""
    target = torch.arange(len(right) * 3).view(-1, 3)
    return {"target": target, "draft": torch.where(torch.tensor(right), target, -1)}


def test_walk_jumps_past_each_accepted_run(diagnosis):
    every = [[True] * 3] * 8
    assert diagnosis.walk(_part(every)).tolist() == [8, 2]  # steps from 0 and 4, four tokens each
    assert diagnosis.walk(_part([[False] * 3] * 5)).tolist() == [5, 5]  # one token a step
    # step 0 from chain 0 takes 2 drafts (the third is wrong) + 1: the next step starts at
    # chain 3 (a miss: 1 token), then chain 4 (1 right: 2 tokens) and chain 6 (all: 4)
    mixed = [[True, True, False], [True] * 3, [True] * 3, [False] * 3, [True, False, True], [True] * 3, [True] * 3]
    assert diagnosis.walk(_part(mixed)).tolist() == [3 + 1 + 2 + 4, 4]
    # a right draft after a wrong one does not count: chains are accepted left to right
    assert diagnosis.walk(_part([[False, True, True]])).tolist() == [1, 1]


def test_out_of_vocab_counts_the_step0_tokens_the_draft_vocabulary_lacks(diagnosis, capsys):
    class Tok:
        def decode(self, ids):
            return f"t{ids[0]}"

    t2d = torch.tensor([True, True, False, False, True])  # tokens 2 and 3 are not drafted
    parts = [{"target": torch.tensor([[2, 0, 0], [3, 0, 0], [2, 0, 0]])},
             {"target": torch.tensor([[0, 2, 2], [2, 3, 3], [4, 3, 3]])}]  # only step 0 counts
    diagnosis.out_of_vocab(parts, t2d, Tok(), top=1)
    out = capsys.readouterr().out
    assert "4 of 6 positions, 2 distinct tokens (3 positions in the 1 most frequent)" in out
    assert out.rstrip().endswith("most frequent: 't2' 3")
