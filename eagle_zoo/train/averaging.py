"""`--ema DECAY`: an exponential moving average of the head's trained weights.

Why: a head trained further from a start can accept less than the same end averaged
with its start (``eagle-zoo convert average`` after the fact). The average kept here
does that during the run, over the whole trajectory: after each optimizer step

    avg = DECAY * avg + (1 - DECAY) * weights

starting from the weights training starts from. A warm start (--init-from) thus keeps
DECAY ** steps of its start in the average (0.99985 over 6,000 steps: 41%); a fresh head
needs many more than 1 / (1 - DECAY) steps for its random init to fade.

The average lives in float32 on the weights' device and is updated in place with no
read back to the host; the training state holds it, so a resumed run's average equals
the uninterrupted run's.
"""
from __future__ import annotations

import torch


def check_decay(decay: float) -> None:
    if not 0.0 < decay < 1.0:
        raise ValueError(f"--ema {decay}: give a decay between 0 and 1 (e.g. 0.9998: the average spans "
                         f"about 1 / (1 - decay) = 5000 steps)")


class WeightAverage:
    """The average of `params` (the trainer's fp32 master weights; the decay is checked
    by TrainSettings, before the target loads)."""

    def __init__(self, params: dict[str, torch.nn.Parameter], decay: float):
        self.decay = decay
        self.values = {n: p.detach().float().clone() for n, p in params.items()}

    @torch.no_grad()
    def update(self, params: dict[str, torch.nn.Parameter]) -> None:
        # one multi-tensor kernel for all the head's tensors, not a launch per tensor per step
        torch._foreach_lerp_(list(self.values.values()), [params[n].detach().float() for n in self.values],
                             1.0 - self.decay)

    @torch.no_grad()
    def copy_to(self, params: dict[str, torch.nn.Parameter]) -> None:
        """Overwrite the weights with the average (the last step's are then gone from the head)."""
        for name, avg in self.values.items():
            params[name].copy_(avg)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: v.cpu() for n, v in self.values.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor], where: str) -> None:
        missing = sorted(set(self.values) - set(state))
        if missing:
            raise ValueError(f"{where}: no averaged values for {missing[:3]}; the file is incomplete")
        for name, avg in self.values.items():
            avg.copy_(state[name])
