"""Held-out prompts (`--val-share`, eagle_zoo/train/validation.py): the split."""
from __future__ import annotations

import pytest
import torch

from eagle_zoo.train.data import TokenData
from eagle_zoo.train.validation import prompt_key, split_by_prompt


def _two_answers_per_prompt(prompts: int) -> TokenData:
    """Sequence 2p and 2p+1 answer prompt p (as greedy + sampled data directories do)."""
    seqs = []
    for p in range(prompts):
        prompt = [5, 6, 100 + p, 7]
        for answer in ([11, 12, 13], [14, 15]):
            seqs.append((prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    return TokenData.from_sequences(seqs, {"vocab_size": 512})


def test_both_answers_of_a_prompt_fall_on_one_side():
    data = _two_answers_per_prompt(400)
    index = torch.arange(len(data))
    train, held = split_by_prompt(data, index, 0.1, seed=0)
    assert sorted(train.tolist() + held.tolist()) == index.tolist()  # a partition
    assert set((held // 2).tolist()).isdisjoint((train // 2).tolist())  # no prompt on both sides
    assert len(held) % 2 == 0 and 20 <= len(held) // 2 <= 70  # ~10% of 400 prompts (37 here), both answers each


def test_the_side_depends_on_the_prompt_and_seed_not_the_order():
    data = _two_answers_per_prompt(200)
    index = torch.arange(len(data))
    _, held = split_by_prompt(data, index, 0.2, seed=3)
    _, held_reversed = split_by_prompt(data, index.flip(0), 0.2, seed=3)
    assert sorted(held_reversed.tolist()) == sorted(held.tolist())
    _, other_seed = split_by_prompt(data, index, 0.2, seed=4)
    assert sorted(other_seed.tolist()) != sorted(held.tolist())
    assert split_by_prompt(data, index, 0.0, seed=3)[1].numel() == 0


def test_the_prompt_is_what_precedes_the_first_loss_token():
    ids, mask = torch.tensor([1, 2, 3, 9, 9]), torch.tensor([0, 0, 0, 1, 1])
    assert prompt_key(ids, mask) == prompt_key(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 0, 0, 1]))
    assert prompt_key(ids, mask) != prompt_key(torch.tensor([1, 2, 8, 9]), torch.tensor([0, 0, 0, 1]))


@pytest.mark.parametrize("share", [-0.1, 1.0])
def test_a_share_outside_0_1_is_refused(share):
    data = _two_answers_per_prompt(4)
    with pytest.raises(ValueError, match="--val-share"):
        split_by_prompt(data, torch.arange(len(data)), share, seed=0)
